/* flame_score with a shared-memory user cache attached: a request that gives a user id and
 * candidates (history_from_user_cache = 1) scores bitwise like the same request with the
 * user's history given; side features of those histories come through the item cache; a miss
 * scores the empty history and is counted; errors write nothing; requests of an older layout
 * still score; a record written by another process is read; threads score concurrently while
 * records are rewritten. */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/wait.h>

#include "testutil.h"
#include "tu_models.h"
#include "ucache/user_cache.h"
#include "core/device.h"

/* SASRec-style dot model, no side features, window 8 */
static const char *dot_config = TU_DOT_CONFIG(100, 2, "\"input_layernorm\":true,\"layernorm\":{\"eps\":1e-12},");

/* sumi ranker with two side features, window 12 */
static const char *sumi_config = TU_SUMI_SIDE_CONFIG(100, 12, 13, gelu_tanh);

#define MAX_IDS 40 /* record bound: slot 0 (history) + slot 1 (read by nobody) */

static char name[64];

typedef struct fixture {
    flame_model *dot, *sumi;
    flame_engine *plain_dot, *dot_uc;  /* dot: no caches / user cache */
    flame_engine *plain_sumi, *sumi_uc; /* sumi: no caches / user cache + item cache */
    flame_user_cache *uc;
    flame_item_cache *ic;
} fixture;

/* item i: artist i % 20, genres {i % 5, (i + 1) % 5} for odd i, none for even */

static flame_status fetch(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)user;
    for (size_t i = 0; i < n; i++) {
        int64_t offs[3], v[3];
        tu_item_record(ids[i], offs, v);
        flame_feature_batch_set(out, i, offs, v, (size_t)offs[2], NULL, 0);
    }
    return FLAME_OK;
}

static int setup(void **state)
{
    static int k;
    tu_seed();
    snprintf(name, sizeof name, "/flame-engine-uc-%d-%d", (int)getpid(), k++);
    fixture *f = calloc(1, sizeof *f);
    flame_user_cache_params p = {.struct_size = sizeof p, .capacity = 1024, .num_slots = 2, .max_ids = MAX_IDS,
                                 .mode = 0600};
    flame_feature_source *s;
    flame_config *dot_cfg, *sumi_cfg;
    flame_item_cache_params icp = {.struct_size = sizeof icp, .manual_refresh = 1};
    /* the caching engines are given their caches at creation */
    if (flame_model_create_random(dot_config, 9, &f->dot) || flame_model_create_random(sumi_config, 3, &f->sumi) ||
        flame_engine_create(f->dot, NULL, &f->plain_dot) || flame_engine_create(f->sumi, NULL, &f->plain_sumi) ||
        flame_user_cache_open(name, FLAME_USER_CACHE_CREATE, &p, &f->uc) ||
        flame_feature_source_create_callback(2, fetch, NULL, NULL, &s) || flame_item_cache_create(s, &icp, &f->ic) ||
        flame_config_create(&dot_cfg) || flame_config_create(&sumi_cfg) ||
        flame_config_set_pointer(dot_cfg, FLAME_OPT_USER_CACHE, f->uc) ||
        flame_config_set_pointer(sumi_cfg, FLAME_OPT_USER_CACHE, f->uc) ||
        flame_config_set_pointer(sumi_cfg, FLAME_OPT_ITEM_CACHE, f->ic) ||
        flame_engine_create(f->dot, dot_cfg, &f->dot_uc) || flame_engine_create(f->sumi, sumi_cfg, &f->sumi_uc)) {
        fprintf(stderr, "setup: %s\n", flame_last_error());
        return -1;
    }
    flame_config_destroy(dot_cfg);
    flame_config_destroy(sumi_cfg);
    flame_feature_source_destroy(s);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    fl_uc_set_clock(NULL);
    flame_user_cache_destroy(f->uc); /* the engines keep theirs until they go */
    flame_item_cache_destroy(f->ic);
    flame_engine_destroy(f->plain_dot);
    flame_engine_destroy(f->dot_uc);
    flame_engine_destroy(f->plain_sumi);
    flame_engine_destroy(f->sumi_uc);
    flame_model_destroy(f->dot);
    flame_model_destroy(f->sumi);
    flame_user_cache_unlink(name);
    free(f);
    return 0;
}

