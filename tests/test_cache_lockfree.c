/* The item cache's lock-free hit path: epoch-based reclamation (an entry a reader may hold is
 * never freed under it, and retired entries are freed once readers leave), readers hammering
 * hot keys in batches while writers replace, invalidate and evict them (every record checked
 * whole, against a model of each key), exact hit counts from many threads, and the hit count
 * that the TTL function sees. Run under ThreadSanitizer and AddressSanitizer by
 * `make test-sanitize`. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "icache/icache.h"
#include "testutil.h"

/* ---- epoch-based reclamation on its own */

typedef struct node {
    fl_ebr_node link;
    int *freed;
} node;

static void node_free(fl_ebr_node *n)
{
    node *x = (node *)n;
    (*x->freed)++;
    free(x);
}

static void retire_n(fl_ebr *d, fl_ebr_list *l, int n, int *freed)
{
    for (int i = 0; i < n; i++) {
        node *x = calloc(1, sizeof *x);
        x->freed = freed;
        fl_ebr_retire(d, l, &x->link, node_free);
    }
}

static void test_ebr_reader_holds_back_reclamation(void **state)
{
    (void)state;
    fl_ebr *d = aligned_alloc(64, sizeof *d);
    fl_ebr_init(d);
    fl_ebr_list l = {0};
    int freed = 0;
    unsigned slot = fl_ebr_slot();
    uint64_t e = fl_ebr_enter(d, slot);
    retire_n(d, &l, 10 * FL_EBR_BATCH, &freed);
    /* the epoch may move once past a reader, never twice: nothing retired while inside is freed */
    assert_int_equal(freed, 0);
    assert_true(atomic_load(&d->epoch) <= e + 1);
    fl_ebr_leave(d, slot, e);
    fl_ebr_reclaim(d, &l, node_free);
    fl_ebr_reclaim(d, &l, node_free);
    assert_int_equal(freed, 10 * FL_EBR_BATCH);
    assert_int_equal(l.count, 0);
    /* no reader: retired objects never pile up beyond a few batches */
    retire_n(d, &l, 100 * FL_EBR_BATCH, &freed);
    assert_true(l.count <= 3 * FL_EBR_BATCH);
    fl_ebr_drain(&l, node_free);
    assert_int_equal(freed, 110 * FL_EBR_BATCH);
    free(d);
}

/* ---- the cache: record of id at version v = slot 0 {id, v, v, ... (2 + v % 13 ids)},
 * dense {v, ...} (v % 5 floats): a torn or freed record cannot pass check_record */

#define KEYS 64
static _Atomic int64_t store[KEYS], done_ver[KEYS], started[KEYS];
static pthread_mutex_t key_lock[KEYS];
static atomic_int violations;
static atomic_llong records_checked;

static void encode(int64_t id, int64_t v, int64_t *ids, int64_t offs[2], float *dense, size_t *nd)
{
    size_t n = 2 + (size_t)(v % 13);
    ids[0] = id;
    for (size_t i = 1; i < n; i++) ids[i] = v;
    offs[0] = 0, offs[1] = (int64_t)n;
    *nd = (size_t)(v % 5);
    for (size_t i = 0; i < *nd; i++) dense[i] = (float)v;
}

static flame_status fetch(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)user;
    for (size_t i = 0; i < n; i++) {
        int64_t rec[16], offs[2];
        float dense[8];
        size_t nd;
        encode(ids[i], atomic_load(&store[ids[i]]), rec, offs, dense, &nd);
        flame_status st = flame_feature_batch_set(out, i, offs, rec, (size_t)offs[1], dense, nd);
        if (st) return st;
    }
    return FLAME_OK;
}

/* The version in record i, or -1 (and a violation) if the record is not one of id's. */
static int64_t check_record(const flame_feature_batch *b, size_t i, int64_t id)
{
    int found;
    const int64_t *v;
    size_t n, nd;
    const float *dense;
    if (flame_feature_batch_get_slot(b, i, 0, &found, &v, &n) || !found || n < 2 || v[0] != id) return -1;
    for (size_t k = 2; k < n; k++)
        if (v[k] != v[1]) return -1;
    if (n != 2 + (size_t)(v[1] % 13) || flame_feature_batch_get_dense(b, i, &dense, &nd) || nd != (size_t)(v[1] % 5))
        return -1;
    for (size_t k = 0; k < nd; k++)
        if (dense[k] != (float)v[1]) return -1;
    return v[1];
}

