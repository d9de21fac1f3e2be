/* Item cache behaviour against a scripted callback source and an injected clock: batching,
 * TTL from popularity, refresh-ahead (manual and threaded), stale-on-error with backoff,
 * single-flight, negative caching, S3-FIFO eviction order, bounds, no lost updates. */
#include <float.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "testutil.h"

#define SEC 1000000ull

/* ---- the scripted source: record of id = slot 0 {id * 100 + version[id]}, slot 1 {id};
 * ids >= 1000 are unknown; ids in fail[] make the whole fetch fail. */
static struct {
    pthread_mutex_t mu;
    int version[1000];
    bool fail[1000];
    int fetched[1000];       /* per id */
    int calls;               /* fetch calls */
    int delay_ms;            /* per call, so concurrent misses overlap */
    pthread_mutex_t gate;    /* held by a test to stall fetches of gate_id */
    int64_t gate_id;
} src = {.mu = PTHREAD_MUTEX_INITIALIZER, .gate = PTHREAD_MUTEX_INITIALIZER, .gate_id = -1};

static _Atomic uint64_t now_us = 1000 * SEC;
static uint64_t test_clock(void *user)
{
    (void)user;
    return atomic_load(&now_us);
}

static flame_status fetch(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)user;
    if (src.delay_ms) usleep((useconds_t)src.delay_ms * 1000);
    for (size_t i = 0; i < n; i++)
        if (ids[i] == src.gate_id) {
            pthread_mutex_lock(&src.gate);
            pthread_mutex_unlock(&src.gate);
        }
    pthread_mutex_lock(&src.mu);
    src.calls++;
    flame_status st = FLAME_OK;
    for (size_t i = 0; i < n && !st; i++) {
        if (ids[i] >= 0 && ids[i] < 1000) {
            src.fetched[ids[i]]++;
            if (src.fail[ids[i]]) st = FLAME_ERR_UNAVAILABLE;
        }
    }
    for (size_t i = 0; i < n && !st; i++) {
        if (ids[i] < 0 || ids[i] >= 1000) {
            flame_feature_batch_set_missing(out, i);
            continue;
        }
        int64_t offs[3] = {0, 1, 2}, v[2] = {ids[i] * 100 + src.version[ids[i]], ids[i]};
        st = flame_feature_batch_set(out, i, offs, v, 2, NULL, 0);
    }
    pthread_mutex_unlock(&src.mu);
    return st;
}

static void reset_source(void)
{
    pthread_mutex_lock(&src.mu);
    memset(src.version, 0, sizeof src.version);
    memset(src.fail, 0, sizeof src.fail);
    memset(src.fetched, 0, sizeof src.fetched);
    src.calls = 0;
    src.delay_ms = 0;
    src.gate_id = -1;
    pthread_mutex_unlock(&src.mu);
    atomic_store(&now_us, 1000 * SEC);
}

static int fetched(int64_t id)
{
    pthread_mutex_lock(&src.mu);
    int n = src.fetched[id];
    pthread_mutex_unlock(&src.mu);
    return n;
}

static void set_version(int64_t id, int v)
{
    pthread_mutex_lock(&src.mu);
    src.version[id] = v;
    pthread_mutex_unlock(&src.mu);
}

static void set_fail(int64_t id, bool f)
{
    pthread_mutex_lock(&src.mu);
    src.fail[id] = f;
    pthread_mutex_unlock(&src.mu);
}

typedef struct fixture {
    flame_feature_source *source;
    flame_item_cache_params p;
    flame_item_cache *cache;
    flame_feature_batch *out;
} fixture;

static int setup(void **state)
{
    reset_source();
    fixture *f = calloc(1, sizeof *f);
    if (flame_feature_source_create_callback(2, fetch, NULL, NULL, &f->source) ||
        flame_feature_batch_create(2, &f->out))
        return -1;
    /* deterministic by default: refreshes run only when a test asks, on the test's clock */
    f->p = (flame_item_cache_params){.struct_size = sizeof f->p, .manual_refresh = 1, .clock_fn = test_clock};
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    flame_item_cache_destroy(f->cache);
    flame_feature_batch_destroy(f->out);
    flame_feature_source_destroy(f->source);
    free(f);
    return 0;
}

static void make_cache(fixture *f)
{
    assert_int_equal(flame_item_cache_create(f->source, &f->p, &f->cache), FLAME_OK);
}

/* The version served for id (slot 0 = id * 100 + version), -1 if missing. */
static int served(fixture *f, int64_t id)
{
    flame_status st = flame_item_cache_get(f->cache, &id, 1, f->out);
    if (st) fail_msg("get(%lld): %s %s", (long long)id, flame_status_string(st), flame_last_error());
    int found;
    const int64_t *ids;
    size_t n;
    assert_int_equal(flame_feature_batch_get_slot(f->out, 0, 0, &found, &ids, &n), FLAME_OK);
    if (!found) return -1;
    assert_int_equal(n, 1);
    assert_int_equal(ids[0] / 100, id);
    return (int)(ids[0] - id * 100);
}

static flame_item_cache_stats stats(fixture *f)
{
    flame_item_cache_stats s = {.struct_size = sizeof s};
    assert_int_equal(flame_item_cache_get_stats(f->cache, &s), FLAME_OK);
    return s;
}

