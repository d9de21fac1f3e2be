/* Metrics: the engine's stage histograms and counters, the scheduler's, the Prometheus text
 * parsed back and checked against the stats and latency structs, the buffer protocol (the size
 * needed, nothing written when short), and argument errors. */
#include <pthread.h>

#include "testutil.h"
#include "tu_gpu.h"
#include "engine/engine.h"
#include "metrics/histogram.h"
#include "sched/sched.h"

static const char *config =
    "{\"format\":\"flame\",\"version\":1,\"d_model\":16,\"max_len\":8,"
    "\"tables\":[{\"name\":\"item\",\"rows\":300,\"dim\":16}],"
    "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
    "\"position\":{\"rule\":\"from_recent\",\"rows\":9,\"candidate_position\":8},"
    "\"blocks\":{\"count\":1,\"num_heads\":2,\"ffn_dim\":32,\"norm\":\"pre\",\"activation\":\"gelu_erf\"},"
    "\"head\":{\"type\":\"sumi\",\"tasks\":[{\"name\":\"a\",\"hidden\":[]}]}}";

typedef struct fixture {
    flame_model *m;
    flame_engine *e;
} fixture;

static int setup(void **state)
{
    tu_gpu_setup(state);
    fixture *f = calloc(1, sizeof *f);
    if (flame_model_create_random(config, 5, &f->m) || flame_engine_create(f->m, NULL, &f->e)) {
        fprintf(stderr, "setup: %s\n", flame_last_error());
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    flame_engine_destroy(f->e);
    flame_model_destroy(f->m);
    free(f);
    return 0;
}

/* The value of the sample `series` (the name with its labels, exactly as written) in a text;
 * fails the test when absent or present twice. */
static double value_of(const char *text, const char *series)
{
    const size_t n = strlen(series);
    const char *hit = NULL;
    for (const char *line = text; *line;) {
        if (!strncmp(line, series, n) && line[n] == ' ') {
            if (hit) fail_msg("series %s appears twice", series);
            hit = line + n + 1;
        }
        const char *nl = strchr(line, '\n');
        if (!nl) break;
        line = nl + 1;
    }
    if (!hit) fail_msg("series %s not in the text", series);
    return strtod(hit, NULL);
}

static char *metrics(flame_engine *e, flame_scheduler *s)
{
    flame_metrics_sources src = {.struct_size = sizeof src, .engine = e, .scheduler = s};
    size_t need = 0;
    assert_int_equal(flame_metrics_text(&src, NULL, 0, &need), FLAME_ERR_BUFFER_TOO_SMALL);
    assert_true(need > 100);
    char *buf = malloc(need + 4096);
    assert_int_equal(flame_metrics_text(&src, buf, need + 4096, &need), FLAME_OK);
    assert_int_equal(strlen(buf) + 1, need);
    return buf;
}

static void request(flame_request *r, int64_t *hist, size_t h, int64_t *cand, size_t m)
{
    for (size_t i = 0; i < h; i++) hist[i] = tu_below(300);
    for (size_t i = 0; i < m; i++) cand[i] = tu_below(300);
    *r = (flame_request){.struct_size = sizeof *r, .history = hist, .history_len = h, .candidates = cand,
                         .num_candidates = m};
}

/* Direct calls: the stage histograms count each successful call once, the counters add up
 * the requests, candidates and tokens, and the text says the same. */
static void test_engine_stages_and_text(void **state)
{
    fixture *f = *state;
    flame_engine *e = NULL;
    assert_int_equal(flame_engine_create(f->m, NULL, &e), FLAME_OK);
    int64_t hist[8], cand[64];
    float scores[64];
    uint64_t cands = 0, tokens = 0;
    for (int i = 0; i < 20; i++) {
        flame_request r;
        size_t h = (size_t)tu_below(9), m = 1 + (size_t)tu_below(64);
        request(&r, hist, h, cand, m);
        assert_int_equal(flame_score(e, &r, scores, 64), FLAME_OK);
        cands += m;
        tokens += h + m; /* the whole history fits max_len 8 */
    }
    flame_request bad;
    request(&bad, hist, 2, cand, 3);
    cand[1] = 300;
    assert_int_equal(flame_score(e, &bad, scores, 64), FLAME_ERR_INVALID_ARG); /* not counted */
    flame_latency lat = {.struct_size = sizeof lat};
    assert_int_equal(flame_engine_get_latency(e, FLAME_STAGE_TOTAL, &lat), FLAME_OK);
    assert_int_equal(lat.count, 20);
    assert_true(lat.p50_us <= lat.p90_us && lat.p90_us <= lat.p99_us && lat.p99_us <= lat.p999_us &&
                lat.p999_us <= lat.max_us);
    assert_true(lat.sum_us >= lat.max_us);
    flame_latency tok = {.struct_size = sizeof tok}, comp = {.struct_size = sizeof comp};
    assert_int_equal(flame_engine_get_latency(e, FLAME_STAGE_TOKENS, &tok), FLAME_OK);
    assert_int_equal(flame_engine_get_latency(e, FLAME_STAGE_COMPUTE, &comp), FLAME_OK);
    assert_int_equal(tok.count, 20);
    assert_int_equal(comp.count, 20);
    assert_true(tok.sum_us + comp.sum_us <= lat.sum_us); /* stages within the call */
    flame_latency none = {.struct_size = sizeof none};
    assert_int_equal(flame_engine_get_latency(e, FLAME_STAGE_FEATURES, &none), FLAME_OK);
    assert_int_equal(none.count, 0); /* no cache: nothing resolved */
    assert_int_equal(flame_engine_get_latency(e, FLAME_STAGE_H2D, &none), FLAME_OK);
    assert_int_equal(none.count, 0); /* the CPU copies nothing to a device */

    char *text = metrics(e, NULL);
    assert_true(value_of(text, "flame_engine_calls_total") == 20);
    assert_true(value_of(text, "flame_engine_requests_total") == 20);
    assert_true(value_of(text, "flame_engine_candidates_total") == (double)cands);
    assert_true(value_of(text, "flame_engine_tokens_total") == (double)tokens);
    assert_true(value_of(text, "flame_engine_stage_seconds_count{stage=\"total\"}") == 20);
    assert_true(value_of(text, "flame_engine_stage_seconds_bucket{stage=\"total\",le=\"+Inf\"}") == 20);
    const double sum = value_of(text, "flame_engine_stage_seconds_sum{stage=\"total\"}");
    assert_true(sum > 0 && fabs(sum - (double)lat.sum_us / 1e6) < 1e-5 + 1e-6 * 20);
    assert_null(strstr(text, "stage=\"h2d\"")); /* CPU engine: no device stages */
    assert_non_null(strstr(text, "# TYPE flame_engine_stage_seconds histogram\n"));
    assert_non_null(strstr(text, "# TYPE flame_engine_calls_total counter\n"));
    /* buckets are cumulative and end at the count */
    double prev = 0;
    static const char *les[] = {"5e-06", "1e-05", "2.5e-05", "5e-05", "0.0001", "0.00025", "0.0005", "0.001",
                                "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5",
                                "5", "10", "+Inf"};
    for (int i = 0; i < 21; i++) {
        char series[96];
        snprintf(series, sizeof series, "flame_engine_stage_seconds_bucket{stage=\"total\",le=\"%s\"}", les[i]);
        double v = value_of(text, series);
        assert_true(v >= prev);
        prev = v;
    }
    free(text);
    flame_engine_destroy(e);
}

/* The Prometheus buckets count each value under the first bound at or above it, exactly. */
static void test_prometheus_buckets_are_exact(void **state)
{
    (void)state;
    static fl_histogram h;
    const uint64_t vals[] = {0, 5, 6, 10, 11, 1000, 1001, 10000000, 10000001, 1ull << 50};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) fl_hist_add(&h, vals[i]);
    assert_int_equal(atomic_load(&h.prom[0]), 2);  /* 0, 5 <= 5 us */
    assert_int_equal(atomic_load(&h.prom[1]), 2);  /* 6, 10 */
    assert_int_equal(atomic_load(&h.prom[2]), 1);  /* 11 */
    assert_int_equal(atomic_load(&h.prom[7]), 1);  /* 1000 <= 1 ms */
    assert_int_equal(atomic_load(&h.prom[8]), 1);  /* 1001 */
    assert_int_equal(atomic_load(&h.prom[19]), 1); /* 10 s */
    assert_int_equal(atomic_load(&h.prom[20]), 2); /* above */
    assert_int_equal(atomic_load(&h.total), 10);
    fl_hist_reset(&h); /* the window only */
    assert_int_equal(fl_hist_quantile(&h, 0.5), 0);
    assert_int_equal(atomic_load(&h.total), 10);
    assert_int_equal(atomic_load(&h.prom[20]), 2);
}

