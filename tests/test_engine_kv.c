/* The user-history KV cache (docs/kv-cache.md): scores with the cache on (a miss, a hit, an
 * extended history, after eviction, in micro-batched chunks, in mixed batches, from many
 * threads at once) equal the scores of the same engine configuration without it, on fresh
 * random models of every position rule and both heads, and on the Beauty-trained model when
 * it was converted (build/beauty.flame.safetensors); every refusal with its message.
 *
 * The same cases run on the GPU engine (blocks in device memory) in fp32 and fp16, each
 * against the GPU engine without the cache and the CPU engine without it, within the compute
 * dtype's tolerance (normwise relative error < 1e-5 in fp32, < 1e-2 in fp16, as
 * tests/test_cuda.c); they skip without a GPU (fail with FLAME_REQUIRE_GPU set). */
#include <pthread.h>

#include "flame/scheduler.h"
#include "testutil.h"
#include "tu_gpu.h"
#include "tu_models.h"
#include "cpu/kernels.h"
#include "engine/engine.h"
#include "kvcache/kvcache.h"

#define ITEMS 500
#define MAX_LEN 64

/* a sumi ranker, item ids only: d_model 32, 2 blocks of 4 heads, candidates at row MAX_LEN */
static void sumi_cfg(char *buf, size_t cap, const char *rule, const char *norm)
{
    snprintf(buf, cap,
             "{\"format\":\"flame\",\"version\":1,\"d_model\":32,\"max_len\":%d,"
             "\"tables\":[{\"name\":\"item\",\"rows\":%d,\"dim\":32}],"
             "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
             "\"position\":{\"rule\":\"%s\",\"rows\":%d,\"candidate_position\":%d},\"input_layernorm\":true,"
             "\"blocks\":{\"count\":2,\"num_heads\":4,\"ffn_dim\":64,\"norm\":\"%s\",\"activation\":\"gelu_tanh\"},"
             "\"final_layernorm\":true,"
             "\"head\":{\"type\":\"sumi\",\"tasks\":[{\"name\":\"a\",\"hidden\":[16]},{\"name\":\"b\",\"hidden\":[]}]}}",
             MAX_LEN, ITEMS, rule, MAX_LEN + 1, MAX_LEN, norm);
}

/* a dot model: d_model 16, 2 post-LN blocks */
static void dot_cfg(char *buf, size_t cap, const char *rule)
{
    snprintf(buf, cap,
             "{\"format\":\"flame\",\"version\":1,\"d_model\":16,\"max_len\":%d,"
             "\"tables\":[{\"name\":\"item\",\"rows\":%d,\"dim\":16}],"
             "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
             "\"position\":{\"rule\":\"%s\",\"rows\":%d},"
             "\"blocks\":{\"count\":2,\"num_heads\":2,\"ffn_dim\":32,\"norm\":\"post\",\"activation\":\"gelu_erf\"},"
             "\"head\":{\"type\":\"dot\",\"table\":\"item\"}}",
             MAX_LEN, ITEMS, rule, MAX_LEN);
}

/* The engines the cases make: NULL device = the CPU; else "cuda" in dtype g_dtype, whose
 * scores are compared normwise (g_rel) */
static const char *g_device, *g_dtype;
static double g_rel;

static flame_engine *engine_on(flame_model *m, int64_t kv_bytes, int64_t block_tokens, const char *device)
{
    flame_config *cfg = NULL;
    assert_int_equal(flame_config_create(&cfg), FLAME_OK);
    if (device) {
        assert_int_equal(flame_config_set_string(cfg, FLAME_OPT_DEVICE, device), FLAME_OK);
        assert_int_equal(flame_config_set_string(cfg, FLAME_OPT_DTYPE, g_dtype), FLAME_OK);
    }
    assert_int_equal(flame_config_set_int(cfg, FLAME_OPT_KV_CACHE_BYTES, kv_bytes), FLAME_OK);
    assert_int_equal(flame_config_set_int(cfg, FLAME_OPT_KV_CACHE_BLOCK_TOKENS, block_tokens), FLAME_OK);
    flame_engine *e = NULL;
    flame_status st = flame_engine_create(m, cfg, &e);
    if (st) fail_msg("flame_engine_create: %s: %s", flame_status_string(st), flame_last_error());
    flame_config_destroy(cfg);
    return e;
}

static flame_engine *engine(flame_model *m, int64_t kv_bytes, int64_t block_tokens)
{
    return engine_on(m, kv_bytes, block_tokens, g_device);
}

static flame_request req(int64_t user, const int64_t *h, size_t n, const int64_t *c, size_t m, int32_t kv)
{
    return (flame_request){.struct_size = sizeof(flame_request), .user_id = user, .history = h, .history_len = n,
                           .candidates = c, .num_candidates = m, .kv_cache = kv};
}

