/* The KV cache's bookkeeping (src/kvcache/kvcache.h) on its own: hits, extensions and misses
 * by version and by hash, LRU eviction of whole users, pins that eviction respects, an entry
 * replaced while read, no room, and many threads at once (run under ThreadSanitizer by
 * make test-sanitize) with the block contents checked by every reader. */
#include <pthread.h>
#include <stdatomic.h>

#include "testutil.h"
#include "kvcache/kvcache.h"
#include "kvcache/kvlayout.h"

/* 4 tokens a block, 16 bytes a token */
static fl_kv_cache *make(uint64_t blocks, int32_t max_tokens)
{
    fl_kv_params p = {.budget_bytes = blocks * 64, .block_tokens = 4, .token_bytes = 16, .max_tokens = max_tokens};
    fl_kv_cache *c = NULL;
    assert_int_equal(fl_kv_cache_create(&p, &c), FLAME_OK);
    assert_int_equal(fl_kv_num_blocks(c), (int32_t)blocks);
    return c;
}

static void hashes(const int64_t *items, int32_t n, uint64_t *prefix)
{
    fl_kv_prefix_hashes(items, NULL, 0, 0, n, prefix);
}

static fl_kv_kind look(fl_kv_cache *c, int64_t user, uint64_t version, const uint64_t *prefix, int32_t n,
                       bool extendable, fl_kv_ticket *t)
{
    fl_kv_key k = {.user = user, .version = version, .tokens = n, .prefix = prefix, .extendable = extendable};
    return fl_kv_lookup(c, &k, t);
}

static void store(fl_kv_cache *c, int64_t user, const int64_t *items, int32_t n, bool extendable)
{
    uint64_t pre[65];
    hashes(items, n, pre);
    fl_kv_ticket t;
    fl_kv_kind k = look(c, user, 0, pre, n, extendable, &t);
    assert_true(k == FL_KV_MISS || k == FL_KV_EXTEND);
    assert_true(t.writer);
    assert_true(fl_kv_reserve(c, &t));
    fl_kv_publish(c, &t, 0, pre[n]);
    fl_kv_release(c, &t);
}

static void test_params_refused(void **state)
{
    (void)state;
    fl_kv_cache *c = NULL;
    fl_kv_params p = {.budget_bytes = 63, .block_tokens = 4, .token_bytes = 16, .max_tokens = 8};
    assert_int_equal(fl_kv_cache_create(&p, &c), FLAME_ERR_INVALID_ARG);
    assert_non_null(strstr(flame_last_error(), "holds no block"));
    p.budget_bytes = 1 << 20;
    p.block_tokens = 0;
    assert_int_equal(fl_kv_cache_create(&p, &c), FLAME_ERR_INVALID_ARG);
    assert_non_null(strstr(flame_last_error(), "block_tokens = 0"));
    p.block_tokens = 4;
    p.budget_bytes = (uint64_t)64 << 31; /* 2^31 blocks of 64 bytes */
    assert_int_equal(fl_kv_cache_create(&p, &c), FLAME_ERR_INVALID_ARG);
    assert_non_null(strstr(flame_last_error(), "more than 2^31 - 1"));
    assert_null(c);
}

