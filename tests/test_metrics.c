/* Metrics: the engine's stage histograms and counters, the scheduler's, the Prometheus text
 * parsed back and checked against the stats and latency structs, the buffer protocol (the size
 * needed, nothing written when short), and argument errors. Feature resolution in its parts:
 * the user cache's and the item cache's lookups and the feature source's fetches (a callback
 * that sleeps a known time), a refresh-ahead fetch charged to no call. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>

#include "testutil.h"
#include "tu_gpu.h"
#include "tu_models.h"
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
    for (int k = FLAME_STAGE_USER_CACHE; k <= FLAME_STAGE_SOURCE_FETCH; k++) { /* no caches */
        assert_int_equal(flame_engine_get_latency(e, (flame_stage)k, &none), FLAME_OK);
        assert_int_equal(none.count, 0);
        assert_int_equal(none.sum_us, 0);
    }

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
    assert_null(strstr(text, "stage=\"user_cache\"")); /* no caches: no cache stages */
    assert_null(strstr(text, "stage=\"item_cache\""));
    assert_null(strstr(text, "stage=\"source_fetch\""));
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
    assert_status_msg(flame_scheduler_get_latency(s, FLAME_STAGE_SOURCE_FETCH, &lat), FLAME_ERR_INVALID_ARG,
                      "stage 9 (source_fetch) is not timed by a scheduler");
    assert_status_msg(flame_engine_get_latency(f->e, (flame_stage)10, &lat), FLAME_ERR_INVALID_ARG,
                      "stage 10 (unknown) is not timed by an engine (FLAME_STAGE_FEATURES..SOURCE_FETCH)");
    assert_status_msg(flame_engine_get_latency(f->e, (flame_stage)-1, &lat), FLAME_ERR_INVALID_ARG, "stage -1");
    assert_status_msg(flame_engine_get_latency(NULL, FLAME_STAGE_TOTAL, &lat), FLAME_ERR_INVALID_ARG, "engine is NULL");
    lat.struct_size = 5000;
    assert_status_msg(flame_engine_get_latency(f->e, FLAME_STAGE_TOTAL, &lat), FLAME_ERR_INVALID_ARG,
                      "flame_latency.struct_size = 5000");
    flame_scheduler_destroy(s);
    flame_engine_destroy(other);
}

/* ---- feature resolution in parts */

/* The feature source of the cache tests: tu_item_record for every id, after sleeping
 * FETCH_SLEEP_US (at least); fails while fail_fetches. It adds its own time, on the stage
 * clock, to callback_us: the fetch stage, timed around each call of it, can be no less. */
#define FETCH_SLEEP_US 2000
static atomic_int fetch_calls, fetched_ids, fail_fetches;
static atomic_int gate_closed, in_callback; /* a fetch waits while the gate is closed */
static _Atomic uint64_t callback_us;
static flame_status slow_fetch(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)user;
    const uint64_t t0 = fl_now_us();
    atomic_fetch_add(&fetch_calls, 1);
    atomic_fetch_add(&fetched_ids, (int)n);
    atomic_store(&in_callback, 1);
    while (atomic_load(&gate_closed)) usleep(100);
    struct timespec ts = {0, FETCH_SLEEP_US * 1000L};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
    flame_status st = FLAME_OK;
    if (atomic_load(&fail_fetches))
        st = FLAME_ERR_UNAVAILABLE;
    else
        for (size_t i = 0; i < n; i++) {
            int64_t offs[3], v[3];
            tu_item_record(ids[i], offs, v);
            flame_feature_batch_set(out, i, offs, v, (size_t)offs[2], NULL, 0);
        }
    atomic_fetch_add(&callback_us, fl_now_us() - t0);
    return st;
}

/* The cache clock of the refresh test, read by the refresh thread too. */
static _Atomic uint64_t cache_now;
static uint64_t cache_clock(void *user)
{
    (void)user;
    return atomic_load(&cache_now);
}