static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    return z ^ (z >> 27);
}

/* Skewed toward small ids, so a few keys are hot. */
static int64_t pick(uint64_t r)
{
    return (int64_t)(r % (1 + (r >> 32) % KEYS));
}

typedef struct worker {
    flame_item_cache *cache;
    uint64_t seed;
    int ops;
    bool writer;
    atomic_int *stop;
} worker;

static void *reader(void *p)
{
    worker *w = p;
    flame_feature_batch *b;
    flame_feature_batch_create(1, &b);
    int64_t keys[40], floor[40];
    while (!atomic_load(w->stop)) {
        uint64_t r = next(&w->seed);
        size_t n = 1 + r % 40;
        for (size_t i = 0; i < n; i++) {
            keys[i] = pick(next(&w->seed));
            floor[i] = atomic_load(&done_ver[keys[i]]);
        }
        if (flame_item_cache_get(w->cache, keys, n, b) != FLAME_OK) atomic_fetch_add(&violations, 1);
        for (size_t i = 0; i < n; i++) {
            int64_t v = check_record(b, i, keys[i]);
            if (v < floor[i] || v > atomic_load(&started[keys[i]])) {
                if (atomic_fetch_add(&violations, 1) < 5)
                    fprintf(stderr, "key %lld: got version %lld, newest completed write %lld\n", (long long)keys[i],
                            (long long)v, (long long)floor[i]);
            }
        }
        atomic_fetch_add(&records_checked, (long long)n);
    }
    flame_feature_batch_destroy(b);
    return NULL;
}

static void *writer(void *p)
{
    worker *w = p;
    for (int op = 0; op < w->ops; op++) {
        uint64_t r = next(&w->seed);
        int64_t key = pick(r);
        pthread_mutex_lock(&key_lock[key]); /* store first, then the cache (write-through) */
        int64_t v = atomic_load(&started[key]) + 1;
        atomic_store(&started[key], v);
        atomic_store(&store[key], v);
        if ((r >> 20) % 4) {
            int64_t ids[16], offs[2];
            float dense[8];
            size_t nd;
            encode(key, v, ids, offs, dense, &nd);
            if (flame_item_cache_put(w->cache, key, offs, ids, (size_t)offs[1], dense, nd)) atomic_fetch_add(&violations, 1);
        } else {
            flame_item_cache_invalidate(w->cache, key);
        }
        atomic_store(&done_ver[key], v);
        pthread_mutex_unlock(&key_lock[key]);
    }
    return NULL;
}

static flame_item_cache *make_cache(flame_feature_source **s, int64_t max_entries, int64_t shards)
{
    flame_item_cache_params p = {.struct_size = sizeof p};
    flame_item_cache *c;
    assert_int_equal(flame_feature_source_create_callback(1, fetch, NULL, NULL, s), FLAME_OK);
    p.shards = shards;
    p.max_entries = max_entries;
    p.manual_refresh = 1;
    assert_int_equal(flame_item_cache_create(*s, &p, &c), FLAME_OK);
    return c;
}

static void entry_free_for_test(fl_ebr_node *n)
{
    free((char *)n - offsetof(fl_entry, retired));
}

static uint64_t retired_now(flame_item_cache *c)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < c->nshards; i++) {
        pthread_mutex_lock(&c->shards[i].lock);
        n += c->shards[i].retired.count;
        pthread_mutex_unlock(&c->shards[i].lock);
    }
    return n;
}

/* Readers on the lock-free path while writers replace and invalidate the same hot keys and a
 * cache smaller than the key set evicts: no read is torn, freed or older than a completed
 * write, and what was retired gets freed. */