/* Writes user's record: slot 0 = hist, slot 1 = `extra` ids that are no item id (never read). */
static void put_history(flame_user_cache *c, int64_t user, const int64_t *hist, size_t n, size_t extra)
{
    int64_t ids[MAX_IDS];
    assert_true(n + extra <= MAX_IDS);
    memcpy(ids, hist, n * sizeof *ids);
    for (size_t i = 0; i < extra; i++) ids[n + i] = 100000 + (int64_t)i;
    uint32_t lens[2] = {(uint32_t)n, (uint32_t)extra};
    flame_user_features f = {.struct_size = sizeof f, .ids = ids, .num_ids = n + extra, .slot_lens = lens};
    assert_int_equal(flame_user_cache_put(c, user, &f), FLAME_OK);
}

static flame_request explicit_req(int64_t user, const int64_t *h, size_t n, const int64_t *c, size_t m)
{
    return (flame_request){.struct_size = sizeof(flame_request), .user_id = user, .history = h, .history_len = n,
                           .candidates = c, .num_candidates = m};
}

static flame_request user_req(int64_t user, const int64_t *c, size_t m, size_t num_side)
{
    return (flame_request){.struct_size = sizeof(flame_request), .user_id = user, .candidates = c,
                           .num_candidates = m, .num_side_features = num_side, .history_from_user_cache = 1};
}

static flame_engine_stats stats_of(flame_engine *e)
{
    flame_engine_stats s = {.struct_size = sizeof s};
    assert_int_equal(flame_engine_get_stats(e, &s), FLAME_OK);
    return s;
}

static void random_ids(int64_t *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = tu_below(100);
}

/* Dot model: users with histories of 0, 1, 5, 8 (= max_len) and 30 (> max_len) items, alone
 * and in one batch with an explicit request; bitwise equal to the histories given. */
static void test_dot_matches_explicit_history(void **state)
{
    fixture *f = *state;
    static const size_t lens[5] = {0, 1, 5, 8, 30};
    int64_t hist[5][30], cand[5][6];
    for (int u = 0; u < 5; u++) {
        random_ids(hist[u], lens[u]);
        random_ids(cand[u], 6);
        put_history(f->uc, 1000 + u, hist[u], lens[u], u % 2 ? 3 : 0);
    }
    for (int u = 0; u < 5; u++) {
        flame_request want_r = explicit_req(1000 + u, hist[u], lens[u], cand[u], 6), got_r = user_req(1000 + u, cand[u], 6, 0);
        flame_request keep = got_r;
        float want[6], got[6];
        tu_poison(got, 6);
        assert_int_equal(flame_score(f->plain_dot, &want_r, want, 6), FLAME_OK);
        assert_int_equal(flame_score(f->dot_uc, &got_r, got, 6), FLAME_OK);
        assert_memory_equal(want, got, sizeof want);
        assert_memory_equal(&keep, &got_r, sizeof keep); /* the request is not modified */
    }
    /* one batch: the five users and an explicit request between them */
    flame_request want_b[6], got_b[6];
    int64_t h6[3] = {7, 8, 9}, c6[4] = {1, 2, 3, 4};
    for (int u = 0; u < 5; u++) {
        want_b[u < 2 ? u : u + 1] = explicit_req(1000 + u, hist[u], lens[u], cand[u], 6);
        got_b[u < 2 ? u : u + 1] = user_req(1000 + u, cand[u], 6, 0);
    }
    want_b[2] = got_b[2] = explicit_req(6, h6, 3, c6, 4);
    float want[34], got[34];
    tu_poison(got, 34);
    assert_int_equal(flame_score_batch(f->plain_dot, want_b, 6, want, 34), FLAME_OK);
    assert_int_equal(flame_score_batch(f->dot_uc, got_b, 6, got, 34), FLAME_OK);
    assert_memory_equal(want, got, sizeof want);
    flame_engine_stats s = stats_of(f->dot_uc);
    assert_int_equal(s.user_cache_hits, 10);
    assert_int_equal(s.user_cache_misses, 0);
    assert_int_equal(s.requests, 11);
    assert_int_equal(stats_of(f->plain_dot).user_cache_hits, 0);
}


/* Sumi model with side features: the history's bags (and the candidates') come through the
 * item cache; equal to the same request with every bag given on an engine without caches. */
