/* The batch-profile scheduler (flame.h, docs/scheduler.md): submit queues a request's parts;
 * workers form batches from the head of the queue, score each with one flame_score_batch
 * call and complete the parts' jobs. One mutex guards the queue; scoring runs outside it.
 *
 * The hand-over is kept cheap at high rates: one lock round trip a submit and one a batch on
 * the worker's side; one-part jobs come from a pool (no malloc a request) and go back to it
 * once a batch, under the lock the worker takes anyway; a submit signals a worker only when
 * one must look sooner than it is going to (notify: the queue went from empty to not empty,
 * a batch filled, or a deadline or due time came earlier), never while the workers are busy
 * or a forming batch's timer already covers it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/abi.h"
#include "engine/sched_iface.h"
#include "sched/sched.h"

#define MAX_WAIT_US 10000000
#define MAX_WORKERS 64
#define DEFAULT_MAX_QUEUE 65536u
#define DEFAULT_MAX_BYPASS 8u
#define MAX_BYPASS 65536u
#define MAX_TIMEOUT_US (1ll << 40)
#define POOL_KEEP 4096u /* free one-part jobs kept for reuse; more go back to malloc */

typedef fl_worker worker;

/* Completion state of one batch (or one list of expired or cancelled parts). */
typedef struct done_ctx {
    uint64_t now;         /* the scheduler's clock when the batch ended: its latency */
    fl_job **recycle;     /* where finished pooled jobs go; NULL: back to the pool before their
                           * callback (a callback may destroy the scheduler) */
} done_ctx;

/* The per-batch arrays of a worker; false on OOM. */
static bool worker_arrays(worker *w, size_t max_users)
{
    w->batch = malloc(max_users * sizeof *w->batch);
    w->reqs = malloc(max_users * sizeof *w->reqs);
    w->status = malloc(max_users * sizeof *w->status);
    w->message = malloc(max_users * sizeof *w->message);
    return w->batch && w->reqs && w->status && w->message;
}

static void worker_free(worker *w)
{
    free(w->batch), free(w->reqs), free(w->status), free(w->message), free(w->out);
}

uint64_t fl_sched_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t monotonic_clock(void *user)
{
    (void)user;
    return fl_sched_now_us();
}

void fl_sched_set_clock(flame_scheduler *s, fl_clock_fn fn, void *user)
{
    pthread_mutex_lock(&s->mu);
    s->clock = fn ? fn : monotonic_clock;
    s->clock_user = fn ? user : NULL;
    pthread_mutex_unlock(&s->mu);
}

void fl_sched_set_freed_hook(flame_scheduler *s, fl_sched_freed_fn fn, void *user)
{
    pthread_mutex_lock(&s->mu);
    s->freed_hook = fn;
    s->freed_user = user;
    pthread_mutex_unlock(&s->mu);
}

/* Wakes every sleeping worker (lock held). */
static void wake_all(flame_scheduler *s)
{
    for (uint32_t i = 0; i < s->num_workers; i++)
        if (s->workers[i].asleep) {
            s->workers[i].wake_at = 0;
            s->signals++;
            pthread_cond_signal(&s->workers[i].cv);
        }
}

void fl_sched_kick(flame_scheduler *s)
{
    pthread_mutex_lock(&s->mu);
    wake_all(s);
    pthread_mutex_unlock(&s->mu);
}

/* With the lock held, after the queue changed: when some worker must next look at it (the
 * scheduler's clock; 0: now, UINT64_MAX: never), by the rules of next_batch. */
static uint64_t needed_at(flame_scheduler *s)
{
    bool aged;
    const int l = fl_queue_pick(s, &aged);
    if (l < 0) return UINT64_MAX;
    if (s->stopping || aged || !s->max_wait_us) return 0;
    bool closed;
    fl_queue_form(s, l, &closed);
    if (closed) return 0;
    const uint64_t due = fl_queue_due(s, l);
    return due < s->next_deadline ? due : s->next_deadline;
}

/* Signals one sleeping worker if none would look by itself in time (lock held). Busy workers
 * look at the queue when their batch is done, so with no sleeper there is nothing to do. */
static void notify(flame_scheduler *s)
{
    if (!s->sleepers) return;
    const uint64_t need = needed_at(s);
    if (need == UINT64_MAX) return;
    worker *pick = NULL;
    for (uint32_t i = 0; i < s->num_workers; i++) {
        worker *w = &s->workers[i];
        if (!w->asleep) continue;
        if (w->wake_at <= need) return; /* it looks in time anyway */
        pick = w;
    }
    if (pick) {
        pick->wake_at = 0;
        s->signals++;
        pthread_cond_signal(&pick->cv);
    }
}

/* ------------------------------------------------------------------ the job pool */

static size_t pooled_bytes(void)
{
    return (sizeof(fl_job) + sizeof(fl_part) + 15) & ~(size_t)15;
}

/* A one-part job (lock held): a pooled one, or a new one; NULL on OOM. */
static fl_job *pool_get(flame_scheduler *s)
{
    fl_job *j = s->pool;
    if (j) {
        s->pool = j->pool_next;
        s->pool_n--;
        return j;
    }
    j = malloc(pooled_bytes());
    if (j) j->pooled = true;
    return j;
}

