/* Batch profiles (FLAME_OPT_BATCH_PROFILES): parsing and routing on every machine; on a GPU,
 * padded passes against unpadded ones and the CPU engine (fp32 < 1e-5, fp16 < 1e-2 normwise
 * relative error), the same bits on every replay of a profile whatever ran before it, no new
 * graph captures once each profile ran twice, device top-k, and a scheduler handing its
 * profiles to the engine. Outputs are poisoned before each run. GPU cases skip with a message
 * where no GPU is usable (FLAME_REQUIRE_GPU=1 makes that a failure). */
#include "testutil.h"
#include "tu_gpu.h"
#include "tu_models.h"
#include "tu_requests.h"

#include "core/common.h"
#include "engine/batch_profiles.h"

/* the sumi ranker with two multi-id side features; history window 24 */
static const char *small_cfg = TU_SUMI_SIDE_CONFIG(500, 24, 25, gelu_erf);
/* wide enough for the Hopper attention kernel in the encoder blocks (head dim 64, 4 heads,
 * 2,560 tokens a pass of its profile) */
static const char *wide_cfg =
    "{\"format\":\"flame\",\"version\":1,\"d_model\":256,\"max_len\":256,"
    "\"tables\":[{\"name\":\"item\",\"rows\":5000,\"dim\":256}],"
    "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
    "\"position\":{\"rule\":\"from_recent\",\"rows\":257,\"candidate_position\":256},"
    "\"blocks\":{\"count\":2,\"num_heads\":4,\"ffn_dim\":512,\"norm\":\"pre\",\"activation\":\"gelu_erf\"},"
    "\"final_layernorm\":true,"
    "\"head\":{\"type\":\"sumi\",\"tasks\":[{\"name\":\"a\",\"hidden\":[32]},{\"name\":\"b\",\"hidden\":[]}]}}";

/* ---------------------------------------------------------------- parsing and routing */

static void expect_bad(const char *value, const char *needle)
{
    flame_config *c = NULL;
    assert_int_equal(flame_config_create(&c), FLAME_OK);
    assert_int_equal(flame_config_set_string(c, FLAME_OPT_BATCH_PROFILES, "2x8"), FLAME_OK);
    if (flame_config_set_string(c, FLAME_OPT_BATCH_PROFILES, value) != FLAME_ERR_INVALID_ARG)
        fail_msg("'%s' was accepted", value);
    if (!strstr(flame_last_error(), needle)) fail_msg("'%s': message '%s' lacks '%s'", value, flame_last_error(), needle);
    char buf[64];
    assert_int_equal(flame_config_get_string(c, FLAME_OPT_BATCH_PROFILES, buf, sizeof buf, NULL), FLAME_OK);
    assert_string_equal(buf, "2x8"); /* unchanged on failure */
    flame_config_destroy(c);
}

static void test_parse(void **state)
{
    (void)state;
    fl_batch_profiles ps;
    assert_int_equal(fl_batch_profiles_parse("16x128,8x256x1024,1x1x1", &ps), FLAME_OK);
    assert_int_equal(ps.n, 3);
    assert_int_equal(ps.p[0].users, 16);
    assert_int_equal(ps.p[0].candidates, 128);
    assert_int_equal(ps.p[0].history, 0);
    assert_int_equal(ps.p[1].users, 8);
    assert_int_equal(ps.p[1].candidates, 256);
    assert_int_equal(ps.p[1].history, 1024);
    assert_int_equal(ps.p[2].history, 1);
    assert_int_equal(fl_batch_profiles_parse("", &ps), FLAME_OK);
    assert_int_equal(ps.n, 0);
    assert_int_equal(fl_batch_profiles_parse("65536x16777216x16777216", &ps), FLAME_OK);

    flame_config *c = NULL;
    assert_int_equal(flame_config_create(&c), FLAME_OK);
    char buf[64];
    assert_int_equal(flame_config_get_string(c, FLAME_OPT_BATCH_PROFILES, buf, sizeof buf, NULL), FLAME_OK);
    assert_string_equal(buf, ""); /* none by default */
    assert_int_equal(flame_config_set_string(c, FLAME_OPT_BATCH_PROFILES, "4x64x32,1x128"), FLAME_OK);
    assert_int_equal(flame_config_get_string(c, FLAME_OPT_BATCH_PROFILES, buf, sizeof buf, NULL), FLAME_OK);
    assert_string_equal(buf, "4x64x32,1x128");
    flame_config_destroy(c);

    expect_bad("0x5", "profile 0 '0x5'");
    expect_bad("4x8,4", "profile 1 '4'");
    expect_bad("4x8,4x", "profile 1 '4x'");
    expect_bad("4x8x", "profile 0 '4x8x'");
    expect_bad("4x8,", "ends with a comma");
    expect_bad("65537x1", "users 1..65536");
    expect_bad("1x16777217", "profile 0");
    expect_bad("1x8x0", "profile 0");
    expect_bad("1x8y2", "profile 0");
    expect_bad("-1x8", "profile 0");
    expect_bad("1x1,1x1,1x1,1x1,1x1,1x1,1x1,1x1,1x1,1x1,1x1,1x1,1x1,1x1,1x1,1x1,1x1", "more than 16");
}