static flame_engine_stats stats(flame_engine *e)
{
    flame_engine_stats s = {.struct_size = sizeof s};
    assert_int_equal(flame_engine_get_stats(e, &s), FLAME_OK);
    return s;
}

/* scores of r on e into a buffer poisoned with NaN first */
static float *score(flame_engine *e, const flame_request *r, size_t len)
{
    float *s = malloc(len * sizeof(float));
    for (size_t i = 0; i < len; i++) s[i] = NAN;
    flame_status st = flame_score(e, r, s, len);
    if (st) fail_msg("flame_score: %s: %s", flame_status_string(st), flame_last_error());
    return s;
}

/* True when the engine's GEMMs run on libflame's own kernels (a CPU with AVX2, not narrowed to
 * the BLAS): each output row then depends on its own inputs alone, so the cache path gives the
 * cache-off bits exactly. */
static bool own_kernels(void)
{
    const char *force = getenv("FLAME_CPU_KERNELS");
    return fl_cpu_isa_detect() != FL_ISA_BASE && !(force && !strcmp(force, "blas"));
}

/* bitwise with the own kernels; else float32 rounding of the same sums in another order (the
 * BLAS blocks its GEMMs by the number of rows) */
static void assert_close(const float *got, const float *want, size_t n)
{
    if (g_device) { /* the GPU: normwise, as tests/test_cuda.c */
        double num = 0.0, den = 0.0;
        for (size_t i = 0; i < n; i++) {
            if (isnan(got[i]) || isnan(want[i])) fail_msg("score %zu is NaN (%g vs %g)", i, got[i], want[i]);
            const double d = fabs((double)got[i] - want[i]);
            if (d > num) num = d;
            if (fabs(want[i]) > den) den = fabs(want[i]);
        }
        const double err = den > 0 ? num / den : num;
        if (!(err < g_rel)) fail_msg("%s %s: relative error %.3g >= %.3g", g_device, g_dtype, err, g_rel);
        return;
    }
    const float tol = own_kernels() ? 0.0f : 2e-5f;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(want[i])) fail_msg("score %zu is NaN (%g vs %g)", i, got[i], want[i]);
        if (fabsf(got[i] - want[i]) > tol * (1.0f + fabsf(want[i])))
            fail_msg("score %zu: %.9g with the cache, %.9g without", i, got[i], want[i]);
    }
}

static void fill(int64_t *v, size_t n)
{
    for (size_t i = 0; i < n; i++) v[i] = tu_below(ITEMS);
}

/* miss, hit, grown by 1-3 items (an extension where the rule keeps older rows, else a miss),
 * a changed item in the cached part (a miss by hash): each against the engine without cache */
static void run_sequence(const char *cfg, bool extendable, int tasks)
{
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(cfg, tu_u64(), &m), FLAME_OK);
    flame_engine *off = engine(m, 0, 16), *on = engine(m, 1 << 22, 8);
    flame_engine *cpu = g_device ? engine_on(m, 0, 16, NULL) : NULL; /* the GPU against the CPU too */
    int64_t h[MAX_LEN + 20], c[40];
    fill(h, MAX_LEN + 20);
    fill(c, 40);
    size_t n = 20;
    uint64_t want_hits = 0, want_ext = 0, want_miss = 0;
    for (int step = 0; step < 6; step++) {
        flame_request r0 = req(9, h, n, c, 40, 0), r1 = req(9, h, n, c, 40, 1);
        float *want = score(off, &r0, 40 * (size_t)tasks), *got = score(on, &r1, 40 * (size_t)tasks);
        assert_close(got, want, 40 * (size_t)tasks);
        if (cpu) {
            float *ref = score(cpu, &r0, 40 * (size_t)tasks);
            assert_close(got, ref, 40 * (size_t)tasks);
            free(ref);
        }
        free(want);
        free(got);
        if (step == 0) want_miss++;
        else if (step == 1 || step == 3) want_hits++;
        else if (step == 5) want_miss++;
        else if (extendable) want_ext++;
        else want_miss++;
        flame_engine_stats s = stats(on);
        assert_int_equal(s.kv_cache_hits, want_hits);
        assert_int_equal(s.kv_cache_extensions, want_ext);
        assert_int_equal(s.kv_cache_misses, want_miss);
        if (step == 1) { /* the hit computed no history token of the sumi head, one of the dot head */
            assert_int_equal(s.kv_cache_tokens_saved, tasks == 1 ? 19 : 20);
            assert_int_equal(s.kv_cache_tokens_computed, tasks == 1 ? 21 : 20);
        }
        /* steps: 0 miss, 1 hit, 2 grown, 3 hit, 4 grown, 5 an item of the cached part changed */
        if (step == 1 || step == 3) n += 1 + (size_t)tu_below(3);
        if (step == 4) h[2] = (h[2] + 1) % ITEMS;
    }
    flame_engine_stats s = stats(on);
    assert_true(s.kv_cache_bytes > 0 && s.kv_cache_bytes <= s.kv_cache_budget_bytes);
    assert_int_equal(stats(off).kv_cache_budget_bytes, 0);
    if (g_device) /* the device blocks are the engine's device bytes */
        assert_true(s.device_bytes >= stats(off).device_bytes + s.kv_cache_budget_bytes);
    flame_engine_destroy(cpu);
    flame_engine_destroy(off);
    flame_engine_destroy(on);
    flame_model_destroy(m);
}

