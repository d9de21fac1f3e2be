/* flame_numa_*: the mode this machine gets, allocation and binding, and the fallbacks forced
 * through the test hook (this machine has one node, so the libnuma path runs on node 0). */
#define _GNU_SOURCE
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <sys/mman.h>

#include "testutil.h"
#include "mem/numa.h"

static int reset_mode(void **state)
{
    (void)state;
    fl_numa_force_mode(-1);
    return 0;
}

static flame_numa_info info_now(void)
{
    flame_numa_info info = {.struct_size = sizeof info};
    assert_int_equal(flame_numa_get_info(&info), FLAME_OK);
    return info;
}

static void test_mode_matches_the_machine(void **state)
{
    (void)state;
    flame_numa_info info = info_now();
    flame_numa_mode want = numa_available() < 0              ? FLAME_NUMA_FALLBACK_NO_NUMA
                           : numa_num_configured_nodes() < 2 ? FLAME_NUMA_FALLBACK_ONE_NODE
                                                             : FLAME_NUMA_LIBNUMA;
    fprintf(stderr, "# NUMA mode %d, %d node(s), current node %d\n", info.mode, info.num_nodes, info.current_node);
    assert_int_equal(info.mode, want);
    assert_int_equal(info.num_nodes, want == FLAME_NUMA_LIBNUMA ? numa_max_node() + 1 : 1);
    assert_true(info.current_node >= 0 && info.current_node < info.num_nodes);
}

/* Memory from every mode is page-aligned, zero-filled and fully writable. */
static void check_alloc(int32_t node, size_t bytes)
{
    unsigned char *p = NULL;
    assert_int_equal(flame_numa_alloc(bytes, node, (void **)&p), FLAME_OK);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % (uintptr_t)sysconf(_SC_PAGESIZE), 0);
    for (size_t i = 0; i < bytes; i++) assert_int_equal(p[i], 0);
    for (size_t i = 0; i < bytes; i++) p[i] = (unsigned char)(i * 7);
    for (size_t i = 0; i < bytes; i += 4093) assert_int_equal(p[i], (unsigned char)(i * 7));
    flame_numa_free(p, bytes);
}

static void test_alloc_local_and_node0(void **state)
{
    (void)state;
    check_alloc(FLAME_NUMA_NODE_LOCAL, 1 << 20);
    check_alloc(0, 12345);
    flame_numa_free(NULL, 10); /* no-op */
}

/* Both fallbacks: same API, plain memory, node 0 only, binding a no-op, the mode says so. */
static void check_fallback(flame_numa_mode mode)
{
    fl_numa_force_mode(mode);
    flame_numa_info info = info_now();
    assert_int_equal(info.mode, mode);
    assert_int_equal(info.num_nodes, 1);
    assert_int_equal(info.current_node, 0);
    check_alloc(FLAME_NUMA_NODE_LOCAL, 3 * 4096 + 1);
    check_alloc(0, 4096);
    void *p = (void *)1;
    assert_status_msg(flame_numa_alloc(4096, 1, &p), FLAME_ERR_INVALID_ARG, "NUMA node 1 does not exist");
    assert_null(p);
    assert_int_equal(flame_numa_bind_thread(0), FLAME_OK);
    assert_status_msg(flame_numa_bind_thread(3), FLAME_ERR_INVALID_ARG, "node 3");
    assert_status_msg(flame_numa_bind_thread(FLAME_NUMA_NODE_LOCAL), FLAME_ERR_INVALID_ARG, "names no node");
}

static void test_fallback_no_numa(void **state)
{
    (void)state;
    check_fallback(FLAME_NUMA_FALLBACK_NO_NUMA);
    assert_status_msg(flame_numa_alloc(4096, 2, &(void *){0}), FLAME_ERR_INVALID_ARG, "numa_available() < 0");
}

static void test_fallback_one_node(void **state)
{
    (void)state;
    check_fallback(FLAME_NUMA_FALLBACK_ONE_NODE);
    assert_status_msg(flame_numa_alloc(4096, 2, &(void *){0}), FLAME_ERR_INVALID_ARG, "one NUMA node");
}

/* The libnuma path itself, on node 0 (the only one here): pages land on the node asked for. */
static void *bind_and_check(void *arg)
{
    int *ok = arg;
    *ok = flame_numa_bind_thread(0) == FLAME_OK && numa_preferred() == 0;
    return NULL;
}

static void test_libnuma_path_on_node0(void **state)
{
    (void)state;
    if (numa_available() < 0) skip(); /* kernel without NUMA: only the fallbacks can run */
    fl_numa_force_mode(FLAME_NUMA_LIBNUMA);
    size_t bytes = 8 * 4096;
    char *p = NULL;
    assert_int_equal(flame_numa_alloc(bytes, 0, (void **)&p), FLAME_OK);
    memset(p, 1, bytes);
    void *pages[1] = {p + 4096};
    int where[1] = {-7};
    assert_int_equal(numa_move_pages(0, 1, pages, NULL, where, 0), 0);
    assert_int_equal(where[0], 0);
    flame_numa_free(p, bytes);
    assert_status_msg(flame_numa_alloc(4096, numa_max_node() + 1, &(void *){0}), FLAME_ERR_INVALID_ARG,
                      "does not exist");
    pthread_t t;
    int ok = 0;
    pthread_create(&t, NULL, bind_and_check, &ok); /* a thread of its own: binding is per thread */
    pthread_join(t, NULL);
    assert_int_equal(ok, 1);
}

