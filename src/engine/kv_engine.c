/* The engine's side of the KV cache: made from FLAME_OPT_KV_CACHE_BYTES and
 * FLAME_OPT_KV_CACHE_BLOCK_TOKENS at creation (bookkeeping in src/kvcache; blocks in host
 * memory for the CPU engine, in device memory for the GPU engine, in the compute dtype), the
 * checks of the requests' kv_cache fields, and its stats. */
#include <stdio.h>
#include <stdlib.h>

#include "engine/cuda_backend.h"
#include "engine/engine.h"
#include "kvcache/kvcache.h"

flame_status fl_kv_engine_init(struct flame_engine *e)
{
    const struct flame_config *cfg = &e->cfg;
    if (cfg->kv_cache_bytes == 0) return FLAME_OK;
    const fl_model_cfg *c = &e->model->cfg;
    /* the compute dtype's elements: float32 on the CPU, the configured dtype on the GPU */
    const int32_t elem = e->gpu && fl_config_dtype(cfg) != FL_COMPUTE_FP32 ? 2 : (int32_t)sizeof(float);
    e->kv_lay = (fl_kv_layout){.layers = c->num_blocks, .d = c->d_model, .block_tokens = (int32_t)cfg->kv_cache_block_tokens,
                               .elem_bytes = elem};
    /* a model without blocks has no K or V: a token still takes one row (never read) */
    fl_kv_layout sizing = e->kv_lay;
    if (sizing.layers == 0) sizing.layers = 1;
    if (c->num_blocks == 0) e->kv_lay.layers = 1;
    fl_kv_params p = {.budget_bytes = (uint64_t)cfg->kv_cache_bytes, .block_tokens = e->kv_lay.block_tokens,
                      .token_bytes = fl_kv_token_bytes(&sizing), .max_tokens = c->max_len};
    flame_status st = fl_kv_cache_create(&p, &e->kv);
    if (st) {
        char why[256];
        snprintf(why, sizeof why, "%s", flame_last_error());
        return fl_error(st, "FLAME_OPT_KV_CACHE_BYTES = %lld with FLAME_OPT_KV_CACHE_BLOCK_TOKENS = %lld: %s",
                        (long long)cfg->kv_cache_bytes, (long long)cfg->kv_cache_block_tokens, why);
    }
    const uint64_t bytes = (uint64_t)fl_kv_num_blocks(e->kv) * fl_kv_block_bytes(e->kv);
    if (e->gpu) { /* the blocks live on the device, in the engine's device bytes */
        st = fl_cuda_kv_attach(e->gpu, e->kv, &e->kv_lay);
        if (st) {
            fl_kv_cache_destroy(e->kv);
            e->kv = NULL;
            return st;
        }
        fl_log(FLAME_LOG_INFO, "KV cache on the device: %d blocks of %d tokens, %llu bytes a token (%d layers, K and V, "
               "d_model %d, %s)", fl_kv_num_blocks(e->kv), e->kv_lay.block_tokens, (unsigned long long)p.token_bytes,
               c->num_blocks, c->d_model, cfg->dtype);
        return FLAME_OK;
    }
    e->kv_blocks = fl_aligned_alloc((size_t)bytes);
    if (!e->kv_blocks) {
        fl_kv_cache_destroy(e->kv);
        e->kv = NULL;
        return fl_error(FLAME_ERR_NOMEM, "out of memory for the KV cache's %llu bytes of blocks", (unsigned long long)bytes);
    }
    fl_log(FLAME_LOG_INFO, "KV cache: %d blocks of %d tokens, %llu bytes a token (%d layers, K and V, d_model %d, fp32)",
           fl_kv_num_blocks(e->kv), e->kv_lay.block_tokens, (unsigned long long)p.token_bytes, c->num_blocks, c->d_model);
    return FLAME_OK;
}

void fl_kv_engine_free(struct flame_engine *e)
{
    fl_kv_cache_destroy(e->kv);
    fl_aligned_free(e->kv_blocks);
    e->kv = NULL;
    e->kv_blocks = NULL;
}

flame_status fl_kv_check_requests(const struct flame_engine *e, const flame_request *reqs, size_t n)
{
    for (size_t r = 0; r < n; r++) {
        const flame_request *q = &reqs[r];
        if (q->kv_cache != 0 && q->kv_cache != 1)
            return fl_error(FLAME_ERR_INVALID_ARG, "request %zu: kv_cache = %d, must be 0 or 1", r, (int)q->kv_cache);
        if (q->kv_cache == 1 && !e->kv)
            return fl_error(FLAME_ERR_INVALID_ARG,
                            "request %zu: kv_cache = 1 but the engine has no KV cache (FLAME_OPT_KV_CACHE_BYTES is 0)", r);
    }
    return FLAME_OK;
}
