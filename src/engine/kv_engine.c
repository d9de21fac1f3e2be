/* The engine's side of the KV cache: made from FLAME_OPT_KV_CACHE_BYTES and
 * FLAME_OPT_KV_CACHE_BLOCK_TOKENS at creation (bookkeeping in src/kvcache; blocks placed by
 * the backend's kv_place, engine/backend.h: host memory or device memory, in the compute dtype), the
 * checks of the requests' kv_cache fields, and its stats. */
#include <stdio.h>
#include <stdlib.h>

#include "engine/engine.h"
#include "kvcache/kvcache.h"

flame_status fl_kv_engine_init(struct flame_engine *e)
{
    const struct flame_config *cfg = &e->cfg;
    if (cfg->kv_cache_bytes == 0) return FLAME_OK;
    const fl_model_cfg *c = &e->model->cfg;
    /* the backend's compute dtype: float32 on the CPU, the configured dtype on a GPU */
    const int32_t elem = e->ops->kv_elem_bytes(e);
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
    st = e->ops->kv_place(e); /* host or device memory, as the backend reads it */
    if (st) {
        fl_kv_cache_destroy(e->kv);
        e->kv = NULL;
    }
    return st;
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