static void test_readers_vs_writers(void **state)
{
    (void)state;
    tu_seed();
    for (int k = 0; k < KEYS; k++) {
        pthread_mutex_init(&key_lock[k], NULL);
        atomic_store(&store[k], 0), atomic_store(&done_ver[k], 0), atomic_store(&started[k], 0);
    }
    flame_feature_source *s;
    flame_item_cache *c = make_cache(&s, 40, 4); /* 64 keys, room for 40: evictions */
    const char *ops = getenv("FLAME_STRESS_OPS");
    enum { READERS = 3, WRITERS = 2 };
    atomic_int stop = 0;
    pthread_t th[READERS + WRITERS];
    worker w[READERS + WRITERS];
    for (int i = 0; i < READERS + WRITERS; i++) {
        w[i] = (worker){c, tu_u64(), ops ? atoi(ops) : 30000, i >= READERS, &stop};
        pthread_create(&th[i], NULL, w[i].writer ? writer : reader, &w[i]);
    }
    for (int i = READERS; i < READERS + WRITERS; i++) pthread_join(th[i], NULL);
    atomic_store(&stop, 1);
    for (int i = 0; i < READERS; i++) pthread_join(th[i], NULL);
    flame_item_cache_stats st = {.struct_size = sizeof st};
    flame_item_cache_get_stats(c, &st);
    uint64_t retired = retired_now(c);
    fprintf(stderr, "# %lld records checked; hits %llu misses %llu evictions %llu; %llu entries retired, not freed\n",
            atomic_load(&records_checked), (unsigned long long)st.hits, (unsigned long long)st.misses,
            (unsigned long long)st.evictions, (unsigned long long)retired);
    assert_int_equal(atomic_load(&violations), 0);
    assert_true(atomic_load(&records_checked) > 1000);
    assert_true(st.hits > 0 && st.misses > 0 && st.evictions > 0);
    assert_true(st.entries <= 40);
    /* tens of thousands of entries were retired; those still waiting (a reader preempted inside
     * its section holds reclamation back meanwhile) are all freed once no reader is left */
    for (uint32_t i = 0; i < c->nshards; i++) {
        fl_shard *sh = &c->shards[i];
        pthread_mutex_lock(&sh->lock);
        fl_ebr_reclaim(sh->ebr, &sh->retired, entry_free_for_test);
        assert_int_equal(sh->retired.count, 0);
        pthread_mutex_unlock(&sh->lock);
    }
    flame_item_cache_destroy(c);
    flame_feature_source_destroy(s);
}

/* A reader inside an epoch holding an entry: the writers replace it many times over, yet
 * its memory stays intact (AddressSanitizer would report a use after free) until it leaves. */
static void test_held_entry_survives_replacement(void **state)
{
    (void)state;
    for (int k = 0; k < KEYS; k++) atomic_store(&store[k], 0);
    flame_feature_source *s;
    flame_item_cache *c = make_cache(&s, 1000, 1);
    flame_feature_batch *b;
    flame_feature_batch_create(1, &b);
    int64_t key = 5;
    assert_int_equal(flame_item_cache_get(c, &key, 1, b), FLAME_OK);
    uint64_t h;
    fl_shard *sh = fl_shard_of(c, key, &h);
    unsigned slot = fl_ebr_slot();
    uint64_t epoch = fl_ebr_enter(&c->ebr, slot);
    fl_entry *held = fl_shard_find(sh, key, h);
    assert_non_null(held);
    uint8_t copy[256];
    uint32_t len = held->len;
    memcpy(copy, fl_entry_blob(held), len);
    for (int64_t v = 1; v <= 20 * FL_EBR_BATCH; v++) {
        int64_t ids[16], offs[2];
        float dense[8];
        size_t nd;
        encode(key, v, ids, offs, dense, &nd);
        assert_int_equal(flame_item_cache_put(c, key, offs, ids, (size_t)offs[1], dense, nd), FLAME_OK);
    }
    assert_int_equal(held->key, key);
    assert_memory_equal(fl_entry_blob(held), copy, len);
    assert_true(retired_now(c) >= 20 * FL_EBR_BATCH);
    fl_ebr_leave(&c->ebr, slot, epoch);
    for (int64_t v = 1; v <= 3 * FL_EBR_BATCH; v++) { /* each invalidate retires one entry */
        assert_int_equal(flame_item_cache_invalidate(c, key), FLAME_OK);
        assert_int_equal(flame_item_cache_get(c, &key, 1, b), FLAME_OK);
    }
    assert_true(retired_now(c) <= 3 * FL_EBR_BATCH);
    flame_feature_batch_destroy(b);
    flame_item_cache_destroy(c);
    flame_feature_source_destroy(s);
}