static flame_item_cache *slow_cache(const flame_item_cache_params *p)
{
    flame_feature_source *src = NULL;
    flame_item_cache *c = NULL;
    atomic_store(&fetch_calls, 0);
    atomic_store(&fetched_ids, 0);
    atomic_store(&fail_fetches, 0);
    atomic_store(&gate_closed, 0);
    atomic_store(&in_callback, 0);
    atomic_store(&callback_us, 0);
    assert_int_equal(flame_feature_source_create_callback(2, slow_fetch, NULL, NULL, &src), FLAME_OK);
    assert_int_equal(flame_item_cache_create(src, p, &c), FLAME_OK);
    flame_feature_source_destroy(src); /* the cache holds it */
    return c;
}

/* An engine over `model` with the caches given (either may be NULL). */
static flame_engine *engine_with(flame_model *model, flame_item_cache *ic, flame_user_cache *uc)
{
    flame_config *cfg = NULL;
    flame_engine *e = NULL;
    assert_int_equal(flame_config_create(&cfg), FLAME_OK);
    if (ic) assert_int_equal(flame_config_set_pointer(cfg, FLAME_OPT_ITEM_CACHE, ic), FLAME_OK);
    if (uc) assert_int_equal(flame_config_set_pointer(cfg, FLAME_OPT_USER_CACHE, uc), FLAME_OK);
    assert_int_equal(flame_engine_create(model, cfg, &e), FLAME_OK);
    flame_config_destroy(cfg);
    return e;
}

/* The engine's latency of every stage, indexed by flame_stage (QUEUE_WAIT's left zero). */
typedef struct stages {
    flame_latency l[FLAME_STAGE_SOURCE_FETCH + 1];
} stages;
static stages stages_of(flame_engine *e)
{
    stages s = {0};
    for (int k = FLAME_STAGE_FEATURES; k <= FLAME_STAGE_SOURCE_FETCH; k++) {
        s.l[k].struct_size = sizeof s.l[k];
        assert_int_equal(flame_engine_get_latency(e, (flame_stage)k, &s.l[k]), FLAME_OK);
    }
    return s;
}
#define FEAT(s) ((s).l[FLAME_STAGE_FEATURES])
#define UCACHE(s) ((s).l[FLAME_STAGE_USER_CACHE])
#define ICACHE(s) ((s).l[FLAME_STAGE_ITEM_CACHE])
#define FETCH(s) ((s).l[FLAME_STAGE_SOURCE_FETCH])

/* Each call's FEATURES sample is its USER_CACHE plus its ITEM_CACHE, in whole microseconds,
 * and its SOURCE_FETCH lies within its ITEM_CACHE. */
static void assert_parts_add_up(const stages *s)
{
    assert_int_equal(FEAT(*s).sum_us, UCACHE(*s).sum_us + ICACHE(*s).sum_us);
    assert_true(FETCH(*s).sum_us <= ICACHE(*s).sum_us);
    assert_true(FETCH(*s).count <= ICACHE(*s).count);
}

/* The text's series of a stage equal its latency struct: count, sum, and the +Inf bucket. */
static void assert_text_stage(const char *text, const char *stage, const flame_latency *l)
{
    char series[128];
    snprintf(series, sizeof series, "flame_engine_stage_seconds_count{stage=\"%s\"}", stage);
    assert_true(value_of(text, series) == (double)l->count);
    snprintf(series, sizeof series, "flame_engine_stage_seconds_bucket{stage=\"%s\",le=\"+Inf\"}", stage);
    assert_true(value_of(text, series) == (double)l->count);
    snprintf(series, sizeof series, "flame_engine_stage_seconds_sum{stage=\"%s\"}", stage);
    assert_true(fabs(value_of(text, series) - (double)l->sum_us / 1e6) < 1e-9);
}

static const char *side_config = TU_SUMI_SIDE_CONFIG(100, 12, 13, gelu_tanh);

/* Id-only requests (no side features given) of the two-slot sumi model. */
static flame_request id_only(const int64_t *h, size_t n, const int64_t *c, size_t m)
{
    return (flame_request){.struct_size = sizeof(flame_request), .history = h, .history_len = n, .candidates = c,
                           .num_candidates = m, .num_side_features = 2};
}