/* Returns a list of finished pooled jobs (linked by pool_next) to the pool (lock held). */
static void pool_put(flame_scheduler *s, fl_job *list)
{
    while (list) {
        fl_job *next = list->pool_next;
        if (s->pool_n < POOL_KEEP) {
            list->pool_next = s->pool;
            s->pool = list;
            s->pool_n++;
        } else {
            free(list);
        }
        list = next;
    }
}

/* ------------------------------------------------------------------ completion */

static void finish_job(flame_scheduler *s, fl_job *j, done_ctx *c)
{
    const int st = atomic_load(&j->status);
    if (st == FLAME_OK && j->gather)
        memcpy(j->scores, j->gather, j->req.num_candidates * (size_t)s->num_tasks * sizeof(float));
    if (st == FLAME_ERR_TIMEOUT) atomic_fetch_add(&s->timeouts, 1);
    else if (st == FLAME_ERR_CANCELLED) atomic_fetch_add(&s->cancelled, 1);
    else { /* scored: its latency counts */
        fl_hist_add(&s->latency, c->now - j->submit_us);
        atomic_fetch_add(st == FLAME_OK ? &s->completed : &s->failed, 1);
    }
    if (!j->pooled) {
        j->done(j->user, (flame_status)st, st == FLAME_OK ? NULL : j->message);
        free(j);
    } else if (c->recycle) { /* a worker's batch: the worker returns it at its next lock */
        j->done(j->user, (flame_status)st, st == FLAME_OK ? NULL : j->message);
        j->pool_next = *c->recycle;
        *c->recycle = j;
    } else { /* s may be gone once done returns: the job goes back first */
        const flame_score_done_fn done = j->done;
        void *user = j->user;
        char message[sizeof j->message];
        if (st != FLAME_OK) memcpy(message, j->message, sizeof message);
        j->pool_next = NULL;
        pthread_mutex_lock(&s->mu);
        pool_put(s, j);
        pthread_mutex_unlock(&s->mu);
        done(user, (flame_status)st, st == FLAME_OK ? NULL : message);
    }
}

/* One part is scored (st FLAME_OK, its scores already in place) or failed; the last part of a
 * job completes it. The first failure's status and message are the job's. */
static void complete_part(flame_scheduler *s, fl_part *p, flame_status st, const char *message, done_ctx *c)
{
    fl_job *j = p->job;
    if (st != FLAME_OK) {
        int ok = FLAME_OK;
        if (atomic_compare_exchange_strong(&j->status, &ok, (int)st))
            snprintf(j->message, sizeof j->message, "%s", message && *message ? message : flame_status_string(st));
    }
    if (j->nparts == 1 || atomic_fetch_sub(&j->parts_left, 1) == 1) /* acq_rel: sees every part's writes */
        finish_job(s, j, c);
}

/* Completes unlinked parts (fl_queue_expire, fl_queue_cancel) with st. A job is freed by its
 * last part, so each link is read before its part completes. */
static void complete_list(flame_scheduler *s, fl_part *p, flame_status st, done_ctx *c)
{
    while (p) {
        fl_part *next = p->next;
        char message[160];
        if (st == FLAME_ERR_TIMEOUT && p->job->deadline_us <= p->job->submit_us) /* (unsigned: no difference) */
            snprintf(message, sizeof message, "request %llu: its deadline had passed %llu us before the submit",
                     (unsigned long long)p->job->id, (unsigned long long)(p->job->submit_us - p->job->deadline_us));
        else if (st == FLAME_ERR_TIMEOUT && p->job->nparts > 1) /* other parts may have been scored already */
            snprintf(message, sizeof message, "request %llu: its deadline passed %llu us after the submit, before the "
                     "batch of one of its %zu parts started", (unsigned long long)p->job->id,
                     (unsigned long long)(p->job->deadline_us - p->job->submit_us), p->job->nparts);
        else if (st == FLAME_ERR_TIMEOUT)
            snprintf(message, sizeof message, "request %llu: its deadline passed %llu us after the submit, before its "
                     "batch started", (unsigned long long)p->job->id,
                     (unsigned long long)(p->job->deadline_us - p->job->submit_us));
        else
            snprintf(message, sizeof message, "request %llu: cancelled while queued", (unsigned long long)p->job->id);
        complete_part(s, p, st, message, c);
        p = next;
    }
}

/* ------------------------------------------------------------------ batches */

static flame_request part_request(const fl_part *p)
{
    flame_request r = p->job->req;
    r.candidates = r.candidates ? r.candidates + p->cand_off : NULL;
    r.num_candidates = p->cand_n;
    r.candidate_side = p->cand_side;
    return r;
}

static float *part_output(const flame_scheduler *s, const fl_part *p)
{
    const fl_job *j = p->job;
    return j->gather ? j->gather + p->cand_off * (size_t)s->num_tasks : j->scores;
}

