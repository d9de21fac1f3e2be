/* The executor slot pool: slots are handed out first come, first served with direct hand-off
 * (src/core/slot_pool.h). Waiters are made to queue in a known order (each thread starts only
 * once the previous one is seen waiting), so every order asserted here is deterministic. */
#include <pthread.h>

#include "testutil.h"
#include "core/slot_pool.h"

typedef struct {
    fl_slot_pool *pool;
    int id;
    int *order, *n_order;
    pthread_mutex_t *order_lock;
} taker;

static void record(taker *t)
{
    pthread_mutex_lock(t->order_lock);
    t->order[(*t->n_order)++] = t->id;
    pthread_mutex_unlock(t->order_lock);
}

static void *take_once(void *arg)
{
    taker *t = arg;
    const int slot = fl_slot_acquire(t->pool);
    record(t);
    fl_slot_release(t->pool, slot);
    return NULL;
}

static void wait_for_waiters(fl_slot_pool *p, int n)
{
    while (fl_slot_pool_waiting(p) < n) usleep(100);
}

/* Waiters are served in the order they started waiting. */
static void test_fifo_order(void **state)
{
    (void)state;
    enum { N = 6 };
    fl_slot_pool p;
    assert_int_equal(fl_slot_pool_init(&p, 1), FLAME_OK);
    const int held = fl_slot_acquire(&p);
    assert_int_equal(held, 0);
    int order[N + 1], n_order = 0;
    pthread_mutex_t ol = PTHREAD_MUTEX_INITIALIZER;
    taker t[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        t[i] = (taker){&p, i, order, &n_order, &ol};
        assert_int_equal(pthread_create(&th[i], NULL, take_once, &t[i]), 0);
        wait_for_waiters(&p, i + 1);
    }
    fl_slot_release(&p, held);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    assert_int_equal(n_order, N);
    for (int i = 0; i < N; i++) assert_int_equal(order[i], i);
    assert_int_equal(p.waited, N);
    assert_int_equal(fl_slot_pool_waiting(&p), 0);
    fl_slot_pool_destroy(&p);
}

/* A caller that releases and calls again at once queues behind the waiter it released to:
 * with a mutex and one condition variable it would usually take the slot straight back. */
static void test_release_then_acquire_does_not_barge(void **state)
{
    (void)state;
    fl_slot_pool p;
    assert_int_equal(fl_slot_pool_init(&p, 1), FLAME_OK);
    int order[4], n_order = 0;
    pthread_mutex_t ol = PTHREAD_MUTEX_INITIALIZER;
    taker waiter = {&p, 1, order, &n_order, &ol}, self = {&p, 0, order, &n_order, &ol};
    for (int round = 0; round < 20; round++) {
        n_order = 0;
        int slot = fl_slot_acquire(&p);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, take_once, &waiter), 0);
        wait_for_waiters(&p, 1);
        fl_slot_release(&p, slot);
        slot = fl_slot_acquire(&p); /* must come after the waiter's turn */
        record(&self);
        fl_slot_release(&p, slot);
        pthread_join(th, NULL);
        assert_int_equal(n_order, 2);
        assert_int_equal(order[0], 1);
        assert_int_equal(order[1], 0);
    }
    fl_slot_pool_destroy(&p);
}

typedef struct {
    fl_slot_pool *pool;
    int n;
    int *in_use; /* [n] times each slot is held right now */
    pthread_mutex_t *lock;
    int bad;
} hammer;

static void *hammer_run(void *arg)
{
    hammer *h = arg;
    for (int i = 0; i < 2000; i++) {
        const int s = fl_slot_acquire(h->pool);
        pthread_mutex_lock(h->lock);
        if (s < 0 || s >= h->n || h->in_use[s]++ != 0) h->bad = 1;
        pthread_mutex_unlock(h->lock);
        pthread_mutex_lock(h->lock);
        h->in_use[s]--;
        pthread_mutex_unlock(h->lock);
        fl_slot_release(h->pool, s);
    }
    return NULL;
}

/* Under contention a slot is never held twice and every slot comes back. */
static void test_slots_are_exclusive(void **state)
{
    (void)state;
    enum { SLOTS = 3, THREADS = 8 };
    fl_slot_pool p;
    assert_int_equal(fl_slot_pool_init(&p, SLOTS), FLAME_OK);
    int in_use[SLOTS] = {0};
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    hammer h = {&p, SLOTS, in_use, &lock, 0};
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&th[i], NULL, hammer_run, &h), 0);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    assert_int_equal(h.bad, 0);
    assert_int_equal(p.num_free, SLOTS);
    int seen[SLOTS] = {0};
    for (int i = 0; i < SLOTS; i++) seen[p.free_slots[i]]++;
    for (int i = 0; i < SLOTS; i++) assert_int_equal(seen[i], 1);
    fl_slot_pool_destroy(&p);
}

static void test_refuses_empty_pool(void **state)
{
    (void)state;
    fl_slot_pool p;
    assert_int_equal(fl_slot_pool_init(&p, 0), FLAME_ERR_INVALID_ARG);
    assert_non_null(strstr(flame_last_error(), "0 slots"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fifo_order),
        cmocka_unit_test(test_release_then_acquire_does_not_barge),
        cmocka_unit_test(test_slots_are_exclusive),
        cmocka_unit_test(test_refuses_empty_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