/* Hits and misses from many threads, through the lock-free path, are counted exactly. */
typedef struct hitter {
    flame_item_cache *cache;
    int calls;
} hitter;

static void *hit_loop(void *p)
{
    hitter *h = p;
    flame_feature_batch *b;
    flame_feature_batch_create(1, &b);
    int64_t keys[KEYS];
    for (int k = 0; k < KEYS; k++) keys[k] = k;
    for (int i = 0; i < h->calls; i++)
        if (flame_item_cache_get(h->cache, keys, KEYS, b)) atomic_fetch_add(&violations, 1);
    flame_feature_batch_destroy(b);
    return NULL;
}

static void test_exact_hit_counts(void **state)
{
    (void)state;
    for (int k = 0; k < KEYS; k++) atomic_store(&store[k], 0);
    flame_feature_source *s;
    flame_item_cache *c = make_cache(&s, 1000, 8);
    hitter one = {c, 1};
    hit_loop(&one); /* KEYS misses */
    enum { T = 6, CALLS = 2000 };
    pthread_t th[T];
    hitter h[T];
    for (int i = 0; i < T; i++) {
        h[i] = (hitter){c, CALLS};
        pthread_create(&th[i], NULL, hit_loop, &h[i]);
    }
    for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
    flame_item_cache_stats st = {.struct_size = sizeof st};
    flame_item_cache_get_stats(c, &st);
    assert_int_equal(atomic_load(&violations), 0);
    assert_int_equal(st.misses, KEYS);
    assert_int_equal(st.hits, (uint64_t)T * CALLS * KEYS);
    assert_int_equal(st.fetches, 1);
    flame_item_cache_destroy(c);
    flame_feature_source_destroy(s);
}

/* The TTL function sees the hits of the previous lifetime: exact up to FL_HITS_EXACT, an
 * unbiased estimate beyond. */
static uint64_t seen_hits;
static uint64_t record_hits(int64_t id, uint64_t previous_hits, void *user)
{
    (void)id, (void)user;
    seen_hits = previous_hits;
    return 60000000;
}

static void test_hit_count_for_ttl(void **state)
{
    (void)state;
    flame_feature_source *s;
    flame_item_cache *c = make_cache(&s, 1000, 1);
    flame_item_cache_set_ttl_fn(c, record_hits, NULL);
    flame_feature_batch *b;
    flame_feature_batch_create(1, &b);
    int64_t key = 9, ids[16], offs[2];
    float dense[8];
    size_t nd;
    encode(key, 0, ids, offs, dense, &nd);
    const uint64_t rounds[] = {FL_HITS_EXACT - 1, FL_HITS_EXACT, 300000};
    for (int r = 0; r < 3; r++) {
        assert_int_equal(flame_item_cache_put(c, key, offs, ids, (size_t)offs[1], dense, nd), FLAME_OK);
        for (uint64_t i = 0; i < rounds[r]; i++) assert_int_equal(flame_item_cache_get(c, &key, 1, b), FLAME_OK);
        assert_int_equal(flame_item_cache_put(c, key, offs, ids, (size_t)offs[1], dense, nd), FLAME_OK);
        if (rounds[r] <= FL_HITS_EXACT) {
            assert_int_equal(seen_hits, rounds[r]);
        } else { /* counted in steps of up to 256 at this count */
            fprintf(stderr, "# %llu hits counted as %llu\n", (unsigned long long)rounds[r], (unsigned long long)seen_hits);
            assert_true(seen_hits > rounds[r] * 85 / 100 && seen_hits < rounds[r] * 115 / 100);
        }
    }
    flame_feature_batch_destroy(b);
    flame_item_cache_destroy(c);
    flame_feature_source_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ebr_reader_holds_back_reclamation),
        cmocka_unit_test(test_readers_vs_writers),
        cmocka_unit_test(test_held_entry_survives_replacement),
        cmocka_unit_test(test_exact_hit_counts),
        cmocka_unit_test(test_hit_count_for_ttl),
    };
    return cmocka_run_group_tests_name("cache_lockfree", tests, NULL, NULL);
}