typedef struct done_arg {
    atomic_int calls;
    flame_status status;
} done_arg;
static void on_done(void *user, flame_status st, const char *message)
{
    (void)message;
    done_arg *d = user;
    d->status = st;
    atomic_fetch_add(&d->calls, 1);
}

/* Through a scheduler: its counters, gauges, fill and histograms in the text equal its stats. */
static void test_scheduler_text_matches_stats(void **state)
{
    fixture *f = *state;
    const flame_batch_profile p[] = {{4, 32}, {1, 64}};
    flame_scheduler_params sp = {.struct_size = sizeof sp, .profiles = p, .num_profiles = 2, .max_wait_us = 2000,
                                 .workers = 1};
    flame_scheduler *s = NULL;
    assert_int_equal(flame_scheduler_create(f->e, &sp, &s), FLAME_OK);
    enum { N = 24 };
    static int64_t hist[N][8], cand[N][64];
    static float scores[N][64];
    static done_arg d[N];
    static flame_request r[N];
    uint64_t cands = 0;
    for (int i = 0; i < N; i++) {
        size_t m = 1 + (size_t)tu_below(i % 3 ? 32 : 64);
        request(&r[i], hist[i], (size_t)tu_below(9), cand[i], m);
        cands += m;
        atomic_init(&d[i].calls, 0);
        assert_int_equal(flame_scheduler_submit(s, &r[i], scores[i], 64, on_done, &d[i]), FLAME_OK);
    }
    for (int i = 0; i < N; i++)
        for (int k = 0; k < 100000 && !atomic_load(&d[i].calls); k++) usleep(100);
    for (int i = 0; i < N; i++) assert_int_equal(d[i].status, FLAME_OK);
    flame_scheduler_stats st = {.struct_size = sizeof st};
    assert_int_equal(flame_scheduler_get_stats(s, &st), FLAME_OK);
    assert_int_equal(st.candidates, cands);
    assert_int_equal(st.in_flight, 0);
    assert_true(st.batch_slots_used == cands); /* sumi: the candidates */
    assert_true(st.batch_slots >= st.batch_slots_used);
    flame_latency qw = {.struct_size = sizeof qw}, tot = {.struct_size = sizeof tot};
    assert_int_equal(flame_scheduler_get_latency(s, FLAME_STAGE_QUEUE_WAIT, &qw), FLAME_OK);
    assert_int_equal(flame_scheduler_get_latency(s, FLAME_STAGE_TOTAL, &tot), FLAME_OK);
    assert_int_equal(qw.count, st.parts);
    assert_int_equal(tot.count, N);
    assert_int_equal(tot.p99_us, st.latency_p99_us);

    char *text = metrics(f->e, s);
    assert_true(value_of(text, "flame_scheduler_submitted_total") == N);
    assert_true(value_of(text, "flame_scheduler_requests_total{status=\"ok\"}") == N);
    assert_true(value_of(text, "flame_scheduler_requests_total{status=\"timeout\"}") == 0);
    assert_true(value_of(text, "flame_scheduler_candidates_total") == (double)cands);
    assert_true(value_of(text, "flame_scheduler_parts_total") == (double)st.parts);
    assert_true(value_of(text, "flame_scheduler_batches_total{profile=\"0\",max_users=\"4\",max_candidates=\"32\"}") ==
                (double)st.profile_batches[0]);
    assert_true(value_of(text, "flame_scheduler_batches_total{profile=\"1\",max_users=\"1\",max_candidates=\"64\"}") ==
                (double)st.profile_batches[1]);
    assert_true(value_of(text, "flame_scheduler_batch_slots_used_total") == (double)st.batch_slots_used);
    assert_true(value_of(text, "flame_scheduler_batch_slots_total") == (double)st.batch_slots);
    assert_true(value_of(text, "flame_scheduler_queue_depth{priority=\"normal\"}") == 0);
    assert_true(value_of(text, "flame_scheduler_in_flight_batches") == 0);
    assert_true(value_of(text, "flame_scheduler_workers") == 1);
    assert_true(value_of(text, "flame_scheduler_stage_seconds_count{stage=\"queue_wait\"}") == (double)st.parts);
    assert_true(value_of(text, "flame_scheduler_stage_seconds_count{stage=\"total\"}") == N);
    assert_true(fabs(value_of(text, "flame_scheduler_stage_seconds_sum{stage=\"total\"}") - (double)tot.sum_us / 1e6) <
                1e-6);
    /* the engine's calls are the scheduler's batches */
    assert_true(value_of(text, "flame_engine_calls_total") >= (double)st.batches);
    free(text);
    /* reset_latency empties the percentiles, not the exported histograms (Prometheus counters) */
    assert_int_equal(flame_scheduler_reset_latency(s), FLAME_OK);
    assert_int_equal(flame_scheduler_get_latency(s, FLAME_STAGE_TOTAL, &tot), FLAME_OK);
    assert_int_equal(tot.count, N);
    assert_int_equal(tot.p99_us, 0);
    flame_scheduler_destroy(s);
}

