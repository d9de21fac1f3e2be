/* One level of open-loop load: a dispatcher sends request i at its scheduled time (Poisson
 * gaps, or a diurnal rate), however many are still in flight; its latency runs from that
 * scheduled time to its completion, so a system that falls behind shows it as queueing. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void sleep_until(uint64_t us)
{
    struct timespec ts = {.tv_sec = (time_t)(us / 1000000u), .tv_nsec = (long)(us % 1000000u) * 1000};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL)) {
    }
}

static uint64_t rng_next(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s)
{
    return ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
}

static size_t draw_cands(const cand_dist *d, uint64_t *s)
{
    switch (d->kind) {
    case CAND_FIXED: return d->a;
    case CAND_UNIFORM: return d->a + (size_t)(rng_next(s) % (d->b - d->a + 1));
    case CAND_LONGTAIL: { /* log-normal, sigma 1: a few requests carry many times the median */
        const double z = sqrt(-2 * log(uniform01(s))) * cos(2 * M_PI * uniform01(s));
        double n = d->a * exp(z);
        return n < 1 ? 1 : n > d->b ? d->b : (size_t)n;
    }
    }
    return 1;
}

/* One request in flight: its arrays and where its completion goes. */
typedef struct slot {
    flame_request r;
    int64_t *ids;              /* history then candidates */
    float *scores;
    uint64_t sched_us;
    struct run *run;
} slot;

typedef struct run {
    const level_opts *o;
    flame_bags *bags;          /* empty bags for the side slots */
    slot *slots;
    uint64_t *lat;             /* completion latency of each ok request, us */
    uint64_t *late;            /* how late the dispatcher sent each request, us (the generator's own tail) */
    atomic_uint_fast64_t done, ok, timeouts, failed, nlat;
    /* direct mode: the caller threads' queue of slot indices */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t *queue;
    uint64_t head, tail;
    bool closed;
} run;

static void complete(slot *q, flame_status st)
{
    run *ru = q->run;
    const uint64_t t = now_us();
    if (st == FLAME_OK) {
        atomic_fetch_add(&ru->ok, 1);
        ru->lat[atomic_fetch_add(&ru->nlat, 1)] = t - q->sched_us;
    } else if (st == FLAME_ERR_TIMEOUT) {
        atomic_fetch_add(&ru->timeouts, 1);
    } else {
        atomic_fetch_add(&ru->failed, 1);
    }
    free(q->ids), free(q->scores);
    q->ids = NULL, q->scores = NULL;
    atomic_fetch_add(&ru->done, 1);
}

static void on_done(void *user, flame_status st, const char *message)
{
    (void)message;
    complete(user, st);
}

