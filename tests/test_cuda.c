/* The GPU forward pass against the CPU engine on the variant matrix, in fp32, fp16 and bf16
 * (normwise relative error < 1e-5 in fp32, < 1e-2 in fp16, < 2e-2 in bf16), with outputs poisoned
 * before each run; the same for models with int8 tables. Skipped with a message where no GPU is usable; FLAME_REQUIRE_GPU=1 (make
 * test-gpu) turns the skip into a failure. */
#include <pthread.h>

#include "testutil.h"
#include "tu_gpu.h"
#include "tu_model_file.h"
#include "tu_models.h"
#include "tu_requests.h"


/* The variant matrix: every option of docs/model-format.md appears in at least one config. */
static const char *configs[] = {
    /* SASRec/ICLRec: post-LN, gelu_erf, left-padded positions, input LN, eps inside, dot head */
    "{\"format\":\"flame\",\"version\":1,\"d_model\":64,\"max_len\":20,"
    "\"tables\":[{\"name\":\"item\",\"rows\":500,\"dim\":64}],"
    "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
    "\"position\":{\"rule\":\"left_padded_slot\",\"rows\":20},\"input_layernorm\":true,"
    "\"blocks\":{\"count\":2,\"num_heads\":2,\"ffn_dim\":256,\"norm\":\"post\",\"activation\":\"gelu_erf\"},"
    "\"layernorm\":{\"eps\":1e-12},\"head\":{\"type\":\"dot\",\"table\":\"item\"}}",
    /* GR ranker: pre-LN, gelu_tanh, side features (sum + mean) summed then projected, from_recent
     * positions with a candidate position, final LN, sumi head with hidden layers: on the GPU b
     * and e share a stacked first layer (22 wide: the erf-GELU pass without 16-byte vectors), d
     * (another activation) and a (deeper) do not, c has no hidden layer */
    "{\"format\":\"flame\",\"version\":1,\"d_model\":128,\"max_len\":40,"
    "\"tables\":[{\"name\":\"item\",\"rows\":300,\"dim\":32},{\"name\":\"artist\",\"rows\":50,\"dim\":32},"
    "{\"name\":\"genre\",\"rows\":9,\"dim\":32}],"
    "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"},"
    "{\"name\":\"artist\",\"table\":\"artist\",\"input\":\"side\"},"
    "{\"name\":\"genre\",\"table\":\"genre\",\"input\":\"side\",\"pooling\":\"mean\"}],"
    "\"combine\":\"sum\",\"projection\":true,"
    "\"position\":{\"rule\":\"from_recent\",\"rows\":41,\"candidate_position\":40},"
    "\"blocks\":{\"count\":3,\"num_heads\":4,\"ffn_dim\":256,\"norm\":\"pre\",\"activation\":\"gelu_tanh\"},"
    "\"final_layernorm\":true,"
    "\"head\":{\"type\":\"sumi\",\"tasks\":[{\"name\":\"a\",\"hidden\":[64,32]},{\"name\":\"b\",\"hidden\":[16],"
    "\"activation\":\"gelu_erf\"},{\"name\":\"c\",\"hidden\":[]},{\"name\":\"d\",\"hidden\":[24],"
    "\"activation\":\"relu\"},{\"name\":\"e\",\"hidden\":[6],\"activation\":\"gelu_erf\"}]}}",
    /* concat of odd dims (no 16-byte vectors), relu, post-LN, eps outside the root, no
     * positions, sumi head, one block, 4 heads of 8 */
    "{\"format\":\"flame\",\"version\":1,\"d_model\":32,\"max_len\":10,"
    "\"tables\":[{\"name\":\"item\",\"rows\":200,\"dim\":13},{\"name\":\"tag\",\"rows\":30,\"dim\":7}],"
    "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"},"
    "{\"name\":\"tag\",\"table\":\"tag\",\"input\":\"side\"}],"
    "\"combine\":\"concat\",\"projection\":true,"
    "\"blocks\":{\"count\":1,\"num_heads\":4,\"ffn_dim\":48,\"norm\":\"post\",\"activation\":\"relu\"},"
    "\"layernorm\":{\"eps\":1e-3,\"eps_inside_sqrt\":false},"
    "\"head\":{\"type\":\"sumi\",\"tasks\":[{\"name\":\"a\",\"hidden\":[8],\"activation\":\"relu\"}]}}",
    /* no blocks: embeddings straight to the dot head */
    "{\"format\":\"flame\",\"version\":1,\"d_model\":16,\"max_len\":5,"
    "\"tables\":[{\"name\":\"item\",\"rows\":100,\"dim\":16}],"
    "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
    "\"position\":{\"rule\":\"from_recent\",\"rows\":5},"
    "\"blocks\":{\"count\":0,\"num_heads\":1,\"ffn_dim\":1,\"norm\":\"pre\",\"activation\":\"relu\"},"
    "\"head\":{\"type\":\"dot\",\"table\":\"item\"}}",
    /* head dim 128 (the kernel's widest), pre-LN dot head */
    "{\"format\":\"flame\",\"version\":1,\"d_model\":256,\"max_len\":64,"
    "\"tables\":[{\"name\":\"item\",\"rows\":1000,\"dim\":256}],"
    "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
    "\"position\":{\"rule\":\"left_padded_slot\",\"rows\":64},"
    "\"blocks\":{\"count\":2,\"num_heads\":2,\"ffn_dim\":512,\"norm\":\"pre\",\"activation\":\"gelu_erf\"},"
    "\"final_layernorm\":true,\"head\":{\"type\":\"dot\",\"table\":\"item\"}}",
    /* positions counted from the oldest item (from_oldest) with a candidate position, pre-LN sumi */
    "{\"format\":\"flame\",\"version\":1,\"d_model\":32,\"max_len\":10,"
    "\"tables\":[{\"name\":\"item\",\"rows\":200,\"dim\":32}],"
    "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
    "\"position\":{\"rule\":\"from_oldest\",\"rows\":11,\"candidate_position\":10},"
    "\"blocks\":{\"count\":2,\"num_heads\":4,\"ffn_dim\":64,\"norm\":\"pre\",\"activation\":\"gelu_tanh\"},"
    "\"final_layernorm\":true,"
    "\"head\":{\"type\":\"sumi\",\"tasks\":[{\"name\":\"a\",\"hidden\":[8],\"activation\":\"relu\"}]}}",
};

