/* The host-index checks of the public embedding bag (src/kernels/tbe_pack.c): every offset, id
 * and weight of a batch, validated with wide branch-free loops over libflame's thread pool, and
 * (for a GPU handle) packed into the page-locked staging block in the same pass. */
#ifndef FLAME_KERNELS_TBE_PACK_H
#define FLAME_KERNELS_TBE_PACK_H

#include "kernels/kernels_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Validates the lookups of all num_tables tables (host arrays) and, when dst is not NULL, copies
 * table t's ids, offsets and weights to dst + at[3t], dst + at[3t + 1] and dst + at[3t + 2]
 * (absent arrays are not copied). threads: the caller's thread count (libflame's pool, <= 1:
 * the calling thread). The first bad value in the order the tables, then each table's offsets,
 * then its ids and weights are met is FLAME_ERR_INVALID_ARG naming the table, the bag and the
 * value (whatever dst received is then not to be used); FLAME_ERR_NOMEM. */
flame_status fl_tbe_check_pack(const fl_tbe_table *tables, const fl_tbe_lookup *lookups, int num_tables,
                               int64_t batch, void *dst, const size_t *at, int threads);

/* FLAME_ERR_INVALID_ARG with the message for the bad value r describes (its kind, table, bag,
 * index and value; rows: that table's rows): one wording for the host checks above and the
 * device record of device_indices forwards. */
flame_status fl_tbe_index_error(const fl_tbe_index_record *r, int64_t rows);

#ifdef __cplusplus
}
#endif
#endif
