/* The CPU engine: workspaces, request validation and the forward pass (never installed). */
#ifndef FLAME_ENGINE_ENGINE_H
#define FLAME_ENGINE_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "core/options.h"
#include "engine/backend.h"
#include "metrics/histogram.h"
#include "kvcache/kvlayout.h"
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
    /* requests in this header's layout, histories read from the user cache (engine/user_history.c) */
    void *prep[2];
    size_t prep_cap[2];
    uint64_t tokens_us;        /* token assembly of the current call (fl_forward_cpu adds to it) */
} fl_workspace;

/* The stages an engine times: flame/metrics.h flame_stage FEATURES..SOURCE_FETCH (the
 * histograms are indexed by the stage; QUEUE_WAIT's stays empty). */
enum { FL_ENGINE_STAGES = FLAME_STAGE_SOURCE_FETCH + 1 };

struct fl_cuda_engine;
struct fl_cpu_plan;

struct flame_engine {
    struct flame_model *model;
    const fl_backend_ops *ops;  /* what the passes run on, chosen at creation (engine/backend.h) */
    /* the backends' own state: gpu is read by engine/backend_cuda.c alone; cpu (NULL unless the
     * CPU backend made it) by the CPU backend and its pass */
    struct fl_cuda_engine *gpu; /* the CUDA backend's device engine (cuda/engine.cuh) */
    struct fl_cpu_plan *cpu;    /* the CPU backend's kernel choice and packed weights (engine/cpu_plan.h) */
    int threads;                /* FLAME_OPT_THREADS resolved (>= 1): the CPU pass's threads (core/pool.h) */
    struct flame_config cfg;
    pthread_mutex_t pool_lock;
    fl_workspace *free_list; /* workspaces not in use; all are freed at destroy */
    atomic_uint_fast64_t calls, requests, workspaces, scratch_bytes, max_workspace_bytes;
    struct flame_item_cache *item_cache; /* NULL: callers give side features themselves */
    struct flame_user_cache *user_cache; /* NULL: requests give their histories themselves */
    atomic_uint_fast64_t user_cache_hits, user_cache_misses;
    atomic_bool warned_blas_threads; /* the oversubscription warning of fl_workspace_acquire, once */
    /* metrics (flame/metrics.h): per-stage latency of successful calls, indexed by flame_stage */
    fl_histogram stage[FL_ENGINE_STAGES];
    atomic_uint_fast64_t candidates, tokens;
    /* the user-history KV cache (FLAME_OPT_KV_CACHE_BYTES; NULL: none): its bookkeeping, and
     * its blocks in host memory (the CPU engine), laid out by kv_lay */
    struct fl_kv_cache *kv;
    uint8_t *kv_blocks;
    fl_kv_layout kv_lay;
    /* candidate tokens per chunk of a kv_cache request on the CPU: the largest max_candidates
     * of the profiles a scheduler gave last (fl_engine_adopt_profiles), so a request the
     * scheduler keeps whole runs in the chunks its batches would have had; 0: fl_plan_chunk's */
    atomic_int kv_chunk;
};


/* *out = *q in this header's layout (the rule of core/abi.h: the fields q's header lacks read
 * 0, a newer header's extra fields are dropped). `avail` is q's struct_size, already checked. */
static inline void fl_request_current(const flame_request *q, size_t avail, flame_request *out)
{ /* (as fl_struct_in with zero defaults, without its check: done once per array) */
    memset(out, 0, sizeof *out);
    memcpy(out, q, avail < sizeof *out ? avail : sizeof *out);
    out->struct_size = sizeof *out;
}

/* Request r of an array whose elements are `stride` bytes apart (request 0's struct_size):
 * INVALID_ARG naming both sizes unless its struct_size is the stride (every request of one
 * call comes from one flame.h). Checked before the request is read as that many bytes. */
flame_status fl_request_stride_check(const void *reqs, size_t stride, size_t r);

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

typedef enum fl_check_mode {
    FL_CHECK_ALL = 0,
    /* everything but the bags of id-only requests (no history_side, and under the sumi head no
     * candidate_side), which the item cache fills: run before the cache is asked, so a request
     * refused for its ids or lengths never reaches the feature source */
    FL_CHECK_DEFER_BAGS = 1
} fl_check_mode;

/* Checks every request against the model before anything is computed; on success
 * *total_scores = sum of num_candidates * num_tasks. FLAME_ERR_INVALID_ARG naming the
 * request, token, feature and id. */
flame_status fl_validate_requests(const struct flame_model *m, const flame_request *reqs, size_t n,
                                  uint64_t *total_scores, fl_check_mode mode);
/* fl_validate_requests with the requests split over up to `threads` pool threads when they
 * hold enough ids (the same status and message as the serial checks). */
flame_status fl_validate_requests_mt(const struct flame_model *m, const flame_request *reqs, size_t n,
                                     uint64_t *total_scores, fl_check_mode mode, int threads);
/* After FL_CHECK_DEFER_BAGS and fl_resolve_features: the bags resolved[r] got from the item
 * cache for the id-only requests of `given` (their structure, and the side ids' ranges: a
 * source's records are data like any other). */