static flame_request req(size_t history, size_t candidates)
{
    return (flame_request){.struct_size = sizeof(flame_request), .history_len = history, .num_candidates = candidates};
}

static void test_route(void **state)
{
    (void)state;
    fl_batch_profiles ps;
    assert_int_equal(fl_batch_profiles_parse("1x128,4x64x32,8x32,2x512x64", &ps), FLAME_OK);
    fl_batch_profile sh;
    flame_request r[9];
    /* one user, 100 candidates, history 20 (bucket 32): 1x128 at 1 x (32 + 128) = 160 tokens
     * against 4x64x32 at 384 */
    r[0] = req(20, 100);
    assert_true(fl_batch_profile_route(&ps, 1000, r, 1, &sh));
    assert_int_equal(sh.users, 1);
    assert_int_equal(sh.candidates, 128);
    assert_int_equal(sh.history, 32);
    /* 3 users of 40 candidates, history up to 30: 4x64x32 (384 tokens) against 8x32 (no: 40
     * candidates) and 2x512x64 (no: 3 users) */
    r[0] = req(5, 10), r[1] = req(30, 40), r[2] = req(0, 1);
    assert_true(fl_batch_profile_route(&ps, 1000, r, 3, &sh));
    assert_int_equal(sh.users, 4);
    assert_int_equal(sh.candidates, 64);
    assert_int_equal(sh.history, 32);
    /* a history of 33 outgrows 4x64x32; 2x512x64 takes it only with 2 users */
    r[1] = req(33, 40);
    assert_false(fl_batch_profile_route(&ps, 1000, r, 3, &sh));
    assert_true(fl_batch_profile_route(&ps, 1000, r, 2, &sh));
    assert_int_equal(sh.users, 2);
    assert_int_equal(sh.history, 64);
    /* the window, not the history, counts: max_len 32 caps a history of 33 */
    assert_true(fl_batch_profile_route(&ps, 32, r, 3, &sh));
    assert_int_equal(sh.users, 4);
    assert_int_equal(sh.history, 32);
    /* buckets: at least 16, powers of two, at most max_len */
    r[0] = req(0, 1);
    assert_true(fl_batch_profile_route(&ps, 1000, r, 1, &sh));
    assert_int_equal(sh.history, 16);
    r[0] = req(600, 1);
    assert_true(fl_batch_profile_route(&ps, 1000, r, 1, &sh));
    assert_int_equal(sh.history, 1000);
    /* too many users or candidates for every profile */
    for (int i = 0; i < 9; i++) r[i] = req(1, 1);
    assert_false(fl_batch_profile_route(&ps, 1000, r, 9, &sh));
    r[0] = req(1, 513);
    assert_false(fl_batch_profile_route(&ps, 1000, r, 1, &sh));
    /* no profiles */
    fl_batch_profiles none = {0};
    assert_false(fl_batch_profile_route(&none, 1000, r, 1, &sh));
    assert_false(fl_batch_profile_route(NULL, 1000, r, 1, &sh));
}