/* Scores parts[0..n) as one call into w->out; on success each part's block is copied to its
 * job. Returns the call's status (its message on this thread). */
static flame_status score_parts(worker *w, fl_part **parts, const flame_request *reqs, size_t n)
{
    flame_scheduler *s = w->s;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += reqs[i].num_candidates * (size_t)s->num_tasks;
    if (total > w->out_cap) {
        float *grown = realloc(w->out, total * sizeof(float));
        if (!grown) return fl_error(FLAME_ERR_NOMEM, "scheduler: out of memory for a batch of %zu scores", total);
        w->out = grown;
        w->out_cap = total;
    }
    flame_status st = flame_score_batch(s->engine, reqs, n, w->out, total);
    if (st != FLAME_OK) return st;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        const size_t len = reqs[i].num_candidates * (size_t)s->num_tasks;
        memcpy(part_output(s, parts[i]), w->out + at, len * sizeof(float));
        at += len;
    }
    return FLAME_OK;
}

static void run_batch(worker *w, size_t n)
{
    flame_scheduler *s = w->s;
    const uint64_t start = fl_sched_clock(s);
    uint64_t cands = 0;
    for (size_t i = 0; i < n; i++) {
        w->reqs[i] = part_request(w->batch[i]);
        if (w->batch[i]->cand_n > cands) cands = w->batch[i]->cand_n;
        fl_hist_add(&s->queue_wait, start - w->batch[i]->job->submit_us);
    }
    atomic_fetch_add(&s->batches, 1);
    atomic_fetch_add(&s->parts, n);
    const fl_profiles *ps = &s->profiles;
    int prof = fl_profiles_fit(ps, n, cands);
    if (prof >= 0) {
        atomic_fetch_add(&s->profile_batches[prof], 1);
        uint64_t used = ps->count_candidates ? 0 : n; /* the candidates, or under the dot head the users */
        for (size_t i = 0; ps->count_candidates && i < n; i++) used += w->batch[i]->cand_n;
        atomic_fetch_add(&s->slots_used, used);
        atomic_fetch_add(&s->slots, (uint64_t)ps->p[prof].max_users * (ps->count_candidates ? ps->p[prof].max_candidates : 1));
    }
    atomic_fetch_add(&s->in_flight, 1);
    flame_status st = score_parts(w, w->batch, w->reqs, n);
    atomic_fetch_sub(&s->in_flight, 1);
    done_ctx c = {.now = fl_sched_clock(s), .recycle = &w->recycle}; /* one clock read for the batch */
    if (st == FLAME_OK) {
        for (size_t i = 0; i < n; i++) complete_part(s, w->batch[i], FLAME_OK, NULL, &c);
        return;
    }
    if (st == FLAME_ERR_INVALID_ARG && n > 1) { /* one bad request: find it, score the others */
        atomic_fetch_add(&s->isolated, 1);
        /* every part is scored before any completes: a done callback may destroy the scheduler
         * and then the engine, after which this worker must not call the engine again */
        for (size_t i = 0; i < n; i++) {
            w->status[i] = score_parts(w, &w->batch[i], &w->reqs[i], 1);
            w->message[i] = w->status[i] ? strdup(flame_last_error()) : NULL;
        }
        c.now = fl_sched_clock(s);
        for (size_t i = 0; i < n; i++) {
            complete_part(s, w->batch[i], w->status[i], w->message[i], &c);
            free(w->message[i]);
        }
        return;
    }
    char message[512];
    snprintf(message, sizeof message, "%s", flame_last_error());
    for (size_t i = 0; i < n; i++) complete_part(s, w->batch[i], st, message, &c);
}

/* ------------------------------------------------------------------ workers */

static void free_scheduler(flame_scheduler *s);

/* With the lock held: the next batch into `into` (its size), or 0 with either *expired (parts
 * whose deadline passed, to complete unlocked first) or *wake (when to look again on the
 * scheduler's clock; UINT64_MAX: when signalled). Never waits for company once stopping. */
static size_t next_batch(flame_scheduler *s, fl_part **into, fl_part **expired, uint64_t *wake)
{
    const uint64_t now = fl_sched_clock(s);
    *expired = NULL;
    *wake = UINT64_MAX;
    if (now >= s->next_deadline && (*expired = fl_queue_expire(s, now))) return 0;
    bool aged;
    const int l = fl_queue_pick(s, &aged);
    if (l < 0) return 0;
    bool closed;
    const size_t n = fl_queue_form(s, l, &closed); /* >= 1: a part no profile holds is a batch of its own */
    if (!closed && !s->stopping && !aged && s->max_wait_us) {
        const uint64_t due = fl_queue_due(s, l);
        if (now < due) { /* wait for more, for the oldest part's due time, or for the next deadline */
            *wake = due < s->next_deadline ? due : s->next_deadline;
            return 0;
        }
    }
    fl_queue_take(s, l, into, n);
    return n;
}

/* Waits on the condition until `wake` on the scheduler's clock (converted to a span, so an
 * injected clock works too), or until signalled. */