static void test_batch_hits_misses(void **state)
{
    fixture *f = *state;
    make_cache(f);
    int64_t ids[4] = {1, 2, 3, 2};
    assert_int_equal(flame_item_cache_get(f->cache, ids, 4, f->out), FLAME_OK);
    assert_int_equal(src.calls, 1); /* the misses of a call go in one fetch, duplicates once */
    assert_int_equal(fetched(2), 1);
    for (int i = 0; i < 4; i++) {
        int found;
        const int64_t *v;
        size_t n;
        assert_int_equal(flame_feature_batch_get_slot(f->out, (size_t)i, 1, &found, &v, &n), FLAME_OK);
        assert_true(found);
        assert_int_equal(n, 1);
        assert_int_equal(v[0], ids[i]);
    }
    assert_int_equal(flame_item_cache_get(f->cache, ids, 4, f->out), FLAME_OK);
    assert_int_equal(src.calls, 1);
    flame_item_cache_stats s = stats(f);
    assert_int_equal(s.misses, 4);
    assert_int_equal(s.hits, 4);
    assert_int_equal(s.entries, 3);
    assert_int_equal(s.fetches, 1);
    assert_true(s.bytes > 3 * 40);
    /* wrong slot count and NULLs are refused with a message */
    flame_feature_batch *b3;
    assert_int_equal(flame_feature_batch_create(3, &b3), FLAME_OK);
    assert_status_msg(flame_item_cache_get(f->cache, ids, 4, b3), FLAME_ERR_INVALID_ARG, "batch has 3 slots, the cache's records 2");
    flame_feature_batch_destroy(b3);
    assert_status_msg(flame_item_cache_get(f->cache, NULL, 4, f->out), FLAME_ERR_INVALID_ARG, "ids is NULL with n 4");
}

static void test_ttl_from_popularity(void **state)
{
    fixture *f = *state;
    f->p.refresh_percent = 100; /* no refresh-ahead */
    make_cache(f);
    assert_int_equal(served(f, 7), 0);
    atomic_fetch_add(&now_us, 59 * SEC); /* cold TTL is 1 min */
    assert_int_equal(served(f, 7), 0);
    assert_int_equal(fetched(7), 1);
    for (int i = 0; i < 40; i++) served(f, 7); /* hot now: >= 32 hits this lifetime */
    atomic_fetch_add(&now_us, 2 * SEC);
    set_version(7, 1);
    assert_int_equal(served(f, 7), 1); /* expired: fetched again */
    assert_int_equal(fetched(7), 2);
    atomic_fetch_add(&now_us, 29 * 60 * SEC); /* the new TTL is 30 min */
    assert_int_equal(served(f, 7), 1);
    assert_int_equal(fetched(7), 2);
    atomic_fetch_add(&now_us, 61 * SEC);
    served(f, 7);
    assert_int_equal(fetched(7), 3);
}

static uint64_t ttl_fn(int64_t id, uint64_t previous_hits, void *user)
{
    (void)previous_hits, (void)user;
    return id == 5 ? 5 * SEC : 100 * SEC;
}

static void test_custom_ttl_fn(void **state)
{
    fixture *f = *state;
    f->p.refresh_percent = 100; /* no refresh-ahead */
    f->p.ttl_fn = ttl_fn;           /* given at creation */
    make_cache(f);
    served(f, 5), served(f, 6);
    atomic_fetch_add(&now_us, 6 * SEC);
    served(f, 5), served(f, 6);
    assert_int_equal(fetched(5), 2);
    assert_int_equal(fetched(6), 1);
}

static uint64_t huge_ttl_fn(int64_t id, uint64_t previous_hits, void *user)
{
    (void)previous_hits, (void)user;
    return id == 1 ? UINT64_MAX : id == 2 ? 1ull << 62 : UINT64_MAX - 1000 * SEC;
}

/* TTLs past the clock's range (UINT64_MAX = never) saturate: the entries are served from the
 * cache for any time to come, and the refresh point (80% of the TTL) lies in the future too,
 * so hits schedule no refresh. A wrapped expiry sends every get to the source; a wrapped
 * refresh point refreshes on every hit. */
static void test_huge_ttls_saturate(void **state)
{
    fixture *f = *state;
    make_cache(f);
    assert_int_equal(flame_item_cache_set_ttl_fn(f->cache, huge_ttl_fn, NULL), FLAME_OK);
    atomic_store(&now_us, 3ull << 62); /* a late clock: now + 2^62 ... UINT64_MAX all overflow */
    for (int64_t id = 1; id <= 3; id++) assert_int_equal(served(f, id), 0);
    for (int round = 0; round < 5; round++) {
        atomic_fetch_add(&now_us, 1000000 * SEC);
        for (int64_t id = 1; id <= 3; id++) assert_int_equal(served(f, id), 0);
    }
    uint64_t n = 99;
    assert_int_equal(flame_item_cache_run_refresh(f->cache, &n), FLAME_OK);
    assert_int_equal(n, 0);
    for (int64_t id = 1; id <= 3; id++) assert_int_equal(fetched(id), 1);
    flame_item_cache_stats s = stats(f);
    assert_int_equal(s.misses, 3);
    assert_int_equal(s.hits, 15);
    assert_int_equal(s.refreshes, 0);
}