/* The power-of-two buckets of padded shapes: profile histories start at 16, the side ids'
 * capacities at 1; a value on a power of two stays, one past it doubles. */
static void test_pow2_buckets(void **state)
{
    (void)state;
    const int64_t big = (int64_t)1 << 40;
    const int64_t cases[][3] = {
        /* v, least, want */
        {0, 1, 1}, {1, 1, 1}, {2, 1, 2}, {3, 1, 4}, {5, 1, 8}, {big, 1, big},
        {0, 16, 16}, {16, 16, 16}, {17, 16, 32}, {1000, 16, 1024}, {big + 1, 16, 2 * big},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        if (fl_pow2_at_least(cases[i][0], cases[i][1]) != cases[i][2])
            fail_msg("fl_pow2_at_least(%lld, %lld) = %lld, want %lld", (long long)cases[i][0], (long long)cases[i][1],
                     (long long)fl_pow2_at_least(cases[i][0], cases[i][1]), (long long)cases[i][2]);
}

/* ---------------------------------------------------------------- requests */

typedef tu_batch batch;

/* Requests: histories 0..hist_max (the window truncates), candidates 1..cand_max (random
 * ids), side bags of 0..3 ids when the model has side features. */
static void make_batch_full(batch *b, flame_model *m, size_t users, size_t hist_max, size_t cand_max, bool full)
{
    static const int64_t side_rows[2] = {20, 5}; /* the side tables of TU_SUMI_SIDE_CONFIG */
    const tu_batch_spec spec = {
        .users = users, .hist_max = hist_max, .cand_max = cand_max, .full = full, .side_rows = side_rows};
    tu_make_batch(b, m, &spec);
}

/* n_users random requests (make_batch_full with every length at its bound and every bag of
 * 3 ids when full). */
static void make_batch(batch *b, flame_model *m, size_t users, size_t hist_max, size_t cand_max)
{
    make_batch_full(b, m, users, hist_max, cand_max, false);
}

static void free_batch(batch *b)
{
    tu_batch_free(b);
}

static flame_engine *engine(flame_model *m, const char *device, const char *dtype, const char *profiles)
{
    flame_config *c = NULL;
    flame_engine *e = NULL;
    assert_int_equal(flame_config_create(&c), FLAME_OK);
    assert_int_equal(flame_config_set_string(c, FLAME_OPT_DEVICE, device), FLAME_OK);
    assert_int_equal(flame_config_set_string(c, FLAME_OPT_DTYPE, dtype), FLAME_OK);
    if (profiles) assert_int_equal(flame_config_set_string(c, FLAME_OPT_BATCH_PROFILES, profiles), FLAME_OK);
    if (flame_engine_create(m, c, &e)) fail_msg("%s engine (%s): %s", device, dtype, flame_last_error());
    flame_config_destroy(c);
    return e;
}

static flame_engine_stats stats(flame_engine *e)
{
    flame_engine_stats s = {.struct_size = sizeof s};
    assert_int_equal(flame_engine_get_stats(e, &s), FLAME_OK);
    return s;
}

/* Scores b on e into a fresh poisoned buffer (one float past the end stays NaN). */
static float *score(flame_engine *e, const batch *b, size_t users)
{
    float *out = malloc((b->total + 1) * sizeof(float));
    tu_poison(out, b->total + 1);
    if (flame_score_batch(e, b->req, users, out, b->total)) fail_msg("flame_score_batch: %s", flame_last_error());
    assert_true(isnan(out[b->total]));
    for (size_t i = 0; i < b->total; i++)
        if (!isfinite(out[i])) fail_msg("score %zu is %g", i, out[i]);
    return out;
}

static void expect_close(const float *got, const float *want, size_t n, double tol, const char *what)
{
    double *ref = malloc((n + 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) ref[i] = want[i];
    const double err = tu_rel_err(got, ref, n);
    fprintf(stderr, "# %s: %zu scores, relative error %.2e\n", what, n, err);
    if (!(err < tol)) fail_msg("%s: relative error %.3g >= %.3g", what, err, tol);
    free(ref);
}

/* ---------------------------------------------------------------- GPU */

/* Padded passes (several profiles, ragged users) against the same engine without profiles and
 * the CPU engine. */
static void check_padded(const char *cfg, const char *dtype, double tol, const char *profiles, size_t max_users,
                         size_t hist_max, size_t cand_max, int reps)
{
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(cfg, 7, &m), FLAME_OK);
    flame_engine *cpu = engine(m, "cpu", "fp32", NULL), *plain = engine(m, "cuda", dtype, NULL),
                 *padded = engine(m, "cuda", dtype, profiles);
    for (int rep = 0; rep < reps; rep++) {
        batch b;
        const size_t users = 1 + (size_t)tu_below((int64_t)max_users);
        make_batch(&b, m, users, hist_max, cand_max);
        const uint64_t before = stats(padded).profile_passes;
        float *want = score(cpu, &b, users), *ref = score(plain, &b, users), *got = score(padded, &b, users);
        if (stats(padded).profile_passes != before + 1) fail_msg("rep %d (%zu users): the pass was not padded", rep, users);
        char what[96];
        snprintf(what, sizeof what, "%s, %zu users, padded against unpadded", dtype, users);
        expect_close(got, ref, b.total, tol, what);
        snprintf(what, sizeof what, "%s, %zu users, padded against the CPU", dtype, users);
        expect_close(got, want, b.total, tol, what);
        free(want);
        free(ref);
        free(got);
        free_batch(&b);
    }
    assert_int_equal(stats(plain).profile_passes, 0);
    assert_true(stats(padded).profile_padding_tokens > 0);
    flame_engine_destroy(padded);
    flame_engine_destroy(plain);
    flame_engine_destroy(cpu);
    flame_model_destroy(m);
}

static void test_padded_matches_fp32(void **state)
{
    (void)state;
    TU_NEED_GPU();
    check_padded(small_cfg, "fp32", 1e-5, "1x16x8,2x32,4x48x32", 4, 36, 48, 12);
}

static void test_padded_matches_fp16(void **state)
{
    (void)state;
    TU_NEED_GPU();
    check_padded(small_cfg, "fp16", 1e-2, "1x16x8,2x32,4x48x32", 4, 36, 48, 6);
}

static void test_padded_wide_model(void **state)
{
    (void)state;
    TU_NEED_GPU();
    check_padded(wide_cfg, "fp16", 1e-2, "8x64x256", 8, 300, 64, 4);
}

/* The same bits on every run of a batch of its profile (eager, captured, replayed), after a
 * larger batch of the same profile too; captures stop once the profile has run twice at its
 * largest content. */
static void test_replay_bitwise(void **state)
{
    (void)state;
    TU_NEED_GPU();
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(small_cfg, 11, &m), FLAME_OK);
    flame_engine *e = engine(m, "cuda", "fp16", "4x48x32");
    batch small, large;
    make_batch(&small, m, 2, 10, 8);
    /* the profile's largest content: 4 windows of 24 items, 48 candidates, 3 ids a bag (the
     * side ids' capacity only grows, and settles here) */
    make_batch_full(&large, m, 4, 24, 48, true);
    float *first = score(e, &small, 2);
    for (int i = 0; i < 3; i++) {
        float *again = score(e, &small, 2);
        if (memcmp(first, again, small.total * sizeof(float))) fail_msg("run %d of the small batch differs", i + 2);
        free(again);
        float *big = score(e, &large, 4);
        free(big);
    }
    const flame_engine_stats warm = stats(e);
    assert_true(warm.graph_replays > 0);
    float *after = score(e, &small, 2);
    if (memcmp(first, after, small.total * sizeof(float))) fail_msg("the small batch after a larger one differs");
    /* other lengths and user counts of the same profile: replays only */
    for (int i = 0; i < 10; i++) {
        batch b;
        const size_t users = 1 + (size_t)tu_below(4);
        make_batch(&b, m, users, 40, 48);
        free(score(e, &b, users));
        free_batch(&b);
    }
    const flame_engine_stats end = stats(e);
    assert_int_equal(end.graph_captures, warm.graph_captures);
    assert_int_equal(end.graph_replays, warm.graph_replays + 11);
    assert_int_equal(end.profile_passes, warm.profile_passes + 11);
    free(first);
    free(after);
    free_batch(&small);
    free_batch(&large);
    flame_engine_destroy(e);
    flame_model_destroy(m);
}