static void test_sumi_from_oldest(void **state)
{
    (void)state;
    char cfg[2048];
    sumi_cfg(cfg, sizeof cfg, "from_oldest", "pre");
    run_sequence(cfg, true, 2);
    sumi_cfg(cfg, sizeof cfg, "from_oldest", "post");
    run_sequence(cfg, true, 2);
}

static void test_sumi_none(void **state)
{
    (void)state;
    char cfg[2048];
    sumi_cfg(cfg, sizeof cfg, "none", "pre");
    run_sequence(cfg, true, 2);
}

static void test_sumi_rules_that_move_rows(void **state)
{
    (void)state;
    char cfg[2048];
    sumi_cfg(cfg, sizeof cfg, "from_recent", "pre");
    run_sequence(cfg, false, 2);
    sumi_cfg(cfg, sizeof cfg, "left_padded_slot", "post");
    run_sequence(cfg, false, 2);
}

static void test_dot_head(void **state)
{
    (void)state;
    char cfg[2048];
    dot_cfg(cfg, sizeof cfg, "left_padded_slot");
    run_sequence(cfg, false, 1);
    dot_cfg(cfg, sizeof cfg, "from_oldest");
    run_sequence(cfg, true, 1);
}

/* side features are part of the hash: the same items with another bag is another history */
static void test_side_features(void **state)
{
    (void)state;
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(TU_SUMI_SIDE_CONFIG(100, 50, 51, gelu_erf), tu_u64(), &m), FLAME_OK);
    flame_engine *off = engine(m, 0, 16), *on = engine(m, 1 << 22, 16);
    int64_t h[30], c[10];
    for (int i = 0; i < 30; i++) h[i] = tu_below(100);
    for (int i = 0; i < 10; i++) c[i] = tu_below(100);
    static tu_side_bags hb, cb;
    tu_side_bags_build(&hb, h, 30, NULL);
    tu_side_bags_build(&cb, c, 10, NULL);
    for (int round = 0; round < 3; round++) {
        if (round == 2) hb.ids[0][4] = (hb.ids[0][4] + 1) % 20; /* another artist of token 4 */
        flame_request r = req(3, h, 30, c, 10, 0);
        r.history_side = hb.b;
        r.candidate_side = cb.b;
        r.num_side_features = 2;
        float *want = score(off, &r, 20);
        r.kv_cache = 1;
        float *got = score(on, &r, 20);
        assert_close(got, want, 20);
        free(want);
        free(got);
    }
    flame_engine_stats s = stats(on);
    assert_int_equal(s.kv_cache_misses, 2);
    assert_int_equal(s.kv_cache_hits, 1);
    flame_engine_destroy(off);
    flame_engine_destroy(on);
    flame_model_destroy(m);
}

/* A budget of one user's entry: users take turns evicting each other, scores unchanged. */
static void test_eviction(void **state)
{
    (void)state;
    char cfg[2048];
    sumi_cfg(cfg, sizeof cfg, "from_oldest", "pre");
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(cfg, tu_u64(), &m), FLAME_OK);
    /* 2 layers x K,V x 32 floats = 512 bytes a token; 8-token blocks of 4096 bytes; 40 tokens = 5 blocks */
    flame_engine *off = engine(m, 0, 16), *on = engine(m, 6 * 4096, 8);
    int64_t h[3][40], c[16];
    for (int u = 0; u < 3; u++) fill(h[u], 40);
    fill(c, 16);
    for (int round = 0; round < 7; round++) {
        const int u = round % 3;
        flame_request r = req(u, h[u], 40, c, 16, 0);
        float *want = score(off, &r, 32);
        r.kv_cache = 1;
        float *got = score(on, &r, 32);
        assert_close(got, want, 32);
        free(want);
        free(got);
    }
    flame_engine_stats s = stats(on);
    assert_int_equal(s.kv_cache_misses, 7);
    assert_int_equal(s.kv_cache_evictions, 6);
    assert_int_equal(s.kv_cache_budget_bytes, 6 * 4096);
    assert_int_equal(s.kv_cache_peak_bytes, 5 * 4096);
    /* a window longer than the whole budget is scored without being stored */
    flame_engine *tiny = engine(m, 4096, 8);
    flame_request r = req(1, h[0], 40, c, 16, 1);
    float *want = score(off, &(flame_request){.struct_size = sizeof r, .history = h[0], .history_len = 40,
                                              .candidates = c, .num_candidates = 16}, 32);
    float *got = score(tiny, &r, 32);
    assert_close(got, want, 32);
    free(got);
    got = score(tiny, &r, 32);
    assert_close(got, want, 32);
    assert_int_equal(stats(tiny).kv_cache_misses, 2);
    assert_int_equal(stats(tiny).kv_cache_bytes, 0);
    free(want);
    free(got);
    flame_engine_destroy(tiny);
    flame_engine_destroy(off);
    flame_engine_destroy(on);
    flame_model_destroy(m);
}