static void test_refresh_ahead_manual(void **state)
{
    fixture *f = *state;
    f->p.refresh_percent = 50;
    make_cache(f);
    assert_int_equal(served(f, 9), 0);
    atomic_fetch_add(&now_us, 31 * SEC); /* past 50% of the 60 s TTL */
    served(f, 9);                      /* 1 hit: not popular yet */
    uint64_t n = 99;
    assert_int_equal(flame_item_cache_run_refresh(f->cache, &n), FLAME_OK);
    assert_int_equal(n, 0);
    set_version(9, 1);
    assert_int_equal(served(f, 9), 0); /* 2nd hit queues the refresh; the old value is served */
    assert_int_equal(flame_item_cache_run_refresh(f->cache, &n), FLAME_OK);
    assert_int_equal(n, 1);
    assert_int_equal(served(f, 9), 1);
    flame_item_cache_stats s = stats(f);
    assert_int_equal(s.refreshes, 1);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.refresh_failures, 0);
}

static void test_refresh_thread(void **state)
{
    fixture *f = *state;
    f->p.manual_refresh = 0;
    make_cache(f);
    served(f, 11);
    atomic_fetch_add(&now_us, 50 * SEC); /* past the default 80% of 60 s */
    set_version(11, 3);
    served(f, 11), served(f, 11);
    for (int i = 0; i < 500 && stats(f).refreshes == 0; i++) usleep(10000);
    assert_int_equal(stats(f).refreshes, 1);
    assert_int_equal(served(f, 11), 3);
    assert_int_equal(fetched(11), 2);
}

/* The last reference can go on the refresh thread itself, inside the source's callback (as a
 * garbage-collecting host language may drop it there): the thread cannot join itself, so it
 * frees the cache once out of its refresh. ASan/TSan (make test-sanitize) watch that. */
/* A cache with its own refresh thread over a callback source it holds the only reference to
 * (f->p as the test set it). */
static flame_item_cache *threaded_cache(fixture *f, flame_feature_fetch_fn fetch_fn,
                                        flame_feature_fetch_async_fn fetch_async)
{
    flame_feature_source *source;
    assert_int_equal(flame_feature_source_create_callback(2, fetch_fn, fetch_async, NULL, &source), FLAME_OK);
    f->p.manual_refresh = 0;
    flame_item_cache *c;
    assert_int_equal(flame_item_cache_create(source, &f->p, &c), FLAME_OK);
    flame_feature_source_destroy(source); /* the cache holds it */
    return c;
}

static struct {
    pthread_t main;
    flame_item_cache *to_release;
    atomic_int main_done, released;
} rel;
static flame_status release_fetch(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    flame_status st = fetch(user, ids, n, out);
    if (!pthread_equal(pthread_self(), rel.main) && rel.to_release && !atomic_load(&rel.released)) {
        while (!atomic_load(&rel.main_done)) usleep(100); /* the test thread is done with the cache */
        flame_item_cache_destroy(rel.to_release);          /* the last reference */
        atomic_store(&rel.released, 1);
    }
    return st;
}
static void test_last_reference_dropped_on_the_refresh_thread(void **state)
{
    fixture *f = *state;
    flame_item_cache *c = threaded_cache(f, release_fetch, NULL);
    assert_int_equal(flame_item_cache_set_clock(c, test_clock, NULL), FLAME_OK);
    rel.main = pthread_self();
    rel.to_release = c;
    int64_t id = 77;
    assert_int_equal(flame_item_cache_get(c, &id, 1, f->out), FLAME_OK); /* a miss, fetched on this thread */
    atomic_fetch_add(&now_us, 50 * SEC);
    assert_int_equal(flame_item_cache_get(c, &id, 1, f->out), FLAME_OK);
    assert_int_equal(flame_item_cache_get(c, &id, 1, f->out), FLAME_OK); /* popular and old: a refresh is due */
    atomic_store(&rel.main_done, 1); /* c is the refresh thread's from here on */
    for (int i = 0; i < 500 && !atomic_load(&rel.released); i++) usleep(10000);
    assert_int_equal(atomic_load(&rel.released), 1);
    usleep(50000); /* the thread frees the cache on its way out */
}

/* The last reference can also go on the thread that completes an asynchronous fetch of the
 * refresh thread, before it completes it (a host's completion thread dropping its handle): the
 * refresh thread is waiting for that very completion, so it cannot be joined; it frees the
 * cache once the fetch completes. (Joined, the two threads waited for each other for ever.) */
static struct {
    flame_item_cache *to_release;
    atomic_int armed, main_done, completed;
} arel;
typedef struct arel_job {
    int64_t ids[8];
    size_t n;
    flame_feature_batch *out;
} arel_job;
static void *arel_complete(void *p)
{
    arel_job *j = p;
    if (atomic_exchange(&arel.armed, 0)) { /* the refresh's fetch (the first miss is not armed) */
        while (!atomic_load(&arel.main_done)) usleep(100);
        flame_item_cache_destroy(arel.to_release); /* the last reference, the fetch still open */
    }
    flame_feature_batch_complete(j->out, fetch(NULL, j->ids, j->n, j->out));
    atomic_fetch_add(&arel.completed, 1);
    free(j);
    return NULL;
}
static void arel_fetch_async(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)user;
    arel_job *j = malloc(sizeof *j);
    assert_non_null(j);
    assert_true(n <= 8);
    memcpy(j->ids, ids, n * sizeof *ids);
    j->n = n;
    j->out = out;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, arel_complete, j), 0);
    pthread_detach(t);
}
static void test_last_reference_dropped_by_the_async_completer(void **state)
{
    fixture *f = *state;
    flame_item_cache *c = threaded_cache(f, NULL, arel_fetch_async);
    arel.to_release = c;
    int64_t id = 78;
    assert_int_equal(flame_item_cache_get(c, &id, 1, f->out), FLAME_OK); /* a miss, completed at once */
    for (int i = 0; i < 500 && atomic_load(&arel.completed) < 1; i++) usleep(1000); /* its thread counts it */
    assert_int_equal(atomic_load(&arel.completed), 1);
    atomic_store(&arel.armed, 1);
    atomic_fetch_add(&now_us, 50 * SEC);
    assert_int_equal(flame_item_cache_get(c, &id, 1, f->out), FLAME_OK);
    assert_int_equal(flame_item_cache_get(c, &id, 1, f->out), FLAME_OK); /* a refresh is due */
    atomic_store(&arel.main_done, 1);                                      /* c is the threads' now */
    for (int i = 0; i < 500 && atomic_load(&arel.completed) < 2; i++) usleep(10000);
    assert_int_equal(atomic_load(&arel.completed), 2);
    usleep(50000); /* the refresh thread frees the cache on its way out */
}