static void test_side_features_through_item_cache(void **state)
{
    fixture *f = *state;
    static const size_t lens[3] = {4, 12, 37}; /* below, at and beyond max_len 12 */
    for (int u = 0; u < 3; u++) {
        int64_t hist[37], cand[5];
        random_ids(hist, lens[u]);
        random_ids(cand, 5);
        put_history(f->uc, -7 - u, hist, lens[u], 0);
        static tu_side_bags hb, cb;
        tu_side_bags_build(&hb, hist, lens[u], NULL);
        tu_side_bags_build(&cb, cand, 5, NULL);
        flame_request want_r = explicit_req(-7 - u, hist, lens[u], cand, 5);
        want_r.history_side = hb.b, want_r.candidate_side = cb.b, want_r.num_side_features = 2;
        flame_request got_r = user_req(-7 - u, cand, 5, 2);
        float want[10], got[10];
        tu_poison(got, 10);
        assert_int_equal(flame_score(f->plain_sumi, &want_r, want, 10), FLAME_OK);
        assert_int_equal(flame_score(f->sumi_uc, &got_r, got, 10), FLAME_OK);
        assert_memory_equal(want, got, sizeof want);
    }
    assert_int_equal(stats_of(f->sumi_uc).user_cache_hits, 3);
    /* without an item cache, a side-feature model refuses a cached history as any id-only request */
    int64_t cand[2] = {1, 2};
    flame_request r = user_req(-7, cand, 2, 2);
    float s[4];
    tu_poison(s, 4);
    assert_int_equal(flame_engine_set_item_cache(f->sumi_uc, NULL), FLAME_OK);
    assert_status_msg(flame_score(f->sumi_uc, &r, s, 4), FLAME_ERR_INVALID_ARG, "history_side is NULL");
    assert_non_null(strstr(flame_last_error(), "FLAME_OPT_ITEM_CACHE")); /* says what would help */
    /* candidate bags given with a cached history: the message blames the pair, not the flag */
    int64_t offs[3] = {0, 1, 2}, ids[2] = {1, 2};
    flame_bags cb[2] = {{offs, ids, 2}, {offs, ids, 2}};
    r.candidate_side = cb;
    assert_status_msg(flame_score(f->sumi_uc, &r, s, 4), FLAME_ERR_INVALID_ARG,
                      "history_side is NULL but candidate_side is not: give the bags of both, or of neither");
    for (int i = 0; i < 4; i++) assert_true(isnan(s[i]));
}

static int64_t fake_now;
static int64_t fake_clock(void)
{
    return fake_now;
}

/* An absent user, and one whose record expired, score exactly as an empty history; counted. */
static void test_miss_scores_empty_history(void **state)
{
    fixture *f = *state;
    int64_t cand[7] = {0, 5, 9, 50, 99, 3, 3};
    flame_request empty = explicit_req(424242, NULL, 0, cand, 7), r = user_req(424242, cand, 7, 0);
    float want[7], got[7];
    assert_int_equal(flame_score(f->plain_dot, &empty, want, 7), FLAME_OK);
    tu_poison(got, 7);
    assert_int_equal(flame_score(f->dot_uc, &r, got, 7), FLAME_OK);
    assert_memory_equal(want, got, sizeof want);
    flame_engine_stats s = stats_of(f->dot_uc);
    assert_int_equal(s.user_cache_hits, 0);
    assert_int_equal(s.user_cache_misses, 1);

    /* a table with a TTL: the record reads as a hit, then, once older than the TTL, as a miss */
    char ttl_name[80];
    snprintf(ttl_name, sizeof ttl_name, "%s-ttl", name);
    flame_user_cache_params p = {.struct_size = sizeof p, .capacity = 64, .num_slots = 1, .max_ids = 16,
                                 .mode = 0600, .ttl_us = 1000};
    flame_user_cache *ttl;
    flame_user_cache_unlink(ttl_name);
    assert_int_equal(flame_user_cache_open(ttl_name, FLAME_USER_CACHE_CREATE, &p, &ttl), FLAME_OK);
    assert_int_equal(flame_engine_set_user_cache(f->dot_uc, ttl), FLAME_OK); /* replaces the first */
    fake_now = 1000000;
    fl_uc_set_clock(fake_clock);
    int64_t h[3] = {4, 5, 6};
    uint32_t len = 3;
    flame_user_features uf = {.struct_size = sizeof uf, .ids = h, .num_ids = 3, .slot_lens = &len};
    assert_int_equal(flame_user_cache_put(ttl, 424242, &uf), FLAME_OK);
    flame_request hist = explicit_req(424242, h, 3, cand, 7);
    float with_hist[7];
    assert_int_equal(flame_score(f->plain_dot, &hist, with_hist, 7), FLAME_OK);
    assert_int_equal(flame_score(f->dot_uc, &r, got, 7), FLAME_OK);
    assert_memory_equal(with_hist, got, sizeof got);
    assert_memory_not_equal(with_hist, want, sizeof want); /* the history matters to these scores */
    fake_now += 1001;
    assert_int_equal(flame_score(f->dot_uc, &r, got, 7), FLAME_OK);
    assert_memory_equal(want, got, sizeof want);
    s = stats_of(f->dot_uc);
    assert_int_equal(s.user_cache_hits, 1);
    assert_int_equal(s.user_cache_misses, 2);
    flame_user_cache_stats us = {.struct_size = sizeof us};
    assert_int_equal(flame_user_cache_get_stats(ttl, &us), FLAME_OK);
    assert_int_equal(us.expired, 1);
    fl_uc_set_clock(NULL);
    flame_user_cache_destroy(ttl); /* the engine still holds it */
    assert_int_equal(flame_score(f->dot_uc, &r, got, 7), FLAME_OK);
    assert_int_equal(flame_engine_set_user_cache(f->dot_uc, NULL), FLAME_OK); /* the last reference */
    flame_user_cache_unlink(ttl_name);
}

