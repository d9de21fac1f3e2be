/* Engine lifetime, device choice (the backend, engine/backend.h) and statistics. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "icache/icache.h"
#include "core/abi.h"
#include "ucache/user_cache.h"
#include "core/device.h"
#include "engine/engine.h"
#include "kvcache/kvcache.h"

/* Resolves the device option: -1 for the CPU, else the CUDA ordinal. "auto" falls back to
 * the CPU and says why through the log hook; "cuda"/"cuda:N" fail when unusable. */
static flame_status choose_device(const struct flame_config *cfg, int *ordinal)
{
    char why[256] = "";
    *ordinal = -1;
    if (!strcmp(cfg->device, "cpu")) return FLAME_OK;
    int count = fl_cuda_device_count(why, sizeof why);
    if (!strcmp(cfg->device, "auto")) {
        if (count > 0) {
            *ordinal = 0;
            return FLAME_OK;
        }
        fl_log(FLAME_LOG_INFO, "device 'auto': using the CPU (%s)", why);
        return FLAME_OK;
    }
    int n = cfg->device[4] == ':' ? atoi(cfg->device + 5) : 0;
    if (count == 0) return fl_error(FLAME_ERR_NO_DEVICE, "device '%s': %s", cfg->device, why);
    if (n >= count)
        return fl_error(FLAME_ERR_NO_DEVICE, "device '%s': only %d CUDA device(s) present", cfg->device, count);
    *ordinal = n;
    return FLAME_OK;
}

/* The checks a cache passes before an engine holds it (at creation or by a setter). */
static flame_status check_item_cache(const flame_model *model, const flame_item_cache *cache)
{
    if (cache && cache->num_slots != model->cfg.num_side)
        return fl_error(FLAME_ERR_INVALID_ARG, "the item cache's records have %d slots, the model has %d side features",
                        cache->num_slots, model->cfg.num_side);
    return FLAME_OK;
}

static void warn_short_user_cache(const flame_model *model, const flame_user_cache *cache)
{
    if (cache && cache->lay.max_ids < (uint32_t)model->cfg.max_len) /* legal, but rarely meant */
        fl_log(FLAME_LOG_WARN,
               "user cache '%s' holds at most %u ids a user, fewer than the model's window of %d: histories read "
               "from it are at most %u items long",
               cache->name, cache->lay.max_ids, model->cfg.max_len, cache->lay.max_ids);
}

FLAME_API flame_status flame_engine_create(flame_model *model, const flame_config *config, flame_engine **out)
{
    fl_clear_error();
    if (out) *out = NULL;
    if (!model || !out) return fl_error(FLAME_ERR_INVALID_ARG, "flame_engine_create: NULL model or out");
    struct flame_config cfg;
    if (config)
        cfg = *config;
    else
        fl_config_defaults(&cfg);
    int ordinal = -1;
    flame_status st = check_item_cache(model, cfg.item_cache);
    if (!st) st = choose_device(&cfg, &ordinal);
    if (st) return st;
    struct flame_engine *e = calloc(1, sizeof *e);
    if (!e) return fl_error(FLAME_ERR_NOMEM, "out of memory allocating an engine");
    if (pthread_mutex_init(&e->pool_lock, NULL) != 0) {
        free(e);
        return fl_error(FLAME_ERR_INTERNAL, "pthread_mutex_init failed");
    }
    e->model = model;
    e->cfg = cfg;
    e->threads = cfg.threads > 0 ? (int)cfg.threads : openblas_get_num_threads();
    if (e->threads < 1) e->threads = 1;
    e->ops = ordinal >= 0 ? &fl_backend_cuda : &fl_backend_cpu; /* the one choice of backend */
    st = e->ops->create(e, ordinal);
    if (!st) {
        st = fl_kv_engine_init(e);
        if (st) e->ops->destroy(e);
    }
    if (st) {
        pthread_mutex_destroy(&e->pool_lock);
        free(e);
        return st;
    }
    fl_model_retain(model);
    /* the caches named by the config are the engine's for its life; the config only borrowed them */
    e->item_cache = cfg.item_cache;
    e->user_cache = cfg.user_cache;
    e->cfg.item_cache = NULL;
    e->cfg.user_cache = NULL;
    if (e->item_cache) fl_icache_retain(e->item_cache);
    if (e->user_cache) fl_uc_retain(e->user_cache);
    warn_short_user_cache(model, e->user_cache);
    /* batch profiles ready before the first request (after the KV cache took its memory) */
    if (e->ops->warm_profiles(e) != FLAME_OK)
        fl_log(FLAME_LOG_WARN, "warming the batch profiles: %s (they warm on first use)", flame_last_error());
    *out = e;
    return FLAME_OK;
}

