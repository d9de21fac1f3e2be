/*
 * libflame: metrics of engines and schedulers, and their Prometheus text exposition.
 *
 * Part of the public API; included by flame/flame.h, and usable on its own. The conventions at
 * the top of flame/flame.h (statuses, ownership, units, the struct_size rule) hold here too.
 *
 * Every engine times the stages of each successful scoring call, and every scheduler the
 * queue wait and the whole life of each request, into latency histograms (log-linear, within
 * 6.25%); flame_*_get_latency reads their percentiles, flame_metrics_text writes everything,
 * with the counters and gauges of the engine, its caches, the scheduler and a pinned pool, in
 * the Prometheus text format for a host's /metrics endpoint. docs/metrics.md.
 */
#ifndef FLAME_METRICS_H
#define FLAME_METRICS_H

#include "flame/flame.h"

#ifdef __cplusplus
extern "C" {
#endif

/* (struct tags: this header may be read before flame/scheduler.h and flame/memory.h finish) */
struct flame_scheduler;
struct flame_pinned_pool;

/* The stages timed. An engine times FEATURES (feature resolution: the user cache's histories
 * and the item cache's side features of the call), TOKENS (token assembly: the embedding bags
 * and positions on the CPU; the host's planning and staging of the indices on the GPU), H2D,
 * COMPUTE, D2H (GPU only: the device's own times, measured with CUDA events) and TOTAL (the
 * whole call), and FEATURES in parts: USER_CACHE (reading the histories of the call's
 * history_from_user_cache requests from the user cache), ITEM_CACHE (the side features of its
 * id-only requests from the item cache: the lookups, the fetches of the ids they missed, and
 * the bags built from the records) and SOURCE_FETCH (within ITEM_CACHE, the feature source
 * alone: the time the call spent fetching the ids it missed, or waiting for another call's
 * fetch of them; refresh-ahead fetches, on the cache's refresh thread or in
 * flame_item_cache_run_refresh, are charged to no call). Each takes one sample per call that
 * has it: a call's FEATURES is its USER_CACHE plus its ITEM_CACHE, and a call whose ids all
 * hit the item cache has no SOURCE_FETCH sample. A scheduler times QUEUE_WAIT
 * (submit to the start of the part's batch) and TOTAL (submit to done, for requests scored).
 * Values are only ever appended: TOTAL is not the last one (docs/metrics.md). */
typedef enum flame_stage {
    FLAME_STAGE_QUEUE_WAIT = 0,
    FLAME_STAGE_FEATURES = 1,
    FLAME_STAGE_TOKENS = 2,
    FLAME_STAGE_H2D = 3,
    FLAME_STAGE_COMPUTE = 4,
    FLAME_STAGE_D2H = 5,
    FLAME_STAGE_TOTAL = 6,
    FLAME_STAGE_USER_CACHE = 7,  /* engines: a part of FEATURES */
    FLAME_STAGE_ITEM_CACHE = 8,  /* engines: a part of FEATURES */
    FLAME_STAGE_SOURCE_FETCH = 9 /* engines: a part of ITEM_CACHE */
} flame_stage;

/* One stage's latency. count and sum_us run since creation (they never reset, as
 * Prometheus counters); the percentiles and max cover the window since creation or the last
 * reset (flame_scheduler_reset_latency), each within 1/16 above the true value. 0 when none. */
typedef struct flame_latency {
    size_t struct_size;        /* sizeof(flame_latency) */
    uint64_t count;            /* samples, since creation */
    uint64_t sum_us;           /* their sum, us, since creation */
    uint64_t p50_us, p90_us, p99_us, p999_us, max_us; /* of the window, us */
} flame_latency;

/*
 * flame_engine_get_latency: one stage's latency on an engine.
 *
 * Parameters:
 *   engine     the engine.
 *   stage      FLAME_STAGE_FEATURES .. FLAME_STAGE_SOURCE_FETCH, every stage but QUEUE_WAIT
 *              (H2D and D2H stay empty on the CPU).
 *   latency    out, filled up to latency->struct_size bytes.
 * Thread-safety: thread-safe (the buckets are read one by one while calls add to them).
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG for NULL, a struct_size outside 8..4096, or a stage
 *   an engine does not time (the message names it).
 */
FLAME_API flame_status flame_engine_get_latency(flame_engine *engine, flame_stage stage, flame_latency *latency);

/*
 * flame_scheduler_get_latency: one stage's latency on a scheduler.
 *
 * Parameters:
 *   scheduler  the scheduler.
 *   stage      FLAME_STAGE_QUEUE_WAIT or FLAME_STAGE_TOTAL.
 *   latency    out, filled up to latency->struct_size bytes.
 * Thread-safety: thread-safe.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG for NULL, a struct_size outside 8..4096, or another
 *   stage (the message names it).
 */
FLAME_API flame_status flame_scheduler_get_latency(struct flame_scheduler *scheduler, flame_stage stage,
                                                   flame_latency *latency);

/* What flame_metrics_text reports on; a NULL member is left out. */
typedef struct flame_metrics_sources {
    size_t struct_size;                    /* sizeof(flame_metrics_sources) */
    flame_engine *engine;                  /* its stages, counters, gauges and attached caches */
    struct flame_scheduler *scheduler;     /* over `engine` when both are given */
    struct flame_pinned_pool *pinned_pool; /* its stats */
} flame_metrics_sources;

/*
 * flame_metrics_text: the metrics in the Prometheus text exposition format (version 0.0.4).
 *
 * Parameters:
 *   sources    the engine, scheduler and pinned pool to report on (any may be NULL).
 *   buf        out: the text, NUL-terminated; written only when it fits whole.
 *   buf_len    capacity of buf, bytes.
 *   needed     out (may be NULL): bytes the text takes with its NUL. The text's size changes
 *              little between calls (digits of the numbers): give some headroom.
 * Names are flame_*, in base units (seconds, bytes); counters end in _total; histograms
 * have _bucket (le = 5 us .. 10 s, +Inf), _sum and _count. docs/metrics.md lists them.
 * Thread-safety: thread-safe, concurrently with scoring (values are read one by one, not as
 *   one snapshot); the sources must not be destroyed meanwhile.
 * Returns: FLAME_OK; FLAME_ERR_BUFFER_TOO_SMALL when buf_len < *needed (buf untouched);
 *   FLAME_ERR_INVALID_ARG for NULL sources, a struct_size outside 8..4096, NULL buf with
 *   buf_len > 0, or a scheduler over another engine than `engine`; FLAME_ERR_NOMEM; the
 *   statuses of the caches' get_stats (FLAME_ERR_IO for a truncated user cache).
 */
FLAME_API flame_status flame_metrics_text(const flame_metrics_sources *sources, char *buf, size_t buf_len,
                                          size_t *needed);

#ifdef __cplusplus
}
#endif
#endif /* FLAME_METRICS_H */