static char warned[512];
static void capture(flame_log_level level, const char *message, void *user)
{
    if (level == FLAME_LOG_WARN) snprintf(warned, sizeof warned, "%s", message);
}

/* 1 if [p, p + bytes) is mapped (mincore fails with ENOMEM on a hole). */
static int mapped(void *p, size_t bytes)
{
    unsigned char v[16];
    return mincore(p, bytes, v) == 0;
}

/* A second free, a foreign pointer or a wrong size never unmaps memory that is not the
 * allocation's: munmap took any address, so a second free unmapped whatever was mapped there
 * since (here a mapping of the caller's own: a crash on its next write). */
static void test_bad_frees(void **state)
{
    (void)state;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    assert_int_equal(flame_set_log_callback(capture, NULL, FLAME_LOG_WARN), FLAME_OK);
    void *p = NULL;
    assert_int_equal(flame_numa_alloc(4 * page, FLAME_NUMA_NODE_LOCAL, &p), FLAME_OK);
    flame_numa_free(p, 4 * page);
    assert_false(mapped(p, page));
    /* the caller maps something at the same address (MAP_FIXED_NOREPLACE: it is free) */
    unsigned char *mine = mmap(p, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                               -1, 0);
    assert_ptr_equal(mine, p);
    warned[0] = '\0';
    flame_numa_free(p, 4 * page);
    assert_true(mapped(mine, 4 * page));
    memset(mine, 7, 4 * page);
    char want[96];
    snprintf(want, sizeof want, "flame_numa_free(%p, %zu): not an allocation of flame_numa_alloc", p, 4 * page);
    assert_non_null(strstr(warned, want));
    /* inside an allocation, or an address never handed out */
    unsigned char *q = NULL;
    assert_int_equal(flame_numa_alloc(3 * page, 0, (void **)&q), FLAME_OK);
    flame_numa_free(q + page, page);
    assert_true(mapped(q, 3 * page));
    flame_numa_free(mine + page, page);
    assert_true(mapped(mine, 4 * page));
    munmap(mine, 4 * page);
    /* the wrong size unmaps the allocation, all of it and nothing else */
    warned[0] = '\0';
    flame_numa_free(q, page);
    assert_false(mapped(q, page));
    assert_false(mapped(q + 2 * page, page));
    snprintf(want, sizeof want, "flame_numa_free(%p, %zu): allocated with %zu bytes", (void *)q, page, 3 * page);
    assert_non_null(strstr(warned, want));
    assert_int_equal(flame_set_log_callback(NULL, NULL, FLAME_LOG_ERROR), FLAME_OK);
}

/* Threads allocating and freeing at once: every allocation is freed, whole, once. */
static void *alloc_free_loop(void *arg)
{
    long *bad = arg;
    for (int i = 0; i < 2000; i++) {
        size_t bytes = 4096 * (size_t)(1 + i % 5);
        unsigned char *p = NULL;
        if (flame_numa_alloc(bytes, FLAME_NUMA_NODE_LOCAL, (void **)&p) != FLAME_OK) {
            ++*bad;
            continue;
        }
        p[0] = 1, p[bytes - 1] = 2;
        flame_numa_free(p, bytes);
    }
    return NULL;
}

static void test_concurrent_alloc_free(void **state)
{
    (void)state;
    pthread_t t[4];
    long bad[4] = {0};
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, alloc_free_loop, &bad[i]);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 4; i++) assert_int_equal(bad[i], 0);
}

static void test_argument_errors(void **state)
{
    (void)state;
    void *p = (void *)1;
    assert_status_msg(flame_numa_alloc(0, 0, &p), FLAME_ERR_INVALID_ARG, "bytes is 0");
    assert_null(p);
    assert_status_msg(flame_numa_alloc(10, 0, NULL), FLAME_ERR_INVALID_ARG, "out is NULL");
    assert_status_msg(flame_numa_get_info(NULL), FLAME_ERR_INVALID_ARG, "info is NULL");
    flame_numa_info small = {.struct_size = 4};
    assert_status_msg(flame_numa_get_info(&small), FLAME_ERR_INVALID_ARG, "flame_numa_info.struct_size = 4");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_mode_matches_the_machine, reset_mode),
        cmocka_unit_test_teardown(test_alloc_local_and_node0, reset_mode),
        cmocka_unit_test_teardown(test_fallback_no_numa, reset_mode),
        cmocka_unit_test_teardown(test_fallback_one_node, reset_mode),
        cmocka_unit_test_teardown(test_libnuma_path_on_node0, reset_mode),
        cmocka_unit_test_teardown(test_bad_frees, reset_mode),
        cmocka_unit_test_teardown(test_concurrent_alloc_free, reset_mode),
        cmocka_unit_test_teardown(test_argument_errors, reset_mode),
    };
    return cmocka_run_group_tests_name("numa", tests, NULL, NULL);
}
