/* flame-bench: the load generator's pieces. run.c drives one level of open-loop load (arrivals
 * on a schedule, whether or not earlier requests finished, so queueing shows) through a
 * scheduler or direct calls; main.c parses options, sweeps levels and reports. */
#ifndef FLAME_BENCH_H
#define FLAME_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "flame/flame.h"

typedef enum { CAND_FIXED, CAND_UNIFORM, CAND_LONGTAIL } cand_kind;

/* Candidates per request: fixed a; uniform a..b; long-tailed: log-normal of median a (sigma 1)
 * clipped to 1..b, as the long tail of real feeds. */
typedef struct cand_dist {
    cand_kind kind;
    uint32_t a, b;
} cand_dist;

typedef struct level_opts {
    flame_engine *engine;
    flame_scheduler *sched;    /* NULL: direct calls from `threads` caller threads */
    uint32_t threads;
    int32_t num_side, num_tasks;
    int64_t num_items;
    double qps;                /* offered: Poisson arrivals; with diurnal, the peak */
    bool diurnal;              /* the rate follows a day compressed into the run: peak / valley = 6 */
    double seconds;            /* stops after this ... */
    uint64_t max_requests;     /* ... or this many requests, whichever first */
    cand_dist cands;
    uint32_t history;
    int64_t timeout_us;        /* per request (scheduler only); 0 = none */
    uint64_t seed;
    bool progress;             /* a progress bar on stderr */
    const char *label;
} level_opts;

typedef struct level_result {
    double offered_qps, achieved_qps;
    double p50_us, p90_us, p99_us, p999_us;
    double late_p50_us, late_p99_us; /* how late the generator sent requests (part of the latency) */
    uint64_t sent, ok, timeouts, rejected, failed;
    double mean_batch;         /* parts per batch (1 for direct calls) */
} level_result;

/* Runs one level; false (with a message on stderr) when it could not run. */
bool run_level(const level_opts *o, level_result *r);

/* The scheduler's own CPU cost (overhead.c): a 1-token, 1-candidate model, one profile of
 * max_users x 1, `submitters` threads submitting bursts of about burst_us worth of requests. */
typedef struct overhead_opts {
    double qps, seconds;
    uint32_t submitters, max_users;
    double burst_us;
    int64_t max_wait_us;
    bool adaptive;
} overhead_opts;

typedef struct overhead_result {
    double offered_qps, achieved_qps;
    uint64_t requests, rejected, burst;
    uint32_t submitters;
    double mean_batch;
    /* CPU time a request, us */
    double worker_cpu_us;     /* the scheduler's workers (batch formation, the pass, completion) */
    double pass_cpu_us;       /* the batches' flame_score_batch calls, measured alone */
    double submit_cpu_us;     /* inside the submit calls */
    double sched_cpu_us;      /* the hand-over: worker - pass + submit */
    double queue_wait_p50_us; /* median submit to batch start */
} overhead_result;

bool run_overhead(const overhead_opts *o, overhead_result *r);

#endif
