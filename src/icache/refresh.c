/* Refresh-ahead: a queue of ids to refetch, run by a background thread (or the caller).
 * A hit past the refresh point queues its id once (the entry's refresh_pending flag); a
 * failed refresh is requeued with exponential backoff while its entry is still there and
 * still waiting, so one failing id never stops the others and is never dropped for good. */
#include <stdlib.h>
#include <time.h>

#include "icache/icache.h"

#define REFRESH_BATCH 256

void fl_refresh_schedule(struct flame_item_cache *c, int64_t key, uint64_t due, uint64_t delay)
{
    pthread_mutex_lock(&c->rq_lock);
    if (c->rq_len == c->rq_cap) {
        size_t cap = c->rq_cap ? c->rq_cap * 2 : 64;
        fl_refresh_item *q = realloc(c->rq, cap * sizeof *q);
        if (!q) { /* out of memory: undo the pending mark so a later hit queues it again */
            pthread_mutex_unlock(&c->rq_lock);
            uint64_t h;
            fl_shard *sh = fl_shard_of(c, key, &h);
            pthread_mutex_lock(&sh->lock);
            fl_entry *e = fl_shard_find(sh, key, h);
            if (e) atomic_store(&e->refresh_pending, 0);
            pthread_mutex_unlock(&sh->lock);
            return;
        }
        c->rq = q;
        c->rq_cap = cap;
    }
    c->rq[c->rq_len++] = (fl_refresh_item){key, due, delay};
    pthread_cond_signal(&c->rq_cv);
    pthread_mutex_unlock(&c->rq_lock);
}

/* Takes up to max due items out of the queue (rq_lock held). */
static size_t take_due(struct flame_item_cache *c, uint64_t now, fl_refresh_item *dst, size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < c->rq_len && n < max;) {
        if (c->rq[i].due <= now) {
            dst[n++] = c->rq[i];
            c->rq[i] = c->rq[--c->rq_len];
        } else {
            i++;
        }
    }
    return n;
}

typedef struct job {
    fl_refresh_item item;
    fl_shard *sh;
    fl_flight *f;
} job;

/* Installs a refresh result or, on failure, keeps the stale value and requeues the id with
 * its backoff doubled while its entry still waits for it. */
static void finish_job(struct flame_item_cache *c, job *j, flame_status st, const flame_feature_batch *got, size_t k)
{
    uint32_t len = 0, state = 0;
    const uint8_t *blob = st ? NULL : fl_batch_blob(got, k, &len, &state);
    uint64_t now = fl_now(c), delay = 0;
    bool retry = false;
    if (st)
        fl_log(FLAME_LOG_WARN, "item cache: refresh of id %lld failed (%s); serving the stale value",
               (long long)j->item.key, flame_last_error());
    pthread_mutex_lock(&j->sh->lock);
    fl_flight_finish(c, j->sh, j->f, st, blob, len, now);
    if (st) {
        fl_entry *e = fl_shard_find(j->sh, j->item.key, fl_hash64(j->item.key));
        retry = e && atomic_load(&e->refresh_pending);
        delay = j->item.delay ? j->item.delay * 2 : c->retry_min;
        if (delay > c->retry_max) delay = c->retry_max;
    }
    pthread_mutex_unlock(&j->sh->lock);
    atomic_fetch_add(st ? &c->refresh_failures : &c->refreshes, 1);
    if (retry) fl_refresh_schedule(c, j->item.key, fl_sat_add_u64(now, delay), delay);
}

/* Before each fetch: false once the last reference has gone (no fetch starts after that).
 * On the refresh thread the batch is published for fl_icache_release, and armed first when the
 * source is asynchronous, in the same critical section that checks stop: release then sees
 * either stop taken here (no fetch) or a batch awaiting its completion (it must not join a
 * thread that waits for a completion the releasing thread may be the one to make). */
static bool begin_fetch(struct flame_item_cache *c, flame_feature_batch *got, bool own_thread)
{
    pthread_mutex_lock(&c->rq_lock);
    const bool go = !c->stop;
    if (go && own_thread) {
        if (c->source->async) fl_batch_arm(got);
        c->refresh_got = got;
    }
    pthread_mutex_unlock(&c->rq_lock);
    return go;
}

static void end_fetches(struct flame_item_cache *c)
{
    pthread_mutex_lock(&c->rq_lock);
    c->refresh_got = NULL;
    pthread_mutex_unlock(&c->rq_lock);
}

/* Whether the last reference has gone (the refresh thread then starts no further fetch). */
static bool stopping(struct flame_item_cache *c)
{
    pthread_mutex_lock(&c->rq_lock);
    const bool stop = c->stop;
    pthread_mutex_unlock(&c->rq_lock);
    return stop;
}

