/* Whole models with int8 row-wise quantized tables (docs/model-format.md, "int8 tables"):
 * each scored by the CPU engine against the same model with those tables dequantized to F32,
 * on fresh random weights and requests, outputs poisoned with NaN. The int8 embedding kernel
 * rounds to the same float32 values as the dequantized table, so models without an int8 dot
 * head agree to the bit; the int8 dot head (scale <h, q> + bias sum(h)) to float32 rounding. */
#include "testutil.h"
#include "tu_model_file.h"
#include "tu_requests.h"

static int setup(void **state)
{
    tu_seed();
    return 0;
}

typedef struct q8_case {
    const char *config;
    uint64_t q8_mask; /* tables stored int8 */
} q8_case;

static const q8_case cases[] = {
    /* SASRec/ICLRec-like: the tied item table int8 (features and the dot head read it) */
    {"{\"format\":\"flame\",\"version\":1,\"d_model\":64,\"max_len\":20,"
     "\"tables\":[{\"name\":\"item\",\"rows\":500,\"dim\":64}],"
     "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
     "\"position\":{\"rule\":\"left_padded_slot\",\"rows\":20},\"input_layernorm\":true,"
     "\"blocks\":{\"count\":2,\"num_heads\":2,\"ffn_dim\":256,\"norm\":\"post\",\"activation\":\"gelu_erf\"},"
     "\"layernorm\":{\"eps\":1e-12},\"head\":{\"type\":\"dot\",\"table\":\"item\"}}",
     1},
    /* GR ranker: item and genre int8, artist float; side bags summed and mean-pooled, projected */
    {"{\"format\":\"flame\",\"version\":1,\"d_model\":128,\"max_len\":40,"
     "\"tables\":[{\"name\":\"item\",\"rows\":300,\"dim\":32},{\"name\":\"artist\",\"rows\":50,\"dim\":32},"
     "{\"name\":\"genre\",\"rows\":9,\"dim\":32}],"
     "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"},"
     "{\"name\":\"artist\",\"table\":\"artist\",\"input\":\"side\"},"
     "{\"name\":\"genre\",\"table\":\"genre\",\"input\":\"side\",\"pooling\":\"mean\"}],"
     "\"combine\":\"sum\",\"projection\":true,"
     "\"position\":{\"rule\":\"from_recent\",\"rows\":41,\"candidate_position\":40},"
     "\"blocks\":{\"count\":2,\"num_heads\":4,\"ffn_dim\":256,\"norm\":\"pre\",\"activation\":\"gelu_tanh\"},"
     "\"final_layernorm\":true,"
     "\"head\":{\"type\":\"sumi\",\"tasks\":[{\"name\":\"a\",\"hidden\":[16]},{\"name\":\"b\",\"hidden\":[]}]}}",
     1 | 4},
    /* odd dims concatenated and projected; the dot head's own table int8, the item table float */
    {"{\"format\":\"flame\",\"version\":1,\"d_model\":32,\"max_len\":10,"
     "\"tables\":[{\"name\":\"item\",\"rows\":200,\"dim\":13},{\"name\":\"tag\",\"rows\":30,\"dim\":7},"
     "{\"name\":\"out\",\"rows\":210,\"dim\":32}],"
     "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"},"
     "{\"name\":\"tag\",\"table\":\"tag\",\"input\":\"side\",\"pooling\":\"mean\"}],"
     "\"combine\":\"concat\",\"projection\":true,"
     "\"blocks\":{\"count\":1,\"num_heads\":4,\"ffn_dim\":48,\"norm\":\"post\",\"activation\":\"relu\"},"
     "\"layernorm\":{\"eps\":1e-3,\"eps_inside_sqrt\":false},\"head\":{\"type\":\"dot\",\"table\":\"out\"}}",
     2 | 4},
    /* no blocks: int8 embeddings straight to the int8 dot head */
    {"{\"format\":\"flame\",\"version\":1,\"d_model\":16,\"max_len\":5,"
     "\"tables\":[{\"name\":\"item\",\"rows\":100,\"dim\":16}],"
     "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
     "\"position\":{\"rule\":\"from_recent\",\"rows\":5},"
     "\"blocks\":{\"count\":0,\"num_heads\":1,\"ffn_dim\":1,\"norm\":\"pre\",\"activation\":\"relu\"},"
     "\"head\":{\"type\":\"dot\",\"table\":\"item\"}}",
     1},
};

