/* flame_metrics_text: the Prometheus text exposition format (version 0.0.4) of an engine (its
 * stages, counters, gauges and attached caches), a scheduler and a pinned pool. The text is
 * built in a private buffer and copied out only when it fits, so a short buffer is never
 * half-written. docs/metrics.md lists the series. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/abi.h"
#include "engine/engine.h"
#include "metrics/metrics.h"
#include "sched/sched.h"

void fl_text_printf(fl_text *t, const char *fmt, ...)
{
    if (t->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const size_t room = t->cap - t->len;
        const int n = vsnprintf(t->p ? t->p + t->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if ((size_t)n < room) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap ? t->cap * 2 : 16384;
        while (cap - t->len <= (size_t)n) cap *= 2;
        char *p = realloc(t->p, cap);
        if (!p) {
            t->failed = true;
            return;
        }
        t->p = p;
        t->cap = cap;
    }
}

static void family(fl_text *t, const char *name, const char *type, const char *help)
{
    fl_text_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A family of one unlabelled sample. */
static void single(fl_text *t, const char *name, const char *type, const char *help, uint64_t v)
{
    family(t, name, type, help);
    fl_text_printf(t, "%s %llu\n", name, (unsigned long long)v);
}

/* The series of one histogram: cumulative buckets, +Inf, sum (seconds) and count (that of
 * +Inf, so the two agree within a scrape). `labels` ends with a comma when not empty. */
static void histogram(fl_text *t, const char *name, const char *labels, fl_histogram *h)
{
    uint64_t cum = 0;
    for (int i = 0; i < FL_PROM_BOUNDS; i++) {
        cum += atomic_load_explicit(&h->prom[i], memory_order_relaxed);
        fl_text_printf(t, "%s_bucket{%sle=\"%g\"} %llu\n", name, labels, (double)FL_PROM_BOUNDS_US[i] / 1e6,
                       (unsigned long long)cum);
    }
    cum += atomic_load_explicit(&h->prom[FL_PROM_BOUNDS], memory_order_relaxed);
    const uint64_t sum = atomic_load_explicit(&h->sum_us, memory_order_relaxed);
    fl_text_printf(t, "%s_bucket{%sle=\"+Inf\"} %llu\n", name, labels, (unsigned long long)cum);
    char bare[64];
    snprintf(bare, sizeof bare, "%.*s", labels[0] ? (int)strlen(labels) - 1 : 0, labels); /* without the comma */
    const char *open = bare[0] ? "{" : "", *close = bare[0] ? "}" : "";
    fl_text_printf(t, "%s_sum%s%s%s %llu.%06llu\n", name, open, bare, close, (unsigned long long)(sum / 1000000u),
                   (unsigned long long)(sum % 1000000u));
    fl_text_printf(t, "%s_count%s%s%s %llu\n", name, open, bare, close, (unsigned long long)cum);
}