typedef tu_batch batch;

/* Random requests for a model: histories of 0..1.5 max_len items (the window truncates),
 * candidates mixing a contiguous range (one GEMM) and random ids (gathered), side bags of
 * 0..3 ids; request 0 has no history, request 1 no candidates. Storage is owned by the batch. */
static void make_batch(batch *b, flame_model *m, size_t nreq)
{
    static const int64_t side_rows[4] = {30, 9, 9, 9}; /* smallest side table in the configs above */
    flame_model_info info = {.struct_size = sizeof info};
    assert_int_equal(flame_model_get_info(m, &info), FLAME_OK);
    const tu_batch_spec spec = {.users = nreq,
                                .hist_max = (size_t)(info.max_len + info.max_len / 2),
                                .cand_max = 40,
                                .edges = true,
                                .ranges = true,
                                .side_rows = side_rows};
    tu_make_batch(b, m, &spec);
}

static void free_batch(batch *b)
{
    tu_batch_free(b);
}

static flame_engine *gpu_engine(flame_model *m, const char *dtype)
{
    flame_config *c = NULL;
    flame_engine *e = NULL;
    assert_int_equal(flame_config_create(&c), FLAME_OK);
    assert_int_equal(flame_config_set_string(c, FLAME_OPT_DEVICE, "cuda"), FLAME_OK);
    assert_int_equal(flame_config_set_string(c, FLAME_OPT_DTYPE, dtype), FLAME_OK);
    flame_status st = flame_engine_create(m, c, &e);
    if (st) fail_msg("cuda engine (%s): %s", dtype, flame_last_error());
    flame_config_destroy(c);
    return e;
}

