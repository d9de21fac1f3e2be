/* flame_score with an item cache attached: id-only requests get their side-feature bags from
 * the cache and score bitwise like the same bags given explicitly; one fetch per call for the
 * misses; missing records pool to zero vectors; source failures leave the scores untouched. */
#include <stdatomic.h>
#include <stdbool.h>

#include "testutil.h"
#include "tu_models.h"

static const char *sumi_config = TU_SUMI_SIDE_CONFIG(100, 12, 13, gelu_tanh);

/* item i: tu_item_record (tests/tu_models.h); 50..59 and ids outside 0..99 unknown */
static bool known(int64_t item)
{
    return item >= 0 && item < 100 && !(item >= 50 && item < 60);
}

static atomic_int calls, fail_next, bad_artist;
static flame_status fetch(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)user;
    atomic_fetch_add(&calls, 1);
    if (atomic_exchange(&fail_next, 0)) return FLAME_ERR_UNAVAILABLE;
    for (size_t i = 0; i < n; i++) {
        if (!known(ids[i])) {
            flame_feature_batch_set_missing(out, i);
            continue;
        }
        int64_t offs[3], v[3];
        tu_item_record(ids[i], offs, v);
        if (atomic_load(&bad_artist) && ids[i] == 7) v[0] = 25;
        flame_feature_batch_set(out, i, offs, v, (size_t)offs[2], NULL, 0);
    }
    return FLAME_OK;
}

typedef struct fixture {
    flame_model *model;
    flame_engine *plain, *cached;
    flame_item_cache *cache;
} fixture;

static int setup(void **state)
{
    tu_seed();
    fixture *f = calloc(1, sizeof *f);
    flame_feature_source *s;
    flame_config *cfg;
    flame_item_cache_params icp = {.struct_size = sizeof icp, .manual_refresh = 1};
    atomic_store(&calls, 0);
    /* the cached engine is given its cache at creation */
    if (flame_model_create_random(sumi_config, 3, &f->model) || flame_engine_create(f->model, NULL, &f->plain) ||
        flame_feature_source_create_callback(2, fetch, NULL, NULL, &s) ||
        flame_item_cache_create(s, &icp, &f->cache) || flame_config_create(&cfg) ||
        flame_config_set_pointer(cfg, FLAME_OPT_ITEM_CACHE, f->cache) ||
        flame_engine_create(f->model, cfg, &f->cached))
        return -1;
    flame_config_destroy(cfg);
    flame_feature_source_destroy(s);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    flame_item_cache_destroy(f->cache);
    flame_engine_destroy(f->plain);
    flame_engine_destroy(f->cached); /* releases its cache reference last */
    flame_model_destroy(f->model);
    free(f);
    return 0;
}


static flame_request req(const int64_t *h, size_t n, const int64_t *c, size_t m, const tu_side_bags *hb, const tu_side_bags *cb)
{
    return (flame_request){.struct_size = sizeof(flame_request), .history = h, .history_len = n, .candidates = c,
                           .num_candidates = m, .history_side = hb ? hb->b : NULL,
                           .candidate_side = cb ? cb->b : NULL, .num_side_features = 2};
}

static void test_id_only_matches_explicit_bags(void **state)
{
    fixture *f = *state;
    for (int round = 0; round < 5; round++) {
        size_t n = round == 0 ? 0 : (size_t)(1 + tu_below(30)), m = (size_t)(1 + tu_below(10)); /* beyond max_len 12 too */
        int64_t h[64], c[16];
        for (size_t i = 0; i < n; i++) h[i] = tu_below(100);
        for (size_t i = 0; i < m; i++) c[i] = tu_below(100);
        h[0] = 55; /* unknown to the source: empty bags */
        static tu_side_bags hb, cb;
        tu_side_bags_build(&hb, h, n, known);
        tu_side_bags_build(&cb, c, m, known);
        flame_request explicit = req(h, n, c, m, &hb, &cb), ids_only = req(h, n, c, m, NULL, NULL);
        float want[32], got[32];
        tu_poison(got, 32);
        assert_int_equal(flame_score(f->plain, &explicit, want, 32), FLAME_OK);
        assert_int_equal(flame_score(f->cached, &ids_only, got, 32), FLAME_OK);
        assert_memory_equal(want, got, m * 2 * sizeof(float));
        /* explicit bags win on the cached engine too */
        assert_int_equal(flame_score(f->cached, &explicit, got, 32), FLAME_OK);
        assert_memory_equal(want, got, m * 2 * sizeof(float));
    }
}