/* A table whose records hold fewer ids than the model's window is legal (histories are then
 * shorter), but rarely meant: attaching it says so through the log hook. */
static char last_log[512];
static int log_lines;
static void on_log(flame_log_level level, const char *msg, void *user)
{
    (void)level, (void)user;
    snprintf(last_log, sizeof last_log, "%s", msg);
    log_lines++;
}
static void test_short_records_warn(void **state)
{
    fixture *f = *state;
    char short_name[80];
    snprintf(short_name, sizeof short_name, "%s-short", name);
    flame_user_cache_unlink(short_name);
    flame_user_cache_params p = {.struct_size = sizeof p, .capacity = 16, .max_ids = 4};
    flame_user_cache *t = NULL;
    assert_int_equal(flame_user_cache_open(short_name, FLAME_USER_CACHE_CREATE, &p, &t), FLAME_OK);
    flame_set_log_callback(on_log, NULL, FLAME_LOG_WARN);
    log_lines = 0;
    assert_int_equal(flame_engine_set_user_cache(f->plain_dot, t), FLAME_OK); /* max_len 8 */
    assert_int_equal(log_lines, 1);
    assert_non_null(strstr(last_log, "holds at most 4 ids a user, fewer than the model's window of 8"));
    assert_int_equal(flame_engine_set_user_cache(f->plain_dot, f->uc), FLAME_OK); /* MAX_IDS: enough */
    assert_int_equal(log_lines, 1);
    flame_set_log_callback(NULL, NULL, FLAME_LOG_ERROR);
    assert_int_equal(flame_engine_set_user_cache(f->plain_dot, NULL), FLAME_OK);
    flame_user_cache_destroy(t);
    flame_user_cache_unlink(short_name);
}

/* A table whose records carry dense values (not read by the engine) scores as one without. */
static void test_records_with_dense_values(void **state)
{
    fixture *f = *state;
    char dense_name[80];
    snprintf(dense_name, sizeof dense_name, "%s-dense", name);
    flame_user_cache_unlink(dense_name);
    flame_user_cache_params p = {.struct_size = sizeof p, .capacity = 16, .max_ids = 8, .max_dense = 5};
    flame_user_cache *t = NULL;
    assert_int_equal(flame_user_cache_open(dense_name, FLAME_USER_CACHE_CREATE, &p, &t), FLAME_OK);
    int64_t hist[6], cand[4];
    random_ids(hist, 6);
    random_ids(cand, 4);
    uint32_t lens[1] = {6};
    float dense[5] = {0.5f, -1.0f, 2.0f, 3.5f, 4.0f};
    flame_user_features uf = {.struct_size = sizeof uf, .ids = hist, .num_ids = 6, .slot_lens = lens, .dense = dense,
                              .num_dense = 5};
    assert_int_equal(flame_user_cache_put(t, 77, &uf), FLAME_OK);
    assert_int_equal(flame_engine_set_user_cache(f->plain_dot, t), FLAME_OK);
    flame_request want_r = explicit_req(77, hist, 6, cand, 4), got_r = user_req(77, cand, 4, 0);
    float want[4], got[4];
    tu_poison(want, 4);
    tu_poison(got, 4);
    assert_int_equal(flame_score(f->plain_dot, &want_r, want, 4), FLAME_OK);
    assert_int_equal(flame_score(f->plain_dot, &got_r, got, 4), FLAME_OK);
    assert_memory_equal(want, got, sizeof want);
    assert_int_equal(stats_of(f->plain_dot).user_cache_hits, 1);
    assert_int_equal(flame_engine_set_user_cache(f->plain_dot, NULL), FLAME_OK);
    flame_user_cache_destroy(t);
    flame_user_cache_unlink(dense_name);
}