/* An asynchronous refresh the host completes only after destroy returned (destroy does not
 * wait for it): the cache is freed on the refresh thread, and none of the host's hooks (here
 * the clock) is called after destroy returned, since the host may free what they use. */
static struct {
    _Atomic int hold;               /* 1: the next fetch is held for the test to complete */
    _Atomic(flame_feature_batch *) out;
    int64_t ids[8];
    size_t n;
    _Atomic long clock_calls;
} held;

static uint64_t counting_clock(void *user)
{
    (void)user;
    atomic_fetch_add(&held.clock_calls, 1);
    return atomic_load(&now_us);
}

static void held_fetch_async(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    if (!atomic_load(&held.hold)) {
        flame_feature_batch_complete(out, fetch(user, ids, n, out));
        return;
    }
    assert_true(n <= 8);
    memcpy(held.ids, ids, n * sizeof *ids);
    held.n = n;
    atomic_store(&held.out, out);
}

static void test_destroy_during_async_refresh_calls_no_hook_after(void **state)
{
    fixture *f = *state;
    f->p.clock_fn = counting_clock;
    flame_item_cache *c = threaded_cache(f, NULL, held_fetch_async);
    int64_t id = 5;
    assert_int_equal(flame_item_cache_get(c, &id, 1, f->out), FLAME_OK); /* a miss, completed at once */
    atomic_store(&held.hold, 1);
    atomic_fetch_add(&now_us, 50 * SEC);
    assert_int_equal(flame_item_cache_get(c, &id, 1, f->out), FLAME_OK);
    assert_int_equal(flame_item_cache_get(c, &id, 1, f->out), FLAME_OK); /* a refresh is due */
    for (int i = 0; i < 500 && !atomic_load(&held.out); i++) usleep(10000);
    flame_feature_batch *out = atomic_load(&held.out);
    assert_non_null(out); /* the refresh thread waits for this completion */
    flame_item_cache_destroy(c); /* returns at once: the refresh thread awaits the host */
    const long calls = atomic_load(&held.clock_calls);
    flame_feature_batch_complete(out, fetch(NULL, held.ids, held.n, out));
    usleep(100000); /* the refresh thread ends its jobs and frees the cache */
    assert_int_equal(atomic_load(&held.clock_calls), calls);
}

static void test_stale_on_error_with_backoff(void **state)
{
    fixture *f = *state;
    f->p.refresh_percent = 50;
    f->p.retry_min_us = 100000;
    f->p.retry_max_us = 400000;
    make_cache(f);
    served(f, 20), served(f, 21);
    atomic_fetch_add(&now_us, 40 * SEC);
    set_fail(20, true);
    set_version(20, 1), set_version(21, 1);
    served(f, 20), served(f, 20), served(f, 21), served(f, 21); /* both queued */
    uint64_t n;
    flame_item_cache_run_refresh(f->cache, &n);
    /* 20's failure does not hold back 21 */
    assert_int_equal(served(f, 21), 1);
    flame_item_cache_stats s = stats(f);
    assert_int_equal(s.refreshes, 1);
    assert_int_equal(s.refresh_failures, 1);
    /* retries back off: 100 ms, then 200 ms, then 400 ms (the max), then 400 ms */
    uint64_t delays[] = {100000, 200000, 400000, 400000};
    int before = fetched(20);
    for (int i = 0; i < 4; i++) {
        atomic_fetch_add(&now_us, delays[i] - 1);
        flame_item_cache_run_refresh(f->cache, &n);
        assert_int_equal(n, 0);
        atomic_fetch_add(&now_us, 1);
        flame_item_cache_run_refresh(f->cache, &n);
        assert_int_equal(n, 1);
        assert_int_equal(fetched(20), before + i + 1);
    }
    atomic_fetch_add(&now_us, 30 * SEC); /* 20 has expired: served stale, not an error */
    assert_int_equal(served(f, 20), 0);
    assert_int_equal(stats(f).stale_serves, 1);
    assert_int_equal(stats(f).refresh_failures, 5);
    set_fail(20, false);
    atomic_fetch_add(&now_us, 400000);
    flame_item_cache_run_refresh(f->cache, &n);
    assert_int_equal(n, 1);
    assert_int_equal(served(f, 20), 1);
    assert_int_equal(stats(f).refreshes, 2);
}