static void test_batch_mixed_and_one_fetch_per_call(void **state)
{
    fixture *f = *state;
    int64_t h1[5] = {1, 2, 3, 2, 1}, c1[3] = {4, 5, 1}, h2[3] = {9, 8, 7}, c2[2] = {6, 3};
    static tu_side_bags hb, cb;
    tu_side_bags_build(&hb, h2, 3, known);
    tu_side_bags_build(&cb, c2, 2, known);
    flame_request two[2] = {req(h1, 5, c1, 3, NULL, NULL), req(h2, 3, c2, 2, &hb, &cb)};
    float got[10];
    int before = atomic_load(&calls);
    assert_int_equal(flame_score_batch(f->cached, two, 2, got, 10), FLAME_OK);
    assert_int_equal(atomic_load(&calls), before + 1); /* 5 distinct ids, one fetch */
    flame_item_cache_stats st = {.struct_size = sizeof st};
    flame_item_cache_get_stats(f->cache, &st);
    assert_int_equal(st.entries, 5);
    assert_int_equal(flame_score_batch(f->cached, two, 2, got, 10), FLAME_OK);
    assert_int_equal(atomic_load(&calls), before + 1); /* all hits */
    static tu_side_bags hb1, cb1;
    tu_side_bags_build(&hb1, h1, 5, known);
    tu_side_bags_build(&cb1, c1, 3, known);
    flame_request explicit[2] = {req(h1, 5, c1, 3, &hb1, &cb1), two[1]};
    float want[10];
    assert_int_equal(flame_score_batch(f->plain, explicit, 2, want, 10), FLAME_OK);
    assert_memory_equal(got, want, sizeof want);
}

static void test_failures_write_nothing(void **state)
{
    fixture *f = *state;
    int64_t h[3] = {10, 11, 12}, c[2] = {13, 7};
    flame_request r = req(h, 3, c, 2, NULL, NULL);
    float s[4];
    tu_poison(s, 4);
    atomic_store(&fail_next, 1);
    assert_status_msg(flame_score(f->cached, &r, s, 4), FLAME_ERR_UNAVAILABLE, "feature callback failed");
    atomic_store(&bad_artist, 1); /* a record whose id is out of its table's range */
    assert_status_msg(flame_score(f->cached, &r, s, 4), FLAME_ERR_INVALID_ARG,
                      "candidate token 1, feature 'artist' (table 'artist'): id 25 out of range [0, 20)");
    atomic_store(&bad_artist, 0);
    for (int i = 0; i < 4; i++) assert_true(isnan(s[i]));
    /* without a cache, id-only requests are refused as before */
    assert_status_msg(flame_score(f->plain, &r, s, 4), FLAME_ERR_INVALID_ARG, "history_side is NULL");
    flame_feature_source *s1;
    flame_item_cache *c1;
    assert_int_equal(flame_feature_source_create_callback(1, fetch, NULL, NULL, &s1), FLAME_OK);
    assert_int_equal(flame_item_cache_create(s1, NULL, &c1), FLAME_OK);
    assert_status_msg(flame_engine_set_item_cache(f->plain, c1), FLAME_ERR_INVALID_ARG,
                      "the item cache's records have 1 slots, the model has 2 side features");
    /* and at creation */
    flame_config *cfg;
    flame_engine *e = (flame_engine *)1;
    assert_int_equal(flame_config_create(&cfg), FLAME_OK);
    assert_int_equal(flame_config_set_pointer(cfg, FLAME_OPT_ITEM_CACHE, c1), FLAME_OK);
    void *back = NULL;
    assert_int_equal(flame_config_get_pointer(cfg, FLAME_OPT_ITEM_CACHE, &back), FLAME_OK);
    assert_ptr_equal(back, c1);
    assert_status_msg(flame_engine_create(f->model, cfg, &e), FLAME_ERR_INVALID_ARG,
                      "the item cache's records have 1 slots, the model has 2 side features");
    assert_null(e);
    flame_config_destroy(cfg);
    flame_item_cache_destroy(c1);
    flame_feature_source_destroy(s1);
    assert_int_equal(flame_engine_set_item_cache(f->plain, NULL), FLAME_OK);
}