/* Thousands of candidates in chunks against one history (a miss, then a hit). */
static void test_micro_batched(void **state)
{
    (void)state;
    char cfg[2048];
    sumi_cfg(cfg, sizeof cfg, "from_recent", "pre");
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(cfg, tu_u64(), &m), FLAME_OK);
    flame_engine *off = engine(m, 0, 16), *on = engine(m, 1 << 22, 16);
    enum { M = 3000 };
    int64_t h[MAX_LEN], *c = malloc(M * sizeof(int64_t));
    fill(h, MAX_LEN);
    fill(c, M);
    flame_request r = req(5, h, MAX_LEN, c, M, 0);
    float *want = score(off, &r, 2 * M);
    r.kv_cache = 1;
    for (int i = 0; i < 2; i++) {
        float *got = score(on, &r, 2 * M);
        assert_close(got, want, 2 * M);
        free(got);
    }
    assert_int_equal(stats(on).kv_cache_hits, 1);
    free(want);
    free(c);
    flame_engine_destroy(off);
    flame_engine_destroy(on);
    flame_model_destroy(m);
}

static flame_scheduler_stats sched_stats(flame_scheduler *s)
{
    flame_scheduler_stats st = {.struct_size = sizeof st};
    assert_int_equal(flame_scheduler_get_stats(s, &st), FLAME_OK);
    return st;
}

/* Through a scheduler whose profiles hold 64 candidates, a KV-cache request of 300 goes whole:
 * one lookup (a miss, then a hit), not one a part, no split, the same scores as flame_score on
 * an engine with its own cache; the same request without kv_cache is still cut into parts. */
static void test_scheduler_sends_whole(void **state)
{
    (void)state;
    char cfg[2048];
    sumi_cfg(cfg, sizeof cfg, "from_recent", "pre");
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(cfg, tu_u64(), &m), FLAME_OK);
    flame_engine *direct = engine(m, 1 << 22, 16), *on = engine(m, 1 << 22, 16);
    const flame_batch_profile prof[] = {{4, 64}, {1, 64}};
    flame_scheduler_params sp = {.struct_size = sizeof sp, .profiles = prof, .num_profiles = 2};
    flame_scheduler *s = NULL;
    assert_int_equal(flame_scheduler_create(on, &sp, &s), FLAME_OK);
    enum { M = 300 };
    int64_t h[MAX_LEN], c[M];
    fill(h, MAX_LEN);
    fill(c, M);
    flame_request r = req(9, h, MAX_LEN, c, M, 1);
    float *want = score(direct, &r, 2 * M), got[2 * M];
    for (int visit = 0; visit < 2; visit++) { /* a miss, then a hit */
        for (size_t i = 0; i < 2 * M; i++) got[i] = NAN;
        assert_int_equal(flame_scheduler_score(s, &r, got, 2 * M), FLAME_OK);
        assert_close(got, want, 2 * M);
        assert_int_equal(stats(on).kv_cache_misses, 1);
        assert_int_equal(stats(on).kv_cache_hits, (uint64_t)visit);
        assert_int_equal(sched_stats(s).split, 0);
    }
    assert_int_equal(sched_stats(s).parts, 2);
    /* without the cache: five parts of at most 64, as before */
    r.kv_cache = 0;
    float *plain = score(direct, &r, 2 * M);
    assert_int_equal(flame_scheduler_score(s, &r, got, 2 * M), FLAME_OK);
    assert_int_equal(sched_stats(s).split, 1);
    assert_int_equal(sched_stats(s).parts, 2 + 5);
    assert_int_equal(stats(on).kv_cache_misses + stats(on).kv_cache_hits, 2);
    assert_close(got, plain, 2 * M);
    free(plain);
    free(want);
    flame_scheduler_destroy(s);
    flame_engine_destroy(on);
    flame_engine_destroy(direct);
    flame_model_destroy(m);
}