/* The GPU engine against the CPU engine on one model (label names it in messages). */
static void check_model(flame_model *m, const char *label, const char *dtype, double tol)
{
    flame_engine *cpu = NULL;
    assert_int_equal(flame_engine_create(m, NULL, &cpu), FLAME_OK);
    flame_engine *gpu = gpu_engine(m, dtype);
    for (int rep = 0; rep < 3; rep++) {
        batch b;
        make_batch(&b, m, 6);
        float *want = malloc((b.total + 1) * sizeof(float)), *got = malloc((b.total + 1) * sizeof(float));
        double *ref = malloc((b.total + 1) * sizeof(double));
        tu_poison(want, b.total + 1);
        tu_poison(got, b.total + 1);
        assert_int_equal(flame_score_batch(cpu, b.req, 6, want, b.total), FLAME_OK);
        flame_status st = flame_score_batch(gpu, b.req, 6, got, b.total);
        if (st) fail_msg("%s %s: %s", label, dtype, flame_last_error());
        assert_true(isnan(got[b.total])); /* nothing past the blocks */
        for (size_t i = 0; i < b.total; i++) ref[i] = want[i];
        double err = tu_rel_err(got, ref, b.total);
        fprintf(stderr, "# %s %s: %zu scores, relative error %.2e\n", label, dtype, b.total, err);
        if (!(err < tol)) {
            size_t worst = 0; /* the score furthest off, to tell a rounding tail from a wrong value */
            for (size_t i = 1; i < b.total; i++)
                if (fabs(got[i] - ref[i]) > fabs(got[worst] - ref[worst])) worst = i;
            fail_msg("%s %s: relative error %.3g >= %.3g (score %zu: %.6g, CPU %.6g)", label, dtype, err, tol, worst,
                     got[worst], ref[worst]);
        }
        /* request 3 alone (a pass of one request) gives its block of the batch */
        flame_model_info info = {.struct_size = sizeof info};
        flame_model_get_info(m, &info);
        size_t off = 0, len = b.req[3].num_candidates * (size_t)info.num_tasks;
        for (int r = 0; r < 3; r++) off += b.req[r].num_candidates * (size_t)info.num_tasks;
        float one[64 * 8];
        tu_poison(one, 64 * 8);
        assert_int_equal(flame_score(gpu, &b.req[3], one, 64 * 8), FLAME_OK);
        for (size_t i = 0; i < len; i++) ref[i] = got[off + i];
        if (len && !(tu_rel_err(one, ref, len) < tol)) fail_msg("%s %s: request 3 alone differs", label, dtype);
        free(want);
        free(got);
        free(ref);
        free_batch(&b);
    }
    flame_engine_stats st = {.struct_size = sizeof st};
    assert_int_equal(flame_engine_get_stats(gpu, &st), FLAME_OK);
    assert_true(st.device_weight_bytes > 0 && st.device_bytes > st.device_weight_bytes);
    flame_engine_destroy(gpu);
    flame_engine_destroy(cpu);
}

static void check_config(int ci, const char *dtype, double tol)
{
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(configs[ci], 100 + (uint64_t)ci, &m), FLAME_OK);
    char label[32];
    snprintf(label, sizeof label, "config %d", ci);
    check_model(m, label, dtype, tol);
    flame_model_destroy(m);
}

static void test_matrix_fp32(void **state)
{
    TU_NEED_GPU();
    for (int ci = 0; ci < (int)(sizeof configs / sizeof configs[0]); ci++) check_config(ci, "fp32", 1e-5);
}

static void test_matrix_fp16(void **state)
{
    TU_NEED_GPU();
    for (int ci = 0; ci < (int)(sizeof configs / sizeof configs[0]); ci++) check_config(ci, "fp16", 1e-2);
}

/* bf16 keeps 8 significant bits, fp16 11: bf16's rounding unit is 8 times fp16's, and the
 * errors scale with it. Config 4 (d_model 256, two pre-LN blocks, a 256-wide dot head) gives
 * the widest spread: fp16 5e-4 to 1e-3, bf16 4e-3 to 1.1e-2 over seeds (score 0.2413 against
 * the CPU's 0.2306 in a batch whose largest score is near 1). Hence twice fp16's bound; a wrong
 * row or mask is off by far more. */
static void test_matrix_bf16(void **state)
{
    TU_NEED_GPU();
    for (int ci = 0; ci < (int)(sizeof configs / sizeof configs[0]); ci++) check_config(ci, "bf16", 2e-2);
}

/* int8 tables (docs/model-format.md, "int8 tables"): models of the matrix above and two more
 * with the tables of q8_mask stored int8, through the embedding kernel's 16-, 8-, 4-value and
 * single-value int8 paths, int8 and float features mixed, int8 dot tables (tied to the item
 * feature, or the head's alone). The GPU engine against the CPU engine on the same int8 file,
 * in fp32, fp16 and bf16; and the device weights: int8 rows + 8 bytes a row for tables that
 * features read, a compute-dtype copy only for the dot head's table. */