static void test_hash_hit_extend_miss(void **state)
{
    (void)state;
    fl_kv_cache *c = make(16, 64);
    int64_t h[12] = {5, 9, 1, 7, 7, 3, 2, 8, 4, 6, 0, 11};
    uint64_t pre[13];
    fl_kv_ticket t;
    hashes(h, 6, pre);
    assert_int_equal(look(c, 42, 0, pre, 6, true, &t), FL_KV_MISS);
    assert_true(t.writer);
    assert_int_equal(t.cached, 0);
    assert_true(fl_kv_reserve(c, &t));
    fl_kv_publish(c, &t, 0, pre[6]);
    fl_kv_release(c, &t);
    fl_kv_stats s;
    fl_kv_get_stats(c, &s);
    assert_int_equal(s.blocks_in_use, 2); /* 6 tokens, 4 a block */
    /* the same window: a hit, read-only */
    assert_int_equal(look(c, 42, 0, pre, 6, true, &t), FL_KV_HIT);
    assert_false(t.writer);
    assert_int_equal(t.cached, 6);
    int32_t b0 = t.blocks[0], b1 = t.blocks[1];
    fl_kv_release(c, &t);
    /* grown by 4 items: an extension from 6, into the blocks it had plus one */
    hashes(h, 10, pre);
    assert_int_equal(look(c, 42, 0, pre, 10, true, &t), FL_KV_EXTEND);
    assert_int_equal(t.cached, 6);
    assert_true(fl_kv_reserve(c, &t));
    assert_int_equal(t.blocks[0], b0);
    assert_int_equal(t.blocks[1], b1);
    fl_kv_publish(c, &t, 0, pre[10]);
    fl_kv_release(c, &t);
    /* grown, but the rule of the positions keeps nothing: a miss */
    hashes(h, 12, pre);
    assert_int_equal(look(c, 42, 0, pre, 12, false, &t), FL_KV_MISS);
    fl_kv_abort(c, &t);
    fl_kv_release(c, &t);
    /* the abort dropped the user: a miss again, and the blocks are free */
    fl_kv_get_stats(c, &s);
    assert_int_equal(s.blocks_in_use, 0);
    assert_int_equal(s.entries, 0);
    store(c, 42, h, 10, true);
    /* a changed item in the cached prefix: the hash says miss, not extension */
    int64_t g[12];
    memcpy(g, h, sizeof g);
    g[3] = 99;
    hashes(g, 12, pre);
    assert_int_equal(look(c, 42, 0, pre, 12, true, &t), FL_KV_MISS);
    fl_kv_abort(c, &t);
    fl_kv_release(c, &t);
    fl_kv_get_stats(c, &s);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.extensions, 1);
    assert_int_equal(s.misses, 4);
    fl_kv_cache_destroy(c);
}

