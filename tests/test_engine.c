/* flame_score / flame_score_batch behaviour: input validation, edge cases of the request,
 * batching and concurrency, configuration and lifetimes. */
#include <pthread.h>
#include <stdatomic.h>

#include "testutil.h"
#include "tu_models.h"
#include "core/device.h"
#include "model/model.h"
#include "cpu/kernels.h"
#include "engine/engine.h"
#include "engine/cpu_plan.h"
#include "engine/plan.h"

/* sumi ranker with two side features (sum and mean) on concat + projection */
static const char *sumi_config = TU_SUMI_SIDE_CONFIG(100, 12, 13, gelu_tanh);

/* SASRec-style dot model */
static const char *dot_config = TU_DOT_CONFIG(100, 2, "\"input_layernorm\":true,\"layernorm\":{\"eps\":1e-12},");

static flame_engine *engine_with(flame_model *m, int threads, const char *kernels);

typedef struct fixture {
    flame_model *sumi, *dot;
    flame_engine *es, *ed;
} fixture;

static int setup(void **state)
{
    tu_seed();
    fixture *f = calloc(1, sizeof *f);
    if (flame_model_create_random(sumi_config, 7, &f->sumi) || flame_model_create_random(dot_config, 9, &f->dot) ||
        flame_engine_create(f->sumi, NULL, &f->es) || flame_engine_create(f->dot, NULL, &f->ed)) {
        fprintf(stderr, "setup: %s\n", flame_last_error());
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    flame_engine_destroy(f->es);
    flame_engine_destroy(f->ed);
    flame_model_destroy(f->sumi);
    flame_model_destroy(f->dot);
    free(f);
    return 0;
}

/* A sumi request with random ids: side bags of 1 artist and 0..3 genres per token. */
typedef struct sreq {
    int64_t hist[64], cand[64];
    int64_t hoff[2][65], hids[2][200], coff[2][65], cids[2][200];
    flame_bags hs[2], cs[2];
    flame_request r;
} sreq;

static void make_sumi(sreq *q, size_t n, size_t m)
{
    memset(q, 0, sizeof *q);
    for (size_t i = 0; i < n; i++) q->hist[i] = tu_below(100);
    for (size_t i = 0; i < m; i++) q->cand[i] = tu_below(100);
    int64_t rows[2] = {20, 5};
    for (int s = 0; s < 2; s++) {
        for (size_t t = 0; t < n; t++) {
            int64_t k = s == 0 ? 1 : tu_below(4);
            for (int64_t i = 0; i < k; i++) q->hids[s][q->hoff[s][t] + i] = tu_below(rows[s]);
            q->hoff[s][t + 1] = q->hoff[s][t] + k;
        }
        for (size_t t = 0; t < m; t++) {
            int64_t k = s == 0 ? 1 : tu_below(4);
            for (int64_t i = 0; i < k; i++) q->cids[s][q->coff[s][t] + i] = tu_below(rows[s]);
            q->coff[s][t + 1] = q->coff[s][t] + k;
        }
        q->hs[s] = (flame_bags){q->hoff[s], q->hids[s], (size_t)q->hoff[s][n]};
        q->cs[s] = (flame_bags){q->coff[s], q->cids[s], (size_t)q->coff[s][m]};
    }
    q->r = (flame_request){.struct_size = sizeof(flame_request), .history = q->hist, .history_len = n,
                           .candidates = q->cand, .num_candidates = m, .history_side = q->hs,
                           .candidate_side = q->cs, .num_side_features = 2};
}

static flame_request dot_req(int64_t *hist, size_t n, int64_t *cand, size_t m)
{
    return (flame_request){.struct_size = sizeof(flame_request), .history = hist, .history_len = n,
                           .candidates = cand, .num_candidates = m};
}

static bool all_nan(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isnan(x[i])) return false;
    return true;
}