/* The item cache: a call that misses records its fetch (one sample, at least the source's
 * sleep) inside its item-cache time; a call that hits records item-cache time and no fetch; a
 * call that gives its bags, or fails, records neither. */
static void test_item_cache_and_fetch_stages(void **state)
{
    (void)state;
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(side_config, 3, &m), FLAME_OK);
    flame_item_cache_params p = {.struct_size = sizeof p, .manual_refresh = 1};
    flame_item_cache *ic = slow_cache(&p);
    flame_engine *e = engine_with(m, ic, NULL);
    int64_t h[3] = {1, 2, 3}, c[2] = {4, 5};
    flame_request r = id_only(h, 3, c, 2);
    float scores[4];

    /* five ids, none cached: one fetch */
    assert_int_equal(flame_score(e, &r, scores, 4), FLAME_OK);
    assert_int_equal(atomic_load(&fetch_calls), 1);
    stages s = stages_of(e);
    assert_int_equal(ICACHE(s).count, 1);
    assert_int_equal(FETCH(s).count, 1);
    assert_true(FETCH(s).sum_us >= FETCH_SLEEP_US);
    assert_true(FETCH(s).sum_us >= atomic_load(&callback_us));
    assert_int_equal(FEAT(s).count, 1);
    assert_int_equal(UCACHE(s).count, 0);
    assert_true(s.l[FLAME_STAGE_TOTAL].sum_us >= ICACHE(s).sum_us);
    assert_parts_add_up(&s);
    const uint64_t first_fetch = FETCH(s).sum_us;

    /* the same ids again: all hits, no fetch */
    assert_int_equal(flame_score(e, &r, scores, 4), FLAME_OK);
    assert_int_equal(atomic_load(&fetch_calls), 1);
    s = stages_of(e);
    assert_int_equal(ICACHE(s).count, 2);
    assert_int_equal(FETCH(s).count, 1);
    assert_int_equal(FETCH(s).sum_us, first_fetch);
    assert_int_equal(FEAT(s).count, 2);
    assert_parts_add_up(&s);

    /* a batch: one request gives its bags, two are id-only, one new id among them: one sample
     * per call (not per request), one fetch of one id */
    int64_t h2[2] = {77, 1}, c2[1] = {2};
    static tu_side_bags hb, cb;
    tu_side_bags_build(&hb, h, 3, NULL);
    tu_side_bags_build(&cb, c, 2, NULL);
    flame_request given = id_only(h, 3, c, 2);
    given.history_side = hb.b, given.candidate_side = cb.b;
    flame_request three[3] = {given, id_only(h2, 2, c2, 1), r};
    float scores3[10];
    assert_int_equal(flame_score_batch(e, three, 3, scores3, 10), FLAME_OK);
    assert_int_equal(atomic_load(&fetch_calls), 2);
    assert_int_equal(atomic_load(&fetched_ids), 6);
    s = stages_of(e);
    assert_int_equal(ICACHE(s).count, 3);
    assert_int_equal(FETCH(s).count, 2);
    assert_true(FETCH(s).sum_us >= first_fetch + FETCH_SLEEP_US);
    assert_true(FETCH(s).sum_us >= atomic_load(&callback_us));
    assert_parts_add_up(&s);

    /* bags given: the item cache is not asked, nothing is resolved */
    assert_int_equal(flame_score(e, &given, scores, 4), FLAME_OK);
    stages g = stages_of(e);
    assert_int_equal(g.l[FLAME_STAGE_TOTAL].count, 4);
    assert_int_equal(ICACHE(g).count, 3);
    assert_int_equal(FEAT(g).count, 3);
    assert_int_equal(FETCH(g).count, 2);

    /* a fetch that fails fails the call: no stage of it is recorded */
    atomic_store(&fail_fetches, 1);
    int64_t c3[1] = {88};
    flame_request miss = id_only(h, 3, c3, 1);
    assert_int_equal(flame_score(e, &miss, scores, 4), FLAME_ERR_UNAVAILABLE);
    assert_int_equal(atomic_load(&fetch_calls), 3);
    stages after = stages_of(e);
    for (int k = FLAME_STAGE_FEATURES; k <= FLAME_STAGE_SOURCE_FETCH; k++) {
        assert_int_equal(after.l[k].count, g.l[k].count);
        assert_int_equal(after.l[k].sum_us, g.l[k].sum_us);
    }

    char *text = metrics(e, NULL);
    assert_text_stage(text, "features", &FEAT(after));
    assert_text_stage(text, "item_cache", &ICACHE(after));
    assert_text_stage(text, "source_fetch", &FETCH(after));
    assert_null(strstr(text, "stage=\"user_cache\"")); /* no user cache, no sample */
    /* each fetch slept 2 ms: both fetch samples are above the 1 ms bound, none below */
    assert_true(value_of(text, "flame_engine_stage_seconds_bucket{stage=\"source_fetch\",le=\"0.001\"}") == 0);
    assert_true(value_of(text, "flame_engine_stage_seconds_bucket{stage=\"source_fetch\",le=\"+Inf\"}") == 2);
    assert_true(value_of(text, "flame_item_cache_fetches_total") == 3);
    free(text);

    flame_item_cache_destroy(ic);
    flame_engine_destroy(e);
    flame_model_destroy(m);
}