/* flame_score_batch_topk on padded passes: the same ids and scores as without profiles. */
static void test_topk_padded(void **state)
{
    (void)state;
    TU_NEED_GPU();
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(small_cfg, 13, &m), FLAME_OK);
    flame_engine *plain = engine(m, "cuda", "fp32", NULL), *padded = engine(m, "cuda", "fp32", "4x48x32");
    enum { K = 5 };
    for (int rep = 0; rep < 4; rep++) {
        batch b;
        make_batch(&b, m, 3, 30, 48);
        int64_t ids[2][3 * K];
        float sc[2][3 * K];
        for (int i = 0; i < 2; i++) {
            tu_poison(sc[i], 3 * K);
            if (flame_score_batch_topk(i ? padded : plain, b.req, 3, K, 1, ids[i], sc[i], 3 * K))
                fail_msg("topk: %s", flame_last_error());
        }
        for (int j = 0; j < 3 * K; j++) {
            assert_int_equal(ids[1][j], ids[0][j]);
            if (ids[0][j] >= 0 && !(fabsf(sc[1][j] - sc[0][j]) <= 1e-5f * (1 + fabsf(sc[0][j]))))
                fail_msg("rep %d, entry %d: %g against %g", rep, j, sc[1][j], sc[0][j]);
        }
        free_batch(&b);
    }
    assert_true(stats(padded).profile_passes >= 4);
    flame_engine_destroy(padded);
    flame_engine_destroy(plain);
    flame_model_destroy(m);
}

