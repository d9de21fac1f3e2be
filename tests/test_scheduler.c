/* The batch-profile scheduler: histogram and profile arithmetic, scores equal to direct calls
 * (SUMI with side features, split requests, dot head), batches formed by the profiles and
 * the wait, arrival order kept, one bad request failing alone, split requests writing nothing
 * on failure, load shedding, draining at destroy, threads, the user cache through it,
 * argument errors, and a GPU engine (skipped without a GPU). */
#include <pthread.h>
#include <stdatomic.h>

#include "testutil.h"
#include "tu_models.h"
#include "tu_gpu.h"
#include "engine/engine.h"
#include "metrics/histogram.h"
#include "sched/sched.h"

/* 2 side slots, sumi head with 2 tasks: candidates are tokens, so long requests are split */
static const char *sumi_config = TU_SUMI_SIDE_CONFIG(500, 16, 17, gelu_erf);

static const char *dot_config = TU_DOT_CONFIG(2000, 1, "");

#define SLOTS 2
#define MAXC 400
#define MAXH 24

/* A request with its own arrays (so a test can keep many in flight). */
typedef struct req {
    int64_t hist[MAXH], cand[MAXC];
    int64_t hoff[SLOTS][MAXH + 1], hids[SLOTS][3 * MAXH], coff[SLOTS][MAXC + 1], cids[SLOTS][3 * MAXC];
    flame_bags hs[SLOTS], cs[SLOTS];
    flame_request r;
    float scores[MAXC * 2], want[MAXC * 2];
    /* completion */
    atomic_int calls;
    flame_status status;
    char message[256];
    uint64_t done_us;
} req;

static void random_bags(int64_t *off, int64_t *ids, size_t n, int64_t rows)
{
    off[0] = 0;
    for (size_t t = 0; t < n; t++) {
        int64_t k = tu_below(3);
        for (int64_t i = 0; i < k; i++) ids[off[t] + i] = tu_below(rows);
        off[t + 1] = off[t] + k;
    }
}

/* h history items, m candidates; side bags when sides, for the sumi model */
static void make_req(req *q, size_t h, size_t m, bool sides)
{
    memset(q, 0, sizeof *q);
    static const int64_t rows[SLOTS] = {20, 5};
    for (size_t i = 0; i < h; i++) q->hist[i] = tu_below(500);
    for (size_t i = 0; i < m; i++) q->cand[i] = tu_below(500);
    for (int s = 0; sides && s < SLOTS; s++) {
        random_bags(q->hoff[s], q->hids[s], h, rows[s]);
        random_bags(q->coff[s], q->cids[s], m, rows[s]);
        q->hs[s] = (flame_bags){q->hoff[s], q->hids[s], (size_t)q->hoff[s][h]};
        q->cs[s] = (flame_bags){q->coff[s], q->cids[s], (size_t)q->coff[s][m]};
    }
    q->r = (flame_request){.struct_size = sizeof(flame_request), .history = h ? q->hist : NULL, .history_len = h,
                           .candidates = m ? q->cand : NULL, .num_candidates = m,
                           .history_side = sides ? q->hs : NULL, .candidate_side = sides ? q->cs : NULL,
                           .num_side_features = sides ? SLOTS : 0};
    tu_poison(q->scores, MAXC * 2);
}

static void on_done(void *user, flame_status st, const char *message)
{
    req *q = user;
    q->status = st;
    snprintf(q->message, sizeof q->message, "%s", message ? message : "");
    q->done_us = fl_sched_now_us();
    atomic_fetch_add(&q->calls, 1);
}

static void wait_done(req *q)
{
    for (int i = 0; i < 100000 && !atomic_load(&q->calls); i++) usleep(100);
    if (!atomic_load(&q->calls)) fail_msg("a request was never completed");
}

typedef struct fixture {
    flame_model *sumi, *dot;
    flame_engine *se, *de;
} fixture;