static void wait_until(flame_scheduler *s, worker *w, uint64_t wake)
{
    const uint64_t now = fl_sched_clock(s);
    if (wake != UINT64_MAX && wake <= now) return;
    w->asleep = true;
    w->wake_at = wake;
    s->sleepers++;
    if (wake == UINT64_MAX) {
        pthread_cond_wait(&w->cv, &s->mu);
    } else {
        const uint64_t real = fl_sched_now_us() + (wake - now);
        struct timespec ts = {.tv_sec = (time_t)(real / 1000000u), .tv_nsec = (long)(real % 1000000u) * 1000};
        pthread_cond_timedwait(&w->cv, &s->mu, &ts);
    }
    s->sleepers--;
    w->asleep = false;
}

/* The scheduler whose worker this thread is (NULL elsewhere): destroy and score called from a
 * done callback find out here that they run on a worker of their own scheduler. */
static _Thread_local flame_scheduler *current;

static void *work(void *arg)
{
    worker *w = arg;
    flame_scheduler *s = w->s;
    current = s;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        fl_part *expired;
        uint64_t wake;
        const size_t n = next_batch(s, w->batch, &expired, &wake);
        if (expired) {
            pthread_mutex_unlock(&s->mu);
            /* now: a split job whose other part failed is completed here as scored, and its
             * latency is counted from it */
            done_ctx c = {.now = fl_sched_clock(s), .recycle = &w->recycle};
            complete_list(s, expired, FLAME_ERR_TIMEOUT, &c);
            pthread_mutex_lock(&s->mu);
            pool_put(s, w->recycle);
            w->recycle = NULL;
            continue;
        }
        if (n == 0) {
            if (!s->queued && s->stopping) break; /* every queued part is done */
            wait_until(s, w, s->queued ? wake : UINT64_MAX);
            continue;
        }
        if (s->queued) notify(s); /* the next batch may form on another worker */
        pthread_mutex_unlock(&s->mu);
        run_batch(w, n);
        pthread_mutex_lock(&s->mu);
        pool_put(s, w->recycle); /* the batch's jobs, in the lock round trip the worker makes anyway */
        w->recycle = NULL;
    }
    const bool free_it = s->freed_by_worker;
    pthread_mutex_unlock(&s->mu);
    current = NULL;
    if (free_it) free_scheduler(s); /* flame_scheduler_destroy ran on this thread (destroy_from_worker) */
    return NULL;
}

/* ------------------------------------------------------------------ create / destroy */

static void free_scheduler(flame_scheduler *s)
{
    if (!s) return;
    worker *ws = s->workers;
    for (uint32_t i = 0; ws && i < s->num_workers; i++) {
        worker_free(&ws[i]);
        if (ws[i].has_cv) pthread_cond_destroy(&ws[i].cv);
    }
    free(s->threads);
    for (fl_job *j = s->pool, *next; j; j = next) {
        next = j->pool_next;
        free(j);
    }
    pthread_mutex_destroy(&s->mu);
    const fl_sched_freed_fn hook = s->freed_hook;
    void *user = s->freed_user;
    free(s);
    if (hook) hook(user);
}

static void stop_workers(flame_scheduler *s)
{
    atomic_store_explicit(&s->closed, true, memory_order_release);
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    wake_all(s);
    pthread_mutex_unlock(&s->mu);
    for (uint32_t i = 0; i < s->started; i++) pthread_join(s->threads[i], NULL);
    s->started = 0;
}