typedef tu_batch batch;

/* Random requests: histories of 0..1.5 max_len items, candidates a contiguous range or random
 * ids, side bags of 0..3 ids (below the rows of each side slot's table). */
static void make_batch(batch *b, const struct flame_model *m, size_t nreq)
{
    const fl_model_cfg *c = &m->cfg;
    int64_t side_rows[TU_BATCH_SIDE] = {0};
    for (int f = 0; f < c->num_features; f++)
        if (c->features[f].side_slot >= 0) side_rows[c->features[f].side_slot] = c->tables[c->features[f].table].rows;
    const tu_batch_spec spec = {.users = nreq,
                                .hist_max = (size_t)(c->max_len + c->max_len / 2),
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

static void check_case(int ci)
{
    const q8_case *k = &cases[ci];
    flame_model *rnd = NULL, *q8 = NULL, *f32 = NULL;
    assert_int_equal(flame_model_create_random(k->config, tu_u64(), &rnd), FLAME_OK);
    assert_int_equal(flame_model_load(tu_write_model("q8.st", rnd, k->config, k->q8_mask, false), &q8), FLAME_OK);
    assert_int_equal(flame_model_load(tu_write_model("deq.st", rnd, k->config, k->q8_mask, true), &f32), FLAME_OK);
    /* weight_bytes: an int8 table costs rows x (dim + 8) bytes instead of rows x dim x 4 */
    const fl_model_cfg *c = &q8->cfg;
    uint64_t want = 0;
    flame_model_info iq = {.struct_size = sizeof iq}, ifl = {.struct_size = sizeof ifl};
    assert_int_equal(flame_model_get_info(q8, &iq), FLAME_OK);
    assert_int_equal(flame_model_get_info(f32, &ifl), FLAME_OK);
    want = ifl.weight_bytes;
    for (int t = 0; t < c->num_tables; t++) {
        const bool is_q8 = k->q8_mask >> t & 1;
        assert_int_equal(q8->w.tables_q8[t] != NULL, is_q8);
        assert_int_equal(q8->w.tables[t] == NULL, is_q8);
        if (is_q8) want -= (uint64_t)c->tables[t].rows * c->tables[t].dim * 3 - (uint64_t)c->tables[t].rows * 8;
    }
    assert_int_equal(iq.weight_bytes, want);
    flame_engine *eq = NULL, *ef = NULL;
    assert_int_equal(flame_engine_create(q8, NULL, &eq), FLAME_OK);
    assert_int_equal(flame_engine_create(f32, NULL, &ef), FLAME_OK);
    for (int rep = 0; rep < 4; rep++) {
        batch b;
        make_batch(&b, q8, 6);
        float *got = malloc((b.total + 1) * sizeof(float)), *ref = malloc((b.total + 1) * sizeof(float));
        double *want_d = malloc((b.total + 1) * sizeof(double));
        tu_poison(got, b.total + 1);
        tu_poison(ref, b.total + 1);
        assert_int_equal(flame_score_batch(ef, b.req, 6, ref, b.total), FLAME_OK);
        flame_status st = flame_score_batch(eq, b.req, 6, got, b.total);
        if (st) fail_msg("case %d: %s", ci, flame_last_error());
        assert_true(isnan(got[b.total])); /* nothing past the scores */
        for (size_t i = 0; i < b.total; i++) want_d[i] = ref[i];
        double err = tu_rel_err(got, want_d, b.total);
        fprintf(stderr, "# case %d: %zu scores, int8 vs dequantized F32: relative error %.2e\n", ci, b.total, err);
        if (!(err < 1e-6)) fail_msg("case %d: relative error %.3g >= 1e-6", ci, err);
        if (c->head == FLAME_HEAD_SUMI) assert_memory_equal(got, ref, b.total * sizeof(float));
        free(got);
        free(ref);
        free(want_d);
        free_batch(&b);
    }
    flame_engine_destroy(eq);
    flame_engine_destroy(ef);
    flame_model_destroy(q8);
    flame_model_destroy(f32);
    flame_model_destroy(rnd);
}

static void test_int8_models_match_dequantized_f32(void **state)
{
    for (int ci = 0; ci < (int)(sizeof cases / sizeof cases[0]); ci++) check_case(ci);
}

/* A whole catalogue through the int8 dot head: split over 2 threads it gives the bits of 1
 * thread, and matches the dequantized F32 model (sgemv) to float32 rounding. */
static void test_int8_dot_head_catalogue_and_threads(void **state)
{
    enum { ROWS = 20000, D = 48 };
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"format\":\"flame\",\"version\":1,\"d_model\":%d,\"max_len\":8,"
             "\"tables\":[{\"name\":\"item\",\"rows\":%d,\"dim\":%d}],"
             "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
             "\"position\":{\"rule\":\"left_padded_slot\",\"rows\":8},\"input_layernorm\":true,"
             "\"blocks\":{\"count\":1,\"num_heads\":2,\"ffn_dim\":64,\"norm\":\"post\",\"activation\":\"gelu_erf\"},"
             "\"head\":{\"type\":\"dot\",\"table\":\"item\"}}",
             D, ROWS, D);
    flame_model *rnd = NULL, *q8 = NULL, *f32 = NULL;
    assert_int_equal(flame_model_create_random(cfg, tu_u64(), &rnd), FLAME_OK);
    assert_int_equal(flame_model_load(tu_write_model("cat-q8.st", rnd, cfg, 1, false), &q8), FLAME_OK);
    assert_int_equal(flame_model_load(tu_write_model("cat-deq.st", rnd, cfg, 1, true), &f32), FLAME_OK);
    flame_engine *e[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        flame_config *conf = NULL;
        assert_int_equal(flame_config_create(&conf), FLAME_OK);
        assert_int_equal(flame_config_set_int(conf, FLAME_OPT_THREADS, i == 1 ? 2 : 1), FLAME_OK);
        assert_int_equal(flame_engine_create(i < 2 ? q8 : f32, conf, &e[i]), FLAME_OK);
        flame_config_destroy(conf);
    }
    int64_t *cand = malloc(ROWS * sizeof(int64_t)), hist[6];
    for (int i = 0; i < ROWS; i++) cand[i] = i;
    for (int i = 0; i < 6; i++) hist[i] = tu_below(ROWS);
    float *out[3];
    for (int i = 0; i < 3; i++) {
        out[i] = malloc((ROWS + 1) * sizeof(float));
        tu_poison(out[i], ROWS + 1);
        flame_request r = {.struct_size = sizeof r, .history = hist, .history_len = 6, .candidates = cand,
                           .num_candidates = ROWS};
        assert_int_equal(flame_score(e[i], &r, out[i], ROWS), FLAME_OK);
        assert_true(isnan(out[i][ROWS]));
    }
    assert_memory_equal(out[0], out[1], ROWS * sizeof(float));
    double *want = malloc(ROWS * sizeof(double));
    for (int i = 0; i < ROWS; i++) want[i] = out[2][i];
    double err = tu_rel_err(out[0], want, ROWS);
    fprintf(stderr, "# %d-item catalogue: int8 dot head vs dequantized F32, relative error %.2e\n", ROWS, err);
    assert_rel_err_below(out[0], want, ROWS, 1e-6);
    for (int i = 0; i < 3; i++) {
        flame_engine_destroy(e[i]);
        free(out[i]);
    }
    free(want);
    free(cand);
    flame_model_destroy(q8);
    flame_model_destroy(f32);
    flame_model_destroy(rnd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int8_models_match_dequantized_f32),
        cmocka_unit_test(test_int8_dot_head_catalogue_and_threads),
    };
    return cmocka_run_group_tests_name("int8 tables", tests, setup, NULL);
}