/* A caller's version: a hit by version alone (no hashes); anything else needs the hashes. */
static void test_caller_version(void **state)
{
    (void)state;
    fl_kv_cache *c = make(16, 64);
    int64_t h[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint64_t pre[9];
    hashes(h, 8, pre);
    fl_kv_ticket t;
    assert_int_equal(look(c, 7, 3, NULL, 5, true, &t), FL_KV_NEED_HASH);
    assert_null(t.entry);
    assert_int_equal(look(c, 7, 3, pre, 5, true, &t), FL_KV_MISS);
    assert_true(fl_kv_reserve(c, &t));
    fl_kv_publish(c, &t, 3, pre[5]);
    fl_kv_release(c, &t);
    assert_int_equal(look(c, 7, 3, NULL, 5, true, &t), FL_KV_HIT);
    fl_kv_release(c, &t);
    /* the same version with another length is no hit: it needs the hashes, then extends */
    assert_int_equal(look(c, 7, 3, NULL, 8, true, &t), FL_KV_NEED_HASH);
    assert_int_equal(look(c, 7, 4, pre, 8, true, &t), FL_KV_EXTEND);
    assert_int_equal(t.cached, 5);
    assert_true(fl_kv_reserve(c, &t));
    fl_kv_publish(c, &t, 4, pre[8]);
    fl_kv_release(c, &t);
    /* a version of the same contents is a hit by hash, which records that version: the next
     * lookup with it is a hit by version alone, with no hashes given */
    assert_int_equal(look(c, 7, 9, NULL, 8, true, &t), FL_KV_NEED_HASH);
    assert_int_equal(look(c, 7, 9, pre, 8, true, &t), FL_KV_HIT);
    fl_kv_release(c, &t);
    fl_kv_stats s;
    fl_kv_get_stats(c, &s);
    const uint64_t hashed = s.hashed;
    assert_int_equal(hashed, 3); /* the miss, the extension and this hit were given hashes */
    assert_int_equal(look(c, 7, 9, NULL, 8, true, &t), FL_KV_HIT);
    assert_int_equal(t.cached, 8);
    fl_kv_release(c, &t);
    /* the entry keeps the last version given: the one it was published under is now no hit
     * by version alone (the hashes still find it) */
    assert_int_equal(look(c, 7, 4, NULL, 8, true, &t), FL_KV_NEED_HASH);
    /* a hashed lookup with version 0 leaves the recorded version as it is */
    assert_int_equal(look(c, 7, 0, pre, 8, true, &t), FL_KV_HIT);
    fl_kv_release(c, &t);
    assert_int_equal(look(c, 7, 9, NULL, 8, true, &t), FL_KV_HIT);
    fl_kv_release(c, &t);
    fl_kv_get_stats(c, &s);
    assert_int_equal(s.hits, 5); /* with the first one by version */
    assert_int_equal(s.hashed, hashed + 1);
    fl_kv_cache_destroy(c);
}

/* Least recently used users go first; pinned ones never; no room when all are pinned. */
static void test_lru_and_pins(void **state)
{
    (void)state;
    fl_kv_cache *c = make(6, 64); /* three users of 8 tokens (2 blocks each) */
    int64_t h[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint64_t pre[9];
    hashes(h, 8, pre);
    for (int64_t u = 1; u <= 3; u++) store(c, u, h, 8, true);
    fl_kv_ticket t1, t4;
    assert_int_equal(look(c, 1, 0, pre, 8, true, &t1), FL_KV_HIT); /* user 1 is now the most recent, and pinned */
    assert_int_equal(look(c, 4, 0, pre, 8, true, &t4), FL_KV_MISS);
    assert_true(fl_kv_reserve(c, &t4)); /* evicts user 2, the least recent */
    fl_kv_publish(c, &t4, 0, pre[8]);
    fl_kv_release(c, &t4);
    fl_kv_ticket t;
    assert_int_equal(look(c, 2, 0, pre, 8, true, &t), FL_KV_MISS);
    assert_true(fl_kv_reserve(c, &t)); /* evicts user 3 */
    fl_kv_publish(c, &t, 0, pre[8]);
    fl_kv_release(c, &t);
    fl_kv_stats s;
    fl_kv_get_stats(c, &s);
    assert_int_equal(s.evictions, 2);
    assert_int_equal(s.peak_blocks_in_use, 6);
    /* pin 2 and 4 as well: user 5 finds no room */
    fl_kv_ticket t2, t4b, t5;
    assert_int_equal(look(c, 2, 0, pre, 8, true, &t2), FL_KV_HIT);
    assert_int_equal(look(c, 4, 0, pre, 8, true, &t4b), FL_KV_HIT);
    assert_int_equal(look(c, 5, 0, pre, 8, true, &t5), FL_KV_MISS);
    assert_false(fl_kv_reserve(c, &t5));
    fl_kv_abort(c, &t5);
    fl_kv_release(c, &t5);
    fl_kv_get_stats(c, &s);
    assert_int_equal(s.store_skipped, 1);
    assert_int_equal(s.blocks_in_use, 6);
    /* a reserve that cannot succeed evicts nothing: with 1 and 2 pinned, user 4 unpinned (2 blocks)
     * and a user needing 6 blocks, evicting 4 would still leave too few */
    fl_kv_release(c, &t4b);
    int64_t h24[24];
    for (int i = 0; i < 24; i++) h24[i] = 100 + i;
    uint64_t pre24[25];
    hashes(h24, 24, pre24);
    fl_kv_ticket t6;
    assert_int_equal(look(c, 6, 0, pre24, 24, true, &t6), FL_KV_MISS);
    assert_false(fl_kv_reserve(c, &t6));
    fl_kv_abort(c, &t6);
    fl_kv_release(c, &t6);
    fl_kv_get_stats(c, &s);
    assert_int_equal(s.evictions, 2); /* user 4 kept */
    assert_int_equal(s.store_skipped, 2);
    assert_int_equal(look(c, 4, 0, pre, 8, true, &t4b), FL_KV_HIT);
    fl_kv_release(c, &t1);
    fl_kv_release(c, &t2);
    fl_kv_release(c, &t4b);
    /* an entry longer than the budget is never stored */
    fl_kv_cache *small = make(1, 64);
    assert_int_equal(look(small, 1, 0, pre, 8, true, &t), FL_KV_MISS);
    assert_false(fl_kv_reserve(small, &t));
    fl_kv_abort(small, &t);
    fl_kv_release(small, &t);
    fl_kv_cache_destroy(small);
    fl_kv_cache_destroy(c);
}

/* A user's entry replaced while a call reads it keeps its blocks until that call releases it. */
static void test_replaced_while_pinned(void **state)
{
    (void)state;
    fl_kv_cache *c = make(8, 64);
    int64_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {8, 7, 6, 5, 4, 3, 2, 1};
    uint64_t pa[9], pb[9];
    hashes(a, 8, pa);
    hashes(b, 8, pb);
    store(c, 1, a, 8, true);
    fl_kv_ticket reader, writer;
    assert_int_equal(look(c, 1, 0, pa, 8, true, &reader), FL_KV_HIT);
    const int32_t old0 = reader.blocks[0], old1 = reader.blocks[1];
    assert_int_equal(look(c, 1, 0, pb, 8, true, &writer), FL_KV_MISS);
    assert_true(fl_kv_reserve(c, &writer));
    assert_true(writer.blocks[0] != old0 && writer.blocks[0] != old1 && writer.blocks[1] != old0 &&
                writer.blocks[1] != old1);
    fl_kv_publish(c, &writer, 0, pb[8]);
    fl_kv_release(c, &writer);
    fl_kv_stats s;
    fl_kv_get_stats(c, &s);
    assert_int_equal(s.blocks_in_use, 4);
    assert_int_equal(s.entries, 1);
    fl_kv_release(c, &reader);
    fl_kv_get_stats(c, &s);
    assert_int_equal(s.blocks_in_use, 2);
    fl_kv_cache_destroy(c);
}

/* ---- many threads: every reader checks the bytes of what it pinned */

#define USERS 6
#define TOKENS 24
typedef struct shared {
    fl_kv_cache *c;
    fl_kv_layout lay;
    uint8_t *blocks;
    int64_t hist[USERS][TOKENS];
    _Atomic int computed[USERS][TOKENS + 1]; /* writers per (user, window length) */
    _Atomic int bad;
    pthread_barrier_t phase;
} shared;

/* the row of token r of user u's window: a value only that (user, token, item) gives */
static uint8_t row_value(int64_t user, int32_t r, int64_t item)
{
    return (uint8_t)(user * 31 + r * 7 + item * 3 + 1);
}

static void *worker(void *arg)
{
    shared *sh = arg;
    uint64_t rng = (uint64_t)(uintptr_t)&rng;
    for (int it = 0; it < 3 * 150; it++) {
        if (it % 150 == 0) pthread_barrier_wait(&sh->phase); /* all threads in one phase */
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const int64_t u = (int64_t)((rng >> 33) % USERS);
        const int32_t n = 8 + (it / 150) * 8; /* windows of 8, then 16, then 24: extensions */
        uint64_t pre[TOKENS + 1];
        hashes(sh->hist[u], n, pre);
        fl_kv_ticket t;
        fl_kv_key key = {.user = u, .tokens = n, .prefix = pre, .extendable = true};
        const fl_kv_kind k = fl_kv_lookup(sh->c, &key, &t);
        for (int32_t r = 0; r < t.cached; r++) { /* readable rows hold the user's values */
            const uint64_t off = fl_kv_row_offset(&sh->lay, t.blocks[r / 4], 0, 1, r % 4);
            if (sh->blocks[off] != row_value(u, r, sh->hist[u][r])) atomic_store(&sh->bad, 1);
        }
        if (t.writer) {
            atomic_fetch_add(&sh->computed[u][n], 1);
            if (fl_kv_reserve(sh->c, &t)) {
                for (int32_t r = t.cached; r < n; r++)
                    sh->blocks[fl_kv_row_offset(&sh->lay, t.blocks[r / 4], 0, 1, r % 4)] = row_value(u, r, sh->hist[u][r]);
                fl_kv_publish(sh->c, &t, 0, pre[n]);
            } else {
                fl_kv_abort(sh->c, &t);
            }
        }
        (void)k;
        fl_kv_release(sh->c, &t);
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    static shared sh;
    memset(&sh, 0, sizeof sh);
    sh.lay = (fl_kv_layout){.layers = 1, .d = 4, .block_tokens = 4, .elem_bytes = 1};
    /* room for every user's longest window: nothing is evicted, and the windows only grow
     * (phase by phase), so each window length of a user is computed at most once (single
     * flight) and each user misses once */
    const uint64_t token_bytes = fl_kv_token_bytes(&sh.lay);
    fl_kv_params p = {.budget_bytes = USERS * (TOKENS / 4) * 4 * token_bytes, .block_tokens = 4,
                      .token_bytes = token_bytes, .max_tokens = TOKENS};
    assert_int_equal(fl_kv_cache_create(&p, &sh.c), FLAME_OK);
    sh.blocks = calloc((size_t)fl_kv_num_blocks(sh.c), fl_kv_block_bytes(sh.c));
    for (int u = 0; u < USERS; u++)
        for (int r = 0; r < TOKENS; r++) sh.hist[u][r] = tu_below(1000);
    pthread_barrier_init(&sh.phase, NULL, 8);
    pthread_t th[8];
    for (int i = 0; i < 8; i++) pthread_create(&th[i], NULL, worker, &sh);
    for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&sh.bad), 0);
    fl_kv_stats s;
    fl_kv_get_stats(sh.c, &s);
    assert_int_equal(s.evictions, 0);
    assert_int_equal(s.store_skipped, 0);
    assert_int_equal(s.hits + s.extensions + s.misses, 8 * 3 * 150);
    assert_true(s.misses <= USERS);
    for (int u = 0; u < USERS; u++)
        for (int n = 0; n <= TOKENS; n++) assert_true(atomic_load(&sh.computed[u][n]) <= 1);
    fprintf(stderr, "# %llu hits, %llu extensions, %llu misses, %llu waits\n", (unsigned long long)s.hits,
            (unsigned long long)s.extensions, (unsigned long long)s.misses, (unsigned long long)s.waits);
    pthread_barrier_destroy(&sh.phase);
    free(sh.blocks);
    fl_kv_cache_destroy(sh.c);
}

/* Two windows built to collide under a hash seeded with a known constant (the state after
 * {1527, 7408} and after {3755, 11985} differ by 0 ^ 6438 in XOR, so the third items close the
 * gap): with the per-process secret seed they hash apart, and a lookup of one never hits the
 * other's entry. */
static void test_crafted_collision_is_no_hit(void **state)
{
    (void)state;
    const int64_t a[3] = {1527, 7408, 0}, b[3] = {3755, 11985, 6438};
    uint64_t pa[4], pb[4];
    hashes(a, 3, pa);
    hashes(b, 3, pb);
    assert_true(pa[3] != pb[3]);
    uint64_t again[4]; /* within the process the hashes are a function of the window */
    hashes(a, 3, again);
    assert_memory_equal(pa, again, sizeof pa);
    fl_kv_cache *c = make(8, 16);
    store(c, 5, a, 3, true);
    fl_kv_ticket t;
    assert_int_equal(look(c, 5, 0, pb, 3, true, &t), FL_KV_MISS);
    fl_kv_abort(c, &t);
    fl_kv_release(c, &t);
    fl_kv_cache_destroy(c);
}

int main(void)
{
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_params_refused),
        cmocka_unit_test(test_hash_hit_extend_miss),
        cmocka_unit_test(test_caller_version),
        cmocka_unit_test(test_lru_and_pins),
        cmocka_unit_test(test_replaced_while_pinned),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_crafted_collision_is_no_hit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