static void test_errors_write_nothing(void **state)
{
    fixture *f = *state;
    int64_t cand[3] = {1, 2, 3}, h[2] = {4, 5};
    float s[3];
    tu_poison(s, 3);
    flame_request r = user_req(5, cand, 3, 0);
    put_history(f->uc, 5, h, 2, 0);
    /* no user cache attached */
    assert_status_msg(flame_score(f->plain_dot, &r, s, 3), FLAME_ERR_INVALID_ARG,
                      "request 0 (user 5): history_from_user_cache is 1 but the engine has no user cache");
    /* a history given too */
    flame_request both = r;
    both.history = h, both.history_len = 2;
    assert_status_msg(flame_score(f->dot_uc, &both, s, 3), FLAME_ERR_INVALID_ARG,
                      "request 0 (user 5): history_from_user_cache is 1 but the request gives a history");
    both.history = NULL, both.history_len = 0, both.history_side = (const flame_bags *)h;
    assert_status_msg(flame_score(f->dot_uc, &both, s, 3), FLAME_ERR_INVALID_ARG, "history_side set");
    flame_request two = r;
    two.history_from_user_cache = 2;
    assert_status_msg(flame_score(f->dot_uc, &two, s, 3), FLAME_ERR_INVALID_ARG,
                      "request 0: history_from_user_cache = 2, expected 0 or 1");
    /* out-of-range ids in a record, inside the window and in the oldest part outside it */
    int64_t bad[10] = {1, 2, 150, 4, 5, 6, 7, 8, 9, 10};
    put_history(f->uc, 77, bad, 4, 2);
    r.user_id = 77;
    assert_status_msg(flame_score(f->dot_uc, &r, s, 3), FLAME_ERR_INVALID_ARG,
                      "request 0: user 77's history in the user cache, position 2 of 4: item id 150 out of range [0, 100)");
    bad[2] = 3, bad[0] = -1;
    put_history(f->uc, 77, bad, 10, 0);
    assert_status_msg(flame_score(f->dot_uc, &r, s, 3), FLAME_ERR_INVALID_ARG,
                      "user 77's history in the user cache, position 0 of 10: item id -1 out of range");
    /* in a batch the message names the request index */
    flame_request pair[2] = {user_req(5, cand, 3, 0), r};
    float s2[6];
    tu_poison(s2, 6);
    assert_status_msg(flame_score_batch(f->dot_uc, pair, 2, s2, 6), FLAME_ERR_INVALID_ARG,
                      "request 1: user 77's history");
    for (int i = 0; i < 6; i++) assert_true(isnan(s2[i]));
    for (int i = 0; i < 3; i++) assert_true(isnan(s[i]));
    /* failed calls count nothing */
    flame_engine_stats st = stats_of(f->dot_uc);
    assert_int_equal(st.calls, 0);
    assert_int_equal(st.user_cache_hits + st.user_cache_misses, 0);
    /* detaching */
    assert_int_equal(flame_engine_set_user_cache(f->dot_uc, NULL), FLAME_OK);
    r.user_id = 5;
    assert_status_msg(flame_score(f->dot_uc, &r, s, 3), FLAME_ERR_INVALID_ARG, "engine has no user cache");
    assert_status_msg(flame_engine_set_user_cache(NULL, f->uc), FLAME_ERR_INVALID_ARG, "engine is NULL");
}

/* A flame_request as a caller built against an older header (one that ended at
 * num_side_features) has it. */
typedef struct request_v1 {
    size_t struct_size;
    int64_t user_id;
    const int64_t *history;
    size_t history_len;
    const int64_t *candidates;
    size_t num_candidates;
    const flame_bags *history_side;
    const flame_bags *candidate_side;
    size_t num_side_features;
} request_v1;