/* A short buffer gets nothing and the size needed; bad arguments name themselves. */
static void test_buffer_protocol_and_errors(void **state)
{
    fixture *f = *state;
    flame_metrics_sources src = {.struct_size = sizeof src, .engine = f->e};
    size_t need = 0;
    assert_status_msg(flame_metrics_text(&src, NULL, 0, &need), FLAME_ERR_BUFFER_TOO_SMALL, "bytes with its NUL");
    char *buf = malloc(need);
    memset(buf, 'x', need);
    assert_status_msg(flame_metrics_text(&src, buf, need - 1, NULL), FLAME_ERR_BUFFER_TOO_SMALL, "buf has");
    for (size_t i = 0; i < need; i++) assert_int_equal(buf[i], 'x'); /* untouched */
    size_t need2 = 0;
    assert_int_equal(flame_metrics_text(&src, buf, need, &need2), FLAME_OK);
    assert_int_equal(need2, need);
    assert_int_equal(buf[need - 1], '\0');
    free(buf);
    /* nothing to report: an empty text */
    flame_metrics_sources none = {.struct_size = sizeof none};
    char one[1] = {'x'};
    assert_int_equal(flame_metrics_text(&none, one, 1, &need), FLAME_OK);
    assert_int_equal(need, 1);
    assert_int_equal(one[0], '\0');
    assert_status_msg(flame_metrics_text(NULL, one, 1, NULL), FLAME_ERR_INVALID_ARG, "sources is NULL");
    assert_status_msg(flame_metrics_text(&src, NULL, 5, NULL), FLAME_ERR_INVALID_ARG, "buf is NULL with buf_len 5");
    src.struct_size = 2;
    assert_status_msg(flame_metrics_text(&src, one, 1, NULL), FLAME_ERR_INVALID_ARG,
                      "flame_metrics_sources.struct_size = 2");
    /* 12 ends inside the engine pointer: copying it would take half an address */
    src.struct_size = 12;
    assert_status_msg(flame_metrics_text(&src, one, 1, NULL), FLAME_ERR_INVALID_ARG,
                      "flame_metrics_sources.struct_size = 12: set it to sizeof(flame_metrics_sources)");
    /* a scheduler over another engine */
    flame_engine *other = NULL;
    assert_int_equal(flame_engine_create(f->m, NULL, &other), FLAME_OK);
    flame_scheduler *s = NULL;
    assert_int_equal(flame_scheduler_create(other, NULL, &s), FLAME_OK);
    src = (flame_metrics_sources){.struct_size = sizeof src, .engine = f->e, .scheduler = s};
    assert_status_msg(flame_metrics_text(&src, one, 1, NULL), FLAME_ERR_INVALID_ARG, "another engine");
    flame_latency lat = {.struct_size = sizeof lat};
    assert_status_msg(flame_scheduler_get_latency(s, FLAME_STAGE_COMPUTE, &lat), FLAME_ERR_INVALID_ARG,
                      "stage 4 (compute) is not timed by a scheduler");
    assert_status_msg(flame_engine_get_latency(f->e, FLAME_STAGE_QUEUE_WAIT, &lat), FLAME_ERR_INVALID_ARG,
                      "stage 0 (queue_wait) is not timed by an engine");
    assert_status_msg(flame_engine_get_latency(f->e, (flame_stage)9, &lat), FLAME_ERR_INVALID_ARG, "stage 9");
    assert_status_msg(flame_engine_get_latency(NULL, FLAME_STAGE_TOTAL, &lat), FLAME_ERR_INVALID_ARG, "engine is NULL");
    lat.struct_size = 5000;
    assert_status_msg(flame_engine_get_latency(f->e, FLAME_STAGE_TOTAL, &lat), FLAME_ERR_INVALID_ARG,
                      "flame_latency.struct_size = 5000");
    flame_scheduler_destroy(s);
    flame_engine_destroy(other);
}