/* A batch mixing cached and uncached requests equals the requests one by one. */
static void test_mixed_batch(void **state)
{
    (void)state;
    char cfg[2048];
    sumi_cfg(cfg, sizeof cfg, "from_oldest", "pre");
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(cfg, tu_u64(), &m), FLAME_OK);
    flame_engine *off = engine(m, 0, 16), *on = engine(m, 1 << 22, 16);
    int64_t h[4][30], c[4][12];
    flame_request rs[4];
    for (int i = 0; i < 4; i++) {
        fill(h[i], 30);
        fill(c[i], 12);
        rs[i] = req(i, h[i], 10 + (size_t)i * 5, c[i], 12, i % 2 == 0);
    }
    float want[4 * 24], got[4 * 24];
    for (int i = 0; i < 4; i++) {
        flame_request r = rs[i];
        r.kv_cache = 0;
        assert_int_equal(flame_score(off, &r, want + i * 24, 24), FLAME_OK);
    }
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 4 * 24; i++) got[i] = NAN;
        assert_int_equal(flame_score_batch(on, rs, 4, got, 4 * 24), FLAME_OK);
        assert_close(got, want, 4 * 24);
    }
    flame_engine_stats s = stats(on);
    assert_int_equal(s.kv_cache_misses, 2);
    assert_int_equal(s.kv_cache_hits, 2);
    /* the top 5 of each request by task 0 (a hit for the cached ones) are those of its scores */
    int64_t ids[4 * 5];
    float top[4 * 5];
    assert_int_equal(flame_score_batch_topk(on, rs, 4, 5, 0, ids, top, 4 * 5), FLAME_OK);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 5; j++) {
            int pos = -1;
            for (int k = 0; k < 12 && pos < 0; k++)
                if (c[i][k] == ids[i * 5 + j]) pos = k;
            if (pos < 0) fail_msg("request %d: top id %lld is none of its candidates", i, (long long)ids[i * 5 + j]);
            assert_close(&top[i * 5 + j], &want[i * 24 + pos * 2], 1);
            if (j > 0 && !(top[i * 5 + j] <= top[i * 5 + j - 1])) fail_msg("request %d: top scores not descending", i);
        }
    assert_int_equal(stats(on).kv_cache_hits, 4);
    flame_engine_destroy(off);
    flame_engine_destroy(on);
    flame_model_destroy(m);
}

/* A reused user id with another history is caught by the hash; a caller's version is trusted
 * (the caller's contract): the same version with another history scores the cached one. */
static void test_versions(void **state)
{
    (void)state;
    char cfg[2048];
    sumi_cfg(cfg, sizeof cfg, "from_oldest", "pre");
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(cfg, tu_u64(), &m), FLAME_OK);
    flame_engine *off = engine(m, 0, 16), *on = engine(m, 1 << 22, 16);
    int64_t a[30], b[30], c[8];
    fill(a, 30);
    fill(c, 8);
    memcpy(b, a, sizeof b);
    b[7] = (a[7] + 1) % ITEMS;
    flame_request ra = req(1, a, 30, c, 8, 0), rb = req(1, b, 30, c, 8, 0);
    float *wa = score(off, &ra, 16), *wb = score(off, &rb, 16);
    ra.kv_cache = rb.kv_cache = 1;
    float *g = score(on, &ra, 16); /* hashed: miss */
    assert_close(g, wa, 16);
    free(g);
    g = score(on, &rb, 16); /* the same user, another history of the same length: the hash says miss */
    assert_close(g, wb, 16);
    free(g);
    assert_int_equal(stats(on).kv_cache_misses, 2);
    ra.history_version = rb.history_version = 77;
    g = score(on, &ra, 16); /* version 77 stored for history a */
    assert_close(g, wa, 16);
    free(g);
    g = score(on, &rb, 16); /* the caller lies: version 77 again for history b gives a's scores */
    assert_close(g, wa, 16);
    free(g);
    rb.history_version = 78;
    g = score(on, &rb, 16);
    assert_close(g, wb, 16);
    free(g);
    free(wa);
    free(wb);
    flame_engine_destroy(off);
    flame_engine_destroy(on);
    flame_model_destroy(m);
}

/* lookups the engine gave the window's hashes to (the cache's internal count) */
static uint64_t hashed(flame_engine *e)
{
    fl_kv_stats s;
    fl_kv_get_stats(e->kv, &s);
    return s.hashed;
}

/* A hit found by the hash under a caller's new version records that version: the next call
 * with it is a hit by version alone, without hashing the window. */
