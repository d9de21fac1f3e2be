/* e2e-bench --clients N: N client threads, each sending one user's request at a time and
 * waiting for its scores, as the threads of a serving process do. --via direct: each thread
 * calls flame_score itself (the library without a scheduler); --via scheduler: each calls
 * flame_scheduler_score, so concurrent requests are batched. Warm-up, then all threads start
 * together; requests/s over the wall time of the timed phase, latency per request as the
 * client sees it. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "e2e_bench.h"

typedef struct client {
    const options *o;
    flame_engine *engine;
    flame_scheduler *sched;
    const flame_request *const *pool;
    size_t pool_n, index, max_scores;
    int32_t tasks;
    pthread_barrier_t *start, *end;
    double *lat; /* [o->calls] */
    size_t failures;
    double checksum;
} client;

static flame_status one(client *c, const flame_request *r, float *scores)
{
    return c->sched ? flame_scheduler_score(c->sched, r, scores, c->max_scores)
                    : flame_score(c->engine, r, scores, c->max_scores);
}

static void *run(void *arg)
{
    client *c = arg;
    float *scores = xmalloc(c->max_scores * sizeof *scores);
    size_t k = c->index;
    for (size_t i = 0; i < c->o->warmup; i++, k += c->o->clients) one(c, c->pool[k % c->pool_n], scores);
    pthread_barrier_wait(c->start);
    for (size_t i = 0; i < c->o->calls; i++, k += c->o->clients) {
        const flame_request *r = c->pool[k % c->pool_n];
        const double a = now_us();
        flame_status st = one(c, r, scores);
        c->lat[i] = now_us() - a;
        if (st) {
            if (!c->failures++) fprintf(stderr, "e2e-bench: client %zu: %s: %s\n", c->index, flame_status_string(st),
                                        flame_last_error());
            continue;
        }
        c->checksum += scores[0];
    }
    pthread_barrier_wait(c->end);
    free(scores);
    return NULL;
}

int run_clients(const options *o, flame_engine *engine, const flame_model_info *info, const request_set *sets,
                size_t num_sets)
{
    size_t pool_n = 0, max_scores = 0;
    for (size_t k = 0; k < num_sets; k++) pool_n += sets[k].n;
    const flame_request **pool = xmalloc(pool_n * sizeof *pool);
    pool_n = 0;
    for (size_t k = 0; k < num_sets; k++)
        for (size_t r = 0; r < sets[k].n; r++) {
            pool[pool_n++] = &sets[k].reqs[r];
            size_t m = sets[k].reqs[r].num_candidates * (size_t)info->num_tasks;
            if (m > max_scores) max_scores = m;
        }
    flame_scheduler *sched = NULL;
    if (!strcmp(o->via, "scheduler")) {
        const flame_batch_profile prof = {(uint32_t)o->sched_users, (uint32_t)o->sched_candidates};
        flame_scheduler_params sp = {.struct_size = sizeof sp, .profiles = &prof, .num_profiles = 1,
                                     .max_wait_us = (int64_t)o->max_wait_us, .workers = (uint32_t)o->workers};
        if (flame_scheduler_create(engine, &sp, &sched) != FLAME_OK) {
            fprintf(stderr, "e2e-bench: flame_scheduler_create: %s\n", flame_last_error());
            free(pool);
            return 1;
        }
    }
    pthread_barrier_t start, end;
    pthread_barrier_init(&start, NULL, (unsigned)o->clients + 1);
    pthread_barrier_init(&end, NULL, (unsigned)o->clients + 1);
    client *cs = calloc(o->clients, sizeof *cs);
    pthread_t *th = xmalloc(o->clients * sizeof *th);
    double *lat = xmalloc(o->clients * o->calls * sizeof *lat);
    for (size_t t = 0; t < o->clients; t++) {
        cs[t] = (client){.o = o, .engine = engine, .sched = sched, .pool = pool, .pool_n = pool_n, .index = t,
                         .max_scores = max_scores, .tasks = info->num_tasks, .start = &start, .end = &end,
                         .lat = lat + t * o->calls};
        pthread_create(&th[t], NULL, run, &cs[t]);
    }
    pthread_barrier_wait(&start);
    if (sched) flame_scheduler_reset_latency(sched);
    flame_scheduler_stats s0 = {.struct_size = sizeof s0}, s1 = {.struct_size = sizeof s1};
    if (sched) flame_scheduler_get_stats(sched, &s0);
    const double t0 = now_us();
    pthread_barrier_wait(&end);
    const double elapsed = now_us() - t0;
    if (sched) flame_scheduler_get_stats(sched, &s1);
    size_t failures = 0;
    double checksum = 0;
    for (size_t t = 0; t < o->clients; t++) {
        pthread_join(th[t], NULL);
        failures += cs[t].failures;
        checksum += cs[t].checksum;
    }
    const size_t n = o->clients * o->calls;
    qsort(lat, n, sizeof *lat, cmp_double);
    double mean = 0;
    for (size_t i = 0; i < n; i++) mean += lat[i];
    mean /= (double)n;
    const double rps = (double)n / (elapsed * 1e-6);
    const uint64_t batches = s1.batches - s0.batches, parts = s1.parts - s0.parts;
    if (o->json)
        printf("{\"mode\":\"clients\",\"via\":\"%s\",\"clients\":%zu,\"calls_per_client\":%zu,\"requests\":%zu,"
               "\"requests_per_s\":%.2f,\"p50_us\":%.2f,\"p99_us\":%.2f,\"mean_us\":%.2f,\"max_us\":%.2f,"
               "\"sched_users\":%zu,\"sched_candidates\":%zu,\"max_wait_us\":%zu,\"batches\":%llu,"
               "\"mean_batch\":%.3f,\"sched_queue_wait_p99_us\":%llu,\"failures\":%zu,\"checksum\":%.6g,"
               "\"device\":\"%s\",\"head\":\"%s\",\"libflame\":\"%s\"}\n",
               o->via, o->clients, o->calls, n, rps, percentile(lat, n, 0.5), percentile(lat, n, 0.99), mean,
               lat[n - 1], sched ? o->sched_users : 0, sched ? o->sched_candidates : 0, sched ? o->max_wait_us : 0,
               (unsigned long long)batches, batches ? (double)parts / (double)batches : 1.0,
               (unsigned long long)s1.queue_wait_p99_us, failures, checksum, o->device,
               info->head == FLAME_HEAD_SUMI ? "sumi" : "dot", flame_version_string());
    else
        printf("%zu clients via %s: %.1f requests/s, per request p50 %.1f us, p99 %.1f us%s\n", o->clients, o->via, rps,
               percentile(lat, n, 0.5), percentile(lat, n, 0.99), sched ? "" : " (no scheduler)");
    if (sched) {
        if (!o->json) printf("scheduler: %llu batches, %.2f requests a batch\n", (unsigned long long)batches,
                             batches ? (double)parts / (double)batches : 0.0);
        flame_scheduler_destroy(sched);
    }
    pthread_barrier_destroy(&start);
    pthread_barrier_destroy(&end);
    free(lat);
    free(th);
    free(cs);
    free(pool);
    return failures ? 1 : 0;
}
