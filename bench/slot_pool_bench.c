/* slot-pool-bench: the tail latency of callers sharing a few executors, with the engine's
 * first-come-first-served slot pool (src/core/slot_pool.h) against a mutex and one condition
 * variable (the hand-off it replaced). Each of --threads callers loops: host work (--host-us
 * of spinning), take a slot, hold it for --hold-us (sleeping, as a caller waiting for its GPU
 * work does), give it back. Prints per-call latency (take to give back) P50, P99 and max, in
 * us, for both, as JSON lines.
 *   bench/slot-pool-bench [--threads 8] [--slots 2] [--hold-us 250] [--host-us 20] [--calls 2000] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/slot_pool.h"
#include "cli_args.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}
static void spin_us(double us)
{
    const double end = now_us() + us;
    while (now_us() < end) {
    }
}
static void sleep_us(double us)
{
    struct timespec ts = {0, (long)(us * 1e3)};
    nanosleep(&ts, NULL);
}

/* the replaced hand-off: last freed first, any caller may take a freed slot */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int free_slots[64], num_free;
} cond_pool;
static int cond_acquire(cond_pool *p)
{
    pthread_mutex_lock(&p->lock);
    while (p->num_free == 0) pthread_cond_wait(&p->cond, &p->lock);
    const int s = p->free_slots[--p->num_free];
    pthread_mutex_unlock(&p->lock);
    return s;
}
static void cond_release(cond_pool *p, int s)
{
    pthread_mutex_lock(&p->lock);
    p->free_slots[p->num_free++] = s;
    pthread_cond_signal(&p->cond);
    pthread_mutex_unlock(&p->lock);
}

static int threads = 8, slots = 2, calls = 2000;
static double hold_us = 250, host_us = 20;

typedef struct {
    int fifo;
    fl_slot_pool *fp;
    cond_pool *cp;
    double *lat;
} worker;

static void *run(void *arg)
{
    worker *w = arg;
    for (int i = 0; i < calls; i++) {
        spin_us(host_us);
        const double t0 = now_us();
        const int s = w->fifo ? fl_slot_acquire(w->fp) : cond_acquire(w->cp);
        sleep_us(hold_us);
        if (w->fifo)
            fl_slot_release(w->fp, s);
        else
            cond_release(w->cp, s);
        w->lat[i] = now_us() - t0;
    }
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void measure(int fifo)
{
    fl_slot_pool fp;
    cond_pool cp = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, {0}, 0};
    if (fl_slot_pool_init(&fp, slots)) exit(1);
    for (int i = 0; i < slots; i++) cp.free_slots[cp.num_free++] = i;
    double *lat = malloc(sizeof(double) * (size_t)threads * (size_t)calls);
    worker *ws = calloc((size_t)threads, sizeof *ws);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    const double t0 = now_us();
    for (int i = 0; i < threads; i++) {
        ws[i] = (worker){fifo, &fp, &cp, lat + (size_t)i * calls};
        pthread_create(&th[i], NULL, run, &ws[i]);
    }
    for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
    const double wall = now_us() - t0;
    const size_t n = (size_t)threads * calls;
    qsort(lat, n, sizeof *lat, cmp);
    printf("{\"pool\": \"%s\", \"threads\": %d, \"slots\": %d, \"hold_us\": %.0f, \"host_us\": %.0f, \"calls_per_s\": %.0f, "
           "\"p50_us\": %.1f, \"p99_us\": %.1f, \"max_us\": %.1f, \"p99_over_p50\": %.2f}\n",
           fifo ? "fifo" : "mutex+condvar", threads, slots, hold_us, host_us, n / wall * 1e6, lat[n / 2],
           lat[n * 99 / 100], lat[n - 1], lat[n * 99 / 100] / lat[n / 2]);
    free(lat);
    free(ws);
    free(th);
    fl_slot_pool_destroy(&fp);
}

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *flag = argv[i], *v = argv[i + 1], *prog = "slot-pool-bench";
        long long n = 0;
        bool ok = true;
        if (!strcmp(flag, "--threads")) ok = cli_int(prog, flag, v, 1, 256, &n), threads = (int)n;
        else if (!strcmp(flag, "--slots")) ok = cli_int(prog, flag, v, 1, 64, &n), slots = (int)n;
        else if (!strcmp(flag, "--calls")) ok = cli_int(prog, flag, v, 1, 1000000000, &n), calls = (int)n;
        else if (!strcmp(flag, "--hold-us")) ok = cli_real(prog, flag, v, 0, false, 1e7, &hold_us);
        else if (!strcmp(flag, "--host-us")) ok = cli_real(prog, flag, v, 0, false, 1e7, &host_us);
        else {
            fprintf(stderr, "usage: %s [--threads N] [--slots N] [--hold-us US] [--host-us US] [--calls N]\n", argv[0]);
            return 2;
        }
        if (!ok) return 2; /* (a refused number left its variable 0: it is not used) */
    }
    measure(0);
    measure(1);
    return 0;
}
