/* The struct_size rule (top of flame.h) at every public struct: a caller built against an
 * older header (a shorter struct) and one built against a newer header (a longer struct) both
 * work. Output structs: an older caller gets exactly the bytes it holds and nothing past them;
 * a newer caller gets this library's fields and its extra bytes stay untouched. Input
 * structs: bytes past the caller's struct_size are never read (they hold values that would
 * be refused if they were), and bytes past this library's struct are ignored. Sizes no
 * header can have are refused with a message naming the struct and the size. */
#include <pthread.h>

#include "testutil.h"
#include "tu_models.h"

#define TAIL 64
#define BIG (4096 + TAIL)
#define GARBAGE 0xff /* read as a field, every byte of this makes a value out of range */

typedef flame_status (*get_fn)(void *ctx, void *out);

/* Runs `get` on structs of `ours` bytes (the exact size), of `older` bytes (a prefix that
 * ends before the struct's last field) and of ours + TAIL, and checks the rule. `end` is
 * where the struct's last field ends (trailing padding is not compared). */
static void check_out(const char *name, get_fn get, void *ctx, size_t ours, size_t end, size_t older)
{
    static unsigned char want[BIG], buf[BIG];
    assert_true(older > sizeof(size_t) && older < end && end <= ours);
    memset(want, 0xee, sizeof want);
    memcpy(want, &ours, sizeof ours);
    assert_int_equal(get(ctx, want), FLAME_OK);
    for (size_t i = end; i < ours + TAIL; i++) /* nothing past the struct */
        if (i >= ours && want[i] != 0xee) fail_msg("%s: byte %zu past the struct was written", name, i);

    /* older: the prefix it holds, nothing beyond, its struct_size kept */
    memset(buf, 0xee, sizeof buf);
    memcpy(buf, &older, sizeof older);
    assert_int_equal(get(ctx, buf), FLAME_OK);
    assert_memory_equal(buf + sizeof(size_t), want + sizeof(size_t), older - sizeof(size_t));
    for (size_t i = older; i < ours + TAIL; i++)
        if (buf[i] != 0xee) fail_msg("%s: struct_size %zu, byte %zu was written", name, older, i);
    size_t kept;
    memcpy(&kept, buf, sizeof kept);
    assert_int_equal(kept, older);

    /* newer: this library's fields, its own tail untouched */
    size_t newer = ours + TAIL;
    memset(buf, 0xee, sizeof buf);
    memcpy(buf, &newer, sizeof newer);
    assert_int_equal(get(ctx, buf), FLAME_OK);
    assert_memory_equal(buf + sizeof(size_t), want + sizeof(size_t), end - sizeof(size_t));
    for (size_t i = ours; i < newer; i++)
        if (buf[i] != 0xee) fail_msg("%s: struct_size %zu, byte %zu of the newer fields was written", name, newer, i);

    /* sizes no header has (12: inside the field after struct_size, half of a pointer or
     * length; every public struct's sizeof is a multiple of 8) */
    const size_t bad[] = {0, 4, 12, 4097, SIZE_MAX};
    for (int k = 0; k < 5; k++) {
        memset(buf, 0xee, sizeof buf);
        memcpy(buf, &bad[k], sizeof bad[k]);
        char needle[96];
        snprintf(needle, sizeof needle, "%s.struct_size = %zu: set it to sizeof(%s) (%zu", name, bad[k], name, ours);
        assert_status_msg(get(ctx, buf), FLAME_ERR_INVALID_ARG, needle);
        for (size_t i = sizeof(size_t); i < ours; i++) assert_int_equal(buf[i], 0xee);
    }
}

/* A caller's input struct with struct_size `size`: the bytes of `fields` (a struct of valid
 * values) before `cut`, GARBAGE from there on. With cut == size the library sees only valid
 * values if it keeps to struct_size; with cut < size (the control) it must refuse. */
static void *input(const void *fields, size_t cut, size_t size)
{
    static unsigned char buf[BIG];
    memset(buf, GARBAGE, sizeof buf);
    memcpy(buf, fields, cut);
    memcpy(buf, &size, sizeof size);
    return buf;
}

/* ------------------------------------------------------------------ output structs */

static flame_status get_model_info(void *m, void *out)
{
    return flame_model_get_info(m, out);
}
static flame_status get_engine_stats(void *e, void *out)
{
    return flame_engine_get_stats(e, out);
}
static flame_status get_scheduler_stats(void *s, void *out)
{
    return flame_scheduler_get_stats(s, out);
}
static flame_status get_numa_info(void *unused, void *out)
{
    return flame_numa_get_info(out);
}
static flame_status get_pinned_stats(void *p, void *out)
{
    return flame_pinned_pool_get_stats(p, out);
}
static flame_status get_user_cache_stats(void *c, void *out)
{
    return flame_user_cache_get_stats(c, out);
}
static flame_status get_user_cache_params(void *c, void *out)
{
    return flame_user_cache_get_params(c, out);
}
static flame_status get_item_cache_stats(void *c, void *out)
{
    return flame_item_cache_get_stats(c, out);
}

