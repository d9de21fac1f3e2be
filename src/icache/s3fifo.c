/* S3-FIFO eviction (Yang et al., SOSP 2023) per shard: new keys enter a small FIFO (10% of
 * the entries); at its head an entry hit more than once since insertion moves to the main
 * FIFO, others leave and their key goes to the ghost FIFO. A key found in the ghost enters
 * main directly. At main's head an entry hit since its last pass is reinserted with its count
 * decremented, else evicted. A hit only bumps a 2-bit counter (no list moves, no lock, unlike
 * LRU; a bump racing with a decrement here may be lost, which costs at most one extra pass).
 * Expired entries count as not hit. */
#include <stdlib.h>

#include "icache/icache.h"

static void q_push(fl_queue *q, fl_entry *e)
{
    e->qnext = NULL;
    e->qprev = q->tail;
    if (q->tail)
        q->tail->qnext = e;
    else
        q->head = e;
    q->tail = e;
    q->count++;
}

static void q_unlink(fl_queue *q, fl_entry *e)
{
    if (e->qprev)
        e->qprev->qnext = e->qnext;
    else
        q->head = e->qnext;
    if (e->qnext)
        e->qnext->qprev = e->qprev;
    else
        q->tail = e->qprev;
    q->count--;
}

static fl_queue *queue_of(fl_shard *sh, const fl_entry *e)
{
    return e->queue == FL_Q_MAIN ? &sh->main : &sh->small;
}

/* ---- ghost */

flame_status fl_ghost_init(fl_ghost *g, uint64_t cap)
{
    uint64_t size = 4;
    while (size < 2 * cap) size *= 2;
    g->cap = cap;
    g->pushes = 0;
    g->mask = size - 1;
    g->ring = malloc(cap * sizeof *g->ring);
    g->keys = malloc(size * sizeof *g->keys);
    g->pos = calloc(size, sizeof *g->pos);
    if (!g->ring || !g->keys || !g->pos) return FLAME_ERR_NOMEM;
    return FLAME_OK;
}

void fl_ghost_free(fl_ghost *g)
{
    free(g->ring), free(g->keys), free(g->pos);
}

static uint64_t ghost_slot(const fl_ghost *g, int64_t key)
{
    uint64_t j = fl_hash64(key) & g->mask;
    while (g->pos[j] && g->keys[j] != key) j = (j + 1) & g->mask;
    return j;
}

/* Backward-shift deletion keeps linear probing free of tombstones. */
static void ghost_delete_slot(fl_ghost *g, uint64_t j)
{
    g->pos[j] = 0;
    for (uint64_t k = (j + 1) & g->mask; g->pos[k]; k = (k + 1) & g->mask) {
        uint64_t home = fl_hash64(g->keys[k]) & g->mask;
        /* move k into the hole j if its home is not in (j, k] cyclically */
        if (((k - home) & g->mask) >= ((k - j) & g->mask)) {
            g->keys[j] = g->keys[k];
            g->pos[j] = g->pos[k];
            g->pos[k] = 0;
            j = k;
        }
    }
}

/* True (and forgets the key) if key was evicted recently. */
static bool ghost_take(fl_ghost *g, int64_t key)
{
    uint64_t j = ghost_slot(g, key);
    if (!g->pos[j]) return false;
    ghost_delete_slot(g, j);
    return true;
}

static void ghost_push(fl_ghost *g, int64_t key)
{
    uint64_t r = g->pushes % g->cap;
    if (g->pushes >= g->cap) { /* overwrite the oldest key, forgetting it if still indexed there */
        uint64_t j = ghost_slot(g, g->ring[r]);
        if (g->pos[j] == r + 1) ghost_delete_slot(g, j);
    }
    g->ring[r] = key;
    uint64_t j = ghost_slot(g, key);
    g->keys[j] = key;
    g->pos[j] = r + 1;
    g->pushes++;
}

/* ---- placement */

void fl_s3_insert(fl_shard *sh, fl_entry *e)
{
    atomic_store_explicit(&e->freq, 0, memory_order_relaxed);
    e->queue = ghost_take(&sh->ghost, e->key) ? FL_Q_MAIN : FL_Q_SMALL;
    q_push(queue_of(sh, e), e);
}

void fl_s3_replace(fl_shard *sh, fl_entry *old, fl_entry *e)
{
    fl_queue *q = queue_of(sh, old);
    e->queue = old->queue;
    atomic_store_explicit(&e->freq, atomic_load_explicit(&old->freq, memory_order_relaxed), memory_order_relaxed);
    e->qprev = old->qprev;
    e->qnext = old->qnext;
    if (e->qprev)
        e->qprev->qnext = e;
    else
        q->head = e;
    if (e->qnext)
        e->qnext->qprev = e;
    else
        q->tail = e;
}

void fl_s3_unlink(fl_shard *sh, fl_entry *e)
{
    q_unlink(queue_of(sh, e), e);
}

static bool evict_small(fl_shard *sh, const fl_entry *keep, uint64_t now)
{
    for (fl_entry *t; (t = sh->small.head) && t != keep;) {
        if (atomic_load_explicit(&t->freq, memory_order_relaxed) > 1 && now < t->expires) {
            q_unlink(&sh->small, t);
            atomic_store_explicit(&t->freq, 0, memory_order_relaxed);
            t->queue = FL_Q_MAIN;
            q_push(&sh->main, t);
            continue;
        }
        ghost_push(&sh->ghost, t->key);
        fl_entry_remove(sh, t, fl_hash64(t->key));
        sh->evictions++;
        return true;
    }
    return false;
}

static bool evict_main(fl_shard *sh, const fl_entry *keep, uint64_t now)
{
    for (fl_entry *t; (t = sh->main.head);) {
        uint8_t f = atomic_load_explicit(&t->freq, memory_order_relaxed);
        if (t == keep || (f > 0 && now < t->expires)) {
            if (t == keep && sh->main.count == 1) return false;
            if (t != keep) atomic_store_explicit(&t->freq, (uint8_t)(f - 1), memory_order_relaxed);
            q_unlink(&sh->main, t);
            q_push(&sh->main, t);
            continue;
        }
        fl_entry_remove(sh, t, fl_hash64(t->key));
        sh->evictions++;
        return true;
    }
    return false;
}

void fl_s3_make_room(fl_shard *sh, const fl_entry *keep, uint64_t now)
{
    while (sh->entries > sh->max_entries || sh->bytes > sh->max_bytes) {
        bool from_small = sh->small.count > sh->small_max || sh->main.count == 0;
        if (from_small ? evict_small(sh, keep, now) : evict_main(sh, keep, now)) continue;
        const uint64_t small_before = sh->small.count;
        if (from_small ? evict_main(sh, keep, now) : evict_small(sh, keep, now)) continue;
        /* evict_small may have promoted hot entries to main and evicted nothing: main has
         * something other than `keep` to evict now (small only shrinks, so this ends) */
        if (sh->small.count < small_before) continue;
        break;
    }
}