static flame_status engine_metrics(fl_text *t, flame_engine *e)
{
    flame_engine_stats es = {.struct_size = sizeof es};
    flame_status st = flame_engine_get_stats(e, &es);
    if (st) return st;
    single(t, "flame_engine_calls_total", "counter",
           "Scoring calls (flame_score, flame_score_batch, flame_score_batch_topk) that succeeded.", es.calls);
    single(t, "flame_engine_requests_total", "counter", "Requests (users) scored.", es.requests);
    single(t, "flame_engine_candidates_total", "counter", "Candidates scored.", atomic_load(&e->candidates));
    single(t, "flame_engine_tokens_total", "counter", "Tokens through the transformer (history and candidates).",
           atomic_load(&e->tokens));
    family(t, "flame_engine_user_cache_lookups_total", "counter", "User-cache lookups of requests scored, by result.");
    fl_text_printf(t, "flame_engine_user_cache_lookups_total{result=\"hit\"} %llu\n",
                   (unsigned long long)es.user_cache_hits);
    fl_text_printf(t, "flame_engine_user_cache_lookups_total{result=\"miss\"} %llu\n",
                   (unsigned long long)es.user_cache_misses);
    single(t, "flame_engine_workspaces", "gauge", "Scratch workspaces (the peak of concurrent calls).", es.workspaces);
    single(t, "flame_engine_scratch_bytes", "gauge", "Bytes held by the scratch workspaces.", es.scratch_bytes);
    single(t, "flame_engine_device_bytes", "gauge", "GPU memory held: weights, activations, GEMM workspace, KV cache blocks.",
           es.device_bytes);
    single(t, "flame_engine_device_weight_bytes", "gauge", "GPU memory held by the weights.", es.device_weight_bytes);
    if (e->ops->cuda_graphs) {
        single(t, "flame_engine_cuda_graph_captures_total", "counter", "GPU passes captured as CUDA graphs.",
               es.graph_captures);
        single(t, "flame_engine_cuda_graph_replays_total", "counter", "GPU passes run by replaying a CUDA graph.",
               es.graph_replays);
    }
    family(t, "flame_engine_stage_seconds", "histogram", "Time of each stage of a successful scoring call.");
    for (int k = FLAME_STAGE_FEATURES; k < FL_ENGINE_STAGES; k++) {
        if (!e->ops->device_copies && (k == FLAME_STAGE_H2D || k == FLAME_STAGE_D2H)) continue;
        /* a cache's stages with the cache, or once they have samples (a series, once there,
         * stays when the cache is detached) */
        const bool cache_stage = k == FLAME_STAGE_USER_CACHE || k == FLAME_STAGE_ITEM_CACHE ||
                                 k == FLAME_STAGE_SOURCE_FETCH;
        const bool has_cache = k == FLAME_STAGE_USER_CACHE ? e->user_cache != NULL : e->item_cache != NULL;
        if (cache_stage && !has_cache && !atomic_load_explicit(&e->stage[k].total, memory_order_relaxed)) continue;
        char labels[48];
        snprintf(labels, sizeof labels, "stage=\"%s\",", fl_stage_name((flame_stage)k));
        histogram(t, "flame_engine_stage_seconds", labels, &e->stage[k]);
    }
    if (e->item_cache) {
        flame_item_cache_stats c = {.struct_size = sizeof c};
        if ((st = flame_item_cache_get_stats(e->item_cache, &c))) return st;
        single(t, "flame_item_cache_hits_total", "counter", "Fresh values served by the item cache.", c.hits);
        single(t, "flame_item_cache_misses_total", "counter", "Ids the item cache did not serve.", c.misses);
        single(t, "flame_item_cache_stale_serves_total", "counter", "Expired values served while refreshing.",
               c.stale_serves);
        single(t, "flame_item_cache_refreshes_total", "counter", "Refresh-ahead fetches that succeeded.", c.refreshes);
        single(t, "flame_item_cache_refresh_failures_total", "counter", "Refreshes that failed.", c.refresh_failures);
        single(t, "flame_item_cache_evictions_total", "counter", "Entries evicted for room.", c.evictions);
        single(t, "flame_item_cache_fetches_total", "counter", "Batched fetches sent to the feature source.", c.fetches);
        single(t, "flame_item_cache_entries", "gauge", "Entries held.", c.entries);
        single(t, "flame_item_cache_bytes", "gauge", "Bytes held (records and bookkeeping).", c.bytes);
    }
    if (e->user_cache) {
        flame_user_cache_stats c = {.struct_size = sizeof c};
        if ((st = flame_user_cache_get_stats(e->user_cache, &c))) return st;
        single(t, "flame_user_cache_hits_total", "counter", "This handle's gets that found a record.", c.hits);
        single(t, "flame_user_cache_misses_total", "counter", "This handle's gets that did not.", c.misses);
        single(t, "flame_user_cache_expired_total", "counter", "Misses on records older than the TTL.", c.expired);
        single(t, "flame_user_cache_corrupt_total", "counter", "Gets that found a malformed record.", c.corrupt);
        single(t, "flame_user_cache_puts_total", "counter", "Puts, all processes.", c.puts);
        single(t, "flame_user_cache_evictions_total", "counter", "Puts that overwrote a live record, all processes.",
               c.evictions);
        single(t, "flame_user_cache_recoveries_total", "counter", "Bucket locks recovered from a dead owner.",
               c.recoveries);
        single(t, "flame_user_cache_records", "gauge", "Live records.", c.records);
        single(t, "flame_user_cache_capacity", "gauge", "Records the table holds.", c.capacity);
        single(t, "flame_user_cache_table_bytes", "gauge", "Size of the shared memory object.", c.table_bytes);
    }
    return FLAME_OK;
}