#define END(type, field) (offsetof(type, field) + sizeof(((type *)0)->field))

static const char *config = TU_DOT_CONFIG(50, 1, "");

static void test_model_engine_scheduler(void **state)
{
    flame_model *m;
    flame_engine *e;
    flame_scheduler *s;
    assert_int_equal(flame_model_create_random(config, 3, &m), FLAME_OK);
    assert_int_equal(flame_engine_create(m, NULL, &e), FLAME_OK);
    assert_int_equal(flame_scheduler_create(e, NULL, &s), FLAME_OK);
    int64_t hist[3] = {1, 2, 3}, cand[2] = {4, 5};
    flame_request r = {.struct_size = sizeof r, .history = hist, .history_len = 3, .candidates = cand,
                       .num_candidates = 2};
    float out[2];
    assert_int_equal(flame_score(e, &r, out, 2), FLAME_OK); /* counters that are not 0 */
    assert_int_equal(flame_scheduler_score(s, &r, out, 2), FLAME_OK);

    check_out("flame_model_info", get_model_info, m, sizeof(flame_model_info),
              END(flame_model_info, weight_bytes), offsetof(flame_model_info, num_items));
    check_out("flame_engine_stats", get_engine_stats, e, sizeof(flame_engine_stats),
              END(flame_engine_stats, user_cache_misses), offsetof(flame_engine_stats, user_cache_hits));
    check_out("flame_scheduler_stats", get_scheduler_stats, s, sizeof(flame_scheduler_stats),
              END(flame_scheduler_stats, queue_wait_p99_us), offsetof(flame_scheduler_stats, batches));
    flame_engine_stats es = {.struct_size = offsetof(flame_engine_stats, workspaces)};
    assert_int_equal(flame_engine_get_stats(e, &es), FLAME_OK);
    assert_int_equal(es.calls, 2); /* the prefix holds the real values */

    /* scheduler params: an older caller's struct ends before max_wait_us (GARBAGE past it
     * would be a negative wait: refused if read); a newer one has fields this library
     * ignores */
    flame_scheduler_params p = {.struct_size = sizeof p, .max_wait_us = 10, .workers = 1};
    flame_scheduler *s2;
    const size_t cut = offsetof(flame_scheduler_params, max_wait_us);
    assert_status_msg(flame_scheduler_create(e, input(&p, cut, sizeof p), &s2), FLAME_ERR_INVALID_ARG,
                      "max_wait_us"); /* (control: garbage inside the struct is refused) */
    assert_int_equal(flame_scheduler_create(e, input(&p, cut, cut), &s2), FLAME_OK);
    assert_int_equal(flame_scheduler_score(s2, &r, out, 2), FLAME_OK);
    flame_scheduler_destroy(s2);
    assert_int_equal(flame_scheduler_create(e, input(&p, sizeof p, sizeof p + TAIL), &s2), FLAME_OK);
    flame_scheduler_destroy(s2);
    assert_status_msg(flame_scheduler_create(e, input(&p, 4, 4), &s2), FLAME_ERR_INVALID_ARG,
                      "flame_scheduler_params.struct_size = 4");
    assert_null(s2);

    flame_scheduler_destroy(s);
    flame_engine_destroy(e);
    flame_model_destroy(m);
}