static const struct {
    int matrix;         /* index into configs, or -1: `config` */
    const char *config;
    uint64_t q8_mask;
} q8_models[] = {
    {0, NULL, 1},     /* dot head tied to the int8 item table; dim 64: 16-value vectors */
    {1, NULL, 1 | 4}, /* item and genre int8, artist float (4 x 16-byte float loads per step) */
    {2, NULL, 1 | 2}, /* odd dims 13 and 7: single values */
    {3, NULL, 1},     /* no blocks */
    /* concat of dims 24 and 8: 8-value (8-byte) int8 vectors; sumi head */
    {-1,
     "{\"format\":\"flame\",\"version\":1,\"d_model\":32,\"max_len\":12,"
     "\"tables\":[{\"name\":\"item\",\"rows\":400,\"dim\":24},{\"name\":\"tag\",\"rows\":30,\"dim\":8}],"
     "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"},"
     "{\"name\":\"tag\",\"table\":\"tag\",\"input\":\"side\",\"pooling\":\"mean\"}],"
     "\"combine\":\"concat\",\"projection\":true,"
     "\"position\":{\"rule\":\"left_padded_slot\",\"rows\":12,\"candidate_position\":3},"
     "\"blocks\":{\"count\":1,\"num_heads\":2,\"ffn_dim\":64,\"norm\":\"pre\",\"activation\":\"relu\"},"
     "\"final_layernorm\":true,\"head\":{\"type\":\"sumi\",\"tasks\":[{\"name\":\"a\",\"hidden\":[16]}]}}",
     1 | 2},
    /* dim 12 (4-value int8 vectors) summed with a float table, projected; the dot head's own
     * table int8 (only its dequantized copy goes to the GPU) */
    {-1,
     "{\"format\":\"flame\",\"version\":1,\"d_model\":16,\"max_len\":8,"
     "\"tables\":[{\"name\":\"item\",\"rows\":300,\"dim\":12},{\"name\":\"cat\",\"rows\":40,\"dim\":12},"
     "{\"name\":\"out\",\"rows\":310,\"dim\":16}],"
     "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"},"
     "{\"name\":\"cat\",\"table\":\"cat\",\"input\":\"side\",\"pooling\":\"mean\"}],"
     "\"combine\":\"sum\",\"projection\":true,\"position\":{\"rule\":\"from_recent\",\"rows\":8},"
     "\"blocks\":{\"count\":2,\"num_heads\":2,\"ffn_dim\":32,\"norm\":\"post\",\"activation\":\"gelu_tanh\"},"
     "\"head\":{\"type\":\"dot\",\"table\":\"out\"}}",
     1 | 4},
};

static void test_int8_tables_match_cpu(void **state)
{
    TU_NEED_GPU();
    static const char *dtypes[] = {"fp32", "fp16", "bf16"};
    static const double tols[] = {1e-5, 1e-2, 1e-2};
    for (size_t i = 0; i < sizeof q8_models / sizeof q8_models[0]; i++) {
        const char *cfg = q8_models[i].matrix >= 0 ? configs[q8_models[i].matrix] : q8_models[i].config;
        const uint64_t mask = q8_models[i].q8_mask;
        flame_model *rnd = NULL, *q8 = NULL, *deq = NULL;
        assert_int_equal(flame_model_create_random(cfg, tu_u64(), &rnd), FLAME_OK);
        assert_int_equal(flame_model_load(tu_write_model("gpu-q8.st", rnd, cfg, mask, false), &q8), FLAME_OK);
        assert_int_equal(flame_model_load(tu_write_model("gpu-deq.st", rnd, cfg, mask, true), &deq), FLAME_OK);
        const fl_model_cfg *c = &q8->cfg;
        for (int t = 0; t < c->num_tables; t++) assert_int_equal(q8->w.tables_q8[t] != NULL, (int)(mask >> t & 1));
        char label[48];
        snprintf(label, sizeof label, "int8 model %zu", i);
        for (int d = 0; d < 3; d++) check_model(q8, label, dtypes[d], tols[d]);
        for (int d = 0; d < 3; d++) {
            flame_engine *gq = gpu_engine(q8, dtypes[d]), *gf = gpu_engine(deq, dtypes[d]);
            flame_engine_stats sq = {.struct_size = sizeof sq}, sf = {.struct_size = sizeof sf};
            assert_int_equal(flame_engine_get_stats(gq, &sq), FLAME_OK);
            assert_int_equal(flame_engine_get_stats(gf, &sf), FLAME_OK);
            const uint64_t es = d == 0 ? 4 : 2;
            uint64_t want = sf.device_weight_bytes;
            for (int t = 0; t < c->num_tables; t++) {
                if (!(mask >> t & 1)) continue;
                const uint64_t rows = (uint64_t)c->tables[t].rows, dim = (uint64_t)c->tables[t].dim;
                bool read = false;
                for (int f = 0; f < c->num_features; f++) read = read || c->features[f].table == t;
                const bool dot = c->head == FLAME_HEAD_DOT && c->dot_table == t;
                want = want - rows * dim * es + (read ? rows * dim + rows * 8 : 0) + (dot ? rows * dim * es : 0);
            }
            fprintf(stderr, "# %s %s: device weights %llu bytes, %llu with the tables dequantized\n", label, dtypes[d],
                    (unsigned long long)sq.device_weight_bytes, (unsigned long long)sf.device_weight_bytes);
            assert_int_equal(sq.device_weight_bytes, want);
            flame_engine_destroy(gq);
            flame_engine_destroy(gf);
        }
        flame_model_destroy(q8);
        flame_model_destroy(deq);
        flame_model_destroy(rnd);
    }
}

