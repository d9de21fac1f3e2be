/* The CPU embedding bag of the public API over validated lookups (src/kernels/tbe_cpu.c). */
#ifndef FLAME_KERNELS_TBE_CPU_H
#define FLAME_KERNELS_TBE_CPU_H

#include "kernels/kernels_gpu.h"

/* out[b, 0:width] of out_dtype (F32, F16 or BF16) for bags 0..batch-1 (row stride ld, in
 * elements), split over `threads` threads of libflame's pool (core/pool.h); F16 and BF16 rows
 * are pooled in float32 and rounded once, to nearest even. FLAME_ERR_NOMEM (the float32 rows
 * of an F16/BF16 output) before anything is written. */
flame_status fl_tbe_cpu_forward(const fl_tbe_table *tables, int num_tables, const fl_tbe_lookup *lookups,
                                int64_t batch, void *out, int64_t ld, flame_dtype out_dtype, int32_t width,
                                int threads);

#endif