static void test_memory(void **state)
{
#if FLAME_WITH_NUMA /* (without libnuma flame_numa_get_info is a stand-in: test_optional_modules) */
    check_out("flame_numa_info", get_numa_info, NULL, sizeof(flame_numa_info), END(flame_numa_info, reserved0),
              offsetof(flame_numa_info, current_node)); /* (struct sizes are multiples of 8) */
#else
    (void)get_numa_info;
#endif

    /* pinned pool params: older without pin (GARBAGE would be pin -1: refused if read) */
    flame_pinned_pool_params pp = {.struct_size = sizeof pp, .numa_node = FLAME_NUMA_NODE_LOCAL, .pin = 0,
                                   .max_cached_bytes = 1 << 20};
    flame_pinned_pool *pool;
    const size_t pcut = offsetof(flame_pinned_pool_params, pin);
    assert_status_msg(flame_pinned_pool_create(input(&pp, pcut, sizeof pp), &pool), FLAME_ERR_INVALID_ARG,
                      "pin"); /* (control: garbage inside the struct is refused) */
    /* a size ending inside the 8 bytes of numa_node and pin (no header has one): refused */
    assert_status_msg(flame_pinned_pool_create(input(&pp, pcut, pcut), &pool), FLAME_ERR_INVALID_ARG,
                      "multiples of 8");
    /* older without max_cached_bytes: the default, GARBAGE not read */
    const size_t mcut = offsetof(flame_pinned_pool_params, max_cached_bytes);
    assert_int_equal(flame_pinned_pool_create(input(&pp, mcut, mcut), &pool), FLAME_OK);
    flame_pinned_pool_stats ps = {.struct_size = sizeof ps};
    assert_int_equal(flame_pinned_pool_get_stats(pool, &ps), FLAME_OK);
    flame_pinned_pool_destroy(pool);
    assert_int_equal(flame_pinned_pool_create(input(&pp, sizeof pp, sizeof pp + TAIL), &pool), FLAME_OK);
    void *buf;
    assert_int_equal(flame_pinned_alloc(pool, 5000, &buf, NULL), FLAME_OK);
    check_out("flame_pinned_pool_stats", get_pinned_stats, pool, sizeof(flame_pinned_pool_stats),
              END(flame_pinned_pool_stats, reserved0), offsetof(flame_pinned_pool_stats, hits));
    assert_int_equal(flame_pinned_free(pool, buf), FLAME_OK);
    flame_pinned_pool_destroy(pool);
}

static void test_user_cache(void **state)
{
    char name[64];
    snprintf(name, sizeof name, "/flame-test-abi-%d", (int)getpid());
    flame_user_cache_unlink(name);
    /* params: older without max_dense, mode, ttl_us (GARBAGE would be max_dense 2^32-1) */
    flame_user_cache_params up = {.struct_size = sizeof up, .capacity = 64, .num_slots = 2, .max_ids = 16};
    flame_user_cache *c;
    const size_t ucut = offsetof(flame_user_cache_params, max_dense);
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE, input(&up, ucut, sizeof up), &c),
                      FLAME_ERR_INVALID_ARG, "max_dense"); /* (control) */
    assert_int_equal(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE, input(&up, ucut, ucut), &c), FLAME_OK);
    flame_user_cache *c2; /* a newer caller attaching with the same values */
    up.mode = 0600;
    assert_int_equal(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, input(&up, sizeof up, sizeof up + TAIL), &c2),
                     FLAME_OK);
    flame_user_cache_destroy(c2);
    check_out("flame_user_cache_params", get_user_cache_params, c, sizeof(flame_user_cache_params),
              END(flame_user_cache_params, ttl_us), offsetof(flame_user_cache_params, max_dense));

    /* features, put: older without dense/num_dense (GARBAGE would be num_dense > max_dense) */
    int64_t ids[3] = {7, 8, 9};
    uint32_t lens[2] = {2, 1};
    flame_user_features f = {.struct_size = sizeof f, .ids = ids, .num_ids = 3, .slot_lens = lens};
    const size_t fcut = offsetof(flame_user_features, dense);
    assert_status_msg(flame_user_cache_put(c, 5, input(&f, fcut, sizeof f)), FLAME_ERR_INVALID_ARG, ""); /* (control) */
    assert_int_equal(flame_user_cache_put(c, 5, input(&f, fcut, fcut)), FLAME_OK);
    assert_int_equal(flame_user_cache_put(c, 6, input(&f, sizeof f, sizeof f + TAIL)), FLAME_OK);
    /* get, newer: the counts are written, the newer fields untouched */
    int64_t got_ids[16];
    uint32_t got_lens[2];
    struct {
        flame_user_features f;
        unsigned char tail[TAIL];
    } next;
    memset(&next, 0xee, sizeof next);
    next.f = (flame_user_features){.struct_size = sizeof next, .ids = got_ids, .slot_lens = got_lens,
                                   .ids_capacity = 16};
    int32_t found = 0;
    assert_int_equal(flame_user_cache_get(c, 5, &next.f, &found), FLAME_OK);
    assert_int_equal(found, 1);
    assert_int_equal(next.f.num_ids, 3);
    assert_int_equal(next.f.num_dense, 0);
    assert_int_equal(got_ids[2], 9);
    assert_int_equal(got_lens[0], 2);
    for (int i = 0; i < TAIL; i++) assert_int_equal(next.tail[i], 0xee);
    /* get, older without age_us: not written */
    flame_user_features old;
    memset(&old, 0xee, sizeof old);
    old = (flame_user_features){.struct_size = offsetof(flame_user_features, age_us), .ids = got_ids,
                                .slot_lens = got_lens, .ids_capacity = 16};
    old.age_us = -12345;
    assert_int_equal(flame_user_cache_get(c, 6, &old, &found), FLAME_OK);
    assert_int_equal(found, 1);
    assert_int_equal(old.num_ids, 3);
    assert_int_equal(old.age_us, -12345);
    assert_int_equal(old.struct_size, offsetof(flame_user_features, age_us));
    /* BUFFER_TOO_SMALL still reports the counts */
    old.ids_capacity = 1;
    assert_int_equal(flame_user_cache_get(c, 6, &old, &found), FLAME_ERR_BUFFER_TOO_SMALL);
    assert_int_equal(old.num_ids, 3);
    old.struct_size = 2;
    assert_status_msg(flame_user_cache_get(c, 6, &old, &found), FLAME_ERR_INVALID_ARG,
                      "flame_user_features.struct_size = 2");

    check_out("flame_user_cache_stats", get_user_cache_stats, c, sizeof(flame_user_cache_stats),
              END(flame_user_cache_stats, corrupt), offsetof(flame_user_cache_stats, puts));
    flame_user_cache_destroy(c);
    assert_int_equal(flame_user_cache_unlink(name), FLAME_OK);
}