/* A GPU engine times its device stages with CUDA events: every successful call has a compute
 * and a D2H sample, the uncaptured passes an H2D one (a replayed CUDA graph holds its upload),
 * and the text carries them. Skipped without a GPU (make test-gpu requires one). */
static void test_gpu_stages(void **state)
{
    TU_NEED_GPU();
    fixture *f = *state;
    flame_config *cfg = NULL;
    flame_engine *g = NULL;
    assert_int_equal(flame_config_create(&cfg), FLAME_OK);
    assert_int_equal(flame_config_set_string(cfg, FLAME_OPT_DEVICE, "cuda"), FLAME_OK);
    if (flame_engine_create(f->m, cfg, &g) != FLAME_OK) fail_msg("GPU engine: %s", flame_last_error());
    flame_config_destroy(cfg);
    int64_t hist[8], cand[64];
    float scores[64];
    flame_request r;
    request(&r, hist, 6, cand, 40);
    for (int i = 0; i < 6; i++) assert_int_equal(flame_score(g, &r, scores, 64), FLAME_OK); /* one shape: captured, replayed */
    request(&r, hist, 3, cand, 17);
    assert_int_equal(flame_score(g, &r, scores, 64), FLAME_OK); /* a new shape: eager */
    flame_latency l[7];
    for (int k = FLAME_STAGE_FEATURES; k <= FLAME_STAGE_TOTAL; k++) {
        l[k] = (flame_latency){.struct_size = sizeof l[k]};
        assert_int_equal(flame_engine_get_latency(g, (flame_stage)k, &l[k]), FLAME_OK);
    }
    assert_int_equal(l[FLAME_STAGE_TOTAL].count, 7);
    assert_int_equal(l[FLAME_STAGE_TOKENS].count, 7);
    assert_int_equal(l[FLAME_STAGE_COMPUTE].count, 7);
    assert_int_equal(l[FLAME_STAGE_D2H].count, 7);
    assert_true(l[FLAME_STAGE_H2D].count >= 2 && l[FLAME_STAGE_H2D].count <= 7); /* at least the two first passes */
    assert_true(l[FLAME_STAGE_COMPUTE].sum_us > 0);
    assert_true(l[FLAME_STAGE_COMPUTE].sum_us + l[FLAME_STAGE_D2H].sum_us <= l[FLAME_STAGE_TOTAL].sum_us + 7);
    char *text = metrics(g, NULL);
    assert_true(value_of(text, "flame_engine_stage_seconds_count{stage=\"d2h\"}") == 7);
    assert_true(value_of(text, "flame_engine_stage_seconds_count{stage=\"h2d\"}") == (double)l[FLAME_STAGE_H2D].count);
    assert_true(value_of(text, "flame_engine_cuda_graph_replays_total") >= 0);
    free(text);
    flame_engine_destroy(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_stages_and_text),
        cmocka_unit_test(test_prometheus_buckets_are_exact),
        cmocka_unit_test(test_scheduler_text_matches_stats),
        cmocka_unit_test(test_buffer_protocol_and_errors),
        cmocka_unit_test(test_gpu_stages),
    };
    return cmocka_run_group_tests_name("metrics", tests, setup, teardown);
}