typedef struct sf_arg {
    fixture *f;
    int64_t key;
    pthread_barrier_t *bar;
    int64_t got;
    flame_status st;
} sf_arg;

static void *sf_thread(void *p)
{
    sf_arg *a = p;
    flame_feature_batch *b;
    flame_feature_batch_create(2, &b);
    pthread_barrier_wait(a->bar);
    a->st = flame_item_cache_get(a->f->cache, &a->key, 1, b);
    int found;
    const int64_t *ids;
    size_t n;
    a->got = -1;
    if (!a->st && !flame_feature_batch_get_slot(b, 0, 1, &found, &ids, &n) && found && n == 1) a->got = ids[0];
    flame_feature_batch_destroy(b);
    return NULL;
}

static void test_single_flight(void **state)
{
    fixture *f = *state;
    make_cache(f);
    src.delay_ms = 100; /* the fetches overlap every thread's lookup */
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 9);
    pthread_t th[9];
    sf_arg a[9];
    for (int i = 0; i < 9; i++) {
        a[i] = (sf_arg){.f = f, .key = 1 + i % 3, .bar = &bar};
        pthread_create(&th[i], NULL, sf_thread, &a[i]);
    }
    for (int i = 0; i < 9; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    for (int i = 0; i < 9; i++) {
        assert_int_equal(a[i].st, FLAME_OK);
        assert_int_equal(a[i].got, a[i].key);
    }
    assert_int_equal(fetched(1), 1);
    assert_int_equal(fetched(2), 1);
    assert_int_equal(fetched(3), 1);
    assert_int_equal(src.calls, 3);
    assert_int_equal(stats(f).misses, 9);
}

static void test_negative_caching(void **state)
{
    fixture *f = *state;
    f->p.negative_ttl_us = 2 * SEC;
    make_cache(f);
    int64_t ids[2] = {5000, 3};
    assert_int_equal(flame_item_cache_get(f->cache, ids, 2, f->out), FLAME_OK);
    int found = 1;
    const int64_t *v = (const int64_t *)1;
    size_t n = 9;
    assert_int_equal(flame_feature_batch_get_slot(f->out, 0, 0, &found, &v, &n), FLAME_OK);
    assert_int_equal(found, 0);
    assert_null(v);
    assert_int_equal(n, 0);
    assert_int_equal(src.calls, 1);
    atomic_fetch_add(&now_us, 1 * SEC);
    assert_int_equal(served(f, 5000), -1);
    assert_int_equal(src.calls, 1); /* cached as missing */
    atomic_fetch_add(&now_us, 1 * SEC + 1);
    assert_int_equal(served(f, 5000), -1);
    assert_int_equal(src.calls, 2); /* its own, shorter TTL ran out; 3 lives on */
    assert_int_equal(served(f, 3), 0);
    assert_int_equal(src.calls, 2);
}

static void test_s3fifo_eviction_order(void **state)
{
    fixture *f = *state;
    f->p.shards = 1;
    f->p.max_entries = 10; /* small queue: 1 entry */
    make_cache(f);
    for (int64_t k = 1; k <= 11; k++) served(f, k); /* 11 evicts the oldest, 1 (FIFO) */
    served(f, 2), served(f, 2);                     /* 2 is hit twice... */
    served(f, 12);                                  /* ...so it moves to main and 3 goes */
    flame_item_cache_stats s = stats(f);
    assert_int_equal(s.evictions, 2);
    assert_int_equal(s.entries, 10);
    served(f, 1); /* 1 is in the ghost: back straight into main; 4 (small's head) goes */
    assert_int_equal(fetched(1), 2);
    for (int64_t k = 100; k < 120; k++) served(f, k); /* a scan of one-hit wonders */
    assert_int_equal(stats(f).evictions, 23);
    int c1 = fetched(1), c2 = fetched(2);
    served(f, 1), served(f, 2); /* survived the scan in main (LRU would have lost both) */
    assert_int_equal(fetched(1), c1);
    assert_int_equal(fetched(2), c2);
    int c4 = fetched(4), c5 = fetched(5);
    served(f, 4), served(f, 5);
    assert_int_equal(fetched(4), c4 + 1);
    assert_int_equal(fetched(5), c5 + 1);
}

/* The entry bound holds when the only main entry is the one being installed and small holds
 * hot entries: those are promoted, then evicted from main (the bound
 * used to be exceeded by one entry per shard). */
static void test_bound_with_hot_small_and_ghost_return(void **state)
{
    fixture *f = *state;
    f->p.shards = 1;
    f->p.max_entries = 1;
    make_cache(f);
    served(f, 1), served(f, 2), served(f, 2), served(f, 2), served(f, 1); /* 1 returns from the ghost */
    assert_int_equal(stats(f).entries, 1);
    for (int64_t k = 0; k < 300; k++) { /* hot and cold keys mixed: never over the bound */
        served(f, k % 7 == 0 ? 3 : k);
        if (k % 2) served(f, k);
        assert_true(stats(f).entries <= 1);
    }
}

static void test_byte_bound(void **state)
{
    fixture *f = *state;
    f->p.shards = 1;
    f->p.max_bytes = 4096;
    make_cache(f);
    for (int64_t k = 0; k < 200; k++) served(f, k);
    flame_item_cache_stats s = stats(f);
    assert_true(s.bytes <= 4096);
    assert_true(s.bytes > 2048);
    assert_int_equal(s.evictions, 200 - s.entries);
}