FLAME_API flame_status flame_scheduler_create(flame_engine *engine, const flame_scheduler_params *params,
                                              flame_scheduler **out)
{
    fl_clear_error();
    if (out) *out = NULL;
    if (!engine || !out) return fl_error(FLAME_ERR_INVALID_ARG, "flame_scheduler_create: %s is NULL", engine ? "out" : "engine");
    flame_scheduler_params p = {.struct_size = sizeof p};
    if (params) {
        flame_status st = fl_struct_in("flame_scheduler_params", &p, sizeof p, params);
        if (st) return st;
    }
    if (p.max_wait_us < 0 || p.max_wait_us > MAX_WAIT_US)
        return fl_error(FLAME_ERR_INVALID_ARG, "max_wait_us %lld is outside 0..%d", (long long)p.max_wait_us,
                        MAX_WAIT_US);
    if (p.max_bypass > MAX_BYPASS)
        return fl_error(FLAME_ERR_INVALID_ARG, "max_bypass %u is outside 1..%u (0 = the default)", p.max_bypass,
                        MAX_BYPASS);
    if (p.adaptive_wait > 1)
        return fl_error(FLAME_ERR_INVALID_ARG, "adaptive_wait %u is outside 0..1", p.adaptive_wait);
    if (p.workers > MAX_WORKERS)
        return fl_error(FLAME_ERR_INVALID_ARG, "workers %u is outside 1..%d (0 = the default)", p.workers, MAX_WORKERS);
    if (p.workers == 0) /* one batch in flight per GPU executor; on the CPU one call uses the cores itself */
        p.workers = fl_engine_workers(engine, MAX_WORKERS);
    flame_scheduler *s = calloc(1, sizeof *s);
    if (!s) return fl_error(FLAME_ERR_NOMEM, "out of memory allocating a scheduler");
    pthread_mutex_init(&s->mu, NULL);
    flame_status st = fl_profiles_init(&s->profiles, p.profiles, p.num_profiles,
                                       fl_engine_candidates_are_tokens(engine));
    if (st) {
        free_scheduler(s);
        return st;
    }
    s->engine = engine;
    s->num_tasks = fl_engine_num_tasks(engine);
    s->max_wait_us = (uint64_t)p.max_wait_us;
    s->max_queue = p.max_queue ? p.max_queue : DEFAULT_MAX_QUEUE;
    s->max_bypass = p.max_bypass ? p.max_bypass : DEFAULT_MAX_BYPASS;
    s->adaptive = p.adaptive_wait == 1;
    s->clock = monotonic_clock;
    s->next_deadline = UINT64_MAX;
    s->num_workers = p.workers;
    /* the thread ids, then the workers' state */
    s->threads = calloc(1, p.workers * (sizeof(pthread_t) + sizeof(worker)));
    worker *ws = s->threads ? (worker *)(s->threads + p.workers) : NULL;
    s->workers = ws;
    bool ok = ws != NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* deadlines do not jump with the wall clock */
    for (uint32_t i = 0; ok && i < p.workers; i++) {
        ws[i].s = s;
        ws[i].has_cv = pthread_cond_init(&ws[i].cv, &ca) == 0;
        ok = ws[i].has_cv && worker_arrays(&ws[i], s->profiles.max_users);
    }
    pthread_condattr_destroy(&ca);
    if (!ok) {
        free_scheduler(s);
        return fl_error(FLAME_ERR_NOMEM, "out of memory allocating %u scheduler workers", p.workers);
    }
    for (uint32_t i = 0; i < p.workers; i++) {
        int e = pthread_create(&s->threads[i], NULL, work, &ws[i]);
        if (e) {
            stop_workers(s);
            free_scheduler(s);
            return fl_error(FLAME_ERR_INTERNAL, "cannot start scheduler worker %u: %s", i, strerror(e));
        }
        s->started++;
    }
    /* a GPU engine pads its passes to these shapes, so each batch replays a captured graph */
    fl_engine_adopt_profiles(engine, s->profiles.p, s->profiles.n);
    *out = s;
    return FLAME_OK;
}

/* destroy called from a done callback, on worker `self` of s: the other workers drain the queue
 * and are joined; with none, this thread drains it; then only this worker's current batch is
 * left to complete (its scores are written: the engine is no longer used) and the worker frees
 * the scheduler when it returns to its loop. */
static void destroy_from_worker(flame_scheduler *s)
{
    const pthread_t self = pthread_self();
    atomic_store_explicit(&s->closed, true, memory_order_release);
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    wake_all(s);
    pthread_mutex_unlock(&s->mu);
    for (uint32_t i = 0; i < s->started; i++)
        if (!pthread_equal(s->threads[i], self)) pthread_join(s->threads[i], NULL);
    worker tmp = {.s = s};
    const bool arrays = worker_arrays(&tmp, s->profiles.max_users);
    pthread_mutex_lock(&s->mu);
    while (s->queued) { /* only when this was the one worker; stopping: no batch waits */
        fl_part *expired, *one = NULL;
        uint64_t wake;
        size_t n = 0;
        if (arrays) {
            n = next_batch(s, tmp.batch, &expired, &wake);
        } else { /* no memory for a batch: fail what is queued, part by part */
            bool aged;
            fl_queue_take(s, fl_queue_pick(s, &aged), &one, 1);
            expired = NULL;
        }
        pthread_mutex_unlock(&s->mu);
        done_ctx c = {.now = fl_sched_clock(s), .recycle = &tmp.recycle};
        if (expired) complete_list(s, expired, FLAME_ERR_TIMEOUT, &c);
        else if (one) complete_part(s, one, FLAME_ERR_NOMEM, "scheduler: out of memory draining the queue", &c);
        else if (n) run_batch(&tmp, n);
        pthread_mutex_lock(&s->mu);
        pool_put(s, tmp.recycle);
        tmp.recycle = NULL;
    }
    s->freed_by_worker = true;
    pthread_mutex_unlock(&s->mu);
    worker_free(&tmp);
    pthread_detach(self);
}

FLAME_API void flame_scheduler_destroy(flame_scheduler *s)
{
    if (!s) return;
    if (current == s) { /* from a done callback of its own */
        destroy_from_worker(s);
        return;
    }
    stop_workers(s); /* they drain the queue first */
    free_scheduler(s);
}

/* ------------------------------------------------------------------ submit */

/* One allocation: the job, its parts, and for a split request with candidate bags the
 * rebased bags of every part, then its private scores. */