static bool all_finite(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

/* ---- validation: a clear status and message, and the output untouched */

static void test_bad_item_ids(void **state)
{
    fixture *f = *state;
    int64_t hist[5] = {1, 2, -1, 4, 5}, cand[3] = {1, 2, 3};
    float s[8];
    tu_poison(s, 8);
    flame_request r = dot_req(hist, 5, cand, 3);
    assert_status_msg(flame_score(f->ed, &r, s, 8), FLAME_ERR_INVALID_ARG,
                      "request 0: history token 2, feature 'item' (table 'item'): id -1 out of range [0, 100)");
    hist[2] = 100;
    assert_status_msg(flame_score(f->ed, &r, s, 8), FLAME_ERR_INVALID_ARG, "id 100 out of range [0, 100)");
    hist[2] = 3;
    cand[1] = 1000;
    assert_status_msg(flame_score(f->ed, &r, s, 8), FLAME_ERR_INVALID_ARG,
                      "candidate 1 (table 'item'): id 1000 out of range [0, 100)");
    /* an id older than the 8-item window is not read, but still rejected */
    int64_t longh[12] = {-7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    r = dot_req(longh, 12, cand, 3);
    cand[1] = 2;
    assert_status_msg(flame_score(f->ed, &r, s, 8), FLAME_ERR_INVALID_ARG, "history token 0, feature 'item' (table 'item'): id -7");
    assert_true(all_nan(s, 8));
}

/* Item ids index every item table: with a 30-row feature table and a 20-row head table,
 * num_items is 20 and a history id of 25 is refused (it could never be a candidate). */
static void test_item_ids_fit_every_item_table(void **state)
{
    const char *cfg =
        "{\"format\":\"flame\",\"version\":1,\"d_model\":8,\"max_len\":4,"
        "\"tables\":[{\"name\":\"item\",\"rows\":30,\"dim\":8},{\"name\":\"out\",\"rows\":20,\"dim\":8}],"
        "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
        "\"blocks\":{\"count\":1,\"num_heads\":2,\"ffn_dim\":8,\"norm\":\"pre\",\"activation\":\"relu\"},"
        "\"head\":{\"type\":\"dot\",\"table\":\"out\"}}";
    flame_model *m = NULL;
    flame_engine *e = NULL;
    assert_int_equal(flame_model_create_random(cfg, 2, &m), FLAME_OK);
    assert_int_equal(flame_engine_create(m, NULL, &e), FLAME_OK);
    flame_model_info info = {.struct_size = sizeof info};
    assert_int_equal(flame_model_get_info(m, &info), FLAME_OK);
    assert_int_equal(info.num_items, 20);
    int64_t hist[2] = {1, 25}, cand[2] = {0, 19};
    float s[2];
    flame_request r = dot_req(hist, 2, cand, 2);
    assert_status_msg(flame_score(e, &r, s, 2), FLAME_ERR_INVALID_ARG, "id 25 out of range [0, 20)");
    hist[1] = 19;
    assert_int_equal(flame_score(e, &r, s, 2), FLAME_OK);
    cand[1] = 20;
    assert_status_msg(flame_score(e, &r, s, 2), FLAME_ERR_INVALID_ARG, "candidate 1 (table 'out'): id 20 out of range [0, 20)");
    flame_engine_destroy(e);
    flame_model_destroy(m);
}

static void test_bad_side_features(void **state)
{
    fixture *f = *state;
    sreq q;
    make_sumi(&q, 5, 4);
    float s[16];
    tu_poison(s, 16);
    q.hids[0][q.hoff[0][3]] = 20; /* artist table has 20 rows */
    assert_status_msg(flame_score(f->es, &q.r, s, 16), FLAME_ERR_INVALID_ARG,
                      "history token 3, feature 'artist' (table 'artist'): id 20 out of range [0, 20)");
    make_sumi(&q, 5, 4);
    q.coff[1][0] = 1;
    assert_status_msg(flame_score(f->es, &q.r, s, 16), FLAME_ERR_INVALID_ARG, "candidate side feature 'genre' (slot 1): offsets[0] = 1");
    make_sumi(&q, 5, 4);
    q.hoff[1][3] = q.hoff[1][2] + 100;
    q.hoff[1][4] = q.hoff[1][2];
    assert_status_msg(flame_score(f->es, &q.r, s, 16), FLAME_ERR_INVALID_ARG, "offsets[4]");
    make_sumi(&q, 5, 4);
    q.r.num_side_features = 1;
    assert_status_msg(flame_score(f->es, &q.r, s, 16), FLAME_ERR_INVALID_ARG, "num_side_features = 1, the model has 2");
    q.r.num_side_features = 2;
    q.r.history_side = NULL;
    assert_status_msg(flame_score(f->es, &q.r, s, 16), FLAME_ERR_INVALID_ARG, "history_side is NULL");
    assert_true(all_nan(s, 16));
}

/* A bag's ids are exactly ids[0..num_ids): a final offset beyond the array (which would be
 * read past its end) or short of it (which would drop ids) is refused, naming the list, the
 * feature, the token and both numbers, with nothing written; so are ids with no tokens. */
static void test_bag_num_ids_must_match_final_offset(void **state)
{
    fixture *f = *state;
    static sreq q;
    float s[16];
    tu_poison(s, 16);
    for (int list = 0; list < 2; list++) {
        make_sumi(&q, 5, 4);
        int64_t *off = list ? q.coff[1] : q.hoff[1];
        flame_bags *b = list ? &q.cs[1] : &q.hs[1];
        const size_t n = list ? 4 : 5;
        /* the array the caller owns holds 2 ids fewer than the offsets address: on the heap, so
         * reading past it is caught */
        off[n] = off[n - 1] + 3;
        int64_t *ids = malloc((size_t)(off[n] - 2) * sizeof *ids);
        for (int64_t i = 0; i < off[n] - 2; i++) ids[i] = i % 5;
        b->ids = ids, b->num_ids = (size_t)(off[n] - 2);
        char want[160];
        snprintf(want, sizeof want, "%s side feature 'genre' (slot 1): offsets[%zu] (the end of token %zu's bag) = "
                 "%lld, but num_ids = %lld", list ? "candidate" : "history", n, n - 1, (long long)off[n],
                 (long long)(off[n] - 2));
        assert_status_msg(flame_score(f->es, &q.r, s, 16), FLAME_ERR_INVALID_ARG, want);
        assert_status_msg(flame_score_batch(f->es, &q.r, 1, s, 16), FLAME_ERR_INVALID_ARG, want);
        /* ids beyond the last bag */
        off[n] -= 3;
        b->num_ids = (size_t)off[n] + 1;
        snprintf(want, sizeof want, "= %lld, but num_ids = %lld", (long long)off[n], (long long)off[n] + 1);
        assert_status_msg(flame_score(f->es, &q.r, s, 16), FLAME_ERR_INVALID_ARG, want);
        b->num_ids = (size_t)off[n];
        assert_int_equal(flame_score(f->es, &q.r, s, 16), FLAME_OK); /* consistent again */
        tu_poison(s, 16);
        b->ids = NULL;
        if (off[n]) assert_status_msg(flame_score(f->es, &q.r, s, 16), FLAME_ERR_INVALID_ARG, "ids is NULL with num_ids");
        free(ids);
    }
    /* no tokens, yet ids */
    make_sumi(&q, 0, 4);
    q.r.history = NULL;
    q.hs[0].num_ids = 3;
    assert_status_msg(flame_score(f->es, &q.r, s, 16), FLAME_ERR_INVALID_ARG,
                      "history side feature 'artist' (slot 0): num_ids = 3, but there are no history tokens");
    assert_true(all_nan(s, 16));
}

static void test_bad_arguments(void **state)
{
    fixture *f = *state;
    int64_t hist[2] = {1, 2}, cand[2] = {3, 4};
    float s[4];
    tu_poison(s, 4);
    flame_request r = dot_req(hist, 2, cand, 2);
    assert_status_msg(flame_score(NULL, &r, s, 4), FLAME_ERR_INVALID_ARG, "engine is NULL");
    assert_status_msg(flame_score(f->ed, NULL, s, 4), FLAME_ERR_INVALID_ARG, "request is NULL");
    assert_status_msg(flame_score(f->ed, &r, NULL, 4), FLAME_ERR_INVALID_ARG, "scores is NULL");
    assert_status_msg(flame_score(f->ed, &r, s, 1), FLAME_ERR_BUFFER_TOO_SMALL, "room for 1 floats, 1 request(s) need 2");
    r.struct_size = 4;
    assert_status_msg(flame_score(f->ed, &r, s, 4), FLAME_ERR_INVALID_ARG, "flame_request.struct_size = 4");
    r = dot_req(NULL, 2, cand, 2);
    assert_status_msg(flame_score(f->ed, &r, s, 4), FLAME_ERR_INVALID_ARG, "history is NULL with history_len 2");
    r = dot_req(hist, 2, NULL, 2);
    assert_status_msg(flame_score(f->ed, &r, s, 4), FLAME_ERR_INVALID_ARG, "candidates is NULL");
    assert_status_msg(flame_score_batch(f->ed, NULL, 3, s, 4), FLAME_ERR_INVALID_ARG, "requests is NULL");
    /* the second request is bad: nothing at all is written, the message names it */
    flame_request two[2] = {dot_req(hist, 2, cand, 1), dot_req(hist, 2, cand, 1)};
    int64_t bad = -5;
    two[1].candidates = &bad;
    assert_status_msg(flame_score_batch(f->ed, two, 2, s, 4), FLAME_ERR_INVALID_ARG, "request 1: candidate 0");
    assert_true(all_nan(s, 4));
}

/* ---- edge cases of the request */

static void test_empty_candidates(void **state)
{
    fixture *f = *state;
    int64_t hist[3] = {1, 2, 3};
    flame_request r = dot_req(hist, 3, NULL, 0);
    assert_int_equal(flame_score(f->ed, &r, NULL, 0), FLAME_OK);
    float s[4];
    tu_poison(s, 4);
    assert_int_equal(flame_score(f->ed, &r, s, 4), FLAME_OK);
    sreq q;
    make_sumi(&q, 4, 0);
    assert_int_equal(flame_score(f->es, &q.r, s, 4), FLAME_OK);
    assert_true(all_nan(s, 4));
}

static void test_short_histories(void **state)
{
    fixture *f = *state;
    int64_t hist[1] = {42}, cand[5] = {0, 1, 2, 3, 4};
    float s[5];
    /* dot head, empty history: no user state, every candidate scores exactly 0 */
    flame_request r = dot_req(NULL, 0, cand, 5);
    tu_poison(s, 5);
    assert_int_equal(flame_score(f->ed, &r, s, 5), FLAME_OK);
    for (int i = 0; i < 5; i++) assert_true(s[i] == 0.0f);
    /* one item: finite, and the candidates are told apart */
    r = dot_req(hist, 1, cand, 5);
    tu_poison(s, 5);
    assert_int_equal(flame_score(f->ed, &r, s, 5), FLAME_OK);
    assert_true(all_finite(s, 5));
    assert_true(s[0] != s[1]);
    /* sumi head, empty history: history_side may be NULL (nothing to describe) */
    sreq q0;
    make_sumi(&q0, 0, 3);
    q0.r.history = NULL;
    q0.r.history_side = NULL;
    float p0[6];
    tu_poison(p0, 6);
    assert_int_equal(flame_score(f->es, &q0.r, p0, 6), FLAME_OK);
    for (int i = 0; i < 6; i++) assert_true(p0[i] > 0.0f && p0[i] < 1.0f);
    /* sumi head: 0 and 1 history items give finite probabilities */
    for (size_t n = 0; n < 2; n++) {
        sreq q;
        make_sumi(&q, n, 6);
        float p[12];
        tu_poison(p, 12);
        assert_int_equal(flame_score(f->es, &q.r, p, 12), FLAME_OK);
        for (int i = 0; i < 12; i++) assert_true(p[i] > 0.0f && p[i] < 1.0f);
    }
}

static void test_long_history_keeps_most_recent(void **state)
{
    fixture *f = *state;
    int64_t hist[30], cand[7];
    for (int i = 0; i < 30; i++) hist[i] = tu_below(100);
    for (int i = 0; i < 7; i++) cand[i] = tu_below(100);
    float a[7], b[7];
    flame_request full = dot_req(hist, 30, cand, 7), last = dot_req(hist + 22, 8, cand, 7); /* max_len 8 */
    assert_int_equal(flame_score(f->ed, &full, a, 7), FLAME_OK);
    assert_int_equal(flame_score(f->ed, &last, b, 7), FLAME_OK);
    assert_memory_equal(a, b, sizeof a);
    flame_request shorter = dot_req(hist + 23, 7, cand, 7);
    assert_int_equal(flame_score(f->ed, &shorter, b, 7), FLAME_OK);
    assert_memory_not_equal(a, b, sizeof a); /* the window really is 8 items */
    /* sumi: side bags are windowed with the items (max_len 12) */
    sreq q;
    make_sumi(&q, 40, 5);
    float p[10], p2[10];
    assert_int_equal(flame_score(f->es, &q.r, p, 10), FLAME_OK);
    sreq w = q;
    /* the same last 12 tokens, rebuilt as a 12-token request */
    for (int s = 0; s < 2; s++) {
        int64_t base = q.hoff[s][28];
        for (int t = 0; t <= 12; t++) w.hoff[s][t] = q.hoff[s][28 + t] - base;
        memcpy(w.hids[s], q.hids[s] + base, (size_t)(q.hoff[s][40] - base) * sizeof(int64_t));
        w.hs[s] = (flame_bags){w.hoff[s], w.hids[s], (size_t)w.hoff[s][12]};
        w.cs[s] = (flame_bags){w.coff[s], w.cids[s], (size_t)w.coff[s][5]};
    }
    memcpy(w.hist, q.hist + 28, 12 * sizeof(int64_t));
    w.r.history = w.hist;
    w.r.history_len = 12;
    w.r.candidates = w.cand;
    w.r.history_side = w.hs;
    w.r.candidate_side = w.cs;
    assert_int_equal(flame_score(f->es, &w.r, p2, 10), FLAME_OK);
    assert_memory_equal(p, p2, sizeof p);
}

/* An empty bag pools to zeros: the same scores as a bag holding a row that is all zeros. */
static void test_empty_bag_equals_zero_row(void **state)
{
    flame_model *m = NULL;
    flame_engine *e = NULL;
    assert_int_equal(flame_model_create_random(sumi_config, 11, &m), FLAME_OK);
    memset((float *)m->w.tables[2] + 4 * 8, 0, 8 * sizeof(float)); /* genre row 4 := 0 */
    assert_int_equal(flame_engine_create(m, NULL, &e), FLAME_OK);
    sreq q;
    make_sumi(&q, 6, 3);
    for (int t = 0; t <= 6; t++) q.hoff[1][t] = 0; /* every history genre bag empty */
    q.hs[1].num_ids = 0;
    float a[6], b[6];
    assert_int_equal(flame_score(e, &q.r, a, 6), FLAME_OK);
    int64_t zero_ids[6] = {4, 4, 4, 4, 4, 4};
    for (int t = 0; t <= 6; t++) q.hoff[1][t] = t;
    q.hs[1].ids = zero_ids;
    q.hs[1].num_ids = 6;
    assert_int_equal(flame_score(e, &q.r, b, 6), FLAME_OK);
    for (int i = 0; i < 6; i++) assert_float_equal(a[i], b[i], 1e-6);
    flame_engine_destroy(e);
    flame_model_destroy(m);
}

/* SUMI: a candidate's scores do not depend on the other candidates. */
static void test_sumi_candidates_independent(void **state)
{
    fixture *f = *state;
    sreq q;
    make_sumi(&q, 9, 6);
    float all[12], one[2];
    assert_int_equal(flame_score(f->es, &q.r, all, 12), FLAME_OK);
    for (int c = 0; c < 6; c++) {
        sreq s1 = q;
        s1.cand[0] = q.cand[c];
        for (int k = 0; k < 2; k++) {
            s1.coff[k][0] = 0;
            s1.coff[k][1] = q.coff[k][c + 1] - q.coff[k][c];
            memcpy(s1.cids[k], q.cids[k] + q.coff[k][c], (size_t)s1.coff[k][1] * sizeof(int64_t));
            s1.hs[k] = (flame_bags){s1.hoff[k], s1.hids[k], q.hs[k].num_ids};
            s1.cs[k] = (flame_bags){s1.coff[k], s1.cids[k], (size_t)s1.coff[k][1]};
        }
        s1.r.history = s1.hist;
        s1.r.candidates = s1.cand;
        s1.r.num_candidates = 1;
        s1.r.history_side = s1.hs;
        s1.r.candidate_side = s1.cs;
        assert_int_equal(flame_score(f->es, &s1.r, one, 2), FLAME_OK);
        assert_float_equal(one[0], all[2 * c], 1e-6);
        assert_float_equal(one[1], all[2 * c + 1], 1e-6);
    }
}

/* ---- batching */

static void test_batch_matches_single(void **state)
{
    fixture *f = *state;
    enum { R = 9 };
    sreq q[R];
    size_t total = 0;
    for (int i = 0; i < R; i++) {
        make_sumi(&q[i], (size_t)tu_below(30), (size_t)tu_below(10));
        total += q[i].r.num_candidates * 2;
    }
    flame_request reqs[R];
    for (int i = 0; i < R; i++) reqs[i] = q[i].r;
    float *batch = malloc((total + 1) * sizeof(float)), *split = malloc((total + 1) * sizeof(float));
    double *single = malloc((total + 1) * sizeof(double));
    tu_poison(batch, total + 1);
    assert_int_equal(flame_score_batch(f->es, reqs, R, batch, total), FLAME_OK);
    assert_true(isnan(batch[total])); /* nothing written past the blocks */
    size_t off = 0;
    for (int i = 0; i < R; i++) {
        float one[64];
        assert_int_equal(flame_score(f->es, &reqs[i], one, 64), FLAME_OK);
        for (size_t j = 0; j < reqs[i].num_candidates * 2; j++) single[off + j] = one[j];
        off += reqs[i].num_candidates * 2;
    }
    assert_rel_err_below(batch, single, total, 1e-5);
    /* the same batch split into passes of 2 requests */
    flame_config *cfg = NULL;
    flame_engine *e2 = NULL;
    assert_int_equal(flame_config_create(&cfg), FLAME_OK);
    assert_int_equal(flame_config_set_int(cfg, FLAME_OPT_MAX_BATCH, 2), FLAME_OK);
    assert_int_equal(flame_engine_create(f->sumi, cfg, &e2), FLAME_OK);
    flame_config_destroy(cfg);
    tu_poison(split, total + 1);
    assert_int_equal(flame_score_batch(e2, reqs, R, split, total), FLAME_OK);
    assert_rel_err_below(split, single, total, 1e-5);
    flame_engine_destroy(e2);
    free(batch);
    free(split);
    free(single);
}

/* Dot head: requests sharing a contiguous range share a GEMM; mixed with gathered
 * candidates and an empty history, every block still matches the single-request result. */
static void test_dot_batch_shared_range(void **state)
{
    fixture *f = *state;
    int64_t range[100], scattered[10], hist[6][8];
    for (int i = 0; i < 100; i++) range[i] = i;
    for (int i = 0; i < 10; i++) scattered[i] = tu_below(100);
    flame_request r[6];
    size_t lens[6] = {8, 3, 0, 5, 8, 1};
    for (int i = 0; i < 6; i++) {
        for (int j = 0; j < 8; j++) hist[i][j] = tu_below(100);
        r[i] = dot_req(hist[i], lens[i], i == 3 ? scattered : range + 20, i == 3 ? 10 : 80);
    }
    float out[6 * 80];
    tu_poison(out, 6 * 80);
    assert_int_equal(flame_score_batch(f->ed, r, 6, out, 6 * 80), FLAME_OK);
    size_t off = 0;
    for (int i = 0; i < 6; i++) {
        float one[80];
        double want[80];
        assert_int_equal(flame_score(f->ed, &r[i], one, 80), FLAME_OK);
        for (size_t j = 0; j < r[i].num_candidates; j++) want[j] = one[j];
        assert_rel_err_below(out + off, want, r[i].num_candidates, 1e-5);
        off += r[i].num_candidates;
    }
    assert_true(isnan(out[off]));
}

/* ---- concurrency: 8 threads at once give bitwise the results of one thread */

typedef struct job {
    flame_engine *e;
    sreq *q;
    int n;
    float *out; /* [n][128] */
    int rounds;
    int failures;
} job;

static void *worker(void *arg)
{
    job *j = arg;
    for (int round = 0; round < j->rounds; round++)
        for (int i = 0; i < j->n; i++) {
            float tmp[128];
            if (flame_score(j->e, &j->q[i].r, tmp, 128) != FLAME_OK ||
                memcmp(tmp, j->out + i * 128, j->q[i].r.num_candidates * 2 * sizeof(float)) != 0)
                j->failures++;
        }
    return NULL;
}

static void test_eight_threads_bitwise(void **state)
{
    fixture *f = *state;
    enum { N = 12, THREADS = 8 };
    sreq *q = malloc(N * sizeof *q);
    float *ref = malloc(N * 128 * sizeof(float));
    for (int i = 0; i < N; i++) {
        make_sumi(&q[i], (size_t)(1 + tu_below(40)), (size_t)(1 + tu_below(40)));
        assert_int_equal(flame_score(f->es, &q[i].r, ref + i * 128, 128), FLAME_OK);
    }
    pthread_t th[THREADS];
    job jobs[THREADS];
    for (int t = 0; t < THREADS; t++) {
        jobs[t] = (job){f->es, q, N, ref, 5, 0};
        pthread_create(&th[t], NULL, worker, &jobs[t]);
    }
    int failures = 0;
    for (int t = 0; t < THREADS; t++) {
        pthread_join(th[t], NULL);
        failures += jobs[t].failures;
    }
    assert_int_equal(failures, 0);
    flame_engine_stats st = {.struct_size = sizeof st};
    assert_int_equal(flame_engine_get_stats(f->es, &st), FLAME_OK);
    assert_true(st.workspaces >= 2 && st.workspaces <= THREADS + 1);
    free(q);
    free(ref);
}

/* ---- configuration, devices, lifetimes */

static void test_config_options(void **state)
{
    flame_config *c = NULL;
    assert_int_equal(flame_config_create(&c), FLAME_OK);
    int64_t v = 0;
    assert_int_equal(flame_config_get_int(c, FLAME_OPT_MAX_BATCH, &v), FLAME_OK);
    assert_int_equal(v, 256);
    assert_status_msg(flame_config_set_int(c, FLAME_OPT_MAX_BATCH, 0), FLAME_ERR_INVALID_ARG,
                      "FLAME_OPT_MAX_BATCH = 0 is out of range [1, 65536]");
    assert_int_equal(flame_config_get_int(c, FLAME_OPT_MAX_BATCH, &v), FLAME_OK);
    assert_int_equal(v, 256); /* unchanged by the failed set */
    assert_status_msg(flame_config_set_int(c, FLAME_OPT_DEVICE, 1), FLAME_ERR_INVALID_ARG, "not an integer option");
    assert_status_msg(flame_config_set_int(c, (flame_option)99, 1), FLAME_ERR_INVALID_ARG, "option 99");
    assert_status_msg(flame_config_set_string(c, FLAME_OPT_DEVICE, "tpu"), FLAME_ERR_INVALID_ARG, "'tpu'");
    assert_status_msg(flame_config_set_string(c, FLAME_OPT_DEVICE, "cuda:x"), FLAME_ERR_INVALID_ARG, "'cuda:x'");
    assert_int_equal(flame_config_set_string(c, FLAME_OPT_DEVICE, "cuda:1"), FLAME_OK);
    char buf[8];
    assert_int_equal(flame_config_get_string(c, FLAME_OPT_DEVICE, buf, sizeof buf, NULL), FLAME_OK);
    assert_string_equal(buf, "cuda:1");
    assert_status_msg(flame_config_get_string(c, FLAME_OPT_DEVICE, buf, 3, NULL), FLAME_ERR_BUFFER_TOO_SMALL, "needs 7 bytes");
    assert_int_equal(flame_config_get_string(c, FLAME_OPT_DTYPE, buf, sizeof buf, NULL), FLAME_OK);
    assert_string_equal(buf, "fp32");
    assert_status_msg(flame_config_set_string(c, FLAME_OPT_DTYPE, "fp8"), FLAME_ERR_INVALID_ARG, "'fp8' is not one of fp32, fp16, bf16");
    assert_int_equal(flame_config_set_string(c, FLAME_OPT_DTYPE, "bf16"), FLAME_OK);
    assert_status_msg(flame_config_set_int(c, FLAME_OPT_DEVICE_MEMORY_BUDGET, -1), FLAME_ERR_INVALID_ARG, "out of range");
    int stream_stub;
    void *got = NULL;
    assert_int_equal(flame_config_set_pointer(c, FLAME_OPT_CUDA_STREAM, &stream_stub), FLAME_OK);
    assert_int_equal(flame_config_get_pointer(c, FLAME_OPT_CUDA_STREAM, &got), FLAME_OK);
    assert_ptr_equal(got, &stream_stub);
    assert_status_msg(flame_config_set_pointer(c, FLAME_OPT_DTYPE, &stream_stub), FLAME_ERR_INVALID_ARG, "not a pointer option");
    assert_status_msg(flame_config_set_int(c, FLAME_OPT_THREADS, 257), FLAME_ERR_INVALID_ARG, "FLAME_OPT_THREADS = 257");
    assert_int_equal(flame_config_get_int(c, FLAME_OPT_CUDA_ATTENTION, &v), FLAME_OK);
    assert_int_equal(v, 0); /* the kernel chosen per launch */
    assert_int_equal(flame_config_set_int(c, FLAME_OPT_CUDA_ATTENTION, 1), FLAME_OK);
    assert_status_msg(flame_config_set_int(c, FLAME_OPT_CUDA_ATTENTION, 2), FLAME_ERR_INVALID_ARG,
                      "FLAME_OPT_CUDA_ATTENTION = 2 is out of range [0, 1]");
    assert_int_equal(flame_config_get_int(c, FLAME_OPT_CUDA_ATTENTION, &v), FLAME_OK);
    assert_int_equal(v, 1);
    flame_config_destroy(c);
    flame_config_destroy(NULL);
}

/* flame_config_get_string reports the size it needs as flame_metrics_text does: a size query
 * (NULL, 0), a buffer one byte short refused with both sizes and left as it was, the exact
 * size taken. */
static void test_config_get_string_size(void **state)
{
    (void)state;
    flame_config *c = NULL;
    assert_int_equal(flame_config_create(&c), FLAME_OK);
    size_t need = 12345;
    assert_status_msg(flame_config_get_string(c, FLAME_OPT_BATCH_PROFILES, NULL, 0, &need),
                      FLAME_ERR_BUFFER_TOO_SMALL, "FLAME_OPT_BATCH_PROFILES needs 1 bytes with its NUL, buf has 0");
    assert_int_equal(need, 1); /* "" by default: its NUL alone */

    const char *value = "4x64x32,1x128"; /* 13 characters */
    assert_int_equal(flame_config_set_string(c, FLAME_OPT_BATCH_PROFILES, value), FLAME_OK);
    need = 0;
    assert_status_msg(flame_config_get_string(c, FLAME_OPT_BATCH_PROFILES, NULL, 0, &need),
                      FLAME_ERR_BUFFER_TOO_SMALL, "needs 14 bytes with its NUL, buf has 0");
    assert_int_equal(need, 14);

    char buf[32], before[32];
    memset(buf, '#', sizeof buf);
    memcpy(before, buf, sizeof buf);
    need = 0;
    assert_status_msg(flame_config_get_string(c, FLAME_OPT_BATCH_PROFILES, buf, 13, &need),
                      FLAME_ERR_BUFFER_TOO_SMALL, "FLAME_OPT_BATCH_PROFILES needs 14 bytes with its NUL, buf has 13");
    assert_int_equal(need, 14);
    assert_memory_equal(buf, before, sizeof buf); /* not half-written */

    need = 0;
    assert_int_equal(flame_config_get_string(c, FLAME_OPT_BATCH_PROFILES, buf, 14, &need), FLAME_OK);
    assert_int_equal(need, 14);
    assert_string_equal(buf, value);
    assert_memory_equal(buf + 14, before + 14, sizeof buf - 14); /* nothing past the NUL */
    memset(buf, '#', sizeof buf);
    assert_int_equal(flame_config_get_string(c, FLAME_OPT_DEVICE, buf, 4, NULL), FLAME_OK); /* needed may be NULL */
    assert_string_equal(buf, "cpu");

    /* the other failures: *needed 0, buf untouched */
    memcpy(before, buf, sizeof buf);
    need = 7;
    assert_status_msg(flame_config_get_string(c, FLAME_OPT_DEVICE, NULL, 5, &need), FLAME_ERR_INVALID_ARG,
                      "buf is NULL with buf_len 5");
    assert_int_equal(need, 0);
    need = 7;
    assert_status_msg(flame_config_get_string(NULL, FLAME_OPT_DEVICE, buf, sizeof buf, &need), FLAME_ERR_INVALID_ARG,
                      "config is NULL");
    assert_int_equal(need, 0);
    need = 7;
    assert_status_msg(flame_config_get_string(c, FLAME_OPT_MAX_BATCH, buf, sizeof buf, &need), FLAME_ERR_INVALID_ARG,
                      "FLAME_OPT_MAX_BATCH is not a string option");
    assert_int_equal(need, 0);
    assert_memory_equal(buf, before, sizeof buf);
    flame_config_destroy(c);
}

/* Every config message names the option as the header spells it; a value that is no option
 * (3 is a retired one, negatives, past the last) is given as its number. */
static void test_config_messages_name_options(void **state)
{
    (void)state;
    enum { INT, STRING, POINTER };
    static const struct {
        flame_option option;
        const char *name;
        int kind;
    } all[] = {
        {FLAME_OPT_DEVICE, "FLAME_OPT_DEVICE", STRING},
        {FLAME_OPT_MAX_BATCH, "FLAME_OPT_MAX_BATCH", INT},
        {FLAME_OPT_DTYPE, "FLAME_OPT_DTYPE", STRING},
        {FLAME_OPT_DEVICE_MEMORY_BUDGET, "FLAME_OPT_DEVICE_MEMORY_BUDGET", INT},
        {FLAME_OPT_CUDA_STREAM, "FLAME_OPT_CUDA_STREAM", POINTER},
        {FLAME_OPT_CUDA_EXECUTORS, "FLAME_OPT_CUDA_EXECUTORS", INT},
        {FLAME_OPT_CUDA_GRAPHS, "FLAME_OPT_CUDA_GRAPHS", INT},
        {FLAME_OPT_THREADS, "FLAME_OPT_THREADS", INT},
        {FLAME_OPT_ITEM_CACHE, "FLAME_OPT_ITEM_CACHE", POINTER},
        {FLAME_OPT_USER_CACHE, "FLAME_OPT_USER_CACHE", POINTER},
        {FLAME_OPT_CUDA_ATTENTION, "FLAME_OPT_CUDA_ATTENTION", INT},
        {FLAME_OPT_CPU_KERNELS, "FLAME_OPT_CPU_KERNELS", STRING},
        {FLAME_OPT_KV_CACHE_BYTES, "FLAME_OPT_KV_CACHE_BYTES", INT},
        {FLAME_OPT_KV_CACHE_BLOCK_TOKENS, "FLAME_OPT_KV_CACHE_BLOCK_TOKENS", INT},
        {FLAME_OPT_BATCH_PROFILES, "FLAME_OPT_BATCH_PROFILES", STRING},
    };
    flame_config *c = NULL;
    assert_int_equal(flame_config_create(&c), FLAME_OK);
    int64_t v = 0;
    void *p = NULL;
    char buf[64], want[96];
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        const flame_option o = all[i].option;
        const char *n = all[i].name;
        /* each option through the three setters and getters that do not take it */
        if (all[i].kind != INT) {
            snprintf(want, sizeof want, "%s is not an integer option", n);
            assert_status_msg(flame_config_set_int(c, o, 1), FLAME_ERR_INVALID_ARG, want);
            assert_string_equal(flame_last_error(), want);
            assert_status_msg(flame_config_get_int(c, o, &v), FLAME_ERR_INVALID_ARG, want);
        }
        if (all[i].kind != STRING) {
            snprintf(want, sizeof want, "%s is not a string option", n);
            assert_status_msg(flame_config_set_string(c, o, "x"), FLAME_ERR_INVALID_ARG, want);
            assert_string_equal(flame_last_error(), want);
            assert_status_msg(flame_config_get_string(c, o, buf, sizeof buf, NULL), FLAME_ERR_INVALID_ARG, want);
        }
        if (all[i].kind != POINTER) {
            snprintf(want, sizeof want, "%s is not a pointer option", n);
            assert_status_msg(flame_config_set_pointer(c, o, NULL), FLAME_ERR_INVALID_ARG, want);
            assert_string_equal(flame_last_error(), want);
            assert_status_msg(flame_config_get_pointer(c, o, &p), FLAME_ERR_INVALID_ARG, want);
        }
    }
    assert_status_msg(flame_config_get_string(c, FLAME_OPT_DEVICE, buf, 3, NULL), FLAME_ERR_BUFFER_TOO_SMALL,
                      "FLAME_OPT_DEVICE needs 4 bytes with its NUL, buf has 3");
    assert_status_msg(flame_config_set_string(c, FLAME_OPT_DTYPE, "fp8"), FLAME_ERR_INVALID_ARG,
                      "FLAME_OPT_DTYPE = 'fp8' is not one of fp32, fp16, bf16");

    assert_status_msg(flame_config_set_int(c, (flame_option)3, 1), FLAME_ERR_INVALID_ARG, "option 3 is not an integer option");
    assert_status_msg(flame_config_get_string(c, (flame_option)0, buf, sizeof buf, NULL), FLAME_ERR_INVALID_ARG,
                      "option 0 is not a string option");
    assert_status_msg(flame_config_set_pointer(c, (flame_option)17, NULL), FLAME_ERR_INVALID_ARG,
                      "option 17 is not a pointer option");
    assert_status_msg(flame_config_get_pointer(c, (flame_option)-1, &p), FLAME_ERR_INVALID_ARG,
                      "option -1 is not a pointer option");
    assert_status_msg(flame_config_set_string(c, (flame_option)99, "cpu"), FLAME_ERR_INVALID_ARG,
                      "option 99 is not a string option");
    flame_config_destroy(c);
}

typedef struct log_capture {
    char last[512];
    int lines;
} log_capture;

static void on_log(flame_log_level level, const char *msg, void *user)
{
    log_capture *c = user;
    snprintf(c->last, sizeof c->last, "%s", msg);
    c->lines++;
}

static void test_device_choice(void **state)
{
    fixture *f = *state;
    flame_config *c = NULL;
    flame_engine *e = (flame_engine *)0x1;
    assert_int_equal(flame_config_create(&c), FLAME_OK);
    assert_int_equal(flame_config_set_string(c, FLAME_OPT_DEVICE, "cuda"), FLAME_OK);
    char why[256];
    const int gpus = fl_cuda_device_count(why, sizeof why);
    flame_status st = flame_engine_create(f->dot, c, &e);
    if (gpus == 0) { /* "cuda" without a usable GPU: refused, saying why */
        assert_int_equal(st, FLAME_ERR_NO_DEVICE);
        assert_non_null(strstr(flame_last_error(), "device 'cuda'"));
        assert_null(e);
    } else {
        assert_int_equal(st, FLAME_OK);
        flame_engine_destroy(e);
    }
    log_capture cap = {0};
    assert_int_equal(flame_set_log_callback(on_log, &cap, FLAME_LOG_INFO), FLAME_OK);
    assert_int_equal(flame_config_set_string(c, FLAME_OPT_DEVICE, "auto"), FLAME_OK);
    assert_int_equal(flame_engine_create(f->dot, c, &e), FLAME_OK);
    assert_non_null(strstr(cap.last, gpus ? "engine on cuda:0" : "using the CPU"));
    assert_int_equal(flame_set_log_callback(NULL, NULL, FLAME_LOG_ERROR), FLAME_OK);
    assert_status_msg(flame_set_log_callback(on_log, &cap, (flame_log_level)9), FLAME_ERR_INVALID_ARG, "log level 9");
    flame_engine_destroy(e);
    flame_config_destroy(c);
}

/* Concurrent calls on the BLAS path while OpenBLAS runs several threads a call oversubscribe
 * the cores: the engine says so once (at its second workspace, i.e. two calls at once), and
 * not when BLAS runs one thread a call. */
void openblas_set_num_threads(int); /* OpenBLAS's own: cblas.h may be another's */
static void test_concurrent_calls_with_threaded_blas_warn_once(void **state)
{
    fixture *f = *state;
    log_capture cap = {0};
    assert_int_equal(flame_set_log_callback(on_log, &cap, FLAME_LOG_WARN), FLAME_OK);
    const int before = fl_blas_threads();
    for (int threads = 1; threads <= 2; threads++) {
        openblas_set_num_threads(threads);
        flame_engine *e = engine_with(f->dot, 0, "blas"); /* the BLAS path: own kernels share one pool */
        cap.lines = 0;
        fl_workspace *ws[3];
        for (int i = 0; i < 3; i++) ws[i] = fl_workspace_acquire(e); /* three calls at once */
        for (int i = 0; i < 3; i++) fl_workspace_release(e, ws[i]);
        ws[0] = fl_workspace_acquire(e), ws[1] = fl_workspace_acquire(e); /* again: from the pool */
        fl_workspace_release(e, ws[0]), fl_workspace_release(e, ws[1]);
        assert_int_equal(cap.lines, threads == 2 ? 1 : 0);
        if (threads == 2) assert_non_null(strstr(cap.last, "OpenBLAS runs 2 threads a call"));
        flame_engine_destroy(e);
    }
    openblas_set_num_threads(before);
    assert_int_equal(flame_set_log_callback(NULL, NULL, FLAME_LOG_ERROR), FLAME_OK);
}

/* Hooks swapped while other threads log: every line reaches a hook with its own user pointer. */
typedef struct hook_tag {
    int id;
    atomic_int mismatches, lines;
} hook_tag;
static void hook_a(flame_log_level level, const char *msg, void *user)
{
    hook_tag *t = user;
    atomic_fetch_add(&t->lines, 1);
    if (t->id != 1) atomic_fetch_add(&t->mismatches, 1);
}
static void hook_b(flame_log_level level, const char *msg, void *user)
{
    hook_tag *t = user;
    atomic_fetch_add(&t->lines, 1);
    if (t->id != 2) atomic_fetch_add(&t->mismatches, 1);
}
static atomic_int stop_logging;
static void *log_spammer(void *arg)
{
    flame_config *c = NULL;
    flame_config_create(&c);
    while (!atomic_load(&stop_logging)) flame_config_set_int(c, FLAME_OPT_MAX_BATCH, 0); /* logs at DEBUG */
    flame_config_destroy(c);
    return NULL;
}
static void test_log_hook_swaps_are_safe(void **state)
{
    hook_tag a = {.id = 1}, b = {.id = 2};
    pthread_t th[2];
    atomic_store(&stop_logging, 0);
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, log_spammer, NULL);
    /* swap until the spammers have delivered plenty of lines under changing hooks (bounded) */
    for (int i = 0; i < 5000000 && atomic_load(&a.lines) + atomic_load(&b.lines) < 5000; i++)
        flame_set_log_callback(i & 1 ? hook_a : hook_b, i & 1 ? (void *)&a : (void *)&b, FLAME_LOG_DEBUG);
    atomic_store(&stop_logging, 1);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    flame_set_log_callback(NULL, NULL, FLAME_LOG_ERROR);
    assert_true(atomic_load(&a.lines) + atomic_load(&b.lines) > 0);
    assert_int_equal(atomic_load(&a.mismatches) + atomic_load(&b.mismatches), 0);
}

