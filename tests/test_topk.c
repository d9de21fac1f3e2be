/* flame_score_batch_topk against a full sort of flame_score_batch's scores on fresh random
 * models: the whole catalogue as one range (full-sort retrieval), random candidates with
 * repeated items (ties: lower id, then the earlier candidate), fewer candidates than k, none,
 * one item 100 times (ties across the k-th place: on the GPU the host's fallback);
 * a multi-task model ranked by its second task; every refusal, with the outputs untouched;
 * and the same on the GPU engine where one is usable. */
#include "testutil.h"
#include "tu_gpu.h"
#include "tu_models.h"

enum { ITEMS = 3000, K = 50 };

typedef struct {
    float score;
    int64_t id;
    size_t pos;
} entry;

static int cmp_entry(const void *pa, const void *pb)
{
    const entry *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->id != b->id) return a->id < b->id ? -1 : 1;
    return a->pos < b->pos ? -1 : a->pos > b->pos;
}

/* requests: 0 the whole catalogue, 1 random ids with repeats, 2 fewer than k, 3 none, 4 one
 * item 100 times */
enum { NREQ = 5 };
typedef struct {
    int64_t hist[NREQ][8], cand1[400], cand2[7], cand4[100], *all;
    flame_request req[NREQ];
} fixture;

static void make_requests(fixture *f, int32_t side)
{
    f->all = malloc(ITEMS * sizeof *f->all);
    for (int i = 0; i < ITEMS; i++) f->all[i] = i;
    for (int r = 0; r < NREQ; r++)
        for (int i = 0; i < 8; i++) f->hist[r][i] = tu_below(ITEMS);
    const int64_t same = tu_below(ITEMS);
    for (int i = 0; i < 100; i++) f->cand4[i] = same;
    for (int i = 0; i < 400; i++) f->cand1[i] = i % 3 == 0 && i ? f->cand1[i - 1] : tu_below(ITEMS);
    for (int i = 0; i < 7; i++) f->cand2[i] = tu_below(ITEMS);
    const int64_t *c[NREQ] = {f->all, f->cand1, f->cand2, NULL, f->cand4};
    const size_t m[NREQ] = {ITEMS, 400, 7, 0, 100};
    for (int r = 0; r < NREQ; r++)
        f->req[r] = (flame_request){.struct_size = sizeof f->req[r], .history = f->hist[r], .history_len = 8,
                                    .candidates = c[r], .num_candidates = m[r], .num_side_features = (size_t)side};
}

/* top-k of every request against the full sort of the same engine's scores */
static void check_engine(flame_engine *e, fixture *f, int32_t tasks, uint32_t task, const char *label)
{
    size_t total = 0;
    for (int r = 0; r < NREQ; r++) total += f->req[r].num_candidates * (size_t)tasks;
    float *sc = malloc(total * sizeof *sc);
    assert_int_equal(flame_score_batch(e, f->req, NREQ, sc, total), FLAME_OK);
    int64_t ids[NREQ * K + 1];
    float got[NREQ * K + 1];
    for (int i = 0; i < NREQ * K + 1; i++) ids[i] = -7, got[i] = NAN;
    if (flame_score_batch_topk(e, f->req, NREQ, K, task, ids, got, NREQ * K)) fail_msg("%s: %s", label, flame_last_error());
    assert_int_equal(ids[NREQ * K], -7); /* nothing past num_requests * k */
    size_t off = 0;
    for (int r = 0; r < NREQ; r++) {
        const size_t m = f->req[r].num_candidates;
        entry *all = malloc((m + 1) * sizeof *all);
        for (size_t i = 0; i < m; i++) all[i] = (entry){sc[off + i * tasks + task], f->req[r].candidates[i], i};
        qsort(all, m, sizeof *all, cmp_entry);
        for (size_t j = 0; j < K; j++) {
            if (j < m) {
                if (ids[r * K + j] != all[j].id || got[r * K + j] != all[j].score)
                    fail_msg("%s request %d rank %zu: id %lld score %.9g, full sort %lld %.9g", label, r, j,
                             (long long)ids[r * K + j], got[r * K + j], (long long)all[j].id, all[j].score);
            } else {
                assert_int_equal(ids[r * K + j], -1);
                assert_true(isinf(got[r * K + j]) && got[r * K + j] < 0);
            }
        }
        free(all);
        off += m * (size_t)tasks;
    }
    fprintf(stderr, "# %s: top %d of %d, 400, 7, 0 and 100 (one item) candidates match the full sort\n", label, K, ITEMS);
    free(sc);
}