/* Uniform passes are captured once (on the second sight of the shape) and replayed: with fresh
 * ids (the same shapes) every replay still matches the CPU, and the stats count the captures
 * and replays. */
static void test_graph_replay_matches_cpu(void **state)
{
    TU_NEED_GPU();
    flame_model *m = NULL;
    flame_engine *cpu = NULL;
    assert_int_equal(flame_model_create_random(configs[1], 7, &m), FLAME_OK);
    assert_int_equal(flame_engine_create(m, NULL, &cpu), FLAME_OK);
    enum { R = 3, N = 40, M = 16, S = 2, K = 5 }; /* K: config 1 has 5 tasks */
    flame_engine *gpu = gpu_engine(m, "fp32");
    flame_model_info info = {.struct_size = sizeof info};
    assert_int_equal(flame_model_get_info(m, &info), FLAME_OK);
    assert_int_equal(info.num_tasks, K);
    static int64_t hist[R][N], cand[R][M], hoff[R][S][N + 1], hids[R][S][N], coff[R][S][M + 1], cids[R][S][M];
    flame_bags hb[R][S], cb[R][S];
    flame_request req[R];
    float got[R * M * K + 1], want[R * M * K];
    double ref[R * M * K];
    for (int round = 0; round < 4; round++) {
        for (int r = 0; r < R; r++) {
            for (int i = 0; i < N; i++) hist[r][i] = tu_below(300);
            for (int i = 0; i < M; i++) cand[r][i] = tu_below(300);
            for (int s2 = 0; s2 < S; s2++) { /* one id per bag: the index layout stays the same */
                for (int i = 0; i <= N; i++) hoff[r][s2][i] = i;
                for (int i = 0; i <= M; i++) coff[r][s2][i] = i;
                for (int i = 0; i < N; i++) hids[r][s2][i] = tu_below(9);
                for (int i = 0; i < M; i++) cids[r][s2][i] = tu_below(9);
                hb[r][s2] = (flame_bags){hoff[r][s2], hids[r][s2], N};
                cb[r][s2] = (flame_bags){coff[r][s2], cids[r][s2], M};
            }
            req[r] = (flame_request){.struct_size = sizeof req[r], .history = hist[r], .history_len = N,
                                     .candidates = cand[r], .num_candidates = M, .history_side = hb[r],
                                     .candidate_side = cb[r], .num_side_features = S};
        }
        tu_poison(got, R * M * K + 1);
        assert_int_equal(flame_score_batch(cpu, req, R, want, R * M * K), FLAME_OK);
        assert_int_equal(flame_score_batch(gpu, req, R, got, R * M * K), FLAME_OK);
        for (int i = 0; i < R * M * K; i++) ref[i] = want[i];
        assert_rel_err_below(got, ref, R * M * K, 1e-5);
        assert_true(isnan(got[R * M * K]));
    }
    flame_engine_stats st = {.struct_size = sizeof st};
    assert_int_equal(flame_engine_get_stats(gpu, &st), FLAME_OK);
    fprintf(stderr, "# graphs: %llu captured, %llu replays\n", (unsigned long long)st.graph_captures,
            (unsigned long long)st.graph_replays);
    assert_int_equal(st.graph_captures, 1); /* round 1 runs eagerly, round 2 captures */
    assert_int_equal(st.graph_replays, 3);
    flame_engine_destroy(gpu);
    flame_engine_destroy(cpu);
    flame_model_destroy(m);
}