/* A job whose fetch completed after the last reference went (destroy returned without waiting
 * for it): its flight ends, nothing is installed or rescheduled, and none of the host's hooks
 * (clock, TTL, log) is called, since the host may have freed what they use. */
static void drop_job(struct flame_item_cache *c, job *j)
{
    pthread_mutex_lock(&j->sh->lock);
    fl_flight_finish(c, j->sh, j->f, FLAME_ERR_UNAVAILABLE, NULL, 0, 0);
    pthread_mutex_unlock(&j->sh->lock);
}

/* One batch: claim a flight per id still waiting for its refresh, fetch them all at once,
 * install or reschedule. */
static uint64_t run_batch(struct flame_item_cache *c, fl_refresh_item *items, size_t n)
{
    job jobs[REFRESH_BATCH];
    int64_t keys[REFRESH_BATCH];
    size_t nj = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t h;
        fl_shard *sh = fl_shard_of(c, items[i].key, &h);
        pthread_mutex_lock(&sh->lock);
        fl_entry *e = fl_shard_find(sh, items[i].key, h);
        /* gone, overwritten (new entries are not pending) or already being fetched: drop */
        if (e && atomic_load(&e->refresh_pending) && !fl_flight_find(sh, items[i].key)) {
            fl_flight *f = fl_flight_start(sh, items[i].key);
            if (f) {
                jobs[nj] = (job){items[i], sh, f};
                keys[nj++] = items[i].key;
            } else {
                atomic_store(&e->refresh_pending, 0);
            }
        }
        pthread_mutex_unlock(&sh->lock);
    }
    if (!nj) return 0;
    flame_feature_batch *got = NULL;
    flame_status st = flame_feature_batch_create(c->num_slots, &got);
    const bool own_thread = c->has_thread && pthread_equal(pthread_self(), c->thread);
    if (!st && begin_fetch(c, got, own_thread)) {
        atomic_fetch_add(&c->fetches, 1);
        st = fl_source_fetch(c->source, keys, nj, got);
    }
    if (stopping(c)) { /* also when begin_fetch refused: stop is never cleared */
        for (size_t k = 0; k < nj; k++) drop_job(c, &jobs[k]);
        nj = 0;
    }
    /* isolate: one id that keeps failing must not hold back the others (unless the last
     * reference went meanwhile: no fetch starts after that) */
    else if (st && got && nj > 1) {
        fl_log(FLAME_LOG_WARN, "item cache: refresh of %zu ids failed (%s); retrying them one by one", nj,
               flame_last_error());
        for (size_t k = 0; k < nj; k++) {
            flame_status one = FLAME_ERR_UNAVAILABLE;
            if (begin_fetch(c, got, own_thread)) {
                atomic_fetch_add(&c->fetches, 1);
                one = fl_source_fetch(c->source, &keys[k], 1, got);
            }
            if (stopping(c)) { /* released meanwhile: the rest are dropped */
                for (size_t r = k; r < nj; r++) drop_job(c, &jobs[r]);
                break;
            }
            finish_job(c, &jobs[k], one, got, 0);
        }
    } else {
        for (size_t k = 0; k < nj; k++) finish_job(c, &jobs[k], st, got, k);
    }
    if (own_thread) end_fetches(c);
    flame_feature_batch_destroy(got);
    return nj;
}

uint64_t fl_refresh_run(struct flame_item_cache *c)
{
    fl_refresh_item items[REFRESH_BATCH];
    uint64_t total = 0;
    uint64_t now = fl_now(c);
    for (;;) {
        pthread_mutex_lock(&c->rq_lock);
        size_t n = c->stop ? 0 : take_due(c, now, items, REFRESH_BATCH);
        pthread_mutex_unlock(&c->rq_lock);
        if (!n) return total;
        total += run_batch(c, items, n);
    }
}

void *fl_refresh_thread(void *arg)
{
    struct flame_item_cache *c = arg;
    pthread_mutex_lock(&c->rq_lock);
    while (!c->stop) {
        uint64_t now = fl_now(c), next = UINT64_MAX;
        for (size_t i = 0; i < c->rq_len; i++)
            if (c->rq[i].due < next) next = c->rq[i].due;
        if (next <= now) {
            pthread_mutex_unlock(&c->rq_lock);
            fl_refresh_run(c);
            pthread_mutex_lock(&c->rq_lock);
            continue;
        }
        /* the cache clock may be a test's: sleep at most 20 ms of real time between looks */
        uint64_t wait_us = next == UINT64_MAX ? 200000 : next - now;
        if (next != UINT64_MAX && wait_us > 20000) wait_us = 20000;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(wait_us * 1000);
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&c->rq_cv, &c->rq_lock, &ts);
    }
    const bool free_it = c->free_on_exit; /* the last reference went on this thread (fl_icache_release) */
    pthread_mutex_unlock(&c->rq_lock);
    if (free_it) fl_icache_free(c);
    return NULL;
}