static fl_job *make_job(const flame_scheduler *s, const flame_request *q, size_t nparts)
{
    const size_t m = q->num_candidates, slots = q->candidate_side ? q->num_side_features : 0;
    const bool split = nparts > 1;
    size_t bytes = sizeof(fl_job) + nparts * sizeof(fl_part);
    const size_t bags_at = bytes;
    if (split) bytes += nparts * slots * sizeof(flame_bags);
    const size_t offs_at = bytes;
    if (split) bytes += (m + nparts) * slots * sizeof(int64_t); /* each part: its count + 1 offsets per slot */
    bytes = (bytes + 15) & ~(size_t)15;
    const size_t gather_at = bytes;
    if (split) bytes += m * (size_t)s->num_tasks * sizeof(float);
    fl_job *j = malloc(bytes);
    if (!j) return NULL;
    memset(j, 0, sizeof *j);
    j->nparts = nparts;
    j->gather = split ? (float *)((unsigned char *)j + gather_at) : NULL;
    flame_bags *bags = (flame_bags *)((unsigned char *)j + bags_at);
    int64_t *offs = (int64_t *)((unsigned char *)j + offs_at);
    const size_t base = m / nparts, extra = m % nparts;
    size_t at = 0;
    for (size_t k = 0; k < nparts; k++) {
        fl_part *p = &j->parts[k];
        p->next = NULL;
        p->job = j;
        p->cand_off = at;
        p->cand_n = base + (k < extra);
        p->cand_side = q->candidate_side;
        p->weight = 1;
        if (split && slots) { /* the slice's bags: offsets rebased to 0, ids from the slice's first */
            for (size_t sl = 0; sl < slots; sl++) {
                const flame_bags *b = &q->candidate_side[sl];
                const int64_t first = b->offsets ? b->offsets[at] : 0;
                for (size_t t = 0; t <= p->cand_n; t++) offs[t] = b->offsets ? b->offsets[at + t] - first : 0;
                bags[sl] = (flame_bags){b->offsets ? offs : NULL, b->ids ? b->ids + first : NULL,
                                        b->offsets ? (size_t)offs[p->cand_n] : 0};
                offs += p->cand_n + 1;
            }
            p->cand_side = bags;
            bags += slots;
        }
        at += p->cand_n;
    }
    return j;
}