typedef struct getter {
    fixture *f;
    int64_t key;
    int version;
} getter;

static void *get_thread(void *p)
{
    getter *g = p;
    flame_feature_batch *b;
    flame_feature_batch_create(2, &b);
    int64_t k = g->key;
    int found;
    const int64_t *ids;
    size_t n;
    g->version = -2;
    if (!flame_item_cache_get(g->f->cache, &k, 1, b) && !flame_feature_batch_get_slot(b, 0, 0, &found, &ids, &n) && found)
        g->version = (int)(ids[0] - k * 100);
    flame_feature_batch_destroy(b);
    return NULL;
}

static void test_put_beats_inflight_fetch(void **state)
{
    fixture *f = *state;
    make_cache(f);
    for (int variant = 0; variant < 2; variant++) {
        int64_t key = 42 + variant;
        pthread_mutex_lock(&src.gate);
        src.gate_id = key;
        getter g = {f, key, 0};
        pthread_t th;
        pthread_create(&th, NULL, get_thread, &g);
        while (fetched(key) == 0 && src.calls < 1000) {
            /* wait until the fetch is underway (it counts the id after the gate) */
            pthread_mutex_lock(&src.mu);
            int inflight = src.gate_id == key;
            pthread_mutex_unlock(&src.mu);
            if (inflight) break;
        }
        usleep(20000);
        if (variant == 0) {
            int64_t offs[3] = {0, 1, 2}, v[2] = {key * 100 + 7, key};
            assert_int_equal(flame_item_cache_put(f->cache, key, offs, v, 2, NULL, 0), FLAME_OK);
        } else {
            set_version(key, 5);
            assert_int_equal(flame_item_cache_invalidate(f->cache, key), FLAME_OK);
        }
        pthread_mutex_unlock(&src.gate);
        pthread_join(th, NULL);
        assert_true(g.version == 0 || g.version == (variant ? 5 : 7));
        /* the stale fetch result was not installed over the newer write */
        assert_int_equal(served(f, key), variant ? 5 : 7);
    }
}

/* A record's ids are exactly ids[0..num_ids): slot offsets ending past the array (read past
 * its end when encoded) or short of it (ids dropped) are refused, naming the record, the slot
 * and both numbers, and nothing is written: the batch's record and the cache's value stay. */
static void test_record_ids_must_match_final_offset(void **state)
{
    fixture *f = *state;
    make_cache(f);
    const int64_t key = 5;
    assert_int_equal(served(f, key), 0); /* f->out now holds key's record, version 0 */
    int64_t offs[3] = {0, 1, 3};
    int64_t *ids = malloc(2 * sizeof *ids); /* 2 ids, on the heap so a read past them is caught */
    ids[0] = key * 100 + 9, ids[1] = key;
    assert_status_msg(flame_feature_batch_set(f->out, 0, offs, ids, 2, NULL, 0), FLAME_ERR_INVALID_ARG,
                      "record 0: slot_offsets[2] (the end of slot 1's bag) = 3, but num_ids = 2");
    int found;
    const int64_t *got;
    size_t n;
    assert_int_equal(flame_feature_batch_get_slot(f->out, 0, 0, &found, &got, &n), FLAME_OK);
    assert_true(found);
    assert_int_equal(n, 1);
    assert_int_equal(got[0], key * 100); /* the record as it was */
    assert_status_msg(flame_item_cache_put(f->cache, key, offs, ids, 2, NULL, 0), FLAME_ERR_INVALID_ARG,
                      "slot_offsets[2] (the end of slot 1's bag) = 3, but num_ids = 2");
    offs[2] = 1; /* the offsets address 1 id of the 2 given */
    assert_status_msg(flame_feature_batch_set(f->out, 0, offs, ids, 2, NULL, 0), FLAME_ERR_INVALID_ARG,
                      "slot_offsets[2] (the end of slot 1's bag) = 1, but num_ids = 2");
    assert_status_msg(flame_item_cache_put(f->cache, key, offs, ids, 2, NULL, 0), FLAME_ERR_INVALID_ARG,
                      "= 1, but num_ids = 2");
    assert_status_msg(flame_item_cache_put(f->cache, key, offs, NULL, 1, NULL, 0), FLAME_ERR_INVALID_ARG,
                      "ids is NULL with num_ids 1");
    assert_int_equal(served(f, key), 0); /* the cache kept its value */
    assert_int_equal(src.calls, 1);
    offs[2] = 2;
    assert_int_equal(flame_item_cache_put(f->cache, key, offs, ids, 2, NULL, 0), FLAME_OK);
    assert_int_equal(served(f, key), 9);
    /* records without slots have no ids */
    flame_feature_source *s0;
    flame_item_cache *c0;
    assert_int_equal(flame_feature_source_create_callback(0, fetch, NULL, NULL, &s0), FLAME_OK);
    assert_int_equal(flame_item_cache_create(s0, &f->p, &c0), FLAME_OK);
    assert_status_msg(flame_item_cache_put(c0, key, NULL, ids, 1, NULL, 0), FLAME_ERR_INVALID_ARG,
                      "record 0: num_ids = 1, but the records have no slots");
    assert_int_equal(flame_item_cache_put(c0, key, NULL, NULL, 0, NULL, 0), FLAME_OK);
    flame_item_cache_destroy(c0);
    flame_feature_source_destroy(s0);
    free(ids);
}

