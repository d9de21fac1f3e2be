/* The pinned host buffer pool: NUMA-local mappings, registered with CUDA when possible, cached
 * per size class. One mutex guards the lists and the counters; mapping and registering (slow:
 * registration touches every page) happen outside it. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/abi.h"
#include "core/device.h"
#include "mem/addr_table.h"
#include "mem/numa.h"
#include "mem/pinned_pool.h"
#include "mem/size_class.h"

typedef struct buf {
    fl_addr_entry e;    /* e.addr: the mapping; filed in `out` while handed out */
    size_t bytes;       /* class bytes mapped */
    size_t requested;
    uint32_t cls;
    bool pinned;
    struct buf *next;   /* free list of its class */
} buf;

struct flame_pinned_pool {
    pthread_mutex_t mu;
    int32_t node;
    bool pinning;
    fl_pin_fn pin;
    fl_unpin_fn unpin;
    size_t page;
    uint64_t max_cached;
    buf *free_list[FL_NUM_CLASSES];
    fl_addr_table out;  /* handed-out buffers by address */
    flame_pinned_pool_stats st; /* counters (struct_size unused) */
    uint64_t bytes_cached;
};

static _Atomic(fl_pin_fn) hook_pin; /* zero-initialised (clang takes no initializer here) */
static _Atomic(fl_unpin_fn) hook_unpin;

void fl_pinned_set_pin_hooks(fl_pin_fn pin, fl_unpin_fn unpin)
{
    atomic_store(&hook_unpin, unpin);
    atomic_store(&hook_pin, pin);
}

static void account(flame_pinned_pool *pool, const buf *b, int sign_reserved, int sign_in_use)
{
    uint64_t n = b->bytes;
    if (sign_reserved) {
        pool->st.bytes_reserved += sign_reserved > 0 ? n : -n;
        uint64_t *kind = b->pinned ? &pool->st.bytes_pinned : &pool->st.bytes_pageable;
        *kind += sign_reserved > 0 ? n : -n;
    }
    if (sign_in_use) {
        pool->st.bytes_in_use += sign_in_use > 0 ? n : -n;
        pool->st.bytes_requested += sign_in_use > 0 ? b->requested : -b->requested;
        pool->bytes_cached += sign_in_use > 0 ? -n : n;
    }
}

static void *mapping(const buf *b) { return (void *)b->e.addr; }

static void release(flame_pinned_pool *pool, buf *b)
{
    if (b->pinned) pool->unpin(mapping(b));
    fl_numa_free(mapping(b), b->bytes);
    free(b);
}

static void release_entry(fl_addr_entry *e, void *pool) { release(pool, (buf *)e); } /* e: buf's first member */

FLAME_API flame_status flame_pinned_pool_create(const flame_pinned_pool_params *params, flame_pinned_pool **out)
{
    fl_clear_error();
    if (!out) return fl_error(FLAME_ERR_INVALID_ARG, "out is NULL");
    *out = NULL;
    flame_pinned_pool_params p = {sizeof p, FLAME_NUMA_NODE_LOCAL, 1, 1ull << 30};
    if (params) {
        flame_status st = fl_struct_in("flame_pinned_pool_params", &p, sizeof p, params);
        if (st) return st;
    }
    flame_status st = fl_numa_check_node(p.numa_node);
    if (st != FLAME_OK) return st;
    if (p.pin != 0 && p.pin != 1) return fl_error(FLAME_ERR_INVALID_ARG, "params->pin is %d, expected 0 or 1", p.pin);

    flame_pinned_pool *pool = calloc(1, sizeof *pool);
    if (!pool || pthread_mutex_init(&pool->mu, NULL) != 0) {
        free(pool);
        return fl_error(FLAME_ERR_NOMEM, "cannot allocate the pinned pool");
    }
    pool->node = p.numa_node;
    pool->max_cached = p.max_cached_bytes;
    pool->page = (size_t)sysconf(_SC_PAGESIZE);
    pool->pin = atomic_load(&hook_pin);
    pool->unpin = atomic_load(&hook_unpin);
    if (p.pin && pool->pin && pool->unpin) {
        pool->pinning = true;
    } else if (p.pin) {
        pool->pin = fl_cuda_host_register;
        pool->unpin = fl_cuda_host_unregister;
        char why[256] = "";
        pool->pinning = fl_cuda_device_count(why, sizeof why) > 0;
        if (!pool->pinning) fl_log(FLAME_LOG_INFO, "pinned pool: pageable memory only (%s)", why);
    }
    pool->st.pinning = pool->pinning;
    if (!fl_addr_table_grow(&pool->out)) {
        flame_pinned_pool_destroy(pool);
        return fl_error(FLAME_ERR_NOMEM, "cannot allocate the pinned pool's table");
    }
    *out = pool;
    return FLAME_OK;
}