typedef struct scorer_arg {
    flame_engine *e;
    const flame_request *r;
    flame_status st;
} scorer_arg;
static void *scorer(void *p)
{
    scorer_arg *a = p;
    float scores[2];
    a->st = flame_score(a->e, a->r, scores, 2);
    return NULL;
}

/* A call that misses ids another call is fetching waits for that fetch (single-flight): it
 * asks the source nothing, but its wait is its fetch time, so both calls have a sample. */
static void test_waiting_for_another_calls_fetch(void **state)
{
    (void)state;
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(side_config, 3, &m), FLAME_OK);
    flame_item_cache_params p = {.struct_size = sizeof p, .manual_refresh = 1};
    flame_item_cache *ic = slow_cache(&p);
    flame_engine *e = engine_with(m, ic, NULL);
    int64_t h[2] = {40, 41}, c[1] = {42};
    flame_request r = id_only(h, 2, c, 1);
    scorer_arg a = {e, &r, FLAME_ERR_INTERNAL}, b = a;
    pthread_t ta, tb;
    atomic_store(&gate_closed, 1);
    assert_int_equal(pthread_create(&ta, NULL, scorer, &a), 0);
    for (int i = 0; i < 100000 && !atomic_load(&in_callback); i++) usleep(100); /* a is fetching */
    assert_true(atomic_load(&in_callback));
    assert_int_equal(pthread_create(&tb, NULL, scorer, &b), 0);
    flame_item_cache_stats cs = {.struct_size = sizeof cs};
    for (int i = 0; i < 100000; i++) { /* b has missed the three ids, so joined their flights */
        assert_int_equal(flame_item_cache_get_stats(ic, &cs), FLAME_OK);
        if (cs.misses == 6) break;
        usleep(100);
    }
    assert_int_equal(cs.misses, 6);
    atomic_store(&gate_closed, 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    assert_int_equal(a.st, FLAME_OK);
    assert_int_equal(b.st, FLAME_OK);
    assert_int_equal(atomic_load(&fetch_calls), 1);
    stages s = stages_of(e);
    assert_int_equal(ICACHE(s).count, 2);
    assert_int_equal(FETCH(s).count, 2);
    assert_true(FETCH(s).sum_us >= atomic_load(&callback_us)); /* a's fetch, and b's wait */
    assert_parts_add_up(&s);
    flame_item_cache_destroy(ic);
    flame_engine_destroy(e);
    flame_model_destroy(m);
}

/* Refresh-ahead: a hit past an entry's refresh point queues its refetch, which the cache's own
 * thread makes while the call returns: the fetch is charged to no call. */