/* A put refuses what the feature file refuses (a dense value that is NaN or infinite, a
 * negative id in a bag, a negative item id) with FLAME_ERR_INVALID_ARG naming the slot or
 * index and the value, and the cache is unchanged: the old value is served, a new id gets no
 * entry. */
static void test_put_refuses_hostile_values(void **state)
{
    fixture *f = *state;
    make_cache(f);
    const int64_t key = 5, fresh = 9;
    assert_int_equal(served(f, key), 0);
    const uint64_t entries = stats(f).entries;
    const int64_t offs[3] = {0, 1, 2};
    static const struct {
        float dense1;
        int64_t id1;
        const char *want;
    } bad[] = {{NAN, 5, "record 0: dense[1] = nan is not a finite float"},
               {INFINITY, 5, "record 0: dense[1] = inf is not a finite float"},
               {-INFINITY, 5, "record 0: dense[1] = -inf is not a finite float"},
               {0.25f, -3, "record 0: slot 1: id -3 (ids[1]) is negative"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const int64_t ids[2] = {key * 100 + 7, bad[i].id1};
        const float dense[2] = {0.5f, bad[i].dense1};
        assert_status_msg(flame_item_cache_put(f->cache, key, offs, ids, 2, dense, 2), FLAME_ERR_INVALID_ARG, bad[i].want);
        assert_status_msg(flame_item_cache_put(f->cache, fresh, offs, ids, 2, dense, 2), FLAME_ERR_INVALID_ARG, bad[i].want);
    }
    const int64_t ids[2] = {1, 2}; /* a good record under a negative id */
    assert_status_msg(flame_item_cache_put(f->cache, -1, offs, ids, 2, NULL, 0), FLAME_ERR_INVALID_ARG,
                      "flame_item_cache_put: item id -1 is negative");
    assert_status_msg(flame_item_cache_put(f->cache, INT64_MIN, offs, ids, 2, NULL, 0),
                      FLAME_ERR_INVALID_ARG, "item id -9223372036854775808 is negative");
    assert_int_equal(stats(f).entries, entries); /* nothing written */
    assert_int_equal(served(f, key), 0);
    assert_int_equal(src.calls, 1);
    assert_int_equal(served(f, fresh), 0); /* fetched: the refused puts left no entry */
    assert_int_equal(src.calls, 2);
    assert_int_equal(served(f, -1), -1); /* the source's answer: missing */
    /* finite values at the edges are values */
    const float edge[3] = {-0.0f, FLT_MAX, 1e-40f};
    assert_int_equal(flame_item_cache_put(f->cache, key, offs, (int64_t[]){key * 100 + 8, 0}, 2, edge, 3), FLAME_OK);
    assert_int_equal(served(f, key), 8);
}

static void test_arguments_and_options(void **state)
{
    fixture *f = *state;
    flame_item_cache *c = (flame_item_cache *)1;
    assert_status_msg(flame_item_cache_create(NULL, NULL, &c), FLAME_ERR_INVALID_ARG, "NULL source");
    assert_null(c);
    /* each field's bounds, named */
    const struct {
        flame_item_cache_params p;
        const char *msg;
    } bad[] = {
        {{.struct_size = sizeof(flame_item_cache_params), .refresh_percent = 101},
         "refresh_percent = 101 is out of range [1, 100]"},
        {{.struct_size = sizeof(flame_item_cache_params), .shards = 4097}, "shards = 4097 is out of range [1, 4096]"},
        {{.struct_size = sizeof(flame_item_cache_params), .max_bytes = 4095},
         "max_bytes = 4095 is out of range [4096, 281474976710656]"},
        {{.struct_size = sizeof(flame_item_cache_params), .max_entries = (1ull << 32) + 1}, "max_entries = 4294967297"},
        {{.struct_size = sizeof(flame_item_cache_params), .negative_ttl_us = 31536000000001ull}, "negative_ttl_us"},
        {{.struct_size = sizeof(flame_item_cache_params), .manual_refresh = 2}, "manual_refresh = 2, expected 0 or 1"},
        {{.struct_size = sizeof(flame_item_cache_params), .cold_ttl_us = 10 * SEC, .hot_ttl_us = 5 * SEC},
         "hot_ttl_us = 5000000 is below cold_ttl_us = 10000000"},
        {{.struct_size = sizeof(flame_item_cache_params), .retry_min_us = 2 * SEC, .retry_max_us = SEC},
         "retry_max_us = 1000000 is below retry_min_us = 2000000"},
        /* a cold TTL above the default hot one (30 min) needs a hot one given */
        {{.struct_size = sizeof(flame_item_cache_params), .cold_ttl_us = 3600 * SEC}, "is below cold_ttl_us"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c = (flame_item_cache *)1;
        assert_status_msg(flame_item_cache_create(f->source, &bad[i].p, &c), FLAME_ERR_INVALID_ARG, bad[i].msg);
        assert_null(c);
    }
    flame_item_cache_destroy(NULL);
    flame_item_cache_stats s = {.struct_size = 4};
    f->p.cold_ttl_us = 10 * SEC, f->p.hot_ttl_us = 50 * SEC;
    make_cache(f);
    assert_status_msg(flame_item_cache_get_stats(f->cache, &s), FLAME_ERR_INVALID_ARG, "struct_size = 4");
}

static flame_status one_id_fetch(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)user;
    for (size_t i = 0; i < n; i++) {
        const int64_t off[2] = {0, 1};
        flame_status st = flame_feature_batch_set(out, i, off, &ids[i], 1, NULL, 0);
        if (st) return st;
    }
    return FLAME_OK;
}

/* Bounds smaller than the default 64 shards: the cache holds no more than max_entries entries
 * and max_bytes bytes (each shard used to keep one entry above a share rounded up or below one
 * record: 64 entries with max_entries 1). */
static void test_small_bounds_hold(void **state)
{
    (void)state;
    flame_feature_source *src;
    assert_int_equal(flame_feature_source_create_callback(1, one_id_fetch, NULL, NULL, &src), FLAME_OK);
    const uint64_t entries[] = {1, 7, 100, 1000000}, bytes[] = {4096, 4096, 1ull << 20, 8192};
    int64_t ids[1000];
    for (int i = 0; i < 1000; i++) ids[i] = i;
    for (int k = 0; k < 4; k++) {
        flame_item_cache_params p = {.struct_size = sizeof p, .manual_refresh = 1, .max_entries = entries[k],
                                     .max_bytes = bytes[k]};
        flame_item_cache *c;
        assert_int_equal(flame_item_cache_create(src, &p, &c), FLAME_OK);
        flame_feature_batch *b;
        assert_int_equal(flame_feature_batch_create(1, &b), FLAME_OK);
        assert_int_equal(flame_item_cache_get(c, ids, 1000, b), FLAME_OK);
        flame_item_cache_stats t = {.struct_size = sizeof t};
        assert_int_equal(flame_item_cache_get_stats(c, &t), FLAME_OK);
        if (t.entries > entries[k] || t.bytes > bytes[k])
            fail_msg("max_entries %llu max_bytes %llu: holds %llu entries, %llu bytes", (unsigned long long)entries[k],
                     (unsigned long long)bytes[k], (unsigned long long)t.entries, (unsigned long long)t.bytes);
        assert_true(t.entries >= 1);
        flame_feature_batch_destroy(b);
        flame_item_cache_destroy(c);
    }
    flame_feature_source_destroy(src);
}

static flame_status fails_on_7777(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == 7777) return FLAME_ERR_FORMAT;
    return one_id_fetch(user, ids, n, out);
}