/* Score rows of either size on their way back: a call of a few candidates (its rows come back
 * through the executor's pinned staging) and a full sort of 80,000 items for two users
 * (640,000 bytes of scores, past the staging's 256 KiB: copied into the caller's memory
 * directly), each against the CPU engine, the output poisoned and its end untouched. */
static void test_score_rows_small_and_large(void **state)
{
    TU_NEED_GPU();
    enum { ITEMS = 80000, R = 2 };
    flame_model *m = NULL;
    flame_engine *cpu = NULL;
    assert_int_equal(flame_model_create_random(TU_DOT_CONFIG(80000, 1, ""), tu_u64(), &m), FLAME_OK);
    assert_int_equal(flame_engine_create(m, NULL, &cpu), FLAME_OK);
    flame_engine *gpu = gpu_engine(m, "fp32");
    int64_t *all = malloc(ITEMS * sizeof *all), hist[R][6], few[5];
    float *got = malloc((R * ITEMS + 1) * sizeof *got), *want = malloc(R * ITEMS * sizeof *want);
    double *ref = malloc(R * ITEMS * sizeof *ref);
    assert_non_null(all), assert_non_null(got), assert_non_null(want), assert_non_null(ref);
    for (int i = 0; i < ITEMS; i++) all[i] = i;
    for (int r = 0; r < R; r++)
        for (int i = 0; i < 6; i++) hist[r][i] = tu_below(ITEMS);
    for (int i = 0; i < 5; i++) few[i] = tu_below(ITEMS);
    for (int big = 0; big < 2; big++) {
        const size_t n = big ? R : 1, m_each = big ? ITEMS : 5, total = n * m_each;
        flame_request req[R];
        for (size_t r = 0; r < n; r++)
            req[r] = (flame_request){.struct_size = sizeof req[r], .history = hist[r], .history_len = 6,
                                     .candidates = big ? all : few, .num_candidates = m_each};
        tu_poison(got, total + 1);
        assert_int_equal(flame_score_batch(cpu, req, n, want, total), FLAME_OK);
        if (flame_score_batch(gpu, req, n, got, total)) fail_msg("gpu: %s", flame_last_error());
        for (size_t i = 0; i < total; i++) ref[i] = want[i];
        assert_rel_err_below(got, ref, total, 1e-5);
        assert_true(isnan(got[total]));
        fprintf(stderr, "# %zu score bytes: GPU matches the CPU\n", total * sizeof(float));
    }
    free(all), free(got), free(want), free(ref);
    flame_engine_destroy(gpu);
    flame_engine_destroy(cpu);
    flame_model_destroy(m);
}

/* A bag whose final offset contradicts its id count is refused by the GPU engine as by the
 * CPU one (validation is host-side and shared): same status, same message, nothing written. */