static void test_refresh_ahead_is_charged_to_no_call(void **state)
{
    (void)state;
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(side_config, 3, &m), FLAME_OK);
    /* a TTL of 1 s (on the test's clock), refreshed from half of it on, from the first hit */
    flame_item_cache_params p = {.struct_size = sizeof p, .hot_ttl_us = 1000000, .cold_ttl_us = 1000000,
                                 .refresh_percent = 50, .refresh_min_hits = 1};
    flame_item_cache *ic = slow_cache(&p);
    atomic_store(&cache_now, 1000000000);
    assert_int_equal(flame_item_cache_set_clock(ic, cache_clock, NULL), FLAME_OK);
    flame_engine *e = engine_with(m, ic, NULL);
    int64_t h[2] = {30, 31}, c[1] = {32};
    flame_request r = id_only(h, 2, c, 1);
    float scores[2];
    assert_int_equal(flame_score(e, &r, scores, 2), FLAME_OK); /* misses: fetched by the call */
    assert_int_equal(atomic_load(&fetch_calls), 1);
    stages s = stages_of(e);
    assert_int_equal(FETCH(s).count, 1);
    assert_true(FETCH(s).sum_us >= atomic_load(&callback_us));
    const uint64_t fetch_sum = FETCH(s).sum_us;

    atomic_fetch_add(&cache_now, 600000); /* past the refresh point, before the expiry */
    assert_int_equal(flame_score(e, &r, scores, 2), FLAME_OK); /* hits, which queue the refresh */
    flame_item_cache_stats cs = {.struct_size = sizeof cs};
    for (int i = 0; i < 5000; i++) { /* the refresh thread fetches the three ids */
        assert_int_equal(flame_item_cache_get_stats(ic, &cs), FLAME_OK);
        if (cs.refreshes == 3) break;
        usleep(1000);
    }
    assert_int_equal(cs.refreshes, 3);
    assert_int_equal(cs.hits, 3);
    assert_int_equal(atomic_load(&fetched_ids), 6); /* (in one fetch or more: the thread may wake between) */
    s = stages_of(e);
    assert_int_equal(ICACHE(s).count, 2);
    assert_int_equal(FETCH(s).count, 1); /* the refresh is no call's */
    assert_int_equal(FETCH(s).sum_us, fetch_sum);
    assert_parts_add_up(&s);

    flame_item_cache_destroy(ic);
    flame_engine_destroy(e);
    flame_model_destroy(m);
}

/* The user cache: a call with requests that take their history from it records user-cache
 * time whether the user is found or not, and no fetch (a miss scores the empty history; the
 * user cache has no feature source behind it). With the item cache behind the user cache's
 * histories, a call records both, FEATURES being their sum, and its misses' fetch. */