/* A fetch of several misses that fails is made again id by id: the id that fails alone is the
 * call's error (named), the others are served and cached. */
static void test_failed_fetch_isolates_the_bad_id(void **state)
{
    (void)state;
    flame_feature_source *src;
    assert_int_equal(flame_feature_source_create_callback(1, fails_on_7777, NULL, NULL, &src), FLAME_OK);
    flame_item_cache_params p = {.struct_size = sizeof p, .manual_refresh = 1};
    flame_item_cache *c;
    assert_int_equal(flame_item_cache_create(src, &p, &c), FLAME_OK);
    flame_feature_batch *b;
    assert_int_equal(flame_feature_batch_create(1, &b), FLAME_OK);
    const int64_t ids[3] = {1, 7777, 2};
    assert_int_equal(flame_item_cache_get(c, ids, 3, b), FLAME_ERR_FORMAT);
    assert_non_null(strstr(flame_last_error(), "7777"));
    flame_item_cache_stats t = {.struct_size = sizeof t};
    assert_int_equal(flame_item_cache_get_stats(c, &t), FLAME_OK);
    assert_int_equal(t.entries, 2);
    const int64_t good[2] = {2, 1};
    assert_int_equal(flame_item_cache_get(c, good, 2, b), FLAME_OK);
    flame_item_cache_stats u = {.struct_size = sizeof u};
    assert_int_equal(flame_item_cache_get_stats(c, &u), FLAME_OK);
    assert_int_equal(u.hits - t.hits, 2);
    for (size_t i = 0; i < 2; i++) {
        int32_t found;
        const int64_t *v;
        size_t k;
        assert_int_equal(flame_feature_batch_get_slot(b, i, 0, &found, &v, &k), FLAME_OK);
        assert_true(found && k == 1 && v[0] == good[i]);
    }
    flame_feature_batch_destroy(b);
    flame_item_cache_destroy(c);
    flame_feature_source_destroy(src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_bounds_hold),
        cmocka_unit_test(test_failed_fetch_isolates_the_bad_id),
        cmocka_unit_test_setup_teardown(test_batch_hits_misses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ttl_from_popularity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_custom_ttl_fn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_huge_ttls_saturate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refresh_ahead_manual, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refresh_thread, setup, teardown),
        cmocka_unit_test_setup_teardown(test_last_reference_dropped_on_the_refresh_thread, setup, teardown),
        cmocka_unit_test_setup_teardown(test_last_reference_dropped_by_the_async_completer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_destroy_during_async_refresh_calls_no_hook_after, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stale_on_error_with_backoff, setup, teardown),
        cmocka_unit_test_setup_teardown(test_single_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_negative_caching, setup, teardown),
        cmocka_unit_test_setup_teardown(test_s3fifo_eviction_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bound_with_hot_small_and_ghost_return, setup, teardown),
        cmocka_unit_test_setup_teardown(test_byte_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_beats_inflight_fetch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_ids_must_match_final_offset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_put_refuses_hostile_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_arguments_and_options, setup, teardown),
    };
    return cmocka_run_group_tests_name("item_cache", tests, NULL, NULL);
}