static void test_lifetimes_and_names(void **state)
{
    flame_model *m = NULL;
    flame_engine *e = NULL;
    assert_int_equal(flame_model_create_random(dot_config, 1, &m), FLAME_OK);
    assert_int_equal(flame_engine_create(m, NULL, &e), FLAME_OK);
    flame_model_destroy(m); /* the engine keeps the model alive */
    int64_t hist[3] = {1, 2, 3}, cand[2] = {4, 5};
    float s[2];
    flame_request r = dot_req(hist, 3, cand, 2);
    assert_int_equal(flame_score(e, &r, s, 2), FLAME_OK);
    assert_true(all_finite(s, 2));
    flame_engine_destroy(e);
    flame_engine_destroy(NULL);
    flame_model_destroy(NULL);
    assert_string_equal(flame_status_string(FLAME_ERR_FORMAT), "FLAME_ERR_FORMAT");
    assert_string_equal(flame_status_string((flame_status)1234), "FLAME_ERR_UNKNOWN");
    assert_int_equal(flame_version(), FLAME_VERSION_NUMBER);
    assert_string_equal(flame_version_string(), FLAME_VERSION_STRING);
    /* the same seed and config give the same weights */
    flame_model *a = NULL, *b = NULL;
    assert_int_equal(flame_model_create_random(dot_config, 5, &a), FLAME_OK);
    assert_int_equal(flame_model_create_random(dot_config, 5, &b), FLAME_OK);
    assert_memory_equal(a->w.blocks[1].fc2.w, b->w.blocks[1].fc2.w, 32 * 16 * sizeof(float));
    flame_model_destroy(a);
    flame_model_destroy(b);
    assert_status_msg(flame_model_create_random("{\"format\":\"x\"}", 1, &a), FLAME_ERR_FORMAT, "'format' must be");
}