static void test_version_recorded(void **state)
{
    (void)state;
    char cfg[2048];
    sumi_cfg(cfg, sizeof cfg, "from_oldest", "pre");
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(cfg, tu_u64(), &m), FLAME_OK);
    flame_engine *off = engine(m, 0, 16), *on = engine(m, 1 << 22, 16);
    int64_t h[40], c[8];
    fill(h, 40);
    fill(c, 8);
    flame_request r = req(3, h, 40, c, 8, 0);
    float *want = score(off, &r, 16);
    r.kv_cache = 1;
    float *g = score(on, &r, 16); /* version 0: hashed, a miss, stored under version 0 */
    assert_close(g, want, 16);
    free(g);
    assert_int_equal(hashed(on), 1);
    r.history_version = 1234;
    g = score(on, &r, 16); /* no hit by version: hashed, a hit by hash that records 1234 */
    assert_close(g, want, 16);
    free(g);
    assert_int_equal(hashed(on), 2);
    for (int i = 0; i < 3; i++) { /* hits by version: nothing hashed */
        g = score(on, &r, 16);
        assert_close(g, want, 16);
        free(g);
    }
    assert_int_equal(hashed(on), 2);
    flame_engine_stats s = stats(on);
    assert_int_equal(s.kv_cache_misses, 1);
    assert_int_equal(s.kv_cache_hits, 4);
    assert_int_equal(s.kv_cache_tokens_saved, 4 * 40);
    free(want);
    flame_engine_destroy(off);
    flame_engine_destroy(on);
    flame_model_destroy(m);
}

static void test_refusals(void **state)
{
    (void)state;
    char cfg[2048];
    sumi_cfg(cfg, sizeof cfg, "from_oldest", "pre");
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(cfg, 1, &m), FLAME_OK);
    flame_engine *off = engine(m, 0, 16), *on = engine(m, 1 << 20, 16);
    int64_t h[4] = {1, 2, 3, 4}, c[2] = {5, 6};
    float s[4] = {-7, -7, -7, -7};
    flame_request r = req(1, h, 4, c, 2, 1);
    assert_int_equal(flame_score(off, &r, s, 4), FLAME_ERR_INVALID_ARG);
    assert_non_null(strstr(flame_last_error(), "request 0: kv_cache = 1 but the engine has no KV cache"));
    r.kv_cache = 2;
    assert_int_equal(flame_score(on, &r, s, 4), FLAME_ERR_INVALID_ARG);
    assert_non_null(strstr(flame_last_error(), "request 0: kv_cache = 2, must be 0 or 1"));
    for (int i = 0; i < 4; i++) assert_true(s[i] == -7.0f);
    flame_config *fc = NULL;
    assert_int_equal(flame_config_create(&fc), FLAME_OK);
    assert_int_equal(flame_config_set_int(fc, FLAME_OPT_KV_CACHE_BYTES, -1), FLAME_ERR_INVALID_ARG);
    assert_non_null(strstr(flame_last_error(), "FLAME_OPT_KV_CACHE_BYTES = -1 is out of range"));
    assert_int_equal(flame_config_set_int(fc, FLAME_OPT_KV_CACHE_BLOCK_TOKENS, 0), FLAME_ERR_INVALID_ARG);
    assert_non_null(strstr(flame_last_error(), "FLAME_OPT_KV_CACHE_BLOCK_TOKENS = 0 is out of range"));
    int64_t v = 0;
    assert_int_equal(flame_config_get_int(fc, FLAME_OPT_KV_CACHE_BLOCK_TOKENS, &v), FLAME_OK);
    assert_int_equal(v, 16);
    /* a budget below one block (16 tokens x 512 bytes) */
    assert_int_equal(flame_config_set_int(fc, FLAME_OPT_KV_CACHE_BYTES, 8191), FLAME_OK);
    flame_engine *e = (flame_engine *)1;
    assert_int_equal(flame_engine_create(m, fc, &e), FLAME_ERR_INVALID_ARG);
    assert_null(e);
    assert_non_null(strstr(flame_last_error(), "FLAME_OPT_KV_CACHE_BYTES = 8191"));
    assert_non_null(strstr(flame_last_error(), "holds no block"));
    flame_config_destroy(fc);
    flame_engine_destroy(off);
    flame_engine_destroy(on);
    flame_model_destroy(m);
}

/* ---- many threads scoring the same users at once */

typedef struct th_arg {
    flame_engine *e;
    const int64_t *h, *c;
    const float *want;
    int bad;
} th_arg;