static flame_status fetch_none(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    for (size_t i = 0; i < n; i++) flame_feature_batch_set_missing(out, i);
    return FLAME_OK;
}

static void test_feature_sources(void **state)
{
    flame_feature_source *src;
    flame_item_cache *ic;
    assert_int_equal(flame_feature_source_create_callback(1, fetch_none, NULL, NULL, &src), FLAME_OK);
    assert_int_equal(flame_item_cache_create(src, NULL, &ic), FLAME_OK);
    flame_feature_batch *b;
    assert_int_equal(flame_feature_batch_create(1, &b), FLAME_OK);
    int64_t ids[2] = {1, 2};
    assert_int_equal(flame_item_cache_get(ic, ids, 2, b), FLAME_OK);
    assert_int_equal(flame_item_cache_get(ic, ids, 2, b), FLAME_OK);
    check_out("flame_item_cache_stats", get_item_cache_stats, ic, sizeof(flame_item_cache_stats),
              END(flame_item_cache_stats, bytes), offsetof(flame_item_cache_stats, refreshes));
    flame_feature_batch_destroy(b);
    flame_item_cache_destroy(ic);

    /* item cache params: an older caller's struct ends before shards (GARBAGE there is more
     * than 4096 shards: refused if read); a newer one has fields this library ignores */
    flame_item_cache_params icp = {.struct_size = sizeof icp, .max_entries = 100, .manual_refresh = 1};
    const size_t icut = offsetof(flame_item_cache_params, shards);
    assert_status_msg(flame_item_cache_create(src, input(&icp, icut, sizeof icp), &ic), FLAME_ERR_INVALID_ARG,
                      "flame_item_cache_params.shards"); /* (control) */
    assert_null(ic);
    assert_int_equal(flame_item_cache_create(src, input(&icp, icut, icut), &ic), FLAME_OK);
    flame_item_cache_destroy(ic);
    assert_int_equal(flame_item_cache_create(src, input(&icp, sizeof icp, sizeof icp + TAIL), &ic), FLAME_OK);
    flame_item_cache_destroy(ic);
    assert_status_msg(flame_item_cache_create(src, input(&icp, 4, 4), &ic), FLAME_ERR_INVALID_ARG,
                      "flame_item_cache_params.struct_size = 4");
    flame_feature_source_destroy(src);

#if FLAME_WITH_REDIS /* (without hiredis the Redis source is a stand-in: test_optional_modules) */
    /* Redis options: an older caller's struct ends before num_slots (GARBAGE would be -1
     * slots: refused if read). Whether a server answers on the port is not the point: the
     * options must not be refused. */
    const char *port_env = getenv("FLAME_TEST_REDIS_PORT");
    flame_redis_options o = {.struct_size = sizeof o, .host = "127.0.0.1", .port = port_env ? atoi(port_env) : 1,
                             .key_prefix = "flame:test-abi:", .connect_timeout_ms = 50};
    const size_t rcut = offsetof(flame_redis_options, num_slots);
    assert_status_msg(flame_feature_source_create_redis(input(&o, rcut, sizeof o), &src), FLAME_ERR_INVALID_ARG,
                      "num_slots"); /* (control) */
    const size_t sizes[2] = {rcut, sizeof o + TAIL};
    for (int k = 0; k < 2; k++) {
        /* (a newer caller's struct: its own values, and a tail this library does not read) */
        flame_redis_options v = o;
        flame_status st = flame_feature_source_create_redis(input(&v, k ? sizeof v : rcut, sizes[k]), &src);
        if (st != FLAME_OK && st != FLAME_ERR_UNAVAILABLE)
            fail_msg("struct_size %zu: %s (%s)", sizes[k], flame_status_string(st), flame_last_error());
        if (st == FLAME_OK) flame_feature_source_destroy(src);
    }
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_engine_scheduler),
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_user_cache),
        cmocka_unit_test(test_feature_sources),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