static void test_older_layout_callers(void **state)
{
    fixture *f = *state;
    assert_int_equal(sizeof(request_v1), offsetof(flame_request, history_from_user_cache));
    assert_true(sizeof(request_v1) < sizeof(flame_request));
    int64_t h[3][9], c[3][4];
    flame_request now[3];
    request_v1 old[3];
    for (int u = 0; u < 3; u++) {
        random_ids(h[u], 9);
        random_ids(c[u], 4);
        now[u] = explicit_req(u, h[u], (size_t)(3 * u + 1), c[u], 4);
        old[u] = (request_v1){.struct_size = sizeof(request_v1), .user_id = u, .history = h[u],
                              .history_len = (size_t)(3 * u + 1), .candidates = c[u], .num_candidates = 4};
    }
    float want[12], got[12];
    assert_int_equal(flame_score_batch(f->plain_dot, now, 3, want, 12), FLAME_OK);
    for (int k = 0; k < 2; k++) { /* with and without a user cache on the engine */
        flame_engine *e = k ? f->dot_uc : f->plain_dot;
        tu_poison(got, 12);
        assert_int_equal(flame_score_batch(e, (const flame_request *)old, 3, got, 12), FLAME_OK);
        assert_memory_equal(want, got, sizeof want);
    }
    /* one old request followed by bytes that would be an invalid flag: never read */
    float one_want[4], one_got[4];
    assert_int_equal(flame_score(f->plain_dot, &now[1], one_want, 4), FLAME_OK);
    unsigned char buf[sizeof(flame_request)];
    memset(buf, 0x5a, sizeof buf);
    memcpy(buf, &old[1], sizeof old[1]);
    tu_poison(one_got, 4);
    assert_int_equal(flame_score(f->dot_uc, (const flame_request *)buf, one_got, 4), FLAME_OK);
    assert_memory_equal(one_want, one_got, sizeof one_want);
    /* elements of one array from different headers: refused, naming the request and both sizes */
    old[2].struct_size = sizeof(flame_request);
    tu_poison(got, 12);
    char mixed[128];
    snprintf(mixed, sizeof mixed, "request 2: struct_size = %zu, but the array's elements are 72 bytes apart",
             sizeof(flame_request));
    assert_status_msg(flame_score_batch(f->dot_uc, (const flame_request *)old, 3, got, 12), FLAME_ERR_INVALID_ARG,
                      mixed);
    for (int i = 0; i < 12; i++) assert_true(isnan(got[i]));
    /* sizes no header has: misaligned elements, shorter than the struct_size field */
    old[0].struct_size = sizeof(request_v1) - 4;
    assert_status_msg(flame_score_batch(f->dot_uc, (const flame_request *)old, 3, got, 12), FLAME_ERR_INVALID_ARG,
                      "flame_request.struct_size = 68: set it to sizeof(flame_request)");
    old[0].struct_size = 4;
    snprintf(mixed, sizeof mixed, "flame_request.struct_size = 4: set it to sizeof(flame_request) (%zu in this library",
             sizeof(flame_request));
    assert_status_msg(flame_score(f->dot_uc, (const flame_request *)old, got, 12), FLAME_ERR_INVALID_ARG, mixed);
    /* an old-layout stats struct gets the fields it knows */
    flame_engine_stats st;
    memset(&st, 0xee, sizeof st);
    st.struct_size = offsetof(flame_engine_stats, user_cache_hits);
    assert_int_equal(flame_engine_get_stats(f->dot_uc, &st), FLAME_OK);
    assert_int_equal(st.calls, 2);
    assert_int_equal(st.user_cache_hits, 0xeeeeeeeeeeeeeeeeull);
}

/* A flame_request from a newer header: this layout plus fields this library does not know. */
typedef struct request_next {
    flame_request base;
    int64_t unknown[3];
} request_next;

static void test_newer_layout_callers(void **state)
{
    fixture *f = *state;
    int64_t h[3][9], c[3][4];
    flame_request now[3];
    request_next next[3];
    memset(next, 0x5a, sizeof next); /* the unknown fields hold garbage: never read */
    for (int u = 0; u < 3; u++) {
        random_ids(h[u], 9);
        random_ids(c[u], 4);
        now[u] = explicit_req(u, h[u], (size_t)(2 * u + 3), c[u], 4);
        next[u].base = now[u];
        next[u].base.struct_size = sizeof(request_next);
    }
    float want[12], got[12];
    assert_int_equal(flame_score_batch(f->plain_dot, now, 3, want, 12), FLAME_OK);
    for (int k = 0; k < 2; k++) { /* stepped through by the caller's element size */
        tu_poison(got, 12);
        assert_int_equal(flame_score_batch(k ? f->dot_uc : f->plain_dot, &next[0].base, 3, got, 12), FLAME_OK);
        assert_memory_equal(want, got, sizeof want);
    }
    /* sizes no header has: refused before anything is read past request 0 (too large, not a
     * multiple of the alignment) */
    const size_t bad[] = {5000, sizeof(request_next) + 4, sizeof(flame_request) - 4};
    for (int k = 0; k < 3; k++) {
        next[0].base.struct_size = bad[k];
        tu_poison(got, 12);
        assert_status_msg(flame_score_batch(f->plain_dot, &next[0].base, 3, got, 12), FLAME_ERR_INVALID_ARG,
                          k ? "multiples of 8 in 8..4096 accepted" : "struct_size = 5000: set it to sizeof(flame_request)");
        for (int i = 0; i < 12; i++) assert_true(isnan(got[i]));
    }
}

