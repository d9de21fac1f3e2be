/* The scheduler's own cost at a high offered rate: submitter threads submit 1-token,
 * 1-candidate requests on schedule in bursts (one sleep a burst, not one a request, so the
 * generator does not eat a core), a scheduler batches them, and the process's CPU time over
 * the run is split by thread: the scheduler's share is the CPU time of its workers (the
 * process's, less the submitters' and the main thread's, each measured on its own thread's
 * clock) less the pass (the same batches scored directly, measured alone), plus the CPU time
 * the submitters spent inside the submit calls (measured around each burst). The submitters'
 * sleeps and loop are the generator's, not counted. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

static const char *tiny_model =
    "{\"format\":\"flame\",\"version\":1,\"d_model\":8,\"max_len\":1,"
    "\"tables\":[{\"name\":\"item\",\"rows\":16,\"dim\":8}],"
    "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
    "\"position\":{\"rule\":\"from_recent\",\"rows\":2,\"candidate_position\":1},"
    "\"blocks\":{\"count\":0,\"num_heads\":1,\"ffn_dim\":8,\"norm\":\"pre\",\"activation\":\"gelu_erf\"},"
    "\"head\":{\"type\":\"sumi\",\"tasks\":[{\"name\":\"a\",\"hidden\":[]}]}}";

static uint64_t clock_us(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static double clock_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

typedef struct ovh_run {
    flame_scheduler *s;
    flame_request *reqs; /* [total] */
    float *scores;       /* [total] */
    uint64_t per_thread, burst, burst_us, start;
    atomic_uint_fast64_t done, ok, rejected;
    _Atomic double submit_ns, thread_ns; /* the submitters: inside submit calls, in all */
} ovh_run;

typedef struct submitter {
    ovh_run *run;
    uint32_t index;
} submitter;

static void on_done(void *user, flame_status st, const char *message)
{
    (void)message;
    ovh_run *r = user;
    if (st == FLAME_OK) atomic_fetch_add_explicit(&r->ok, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&r->done, 1, memory_order_release);
}

/* Submits this thread's share: `burst` requests every burst_us, staggered across threads. */
static void *submit_loop(void *arg)
{
    const submitter *me = arg;
    ovh_run *r = me->run;
    const uint64_t first = me->index * r->per_thread;
    uint64_t at = r->start + me->index * r->burst_us / 2; /* half a period apart: bursts interleave */
    const double t0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    double in_submit = 0;
    for (uint64_t i = 0; i < r->per_thread;) {
        struct timespec ts = {.tv_sec = (time_t)(at / 1000000u), .tv_nsec = (long)(at % 1000000u) * 1000};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL)) {
        }
        const double b0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        for (uint64_t k = 0; k < r->burst && i < r->per_thread; k++, i++) {
            const uint64_t q = first + i;
            if (flame_scheduler_submit(r->s, &r->reqs[q], &r->scores[q], 1, on_done, r)) {
                atomic_fetch_add(&r->rejected, 1);
                atomic_fetch_add(&r->done, 1);
            }
        }
        in_submit += clock_ns(CLOCK_THREAD_CPUTIME_ID) - b0;
        at += r->burst_us;
    }
    const double total = clock_ns(CLOCK_THREAD_CPUTIME_ID) - t0;
    double v = atomic_load(&r->submit_ns);
    while (!atomic_compare_exchange_weak(&r->submit_ns, &v, v + in_submit)) {
    }
    v = atomic_load(&r->thread_ns);
    while (!atomic_compare_exchange_weak(&r->thread_ns, &v, v + total)) {
    }
    return NULL;
}

/* Runs the submitters to the end and waits for every completion; the CPU time (ns) of the
 * threads that are not submitters or this one (the workers), and when it ended on *end. */
static double run_submitters(ovh_run *r, uint32_t nth, uint64_t total, uint64_t *end)
{
    pthread_t th[16];
    submitter subs[16];
    atomic_store(&r->done, 0);
    atomic_store(&r->ok, 0);
    atomic_store(&r->rejected, 0);
    r->start = clock_us(CLOCK_MONOTONIC) + 2000;
    const double cpu0 = clock_ns(CLOCK_PROCESS_CPUTIME_ID), me0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    for (uint32_t i = 0; i < nth; i++) {
        subs[i] = (submitter){r, i};
        pthread_create(&th[i], NULL, submit_loop, &subs[i]);
    }
    for (uint32_t i = 0; i < nth; i++) pthread_join(th[i], NULL);
    while (atomic_load_explicit(&r->done, memory_order_acquire) < total) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    *end = clock_us(CLOCK_MONOTONIC);
    const double me = clock_ns(CLOCK_THREAD_CPUTIME_ID) - me0;
    return clock_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu0 - me - atomic_load(&r->thread_ns);
}