flame_status fl_validate_resolved(const struct flame_model *m, const flame_request *given,
                                  const flame_request *resolved, size_t n);
/* The CSR structure (offsets[0] == 0, non-decreasing, offsets[n] == num_ids, ids set) of one
 * token list's side bags (`side` has the model's side slots, `n` tokens), as validation checks
 * it: for callers that cut bags before validation (the scheduler's split requests). */
flame_status fl_check_side_bags(const struct flame_model *m, size_t r, const char *what, const flame_bags *side,
                                size_t n);
/* An output of a call: the caller's bytes [p, p + bytes), named in messages. */
typedef struct fl_out_range {
    const void *p;
    size_t bytes;
    const char *name;
} fl_out_range;
/* After validation: FLAME_ERR_INVALID_ARG when an output shares a byte with the requests
 * (num_requests structs of the caller's, stride bytes apart) or with an array a request has
 * the library read (history, candidates, their side bags, each bag's offsets and ids).
 * Outputs are written pass by pass and requests are read again later (the next pass, top-k's
 * ids), so an id overwritten by a score's bits would be used unchecked. reqs: the requests
 * already read into this header's struct, or NULL to read each here. */
flame_status fl_check_outputs_apart(const flame_request *requests, size_t num_requests, size_t stride,
                                    const flame_request *reqs, const fl_out_range *outs, int num_outs);
/* Candidates of one request at most (GEMM dimensions go to CBLAS as 32-bit ints). */
#define FL_MAX_CANDIDATES (1 << 24)

/* Scratch bytes fl_forward_cpu needs for these requests (reserve it first so a call either
 * gets all its memory or fails before writing anything). */
size_t fl_forward_bytes(const struct flame_engine *e, const flame_request *reqs, size_t n, int64_t *tokens);

/* Scores n validated requests in one pass into `scores` (their concatenated blocks). */
flame_status fl_forward_cpu(struct flame_engine *e, fl_workspace *ws, const flame_request *reqs, size_t n,
                            float *scores);

/* One request scored against its history alone (engine/forward_kv.c, executing
 * engine/plan.h): with kv_cache = 1 the rows the engine's KV cache holds are read, the others
 * computed and stored; candidates run in chunks. */
flame_status fl_forward_cpu_kv(struct flame_engine *e, fl_workspace *ws, const flame_request *q, float *scores);
/* Scratch bytes of fl_forward_cpu_kv for q (whatever the cache holds). */
size_t fl_forward_kv_bytes(const struct flame_engine *e, const flame_request *q);
/* Checks the kv_cache fields of validated requests against the engine (engine/kv_engine.c). */
flame_status fl_kv_check_requests(const struct flame_engine *e, const flame_request *reqs, size_t n);
/* Makes the engine's KV cache from its config (none when the budget is 0). */
flame_status fl_kv_engine_init(struct flame_engine *e);
void fl_kv_engine_free(struct flame_engine *e);

/* The embedding view of feature f over a token list (items, side bags), from token `first` on. */
struct fl_emb_feature fl_feature_view(const fl_model_cfg *c, const struct flame_model *m, int f, const int64_t *items,
                                      const flame_bags *side, int64_t first);

/* flame_score_batch_topk's outputs: ids/scores [num_requests, k], ranked by column task. */
typedef struct fl_topk_spec {
    uint32_t k, task;
    int64_t *ids;
    float *scores;
} fl_topk_spec;
/* flame_score_batch's path (requests `stride` bytes apart) with the k best of each request
 * selected by the backend's score_topk (engine/backend.h), written to topk's outputs. */
flame_status fl_score_topk_device(struct flame_engine *e, const flame_request *requests, size_t num_requests,
                               size_t stride, const fl_topk_spec *topk);

/* For requests that give no side features, builds them from the engine's item cache into
 * ws and points *out at copies of the requests that carry them (else *out = reqs); *ft gets
 * what the cache's lookup spent on the feature source (icache/icache.h). */
struct fl_fetch_time;
flame_status fl_resolve_features(struct flame_engine *e, fl_workspace *ws, const flame_request *reqs, size_t n,
                                 const flame_request **out, struct fl_fetch_time *ft);
void fl_workspace_free_features(fl_workspace *ws);

/* Grows a buffer of a workspace to at least `bytes` (kept for the next calls); NULL on OOM. */
void *fl_workspace_grow(void **buf, size_t *cap, size_t bytes);

/* True when the requests (`stride` bytes apart) must go through fl_prepare_requests: some are
 * of an older layout than this header's, or take their history from the user cache. */
bool fl_requests_need_prepare(const void *reqs, size_t n, size_t stride);
/* Copies the requests into ws in this header's layout (fields a caller's struct_size does not
 * cover read as 0) and, for those with history_from_user_cache, points history at the user's
 * history read from the engine's user cache (a miss: empty). *out points at the copies;
 * *hits and *misses count the lookups. FLAME_ERR_INVALID_ARG naming the request (and the
 * user, position and id of a bad cached item id); FLAME_ERR_NOMEM. */
flame_status fl_prepare_requests(struct flame_engine *e, fl_workspace *ws, const void *reqs, size_t n, size_t stride,
                                 const flame_request **out, uint64_t *hits, uint64_t *misses);

#endif