static int setup(void **state)
{
    tu_gpu_setup(state);
    *state = NULL;
    fixture *f = calloc(1, sizeof *f);
    if (flame_model_create_random(sumi_config, 3, &f->sumi) || flame_model_create_random(dot_config, 4, &f->dot) ||
        flame_engine_create(f->sumi, NULL, &f->se) || flame_engine_create(f->dot, NULL, &f->de)) {
        fprintf(stderr, "setup: %s\n", flame_last_error());
        return -1;
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    if (!f) return 0;
    flame_engine_destroy(f->se);
    flame_engine_destroy(f->de);
    flame_model_destroy(f->sumi);
    flame_model_destroy(f->dot);
    free(f);
    return 0;
}

static flame_scheduler *make_sched(flame_engine *e, const flame_batch_profile *p, size_t np, int64_t wait_us,
                                   uint32_t workers, uint32_t max_queue)
{
    flame_scheduler_params sp = {.struct_size = sizeof sp, .profiles = p, .num_profiles = np, .max_wait_us = wait_us,
                                 .workers = workers, .max_queue = max_queue};
    flame_scheduler *s = NULL;
    if (flame_scheduler_create(e, &sp, &s) != FLAME_OK) fail_msg("scheduler: %s", flame_last_error());
    return s;
}

static flame_scheduler_stats stats_of(flame_scheduler *s)
{
    flame_scheduler_stats st = {.struct_size = sizeof st};
    assert_int_equal(flame_scheduler_get_stats(s, &st), FLAME_OK);
    return st;
}

/* the scores of the request alone, direct */
static void direct(flame_engine *e, req *q)
{
    tu_poison(q->want, MAXC * 2);
    if (flame_score(e, &q->r, q->want, MAXC * 2) != FLAME_OK) fail_msg("direct: %s", flame_last_error());
}

/* the scheduler's scores against the direct ones: another batch shape rounds differently
 * (BLAS accumulation order), so within float rounding, never NaN */
static void assert_matches(const req *q, int tasks)
{
    const size_t n = q->r.num_candidates * (size_t)tasks;
    double want[MAXC * 2];
    for (size_t i = 0; i < n; i++) want[i] = q->want[i];
    assert_rel_err_below(q->scores, want, n, 1e-5);
}

/* ------------------------------------------------------------------ arithmetic */

static void test_histogram(void **state)
{
    (void)state;
    for (uint64_t v = 0; v < 16; v++) assert_int_equal(fl_hist_upper(fl_hist_index(v)), v);
    for (int i = 0; i < 100000; i++) { /* the bucket of v ends at or above v, within 1/16 of it */
        uint64_t v = tu_u64() >> (tu_below(60) + 4);
        if (v >= (1ull << 44)) continue;
        uint64_t up = fl_hist_upper(fl_hist_index(v));
        if (up < v || (v >= 16 && (double)(up - v) > v / 16.0)) fail_msg("value %llu: bucket ends at %llu",
                                                                      (unsigned long long)v, (unsigned long long)up);
    }
    static fl_histogram h;
    assert_int_equal(fl_hist_quantile(&h, 0.5), 0);
    for (uint64_t v = 1; v <= 1000; v++) fl_hist_add(&h, v);
    uint64_t p50 = fl_hist_quantile(&h, 0.5), p99 = fl_hist_quantile(&h, 0.99);
    assert_true(p50 >= 500 && p50 <= 500 + 500 / 16);
    assert_true(p99 >= 990 && p99 <= 1000);
    assert_int_equal(fl_hist_quantile(&h, 1.0), 1000);
    assert_int_equal(fl_hist_max(&h), 1000);
    fl_hist_reset(&h);
    assert_int_equal(fl_hist_quantile(&h, 0.99), 0);
}

static void test_profiles(void **state)
{
    (void)state;
    fl_profiles ps;
    assert_int_equal(fl_profiles_init(&ps, NULL, 0, true), FLAME_OK); /* {1,128} {2,128} {4,64} {8,32} */
    assert_int_equal(fl_profiles_fit(&ps, 1, 100), 0);
    assert_int_equal(fl_profiles_fit(&ps, 2, 128), 1);
    assert_int_equal(fl_profiles_fit(&ps, 3, 50), 2);
    assert_int_equal(fl_profiles_fit(&ps, 5, 20), 3);
    assert_int_equal(fl_profiles_fit(&ps, 1, 20), 0); /* smallest: 1 x 128 beats 8 x 32 */
    assert_int_equal(fl_profiles_fit(&ps, 5, 40), -1);
    assert_int_equal(fl_profiles_fit(&ps, 1, 129), -1);
    assert_int_equal(fl_profiles_parts(&ps, 128), 1);
    assert_int_equal(fl_profiles_parts(&ps, 300), 3);
    assert_int_equal(ps.max_users, 8);
    assert_int_equal(fl_profiles_init(&ps, NULL, 0, false), FLAME_OK); /* dot head: users only */
    assert_int_equal(fl_profiles_fit(&ps, 8, 100000), 3);
    assert_int_equal(fl_profiles_parts(&ps, 100000), 1);
    flame_batch_profile bad[2] = {{4, 64}, {0, 8}};
    assert_status_msg(fl_profiles_init(&ps, bad, 2, true), FLAME_ERR_INVALID_ARG, "profile 1: max_users 0");
    bad[1] = (flame_batch_profile){2, (1u << 24) + 1};
    assert_status_msg(fl_profiles_init(&ps, bad, 2, true), FLAME_ERR_INVALID_ARG, "profile 1: max_candidates 16777217");
    assert_status_msg(fl_profiles_init(&ps, bad, 17, true), FLAME_ERR_INVALID_ARG, "num_profiles 17 exceeds 16");
    assert_status_msg(fl_profiles_init(&ps, NULL, 3, true), FLAME_ERR_INVALID_ARG, "profiles is NULL");
}

/* ------------------------------------------------------------------ scores */

static void test_scores_match_direct_calls(void **state)
{
    fixture *f = *state;
    enum { N = 24 };
    static req q[N];
    flame_scheduler *s = make_sched(f->se, NULL, 0, 2000, 2, 0);
    size_t parts = 0, split = 0;
    for (int i = 0; i < N; i++) {
        size_t m = 1 + (size_t)tu_below(i % 4 == 0 ? MAXC : 64); /* some longer than 128: split */
        make_req(&q[i], (size_t)tu_below(MAXH + 1), m, true);
        direct(f->se, &q[i]);
        size_t k = m > 128 ? (m + 127) / 128 : 1;
        parts += k;
        split += k > 1;
        assert_int_equal(flame_scheduler_submit(s, &q[i].r, q[i].scores, MAXC * 2, on_done, &q[i]), FLAME_OK);
    }
    for (int i = 0; i < N; i++) {
        wait_done(&q[i]);
        assert_int_equal(q[i].status, FLAME_OK);
        assert_matches(&q[i], 2);
        for (size_t j = q[i].r.num_candidates * 2; j < MAXC * 2; j++) assert_true(isnan(q[i].scores[j])); /* no more */
    }
    flame_scheduler_stats st = stats_of(s);
    assert_int_equal(st.parts, parts); /* cut as the default profiles' largest, 128, says */
    assert_int_equal(st.split, split);
    flame_scheduler_destroy(s);
    for (int i = 0; i < N; i++) assert_int_equal(atomic_load(&q[i].calls), 1);
}

static void test_split_parts_and_stats(void **state)
{
    fixture *f = *state;
    static req q;
    make_req(&q, 10, 300, true); /* 3 parts of 100 under the default profiles (largest 128) */
    direct(f->se, &q);
    flame_scheduler *s = make_sched(f->se, NULL, 0, 0, 1, 0);
    assert_int_equal(flame_scheduler_score(s, &q.r, q.scores, MAXC * 2), FLAME_OK);
    assert_matches(&q, 2);
    flame_scheduler_stats st = stats_of(s);
    assert_int_equal(st.submitted, 1);
    assert_int_equal(st.completed, 1);
    assert_int_equal(st.split, 1);
    assert_int_equal(st.parts, 3);
    assert_true(st.batches >= 1 && st.batches <= 3);
    assert_true(st.latency_max_us > 0 && st.latency_p50_us <= st.latency_max_us + st.latency_max_us / 16);
    assert_int_equal(st.queued, 0);
    flame_scheduler_destroy(s);
}

static void test_dot_head_is_never_split(void **state)
{
    fixture *f = *state;
    static req q[3];
    flame_scheduler *s = make_sched(f->de, NULL, 0, 0, 1, 0);
    for (int i = 0; i < 3; i++) {
        make_req(&q[i], (size_t)tu_below(12), MAXC, false); /* 400 candidates: more than any profile's 128 */
        direct(f->de, &q[i]);
        assert_int_equal(flame_scheduler_score(s, &q[i].r, q[i].scores, MAXC * 2), FLAME_OK);
        assert_matches(&q[i], 1);
    }
    flame_scheduler_stats st = stats_of(s);
    assert_int_equal(st.split, 0);
    assert_int_equal(st.parts, 3);
    flame_scheduler_destroy(s);
}

/* A sumi engine with the user-history KV cache. */
static flame_engine *kv_engine(flame_model *m)
{
    flame_config *cfg = NULL;
    assert_int_equal(flame_config_create(&cfg), FLAME_OK);
    assert_int_equal(flame_config_set_int(cfg, FLAME_OPT_KV_CACHE_BYTES, 4 << 20), FLAME_OK);
    assert_int_equal(flame_config_set_int(cfg, FLAME_OPT_KV_CACHE_BLOCK_TOKENS, 16), FLAME_OK);
    flame_engine *e = NULL;
    if (flame_engine_create(m, cfg, &e)) fail_msg("kv engine: %s", flame_last_error());
    flame_config_destroy(cfg);
    return e;
}

static uint64_t kv_lookups(flame_engine *e)
{
    flame_engine_stats es = {.struct_size = sizeof es};
    assert_int_equal(flame_engine_get_stats(e, &es), FLAME_OK);
    return es.kv_cache_hits + es.kv_cache_misses;
}

/* A kv_cache request longer than every profile is one job and one engine call: one cache
 * lookup, not one a part; its scores are flame_score's on the same engine bitwise (the same
 * chunks: the engine took the profiles' largest max_candidates); it still holds the places of
 * max_queue its parts would; a request of the same size without the cache is still split. */
static void test_kv_cache_request_is_not_split(void **state)
{
    fixture *f = *state;
    flame_engine *e = kv_engine(f->sumi);
    assert_int_equal(atomic_load(&e->kv_chunk), 0); /* no scheduler yet: fl_plan_chunk's default */
    flame_scheduler *s = make_sched(e, NULL, 0, 0, 1, 0);
    assert_int_equal(atomic_load(&e->kv_chunk), 128); /* the default profiles' largest max_candidates */
    static req q, ref;
    make_req(&q, 10, 300, true); /* 3 parts of 100 if it were split (largest profile 128) */
    q.r.kv_cache = 1;
    q.r.user_id = 7;
    memcpy(&ref, &q, sizeof q);
    ref.r.user_id = 8; /* another user: a miss too, so the direct call computes as the scheduled one */
    ref.r.history = ref.hist, ref.r.candidates = ref.cand, ref.r.history_side = ref.hs, ref.r.candidate_side = ref.cs;
    for (int sl = 0; sl < SLOTS; sl++) {
        ref.hs[sl].offsets = ref.hoff[sl], ref.hs[sl].ids = ref.hids[sl];
        ref.cs[sl].offsets = ref.coff[sl], ref.cs[sl].ids = ref.cids[sl];
    }
    uint64_t before = kv_lookups(e);
    tu_poison(ref.scores, MAXC * 2);
    assert_int_equal(flame_score(e, &ref.r, ref.scores, MAXC * 2), FLAME_OK);
    assert_int_equal(kv_lookups(e), before + 1);

    before = kv_lookups(e);
    assert_int_equal(flame_scheduler_score(s, &q.r, q.scores, MAXC * 2), FLAME_OK);
    assert_int_equal(kv_lookups(e), before + 1); /* one lookup for the whole request */
    assert_memory_equal(q.scores, ref.scores, 300 * 2 * sizeof(float));
    flame_scheduler_stats st = stats_of(s);
    assert_int_equal(st.split, 0);
    assert_int_equal(st.parts, 1);
    assert_int_equal(st.batches, 1);
    assert_int_equal(st.completed, 1);
    assert_int_equal(st.queued, 0);

    /* again: a hit, still one lookup, the same scores within float rounding */
    before = kv_lookups(e);
    tu_poison(q.scores, MAXC * 2);
    assert_int_equal(flame_scheduler_score(s, &q.r, q.scores, MAXC * 2), FLAME_OK);
    assert_int_equal(kv_lookups(e), before + 1);
    for (size_t i = 0; i < 300 * 2; i++) q.want[i] = ref.scores[i];
    assert_matches(&q, 2);

    /* without the cache the same request is split as before */
    static req plain;
    make_req(&plain, 10, 300, true);
    direct(e, &plain);
    before = kv_lookups(e);
    assert_int_equal(flame_scheduler_score(s, &plain.r, plain.scores, MAXC * 2), FLAME_OK);
    assert_int_equal(kv_lookups(e), before);
    assert_matches(&plain, 2);
    st = stats_of(s);
    assert_int_equal(st.split, 1);
    assert_int_equal(st.parts, 1 + 1 + 3);
    flame_scheduler_destroy(s);

    /* the three places of max_queue it would have held as parts: refused where 2 are allowed */
    s = make_sched(e, NULL, 0, 0, 1, 2);
    assert_int_equal(flame_scheduler_score(s, &q.r, q.scores, MAXC * 2), FLAME_ERR_INVALID_ARG);
    assert_non_null(strstr(flame_last_error(), "max_queue 2"));
    make_req(&plain, 10, 200, true); /* 2 places: accepted, one part */
    plain.r.kv_cache = 1;
    plain.r.user_id = 9;
    assert_int_equal(flame_scheduler_score(s, &plain.r, plain.scores, MAXC * 2), FLAME_OK);
    st = stats_of(s);
    assert_int_equal(st.split, 0);
    assert_int_equal(st.parts, 1);
    flame_scheduler_destroy(s);
    flame_engine_destroy(e);
}

/* ------------------------------------------------------------------ batching */

/* 8 requests that fit {4 users x 64}: two full batches go at once, long before max_wait */
static void test_full_batches_do_not_wait(void **state)
{
    fixture *f = *state;
    static req q[8];
    const flame_batch_profile p[] = {{4, 64}};
    flame_scheduler *s = make_sched(f->se, p, 1, 5000000, 1, 0);
    const uint64_t t0 = fl_sched_now_us();
    for (int i = 0; i < 8; i++) {
        make_req(&q[i], 5, 1 + (size_t)tu_below(64), true);
        assert_int_equal(flame_scheduler_submit(s, &q[i].r, q[i].scores, MAXC * 2, on_done, &q[i]), FLAME_OK);
    }
    for (int i = 0; i < 8; i++) wait_done(&q[i]);
    for (int i = 0; i < 8; i++) assert_true(q[i].done_us - t0 < 2500000); /* half of max_wait */
    flame_scheduler_stats st = stats_of(s);
    assert_int_equal(st.batches, 2);
    assert_int_equal(st.parts, 8);
    assert_int_equal(st.profile_batches[0], 2);
    for (int i = 0; i < 8; i++) {
        direct(f->se, &q[i]);
        assert_matches(&q[i], 2);
    }
    flame_scheduler_destroy(s);
}

/* A lone request waits max_wait for company; the next request that does not fit closes the
 * batch before it at once, and requests are never overtaken. */
static void test_waiting_and_arrival_order(void **state)
{
    fixture *f = *state;
    static req a, b, c;
    const flame_batch_profile p[] = {{4, 32}, {1, 256}};
    const int64_t wait = 400000;
    flame_scheduler *s = make_sched(f->se, p, 2, wait, 1, 0);
    make_req(&a, 4, 20, true);
    make_req(&b, 4, 200, true); /* only {1, 256} holds it: it cannot join a's batch */
    make_req(&c, 4, 20, true);
    const uint64_t t0 = fl_sched_now_us();
    assert_int_equal(flame_scheduler_submit(s, &a.r, a.scores, MAXC * 2, on_done, &a), FLAME_OK);
    assert_int_equal(flame_scheduler_submit(s, &b.r, b.scores, MAXC * 2, on_done, &b), FLAME_OK);
    assert_int_equal(flame_scheduler_submit(s, &c.r, c.scores, MAXC * 2, on_done, &c), FLAME_OK);
    wait_done(&a);
    wait_done(&b);
    wait_done(&c);
    assert_true(a.done_us <= b.done_us && b.done_us <= c.done_us);
    /* a and b went without waiting (b closed a's batch; nothing can join b); c waited for company */
    assert_true(b.done_us - t0 < (uint64_t)wait);
    assert_true(c.done_us - t0 >= (uint64_t)wait);
    flame_scheduler_stats st = stats_of(s);
    assert_int_equal(st.batches, 3);
    assert_int_equal(st.profile_batches[0], 2);
    assert_int_equal(st.profile_batches[1], 1);
    assert_true(st.latency_max_us >= (uint64_t)wait && st.queue_wait_p99_us >= (uint64_t)wait * 15 / 16);
    assert_int_equal(flame_scheduler_reset_latency(s), FLAME_OK);
    st = stats_of(s);
    assert_int_equal(st.latency_max_us, 0);
    assert_int_equal(st.latency_p99_us, 0);
    assert_int_equal(st.completed, 3); /* counters stay */
    flame_scheduler_destroy(s);
}

/* ------------------------------------------------------------------ failures */

static void test_bad_request_fails_alone(void **state)
{
    fixture *f = *state;
    static req q[4];
    const flame_batch_profile p[] = {{4, 128}};
    flame_scheduler *s = make_sched(f->se, p, 1, 5000000, 1, 0);
    for (int i = 0; i < 4; i++) {
        make_req(&q[i], 6, 10, true);
        if (i != 2) direct(f->se, &q[i]);
    }
    q[2].cand[3] = 500; /* out of range */
    for (int i = 0; i < 4; i++)
        assert_int_equal(flame_scheduler_submit(s, &q[i].r, q[i].scores, MAXC * 2, on_done, &q[i]), FLAME_OK);
    for (int i = 0; i < 4; i++) wait_done(&q[i]);
    assert_int_equal(q[2].status, FLAME_ERR_INVALID_ARG);
    assert_non_null(strstr(q[2].message, "id 500 out of range"));
    for (int j = 0; j < MAXC * 2; j++) assert_true(isnan(q[2].scores[j])); /* nothing written */
    for (int i = 0; i < 4; i++)
        if (i != 2) {
            assert_int_equal(q[i].status, FLAME_OK);
            assert_matches(&q[i], 2);
        }
    flame_scheduler_stats st = stats_of(s);
    assert_int_equal(st.batches, 1);
    assert_int_equal(st.isolated, 1);
    assert_int_equal(st.completed, 3);
    assert_int_equal(st.failed, 1);
    /* the synchronous call carries the message to the caller's thread */
    assert_status_msg(flame_scheduler_score(s, &q[2].r, q[2].scores, MAXC * 2), FLAME_ERR_INVALID_ARG,
                      "id 500 out of range");
    flame_scheduler_destroy(s);
}

/* A split request whose last part is bad fails whole, and its good parts write nothing. */
static void test_split_request_failing_writes_nothing(void **state)
{
    fixture *f = *state;
    static req q;
    make_req(&q, 3, 300, true);
    flame_scheduler *s = make_sched(f->se, NULL, 0, 0, 2, 0);
    q.cids[1][q.coff[1][299]] = 9; /* genre 9 of 5, in the last part (if its bag is not empty) */
    q.coff[1][300] = q.coff[1][299] + 1;
    q.cs[1].num_ids = (size_t)q.coff[1][300];
    assert_status_msg(flame_scheduler_score(s, &q.r, q.scores, MAXC * 2), FLAME_ERR_INVALID_ARG, "id 9 out of range");
    for (int j = 0; j < MAXC * 2; j++) assert_true(isnan(q.scores[j]));
    flame_scheduler_destroy(s);
}

/* A request to be split whose candidate bags are broken is refused at submit with the
 * message flame_score gives, before its bags are cut (cutting would rebase offsets[0] away). */
static void test_split_request_with_broken_bags_is_refused(void **state)
{
    fixture *f = *state;
    static req q;
    flame_scheduler *s = make_sched(f->se, NULL, 0, 0, 1, 0);
    make_req(&q, 3, 300, true);
    for (int t = 0; t <= 300; t++) q.coff[0][t] += 2; /* offsets[0] = 2 */
    assert_status_msg(flame_score(f->se, &q.r, q.scores, MAXC * 2), FLAME_ERR_INVALID_ARG, "offsets[0] = 2, expected 0");
    assert_status_msg(flame_scheduler_submit(s, &q.r, q.scores, MAXC * 2, on_done, &q), FLAME_ERR_INVALID_ARG,
                      "candidate side feature 'artist' (slot 0): offsets[0] = 2, expected 0");
    for (int t = 0; t <= 300; t++) q.coff[0][t] -= 5; /* negative offsets */
    assert_status_msg(flame_scheduler_submit(s, &q.r, q.scores, MAXC * 2, on_done, &q), FLAME_ERR_INVALID_ARG,
                      "offsets[0] = -3, expected 0");
    for (int t = 0; t <= 300; t++) q.coff[0][t] += 3;
    q.coff[0][150] = q.coff[0][149] - 1; /* decreasing in the middle */
    assert_status_msg(flame_scheduler_submit(s, &q.r, q.scores, MAXC * 2, on_done, &q), FLAME_ERR_INVALID_ARG,
                      "offsets[150]");
    q.r.num_candidates = (1u << 24) + 1; /* beyond the engine's bound: refused before any size is computed */
    assert_status_msg(flame_scheduler_submit(s, &q.r, q.scores, SIZE_MAX, on_done, &q), FLAME_ERR_INVALID_ARG,
                      "num_candidates = 16777217 exceeds 16777216");
    /* and before the buffer is sized: a count whose product with the tasks wraps to a small
     * number is still INVALID_ARG, not BUFFER_TOO_SMALL */
    q.r.num_candidates = SIZE_MAX / 3 + 1;
    assert_status_msg(flame_scheduler_submit(s, &q.r, q.scores, MAXC * 2, on_done, &q), FLAME_ERR_INVALID_ARG,
                      "exceeds 16777216");
    assert_int_equal(atomic_load(&q.calls), 0);
    assert_int_equal(stats_of(s).submitted, 0);
    flame_scheduler_destroy(s);
}

/* A request to be split whose candidate bags address more ids than its array holds is
 * refused at submit, before its bags are cut (each part would read past the array), and one
 * whose bags address fewer is refused too (the parts would drop ids). */
static void test_split_request_bag_count_is_checked(void **state)
{
    fixture *f = *state;
    static req q;
    flame_scheduler *s = make_sched(f->se, NULL, 0, 0, 1, 0);
    make_req(&q, 3, 300, true);
    const size_t n = (size_t)q.coff[1][300];
    int64_t *ids = malloc((n + 1) * sizeof *ids); /* on the heap, so a read past it is caught */
    memcpy(ids, q.cids[1], n * sizeof *ids);
    ids[n] = 0;
    q.cs[1].ids = ids;
    for (int t = 150; t <= 300; t++) q.coff[1][t] += 4; /* 4 ids more than the array holds, in the later parts */
    q.cs[1].num_ids = n;
    char want[160];
    snprintf(want, sizeof want, "candidate side feature 'genre' (slot 1): offsets[300] (the end of token 299's bag) = "
             "%zu, but num_ids = %zu", n + 4, n);
    assert_status_msg(flame_scheduler_submit(s, &q.r, q.scores, MAXC * 2, on_done, &q), FLAME_ERR_INVALID_ARG, want);
    assert_status_msg(flame_scheduler_score(s, &q.r, q.scores, MAXC * 2), FLAME_ERR_INVALID_ARG, want);
    for (int t = 150; t <= 300; t++) q.coff[1][t] -= 4;
    q.cs[1].num_ids = n + 1; /* one id beyond the last bag */
    assert_status_msg(flame_scheduler_submit(s, &q.r, q.scores, MAXC * 2, on_done, &q), FLAME_ERR_INVALID_ARG,
                      "but num_ids = ");
    assert_int_equal(atomic_load(&q.calls), 0);
    assert_int_equal(stats_of(s).submitted, 0);
    q.cs[1].num_ids = n;
    assert_int_equal(flame_scheduler_score(s, &q.r, q.scores, MAXC * 2), FLAME_OK);
    flame_scheduler_destroy(s);
    free(ids);
}

/* ------------------------------------------------------------------ load and lifetime */

static void test_queue_full_sheds_load(void **state)
{
    fixture *f = *state;
    static req q[3], big;
    const flame_batch_profile p[] = {{8, 64}};
    flame_scheduler *s = make_sched(f->se, p, 1, 5000000, 1, 2); /* the worker waits for company */
    for (int i = 0; i < 3; i++) make_req(&q[i], 2, 8, true);
    assert_int_equal(flame_scheduler_submit(s, &q[0].r, q[0].scores, MAXC * 2, on_done, &q[0]), FLAME_OK);
    assert_int_equal(flame_scheduler_submit(s, &q[1].r, q[1].scores, MAXC * 2, on_done, &q[1]), FLAME_OK);
    assert_status_msg(flame_scheduler_submit(s, &q[2].r, q[2].scores, MAXC * 2, on_done, &q[2]),
                      FLAME_ERR_UNAVAILABLE, "queue full: 2 part(s) waiting, this request needs 1, max_queue 2");
    make_req(&big, 2, 100, true); /* 2 parts of 50: refused now, could go later */
    assert_status_msg(flame_scheduler_submit(s, &big.r, big.scores, MAXC * 2, on_done, &big), FLAME_ERR_UNAVAILABLE,
                      "this request needs 2");
    make_req(&big, 2, 200, true); /* 4 parts of 50: never, whatever the queue holds */
    assert_status_msg(flame_scheduler_submit(s, &big.r, big.scores, MAXC * 2, on_done, &big), FLAME_ERR_INVALID_ARG,
                      "200 candidates make 4 parts of at most 64, more than max_queue 2");
    flame_scheduler_stats st = stats_of(s);
    assert_int_equal(st.rejected, 2); /* the two refused for room */
    assert_int_equal(st.queued, 2);
    const uint64_t t0 = fl_sched_now_us();
    flame_scheduler_destroy(s); /* scores the two queued ones without waiting out max_wait */
    assert_true(fl_sched_now_us() - t0 < 2500000);
    assert_int_equal(atomic_load(&q[0].calls), 1);
    assert_int_equal(atomic_load(&q[1].calls), 1);
    assert_int_equal(atomic_load(&q[2].calls), 0);
    assert_int_equal(q[0].status, FLAME_OK);
    assert_int_equal(atomic_load(&big.calls), 0);
}

static void test_destroy_drains_the_queue(void **state)
{
    fixture *f = *state;
    enum { N = 40 };
    static req q[N];
    flame_scheduler *s = make_sched(f->se, NULL, 0, 3000000, 2, 0);
    const uint64_t t0 = fl_sched_now_us();
    for (int i = 0; i < N; i++) {
        make_req(&q[i], (size_t)tu_below(MAXH), 1 + (size_t)tu_below(160), true);
        assert_int_equal(flame_scheduler_submit(s, &q[i].r, q[i].scores, MAXC * 2, on_done, &q[i]), FLAME_OK);
    }
    flame_scheduler_destroy(s);
    assert_true(fl_sched_now_us() - t0 < 2500000); /* no batch waited for company */
    for (int i = 0; i < N; i++) {
        assert_int_equal(atomic_load(&q[i].calls), 1);
        assert_int_equal(q[i].status, FLAME_OK);
        direct(f->se, &q[i]);
        assert_matches(&q[i], 2);
    }
}

/* done callbacks that destroy their own scheduler (as a host language's garbage collector
 * may, from there) or wait on it: every queued request still completes exactly once, the
 * wait is refused instead of hanging. The interleaving is fixed rather than left to timing:
 * every worker is held in a gate callback until all requests are queued, so the destroy meets
 * a known queue; with two workers the other one is held inside a callback of its own batch
 * until the destroy has begun (it then finishes that batch and drains the queue), or, with
 * nothing queued, goes to sleep. The test ends when the worker has freed the scheduler (the
 * freed hook), not after a sleep. (Left to timing, a loaded machine could complete every
 * request before the test armed the destroy, so that no destroy happened at all.) */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int held, want_held;       /* workers held in hold_done; how many the test waits for */
    bool open;                 /* the gates */
    req *destroyer;            /* the request whose done destroys s */
    req *mid;                  /* the other worker's request, held until the destroy begins (or NULL) */
    bool mid_entered, destroying, destroyed, freed, timed_out;
    flame_scheduler *s;
    flame_status score_status; /* flame_scheduler_score from the destroying callback */
    flame_status stats_status;
    uint64_t queued_at_destroy;
} self = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* Waits until holds() (read under self.mu), at most 30 s: false then (a failure, not a hang). */
static bool self_wait(bool (*holds)(void))
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    pthread_mutex_lock(&self.mu);
    int e = 0;
    while (!holds() && e == 0) e = pthread_cond_timedwait(&self.cv, &self.mu, &until);
    const bool ok = holds();
    if (!ok) self.timed_out = true;
    pthread_mutex_unlock(&self.mu);
    return ok;
}
static void self_set(bool *flag)
{
    pthread_mutex_lock(&self.mu);
    *flag = true;
    pthread_cond_broadcast(&self.cv);
    pthread_mutex_unlock(&self.mu);
}
static bool gates_open(void) { return self.open; }
static bool workers_held(void) { return self.held == self.want_held; }
static bool mid_entered(void) { return self.mid_entered; }
static bool destroying(void) { return self.destroying; }
static bool destroyed_and_freed(void) { return self.destroyed && self.freed; }
static bool scheduler_freed(void) { return self.freed; }

