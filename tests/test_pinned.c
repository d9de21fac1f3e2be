/* The pinned host buffer pool: size classes and footprint, reuse, the cache bound, the fallback
 * to pageable memory (no GPU here; a failing registration is injected through the pin hooks),
 * and concurrent use. */
#include <pthread.h>
#include <stdatomic.h>

#include "testutil.h"
#include "core/device.h"
#include "mem/pinned_pool.h"
#include "mem/size_class.h"

static size_t page(void)
{
    return (size_t)sysconf(_SC_PAGESIZE);
}

static size_t class_bytes(size_t bytes)
{
    return (size_t)fl_class_pages(fl_size_class((bytes + page() - 1) / page())) * page();
}

static flame_pinned_pool *make_pool(int32_t pin, uint64_t max_cached)
{
    flame_pinned_pool_params p = {.struct_size = sizeof p, .numa_node = FLAME_NUMA_NODE_LOCAL, .pin = pin,
                                  .max_cached_bytes = max_cached};
    flame_pinned_pool *pool = NULL;
    assert_int_equal(flame_pinned_pool_create(&p, &pool), FLAME_OK);
    return pool;
}

static flame_pinned_pool_stats stats_of(flame_pinned_pool *pool)
{
    flame_pinned_pool_stats s = {.struct_size = sizeof s};
    assert_int_equal(flame_pinned_pool_get_stats(pool, &s), FLAME_OK);
    return s;
}

static long rss_bytes(void)
{
    long pages_total = 0, pages_rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    assert_non_null(f);
    assert_int_equal(fscanf(f, "%ld %ld", &pages_total, &pages_rss), 2);
    fclose(f);
    return pages_rss * (long)page();
}

/* Every page count maps to a class that holds it with < 12.5% waste; classes are monotone and
 * each class's own size maps back to it. */
static void test_size_classes(void **state)
{
    (void)state;
    uint32_t prev = 0;
    for (uint64_t n = 1; n <= 200000; n++) {
        uint32_t c = fl_size_class(n);
        uint64_t got = fl_class_pages(c);
        assert_true(c < FL_NUM_CLASSES);
        assert_true(got >= n);
        if (n > FL_EXACT_CLASSES) assert_true(got * 8 < n * 9 + 8); else assert_int_equal(got, n);
        assert_true(c >= prev);
        prev = c;
    }
    for (uint32_t c = 0; c < FL_NUM_CLASSES; c++) assert_int_equal(fl_size_class(fl_class_pages(c)), c);
    assert_int_equal(fl_size_class(FL_MAX_CLASS_PAGES), FL_NUM_CLASSES - 1);
}

/* 8.7 GB asked: the pool reserves < 12.5% more (not the 16 GiB of power-of-two classes) and,
 * unpinned and untouched, it costs address space, not resident memory. */
static void test_large_request_footprint(void **state)
{
    (void)state;
    flame_pinned_pool *pool = make_pool(0, 1ull << 30);
    const size_t want = 8700000000ull;
    long rss0 = rss_bytes();
    char *p = NULL;
    int32_t pinned = -1;
    assert_int_equal(flame_pinned_alloc(pool, want, (void **)&p, &pinned), FLAME_OK);
    long grew = rss_bytes() - rss0;
    flame_pinned_pool_stats s = stats_of(pool);
    fprintf(stderr, "# 8.7 GB request: %.3f GB reserved (+%.2f%%), resident grew %ld KiB\n",
            s.bytes_reserved / 1e9, 100.0 * ((double)s.bytes_reserved / want - 1), grew / 1024);
    assert_int_equal(pinned, 0);
    assert_int_equal(s.bytes_requested, want);
    assert_true(s.bytes_reserved >= want && s.bytes_reserved <= want + want / 8);
    assert_int_equal(s.bytes_in_use, s.bytes_reserved);
    assert_int_equal(s.bytes_pageable, s.bytes_reserved);
    assert_int_equal(s.bytes_pinned, 0);
    assert_true(grew < 16 << 20);
    p[0] = 1;
    p[want - 1] = 2; /* the whole request is usable */
    assert_int_equal(p[0] + p[want - 1], 3);
    /* larger than max_cached: unmapped on free */
    assert_int_equal(flame_pinned_free(pool, p), FLAME_OK);
    s = stats_of(pool);
    assert_int_equal(s.bytes_reserved, 0);
    assert_int_equal(s.releases, 1);
    flame_pinned_pool_destroy(pool);
}