FLAME_API void flame_engine_destroy(flame_engine *engine)
{
    if (!engine) return;
    engine->ops->destroy(engine);
    for (fl_workspace *ws = engine->free_list, *next; ws; ws = next) {
        next = ws->next;
        fl_workspace_free_features(ws);
        fl_aligned_free(ws->base);
        free(ws);
    }
    pthread_mutex_destroy(&engine->pool_lock);
    fl_kv_engine_free(engine);
    fl_icache_release(engine->item_cache);
    fl_uc_release(engine->user_cache);
    fl_model_release(engine->model);
    free(engine);
}

FLAME_API flame_status flame_engine_get_stats(flame_engine *engine, flame_engine_stats *stats)
{
    fl_clear_error();
    if (!engine || !stats) return fl_error(FLAME_ERR_INVALID_ARG, "flame_engine_get_stats: NULL argument");
    flame_engine_stats v = {
        .struct_size = sizeof v,
        .calls = atomic_load(&engine->calls),
        .requests = atomic_load(&engine->requests),
        .workspaces = atomic_load(&engine->workspaces),
        .scratch_bytes = atomic_load(&engine->scratch_bytes),
        .max_workspace_bytes = atomic_load(&engine->max_workspace_bytes),
        .device_bytes = engine->ops->device_bytes(engine),
        .device_weight_bytes = engine->ops->weight_bytes(engine),
        .user_cache_hits = atomic_load(&engine->user_cache_hits),
        .user_cache_misses = atomic_load(&engine->user_cache_misses),
    };
    engine->ops->graph_counts(engine, &v.graph_captures, &v.graph_replays);
    engine->ops->profile_counts(engine, &v.profile_passes, &v.profile_padding_tokens);
    if (engine->kv) {
        fl_kv_stats ks;
        fl_kv_get_stats(engine->kv, &ks);
        const uint64_t bb = fl_kv_block_bytes(engine->kv);
        v.kv_cache_hits = ks.hits;
        v.kv_cache_misses = ks.misses;
        v.kv_cache_extensions = ks.extensions;
        v.kv_cache_evictions = ks.evictions;
        v.kv_cache_bytes = ks.blocks_in_use * bb;
        v.kv_cache_peak_bytes = ks.peak_blocks_in_use * bb;
        v.kv_cache_budget_bytes = (uint64_t)fl_kv_num_blocks(engine->kv) * bb;
        v.kv_cache_tokens_computed = ks.tokens_computed;
        v.kv_cache_tokens_saved = ks.tokens_saved;
    }
    return fl_struct_out("flame_engine_stats", stats, &v, sizeof v);
}

/* the item cache that fills side features of id-only requests, after creation (0.2.x
 * compatibility; FLAME_OPT_ITEM_CACHE gives it at creation) */
FLAME_API flame_status flame_engine_set_item_cache(flame_engine *engine, flame_item_cache *cache)
{
    fl_clear_error();
    if (!engine) return fl_error(FLAME_ERR_INVALID_ARG, "flame_engine_set_item_cache: engine is NULL");
    flame_status st = check_item_cache(engine->model, cache);
    if (st) return st;
    if (cache) fl_icache_retain(cache);
    fl_icache_release(engine->item_cache);
    engine->item_cache = cache;
    return FLAME_OK;
}

/* The user cache that holds the histories of requests giving a user id only (engine/user_history.c),
 * after creation (0.2.x compatibility; FLAME_OPT_USER_CACHE gives it at creation) */
FLAME_API flame_status flame_engine_set_user_cache(flame_engine *engine, flame_user_cache *cache)
{
    fl_clear_error();
    if (!engine) return fl_error(FLAME_ERR_INVALID_ARG, "flame_engine_set_user_cache: engine is NULL");
    warn_short_user_cache(engine->model, cache);
    if (cache) fl_uc_retain(cache);
    fl_uc_release(engine->user_cache);
    engine->user_cache = cache;
    return FLAME_OK;
}