static void test_dot_head_matches_full_sort(void **state)
{
    (void)state;
    flame_model *m = NULL;
    flame_engine *e = NULL;
    assert_int_equal(flame_model_create_random(TU_DOT_CONFIG(3000, 2, ""), tu_u64(), &m), FLAME_OK);
    assert_int_equal(flame_engine_create(m, NULL, &e), FLAME_OK);
    fixture f;
    make_requests(&f, 0);
    check_engine(e, &f, 1, 0, "cpu dot");
    free(f.all);
    flame_engine_destroy(e);
    flame_model_destroy(m);
}

/* the sumi head without side features: two tasks, ranked by the second */
#define SUMI_CONFIG                                                                                                     \
    "{\"format\":\"flame\",\"version\":1,\"d_model\":16,\"max_len\":8,"                                                 \
    "\"tables\":[{\"name\":\"item\",\"rows\":3000,\"dim\":16}],"                                                        \
    "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"                                         \
    "\"blocks\":{\"count\":1,\"num_heads\":2,\"ffn_dim\":32,\"norm\":\"pre\",\"activation\":\"relu\"},"                  \
    "\"head\":{\"type\":\"sumi\",\"tasks\":[{\"name\":\"a\",\"hidden\":[8]},{\"name\":\"b\",\"hidden\":[]}]}}"

static void test_sumi_second_task(void **state)
{
    (void)state;
    flame_model *m = NULL;
    flame_engine *e = NULL;
    assert_int_equal(flame_model_create_random(SUMI_CONFIG, tu_u64(), &m), FLAME_OK);
    assert_int_equal(flame_engine_create(m, NULL, &e), FLAME_OK);
    fixture f;
    make_requests(&f, 0);
    check_engine(e, &f, 2, 1, "cpu sumi task 1");
    free(f.all);
    flame_engine_destroy(e);
    flame_model_destroy(m);
}