FLAME_API flame_status flame_scheduler_submit_ex(flame_scheduler *s, const flame_request *request, float *scores,
                                                 size_t scores_len, const flame_submit_options *options,
                                                 flame_score_done_fn done, void *user, uint64_t *ticket)
{
    fl_clear_error();
    if (ticket) *ticket = 0;
    if (!s || !request || !done)
        return fl_error(FLAME_ERR_INVALID_ARG, "flame_scheduler_submit: %s is NULL",
                        !s ? "scheduler" : !request ? "request" : "done");
    if (atomic_load_explicit(&s->closed, memory_order_acquire)) /* before the engine is touched: it may be gone */
        return fl_error(FLAME_ERR_UNAVAILABLE, "the scheduler is being destroyed");
    flame_submit_options o = {.struct_size = sizeof o};
    flame_status st;
    if (options && (st = fl_struct_in("flame_submit_options", &o, sizeof o, options))) return st;
    if (o.priority < FLAME_PRIORITY_LOW || o.priority > FLAME_PRIORITY_HIGH)
        return fl_error(FLAME_ERR_INVALID_ARG, "priority %d is none of FLAME_PRIORITY_LOW (-1), _NORMAL (0), _HIGH (1)",
                        (int)o.priority);
    if (o.timeout_us < 0 || o.timeout_us > MAX_TIMEOUT_US)
        return fl_error(FLAME_ERR_INVALID_ARG, "timeout_us %lld is outside 0..2^40 (0 = none)",
                        (long long)o.timeout_us);
    flame_request q = {0}; /* as flame_score reads it (core/abi.h) */
    st = fl_struct_in("flame_request", &q, sizeof q, request);
    if (st) return st;
    const int32_t slots = fl_engine_num_side(s->engine);
    if (q.num_side_features != (size_t)slots) /* checked before the bags are read for splitting */
        return fl_error(FLAME_ERR_INVALID_ARG, "request: num_side_features = %zu, the model has %d",
                        q.num_side_features, slots);
    /* before the buffer: a count past the limit is INVALID_ARG however large scores_len is
     * (validation's answer; also bounds make_job's sizes) */
    if (q.num_candidates > fl_engine_max_candidates())
        return fl_error(FLAME_ERR_INVALID_ARG, "request 0: num_candidates = %zu exceeds %zu", q.num_candidates,
                        fl_engine_max_candidates());
    uint64_t need;
    if (!fl_mul_u64(q.num_candidates, (uint64_t)s->num_tasks, &need) || need > scores_len)
        return fl_error(FLAME_ERR_BUFFER_TOO_SMALL, "scores has room for %zu floats, the request needs %zu x %d",
                        scores_len, q.num_candidates, s->num_tasks);
    if (q.num_candidates && !scores) return fl_error(FLAME_ERR_INVALID_ARG, "scores is NULL");
    if (q.num_candidates && !q.candidates)
        return fl_error(FLAME_ERR_INVALID_ARG, "request: candidates is NULL with num_candidates %zu", q.num_candidates);
    if (q.num_candidates == 0) { /* nothing to batch: validated and done here (ticket 0: nothing to cancel) */
        st = flame_score(s->engine, &q, scores, scores_len);
        char message[512];
        snprintf(message, sizeof message, "%s", st ? flame_last_error() : "");
        atomic_fetch_add(&s->submitted, 1);
        atomic_fetch_add(st ? &s->failed : &s->completed, 1);
        done(user, st, st ? message : NULL);
        fl_clear_error(); /* accepted: the request's error went to done, not to this call */
        return FLAME_OK;
    }
    /* a kv_cache request is one engine call whatever its length: one cache lookup and one gather
     * of the cached K/V, its candidates in chunks of the largest max_candidates (the engine
     * adopted the profiles); cut into parts, each would look up and gather again, and on a miss
     * compute the history again or wait on the first part's computation. It still holds the
     * places of max_queue its parts would, so the queue bounds the same work. */
    const size_t weight = fl_profiles_parts(&s->profiles, q.num_candidates);
    const size_t nparts = fl_engine_kv_request(s->engine, &q) ? 1 : weight;
    if (weight > s->max_queue) /* never accepted, however empty the queue: not a transient refusal */
        return fl_error(FLAME_ERR_INVALID_ARG, "request: %zu candidates make %zu parts of at most %u, more than "
                        "max_queue %u", q.num_candidates, weight, s->profiles.max_candidates, s->max_queue);
    /* the parts get rebased slices of the candidate bags: check their structure first, or a bad
     * offsets[0] would be rebased away (validation then sees 0) */
    if (nparts > 1 && q.candidate_side &&
        (st = fl_engine_check_candidate_bags(s->engine, q.candidate_side, q.num_candidates)))
        return st;
    fl_job *j = NULL; /* a split job is made here; a one-part one comes from the pool under the lock */
    if (nparts > 1 && !(j = make_job(s, &q, nparts)))
        return fl_error(FLAME_ERR_NOMEM, "out of memory queueing a request of %zu candidates", q.num_candidates);
    pthread_mutex_lock(&s->mu);
    const bool stopping = s->stopping, full = s->queued + weight > s->max_queue;
    const uint64_t queued = s->queued;
    bool nomem = false;
    if (!stopping && !full && !j) {
        if ((j = pool_get(s))) {
            j->nparts = 1;
            j->gather = NULL;
            j->taken = 0;
            j->parts[0] = (fl_part){.job = j, .cand_n = q.num_candidates, .cand_side = q.candidate_side,
                                    .weight = weight};
        }
        nomem = !j;
    }
    if (!stopping && !full && !nomem) { /* counted before a worker can see it (and complete it) */
        j->req = q;
        j->scores = scores;
        j->done = done;
        j->user = user;
        j->level = FLAME_PRIORITY_HIGH - o.priority; /* 0 = the highest */
        atomic_init(&j->parts_left, nparts);
        atomic_init(&j->status, FLAME_OK);
        atomic_fetch_add(&s->submitted, 1);
        atomic_fetch_add(&s->candidates, q.num_candidates);
        if (nparts > 1) atomic_fetch_add(&s->split, 1);
        j->submit_us = fl_sched_clock(s);
        j->deadline_us = UINT64_MAX;
        if (o.timeout_us) j->deadline_us = j->submit_us + (uint64_t)o.timeout_us;
        if (o.deadline_us && o.deadline_us < j->deadline_us) j->deadline_us = o.deadline_us;
        j->id = ++s->next_id;
        if (ticket) *ticket = j->id;
        fl_queue_push(s, j);
        notify(s); /* a worker is woken only if none would look in time by itself */
    } else if (!nomem) {
        atomic_fetch_add(&s->rejected, 1);
    }
    pthread_mutex_unlock(&s->mu); /* s is not touched after this on success */
    if (nomem) return fl_error(FLAME_ERR_NOMEM, "out of memory queueing a request of %zu candidates", q.num_candidates);
    if (stopping || full) {
        free(j); /* NULL or a split job: a pooled one is taken only when accepted */
        if (stopping) return fl_error(FLAME_ERR_UNAVAILABLE, "the scheduler is being destroyed");
        return fl_error(FLAME_ERR_UNAVAILABLE, "scheduler queue full: %llu part(s) waiting, this request needs %zu, "
                        "max_queue %u", (unsigned long long)queued, weight, s->max_queue);
    }
    return FLAME_OK;
}

FLAME_API flame_status flame_scheduler_submit(flame_scheduler *s, const flame_request *request, float *scores,
                                              size_t scores_len, flame_score_done_fn done, void *user)
{
    return flame_scheduler_submit_ex(s, request, scores, scores_len, NULL, done, user, NULL);
}