static void test_bag_count_refused_like_cpu(void **state)
{
    TU_NEED_GPU();
    flame_model *m = NULL;
    flame_engine *cpu = NULL;
    assert_int_equal(flame_model_create_random(configs[1], 7, &m), FLAME_OK);
    assert_int_equal(flame_engine_create(m, NULL, &cpu), FLAME_OK);
    flame_engine *gpu = gpu_engine(m, "fp32");
    enum { N = 6, M = 4, K = 5 };
    int64_t hist[N] = {1, 2, 3, 4, 5, 6}, cand[M] = {7, 8, 9, 10}, hoff[N + 1], coff[M + 1], ids[N] = {0};
    for (int i = 0; i <= N; i++) hoff[i] = i;
    for (int i = 0; i <= M; i++) coff[i] = i;
    flame_bags hb[2] = {{hoff, ids, N}, {hoff, ids, N}}, cb[2] = {{coff, ids, M}, {coff, ids, M}};
    flame_request r = {.struct_size = sizeof r, .history = hist, .history_len = N, .candidates = cand,
                       .num_candidates = M, .history_side = hb, .candidate_side = cb, .num_side_features = 2};
    float a[M * K], b[M * K];
    assert_int_equal(flame_score(cpu, &r, a, M * K), FLAME_OK);
    assert_int_equal(flame_score(gpu, &r, b, M * K), FLAME_OK);
    for (int part = 0; part < 2; part++)
        for (int delta = -1; delta <= 1; delta += 2) {
            flame_bags *bag = part ? &cb[1] : &hb[1];
            bag->num_ids += (size_t)delta;
            assert_int_equal(flame_score(cpu, &r, a, M * K), FLAME_ERR_INVALID_ARG);
            char want[256];
            snprintf(want, sizeof want, "%s", flame_last_error());
            tu_poison(b, M * K);
            assert_status_msg(flame_score(gpu, &r, b, M * K), FLAME_ERR_INVALID_ARG, want);
            for (int i = 0; i < M * K; i++) assert_true(isnan(b[i]));
            bag->num_ids -= (size_t)delta;
        }
    flame_engine_destroy(gpu);
    flame_engine_destroy(cpu);
    flame_model_destroy(m);
}

/* Several host threads on one GPU engine (2 executors): every result matches the CPU. */
typedef struct gpu_job {
    flame_engine *gpu;
    flame_model *m;
    int failures;
    double worst;
} gpu_job;

static void *gpu_worker(void *arg)
{
    gpu_job *j = arg;
    flame_engine *cpu = NULL;
    flame_engine_create(j->m, NULL, &cpu);
    for (int rep = 0; rep < 5; rep++) {
        batch b;
        make_batch(&b, j->m, 4);
        float *want = malloc((b.total + 1) * sizeof(float)), *got = malloc((b.total + 1) * sizeof(float));
        double *ref = malloc((b.total + 1) * sizeof(double));
        if (flame_score_batch(cpu, b.req, 4, want, b.total) || flame_score_batch(j->gpu, b.req, 4, got, b.total)) {
            j->failures++;
        } else {
            for (size_t i = 0; i < b.total; i++) ref[i] = want[i];
            double e = tu_rel_err(got, ref, b.total);
            if (e > j->worst) j->worst = e;
            if (!(e < 1e-5)) j->failures++;
        }
        free(want);
        free(got);
        free(ref);
        free_batch(&b);
    }
    flame_engine_destroy(cpu);
    return NULL;
}

/* FLAME_OPT_CUDA_ATTENTION: a model and batch large enough that the kernel chosen per launch is
 * the 128-query Hopper kernel on an H200 (head dim 64, 8 users x 384 tokens x 4 heads = 96
 * CTAs), scored with that choice and with the portable kernel forced, both against the CPU. */