static void test_reuse_counts_hits_and_misses(void **state)
{
    (void)state;
    flame_pinned_pool *pool = make_pool(0, 1ull << 30);
    size_t a_bytes = 100000, b_bytes = 3 * page() + 1;
    void *a = NULL, *a2 = NULL, *b = NULL;
    assert_int_equal(flame_pinned_alloc(pool, a_bytes, &a, NULL), FLAME_OK);
    assert_int_equal(flame_pinned_free(pool, a), FLAME_OK);
    flame_pinned_pool_stats s = stats_of(pool);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.bytes_reserved, class_bytes(a_bytes)); /* cached */
    assert_int_equal(flame_pinned_alloc(pool, a_bytes - 10, &a2, NULL), FLAME_OK); /* same class: reused */
    assert_ptr_equal(a2, a);
    assert_int_equal(flame_pinned_alloc(pool, b_bytes, &b, NULL), FLAME_OK); /* another class: new */
    assert_ptr_not_equal(b, a);
    s = stats_of(pool);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.misses, 2);
    assert_int_equal(s.bytes_in_use, class_bytes(a_bytes) + class_bytes(b_bytes));
    assert_int_equal(s.bytes_requested, a_bytes - 10 + b_bytes);
    assert_int_equal(class_bytes(b_bytes), 4 * page());
    flame_pinned_pool_destroy(pool); /* both still handed out: unmapped with a warning */
}

static void test_cache_bound_releases(void **state)
{
    (void)state;
    size_t n = 64 << 10;
    flame_pinned_pool *pool = make_pool(0, n + n / 2); /* room for one cached buffer */
    void *a, *b;
    assert_int_equal(flame_pinned_alloc(pool, n, &a, NULL), FLAME_OK);
    assert_int_equal(flame_pinned_alloc(pool, n, &b, NULL), FLAME_OK);
    assert_int_equal(flame_pinned_free(pool, a), FLAME_OK);
    assert_int_equal(flame_pinned_free(pool, b), FLAME_OK);
    flame_pinned_pool_stats s = stats_of(pool);
    assert_int_equal(s.releases, 1);
    assert_int_equal(s.bytes_reserved, n);
    flame_pinned_pool_destroy(pool);
}

/* ---- pinning through injected hooks: buffers below 1 MiB pin, larger ones fail */
static atomic_int pins, unpins;
static int fake_pin(void *p, size_t bytes, char *why, size_t why_len)
{
    if (bytes >= (1u << 20)) {
        snprintf(why, why_len, "fake: cannot lock %zu bytes", bytes);
        return -1;
    }
    atomic_fetch_add(&pins, 1);
    return 0;
}
static void fake_unpin(void *p)
{
    atomic_fetch_add(&unpins, 1);
}

static char warned[512];
static void capture(flame_log_level level, const char *message, void *user)
{
    if (level == FLAME_LOG_WARN && strstr(message, "pageable")) snprintf(warned, sizeof warned, "%s", message);
}

static void test_failed_pin_falls_back_to_pageable(void **state)
{
    (void)state;
    fl_pinned_set_pin_hooks(fake_pin, fake_unpin);
    assert_int_equal(flame_set_log_callback(capture, NULL, FLAME_LOG_WARN), FLAME_OK);
    flame_pinned_pool *pool = make_pool(1, 1ull << 30);
    fl_pinned_set_pin_hooks(NULL, NULL); /* the pool keeps the hooks it was created with */
    void *small, *big;
    int32_t small_pinned = -1, big_pinned = -1;
    assert_int_equal(flame_pinned_alloc(pool, 64 << 10, &small, &small_pinned), FLAME_OK);
    assert_int_equal(flame_pinned_alloc(pool, 4 << 20, &big, &big_pinned), FLAME_OK);
    assert_int_equal(small_pinned, 1);
    assert_int_equal(big_pinned, 0);
    memset(big, 7, 4 << 20); /* pageable but usable */
    flame_pinned_pool_stats s = stats_of(pool);
    assert_int_equal(s.pinning, 1);
    assert_int_equal(s.pin_failures, 1);
    assert_int_equal(s.bytes_pinned, 64 << 10);
    assert_int_equal(s.bytes_pageable, 4 << 20);
    assert_non_null(strstr(warned, "fake: cannot lock 4194304 bytes"));
    assert_int_equal(flame_pinned_free(pool, small), FLAME_OK);
    assert_int_equal(flame_pinned_alloc(pool, 64 << 10, &small, &small_pinned), FLAME_OK); /* cached: no pin */
    assert_int_equal(small_pinned, 1);
    assert_int_equal(atomic_load(&pins), 1);
    flame_pinned_pool_destroy(pool);
    assert_int_equal(atomic_load(&unpins), 1); /* only the pinned buffer is unregistered */
    flame_set_log_callback(NULL, NULL, FLAME_LOG_ERROR);
}