static void hold_done(void *user, flame_status st, const char *message)
{
    on_done(user, st, message);
    pthread_mutex_lock(&self.mu);
    self.held++;
    pthread_cond_broadcast(&self.cv);
    pthread_mutex_unlock(&self.mu);
    self_wait(gates_open);
}

static void destroy_in_done(void *user, flame_status st, const char *message)
{
    on_done(user, st, message);
    if (user == self.mid) { /* the other worker, mid-batch: stays here until the destroy has begun */
        self_set(&self.mid_entered);
        self_wait(destroying);
        return;
    }
    if (user != self.destroyer) return;
    if (self.mid) self_wait(mid_entered); /* (it can only be on the other worker: this one is here) */
    flame_scheduler_stats stats = {.struct_size = sizeof stats};
    self.stats_status = flame_scheduler_get_stats(self.s, &stats); /* (no cmocka asserts off the test thread) */
    self.queued_at_destroy = stats.queued;
    self_set(&self.destroying);
    self.score_status = flame_scheduler_score(self.s, &self.destroyer->r, self.destroyer->scores, MAXC * 2);
    flame_scheduler_destroy(self.s);
    self_set(&self.destroyed);
}

static void freed_hook(void *user)
{
    (void)user;
    self_set(&self.freed);
}

static void test_destroy_from_a_done_callback(void **state)
{
    fixture *f = *state;
    enum { N = 12 };
    static req q[N], g[2];
    /* workers, requests queued behind the gates, parts queued when the destroy begins: with one
     * worker all but the destroying batch {q0, q1}; with two also less the other worker's {q2, q3} */
    static const struct { uint32_t workers; int n, queued; } cases[] = {{1, N, N - 2}, {2, N, N - 4}, {2, 1, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const uint32_t workers = cases[c].workers;
        const int n = cases[c].n;
        const flame_batch_profile p[] = {{2, 64}};
        flame_scheduler *s = make_sched(f->se, p, 1, 0, workers, 0);
        fl_sched_set_freed_hook(s, freed_hook, NULL);
        pthread_mutex_lock(&self.mu);
        self.held = self.want_held = 0;
        self.open = self.mid_entered = self.destroying = self.destroyed = self.freed = self.timed_out = false;
        self.s = s, self.destroyer = &q[0], self.mid = workers == 2 && n >= 4 ? &q[2] : NULL;
        self.score_status = self.stats_status = FLAME_OK, self.queued_at_destroy = UINT64_MAX;
        pthread_mutex_unlock(&self.mu);
        for (uint32_t w = 0; w < workers; w++) { /* a gate request a worker: each goes alone (max_wait 0) */
            make_req(&g[w], 3, 5, true);
            pthread_mutex_lock(&self.mu);
            self.want_held = (int)w + 1;
            pthread_mutex_unlock(&self.mu);
            assert_int_equal(flame_scheduler_submit(s, &g[w].r, g[w].scores, MAXC * 2, hold_done, &g[w]), FLAME_OK);
            if (!self_wait(workers_held)) fail_msg("worker %u never entered its gate callback", w);
        }
        for (int i = 0; i < n; i++) {
            make_req(&q[i], 4, 1 + (size_t)tu_below(64), true);
            assert_int_equal(flame_scheduler_submit(s, &q[i].r, q[i].scores, MAXC * 2, destroy_in_done, &q[i]),
                             FLAME_OK);
        }
        assert_int_equal(stats_of(s).queued, n); /* every worker is held: nothing taken yet */
        self_set(&self.open);
        if (!self_wait(destroyed_and_freed))
            fail_msg("%u worker(s), %d request(s): destroyed %d, freed %d", workers, n, self.destroyed, self.freed);
        assert_false(self.timed_out);
        assert_int_equal(self.stats_status, FLAME_OK);
        assert_int_equal(self.queued_at_destroy, cases[c].queued);
        assert_int_equal(self.score_status, FLAME_ERR_INVALID_ARG);
        for (uint32_t w = 0; w < workers; w++) {
            assert_int_equal(atomic_load(&g[w].calls), 1);
            assert_int_equal(g[w].status, FLAME_OK);
        }
        for (int i = 0; i < n; i++) { /* freed: every callback has run, exactly once */
            assert_int_equal(atomic_load(&q[i].calls), 1);
            assert_int_equal(q[i].status, FLAME_OK);
            direct(f->se, &q[i]);
            assert_matches(&q[i], 2);
        }
    }
}

/* During isolation (a batch with a bad request scored part by part) the first completion
 * destroys the scheduler and then the engine, as a Python program dropping both in a future's
 * callback does: the worker must not call the engine after that (ASan watches). */
static struct {
    flame_scheduler *s;
    flame_engine *e;
    atomic_int gone;
    atomic_int late_n, late_done; /* submits from the later callbacks, and their done calls */
    flame_status late[8];
} iso;
static void late_done(void *user, flame_status st, const char *message)
{
    (void)user, (void)st, (void)message;
    atomic_fetch_add(&iso.late_done, 1);
}
static void destroy_all_in_done(void *user, flame_status st, const char *message)
{
    on_done(user, st, message);
    if (!atomic_exchange(&iso.gone, 1)) {
        flame_scheduler_destroy(iso.s);
        flame_engine_destroy(iso.e);
        return;
    }
    /* a later callback of the batch submits, an empty request and a whole one: both refused
     * before the engine (gone) is touched; the empty one was scored on it */
    req *q = user;
    flame_request empty = q->r;
    empty.num_candidates = 0;
    const int k = atomic_fetch_add(&iso.late_n, 2);
    if (k + 1 < 8) {
        iso.late[k] = flame_scheduler_submit(iso.s, &empty, NULL, 0, late_done, NULL);
        iso.late[k + 1] = flame_scheduler_submit(iso.s, &q->r, q->scores, MAXC * 2, late_done, NULL);
    }
}
static void test_destroy_scheduler_and_engine_in_a_callback_during_isolation(void **state)
{
    fixture *f = *state;
    static req q[4];
    iso.gone = iso.late_n = iso.late_done = 0;
    assert_int_equal(flame_engine_create(f->sumi, NULL, &iso.e), FLAME_OK);
    const flame_batch_profile p[] = {{4, 64}};
    iso.s = make_sched(iso.e, p, 1, 5000000, 1, 0); /* the four form one batch */
    pthread_mutex_lock(&self.mu);
    self.freed = false;
    pthread_mutex_unlock(&self.mu);
    fl_sched_set_freed_hook(iso.s, freed_hook, NULL);
    for (int i = 0; i < 4; i++) make_req(&q[i], 5, 8, true);
    q[3].hist[0] = 9999; /* bad: the batch is isolated */
    for (int i = 0; i < 4; i++)
        assert_int_equal(flame_scheduler_submit(iso.s, &q[i].r, q[i].scores, MAXC * 2, destroy_all_in_done, &q[i]),
                         FLAME_OK);
    for (int i = 0; i < 4; i++) wait_done(&q[i]);
    if (!self_wait(scheduler_freed)) fail_msg("the worker never freed the scheduler"); /* then it is through */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(q[i].status, FLAME_OK);
        direct(f->se, &q[i]);
        assert_matches(&q[i], 2);
    }
    assert_int_equal(q[3].status, FLAME_ERR_INVALID_ARG);
    assert_int_equal(atomic_load(&iso.late_n), 6); /* three later callbacks, two submits each */
    for (int k = 0; k < 6; k++) assert_int_equal(iso.late[k], FLAME_ERR_UNAVAILABLE);
    assert_int_equal(atomic_load(&iso.late_done), 0);
}