static void test_attention_kernel_option(void **state)
{
    TU_NEED_GPU();
    static const char *cfg =
        "{\"format\":\"flame\",\"version\":1,\"d_model\":256,\"max_len\":384,"
        "\"tables\":[{\"name\":\"item\",\"rows\":2000,\"dim\":256}],"
        "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
        "\"position\":{\"rule\":\"left_padded_slot\",\"rows\":384},"
        "\"blocks\":{\"count\":1,\"num_heads\":4,\"ffn_dim\":256,\"norm\":\"pre\",\"activation\":\"gelu_erf\"},"
        "\"final_layernorm\":true,\"head\":{\"type\":\"dot\",\"table\":\"item\"}}";
    flame_model *m = NULL;
    flame_engine *cpu = NULL;
    assert_int_equal(flame_model_create_random(cfg, tu_u64(), &m), FLAME_OK);
    assert_int_equal(flame_engine_create(m, NULL, &cpu), FLAME_OK);
    enum { N = 8, L = 384, M = 32 };
    static int64_t hist[N][L], cand[N][M];
    flame_request req[N];
    for (int r = 0; r < N; r++) {
        for (int i = 0; i < L; i++) hist[r][i] = tu_below(2000);
        for (int i = 0; i < M; i++) cand[r][i] = tu_below(2000);
        req[r] = (flame_request){.struct_size = sizeof req[r], .history = hist[r], .history_len = L,
                                 .candidates = cand[r], .num_candidates = M};
    }
    static float want[N * M + 1], got[N * M + 1];
    static double ref[N * M];
    tu_poison(want, N * M + 1);
    assert_int_equal(flame_score_batch(cpu, req, N, want, N * M), FLAME_OK);
    for (int i = 0; i < N * M; i++) ref[i] = want[i];
    for (int portable = 0; portable < 2; portable++) {
        flame_config *c = NULL;
        flame_engine *e = NULL;
        assert_int_equal(flame_config_create(&c), FLAME_OK);
        assert_int_equal(flame_config_set_string(c, FLAME_OPT_DEVICE, "cuda"), FLAME_OK);
        assert_int_equal(flame_config_set_string(c, FLAME_OPT_DTYPE, "fp16"), FLAME_OK);
        assert_int_equal(flame_config_set_int(c, FLAME_OPT_CUDA_ATTENTION, portable), FLAME_OK);
        if (flame_engine_create(m, c, &e)) fail_msg("cuda engine: %s", flame_last_error());
        flame_config_destroy(c);
        tu_poison(got, N * M + 1);
        if (flame_score_batch(e, req, N, got, N * M)) fail_msg("%s", flame_last_error());
        assert_true(isnan(got[N * M]));
        const double err = tu_rel_err(got, ref, N * M);
        fprintf(stderr, "# attention kernel %s: relative error %.2e against the CPU\n",
                portable ? "portable" : "chosen per launch", err);
        if (!(err < 1e-2)) fail_msg("FLAME_OPT_CUDA_ATTENTION = %d: relative error %.3g", portable, err);
        flame_engine_destroy(e);
    }
    flame_engine_destroy(cpu);
    flame_model_destroy(m);
}

static void test_concurrent_callers(void **state)
{
    TU_NEED_GPU();
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(configs[0], 3, &m), FLAME_OK);
    flame_engine *gpu = gpu_engine(m, "fp32");
    pthread_t th[4];
    gpu_job jobs[4];
    for (int t = 0; t < 4; t++) {
        jobs[t] = (gpu_job){gpu, m, 0, 0.0};
        pthread_create(&th[t], NULL, gpu_worker, &jobs[t]);
    }
    int failures = 0;
    for (int t = 0; t < 4; t++) {
        pthread_join(th[t], NULL);
        failures += jobs[t].failures;
        fprintf(stderr, "# thread %d: worst relative error %.2e\n", t, jobs[t].worst);
    }
    assert_int_equal(failures, 0);
    flame_engine_destroy(gpu);
    flame_model_destroy(m);
}

static void test_memory_budget_and_devices(void **state)
{
    TU_NEED_GPU();
    flame_model *m = NULL;
    flame_engine *e = (flame_engine *)0x1;
    assert_int_equal(flame_model_create_random(configs[4], 1, &m), FLAME_OK);
    flame_config *c = NULL;
    assert_int_equal(flame_config_create(&c), FLAME_OK);
    assert_int_equal(flame_config_set_string(c, FLAME_OPT_DEVICE, "cuda"), FLAME_OK);
    assert_int_equal(flame_config_set_int(c, FLAME_OPT_DEVICE_MEMORY_BUDGET, 1 << 20), FLAME_OK);
    assert_status_msg(flame_engine_create(m, c, &e), FLAME_ERR_NOMEM, "budget (FLAME_OPT_DEVICE_MEMORY_BUDGET) is 1048576");
    assert_null(e);
    assert_int_equal(flame_config_set_string(c, FLAME_OPT_DEVICE, "cuda:999"), FLAME_OK);
    assert_status_msg(flame_engine_create(m, c, &e), FLAME_ERR_NO_DEVICE, "cuda:999");
    flame_config_destroy(c);
    flame_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matrix_fp32),
        cmocka_unit_test(test_matrix_fp16),
        cmocka_unit_test(test_matrix_bf16),
        cmocka_unit_test(test_int8_tables_match_cpu),
        cmocka_unit_test(test_graph_replay_matches_cpu),
        cmocka_unit_test(test_score_rows_small_and_large),
        cmocka_unit_test(test_bag_count_refused_like_cpu),
        cmocka_unit_test(test_attention_kernel_option),
        cmocka_unit_test(test_concurrent_callers),
        cmocka_unit_test(test_memory_budget_and_devices),
    };
    return cmocka_run_group_tests_name("cuda", tests, tu_gpu_setup, NULL);
}