/* An engine on model m with FLAME_OPT_THREADS = threads and FLAME_OPT_CPU_KERNELS = kernels
 * (NULL: the default, "auto"). */
static flame_engine *engine_with(flame_model *m, int threads, const char *kernels)
{
    flame_config *c = NULL;
    flame_engine *e = NULL;
    assert_int_equal(flame_config_create(&c), FLAME_OK);
    assert_int_equal(flame_config_set_int(c, FLAME_OPT_THREADS, threads), FLAME_OK);
    if (kernels) assert_int_equal(flame_config_set_string(c, FLAME_OPT_CPU_KERNELS, kernels), FLAME_OK);
    assert_int_equal(flame_engine_create(m, c, &e), FLAME_OK);
    flame_config_destroy(c);
    return e;
}

/* FLAME_OPT_CPU_KERNELS: the config takes the four choices and refuses others by name; a
 * choice the CPU lacks is FLAME_ERR_UNSUPPORTED (the rule checked for every CPU level, and
 * once for real on this CPU when it lacks one). */
static void test_cpu_kernels_option(void **state)
{
    fixture *f = *state;
    flame_config *c = NULL;
    char buf[16];
    assert_int_equal(flame_config_create(&c), FLAME_OK);
    assert_int_equal(flame_config_get_string(c, FLAME_OPT_CPU_KERNELS, buf, sizeof buf, NULL), FLAME_OK);
    assert_string_equal(buf, "auto");
    assert_status_msg(flame_config_set_string(c, FLAME_OPT_CPU_KERNELS, "avx"), FLAME_ERR_INVALID_ARG,
                      "FLAME_OPT_CPU_KERNELS = 'avx' is not one of auto, avx512, avx2, blas");
    assert_int_equal(flame_config_get_string(c, FLAME_OPT_CPU_KERNELS, buf, sizeof buf, NULL), FLAME_OK);
    assert_string_equal(buf, "auto"); /* unchanged by the refusal */
    const char *choice[] = {"auto", "avx512", "avx2", "blas"};
    const fl_cpu_isa asked[] = {FL_ISA_BASE /* unused */, FL_ISA_AVX512, FL_ISA_AVX2, FL_ISA_BASE};
    for (int cpu = FL_ISA_BASE; cpu <= FL_ISA_AVX512; cpu++)
        for (int k = 0; k < 4; k++) {
            fl_cpu_isa got = (fl_cpu_isa)99;
            const flame_status st = fl_cpu_choose_isa(choice[k], (fl_cpu_isa)cpu, &got);
            if (k == 0) {
                assert_int_equal(st, FLAME_OK);
                assert_int_equal(got, cpu);
            } else if (k == 3 || (int)asked[k] <= cpu) {
                assert_int_equal(st, FLAME_OK);
                assert_int_equal(got, asked[k]);
            } else {
                assert_int_equal(st, FLAME_ERR_UNSUPPORTED);
                assert_int_equal(got, 99); /* untouched */
                char want[64];
                snprintf(want, sizeof want, "FLAME_OPT_CPU_KERNELS = '%s': this CPU lacks", choice[k]);
                assert_non_null(strstr(flame_last_error(), want));
            }
        }
    const fl_cpu_isa cpu = fl_cpu_isa_detect();
    for (int k = 1; k < 3; k++) {
        if ((int)asked[k] <= (int)cpu) continue;
        flame_engine *e = NULL;
        assert_int_equal(flame_config_set_string(c, FLAME_OPT_CPU_KERNELS, choice[k]), FLAME_OK);
        assert_status_msg(flame_engine_create(f->dot, c, &e), FLAME_ERR_UNSUPPORTED, choice[k]);
        assert_null(e);
    }
    flame_config_destroy(c);
}