static void assert_profile(const fl_batch_profile *p, int32_t users, int32_t candidates)
{
    assert_int_equal(p->users, users);
    assert_int_equal(p->candidates, candidates);
    assert_int_equal(p->history, 0);
}

/* A scheduler's profiles first, then power-of-two user ladders below each, smallest rung of
 * every profile first, no duplicates, at most FL_MAX_BATCH_PROFILES. */
static void test_scheduler_ladder(void **state)
{
    (void)state;
    fl_batch_profiles ps;
    const flame_batch_profile three[] = {{16, 128}, {8, 256}, {4, 512}};
    fl_batch_profiles_for_scheduler(three, 3, &ps);
    assert_int_equal(ps.n, 3 + 4 + 3 + 2);
    assert_profile(&ps.p[0], 16, 128);
    assert_profile(&ps.p[1], 8, 256);
    assert_profile(&ps.p[2], 4, 512);
    assert_profile(&ps.p[3], 1, 128);
    assert_profile(&ps.p[4], 1, 256);
    assert_profile(&ps.p[5], 1, 512);
    assert_profile(&ps.p[6], 2, 128);
    assert_profile(&ps.p[9], 4, 128);
    assert_profile(&ps.p[10], 4, 256);
    assert_profile(&ps.p[11], 8, 128);
    /* a lone request of 100 candidates routes to 1x128 */
    flame_request r = req(10, 100);
    fl_batch_profile sh;
    assert_true(fl_batch_profile_route(&ps, 64, &r, 1, &sh));
    assert_int_equal(sh.users, 1);
    assert_int_equal(sh.candidates, 128);
    /* one profile of 1 user: nothing to add; a duplicate profile is held once */
    const flame_batch_profile dup[] = {{1, 64}, {1, 64}, {3, 64}};
    fl_batch_profiles_for_scheduler(dup, 3, &ps);
    assert_int_equal(ps.n, 3);
    assert_profile(&ps.p[0], 1, 64);
    assert_profile(&ps.p[1], 3, 64);
    assert_profile(&ps.p[2], 2, 64);
    /* many profiles: the scheduler's own come first, the ladder fills what is left */
    flame_batch_profile many[12];
    for (int i = 0; i < 12; i++) many[i] = (flame_batch_profile){64, (uint32_t)(i + 1)};
    fl_batch_profiles_for_scheduler(many, 12, &ps);
    assert_int_equal(ps.n, FL_MAX_BATCH_PROFILES);
    for (int i = 0; i < 12; i++) assert_profile(&ps.p[i], 64, i + 1);
    for (int i = 12; i < 16; i++) assert_profile(&ps.p[i], 1, i - 11);
}

