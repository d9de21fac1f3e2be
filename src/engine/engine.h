/* The CPU engine: workspaces, request validation and the forward pass (never installed). */
#ifndef FLAME_ENGINE_ENGINE_H
#define FLAME_ENGINE_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>

#include "core/options.h"
#include "model/model.h"

/* A growable 64-byte aligned arena, private to one call at a time. */
typedef struct fl_workspace {
    struct fl_workspace *next; /* free-list link */
    uint8_t *base;
    size_t cap, used;
    /* item features resolved through the item cache (engine/features.c) */
    void *feat[2];
    size_t feat_cap[2];
    struct flame_feature_batch *records;
} fl_workspace;

struct fl_cuda_engine;

struct flame_engine {
    struct flame_model *model;
    struct fl_cuda_engine *gpu; /* non-NULL: the forward pass runs on this GPU backend */
    int threads;                /* FLAME_OPT_THREADS resolved (>= 1) */
    struct flame_config cfg;
    pthread_mutex_t pool_lock;
    fl_workspace *free_list; /* workspaces not in use; all are freed at destroy */
    atomic_uint_fast64_t calls, requests, workspaces, scratch_bytes, max_workspace_bytes;
    struct flame_item_cache *item_cache; /* NULL: callers give side features themselves */
};

/* Takes a workspace from the pool (or makes one); NULL on OOM. */
fl_workspace *fl_workspace_acquire(struct flame_engine *e);
void fl_workspace_release(struct flame_engine *e, fl_workspace *ws);
/* Ensures capacity for `bytes` (contents discarded); records the growth in the stats. */
flame_status fl_workspace_reserve(struct flame_engine *e, fl_workspace *ws, size_t bytes);
/* Carves the next 64-byte aligned piece (after reserve; never fails within the plan). */
void *fl_workspace_take(fl_workspace *ws, size_t bytes);
/* Rounds a size up to the carving granularity, for planning. */
static inline size_t fl_ws_round(size_t bytes)
{
    return (bytes + 63) & ~(size_t)63;
}

/* Checks every request against the model before anything is computed; on success
 * *total_scores = sum of num_candidates * num_tasks. FLAME_ERR_INVALID_ARG naming the
 * request, token, feature and id. */
flame_status fl_validate_requests(const struct flame_model *m, const flame_request *reqs, size_t n,
                                  uint64_t *total_scores);

/* Scratch bytes fl_forward_cpu needs for these requests (reserve it first so a call either
 * gets all its memory or fails before writing anything). */
size_t fl_forward_bytes(const struct flame_model *m, const flame_request *reqs, size_t n, int64_t *tokens);

/* Scores n validated requests in one pass into `scores` (their concatenated blocks). */
flame_status fl_forward_cpu(struct flame_engine *e, fl_workspace *ws, const flame_request *reqs, size_t n,
                            float *scores);

/* For requests that give no side features, builds them from the engine's item cache into
 * ws and points *out at copies of the requests that carry them (else *out = reqs). */
flame_status fl_resolve_features(struct flame_engine *e, fl_workspace *ws, const flame_request *reqs, size_t n,
                                 const flame_request **out);
void fl_workspace_free_features(fl_workspace *ws);

#endif