static flame_status scheduler_metrics(fl_text *t, flame_scheduler *s)
{
    flame_scheduler_stats ss = {.struct_size = sizeof ss};
    flame_status st = flame_scheduler_get_stats(s, &ss);
    if (st) return st;
    single(t, "flame_scheduler_submitted_total", "counter", "Requests accepted by submit.", ss.submitted);
    family(t, "flame_scheduler_requests_total", "counter", "Requests done, by outcome.");
    const struct { const char *k; uint64_t v; } done[] = {
        {"ok", ss.completed}, {"error", ss.failed}, {"timeout", ss.timeouts}, {"cancelled", ss.cancelled}};
    for (int i = 0; i < 4; i++)
        fl_text_printf(t, "flame_scheduler_requests_total{status=\"%s\"} %llu\n", done[i].k,
                       (unsigned long long)done[i].v);
    single(t, "flame_scheduler_rejected_total", "counter", "Submits refused to shed load (queue full, stopping).",
           ss.rejected);
    single(t, "flame_scheduler_candidates_total", "counter", "Candidates of the requests accepted.", ss.candidates);
    single(t, "flame_scheduler_split_total", "counter", "Requests split into parts.", ss.split);
    single(t, "flame_scheduler_parts_total", "counter", "Parts scored (an unsplit request is one).", ss.parts);
    single(t, "flame_scheduler_isolated_total", "counter",
           "Batches rescored request by request after an invalid request.", ss.isolated);
    family(t, "flame_scheduler_batches_total", "counter", "Batches, by the smallest batch profile holding them.");
    for (int i = 0; i < s->profiles.n; i++)
        fl_text_printf(t, "flame_scheduler_batches_total{profile=\"%d\",max_users=\"%u\",max_candidates=\"%u\"} %llu\n",
                       i, s->profiles.p[i].max_users, s->profiles.p[i].max_candidates,
                       (unsigned long long)ss.profile_batches[i]);
    single(t, "flame_scheduler_batch_slots_used_total", "counter",
           "Candidates in batches (users under the dot head); over batch_slots_total: the fill ratio.",
           ss.batch_slots_used);
    single(t, "flame_scheduler_batch_slots_total", "counter", "Capacity of the batches' profiles.", ss.batch_slots);
    family(t, "flame_scheduler_queue_depth", "gauge", "Parts waiting, by priority level.");
    static const char *level[FL_LEVELS] = {"high", "normal", "low"};
    uint64_t depth[FL_LEVELS];
    pthread_mutex_lock(&s->mu);
    for (int l = 0; l < FL_LEVELS; l++) depth[l] = s->levels[l].queued;
    pthread_mutex_unlock(&s->mu);
    for (int l = 0; l < FL_LEVELS; l++)
        fl_text_printf(t, "flame_scheduler_queue_depth{priority=\"%s\"} %llu\n", level[l], (unsigned long long)depth[l]);
    single(t, "flame_scheduler_in_flight_batches", "gauge", "Batches being scored.", ss.in_flight);
    single(t, "flame_scheduler_workers", "gauge", "Worker threads (batches in flight at most).", s->num_workers);
    family(t, "flame_scheduler_stage_seconds", "histogram",
           "Queue wait (submit to batch start, per part) and total time (submit to done) of requests scored.");
    histogram(t, "flame_scheduler_stage_seconds", "stage=\"queue_wait\",", &s->queue_wait);
    histogram(t, "flame_scheduler_stage_seconds", "stage=\"total\",", &s->latency);
    return FLAME_OK;
}

static flame_status pinned_metrics(fl_text *t, flame_pinned_pool *pool)
{
    flame_pinned_pool_stats ps = {.struct_size = sizeof ps};
    flame_status st = flame_pinned_pool_get_stats(pool, &ps);
    if (st) return st;
    single(t, "flame_pinned_pool_reserved_bytes", "gauge", "Bytes mapped by the pool.", ps.bytes_reserved);
    single(t, "flame_pinned_pool_in_use_bytes", "gauge", "Size-class bytes handed out.", ps.bytes_in_use);
    single(t, "flame_pinned_pool_requested_bytes", "gauge", "Bytes callers asked for, handed out.", ps.bytes_requested);
    single(t, "flame_pinned_pool_pinned_bytes", "gauge", "Reserved bytes registered with CUDA.", ps.bytes_pinned);
    single(t, "flame_pinned_pool_pageable_bytes", "gauge", "Reserved bytes not registered.", ps.bytes_pageable);
    single(t, "flame_pinned_pool_hits_total", "counter", "Allocations served from a cached buffer.", ps.hits);
    single(t, "flame_pinned_pool_misses_total", "counter", "Allocations that mapped a new buffer.", ps.misses);
    single(t, "flame_pinned_pool_pin_failures_total", "counter", "Registrations that failed.", ps.pin_failures);
    single(t, "flame_pinned_pool_releases_total", "counter", "Buffers unmapped because the cache was full.",
           ps.releases);
    return FLAME_OK;
}

FLAME_API flame_status flame_metrics_text(const flame_metrics_sources *sources, char *buf, size_t buf_len,
                                          size_t *needed)
{
    fl_clear_error();
    if (needed) *needed = 0;
    if (!sources) return fl_error(FLAME_ERR_INVALID_ARG, "flame_metrics_text: sources is NULL");
    if (!buf && buf_len) return fl_error(FLAME_ERR_INVALID_ARG, "flame_metrics_text: buf is NULL with buf_len %zu", buf_len);
    flame_metrics_sources src = {.struct_size = sizeof src};
    flame_status st = fl_struct_in("flame_metrics_sources", &src, sizeof src, sources);
    if (st) return st;
    if (src.engine && src.scheduler && src.scheduler->engine != src.engine)
        return fl_error(FLAME_ERR_INVALID_ARG, "flame_metrics_text: the scheduler runs over another engine than the "
                        "one given");
    fl_text t = {0};
    if (src.engine) st = engine_metrics(&t, src.engine);
    if (!st && src.scheduler) st = scheduler_metrics(&t, src.scheduler);
    if (!st && src.pinned_pool) st = pinned_metrics(&t, src.pinned_pool);
    if (!st && t.failed) st = fl_error(FLAME_ERR_NOMEM, "flame_metrics_text: out of memory for the text");
    if (!st) {
        if (needed) *needed = t.len + 1;
        if (t.len + 1 > buf_len)
            st = fl_error(FLAME_ERR_BUFFER_TOO_SMALL, "flame_metrics_text: the text takes %zu bytes with its NUL, buf "
                          "has %zu", t.len + 1, buf_len);
        else {
            if (t.len) memcpy(buf, t.p, t.len);
            buf[t.len] = '\0';
        }
    }
    free(t.p);
    return st;
}
