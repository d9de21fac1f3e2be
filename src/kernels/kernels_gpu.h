/* The GPU side of the public kernels (flame/kernels.h), as src/kernels/ sees it: implemented in
 * cuda/kernels_api.cu, stand-in in src/engine/no_cuda.c. Everything here receives validated
 * arguments (src/kernels/ checks them on the host first); it only moves data and launches. */
#ifndef FLAME_KERNELS_GPU_H
#define FLAME_KERNELS_GPU_H

#include "core/common.h"
#include "flame/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FL_TBE_MAX_TABLES 64

/* One table of an embedding bag handle; data/qparams are device pointers on a GPU handle. */
typedef struct fl_tbe_table {
    flame_dtype dtype; /* as the caller gave it, and as held */
    flame_pooling pooling;
    int64_t rows;
    int32_t dim;
    int32_t col;  /* first output column */
    void *data;   /* [rows, dim] of dtype */
    float *qparams; /* INT8: [rows, 2] */
    bool owned;   /* freed with the handle */
} fl_tbe_table;

/* One table's validated lookups (host arrays, as the caller gave them). */
typedef struct fl_tbe_lookup {
    const int64_t *ids, *offsets; /* offsets NULL: bag b = {ids[b]} */
    int64_t num_ids;
    const float *weights;
} fl_tbe_lookup;

/* The index record of a GPU embedding bag (device memory, one per handle), written by the
 * validation kernel of device_indices forwards. key orders the bad values as the host checks
 * meet them: (table << 56) | (phase << 55) | (position << 1) | sub, phase 0 for offsets[position],
 * 1 for ids[position] (sub 0) and weights[position] (sub 1); UINT64_MAX: nothing found. The
 * validation kernel lowers key with atomicMin; its last block to finish describes the smallest
 * key in the fields below (detail_key says which key they describe). */
typedef struct fl_tbe_index_record {
    uint64_t key;
    uint64_t detail_key;
    int32_t kind; /* FL_TBE_BAD_* */
    int32_t table;
    int64_t bag, index, value;
    int64_t prev;    /* OFFSET_ORDER: offsets[bag] */
    int64_t num_ids; /* the table's num_ids */
    double weight;   /* WEIGHT: the weight */
    /* blocks of the running validation launch that are done (the last one describes the key
     * and sets it back to 0); not cleared with the fields above */
    uint32_t blocks_done;
    uint32_t pad;
} fl_tbe_index_record;

enum {
    FL_TBE_BAD_OFFSET_START = 0, /* offsets[0] != 0 */
    FL_TBE_BAD_OFFSET_ORDER = 1, /* offsets[bag + 1] outside offsets[bag] .. num_ids */
    FL_TBE_BAD_OFFSET_END = 2,   /* offsets[batch] != num_ids */
    FL_TBE_BAD_ID = 3,           /* ids[index] outside 0..rows-1 */
    FL_TBE_BAD_WEIGHT = 4        /* weights[index] not finite */
};

/* FLAME_OK when `device` is a usable CUDA device; FLAME_ERR_UNSUPPORTED without CUDA,
 * FLAME_ERR_NO_DEVICE (with the reason) otherwise. */
flame_status fl_gpu_kernels_device(int device);

/* FLAME_OK when kernels on `device` may access p (device memory of that device, managed or
 * page-locked host memory); FLAME_ERR_INVALID_ARG naming `what` otherwise. */
flame_status fl_gpu_kernels_check_pointer(int device, const void *p, const char *what);

/* Device copy of `bytes` of host memory (synchronous: creation time); *dev NULL for 0 bytes. */
flame_status fl_gpu_kernels_upload(int device, const void *host, size_t bytes, void **dev);
void fl_gpu_kernels_free(int device, void *dev);

/* Host -> device copy enqueued on `stream` through libflame's page-locked staging (the host
 * memory may be reused on return). */
flame_status fl_gpu_kernels_copy_in(int device, void *dev, const void *host, size_t bytes, void *stream);

/* The embedding bag on device tables: ids/offsets/weights are host arrays (lengths not yet
 * checked), validated and packed into page-locked staging by `threads` threads
 * (fl_tbe_check_pack; a bad value enqueues nothing), copied in on `stream`, then one launch of
 * the engine's kernel. */
flame_status fl_gpu_tbe_forward(int device, const fl_tbe_table *tables, int num_tables, bool sum_combine,
                                int32_t width, const fl_tbe_lookup *lookups, int64_t batch, void *out, int64_t ld_out,
                                flame_dtype out_dtype, void *stream, int threads);

/* The same with ids/offsets/weights in device memory (lengths validated): checked on `stream`
 * by a validation kernel that lowers record->key, and the lookup writes nothing while
 * record->key is set (a CUDA build only; see tbe_no_cuda.c). */
flame_status fl_gpu_tbe_forward_device(int device, const fl_tbe_table *tables, int num_tables, bool sum_combine,
                                       int32_t width, const fl_tbe_lookup *lookups, int64_t batch, void *out,
                                       int64_t ld_out, flame_dtype out_dtype, void *stream,
                                       fl_tbe_index_record *record);

/* A handle's index record (device memory, reset to nothing found) and its page-locked host
 * mirror; made at creation (synchronous). */
flame_status fl_gpu_tbe_record_create(int device, fl_tbe_index_record **record, fl_tbe_index_record **mirror);
void fl_gpu_tbe_record_free(int device, fl_tbe_index_record *record, fl_tbe_index_record *mirror);

/* Copies the record to the mirror and resets it on `stream`, waits for the stream; the
 * caller serializes calls on one handle. */
flame_status fl_gpu_tbe_record_read(int device, fl_tbe_index_record *record, fl_tbe_index_record *mirror,
                                    void *stream);

/* One sequence of an attention batch (validated). */
typedef struct fl_attn_seq {
    int64_t row;    /* first packed row */
    int32_t n_hist; /* keys with the causal history mask (all keys under NONE and CAUSAL) */
    int32_t len;    /* rows */
} fl_attn_seq;

/* SUMI attention on the device through the engine's dispatcher (fl_cuda_attention);
 * none_mask: every query sees all len keys; fused: q, k and v are column blocks of one array
 * (checked as one device pointer). The tile plan is written into page-locked staging and
 * copied in on `stream`; nothing is allocated per call. */
flame_status fl_gpu_attention(int device, flame_dtype dtype, const fl_attn_seq *seqs, int64_t num_seqs,
                              int64_t rows, bool none_mask, int32_t heads, int32_t dh, const void *q, int64_t ldq,
                              const void *k, const void *v, int64_t ldkv, void *out, int64_t ldo, bool fused,
                              void *stream);

#ifdef __cplusplus
}
#endif
#endif