static void test_refusals_write_nothing(void **state)
{
    (void)state;
    flame_model *m = NULL;
    flame_engine *e = NULL;
    assert_int_equal(flame_model_create_random(SUMI_CONFIG, tu_u64(), &m), FLAME_OK);
    assert_int_equal(flame_engine_create(m, NULL, &e), FLAME_OK);
    fixture f;
    make_requests(&f, 0);
    int64_t ids[4 * 8];
    float sc[4 * 8];
    for (int i = 0; i < 32; i++) ids[i] = -7, sc[i] = 9.0f;
    assert_status_msg(flame_score_batch_topk(e, f.req, 4, 0, 0, ids, sc, 32), FLAME_ERR_INVALID_ARG,
                      "k = 0 is out of range [1, 1024]");
    assert_status_msg(flame_score_batch_topk(e, f.req, 4, 1025, 0, ids, sc, 32), FLAME_ERR_INVALID_ARG,
                      "k = 1025 is out of range [1, 1024]");
    assert_status_msg(flame_score_batch_topk(e, f.req, 4, 8, 2, ids, sc, 32), FLAME_ERR_INVALID_ARG,
                      "task 2: the model scores 2 task(s)");
    assert_status_msg(flame_score_batch_topk(e, f.req, 4, 8, 0, ids, sc, 31), FLAME_ERR_BUFFER_TOO_SMALL,
                      "room for 31 entries, 4 request(s) x k 8 need 32");
    assert_status_msg(flame_score_batch_topk(e, f.req, 4, 8, 0, NULL, sc, 32), FLAME_ERR_INVALID_ARG, "NULL");
    assert_status_msg(flame_score_batch_topk(NULL, f.req, 4, 8, 0, ids, sc, 32), FLAME_ERR_INVALID_ARG, "engine is NULL");
    /* outputs over a request's arrays: the selection would read ids it had overwritten */
    int64_t keep[400];
    memcpy(keep, f.cand1, sizeof keep);
    assert_status_msg(flame_score_batch_topk(e, f.req, 4, 8, 0, f.cand1 + 100, sc, 32), FLAME_ERR_INVALID_ARG,
                      "request 1: ids overlaps its candidates");
    assert_status_msg(flame_score_batch_topk(e, f.req, 4, 8, 0, ids, (float *)f.hist[2], 32), FLAME_ERR_INVALID_ARG,
                      "request 2: scores overlaps its history");
    assert_status_msg(flame_score_batch_topk(e, f.req, 4, 8, 0, (int64_t *)&f.req[1], sc, 32), FLAME_ERR_INVALID_ARG,
                      "ids overlaps the requests");
    assert_memory_equal(keep, f.cand1, sizeof keep);
    f.cand1[17] = ITEMS; /* a bad id in request 1: flame_score_batch's refusal, nothing written */
    assert_status_msg(flame_score_batch_topk(e, f.req, 4, 8, 0, ids, sc, 32), FLAME_ERR_INVALID_ARG,
                      "id 3000 out of range [0, 3000)");
    for (int i = 0; i < 32; i++) {
        assert_int_equal(ids[i], -7);
        assert_true(sc[i] == 9.0f);
    }
    assert_int_equal(flame_score_batch_topk(e, f.req, 0, 8, 0, NULL, NULL, 0), FLAME_OK); /* no requests */
    /* the array's elements are request 0's struct_size apart: one claiming more is refused before
     * it is read as that many bytes (that read went past the array; ASan sees it) */
    size_t *two = malloc(2 * sizeof *two);
    two[0] = 8, two[1] = sizeof(flame_request);
    char want[160];
    snprintf(want, sizeof want, "request 1: struct_size = %zu, but the array's elements are 8 bytes apart",
             sizeof(flame_request));
    assert_status_msg(flame_score_batch_topk(e, (const flame_request *)two, 2, 8, 0, ids, sc, 32),
                      FLAME_ERR_INVALID_ARG, want);
    free(two);
    free(f.all);
    flame_engine_destroy(e);
    flame_model_destroy(m);
}

static void test_gpu_engine_matches_full_sort(void **state)
{
    TU_NEED_GPU();
    flame_model *m = NULL;
    flame_config *c = NULL;
    flame_engine *e = NULL;
    assert_int_equal(flame_model_create_random(TU_DOT_CONFIG(3000, 2, ""), tu_u64(), &m), FLAME_OK);
    assert_int_equal(flame_config_create(&c), FLAME_OK);
    assert_int_equal(flame_config_set_string(c, FLAME_OPT_DEVICE, "cuda"), FLAME_OK);
    assert_int_equal(flame_config_set_string(c, FLAME_OPT_DTYPE, "fp16"), FLAME_OK);
    if (flame_engine_create(m, c, &e)) fail_msg("cuda engine: %s", flame_last_error());
    flame_config_destroy(c);
    fixture f;
    make_requests(&f, 0);
    check_engine(e, &f, 1, 0, "gpu dot fp16");
    free(f.all);
    flame_engine_destroy(e);
    flame_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dot_head_matches_full_sort),
        cmocka_unit_test(test_sumi_second_task),
        cmocka_unit_test(test_refusals_write_nothing),
        cmocka_unit_test(test_gpu_engine_matches_full_sort),
    };
    return cmocka_run_group_tests(tests, tu_gpu_setup, NULL);
}
