/* The engine options behind the opaque flame_config (shared by api and engine). */
#ifndef FLAME_CORE_OPTIONS_H
#define FLAME_CORE_OPTIONS_H

#include "core/common.h"

typedef enum fl_dtype_opt { FL_COMPUTE_FP32 = 0, FL_COMPUTE_FP16 = 1, FL_COMPUTE_BF16 = 2 } fl_dtype_opt;

struct flame_config {
    char device[32];              /* "cpu", "auto", "cuda", "cuda:N" */
    int64_t max_batch;            /* requests per pass */
    char dtype[8];                /* "fp32", "fp16", "bf16" */
    char cpu_kernels[8];          /* "auto", "avx512", "avx2", "blas" */
    char batch_profiles[512];     /* "UxC[xL],...", "" = none (engine/batch_profiles.h) */
    int64_t device_memory_budget; /* bytes, 0 = no limit */
    void *cuda_stream;            /* the caller's cudaStream_t, or NULL for the engine's own */
    int64_t cuda_executors;       /* GPU executors (streams with their own buffers) */
    int64_t cuda_graphs;          /* 1: capture and replay CUDA graphs */
    int64_t cuda_attention;       /* 1: the portable attention kernel on every GPU */
    int64_t threads;              /* FLAME_OPT_THREADS: CPU threads one call runs on; 0 = the BLAS's count */
    int64_t kv_cache_bytes;       /* the user-history KV cache's budget, 0 = none */
    int64_t kv_cache_block_tokens; /* tokens a block of it holds */
    /* the caches the engine reads, borrowed by the config (the engine takes references) */
    struct flame_item_cache *item_cache;
    struct flame_user_cache *user_cache;
};

void fl_config_defaults(struct flame_config *c);
fl_dtype_opt fl_config_dtype(const struct flame_config *c);

#endif