/* A batch scored by engines of 1..4 threads gives the same bits; the AVX2 kernels give the
 * bits of the AVX-512 ones; the BLAS path agrees within 1e-5. Sumi requests of mixed
 * lengths, and dot-head users sharing a full-catalogue candidate array (the batched GEMM). */
static void test_threads_and_kernels_bitwise(void **state)
{
    fixture *f = *state;
    enum { R = 9 };
    sreq q[R];
    flame_request reqs[R];
    size_t total = 0;
    for (int i = 0; i < R; i++) {
        make_sumi(&q[i], (size_t)tu_below(40), 1 + (size_t)tu_below(40));
        reqs[i] = q[i].r;
        total += q[i].r.num_candidates * 2;
    }
    int64_t cand[100], hist[R][8];
    for (int i = 0; i < 100; i++) cand[i] = i;
    flame_request dreqs[R];
    for (int i = 0; i < R; i++) {
        for (int j = 0; j < 8; j++) hist[i][j] = tu_below(100);
        dreqs[i] = dot_req(hist[i], 1 + (size_t)tu_below(8), cand, 100);
    }
    const char *kinds[] = {NULL, fl_cpu_isa_detect() >= FL_ISA_AVX2 ? "avx2" : "blas", "blas"};
    float *ref = NULL, *dref = NULL;
    for (int k = 0; k < 3; k++)
        for (int threads = 1; threads <= 4; threads++) {
            if (k && threads > 2) continue;
            void *packed = f->sumi->cpu_packed; /* made by the fixture's engine, shared after */
            flame_engine *es = engine_with(f->sumi, threads, kinds[k]), *ed = engine_with(f->dot, threads, kinds[k]);
            assert_true(f->sumi->cpu_packed == packed); /* never packed again (NULL: no own kernels here) */
            float *got = malloc((total + 1) * sizeof(float)), *dgot = malloc((R * 100 + 1) * sizeof(float));
            tu_poison(got, total + 1);
            tu_poison(dgot, R * 100 + 1);
            assert_int_equal(flame_score_batch(es, reqs, R, got, total), FLAME_OK);
            assert_int_equal(flame_score_batch(ed, dreqs, R, dgot, R * 100), FLAME_OK);
            flame_engine_destroy(es);
            flame_engine_destroy(ed);
            assert_true(isnan(got[total]) && isnan(dgot[R * 100]));
            for (size_t i = 0; i < total; i++) assert_false(isnan(got[i]));
            for (size_t i = 0; i < R * 100; i++) assert_false(isnan(dgot[i]));
            if (!ref) {
                ref = got;
                dref = dgot;
                continue;
            }
            if (k < 2) { /* own kernels, any isa, any thread count: the same bits */
                assert_memory_equal(got, ref, total * sizeof(float));
                assert_memory_equal(dgot, dref, R * 100 * sizeof(float));
            } else { /* the BLAS sums in another order */
                double *w = malloc(total * sizeof(double)), *dw = malloc(R * 100 * sizeof(double));
                for (size_t i = 0; i < total; i++) w[i] = ref[i];
                for (size_t i = 0; i < R * 100; i++) dw[i] = dref[i];
                assert_rel_err_below(got, w, total, 1e-5);
                assert_rel_err_below(dgot, dw, R * 100, 1e-5);
                free(w);
                free(dw);
            }
            free(got);
            free(dgot);
        }
    free(ref);
    free(dref);
}