/* A second process writes a user's record; this one scores it. */
static void test_record_from_another_process(void **state)
{
    fixture *f = *state;
    int64_t hist[11], cand[4] = {10, 20, 30, 40};
    random_ids(hist, 11);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        flame_user_cache *c;
        if (flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &c)) _exit(2);
        int64_t ids[11];
        memcpy(ids, hist, sizeof ids);
        uint32_t lens[2] = {11, 0};
        flame_user_features uf = {.struct_size = sizeof uf, .ids = ids, .num_ids = 11, .slot_lens = lens};
        flame_status st = flame_user_cache_put(c, 31337, &uf);
        flame_user_cache_destroy(c);
        _exit(st == FLAME_OK ? 0 : 3);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    flame_request want_r = explicit_req(31337, hist, 11, cand, 4), r = user_req(31337, cand, 4, 0);
    float want[4], got[4];
    tu_poison(got, 4);
    assert_int_equal(flame_score(f->plain_dot, &want_r, want, 4), FLAME_OK);
    assert_int_equal(flame_score(f->dot_uc, &r, got, 4), FLAME_OK);
    assert_memory_equal(want, got, sizeof want);
    assert_int_equal(stats_of(f->dot_uc).user_cache_hits, 1);
}

/* Threads score their own users through one engine while a writer flips one shared user's
 * record between two histories: every score is one of the expected ones, bitwise. The flipped
 * user's expected scores are taken per partner request: the pass's token count (both
 * histories) can change the BLAS kernel's accumulation order (OpenBLAS's small-matrix
 * kernels), so they are bitwise equal only within the same batch shape. */
#define THREADS 4
#define USERS 4 /* per thread */
#define ROUNDS 60
typedef struct shared {
    fixture *f;
    int64_t hist[THREADS * USERS][20], cand[6];
    size_t len[THREADS * USERS];
    float want[THREADS * USERS][6];
    int64_t flip[2][9];
    float flip_want[THREADS * USERS][2][6]; /* [partner user][record] */
    atomic_int stop, bad, flips_seen[2];
} shared;
typedef struct worker {
    shared *s;
    int t;
} worker;

static void *scorer(void *arg)
{
    worker *w = arg;
    shared *s = w->s;
    for (int k = 0; k < ROUNDS; k++) {
        int u = w->t * USERS + k % USERS;
        flame_request r[2] = {user_req(u, s->cand, 6, 0), user_req(9999, s->cand, 6, 0)};
        float got[12];
        if (flame_score_batch(s->f->dot_uc, r, 2, got, 12) != FLAME_OK) {
            atomic_fetch_add(&s->bad, 1);
            continue;
        }
        if (memcmp(got, s->want[u], sizeof s->want[u])) atomic_fetch_add(&s->bad, 1);
        int which = !memcmp(got + 6, s->flip_want[u][0], 6 * sizeof(float)) ? 0
                    : !memcmp(got + 6, s->flip_want[u][1], 6 * sizeof(float)) ? 1 : -1;
        if (which < 0)
            atomic_fetch_add(&s->bad, 1);
        else
            atomic_fetch_add(&s->flips_seen[which], 1);
    }
    return NULL;
}

static void *flipper(void *arg)
{
    shared *s = arg;
    for (uint64_t v = 0; !atomic_load(&s->stop); v++) {
        put_history(s->f->uc, 9999, s->flip[v & 1], 9, 0);
        if (v % 16 == 15) sched_yield();
    }
    return NULL;
}

static void test_threads_score_concurrently(void **state)
{
    static shared s;
    memset(&s, 0, sizeof s);
    s.f = *state;
    random_ids(s.cand, 6);
    for (int u = 0; u < THREADS * USERS; u++) {
        s.len[u] = (size_t)tu_below(21);
        random_ids(s.hist[u], s.len[u]);
        put_history(s.f->uc, u, s.hist[u], s.len[u], (size_t)u % 3);
    }
    for (int k = 0; k < 2; k++) random_ids(s.flip[k], 9);
    s.flip[1][8] = (s.flip[0][8] + 1) % 100; /* different newest items: different scores */
    /* expected: each request alone in a batch of two as the threads send them */
    for (int u = 0; u < THREADS * USERS; u++)
        for (int k = 0; k < 2; k++) {
            flame_request r[2] = {explicit_req(u, s.hist[u], s.len[u], s.cand, 6),
                                  explicit_req(9999, s.flip[k], 9, s.cand, 6)};
            float got[12];
            assert_int_equal(flame_score_batch(s.f->plain_dot, r, 2, got, 12), FLAME_OK);
            memcpy(s.want[u], got, sizeof s.want[u]);
            memcpy(s.flip_want[u][k], got + 6, sizeof s.flip_want[u][k]);
            assert_true(k == 0 || memcmp(s.flip_want[u][0], s.flip_want[u][1], sizeof s.flip_want[u][0]));
        }
    put_history(s.f->uc, 9999, s.flip[0], 9, 0);
    pthread_t tw, tr[THREADS];
    worker w[THREADS];
    pthread_create(&tw, NULL, flipper, &s);
    for (int t = 0; t < THREADS; t++) {
        w[t] = (worker){&s, t};
        pthread_create(&tr[t], NULL, scorer, &w[t]);
    }
    for (int t = 0; t < THREADS; t++) pthread_join(tr[t], NULL);
    atomic_store(&s.stop, 1);
    pthread_join(tw, NULL);
    assert_int_equal(atomic_load(&s.bad), 0);
    assert_int_equal(atomic_load(&s.flips_seen[0]) + atomic_load(&s.flips_seen[1]), THREADS * ROUNDS);
    flame_engine_stats st = stats_of(s.f->dot_uc);
    assert_int_equal(st.user_cache_hits, 2 * THREADS * ROUNDS);
    assert_int_equal(st.user_cache_misses, 0);
    assert_true(st.workspaces <= THREADS);
}