bool run_overhead(const overhead_opts *o, overhead_result *res)
{
    memset(res, 0, sizeof *res);
    const uint32_t nth = o->submitters < 1 ? 1 : o->submitters > 16 ? 16 : o->submitters;
    const double per_thread_rate = o->qps / nth;
    const uint64_t per_thread = (uint64_t)(per_thread_rate * o->seconds);
    if (per_thread == 0) { /* the pass below replays the run's batches: there must be one */
        fprintf(stderr, "flame-bench: overhead run: %g requests/s by %u submitters for %g s is no request a "
                        "submitter; skipped\n", o->qps, nth, o->seconds);
        return false;
    }
    flame_model *m = NULL;
    flame_config *cfg = NULL;
    flame_engine *e = NULL;
    flame_scheduler *s = NULL;
    flame_status st = flame_model_create_random(tiny_model, 1, &m);
    if (!st) st = flame_config_create(&cfg);
    if (!st) st = flame_config_set_int(cfg, FLAME_OPT_THREADS, 1); /* no pool hand-off inside the pass */
    if (!st) st = flame_engine_create(m, cfg, &e);
    flame_batch_profile prof = {o->max_users, 1};
    flame_scheduler_params sp = {.struct_size = sizeof sp, .profiles = &prof, .num_profiles = 1,
                                 .max_wait_us = o->max_wait_us, .adaptive_wait = o->adaptive};
    if (!st) st = flame_scheduler_create(e, &sp, &s);
    flame_config_destroy(cfg);
    if (st) {
        fprintf(stderr, "flame-bench: overhead run: %s\n", flame_last_error());
        flame_scheduler_destroy(s), flame_engine_destroy(e), flame_model_destroy(m);
        return false;
    }
    uint64_t burst = (uint64_t)(per_thread_rate * o->burst_us / 1e6 + 0.5);
    if (burst < 1) burst = 1;
    const uint64_t burst_us = (uint64_t)(burst * 1e6 / per_thread_rate + 0.5); /* the rate, for whole bursts */
    const uint64_t total = per_thread * nth;
    static const int64_t item = 3;
    ovh_run r = {.s = s, .per_thread = per_thread, .burst = burst, .burst_us = burst_us};
    r.reqs = malloc(total * sizeof *r.reqs);
    r.scores = calloc(total, sizeof *r.scores);
    if (!r.reqs || !r.scores) {
        fprintf(stderr, "flame-bench: overhead run: out of memory for %llu requests\n", (unsigned long long)total);
        free(r.reqs), free(r.scores);
        flame_scheduler_destroy(s), flame_engine_destroy(e), flame_model_destroy(m);
        return false;
    }
    for (uint64_t i = 0; i < total; i++)
        r.reqs[i] = (flame_request){.struct_size = sizeof r.reqs[i], .candidates = &item, .num_candidates = 1};
    /* warm-up (pages, caches, the engine's workspace), then the measured run */
    for (uint64_t i = 0; i < 1000 && i < total; i++) flame_scheduler_score(s, &r.reqs[i], &r.scores[i], 1);
    flame_scheduler_reset_latency(s);
    flame_scheduler_stats s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
    flame_scheduler_get_stats(s, &s0);
    uint64_t end;
    const double workers = run_submitters(&r, nth, total, &end);
    flame_scheduler_get_stats(s, &s1);
    flame_latency qw = {.struct_size = sizeof qw};
    flame_scheduler_get_latency(s, FLAME_STAGE_QUEUE_WAIT, &qw);
    const uint64_t batches = s1.batches - s0.batches, parts = s1.parts - s0.parts;
    /* the pass alone: the same number of batches of the same mean size, scored on this thread */
    const size_t bsz = batches ? (size_t)((parts + batches / 2) / batches) : 1;
    const uint64_t reps = batches ? batches : 1;
    const double p0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    for (uint64_t b = 0; b < reps; b++) flame_score_batch(e, r.reqs, bsz, r.scores, bsz);
    const double p1 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    const uint64_t ok = atomic_load(&r.ok);
    *res = (overhead_result){
        .offered_qps = (double)total / ((double)(per_thread * burst_us / burst) / 1e6),
        .achieved_qps = (double)ok / ((double)(end - r.start) / 1e6),
        .requests = total,
        .rejected = atomic_load(&r.rejected),
        .mean_batch = batches ? (double)parts / (double)batches : 0,
        .worker_cpu_us = total ? workers / 1e3 / (double)total : 0,
        .submit_cpu_us = total ? atomic_load(&r.submit_ns) / 1e3 / (double)total : 0,
        .pass_cpu_us = total ? (p1 - p0) / 1e3 / (double)total : 0,
        .queue_wait_p50_us = (double)qw.p50_us,
        .submitters = nth,
        .burst = burst};
    res->sched_cpu_us = res->worker_cpu_us - res->pass_cpu_us + res->submit_cpu_us;
    flame_scheduler_destroy(s);
    flame_engine_destroy(e);
    flame_model_destroy(m);
    free(r.reqs), free(r.scores);
    return true;
}
