/* Engine lifetime and statistics. */
#include <stdlib.h>
#include <string.h>

#include "cache/icache.h"
#include "core/device.h"
#include "engine/engine.h"

/* Resolves the device option. The forward pass runs on the CPU in this version: "auto" says
 * so through the log hook, "cuda" is refused with the reason. */
static flame_status choose_device(const struct flame_config *cfg)
{
    char why[256] = "";
    if (!strcmp(cfg->device, "cpu")) return FLAME_OK;
    int count = fl_cuda_device_count(why, sizeof why);
    if (!strcmp(cfg->device, "auto")) {
        fl_log(FLAME_LOG_INFO, "device 'auto': using the CPU (%s)",
               count ? "this version has no CUDA forward pass" : why);
        return FLAME_OK;
    }
    int ordinal = cfg->device[4] == ':' ? atoi(cfg->device + 5) : 0;
    if (count == 0) return fl_error(FLAME_ERR_NO_DEVICE, "device '%s': %s", cfg->device, why);
    if (ordinal >= count)
        return fl_error(FLAME_ERR_NO_DEVICE, "device '%s': only %d CUDA device(s) present", cfg->device, count);
    return fl_error(FLAME_ERR_UNSUPPORTED, "device '%s': this version has no CUDA forward pass; use 'cpu' or 'auto'",
                    cfg->device);
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
    flame_status st = choose_device(&cfg);
    if (st) return st;
    struct flame_engine *e = calloc(1, sizeof *e);
    if (!e) return fl_error(FLAME_ERR_NOMEM, "out of memory allocating an engine");
    if (pthread_mutex_init(&e->pool_lock, NULL) != 0) {
        free(e);
        return fl_error(FLAME_ERR_INTERNAL, "pthread_mutex_init failed");
    }
    e->cfg = cfg;
    e->model = model;
    fl_model_retain(model);
    *out = e;
    return FLAME_OK;
}

FLAME_API void flame_engine_destroy(flame_engine *engine)
{
    if (!engine) return;
    for (fl_workspace *ws = engine->free_list, *next; ws; ws = next) {
        next = ws->next;
        fl_workspace_free_features(ws);
        fl_aligned_free(ws->base);
        free(ws);
    }
    pthread_mutex_destroy(&engine->pool_lock);
    fl_icache_release(engine->item_cache);
    fl_model_release(engine->model);
    free(engine);
}

FLAME_API flame_status flame_engine_get_stats(flame_engine *engine, flame_engine_stats *stats)
{
    fl_clear_error();
    if (!engine || !stats) return fl_error(FLAME_ERR_INVALID_ARG, "flame_engine_get_stats: NULL argument");
    if (stats->struct_size < sizeof(flame_engine_stats))
        return fl_error(FLAME_ERR_INVALID_ARG, "flame_engine_stats.struct_size = %zu, expected at least %zu",
                        stats->struct_size, sizeof(flame_engine_stats));
    stats->calls = atomic_load(&engine->calls);
    stats->requests = atomic_load(&engine->requests);
    stats->workspaces = atomic_load(&engine->workspaces);
    stats->scratch_bytes = atomic_load(&engine->scratch_bytes);
    stats->max_workspace_bytes = atomic_load(&engine->max_workspace_bytes);
    return FLAME_OK;
}

/* issue 4: the item cache that fills side features of id-only requests */
FLAME_API flame_status flame_engine_set_item_cache(flame_engine *engine, flame_item_cache *cache)
{
    fl_clear_error();
    if (!engine) return fl_error(FLAME_ERR_INVALID_ARG, "flame_engine_set_item_cache: engine is NULL");
    if (cache && cache->num_slots != engine->model->cfg.num_side)
        return fl_error(FLAME_ERR_INVALID_ARG, "the item cache's records have %d slots, the model has %d side features",
                        cache->num_slots, engine->model->cfg.num_side);
    if (cache) fl_icache_retain(cache);
    fl_icache_release(engine->item_cache);
    engine->item_cache = cache;
    return FLAME_OK;
}