/* ------------------------------------------------------------------ admission */

/* An injectable clock (the tests move it; fl_sched_kick wakes the workers after a move). */
static _Atomic uint64_t fake_now = 1000000;
static uint64_t fake_clock(void *user)
{
    (void)user;
    return atomic_load(&fake_now);
}
static void advance(flame_scheduler *s, uint64_t us)
{
    atomic_fetch_add(&fake_now, us);
    fl_sched_kick(s);
}

/* A gate: the done callback of the request that holds it blocks its worker until opened, so
 * the test queues requests behind a busy worker deterministically. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool entered, open;
} gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false};
static void gate_done(void *user, flame_status st, const char *message)
{
    on_done(user, st, message);
    pthread_mutex_lock(&gate.mu);
    gate.entered = true;
    pthread_cond_broadcast(&gate.cv);
    while (!gate.open) pthread_cond_wait(&gate.cv, &gate.mu);
    pthread_mutex_unlock(&gate.mu);
}
/* Submits q through the gate and returns once its callback holds the (only) worker. */
static void hold_worker(flame_scheduler *s, req *q, const flame_submit_options *o)
{
    gate.entered = gate.open = false;
    assert_int_equal(flame_scheduler_submit_ex(s, &q->r, q->scores, MAXC * 2, o, gate_done, q, NULL), FLAME_OK);
    pthread_mutex_lock(&gate.mu);
    while (!gate.entered) pthread_cond_wait(&gate.cv, &gate.mu);
    pthread_mutex_unlock(&gate.mu);
}
static void release_worker(void)
{
    pthread_mutex_lock(&gate.mu);
    gate.open = true;
    pthread_cond_broadcast(&gate.cv);
    pthread_mutex_unlock(&gate.mu);
}

/* completion order, recorded by ordered_done */
static req *order[32];
static atomic_int order_n;
static void ordered_done(void *user, flame_status st, const char *message)
{
    on_done(user, st, message);
    order[atomic_fetch_add(&order_n, 1)] = user;
}