FLAME_API flame_status flame_scheduler_cancel(flame_scheduler *s, uint64_t ticket)
{
    fl_clear_error();
    if (!s) return fl_error(FLAME_ERR_INVALID_ARG, "scheduler is NULL");
    pthread_mutex_lock(&s->mu);
    const uint64_t last = s->next_id;
    bool running = false;
    fl_part *parts = ticket && ticket <= last ? fl_queue_cancel(s, ticket, &running) : NULL;
    pthread_mutex_unlock(&s->mu);
    if (!ticket || ticket > last)
        return fl_error(FLAME_ERR_INVALID_ARG, "ticket %llu was never given by this scheduler (the last is %llu)",
                        (unsigned long long)ticket, (unsigned long long)last);
    if (!parts)
        return fl_error(FLAME_ERR_UNAVAILABLE, "request %llu is no longer queued: %s", (unsigned long long)ticket,
                        running ? "a part of it is being scored" : "it is being scored or has completed");
    /* s may be gone after this (a done callback may destroy it) */
    done_ctx c = {.now = fl_sched_clock(s), .recycle = NULL};
    complete_list(s, parts, FLAME_ERR_CANCELLED, &c);
    return FLAME_OK;
}

FLAME_API uint64_t flame_scheduler_now_us(const flame_scheduler *s)
{
    return s ? fl_sched_clock(s) : 0;
}

/* ------------------------------------------------------------------ synchronous scoring */

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    flame_status status;
    char message[512];
} waiter;

static void wake(void *user, flame_status st, const char *message)
{
    waiter *w = user;
    pthread_mutex_lock(&w->mu);
    w->status = st;
    if (message) snprintf(w->message, sizeof w->message, "%s", message);
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

FLAME_API flame_status flame_scheduler_score_ex(flame_scheduler *s, const flame_request *request, float *scores,
                                                size_t scores_len, const flame_submit_options *options)
{
    if (s && current == s) /* a done callback waiting for its own scheduler: with one worker, forever */
        return fl_error(FLAME_ERR_INVALID_ARG, "flame_scheduler_score called from a done callback of the same "
                        "scheduler: it would wait for the worker it runs on (submit instead)");
    waiter w = {.done = false, .status = FLAME_OK};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    flame_status st = flame_scheduler_submit_ex(s, request, scores, scores_len, options, wake, &w, NULL);
    if (st == FLAME_OK) {
        pthread_mutex_lock(&w.mu);
        while (!w.done) pthread_cond_wait(&w.cv, &w.mu);
        pthread_mutex_unlock(&w.mu);
        st = w.status;
        if (st) fl_error(st, "%s", w.message); /* the worker's message, on the caller's thread */
    }
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    return st;
}

FLAME_API flame_status flame_scheduler_score(flame_scheduler *s, const flame_request *request, float *scores,
                                             size_t scores_len)
{
    return flame_scheduler_score_ex(s, request, scores, scores_len, NULL);
}

/* ------------------------------------------------------------------ statistics */

FLAME_API flame_status flame_scheduler_get_stats(flame_scheduler *s, flame_scheduler_stats *stats)
{
    fl_clear_error();
    if (!s || !stats) return fl_error(FLAME_ERR_INVALID_ARG, "%s is NULL", s ? "stats" : "scheduler");
    flame_status st = fl_struct_size_check("flame_scheduler_stats", stats->struct_size, sizeof *stats);
    if (st) return st;
    flame_scheduler_stats v = {.struct_size = sizeof v}, *out = stats;
    stats = &v;
    stats->submitted = atomic_load(&s->submitted);
    stats->completed = atomic_load(&s->completed);
    stats->failed = atomic_load(&s->failed);
    stats->rejected = atomic_load(&s->rejected);
    stats->split = atomic_load(&s->split);
    stats->parts = atomic_load(&s->parts);
    stats->batches = atomic_load(&s->batches);
    stats->isolated = atomic_load(&s->isolated);
    stats->timeouts = atomic_load(&s->timeouts);
    stats->cancelled = atomic_load(&s->cancelled);
    stats->in_flight = atomic_load(&s->in_flight);
    stats->candidates = atomic_load(&s->candidates);
    stats->batch_slots_used = atomic_load(&s->slots_used);
    stats->batch_slots = atomic_load(&s->slots);
    pthread_mutex_lock(&s->mu);
    stats->queued = s->queued;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < FLAME_SCHED_MAX_PROFILES; i++) stats->profile_batches[i] = atomic_load(&s->profile_batches[i]);
    stats->latency_p50_us = fl_hist_quantile(&s->latency, 0.50);
    stats->latency_p99_us = fl_hist_quantile(&s->latency, 0.99);
    stats->latency_max_us = fl_hist_max(&s->latency);
    stats->queue_wait_p50_us = fl_hist_quantile(&s->queue_wait, 0.50);
    stats->queue_wait_p99_us = fl_hist_quantile(&s->queue_wait, 0.99);
    return fl_struct_out("flame_scheduler_stats", out, &v, sizeof v);
}

FLAME_API flame_status flame_scheduler_reset_latency(flame_scheduler *s)
{
    fl_clear_error();
    if (!s) return fl_error(FLAME_ERR_INVALID_ARG, "scheduler is NULL");
    fl_hist_reset(&s->latency);
    fl_hist_reset(&s->queue_wait);
    return FLAME_OK;
}