/* The GPU forward reads the resolved requests too: a GPU engine with both caches scores the
 * user-cache requests as the same histories given (fp32). Skipped without a GPU. */
static void test_gpu_engine(void **state)
{
    fixture *f = *state;
    char why[256] = "";
    if (fl_cuda_device_count(why, sizeof why) <= 0) {
        if (getenv("FLAME_REQUIRE_GPU")) fail_msg("FLAME_REQUIRE_GPU is set but %s", why);
        fprintf(stderr, "# GPU case skipped: %s\n", why);
        skip();
    }
    flame_config *cfg;
    flame_engine *gd, *gs;
    assert_int_equal(flame_config_create(&cfg), FLAME_OK);
    assert_int_equal(flame_config_set_string(cfg, FLAME_OPT_DEVICE, "cuda"), FLAME_OK);
    assert_int_equal(flame_config_set_pointer(cfg, FLAME_OPT_USER_CACHE, f->uc), FLAME_OK);
    assert_int_equal(flame_engine_create(f->dot, cfg, &gd), FLAME_OK);
    assert_int_equal(flame_config_set_pointer(cfg, FLAME_OPT_ITEM_CACHE, f->ic), FLAME_OK);
    assert_int_equal(flame_engine_create(f->sumi, cfg, &gs), FLAME_OK);
    flame_config_destroy(cfg);
    int64_t hist[3][30], cand[3][5];
    const size_t lens[3] = {3, 12, 30};
    flame_request want_d[3], got_d[3], want_s[3], got_s[3];
    for (int u = 0; u < 3; u++) {
        random_ids(hist[u], lens[u]);
        random_ids(cand[u], 5);
        put_history(f->uc, 500 + u, hist[u], lens[u], 1);
        want_d[u] = explicit_req(500 + u, hist[u], lens[u], cand[u], 5);
        want_s[u] = want_d[u];
        want_s[u].num_side_features = 2; /* id-only: bags through the item cache */
        got_d[u] = user_req(500 + u, cand[u], 5, 0);
        got_s[u] = user_req(500 + u, cand[u], 5, 2);
    }
    float want[30], got[30];
    double want64[30];
    for (int k = 0; k < 2; k++) {
        flame_engine *e = k ? gs : gd;
        size_t n = k ? 30 : 15;
        tu_poison(got, 30);
        assert_int_equal(flame_score_batch(e, k ? want_s : want_d, 3, want, n), FLAME_OK);
        assert_int_equal(flame_score_batch(e, k ? got_s : got_d, 3, got, n), FLAME_OK);
        for (size_t i = 0; i < n; i++) want64[i] = want[i];
        assert_rel_err_below(got, want64, n, 1e-6);
    }
    assert_int_equal(stats_of(gd).user_cache_hits, 3);
    assert_int_equal(stats_of(gs).user_cache_hits, 3);
    flame_engine_destroy(gd);
    flame_engine_destroy(gs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_dot_matches_explicit_history, setup, teardown),
        cmocka_unit_test_setup_teardown(test_side_features_through_item_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_miss_scores_empty_history, setup, teardown),
        cmocka_unit_test_setup_teardown(test_short_records_warn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_records_with_dense_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors_write_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_older_layout_callers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_newer_layout_callers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_record_from_another_process, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads_score_concurrently, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gpu_engine, setup, teardown),
    };
    return cmocka_run_group_tests_name("engine_user_cache", tests, NULL, NULL);
}