FLAME_API void flame_pinned_pool_destroy(flame_pinned_pool *pool)
{
    if (!pool) return;
    if (pool->out.count)
        fl_log(FLAME_LOG_WARN, "pinned pool destroyed with %zu buffers still handed out; they are unmapped",
               pool->out.count);
    fl_addr_table_drain(&pool->out, release_entry, pool);
    for (size_t c = 0; c < FL_NUM_CLASSES; c++) {
        for (buf *b = pool->free_list[c], *next; b; b = next) {
            next = b->next;
            release(pool, b);
        }
    }
    pthread_mutex_destroy(&pool->mu);
    free(pool);
}

/* Files a handed-out buffer under its address (mutex held). */
static void hand_out(flame_pinned_pool *pool, buf *b)
{
    (void)fl_addr_table_add(&pool->out, &b->e); /* has slots since create */
    account(pool, b, 0, +1);
}

FLAME_API flame_status flame_pinned_alloc(flame_pinned_pool *pool, size_t bytes, void **out, int32_t *is_pinned)
{
    fl_clear_error();
    if (!pool || !out) return fl_error(FLAME_ERR_INVALID_ARG, "%s is NULL", pool ? "out" : "pool");
    *out = NULL;
    if (bytes == 0 || bytes > (1ull << 47))
        return fl_error(FLAME_ERR_INVALID_ARG, "bytes %zu is outside 1..2^47", bytes);
    uint64_t pages = (bytes + pool->page - 1) / pool->page;
    uint32_t cls = fl_size_class(pages);

    pthread_mutex_lock(&pool->mu);
    buf *b = pool->free_list[cls];
    if (b) {
        pool->free_list[cls] = b->next;
        b->requested = bytes;
        pool->st.hits++;
        hand_out(pool, b);
        void *p = mapping(b);
        const bool pinned = b->pinned; /* read under the lock: b is the caller's from here */
        pthread_mutex_unlock(&pool->mu);
        *out = p;
        if (is_pinned) *is_pinned = pinned;
        return FLAME_OK;
    }
    pool->st.misses++;
    pthread_mutex_unlock(&pool->mu);

    b = calloc(1, sizeof *b);
    size_t class_bytes = (size_t)(fl_class_pages(cls) * pool->page);
    void *p = b ? fl_numa_alloc(class_bytes, pool->node) : NULL;
    if (!p) {
        free(b);
        return fl_error(FLAME_ERR_NOMEM, "cannot map %zu bytes (size class of %zu) on NUMA node %d", class_bytes,
                        bytes, (int)pool->node);
    }
    *b = (buf){.e.addr = p, .bytes = class_bytes, .requested = bytes, .cls = cls};
    bool failed = false;
    if (pool->pinning) {
        char why[256] = "";
        b->pinned = pool->pin(p, class_bytes, why, sizeof why) == 0;
        failed = !b->pinned;
        if (failed) fl_log(FLAME_LOG_WARN, "pinned pool: %zu bytes stay pageable: %s", class_bytes, why);
    }
    pthread_mutex_lock(&pool->mu);
    pool->st.pin_failures += failed;
    pool->bytes_cached += class_bytes; /* hand_out moves it from cached to in use */
    account(pool, b, +1, 0);
    hand_out(pool, b);
    const bool pinned = b->pinned;
    pthread_mutex_unlock(&pool->mu);
    *out = p;
    if (is_pinned) *is_pinned = pinned;
    return FLAME_OK;
}

FLAME_API flame_status flame_pinned_free(flame_pinned_pool *pool, void *ptr)
{
    fl_clear_error();
    if (!pool) return fl_error(FLAME_ERR_INVALID_ARG, "pool is NULL");
    if (!ptr) return FLAME_OK;
    pthread_mutex_lock(&pool->mu);
    buf *b = (buf *)fl_addr_table_take(&pool->out, ptr); /* e is its first member */
    if (!b) {
        pthread_mutex_unlock(&pool->mu);
        return fl_error(FLAME_ERR_INVALID_ARG, "pointer %p was not handed out by this pool (or is already freed)",
                        ptr);
    }
    account(pool, b, 0, -1);
    bool keep = pool->bytes_cached <= pool->max_cached;
    if (keep) {
        b->next = pool->free_list[b->cls];
        pool->free_list[b->cls] = b;
    } else {
        pool->bytes_cached -= b->bytes;
        account(pool, b, -1, 0);
        pool->st.releases++;
    }
    pthread_mutex_unlock(&pool->mu);
    if (!keep) release(pool, b);
    return FLAME_OK;
}

FLAME_API flame_status flame_pinned_pool_get_stats(flame_pinned_pool *pool, flame_pinned_pool_stats *stats)
{
    fl_clear_error();
    if (!pool || !stats) return fl_error(FLAME_ERR_INVALID_ARG, "%s is NULL", pool ? "stats" : "pool");
    flame_status st = fl_struct_size_check("flame_pinned_pool_stats", stats->struct_size, sizeof *stats);
    if (st) return st;
    pthread_mutex_lock(&pool->mu);
    flame_pinned_pool_stats s = pool->st;
    pthread_mutex_unlock(&pool->mu);
    s.struct_size = sizeof s;
    return fl_struct_out("flame_pinned_pool_stats", stats, &s, sizeof s);
}