static uint64_t submit_opt(flame_scheduler *s, req *q, int32_t prio, int64_t timeout_us, uint64_t deadline_us,
                           flame_score_done_fn fn)
{
    flame_submit_options o = {.struct_size = sizeof o, .priority = prio, .timeout_us = timeout_us,
                              .deadline_us = deadline_us};
    uint64_t t = 0;
    assert_int_equal(flame_scheduler_submit_ex(s, &q->r, q->scores, MAXC * 2, &o, fn, q, &t), FLAME_OK);
    assert_true(t > 0);
    return t;
}

/* One request a batch behind a held worker: high before normal before low, and the
 * no-starvation rule lets a level that waited through max_bypass batches go next. */
static void test_priorities_and_no_starvation(void **state)
{
    fixture *f = *state;
    static req g, l[2], n[3], h[4];
    const flame_batch_profile p[] = {{1, 64}};
    for (uint32_t bypass = 2; bypass <= 8; bypass += 6) {
        flame_scheduler_params sp = {.struct_size = sizeof sp, .profiles = p, .num_profiles = 1, .workers = 1,
                                     .max_bypass = bypass};
        flame_scheduler *s = NULL;
        assert_int_equal(flame_scheduler_create(f->se, &sp, &s), FLAME_OK);
        make_req(&g, 3, 8, true);
        hold_worker(s, &g, NULL);
        atomic_store(&order_n, 0);
        for (int i = 0; i < 2; i++) make_req(&l[i], 3, 8, true), submit_opt(s, &l[i], FLAME_PRIORITY_LOW, 0, 0, ordered_done);
        for (int i = 0; i < 3; i++) make_req(&n[i], 3, 8, true), submit_opt(s, &n[i], FLAME_PRIORITY_NORMAL, 0, 0, ordered_done);
        for (int i = 0; i < 4; i++) make_req(&h[i], 3, 8, true), submit_opt(s, &h[i], FLAME_PRIORITY_HIGH, 0, 0, ordered_done);
        release_worker();
        flame_scheduler_destroy(s);
        assert_int_equal(atomic_load(&order_n), 9);
        /* bypass 2: H1 H2, then the low level (bypassed twice), then normal (twice), ... */
        req *want2[9] = {&h[0], &h[1], &l[0], &n[0], &h[2], &l[1], &h[3], &n[1], &n[2]};
        req *want8[9] = {&h[0], &h[1], &h[2], &h[3], &n[0], &n[1], &n[2], &l[0], &l[1]};
        for (int i = 0; i < 9; i++) {
            if (order[i] != (bypass == 2 ? want2 : want8)[i]) fail_msg("max_bypass %u: batch %d is not the expected request", bypass, i);
            assert_int_equal(order[i]->status, FLAME_OK);
            direct(f->se, order[i]);
            assert_matches(order[i], 2);
        }
    }
}

/* A turnstile: the k-th callback through it blocks its worker until k callbacks are allowed,
 * so a test can stop the one worker after each of several batches. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int entered, allowed;
} turn = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
static void turn_done(void *user, flame_status st, const char *message)
{
    on_done(user, st, message);
    pthread_mutex_lock(&turn.mu);
    const int me = ++turn.entered;
    pthread_cond_broadcast(&turn.cv);
    while (turn.allowed < me) pthread_cond_wait(&turn.cv, &turn.mu);
    pthread_mutex_unlock(&turn.mu);
}
static void turn_wait(int entered)
{
    pthread_mutex_lock(&turn.mu);
    while (turn.entered < entered) pthread_cond_wait(&turn.cv, &turn.mu);
    pthread_mutex_unlock(&turn.mu);
}
static void turn_allow(int allowed)
{
    pthread_mutex_lock(&turn.mu);
    turn.allowed = allowed;
    pthread_cond_broadcast(&turn.cv);
    pthread_mutex_unlock(&turn.mu);
}

/* The no-starvation count is of batches that went ahead of waiting requests: once a level's
 * last waiting request left the queue (cancelled, or expired) the count leaves with it, so a
 * request submitted later waits through max_bypass batches of its own (it inherited the count
 * and went ahead of the high level after fewer). */
static void test_bypass_count_leaves_with_the_requests(void **state)
{
    fixture *f = *state;
    static req g, h[4], l[2];
    const flame_batch_profile p[] = {{1, 64}};
    for (int how = 0; how < 2; how++) { /* the first low request cancelled, or expired */
        flame_scheduler_params sp = {.struct_size = sizeof sp, .profiles = p, .num_profiles = 1, .workers = 1,
                                     .max_bypass = 2};
        flame_scheduler *s = NULL;
        assert_int_equal(flame_scheduler_create(f->se, &sp, &s), FLAME_OK);
        fl_sched_set_clock(s, fake_clock, NULL);
        turn.entered = turn.allowed = 0;
        atomic_store(&order_n, 0);
        make_req(&g, 3, 8, true);
        submit_opt(s, &g, FLAME_PRIORITY_NORMAL, 0, 0, turn_done);
        turn_wait(1); /* the worker is in g's callback */
        make_req(&l[0], 3, 8, true);
        const uint64_t t0 = submit_opt(s, &l[0], FLAME_PRIORITY_LOW, how ? 1000 : 0, 0, on_done);
        for (int i = 0; i < 4; i++)
            make_req(&h[i], 3, 8, true), submit_opt(s, &h[i], FLAME_PRIORITY_HIGH, 0, 0, i < 2 ? turn_done : ordered_done);
        turn_allow(1);
        turn_wait(2); /* h0's batch went ahead of l0: one bypass counted for the low level */
        if (how == 0)
            assert_int_equal(flame_scheduler_cancel(s, t0), FLAME_OK);
        else
            atomic_fetch_add(&fake_now, 2000); /* past l0's deadline: the worker's next look expires it */
        turn_allow(2);
        turn_wait(3); /* the worker is in h1's callback: l0 is gone, the low level empty */
        assert_int_equal(l[0].status, how ? FLAME_ERR_TIMEOUT : FLAME_ERR_CANCELLED);
        make_req(&l[1], 3, 8, true);
        submit_opt(s, &l[1], FLAME_PRIORITY_LOW, 0, 0, ordered_done);
        turn_allow(3);
        flame_scheduler_destroy(s);
        assert_int_equal(atomic_load(&order_n), 3);
        req *want[3] = {&h[2], &h[3], &l[1]};
        for (int i = 0; i < 3; i++) {
            if (order[i] != want[i])
                fail_msg("%s: batch %d is not the expected request (l1 went after %d high batch(es), max_bypass 2)",
                         how ? "expired" : "cancelled", i, order[i] == &l[1] ? i : -1);
            assert_int_equal(order[i]->status, FLAME_OK);
        }
    }
}

/* Deadlines on an injected clock: a queued request whose deadline passes completes with
 * FLAME_ERR_TIMEOUT and writes nothing (split ones too), a running one completes, the
 * others are scored; a request waiting for company times out without a batch. */
/* flame_scheduler_score_ex: the blocking call takes submit_ex's options (the scores are those
 * of a direct call; a bad priority is refused naming it, nothing written). */
static void test_score_ex_with_options(void **state)
{
    fixture *f = *state;
    static req q;
    make_req(&q, 4, 20, true);
    direct(f->se, &q);
    flame_scheduler *s = make_sched(f->se, NULL, 0, 0, 1, 0);
    const flame_submit_options hi = {.struct_size = sizeof hi, .priority = FLAME_PRIORITY_HIGH, .timeout_us = 60000000};
    assert_int_equal(flame_scheduler_score_ex(s, &q.r, q.scores, MAXC * 2, &hi), FLAME_OK);
    assert_matches(&q, 2);
    const flame_submit_options bad = {.struct_size = sizeof bad, .priority = 5};
    for (size_t i = 0; i < MAXC * 2; i++) q.scores[i] = -7.0f;
    assert_status_msg(flame_scheduler_score_ex(s, &q.r, q.scores, MAXC * 2, &bad), FLAME_ERR_INVALID_ARG, "priority 5");
    for (size_t i = 0; i < MAXC * 2; i++) assert_true(q.scores[i] == -7.0f);
    assert_int_equal(flame_scheduler_score_ex(s, &q.r, q.scores, MAXC * 2, NULL), FLAME_OK);
    assert_matches(&q, 2);
    flame_scheduler_destroy(s);
}

static void test_deadlines(void **state)
{
    fixture *f = *state;
    static req g, a, b, c, sp, past;
    flame_scheduler *s = make_sched(f->se, NULL, 0, 0, 1, 0);
    fl_sched_set_clock(s, fake_clock, NULL);
    make_req(&g, 3, 8, true);
    flame_submit_options go = {.struct_size = sizeof go, .timeout_us = 100};
    hold_worker(s, &g, &go); /* running: its deadline passing does not stop it */
    make_req(&a, 3, 10, true);
    make_req(&b, 3, 10, true);
    make_req(&c, 3, 10, true);
    make_req(&sp, 3, 300, true); /* three parts */
    const uint64_t t0 = flame_scheduler_now_us(s);
    assert_int_equal(t0, atomic_load(&fake_now));
    submit_opt(s, &a, 0, 1000, 0, on_done);
    submit_opt(s, &b, 0, 0, 0, on_done);
    submit_opt(s, &c, 0, 0, t0 + 5000, on_done);           /* absolute, not passed */
    submit_opt(s, &sp, 0, 50000, t0 + 1500, on_done);      /* the earlier of the two holds */
    make_req(&past, 3, 10, true);
    submit_opt(s, &past, 0, 0, t0 - 300, on_done);         /* absolute, already passed at the submit */
    advance(s, 2000);
    release_worker();
    wait_done(&a), wait_done(&b), wait_done(&c), wait_done(&sp);
    assert_int_equal(g.status, FLAME_OK);
    assert_int_equal(a.status, FLAME_ERR_TIMEOUT);
    assert_non_null(strstr(a.message, "deadline passed 1000 us after the submit"));
    wait_done(&past);
    assert_int_equal(past.status, FLAME_ERR_TIMEOUT);
    if (!strstr(past.message, "deadline had passed 300 us before the submit")) fail_msg("message: %s", past.message);
    assert_int_equal(sp.status, FLAME_ERR_TIMEOUT);
    if (!strstr(sp.message, "deadline passed 1500 us after the submit, before the batch of one of its 3 parts started"))
        fail_msg("message: %s", sp.message);
    for (int j = 0; j < MAXC * 2; j++) assert_true(isnan(a.scores[j]) && isnan(sp.scores[j]));
    assert_int_equal(b.status, FLAME_OK);
    assert_int_equal(c.status, FLAME_OK);
    direct(f->se, &b), assert_matches(&b, 2);
    direct(f->se, &c), assert_matches(&c, 2);
    flame_scheduler_stats st = stats_of(s);
    assert_int_equal(st.timeouts, 3); /* a, sp, past */
    assert_int_equal(st.completed, 3);
    assert_int_equal(st.failed, 0);
    assert_int_equal(st.parts, 3); /* g, b, c: the timed-out ones never reached a batch */
    flame_scheduler_destroy(s);
    assert_int_equal(atomic_load(&a.calls) + atomic_load(&b.calls) + atomic_load(&c.calls) + atomic_load(&sp.calls) +
                         atomic_load(&g.calls), 5);
}

