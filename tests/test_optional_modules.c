/* A library built without an optional module (make WITH_REDIS=0, WITH_NUMA=0) keeps its entry
 * points, which refuse with FLAME_ERR_UNSUPPORTED naming the build option, and what depends on
 * the module inside the library still works (the pinned pool on plain memory). A library built
 * with the modules skips these cases: test_feature_sources and test_numa cover them there.
 * tests/check-optional-modules.sh builds the library without them and runs every C suite. */
#include "testutil.h"

static void test_redis_stand_in(void **state)
{
    (void)state;
#if FLAME_WITH_REDIS
    fprintf(stderr, "# built with Redis (WITH_REDIS=1): test_feature_sources covers the source\n");
    skip();
#else
    flame_redis_options o = {.struct_size = sizeof o, .num_slots = 1};
    flame_feature_source *s = (flame_feature_source *)1;
    assert_status_msg(flame_feature_source_create_redis(&o, &s), FLAME_ERR_UNSUPPORTED, "make WITH_REDIS=0");
    assert_null(s);
    uint64_t written = 7;
    assert_status_msg(flame_redis_load_features(&o, "/nonexistent", &written), FLAME_ERR_UNSUPPORTED,
                      "flame_redis_load_features: this libflame was built without Redis support");
    assert_int_equal(written, 0);
#endif
}

static void test_numa_stand_in(void **state)
{
    (void)state;
#if FLAME_WITH_NUMA
    fprintf(stderr, "# built with libnuma (WITH_NUMA=1): test_numa covers it\n");
    skip();
#else
    flame_numa_info info = {.struct_size = sizeof info};
    assert_status_msg(flame_numa_get_info(&info), FLAME_ERR_UNSUPPORTED, "make WITH_NUMA=0");
    void *p = (void *)1;
    assert_status_msg(flame_numa_alloc(4096, FLAME_NUMA_NODE_LOCAL, &p), FLAME_ERR_UNSUPPORTED, "flame_numa_alloc");
    assert_null(p);
    assert_status_msg(flame_numa_bind_thread(0), FLAME_ERR_UNSUPPORTED, "flame_numa_bind_thread");
    flame_numa_free(NULL, 0);

    /* the pinned pool takes plain memory: the local node and node 0 work, others are refused */
    for (int32_t node = FLAME_NUMA_NODE_LOCAL; node <= 0; node++) {
        flame_pinned_pool_params pp = {.struct_size = sizeof pp, .numa_node = node, .pin = 0,
                                       .max_cached_bytes = 1 << 20};
        flame_pinned_pool *pool;
        assert_int_equal(flame_pinned_pool_create(&pp, &pool), FLAME_OK);
        unsigned char *buf;
        int32_t pinned = -1;
        assert_int_equal(flame_pinned_alloc(pool, 5000, (void **)&buf, &pinned), FLAME_OK);
        assert_int_equal(pinned, 0);
        for (size_t i = 0; i < 5000; i++) assert_int_equal(buf[i], 0); /* fresh pages are zero */
        memset(buf, 0xab, 5000);
        assert_int_equal(flame_pinned_free(pool, buf), FLAME_OK);
        flame_pinned_pool_destroy(pool);
    }
    flame_pinned_pool_params far = {.struct_size = sizeof far, .numa_node = 1, .pin = 0};
    flame_pinned_pool *pool = (flame_pinned_pool *)1;
    assert_status_msg(flame_pinned_pool_create(&far, &pool), FLAME_ERR_INVALID_ARG,
                      "NUMA node 1 does not exist: this libflame was built without libnuma");
    assert_null(pool);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_redis_stand_in),
        cmocka_unit_test(test_numa_stand_in),
    };
    return cmocka_run_group_tests_name("optional_modules", tests, NULL, NULL);
}