static void *caller(void *arg) /* direct mode: score what the dispatcher queued, oldest first */
{
    run *ru = arg;
    for (;;) {
        pthread_mutex_lock(&ru->mu);
        while (ru->head == ru->tail && !ru->closed) pthread_cond_wait(&ru->cv, &ru->mu);
        if (ru->head == ru->tail) {
            pthread_mutex_unlock(&ru->mu);
            return NULL;
        }
        slot *q = &ru->slots[ru->queue[ru->head++]];
        pthread_mutex_unlock(&ru->mu);
        const size_t n = q->r.num_candidates * (size_t)ru->o->num_tasks;
        complete(q, flame_score(ru->o->engine, &q->r, q->scores, n));
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct(const uint64_t *v, uint64_t n, double q)
{
    if (!n) return 0;
    uint64_t k = (uint64_t)ceil(q * (double)n);
    return (double)v[(k ? k : 1) - 1];
}

static void progress(const level_opts *o, double frac)
{
    int w = 40, k = (int)(frac * w);
    fprintf(stderr, "\r%-18s [%.*s%*s] %3d%%", o->label, k, "========================================", w - k, "",
            (int)(frac * 100));
}

bool run_level(const level_opts *o, level_result *res)
{
    const uint64_t cap = o->max_requests;
    run ru = {.o = o};
    ru.slots = calloc(cap, sizeof *ru.slots);
    ru.lat = calloc(cap, sizeof *ru.lat);
    ru.late = calloc(cap, sizeof *ru.late);
    ru.queue = o->sched ? NULL : calloc(cap, sizeof *ru.queue);
    ru.bags = calloc((size_t)o->num_side + 1, sizeof *ru.bags);
    const size_t max_tokens = o->history + (o->cands.b > o->cands.a ? o->cands.b : o->cands.a) + 1;
    int64_t *zeros = calloc(max_tokens, sizeof *zeros);
    if (!ru.slots || !ru.lat || !ru.late || (!o->sched && !ru.queue) || !ru.bags || !zeros) {
        fprintf(stderr, "flame-bench: out of memory for %llu requests\n", (unsigned long long)cap);
        return false;
    }
    for (int32_t k = 0; k < o->num_side; k++) ru.bags[k] = (flame_bags){zeros, NULL, 0};
    pthread_mutex_init(&ru.mu, NULL);
    pthread_cond_init(&ru.cv, NULL);
    pthread_t th[64];
    const uint32_t nth = o->sched ? 0 : (o->threads > 64 ? 64 : o->threads);
    for (uint32_t i = 0; i < nth; i++) pthread_create(&th[i], NULL, caller, &ru);
    flame_scheduler_stats s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
    if (o->sched) flame_scheduler_get_stats(o->sched, &s0);
    uint64_t seed = o->seed, rejected = 0, sent = 0;
    bool told = false; /* a refusal other than a full queue was printed */
    const uint64_t start = now_us() + 1000, span = (uint64_t)(o->seconds * 1e6);
    double t = 0; /* seconds from start of the next arrival */
    for (uint64_t i = 0; i < cap; i++) {
        double rate = o->qps;
        if (o->diurnal) /* valley qps / 6 at the start and end, peak qps in the middle */
            rate = o->qps / 6 + (o->qps - o->qps / 6) * (1 - cos(2 * M_PI * t / o->seconds)) / 2;
        t += -log(uniform01(&seed)) / rate;
        if (!(t * 1e6 <= (double)span)) break; /* past the level's end (checked before the cast: a tiny rate's
                                                  t does not fit an integer) */
        const uint64_t at = start + (uint64_t)(t * 1e6);
        slot *q = &ru.slots[i];
        const size_t m = draw_cands(&o->cands, &seed);
        q->ids = malloc((o->history + m) * sizeof *q->ids);
        q->scores = malloc(m * (size_t)o->num_tasks * sizeof *q->scores);
        if (!q->ids || !q->scores) {
            fprintf(stderr, "flame-bench: out of memory\n");
            return false;
        }
        for (size_t k = 0; k < o->history + m; k++) q->ids[k] = (int64_t)(rng_next(&seed) % (uint64_t)o->num_items);
        q->r = (flame_request){.struct_size = sizeof q->r, .history = q->ids, .history_len = o->history,
                               .candidates = q->ids + o->history, .num_candidates = m,
                               .history_side = o->num_side ? ru.bags : NULL,
                               .candidate_side = o->num_side ? ru.bags : NULL, .num_side_features = (size_t)o->num_side};
        q->run = &ru;
        const uint64_t now = now_us();
        if (now < at) sleep_until(at); /* late: send at once (open loop: never skipped) */
        q->sched_us = at;
        const uint64_t sent_at = now_us();
        ru.late[sent] = sent_at > at ? sent_at - at : 0;
        sent++;
        if (o->sched) {
            flame_submit_options so = {.struct_size = sizeof so, .timeout_us = o->timeout_us};
            const flame_status sst =
                flame_scheduler_submit_ex(o->sched, &q->r, q->scores, m * (size_t)o->num_tasks, &so, on_done, q, NULL);
            if (sst) {
                /* a full queue is load shedding (rejected); anything else is a failure, and the first
                 * one's message is printed */
                if (sst == FLAME_ERR_UNAVAILABLE) {
                    rejected++;
                } else {
                    if (!told) fprintf(stderr, "flame-bench: a request was refused: %s\n", flame_last_error());
                    told = true;
                    atomic_fetch_add(&ru.failed, 1);
                }
                free(q->ids), free(q->scores);
                q->ids = NULL, q->scores = NULL;
                atomic_fetch_add(&ru.done, 1);
            }
        } else {
            pthread_mutex_lock(&ru.mu);
            ru.queue[ru.tail++] = i;
            pthread_cond_signal(&ru.cv);
            pthread_mutex_unlock(&ru.mu);
        }
        if (o->progress && i % 64 == 0) progress(o, (double)(at - start) / (double)span);
    }
    pthread_mutex_lock(&ru.mu);
    ru.closed = true;
    pthread_cond_broadcast(&ru.cv);
    pthread_mutex_unlock(&ru.mu);
    while (atomic_load(&ru.done) < sent) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    const uint64_t end = now_us();
    for (uint32_t i = 0; i < nth; i++) pthread_join(th[i], NULL);
    if (o->progress) progress(o, 1), fputc('\n', stderr);
    if (o->sched) flame_scheduler_get_stats(o->sched, &s1);
    const uint64_t n = atomic_load(&ru.nlat);
    qsort(ru.lat, n, sizeof *ru.lat, cmp_u64);
    qsort(ru.late, sent, sizeof *ru.late, cmp_u64);
    *res = (level_result){
        .offered_qps = (double)sent / o->seconds, .achieved_qps = (double)atomic_load(&ru.ok) / ((end > start ? end - start : 1) / 1e6),
        .p50_us = pct(ru.lat, n, 0.5), .p90_us = pct(ru.lat, n, 0.9), .p99_us = pct(ru.lat, n, 0.99),
        .p999_us = pct(ru.lat, n, 0.999), .late_p50_us = pct(ru.late, sent, 0.5),
        .late_p99_us = pct(ru.late, sent, 0.99), .sent = sent, .ok = atomic_load(&ru.ok),
        .timeouts = atomic_load(&ru.timeouts), .rejected = rejected, .failed = atomic_load(&ru.failed),
        .mean_batch = o->sched && s1.batches > s0.batches ? (double)(s1.parts - s0.parts) / (double)(s1.batches - s0.batches)
                                                          : 1.0};
    if (!o->diurnal && sent) res->offered_qps = o->qps;
    pthread_cond_destroy(&ru.cv);
    pthread_mutex_destroy(&ru.mu);
    free(ru.slots), free(ru.lat), free(ru.late), free(ru.queue), free(ru.bags), free(zeros);
    return true;
}