/* A call refused for its ids, lengths or buffer never reaches the feature source: nothing is
 * fetched and nothing cached (no negative entries for bad ids pushing valid ones out). */
static void test_refused_requests_fetch_nothing(void **state)
{
    fixture *f = *state;
    int64_t h[20], c[3] = {4, 5, 6};
    for (int i = 0; i < 20; i++) h[i] = i + 1;
    float s[6];
    tu_poison(s, 6);
    h[19] = 100; /* the model has 100 items */
    flame_request r = req(h, 20, c, 3, NULL, NULL);
    assert_status_msg(flame_score(f->cached, &r, s, 6), FLAME_ERR_INVALID_ARG,
                      "history token 19, feature 'item' (table 'item'): id 100 out of range [0, 100)");
    h[19] = 20;
    h[2] = -1; /* outside the window of 12: not fetched, still refused */
    assert_status_msg(flame_score(f->cached, &r, s, 6), FLAME_ERR_INVALID_ARG, "history token 2");
    h[2] = 3;
    c[1] = 1000;
    assert_status_msg(flame_score(f->cached, &r, s, 6), FLAME_ERR_INVALID_ARG, "candidate token 1");
    c[1] = 5;
    assert_status_msg(flame_score(f->cached, &r, s, 5), FLAME_ERR_BUFFER_TOO_SMALL, "room for 5 floats");
    /* a valid id-only request beside a bad one: the call is refused before either is fetched */
    static tu_side_bags hb, cb;
    int64_t h2[2] = {7, 8}, c2[1] = {9};
    tu_side_bags_build(&hb, h2, 2, known);
    tu_side_bags_build(&cb, c2, 1, known);
    hb.ids[0][1] = 20; /* artist table has 20 rows */
    flame_request two[2] = {r, req(h2, 2, c2, 1, &hb, &cb)};
    float s2[8];
    tu_poison(s2, 8);
    assert_status_msg(flame_score_batch(f->cached, two, 2, s2, 8), FLAME_ERR_INVALID_ARG,
                      "request 1: history token 1, feature 'artist' (table 'artist'): id 20 out of range");
    hb.ids[0][1] = 8;
    hb.b[1].num_ids = (size_t)hb.off[1][2] + 1;
    assert_status_msg(flame_score_batch(f->cached, two, 2, s2, 8), FLAME_ERR_INVALID_ARG, "request 1: history side");
    for (int i = 0; i < 6; i++) assert_true(isnan(s[i]));
    for (int i = 0; i < 8; i++) assert_true(isnan(s2[i]));
    assert_int_equal(atomic_load(&calls), 0);
    flame_item_cache_stats st = {.struct_size = sizeof st};
    assert_int_equal(flame_item_cache_get_stats(f->cache, &st), FLAME_OK);
    assert_int_equal(st.fetches, 0);
    assert_int_equal(st.misses, 0);
    assert_int_equal(st.entries, 0);
    /* once valid, one fetch for the window and the candidates */
    assert_int_equal(flame_score(f->cached, &r, s, 6), FLAME_OK);
    assert_int_equal(atomic_load(&calls), 1);
    assert_int_equal(flame_item_cache_get_stats(f->cache, &st), FLAME_OK);
    assert_int_equal(st.entries, 12 + 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_id_only_matches_explicit_bags, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_mixed_and_one_fetch_per_call, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failures_write_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_requests_fetch_nothing, setup, teardown),
    };
    return cmocka_run_group_tests_name("engine_cache", tests, NULL, NULL);
}