/* A call large enough to be validated on several threads names the first bad request, as
 * the serial checks do, writes nothing, and scores the same when all is well. */
static void test_parallel_validation_names_first_bad(void **state)
{
    fixture *f = *state;
    enum { R = 48, M = 2000 };
    int64_t *cand = malloc((size_t)R * M * sizeof(int64_t)), hist[R][4];
    flame_request reqs[R];
    for (int r = 0; r < R; r++) {
        for (int i = 0; i < M; i++) cand[(size_t)r * M + i] = tu_below(100);
        for (int j = 0; j < 4; j++) hist[r][j] = tu_below(100);
        reqs[r] = dot_req(hist[r], 4, cand + (size_t)r * M, M); /* distinct arrays: each one is checked */
    }
    flame_engine *e2 = engine_with(f->dot, 2, NULL), *e1 = engine_with(f->dot, 1, NULL);
    float *s2 = malloc((size_t)R * M * sizeof(float)), *s1 = malloc((size_t)R * M * sizeof(float));
    tu_poison(s1, (size_t)R * M);
    tu_poison(s2, (size_t)R * M);
    assert_int_equal(flame_score_batch(e1, reqs, R, s1, (size_t)R * M), FLAME_OK);
    assert_int_equal(flame_score_batch(e2, reqs, R, s2, (size_t)R * M), FLAME_OK);
    assert_memory_equal(s1, s2, (size_t)R * M * sizeof(float));
    const int bad = 30 + (int)tu_below(10);
    cand[(size_t)bad * M + 1234] = 100;
    cand[(size_t)(R - 1) * M + 5] = -3; /* a later one is not the one named */
    tu_poison(s2, (size_t)R * M);
    char want[96];
    snprintf(want, sizeof want, "request %d: candidate 1234 (table 'item'): id 100 out of range", bad);
    assert_status_msg(flame_score_batch(e2, reqs, R, s2, (size_t)R * M), FLAME_ERR_INVALID_ARG, want);
    for (size_t i = 0; i < (size_t)R * M; i++) assert_true(isnan(s2[i]));
    flame_engine_destroy(e1);
    flame_engine_destroy(e2);
    free(cand);
    free(s1);
    free(s2);
}

