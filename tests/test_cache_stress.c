/* Many threads mixing reads, writes, invalidations, expiries (a clock that jumps), background
 * refreshes and failing fetches on a few hot keys of a small cache, checked against a
 * sequential model of each key: a read never returns a version older than the newest write
 * completed before it began, nor one never written. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "testutil.h"

#define KEYS 48
#define THREADS 8

static _Atomic int64_t store[KEYS];     /* the backing store: the version of each key */
static _Atomic int64_t done_ver[KEYS];  /* newest write completed */
static _Atomic int64_t started[KEYS];   /* newest write started */
static pthread_mutex_t key_lock[KEYS];  /* writes of one key are sequential, as in the model */
static _Atomic uint64_t now_us = 1;
static atomic_int fail_rate;            /* percent of fetches that fail */
static atomic_int violations, reads_checked;

static uint64_t clock_fn(void *u)
{
    (void)u;
    return atomic_load(&now_us);
}

static flame_status fetch(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)user;
    static _Atomic uint64_t rng = 1;
    if ((int)(atomic_fetch_add(&rng, 0x9e3779b97f4a7c15ull) >> 57) % 100 < atomic_load(&fail_rate))
        return FLAME_ERR_UNAVAILABLE;
    for (size_t i = 0; i < n; i++) {
        int64_t offs[2] = {0, 2}, v[2] = {ids[i], atomic_load(&store[ids[i]])};
        flame_feature_batch_set(out, i, offs, v, 2, NULL, 0);
    }
    return FLAME_OK;
}

typedef struct worker {
    flame_item_cache *cache;
    uint64_t seed;
    int ops;
} worker;

static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    return z ^ (z >> 27);
}

static void *run(void *p)
{
    worker *w = p;
    flame_feature_batch *b;
    flame_feature_batch_create(1, &b);
    for (int op = 0; op < w->ops; op++) {
        uint64_t r = next(&w->seed);
        int64_t key = (int64_t)(r % KEYS);
        int kind = (int)((r >> 32) % 100);
        if (kind < 10) { /* write: store first, then the cache (write-through) */
            pthread_mutex_lock(&key_lock[key]);
            int64_t v = atomic_load(&started[key]) + 1;
            atomic_store(&started[key], v);
            atomic_store(&store[key], v);
            int64_t offs[2] = {0, 2}, ids[2] = {key, v};
            if (kind < 7)
                flame_item_cache_put(w->cache, key, offs, ids, 2, NULL, 0);
            else
                flame_item_cache_invalidate(w->cache, key);
            atomic_store(&done_ver[key], v);
            pthread_mutex_unlock(&key_lock[key]);
        } else if (kind < 13) { /* time passes: entries expire, refreshes fall due */
            atomic_fetch_add(&now_us, 1 + (r >> 40) % 400000);
        } else { /* read a few keys at once */
            int64_t keys[4];
            int64_t floor[4];
            int nk = 1 + (int)((r >> 20) % 4);
            for (int i = 0; i < nk; i++) {
                keys[i] = (key + i * 7) % KEYS;
                floor[i] = atomic_load(&done_ver[keys[i]]);
            }
            if (flame_item_cache_get(w->cache, keys, (size_t)nk, b) != FLAME_OK) continue; /* a failed fetch */
            for (int i = 0; i < nk; i++) {
                int found;
                const int64_t *v;
                size_t n;
                if (flame_feature_batch_get_slot(b, (size_t)i, 0, &found, &v, &n) || !found || n != 2 ||
                    v[0] != keys[i] || v[1] < floor[i] || v[1] > atomic_load(&started[keys[i]])) {
                    if (atomic_fetch_add(&violations, 1) < 5)
                        fprintf(stderr, "key %lld: got version %lld, newest completed write %lld\n",
                                (long long)keys[i], found && n == 2 ? (long long)v[1] : -1LL, (long long)floor[i]);
                }
                atomic_fetch_add(&reads_checked, 1);
            }
        }
    }
    flame_feature_batch_destroy(b);
    return NULL;
}

static void test_stress_against_model(void **state)
{
    (void)state;
    tu_seed();
    for (int k = 0; k < KEYS; k++) pthread_mutex_init(&key_lock[k], NULL);
    flame_feature_source *s;
    flame_item_cache_params p = {.struct_size = sizeof p};
    flame_item_cache *c;
    assert_int_equal(flame_feature_source_create_callback(1, fetch, NULL, NULL, &s), FLAME_OK);
    p.shards = 4;
    p.max_entries = 24; /* evictions too */
    p.cold_ttl_us = 300000;
    p.hot_ttl_us = 3000000;
    p.hot_hits = 8;
    p.refresh_percent = 30;
    p.retry_min_us = 1000;
    assert_int_equal(flame_item_cache_create(s, &p, &c), FLAME_OK);
    flame_item_cache_set_clock(c, clock_fn, NULL);
    atomic_store(&fail_rate, 10);
    pthread_t th[THREADS];
    worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){c, tu_u64(), getenv("FLAME_STRESS_OPS") ? atoi(getenv("FLAME_STRESS_OPS")) : 40000};
        pthread_create(&th[i], NULL, run, &w[i]);
    }
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    flame_item_cache_stats st = {.struct_size = sizeof st};
    flame_item_cache_get_stats(c, &st);
    fprintf(stderr, "# %d reads checked; hits %llu misses %llu stale %llu refreshes %llu failures %llu evictions %llu\n",
            atomic_load(&reads_checked), (unsigned long long)st.hits, (unsigned long long)st.misses,
            (unsigned long long)st.stale_serves, (unsigned long long)st.refreshes,
            (unsigned long long)st.refresh_failures, (unsigned long long)st.evictions);
    assert_int_equal(atomic_load(&violations), 0);
    assert_true(atomic_load(&reads_checked) > 1000);
    assert_true(st.hits > 0 && st.misses > 0 && st.evictions > 0);
    assert_true(st.entries <= 24);
    flame_item_cache_destroy(c);
    flame_feature_source_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_stress_against_model)};
    return cmocka_run_group_tests_name("cache_stress", tests, NULL, NULL);
}