/* A lone request waiting for company (max_wait 10 s) times out at its deadline without a batch. */
static void test_deadline_while_waiting_for_company(void **state)
{
    fixture *f = *state;
    static req a;
    const flame_batch_profile p[] = {{4, 64}};
    flame_scheduler *s = make_sched(f->se, p, 1, 10000000, 1, 0);
    fl_sched_set_clock(s, fake_clock, NULL);
    make_req(&a, 3, 10, true);
    submit_opt(s, &a, FLAME_PRIORITY_HIGH, 500, 0, on_done);
    usleep(20000);
    assert_int_equal(atomic_load(&a.calls), 0); /* the clock has not moved */
    advance(s, 499);
    usleep(20000);
    assert_int_equal(atomic_load(&a.calls), 0);
    advance(s, 1);
    wait_done(&a);
    assert_int_equal(a.status, FLAME_ERR_TIMEOUT);
    assert_int_equal(stats_of(s).batches, 0);
    flame_scheduler_destroy(s);
    assert_int_equal(atomic_load(&a.calls), 1);
}

/* A split request whose first part failed in a batch and whose second then expired in the
 * queue completes on the expiry path, as scored (the failure): its latency is counted from
 * the clock there (it was counted from 0, a wrapped 2^64 us in every latency sum after). */
static void test_split_request_failing_then_expiring(void **state)
{
    fixture *f = *state;
    static req v, a;
    const flame_batch_profile p[] = {{2, 4}};
    flame_scheduler *s = make_sched(f->se, p, 1, 5000000, 1, 0); /* v waits for company on the fake clock */
    fl_sched_set_clock(s, fake_clock, NULL);
    make_req(&v, 3, 4, true);
    make_req(&a, 3, 8, true); /* parts of 4: the first in v's batch, the second left queued */
    a.cand[0] = 9999;         /* the first part fails */
    gate.entered = gate.open = false;
    flame_submit_options vo = {.struct_size = sizeof vo};
    assert_int_equal(flame_scheduler_submit_ex(s, &v.r, v.scores, MAXC * 2, &vo, gate_done, &v, NULL), FLAME_OK);
    submit_opt(s, &a, 0, 1000, 0, on_done);
    pthread_mutex_lock(&gate.mu); /* the worker is in v's callback, the batch {v, a's first part} done */
    while (!gate.entered) pthread_cond_wait(&gate.cv, &gate.mu);
    pthread_mutex_unlock(&gate.mu);
    advance(s, 2000); /* past a's deadline */
    release_worker();
    wait_done(&a);
    assert_int_equal(v.status, FLAME_OK);
    assert_int_equal(a.status, FLAME_ERR_INVALID_ARG);
    flame_latency lat = {.struct_size = sizeof lat};
    assert_int_equal(flame_scheduler_get_latency(s, FLAME_STAGE_TOTAL, &lat), FLAME_OK);
    assert_int_equal(lat.count, 2);
    assert_int_equal(lat.max_us, 2000); /* a, submitted at the clock's start, completed 2,000 us later */
    assert_int_equal(lat.sum_us, 2000); /* v took no time on the fake clock */
    flame_scheduler_destroy(s);
}

static void test_cancel(void **state)
{
    fixture *f = *state;
    static req g, a, b, c;
    flame_scheduler *s = make_sched(f->se, NULL, 0, 0, 1, 0);
    make_req(&g, 3, 8, true);
    gate.entered = gate.open = false;
    uint64_t tg = 0;
    assert_int_equal(flame_scheduler_submit_ex(s, &g.r, g.scores, MAXC * 2, NULL, gate_done, &g, &tg), FLAME_OK);
    pthread_mutex_lock(&gate.mu);
    while (!gate.entered) pthread_cond_wait(&gate.cv, &gate.mu);
    pthread_mutex_unlock(&gate.mu);
    make_req(&a, 3, 10, true);
    make_req(&b, 3, 300, true); /* split: all three parts withdrawn */
    make_req(&c, 3, 10, true);
    const uint64_t ta = submit_opt(s, &a, FLAME_PRIORITY_LOW, 0, 0, on_done);
    const uint64_t tb = submit_opt(s, &b, FLAME_PRIORITY_LOW, 0, 0, on_done);
    submit_opt(s, &c, FLAME_PRIORITY_HIGH, 0, 0, on_done);
    assert_true(tg < ta && ta < tb);
    assert_int_equal(flame_scheduler_cancel(s, tb), FLAME_OK);
    assert_int_equal(atomic_load(&b.calls), 1); /* done ran before cancel returned */
    assert_int_equal(b.status, FLAME_ERR_CANCELLED);
    assert_non_null(strstr(b.message, "cancelled while queued"));
    assert_status_msg(flame_scheduler_cancel(s, tb), FLAME_ERR_UNAVAILABLE, "no longer queued: it is being scored or has completed");
    assert_status_msg(flame_scheduler_cancel(s, tg), FLAME_ERR_UNAVAILABLE, "no longer queued");
    assert_status_msg(flame_scheduler_cancel(s, 0), FLAME_ERR_INVALID_ARG, "ticket 0 was never given");
    assert_status_msg(flame_scheduler_cancel(s, tb + 100), FLAME_ERR_INVALID_ARG, "was never given by this scheduler");
    assert_status_msg(flame_scheduler_cancel(NULL, ta), FLAME_ERR_INVALID_ARG, "scheduler is NULL");
    release_worker();
    wait_done(&a), wait_done(&c);
    for (int j = 0; j < MAXC * 2; j++) assert_true(isnan(b.scores[j]));
    assert_int_equal(a.status, FLAME_OK);
    assert_int_equal(c.status, FLAME_OK);
    direct(f->se, &a), assert_matches(&a, 2);
    flame_scheduler_stats st = stats_of(s);
    assert_int_equal(st.cancelled, 1);
    assert_int_equal(st.completed, 3);
    assert_int_equal(st.parts, 3); /* g, a, c */
    flame_scheduler_destroy(s);
    assert_int_equal(atomic_load(&a.calls) + atomic_load(&b.calls) + atomic_load(&c.calls) + atomic_load(&g.calls), 4);
}

/* Destroy with work pending of every kind: each accepted request's done runs exactly once,
 * with its own status (timeout, cancel, engine error, or scored). */
static void test_every_callback_once_at_destroy(void **state)
{
    fixture *f = *state;
    enum { N = 30 };
    static req g, q[N];
    flame_scheduler *s = make_sched(f->se, NULL, 0, 0, 1, 0);
    fl_sched_set_clock(s, fake_clock, NULL);
    make_req(&g, 3, 8, true);
    hold_worker(s, &g, NULL);
    uint64_t t[N];
    for (int i = 0; i < N; i++) {
        make_req(&q[i], (size_t)tu_below(MAXH), 1 + (size_t)tu_below(200), true);
        if (i % 7 == 3) q[i].cand[0] = 99999; /* an engine error: fails alone */
        t[i] = submit_opt(s, &q[i], (int32_t)(i % 3) - 1, i % 5 == 1 ? 1000 : 0, 0, on_done);
    }
    for (int i = 0; i < N; i++)
        if (i % 4 == 2) assert_int_equal(flame_scheduler_cancel(s, t[i]), FLAME_OK);
    advance(s, 5000); /* the timeouts of i % 5 == 1 have passed */
    release_worker();
    flame_scheduler_destroy(s);
    assert_int_equal(atomic_load(&g.calls), 1);
    for (int i = 0; i < N; i++) {
        assert_int_equal(atomic_load(&q[i].calls), 1);
        flame_status want = i % 4 == 2 ? FLAME_ERR_CANCELLED
                            : i % 5 == 1 ? FLAME_ERR_TIMEOUT
                            : i % 7 == 3 ? FLAME_ERR_INVALID_ARG : FLAME_OK;
        if (q[i].status != want) fail_msg("request %d: %s, expected %s (%s)", i, flame_status_string(q[i].status),
                                          flame_status_string(want), q[i].message);
        if (want == FLAME_OK) direct(f->se, &q[i]), assert_matches(&q[i], 2);
        else for (int j = 0; j < MAXC * 2; j++) assert_true(isnan(q[i].scores[j]));
    }
}

/* Many threads submit with priorities and deadlines and cancel concurrently (make
 * test-sanitize runs it under ThreadSanitizer): every request completes exactly once. */
typedef struct stress_arg {
    flame_scheduler *s;
    req *qs;
    int n;
    atomic_int *cancelled_ok;
} stress_arg;
static void *stress_client(void *p)
{
    stress_arg *a = p;
    for (int k = 0; k < a->n; k++) {
        req *q = &a->qs[k];
        flame_submit_options o = {.struct_size = sizeof o, .priority = (int32_t)(k % 3) - 1,
                                  .timeout_us = k % 4 == 0 ? 200 : 0};
        uint64_t t = 0;
        if (flame_scheduler_submit_ex(a->s, &q->r, q->scores, MAXC * 2, &o, on_done, q, &t) != FLAME_OK) {
            atomic_fetch_add(&q->calls, 1000); /* refused: must not complete */
            continue;
        }
        if (k % 5 == 0 && flame_scheduler_cancel(a->s, t) == FLAME_OK) atomic_fetch_add(a->cancelled_ok, 1);
    }
    return NULL;
}
static void test_admission_stress(void **state)
{
    fixture *f = *state;
    enum { T = 6, K = 25 };
    static req qs[T][K];
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) make_req(&qs[t][k], (size_t)tu_below(MAXH), 1 + (size_t)tu_below(160), true);
    flame_scheduler *s = make_sched(f->se, NULL, 0, 300, 2, 0);
    atomic_int cancelled_ok = 0;
    pthread_t th[T];
    stress_arg args[T];
    for (int t = 0; t < T; t++) {
        args[t] = (stress_arg){s, qs[t], K, &cancelled_ok};
        pthread_create(&th[t], NULL, stress_client, &args[t]);
    }
    for (int t = 0; t < T; t++) pthread_join(th[t], NULL);
    flame_scheduler_destroy(s); /* drains */
    int cancelled = 0, timeouts = 0;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            req *q = &qs[t][k];
            assert_int_equal(atomic_load(&q->calls), 1);
            if (q->status == FLAME_ERR_CANCELLED) cancelled++;
            else if (q->status == FLAME_ERR_TIMEOUT) assert_int_equal(k % 4, 0), timeouts++;
            else assert_int_equal(q->status, FLAME_OK);
        }
    assert_int_equal(cancelled, atomic_load(&cancelled_ok));
}