/* Per-call scratch for the Beauty architecture (d 64, 1 block, 50-item window, 12,103
 * items scored) stays under 1 MB with 2 threads (part of it is per thread: the engine is
 * given a fixed count so that the bound holds on a machine of any size). */
static void test_beauty_sized_scratch(void **state)
{
    const char *cfg =
        "{\"format\":\"flame\",\"version\":1,\"d_model\":64,\"max_len\":50,"
        "\"tables\":[{\"name\":\"item\",\"rows\":12103,\"dim\":64}],"
        "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
        "\"position\":{\"rule\":\"left_padded_slot\",\"rows\":50},\"input_layernorm\":true,"
        "\"blocks\":{\"count\":1,\"num_heads\":2,\"ffn_dim\":256,\"norm\":\"post\",\"activation\":\"gelu_erf\"},"
        "\"layernorm\":{\"eps\":1e-12},\"head\":{\"type\":\"dot\",\"table\":\"item\"}}";
    flame_model *m = NULL;
    flame_engine *e = NULL;
    assert_int_equal(flame_model_create_random(cfg, 3, &m), FLAME_OK);
    flame_config *two = NULL;
    assert_int_equal(flame_config_create(&two), FLAME_OK);
    assert_int_equal(flame_config_set_int(two, FLAME_OPT_THREADS, 2), FLAME_OK);
    assert_int_equal(flame_engine_create(m, two, &e), FLAME_OK);
    flame_config_destroy(two);
    int64_t *cand = malloc(12103 * sizeof(int64_t)), hist[50];
    for (int i = 0; i < 12103; i++) cand[i] = i;
    for (int i = 0; i < 50; i++) hist[i] = 1 + tu_below(12102);
    float *s = malloc(12103 * sizeof(float));
    flame_request r = dot_req(hist, 50, cand, 12103);
    assert_int_equal(flame_score(e, &r, s, 12103), FLAME_OK);
    r.candidates = cand + 100; /* a shuffled list goes the gather path */
    cand[100] = 7;
    r.num_candidates = 1000;
    assert_int_equal(flame_score(e, &r, s, 12103), FLAME_OK);
    /* libflame's own dot-head kernel split over threads gives bitwise the one-thread scores */
    for (int i = 0; i < 12103; i++) cand[i] = (i * 7919) % 12103; /* a permutation: the gather path */
    r.candidates = cand;
    r.num_candidates = 12103;
    float *one = malloc(12103 * sizeof(float)), *four = malloc(12103 * sizeof(float));
    flame_config *opts = NULL;
    flame_engine *e1 = NULL, *e4 = NULL;
    assert_int_equal(flame_config_create(&opts), FLAME_OK);
    assert_int_equal(flame_config_set_int(opts, FLAME_OPT_THREADS, 1), FLAME_OK);
    assert_int_equal(flame_engine_create(m, opts, &e1), FLAME_OK);
    assert_int_equal(flame_config_set_int(opts, FLAME_OPT_THREADS, 4), FLAME_OK);
    assert_int_equal(flame_engine_create(m, opts, &e4), FLAME_OK);
    flame_config_destroy(opts);
    tu_poison(one, 12103);
    tu_poison(four, 12103);
    assert_int_equal(flame_score(e1, &r, one, 12103), FLAME_OK);
    assert_int_equal(flame_score(e4, &r, four, 12103), FLAME_OK);
    assert_memory_equal(one, four, 12103 * sizeof(float));
    for (int i = 0; i < 12103; i++) assert_false(isnan(one[i]));
    flame_engine_destroy(e1);
    flame_engine_destroy(e4);
    free(one);
    free(four);
    flame_engine_stats st = {.struct_size = sizeof st};
    assert_int_equal(flame_engine_get_stats(e, &st), FLAME_OK);
    fprintf(stderr, "# Beauty-sized call: %llu bytes of scratch\n", (unsigned long long)st.max_workspace_bytes);
    assert_true(st.max_workspace_bytes > 0 && st.max_workspace_bytes < 1000000);
    assert_int_equal(st.calls, 2);
    assert_int_equal(st.requests, 2);
    free(cand);
    free(s);
    flame_engine_destroy(e);
    flame_model_destroy(m);
}