/* Without hooks the pool pins only when this build and machine have a CUDA device. */
static void test_pins_only_with_a_device(void **state)
{
    (void)state;
    char why[256];
    int devices = fl_cuda_device_count(why, sizeof why);
    flame_pinned_pool *pool = make_pool(1, 1ull << 30);
    void *p;
    int32_t pinned = -1;
    assert_int_equal(flame_pinned_alloc(pool, 1 << 20, &p, &pinned), FLAME_OK);
    flame_pinned_pool_stats s = stats_of(pool);
    if (devices == 0) fprintf(stderr, "# no CUDA device (%s): the pool is pageable\n", why);
    assert_int_equal(s.pinning, devices > 0);
    assert_int_equal(pinned, devices > 0 && s.pin_failures == 0);
    assert_int_equal(s.bytes_pinned + s.bytes_pageable, 1 << 20);
    flame_pinned_pool_destroy(pool);
}

static void test_bad_frees_and_arguments(void **state)
{
    (void)state;
    flame_pinned_pool *pool = make_pool(0, 1 << 20);
    int local;
    void *p;
    assert_status_msg(flame_pinned_free(pool, &local), FLAME_ERR_INVALID_ARG, "not handed out by this pool");
    assert_int_equal(flame_pinned_alloc(pool, 10, &p, NULL), FLAME_OK);
    assert_int_equal(flame_pinned_free(pool, p), FLAME_OK);
    assert_status_msg(flame_pinned_free(pool, p), FLAME_ERR_INVALID_ARG, "already freed");
    assert_int_equal(flame_pinned_free(pool, NULL), FLAME_OK);
    assert_status_msg(flame_pinned_alloc(pool, 0, &p, NULL), FLAME_ERR_INVALID_ARG, "bytes 0");
    assert_status_msg(flame_pinned_alloc(pool, (1ull << 47) + 1, &p, NULL), FLAME_ERR_INVALID_ARG, "2^47");
    flame_pinned_pool_destroy(pool);
    flame_pinned_pool_destroy(NULL);
    flame_pinned_pool_params bad = {.struct_size = sizeof bad, .pin = 2};
    assert_status_msg(flame_pinned_pool_create(&bad, &pool), FLAME_ERR_INVALID_ARG, "pin is 2");
    assert_null(pool);
    bad = (flame_pinned_pool_params){.struct_size = sizeof bad, .numa_node = 64, .pin = 1};
    assert_status_msg(flame_pinned_pool_create(&bad, &pool), FLAME_ERR_INVALID_ARG, "node 64");
    bad.struct_size = 4;
    assert_status_msg(flame_pinned_pool_create(&bad, &pool), FLAME_ERR_INVALID_ARG,
                      "flame_pinned_pool_params.struct_size = 4");
    assert_int_equal(flame_pinned_pool_create(NULL, &pool), FLAME_OK); /* defaults */
    flame_pinned_pool_destroy(pool);
}

/* Threads allocating and freeing at once never get one buffer twice: each stamps its id into
 * the whole buffer and checks it before giving it back. */
typedef struct worker {
    flame_pinned_pool *pool;
    int id;
    uint64_t seed;
    int errors;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    for (int i = 0; i < 3000; i++) {
        w->seed = w->seed * 6364136223846793005ull + 1442695040888963407ull;
        size_t bytes = 1 + (w->seed >> 33) % (40 << 10);
        unsigned char *p;
        if (flame_pinned_alloc(w->pool, bytes, (void **)&p, NULL) != FLAME_OK) {
            w->errors++;
            continue;
        }
        memset(p, w->id, bytes);
        for (size_t k = 0; k < bytes; k += 97) w->errors += p[k] != w->id;
        w->errors += flame_pinned_free(w->pool, p) != FLAME_OK;
    }
    return NULL;
}

static void test_concurrent_use(void **state)
{
    (void)state;
    tu_seed();
    flame_pinned_pool *pool = make_pool(0, 1 << 20);
    enum { T = 4 };
    pthread_t t[T];
    worker w[T];
    for (int i = 0; i < T; i++) {
        w[i] = (worker){pool, i + 1, tu_u64(), 0};
        pthread_create(&t[i], NULL, work, &w[i]);
    }
    for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < T; i++) assert_int_equal(w[i].errors, 0);
    flame_pinned_pool_stats s = stats_of(pool);
    assert_int_equal(s.hits + s.misses, T * 3000);
    assert_true(s.hits > s.misses); /* 11 classes cover 1..40 KiB: most allocations reuse */
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.bytes_requested, 0);
    assert_true(s.bytes_reserved <= (1 << 20) + (40 << 10));
    flame_pinned_pool_destroy(pool);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size_classes),
        cmocka_unit_test(test_large_request_footprint),
        cmocka_unit_test(test_reuse_counts_hits_and_misses),
        cmocka_unit_test(test_cache_bound_releases),
        cmocka_unit_test(test_failed_pin_falls_back_to_pageable),
        cmocka_unit_test(test_pins_only_with_a_device),
        cmocka_unit_test(test_bad_frees_and_arguments),
        cmocka_unit_test(test_concurrent_use),
    };
    return cmocka_run_group_tests_name("pinned pool", tests, NULL, NULL);
}
