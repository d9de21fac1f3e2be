/* The CPU thread pool (src/core/pool.c): every task runs exactly once, with a worker index
 * below the thread count, whether one caller or several use the pool at once, and in a
 * forked child (which has none of the parent's pool threads). */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>

#include "testutil.h"
#include "core/pool.h"

typedef struct marks {
    atomic_int *hits;
    int threads;
    atomic_int bad_worker;
} marks;

static void mark(void *ctx, int64_t t, int worker)
{
    marks *m = ctx;
    atomic_fetch_add(&m->hits[t], 1);
    if (worker < 0 || worker >= (m->threads > 1 ? m->threads : 1)) atomic_store(&m->bad_worker, 1);
}

static void run_and_check(int threads, int64_t n)
{
    marks m = {.hits = calloc((size_t)(n > 0 ? n : 1), sizeof(atomic_int)), .threads = threads};
    fl_parallel(threads, n, mark, &m);
    for (int64_t t = 0; t < n; t++)
        if (atomic_load(&m.hits[t]) != 1) fail_msg("threads %d, n %lld: task %lld ran %d times", threads, (long long)n,
                                                   (long long)t, atomic_load(&m.hits[t]));
    assert_int_equal(atomic_load(&m.bad_worker), 0);
    free(m.hits);
}

static void test_every_task_once(void **state)
{
    (void)state;
    for (int rep = 0; rep < 300; rep++) run_and_check(1 + rep % 5, rep % 7 == 0 ? 0 : 1 + (int64_t)(rep * 37 % 500));
}

static void *caller(void *arg)
{
    (void)arg;
    for (int rep = 0; rep < 200; rep++) run_and_check(2 + rep % 3, 1 + rep % 97);
    return NULL;
}

static void test_concurrent_callers(void **state)
{
    (void)state;
    pthread_t t[4];
    for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&t[i], NULL, caller, NULL), 0);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
}

static void test_forked_child(void **state)
{
    (void)state;
#ifdef __SANITIZE_THREAD__
    print_message("# ThreadSanitizer cannot start threads in a child forked from a threaded parent: skipped\n");
    skip();
#endif
    run_and_check(3, 100); /* the parent's pool threads exist now */
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        marks m = {.hits = calloc(1000, sizeof(atomic_int)), .threads = 3};
        fl_parallel(3, 1000, mark, &m);
        int ok = atomic_load(&m.bad_worker) == 0;
        for (int t = 0; t < 1000; t++) ok &= atomic_load(&m.hits[t]) == 1;
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_task_once),
        cmocka_unit_test(test_concurrent_callers),
        cmocka_unit_test(test_forked_child),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