/* The dot head's contiguity test of the shared plan: a run of consecutive ids gives its first
 * id, anything else -1; a request scoring the previous one's array takes the previous answer
 * without reading it (shown by an answer the ids would contradict), an equal copy of it does not. */
static void test_dot_contiguous_start(void **state)
{
    (void)state;
    int64_t run[40], copy[40], holes[40];
    for (int i = 0; i < 40; i++) run[i] = copy[i] = holes[i] = 100 + i;
    holes[39] = 5;
    const flame_request a = {.candidates = run, .num_candidates = 40}, b = {.candidates = copy, .num_candidates = 40},
                        h = {.candidates = holes, .num_candidates = 40}, none = {.candidates = run, .num_candidates = 0},
                        shorter = {.candidates = run, .num_candidates = 39};
    assert_int_equal(fl_plan_dot_contiguous_start(&a, NULL, -1), 100);
    assert_int_equal(fl_plan_dot_contiguous_start(&h, NULL, -1), -1);
    assert_int_equal(fl_plan_dot_contiguous_start(&none, NULL, -1), -1);
    /* the same array as the previous request: its answer, even one its ids contradict */
    assert_int_equal(fl_plan_dot_contiguous_start(&a, &a, -1), -1);
    assert_int_equal(fl_plan_dot_contiguous_start(&h, &h, 100), 100);
    /* another array, or the same array with another count: scanned */
    assert_int_equal(fl_plan_dot_contiguous_start(&b, &a, -1), 100);
    assert_int_equal(fl_plan_dot_contiguous_start(&shorter, &a, -1), 100);
    assert_int_equal(fl_plan_dot_contiguous_start(&h, &b, 100), -1);
    /* a group: the same range, the same count; gathered requests (-1) never join */
    assert_true(fl_plan_dot_joins_group(100, 40, 100, 40));
    assert_false(fl_plan_dot_joins_group(100, 40, 100, 39));
    assert_false(fl_plan_dot_joins_group(100, 40, 101, 40));
    assert_false(fl_plan_dot_joins_group(-1, 40, -1, 40));
}

/* The rows the head reads: every candidate under the sumi head (n + i), the last history row
 * under the dot head (n - 1), none without history (dot) or candidates. */
static void test_selected_rows(void **state)
{
    (void)state;
    fl_model_cfg sumi = {.head = FLAME_HEAD_SUMI}, dot = {.head = FLAME_HEAD_DOT};
    assert_int_equal(fl_plan_selected_count(&sumi, 7, 5), 5);
    assert_int_equal(fl_plan_selected_count(&sumi, 0, 5), 5);
    assert_int_equal(fl_plan_selected_count(&sumi, 7, 0), 0);
    assert_int_equal(fl_plan_selected_position(&sumi, 7, 2), 9);
    assert_int_equal(fl_plan_selected_count(&dot, 7, 5), 1);
    assert_int_equal(fl_plan_selected_count(&dot, 0, 5), 0);
    assert_int_equal(fl_plan_selected_count(&dot, 7, 0), 0);
    assert_int_equal(fl_plan_selected_position(&dot, 7, 0), 6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dot_contiguous_start),
        cmocka_unit_test(test_selected_rows),
        cmocka_unit_test(test_bad_item_ids),
        cmocka_unit_test(test_item_ids_fit_every_item_table),
        cmocka_unit_test(test_bad_side_features),
        cmocka_unit_test(test_bag_num_ids_must_match_final_offset),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_empty_candidates),
        cmocka_unit_test(test_short_histories),
        cmocka_unit_test(test_long_history_keeps_most_recent),
        cmocka_unit_test(test_empty_bag_equals_zero_row),
        cmocka_unit_test(test_sumi_candidates_independent),
        cmocka_unit_test(test_batch_matches_single),
        cmocka_unit_test(test_threads_and_kernels_bitwise),
        cmocka_unit_test(test_cpu_kernels_option),
        cmocka_unit_test(test_parallel_validation_names_first_bad),
        cmocka_unit_test(test_dot_batch_shared_range),
        cmocka_unit_test(test_eight_threads_bitwise),
        cmocka_unit_test(test_config_options),
        cmocka_unit_test(test_config_get_string_size),
        cmocka_unit_test(test_config_messages_name_options),
        cmocka_unit_test(test_device_choice),
        cmocka_unit_test(test_concurrent_calls_with_threaded_blas_warn_once),
        cmocka_unit_test(test_log_hook_swaps_are_safe),
        cmocka_unit_test(test_lifetimes_and_names),
        cmocka_unit_test(test_beauty_sized_scratch),
    };
    return cmocka_run_group_tests_name("engine", tests, setup, teardown);
}