static void *scorer(void *p)
{
    th_arg *a = p;
    for (int i = 0; i < 20; i++) {
        flame_request r = req(i % 2, a->h + (i % 2) * 40, 40, a->c, 16, 1);
        float s[32];
        if (flame_score(a->e, &r, s, 32) != FLAME_OK) a->bad = 1;
        const float *w = a->want + (i % 2) * 32;
        double num = 0.0, den = 0.0;
        for (int j = 0; j < 32; j++) {
            if (!g_device && !(fabsf(s[j] - w[j]) <= 2e-5f * (1.0f + fabsf(w[j])))) a->bad = 1;
            if (isnan(s[j])) a->bad = 1;
            num = fmax(num, fabs((double)s[j] - w[j]));
            den = fmax(den, fabs((double)w[j]));
        }
        if (g_device && !(num < g_rel * den)) a->bad = 1;
    }
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    char cfg[2048];
    sumi_cfg(cfg, sizeof cfg, "from_oldest", "pre");
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(cfg, tu_u64(), &m), FLAME_OK);
    flame_engine *off = engine(m, 0, 16), *on = engine(m, 1 << 22, 16);
    int64_t h[80], c[16];
    fill(h, 80);
    fill(c, 16);
    float want[64];
    for (int u = 0; u < 2; u++) {
        flame_request r = req(u, h + u * 40, 40, c, 16, 0);
        assert_int_equal(flame_score(off, &r, want + u * 32, 32), FLAME_OK);
    }
    th_arg a[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (th_arg){.e = on, .h = h, .c = c, .want = want};
        pthread_create(&th[i], NULL, scorer, &a[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) assert_int_equal(a[i].bad, 0);
    flame_engine_stats s = stats(on);
    assert_int_equal(s.kv_cache_misses, 2); /* each user's history computed once */
    assert_int_equal(s.kv_cache_hits, 4 * 20 - 2);
    flame_engine_destroy(off);
    flame_engine_destroy(on);
    flame_model_destroy(m);
}

/* The Beauty-trained model (dot head, left-padded positions): hits equal the cache-off scores. */
static void test_beauty(void **state)
{
    (void)state;
    flame_model *m = NULL;
    if (flame_model_load("build/beauty.flame.safetensors", &m) != FLAME_OK) {
        skip(); /* make test converts it from ../shared/data when present */
    }
    flame_model_info info = {.struct_size = sizeof info};
    assert_int_equal(flame_model_get_info(m, &info), FLAME_OK);
    flame_engine *off = engine(m, 0, 16), *on = engine(m, 1 << 24, 16);
    const size_t M = (size_t)info.num_items;
    int64_t *c = malloc(M * sizeof(int64_t)), h[40];
    for (size_t i = 0; i < M; i++) c[i] = (int64_t)i;
    float *want = malloc(M * sizeof(float));
    for (int user = 0; user < 3; user++) {
        for (int i = 0; i < 40; i++) h[i] = 1 + tu_below(info.num_items - 1);
        flame_request r = req(user, h, 10 + (size_t)user * 15, c, M, 0);
        assert_int_equal(flame_score(off, &r, want, M), FLAME_OK);
        r.kv_cache = 1;
        for (int k = 0; k < 2; k++) {
            float *got = score(on, &r, M);
            assert_close(got, want, M);
            free(got);
        }
    }
    assert_int_equal(stats(on).kv_cache_hits, 3);
    free(want);
    free(c);
    flame_engine_destroy(off);
    flame_engine_destroy(on);
    flame_model_destroy(m);
}

/* ---- the GPU engine: the cases above with the blocks in device memory */

/* a failed case leaves the GPU settings behind: the next case starts from the CPU's */
static int on_cpu(void **state)
{
    (void)state;
    g_device = NULL;
    return 0;
}

/* a case of the CPU suite on the GPU engine in one dtype (the dtype's name in the test's) */
#define GPU_CASE(name, body, dtype, rel)                                                                       \
    static void name(void **state)                                                                             \
    {                                                                                                          \
        TU_NEED_GPU();                                                                                         \
        g_device = "cuda", g_dtype = dtype, g_rel = rel;                                                       \
        body(state);                                                                                           \
        g_device = NULL;                                                                                       \
    }
GPU_CASE(gpu_fp32_sumi_from_oldest, test_sumi_from_oldest, "fp32", 1e-5)
GPU_CASE(gpu_fp16_sumi_from_oldest, test_sumi_from_oldest, "fp16", 1e-2)
GPU_CASE(gpu_fp16_sumi_none, test_sumi_none, "fp16", 1e-2)
GPU_CASE(gpu_fp32_sumi_rules_that_move_rows, test_sumi_rules_that_move_rows, "fp32", 1e-5)
GPU_CASE(gpu_fp32_dot_head, test_dot_head, "fp32", 1e-5)
GPU_CASE(gpu_fp16_dot_head, test_dot_head, "fp16", 1e-2)
GPU_CASE(gpu_fp16_side_features, test_side_features, "fp16", 1e-2)
GPU_CASE(gpu_fp32_eviction, test_eviction, "fp32", 1e-5) /* fp32: its byte counts are of 4-byte elements */
GPU_CASE(gpu_fp16_micro_batched, test_micro_batched, "fp16", 1e-2)
GPU_CASE(gpu_fp16_scheduler_sends_whole, test_scheduler_sends_whole, "fp16", 1e-2)
GPU_CASE(gpu_fp32_mixed_batch, test_mixed_batch, "fp32", 1e-5)
GPU_CASE(gpu_fp16_versions, test_versions, "fp16", 1e-2)
GPU_CASE(gpu_fp32_version_recorded, test_version_recorded, "fp32", 1e-5)
GPU_CASE(gpu_fp32_threads, test_threads, "fp32", 1e-5)
GPU_CASE(gpu_fp16_beauty, test_beauty, "fp16", 1e-2)

/* The device blocks count in FLAME_OPT_DEVICE_MEMORY_BUDGET: a budget that holds the model
 * but not the blocks is refused at creation with the numbers; fp16 blocks take 2-byte
 * elements (2 layers x K,V x 32 x 2 bytes = 256 bytes a token). */
static void gpu_budget(void **state)
{
    (void)state;
    TU_NEED_GPU();
    g_device = "cuda", g_dtype = "fp16";
    char cfg[2048];
    sumi_cfg(cfg, sizeof cfg, "from_oldest", "pre");
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(cfg, 1, &m), FLAME_OK);
    flame_engine *off = engine(m, 0, 16), *on = engine(m, 256 * 16 * 10, 16);
    g_device = NULL;
    assert_int_equal(stats(on).kv_cache_budget_bytes, 256 * 16 * 10);
    const uint64_t held = stats(off).device_bytes;
    flame_engine_destroy(off);
    flame_engine_destroy(on);
    flame_config *fc = NULL;
    assert_int_equal(flame_config_create(&fc), FLAME_OK);
    assert_int_equal(flame_config_set_string(fc, FLAME_OPT_DEVICE, "cuda"), FLAME_OK);
    assert_int_equal(flame_config_set_string(fc, FLAME_OPT_DTYPE, "fp16"), FLAME_OK);
    assert_int_equal(flame_config_set_int(fc, FLAME_OPT_DEVICE_MEMORY_BUDGET, (int64_t)held + (1 << 20)), FLAME_OK);
    assert_int_equal(flame_config_set_int(fc, FLAME_OPT_KV_CACHE_BYTES, 1 << 24), FLAME_OK);
    flame_engine *e = (flame_engine *)1;
    assert_int_equal(flame_engine_create(m, fc, &e), FLAME_ERR_NOMEM);
    assert_null(e);
    assert_non_null(strstr(flame_last_error(), "the KV cache's blocks"));
    flame_config_destroy(fc);
    flame_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sumi_from_oldest),
        cmocka_unit_test(test_sumi_none),
        cmocka_unit_test(test_sumi_rules_that_move_rows),
        cmocka_unit_test(test_dot_head),
        cmocka_unit_test(test_side_features),
        cmocka_unit_test(test_eviction),
        cmocka_unit_test(test_micro_batched),
        cmocka_unit_test(test_scheduler_sends_whole),
        cmocka_unit_test(test_mixed_batch),
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_version_recorded),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_beauty),
    };
    const struct CMUnitTest gpu[] = {
        cmocka_unit_test_setup(gpu_fp32_sumi_from_oldest, on_cpu),
        cmocka_unit_test_setup(gpu_fp16_sumi_from_oldest, on_cpu),
        cmocka_unit_test_setup(gpu_fp16_sumi_none, on_cpu),
        cmocka_unit_test_setup(gpu_fp32_sumi_rules_that_move_rows, on_cpu),
        cmocka_unit_test_setup(gpu_fp32_dot_head, on_cpu),
        cmocka_unit_test_setup(gpu_fp16_dot_head, on_cpu),
        cmocka_unit_test_setup(gpu_fp16_side_features, on_cpu),
        cmocka_unit_test_setup(gpu_fp32_eviction, on_cpu),
        cmocka_unit_test_setup(gpu_fp16_micro_batched, on_cpu),
        cmocka_unit_test_setup(gpu_fp16_scheduler_sends_whole, on_cpu),
        cmocka_unit_test_setup(gpu_fp32_mixed_batch, on_cpu),
        cmocka_unit_test_setup(gpu_fp16_versions, on_cpu),
        cmocka_unit_test_setup(gpu_fp32_version_recorded, on_cpu),
        cmocka_unit_test_setup(gpu_fp32_threads, on_cpu),
        cmocka_unit_test_setup(gpu_fp16_beauty, on_cpu),
        cmocka_unit_test_setup(gpu_budget, on_cpu),
    };
    /* TU_GROUP=gpu runs the GPU group alone (e.g. under compute-sanitizer) */
    const char *only = getenv("TU_GROUP");
    int failed = 0;
    if (!only || !strcmp(only, "cpu")) failed += cmocka_run_group_tests_name("cpu", tests, tu_gpu_setup, NULL);
    if (!only || !strcmp(only, "gpu")) failed += cmocka_run_group_tests_name("gpu", gpu, tu_gpu_setup, NULL);
    return failed;
}