/* A scheduler created on a GPU engine without profiles gives it its own; an engine with
 * profiles keeps them; a CPU engine has none to take. */
static void test_scheduler_gives_profiles(void **state)
{
    (void)state;
    TU_NEED_GPU();
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(small_cfg, 17, &m), FLAME_OK);
    flame_engine *e = engine(m, "cuda", "fp32", NULL);
    batch b;
    make_batch(&b, m, 3, 30, 40);
    free(score(e, &b, 3));
    assert_int_equal(stats(e).profile_passes, 0);
    const flame_batch_profile prof[] = {{4, 48}};
    flame_scheduler_params sp = {.struct_size = sizeof sp, .profiles = prof, .num_profiles = 1};
    flame_scheduler *s = NULL;
    assert_int_equal(flame_scheduler_create(e, &sp, &s), FLAME_OK);
    free(score(e, &b, 3));
    assert_int_equal(stats(e).profile_passes, 1);
    /* a lone request runs on the ladder's 1x48, not padded to 4 users: a 20-item history is
     * bucketed to 32, capped at max_len 24, so 1 x (24 + 48) tokens hold 20 + 40 */
    batch one;
    make_batch_full(&one, m, 1, 20, 40, true);
    const uint64_t pad = stats(e).profile_padding_tokens;
    free(score(e, &one, 1));
    assert_int_equal(stats(e).profile_passes, 2);
    assert_int_equal(stats(e).profile_padding_tokens - pad, (24 + 48) - (20 + 40));
    free_batch(&one);
    flame_scheduler_destroy(s);
    /* an engine's own profiles stay: 1x8 holds none of these batches */
    flame_engine *own = engine(m, "cuda", "fp32", "1x8");
    assert_int_equal(flame_scheduler_create(own, &sp, &s), FLAME_OK);
    free(score(own, &b, 3));
    assert_int_equal(stats(own).profile_passes, 0);
    flame_scheduler_destroy(s);
    flame_engine_destroy(own);
    free_batch(&b);
    flame_engine_destroy(e);
    flame_model_destroy(m);
}

/* A CPU engine takes the option and scores as without it. */
static void test_cpu_ignores_profiles(void **state)
{
    (void)state;
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(small_cfg, 19, &m), FLAME_OK);
    flame_engine *a = engine(m, "cpu", "fp32", NULL), *b2 = engine(m, "cpu", "fp32", "4x48x32");
    batch b;
    make_batch(&b, m, 3, 30, 40);
    float *x = score(a, &b, 3), *y = score(b2, &b, 3);
    assert_memory_equal(x, y, b.total * sizeof(float));
    assert_int_equal(stats(b2).profile_passes, 0);
    free(x);
    free(y);
    free_batch(&b);
    flame_engine_destroy(b2);
    flame_engine_destroy(a);
    flame_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_pow2_buckets),
        cmocka_unit_test(test_cpu_ignores_profiles),
        cmocka_unit_test(test_padded_matches_fp32),
        cmocka_unit_test(test_padded_matches_fp16),
        cmocka_unit_test(test_padded_wide_model),
        cmocka_unit_test(test_replay_bitwise),
        cmocka_unit_test(test_topk_padded),
        cmocka_unit_test(test_scheduler_ladder),
        cmocka_unit_test(test_scheduler_gives_profiles),
    };
    return cmocka_run_group_tests(tests, tu_gpu_setup, NULL);
}
