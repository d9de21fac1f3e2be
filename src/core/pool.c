/* The CPU thread pool (contract in pool.h).
 *
 * A job lives on its caller's stack. It is handed to the pool threads under one mutex: a
 * thread takes a reference to the current job, claims tasks from its counter until none
 * are left, and drops the reference. The caller, once every task is claimed and finished,
 * withdraws the job and waits only for the references still held (threads that picked the
 * job up), never for threads that did not. Between jobs a pool thread spins for a short
 * while (the forward pass hands out a job every few microseconds), yielding its core after
 * the first microseconds, then sleeps. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "core/pool.h"

#define MAX_THREADS 256
#define PAUSE_NS 10000  /* a pool thread pause-spins this long after a job, */
#define SPIN_NS 200000  /* then yields the core between checks up to this long, then sleeps */

typedef struct job {
    fl_task_fn fn;
    void *ctx;
    int64_t n;
    int width;                 /* pool threads 1..width-1 may join */
    atomic_int_fast64_t next;  /* next task to claim */
    atomic_int_fast64_t done;  /* tasks finished */
    int refs;                  /* pool threads holding the job (under lock) */
} job;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER, idle = PTHREAD_COND_INITIALIZER;
static job *current;                /* under lock */
static atomic_uint_fast64_t gen;    /* bumped (under lock) when a job is published */
static atomic_int started;          /* pool threads started (written under lock) */
static atomic_flag busy = ATOMIC_FLAG_INIT; /* a job is running */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void run_tasks(job *j, int worker)
{
    int64_t t;
    while ((t = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->n) {
        j->fn(j->ctx, t, worker);
        atomic_fetch_add_explicit(&j->done, 1, memory_order_release);
    }
}

static void *pool_thread(void *arg)
{
    const int me = (int)(intptr_t)arg;
    uint_fast64_t seen = 0;
    for (;;) {
        /* a few microseconds of pause-spinning, then yielding (another process, or this
         * one's caller, may want the core), then sleep */
        const int64_t t0 = now_ns();
        for (int i = 0; atomic_load_explicit(&gen, memory_order_acquire) == seen; i++) {
            if ((i & 63) != 63) {
                cpu_relax();
                continue;
            }
            const int64_t dt = now_ns() - t0;
            if (dt > SPIN_NS) break;
            if (dt > PAUSE_NS) sched_yield();
        }
        pthread_mutex_lock(&lock);
        while (atomic_load_explicit(&gen, memory_order_relaxed) == seen) pthread_cond_wait(&wake, &lock);
        seen = atomic_load_explicit(&gen, memory_order_relaxed);
        job *j = current;
        if (j && me < j->width)
            j->refs++;
        else
            j = NULL;
        pthread_mutex_unlock(&lock);
        if (!j) continue;
        run_tasks(j, me);
        pthread_mutex_lock(&lock);
        if (--j->refs == 0) pthread_cond_broadcast(&idle);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

/* A forked child has none of the parent's pool threads: start afresh. */
static void after_fork_child(void)
{
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&wake, NULL);
    pthread_cond_init(&idle, NULL);
    current = NULL;
    atomic_store(&started, 0);
    atomic_flag_clear(&busy);
}

static void init(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* Starts pool threads up to `want` (fewer if the system refuses: the caller does their share). */
static void grow(int want)
{
    if (want > MAX_THREADS - 1) want = MAX_THREADS - 1;
    pthread_mutex_lock(&lock);
    while (atomic_load(&started) < want) {
        pthread_attr_t a;
        pthread_t t;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        const int rc = pthread_create(&t, &a, pool_thread, (void *)(intptr_t)(atomic_load(&started) + 1));
        pthread_attr_destroy(&a);
        if (rc != 0) break;
        atomic_fetch_add(&started, 1);
    }
    pthread_mutex_unlock(&lock);
}

void fl_parallel(int threads, int64_t n, fl_task_fn fn, void *ctx)
{
    if (threads > n) threads = (int)n;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads <= 1 || atomic_flag_test_and_set_explicit(&busy, memory_order_acquire)) {
        for (int64_t t = 0; t < n; t++) fn(ctx, t, 0);
        return;
    }
    pthread_once(&once, init);
    if (atomic_load(&started) < threads - 1) grow(threads - 1);
    job j = {.fn = fn, .ctx = ctx, .n = n, .width = threads};
    atomic_init(&j.next, 0);
    atomic_init(&j.done, 0);
    pthread_mutex_lock(&lock);
    current = &j;
    atomic_fetch_add_explicit(&gen, 1, memory_order_release);
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&lock);
    run_tasks(&j, 0);
    /* tasks claimed by pool threads and still running */
    for (int i = 0; atomic_load_explicit(&j.done, memory_order_acquire) < n; i++) {
        cpu_relax();
        if ((i & 1023) == 1023) sched_yield(); /* the one running it may share this core */
    }
    pthread_mutex_lock(&lock);
    current = NULL;
    while (j.refs > 0) pthread_cond_wait(&idle, &lock);
    pthread_mutex_unlock(&lock);
    atomic_flag_clear_explicit(&busy, memory_order_release);
}