/* The adaptive wait on an injected clock: a lone request after an idle spell waits the whole
 * bound (low traffic); a train of arrivals 100 us apart keeps its batch open while they come
 * on time and sends it once the next is overdue (the average gap), long before the bound,
 * where the fixed wait holds it to the bound. */
static void test_adaptive_wait(void **state)
{
    fixture *f = *state;
    enum { N = 30 };
    static req q[N];
    const flame_batch_profile p[] = {{64, 64}}; /* never full here: only the wait sends it */
    const int64_t bound = 10000;
    for (uint32_t adaptive = 0; adaptive <= 1; adaptive++) {
        flame_scheduler_params sp = {.struct_size = sizeof sp, .profiles = p, .num_profiles = 1, .workers = 1,
                                     .max_wait_us = bound, .adaptive_wait = adaptive};
        flame_scheduler *s = NULL;
        assert_int_equal(flame_scheduler_create(f->se, &sp, &s), FLAME_OK);
        fl_sched_set_clock(s, fake_clock, NULL);
        /* low traffic: the first request waits the bound either way */
        make_req(&q[0], 3, 4, true);
        submit_opt(s, &q[0], 0, 0, 0, on_done);
        advance(s, (uint64_t)bound - 1);
        usleep(20000);
        assert_int_equal(atomic_load(&q[0].calls), 0);
        advance(s, 1);
        wait_done(&q[0]);
        assert_int_equal(flame_scheduler_reset_latency(s), FLAME_OK); /* the window: the train only */
        /* a train: 29 arrivals 100 us apart */
        for (int i = 1; i < N; i++) {
            make_req(&q[i], 3, 2, true);
            advance(s, 100);
            submit_opt(s, &q[i], 0, 0, 0, on_done);
        }
        usleep(20000);
        for (int i = 1; i < N; i++) assert_int_equal(atomic_load(&q[i].calls), 0); /* they came on time */
        const double gap = s->levels[1].gap_us;
        assert_true(gap > 100 && gap < 400); /* 100 + 9900 x (7/8)^28 */
        advance(s, (uint64_t)gap + 1); /* the next one is overdue */
        usleep(20000);
        if (adaptive) {
            for (int i = 1; i < N; i++) wait_done(&q[i]);
        } else {
            for (int i = 1; i < N; i++) assert_int_equal(atomic_load(&q[i].calls), 0); /* held to the bound */
            advance(s, (uint64_t)bound); /* past the oldest's bound */
            for (int i = 1; i < N; i++) wait_done(&q[i]);
        }
        flame_scheduler_stats st = stats_of(s);
        assert_int_equal(st.batches, 2);
        assert_int_equal(st.batch_slots_used, 4 + 2 * (N - 1));
        flame_latency qw = {.struct_size = sizeof qw};
        assert_int_equal(flame_scheduler_get_latency(s, FLAME_STAGE_QUEUE_WAIT, &qw), FLAME_OK);
        /* the oldest of the train waited 2,800 us + the gap (adaptive) or the whole bound */
        if (adaptive) assert_true(qw.max_us >= 2800 && qw.max_us < (uint64_t)bound);
        else assert_true(qw.max_us >= (uint64_t)bound);
        flame_scheduler_destroy(s);
        for (int i = 0; i < N; i++) assert_int_equal(q[i].status, FLAME_OK);
    }
}

/* The worker's sleep as the scheduler records it: waits until it sleeps with a wake time that
 * is (timed) or is not (untimed) set, and returns the signals sent so far. */
static uint64_t signals_once_asleep(flame_scheduler *s, bool timed)
{
    for (int i = 0; i < 100000; i++) {
        pthread_mutex_lock(&s->mu);
        const fl_worker *w = &s->workers[0];
        const bool ok = w->asleep && (timed ? w->wake_at != 0 && w->wake_at != UINT64_MAX : w->wake_at == UINT64_MAX);
        const uint64_t n = s->signals;
        pthread_mutex_unlock(&s->mu);
        if (ok) return n;
        usleep(100);
    }
    fail_msg("the worker never went to sleep (%s)", timed ? "timed" : "untimed");
    return 0;
}

static uint64_t signals_of(flame_scheduler *s)
{
    pthread_mutex_lock(&s->mu);
    const uint64_t n = s->signals;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* A submit wakes the worker only when it must look sooner than it will by itself: the first
 * request into an empty queue, and the one that fills the batch; none while a batch forms
 * under its timer, none while the worker is busy. */
static void test_wakeups_once_per_batch(void **state)
{
    fixture *f = *state;
    static req q[9];
    const flame_batch_profile p[] = {{4, 64}};
    flame_scheduler *s = make_sched(f->se, p, 1, 10000, 1, 0);
    fl_sched_set_clock(s, fake_clock, NULL);
    uint64_t sig = signals_once_asleep(s, false);
    make_req(&q[0], 3, 2, true);
    submit_opt(s, &q[0], 0, 0, 0, on_done); /* empty -> not empty: the worker starts the batch's timer */
    assert_int_equal(signals_of(s), sig + 1);
    sig = signals_once_asleep(s, true);
    for (int i = 1; i < 3; i++) { /* the batch forms: the timer covers them */
        make_req(&q[i], 3, 2, true);
        submit_opt(s, &q[i], 0, 0, 0, on_done);
        assert_int_equal(signals_of(s), sig);
    }
    usleep(20000);
    for (int i = 0; i < 3; i++) assert_int_equal(atomic_load(&q[i].calls), 0);
    make_req(&q[3], 3, 2, true);
    submit_opt(s, &q[3], 0, 0, 0, on_done); /* the fourth fills the profile: the batch goes now */
    assert_int_equal(signals_of(s), sig + 1);
    for (int i = 0; i < 4; i++) wait_done(&q[i]);
    assert_int_equal(stats_of(s).batches, 1);
    /* a busy worker: nothing to signal, it finds the queue when its batch is done */
    sig = signals_once_asleep(s, false);
    pthread_mutex_lock(&s->mu);
    const uint32_t pooled = s->pool_n; /* the batch's four jobs, back in the pool for the next submits */
    pthread_mutex_unlock(&s->mu);
    assert_int_equal(pooled, 4);
    make_req(&q[4], 3, 2, true);
    gate.entered = gate.open = false;
    assert_int_equal(flame_scheduler_submit_ex(s, &q[4].r, q[4].scores, MAXC * 2, NULL, gate_done, &q[4], NULL), FLAME_OK);
    advance(s, 10000); /* its bound: it goes alone and its callback holds the worker */
    pthread_mutex_lock(&gate.mu);
    while (!gate.entered) pthread_cond_wait(&gate.cv, &gate.mu);
    pthread_mutex_unlock(&gate.mu);
    sig = signals_of(s);
    for (int i = 5; i < 9; i++) {
        make_req(&q[i], 3, 2, true);
        submit_opt(s, &q[i], 0, 0, 0, on_done);
    }
    assert_int_equal(signals_of(s), sig);
    release_worker();
    for (int i = 5; i < 9; i++) wait_done(&q[i]); /* a full batch, taken once the worker was back */
    assert_int_equal(stats_of(s).batches, 3);
    flame_scheduler_destroy(s);
    for (int i = 0; i < 9; i++) assert_int_equal(q[i].status, FLAME_OK);
}

typedef struct thread_arg {
    flame_scheduler *s;
    req *qs; /* [4], built before the threads start (the test generator is not thread-safe) */
    atomic_int *bad;
} thread_arg;

static void *client(void *p)
{
    thread_arg *a = p;
    for (int k = 0; k < 40; k++) {
        req *q = &a->qs[k % 4];
        tu_poison(q->scores, MAXC * 2);
        if (flame_scheduler_score(a->s, &q->r, q->scores, MAXC * 2) != FLAME_OK) {
            atomic_fetch_add(a->bad, 1);
            continue;
        }
        double want[MAXC * 2];
        const size_t n = q->r.num_candidates * 2;
        for (size_t i = 0; i < n; i++) want[i] = q->want[i];
        if (!(tu_rel_err(q->scores, want, n) < 1e-5)) atomic_fetch_add(a->bad, 1);
    }
    return NULL;
}

static void test_threads_score_concurrently(void **state)
{
    fixture *f = *state;
    static req qs[8][4];
    for (int t = 0; t < 8; t++)
        for (int k = 0; k < 4; k++) {
            make_req(&qs[t][k], (size_t)tu_below(MAXH + 1), 1 + (size_t)tu_below(150), true);
            direct(f->se, &qs[t][k]);
        }
    flame_scheduler *s = make_sched(f->se, NULL, 0, 200, 2, 0);
    atomic_int bad = 0;
    pthread_t th[8];
    thread_arg args[8];
    for (int t = 0; t < 8; t++) {
        args[t] = (thread_arg){s, qs[t], &bad};
        pthread_create(&th[t], NULL, client, &args[t]);
    }
    for (int t = 0; t < 8; t++) pthread_join(th[t], NULL);
    assert_int_equal(atomic_load(&bad), 0);
    flame_scheduler_stats st = stats_of(s);
    assert_int_equal(st.completed, 8 * 40);
    assert_true(st.batches <= st.parts);
    flame_scheduler_destroy(s);
}

/* ------------------------------------------------------------------ requests of every kind */

/* Histories from the user cache, and a caller built against the first flame.h. */
static void test_user_cache_requests_and_older_layout(void **state)
{
    fixture *f = *state;
    char name[64];
    snprintf(name, sizeof name, "/flame-sched-test-%d", (int)getpid());
    flame_user_cache_unlink(name);
    flame_user_cache_params up = {.struct_size = sizeof up, .capacity = 64, .max_ids = 16};
    flame_user_cache *uc = NULL;
    assert_int_equal(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE, &up, &uc), FLAME_OK);
    assert_int_equal(flame_engine_set_user_cache(f->de, uc), FLAME_OK);
    flame_scheduler *s = make_sched(f->de, NULL, 0, 1000, 1, 0);
    static req q[6];
    for (int u = 0; u < 6; u++) {
        make_req(&q[u], 1 + (size_t)tu_below(16), 50, false);
        uint32_t len = (uint32_t)q[u].r.history_len;
        flame_user_features uf = {.struct_size = sizeof uf, .ids = q[u].hist, .num_ids = len, .slot_lens = &len};
        assert_int_equal(flame_user_cache_put(uc, 100 + u, &uf), FLAME_OK);
        direct(f->de, &q[u]); /* the history given */
        q[u].r.history = NULL, q[u].r.history_len = 0;
        q[u].r.user_id = 100 + u;
        q[u].r.history_from_user_cache = 1;
    }
    q[5].r.struct_size = offsetof(flame_request, history_from_user_cache); /* an older layout: history given */
    q[5].r.history = q[5].hist, q[5].r.history_len = 3;
    direct(f->de, &q[5]); /* (direct() reads it in the older layout too) */
    for (int u = 0; u < 6; u++)
        assert_int_equal(flame_scheduler_submit(s, &q[u].r, q[u].scores, MAXC * 2, on_done, &q[u]), FLAME_OK);
    for (int u = 0; u < 6; u++) {
        wait_done(&q[u]);
        assert_int_equal(q[u].status, FLAME_OK);
        assert_matches(&q[u], 1);
    }
    flame_scheduler_destroy(s);
    flame_engine_stats es = {.struct_size = sizeof es};
    assert_int_equal(flame_engine_get_stats(f->de, &es), FLAME_OK);
    assert_int_equal(es.user_cache_hits, 5);
    assert_int_equal(flame_engine_set_user_cache(f->de, NULL), FLAME_OK);
    flame_user_cache_destroy(uc);
    flame_user_cache_unlink(name);
}