static void test_user_cache_stages(void **state)
{
    fixture *f = *state;
    char name[64];
    snprintf(name, sizeof name, "/flame-metrics-uc-%d", (int)getpid());
    flame_user_cache_unlink(name);
    flame_user_cache_params up = {.struct_size = sizeof up, .capacity = 64, .num_slots = 1, .max_ids = 16,
                                  .mode = 0600};
    flame_user_cache *uc = NULL;
    assert_int_equal(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE, &up, &uc), FLAME_OK);
    int64_t hist[3] = {10, 11, 12};
    uint32_t len = 3;
    flame_user_features uf = {.struct_size = sizeof uf, .ids = hist, .num_ids = 3, .slot_lens = &len};
    assert_int_equal(flame_user_cache_put(uc, 7, &uf), FLAME_OK);

    /* the fixture's model (no side features): the user cache alone */
    flame_engine *e = engine_with(f->m, NULL, uc);
    int64_t cand[2] = {4, 5};
    flame_request hit = {.struct_size = sizeof hit, .user_id = 7, .candidates = cand, .num_candidates = 2,
                         .history_from_user_cache = 1};
    flame_request miss = hit;
    miss.user_id = 8;
    float scores[4];
    assert_int_equal(flame_score(e, &hit, scores, 4), FLAME_OK);
    stages s = stages_of(e);
    assert_int_equal(UCACHE(s).count, 1);
    assert_int_equal(FEAT(s).count, 1);
    assert_int_equal(ICACHE(s).count, 0);
    assert_int_equal(FETCH(s).count, 0);
    assert_parts_add_up(&s);
    assert_int_equal(flame_score(e, &miss, scores, 4), FLAME_OK);
    s = stages_of(e);
    assert_int_equal(UCACHE(s).count, 2);
    assert_int_equal(FEAT(s).count, 2);
    assert_int_equal(FETCH(s).count, 0);
    assert_parts_add_up(&s);
    flame_engine_stats es = {.struct_size = sizeof es};
    assert_int_equal(flame_engine_get_stats(e, &es), FLAME_OK);
    assert_int_equal(es.user_cache_hits, 1);
    assert_int_equal(es.user_cache_misses, 1);
    /* both in one call: one sample; a history given: none */
    flame_request two[2] = {hit, miss};
    assert_int_equal(flame_score_batch(e, two, 2, scores, 4), FLAME_OK);
    flame_request plain = {.struct_size = sizeof plain, .history = hist, .history_len = 3, .candidates = cand,
                           .num_candidates = 2};
    assert_int_equal(flame_score(e, &plain, scores, 4), FLAME_OK);
    s = stages_of(e);
    assert_int_equal(s.l[FLAME_STAGE_TOTAL].count, 4);
    assert_int_equal(UCACHE(s).count, 3);
    assert_int_equal(FEAT(s).count, 3);
    assert_parts_add_up(&s);
    char *text = metrics(e, NULL);
    assert_text_stage(text, "user_cache", &UCACHE(s));
    assert_text_stage(text, "features", &FEAT(s));
    assert_null(strstr(text, "stage=\"item_cache\""));
    assert_null(strstr(text, "stage=\"source_fetch\""));
    free(text);
    flame_engine_destroy(e);

    /* the side-feature model: user 7's history and the candidates through the item cache */
    flame_model *m = NULL;
    assert_int_equal(flame_model_create_random(side_config, 3, &m), FLAME_OK);
    flame_item_cache_params p = {.struct_size = sizeof p, .manual_refresh = 1};
    flame_item_cache *ic = slow_cache(&p);
    e = engine_with(m, ic, uc);
    hit.num_side_features = 2;
    assert_int_equal(flame_score(e, &hit, scores, 4), FLAME_OK); /* 5 ids, all missing */
    assert_int_equal(atomic_load(&fetch_calls), 1);
    assert_int_equal(atomic_load(&fetched_ids), 5);
    s = stages_of(e);
    assert_int_equal(UCACHE(s).count, 1);
    assert_int_equal(ICACHE(s).count, 1);
    assert_int_equal(FEAT(s).count, 1);
    assert_int_equal(FETCH(s).count, 1);
    assert_true(FETCH(s).sum_us >= FETCH_SLEEP_US);
    assert_true(FETCH(s).sum_us >= atomic_load(&callback_us));
    assert_parts_add_up(&s);
    assert_int_equal(flame_score(e, &hit, scores, 4), FLAME_OK); /* all hits */
    assert_int_equal(atomic_load(&fetch_calls), 1);
    s = stages_of(e);
    assert_int_equal(UCACHE(s).count, 2);
    assert_int_equal(ICACHE(s).count, 2);
    assert_int_equal(FEAT(s).count, 2);
    assert_int_equal(FETCH(s).count, 1);
    assert_parts_add_up(&s);
    text = metrics(e, NULL);
    assert_text_stage(text, "user_cache", &UCACHE(s));
    assert_text_stage(text, "item_cache", &ICACHE(s));
    assert_text_stage(text, "source_fetch", &FETCH(s));
    free(text);

    flame_engine_destroy(e);
    flame_item_cache_destroy(ic);
    flame_model_destroy(m);
    flame_user_cache_destroy(uc);
    flame_user_cache_unlink(name);
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
        cmocka_unit_test(test_item_cache_and_fetch_stages),
        cmocka_unit_test(test_waiting_for_another_calls_fetch),
        cmocka_unit_test(test_refresh_ahead_is_charged_to_no_call),
        cmocka_unit_test(test_user_cache_stages),
        cmocka_unit_test(test_gpu_stages),
    };
    return cmocka_run_group_tests_name("metrics", tests, setup, teardown);
}