static void test_argument_errors(void **state)
{
    fixture *f = *state;
    flame_scheduler *s = NULL;
    assert_status_msg(flame_scheduler_create(NULL, NULL, &s), FLAME_ERR_INVALID_ARG, "engine is NULL");
    assert_status_msg(flame_scheduler_create(f->se, NULL, NULL), FLAME_ERR_INVALID_ARG, "out is NULL");
    flame_scheduler_params p = {.struct_size = 4};
    assert_status_msg(flame_scheduler_create(f->se, &p, &s), FLAME_ERR_INVALID_ARG, "flame_scheduler_params.struct_size = 4");
    p = (flame_scheduler_params){.struct_size = sizeof p, .max_wait_us = -1};
    assert_status_msg(flame_scheduler_create(f->se, &p, &s), FLAME_ERR_INVALID_ARG, "max_wait_us -1 is outside");
    p = (flame_scheduler_params){.struct_size = sizeof p, .max_bypass = 70000};
    assert_status_msg(flame_scheduler_create(f->se, &p, &s), FLAME_ERR_INVALID_ARG, "max_bypass 70000 is outside");
    p = (flame_scheduler_params){.struct_size = sizeof p, .adaptive_wait = 2};
    assert_status_msg(flame_scheduler_create(f->se, &p, &s), FLAME_ERR_INVALID_ARG, "adaptive_wait 2 is outside 0..1");
    p = (flame_scheduler_params){.struct_size = sizeof p, .workers = 65};
    assert_status_msg(flame_scheduler_create(f->se, &p, &s), FLAME_ERR_INVALID_ARG, "workers 65 is outside 1..64");
    const flame_batch_profile bad[] = {{0, 8}};
    p = (flame_scheduler_params){.struct_size = sizeof p, .profiles = bad, .num_profiles = 1};
    assert_status_msg(flame_scheduler_create(f->se, &p, &s), FLAME_ERR_INVALID_ARG, "profile 0: max_users 0");
    assert_null(s);

    s = make_sched(f->se, NULL, 0, 0, 1, 0);
    static req q;
    make_req(&q, 4, 10, true);
    assert_status_msg(flame_scheduler_submit(s, &q.r, q.scores, MAXC * 2, NULL, &q), FLAME_ERR_INVALID_ARG,
                      "done is NULL");
    assert_status_msg(flame_scheduler_submit(s, NULL, q.scores, MAXC * 2, on_done, &q), FLAME_ERR_INVALID_ARG,
                      "request is NULL");
    assert_status_msg(flame_scheduler_submit(s, &q.r, q.scores, 19, on_done, &q), FLAME_ERR_BUFFER_TOO_SMALL,
                      "room for 19 floats, the request needs 10 x 2");
    assert_status_msg(flame_scheduler_submit(s, &q.r, NULL, MAXC * 2, on_done, &q), FLAME_ERR_INVALID_ARG,
                      "scores is NULL");
    flame_request r = q.r;
    r.num_side_features = 1;
    assert_status_msg(flame_scheduler_submit(s, &r, q.scores, MAXC * 2, on_done, &q), FLAME_ERR_INVALID_ARG,
                      "num_side_features = 1, the model has 2");
    r = q.r;
    r.struct_size = 5000;
    assert_status_msg(flame_scheduler_submit(s, &r, q.scores, MAXC * 2, on_done, &q), FLAME_ERR_INVALID_ARG,
                      "flame_request.struct_size = 5000");
    r = q.r;
    r.candidates = NULL;
    assert_status_msg(flame_scheduler_submit(s, &r, q.scores, MAXC * 2, on_done, &q), FLAME_ERR_INVALID_ARG,
                      "candidates is NULL with num_candidates 10");
    flame_submit_options o = {.struct_size = sizeof o, .priority = 2};
    assert_status_msg(flame_scheduler_submit_ex(s, &q.r, q.scores, MAXC * 2, &o, on_done, &q, NULL),
                      FLAME_ERR_INVALID_ARG, "priority 2 is none of");
    o = (flame_submit_options){.struct_size = sizeof o, .timeout_us = -1};
    assert_status_msg(flame_scheduler_submit_ex(s, &q.r, q.scores, MAXC * 2, &o, on_done, &q, NULL),
                      FLAME_ERR_INVALID_ARG, "timeout_us -1 is outside");
    o = (flame_submit_options){.struct_size = 3};
    assert_status_msg(flame_scheduler_submit_ex(s, &q.r, q.scores, MAXC * 2, &o, on_done, &q, NULL),
                      FLAME_ERR_INVALID_ARG, "flame_submit_options.struct_size = 3");
    assert_int_equal(atomic_load(&q.calls), 0); /* none of these called done */
    /* no candidates: validated and done before submit returns; candidate bags holding ids
     * over no candidates contradict themselves, refused as flame_score refuses them */
    r = q.r;
    r.num_candidates = 0, r.candidates = NULL;
    flame_bags held[SLOTS] = {q.cs[0], q.cs[1]};
    held[0].num_ids = 1, held[1].num_ids = 0;
    r.candidate_side = held;
    assert_int_equal(flame_scheduler_submit(s, &r, NULL, 0, on_done, &q), FLAME_OK);
    assert_string_equal(flame_last_error(), ""); /* accepted: the request's error went to done */
    assert_int_equal(atomic_load(&q.calls), 1);
    assert_int_equal(q.status, FLAME_ERR_INVALID_ARG);
    assert_non_null(strstr(q.message, "candidate side feature 'artist' (slot 0): num_ids = 1, but there are no "
                                      "candidate tokens"));
    r.candidate_side = NULL;
    assert_int_equal(flame_scheduler_submit(s, &r, NULL, 0, on_done, &q), FLAME_OK);
    assert_int_equal(atomic_load(&q.calls), 2);
    assert_int_equal(q.status, FLAME_OK);
    q.hist[1] = -5;
    assert_int_equal(flame_scheduler_submit(s, &r, NULL, 0, on_done, &q), FLAME_OK);
    assert_int_equal(atomic_load(&q.calls), 3);
    assert_int_equal(q.status, FLAME_ERR_INVALID_ARG);
    assert_non_null(strstr(q.message, "id -5 out of range"));
    flame_scheduler_stats st = {.struct_size = 0};
    assert_status_msg(flame_scheduler_get_stats(s, &st), FLAME_ERR_INVALID_ARG, "flame_scheduler_stats.struct_size = 0");
    assert_status_msg(flame_scheduler_get_stats(NULL, &st), FLAME_ERR_INVALID_ARG, "scheduler is NULL");
    assert_status_msg(flame_scheduler_reset_latency(NULL), FLAME_ERR_INVALID_ARG, "scheduler is NULL");
    st = stats_of(s);
    assert_int_equal(st.submitted, 3);
    assert_int_equal(st.completed, 1);
    assert_int_equal(st.failed, 2);
    flame_scheduler_destroy(s);
    flame_scheduler_destroy(NULL);
}

/* A GPU engine (fp32) behind the scheduler: its default workers are the executors, and the
 * scores match the CPU engine's. Skipped without a GPU (make test-gpu requires one). */
static void test_gpu_engine(void **state)
{
    TU_NEED_GPU();
    fixture *f = *state;
    flame_config *cfg = NULL;
    flame_engine *g = NULL;
    assert_int_equal(flame_config_create(&cfg), FLAME_OK);
    assert_int_equal(flame_config_set_string(cfg, FLAME_OPT_DEVICE, "cuda"), FLAME_OK);
    assert_int_equal(flame_config_set_int(cfg, FLAME_OPT_CUDA_EXECUTORS, 3), FLAME_OK);
    if (flame_engine_create(f->sumi, cfg, &g) != FLAME_OK) fail_msg("GPU engine: %s", flame_last_error());
    flame_config_destroy(cfg);
    flame_scheduler *s = make_sched(g, NULL, 0, 500, 0, 0);
    assert_int_equal(s->num_workers, 3);
    enum { N = 16 };
    static req q[N];
    for (int i = 0; i < N; i++) {
        make_req(&q[i], (size_t)tu_below(MAXH + 1), 1 + (size_t)tu_below(MAXC), true);
        direct(f->se, &q[i]); /* the CPU engine's scores */
        assert_int_equal(flame_scheduler_submit(s, &q[i].r, q[i].scores, MAXC * 2, on_done, &q[i]), FLAME_OK);
    }
    for (int i = 0; i < N; i++) {
        wait_done(&q[i]);
        assert_int_equal(q[i].status, FLAME_OK);
        assert_matches(&q[i], 2);
    }
    flame_scheduler_destroy(s);
    flame_engine_destroy(g);
}

int main(void)
{
#define T(f) cmocka_unit_test(f)
    const struct CMUnitTest tests[] = {
        T(test_histogram),
        T(test_profiles),
        T(test_scores_match_direct_calls),
        T(test_split_parts_and_stats),
        T(test_dot_head_is_never_split),
        T(test_kv_cache_request_is_not_split),
        T(test_full_batches_do_not_wait),
        T(test_waiting_and_arrival_order),
        T(test_bad_request_fails_alone),
        T(test_split_request_failing_writes_nothing),
        T(test_split_request_with_broken_bags_is_refused),
        T(test_split_request_bag_count_is_checked),
        T(test_queue_full_sheds_load),
        T(test_destroy_drains_the_queue),
        T(test_destroy_from_a_done_callback),
        T(test_destroy_scheduler_and_engine_in_a_callback_during_isolation),
        T(test_priorities_and_no_starvation),
        T(test_bypass_count_leaves_with_the_requests),
        T(test_score_ex_with_options),
        T(test_deadlines),
        T(test_deadline_while_waiting_for_company),
        T(test_split_request_failing_then_expiring),
        T(test_cancel),
        T(test_every_callback_once_at_destroy),
        T(test_admission_stress),
        T(test_adaptive_wait),
        T(test_wakeups_once_per_batch),
        T(test_threads_score_concurrently),
        T(test_user_cache_requests_and_older_layout),
        T(test_argument_errors),
        T(test_gpu_engine),
    };
    return cmocka_run_group_tests_name("scheduler", tests, setup, teardown);
}
