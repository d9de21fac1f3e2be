/* Epoch-based reclamation for the item cache's lock-free readers (never installed).
 * Readers enter before loading any entry pointer and leave when they no longer hold one; a
 * writer unlinks an entry under its shard lock, then retires it with the global epoch read
 * after the unlink; it is freed once the epoch has moved two steps on, by which time every
 * reader that could have reached it has left. Readers are counted per stripe (a thread keeps
 * its stripe) and per epoch parity, so entering writes only the thread's own cache line; the
 * epoch moves from E to E+1 when no reader of E-1 is left. Readers never wait; writers never
 * wait for readers (an entry just stays retired a little longer). */
#ifndef FLAME_CACHE_EPOCH_H
#define FLAME_CACHE_EPOCH_H

#include <stdatomic.h>
#include <stdint.h>

#define FL_EBR_STRIPES 64

typedef struct fl_ebr_stripe {
    _Alignas(64) _Atomic uint64_t active[2]; /* readers inside, by epoch parity */
} fl_ebr_stripe;

typedef struct fl_ebr {
    _Alignas(64) _Atomic uint64_t epoch;
    fl_ebr_stripe stripe[FL_EBR_STRIPES];
} fl_ebr;

/* Embedded in a retirable object. */
typedef struct fl_ebr_node {
    struct fl_ebr_node *next;
    uint64_t epoch;
} fl_ebr_node;

/* Objects retired by one writer (or under one lock), oldest first. */
typedef struct fl_ebr_list {
    fl_ebr_node *head, *tail;
    uint64_t count;
    uint64_t since; /* retirements since the last fl_ebr_reclaim */
} fl_ebr_list;

void fl_ebr_init(fl_ebr *d);
/* The calling thread's stripe (fixed per thread; threads beyond FL_EBR_STRIPES share). */
unsigned fl_ebr_slot(void);

/* Enters a read-side section; returns the epoch to pass to fl_ebr_leave. Every pointer load
 * that may reach a retired object must be seq_cst (a plain load on x86), as must the stores
 * that unlink: the argument that a reader which could still reach an object entered no
 * later than its retirement runs over the single order of those operations. */
static inline uint64_t fl_ebr_enter(fl_ebr *d, unsigned slot)
{
    for (;;) {
        uint64_t e = atomic_load(&d->epoch);
        atomic_fetch_add(&d->stripe[slot].active[e & 1], 1);
        if (atomic_load(&d->epoch) == e) return e;
        /* the epoch moved before we were counted: we might be counted as a reader of E+2 */
        atomic_fetch_sub_explicit(&d->stripe[slot].active[e & 1], 1, memory_order_release);
    }
}

static inline void fl_ebr_leave(fl_ebr *d, unsigned slot, uint64_t e)
{
    atomic_fetch_sub_explicit(&d->stripe[slot].active[e & 1], 1, memory_order_release);
}

/* Retires n (already unlinked by a seq_cst store) and, every FL_EBR_BATCH retirements,
 * reclaims. The list's owner serialises calls. */
#define FL_EBR_BATCH 32
void fl_ebr_retire(fl_ebr *d, fl_ebr_list *l, fl_ebr_node *n, void (*free_fn)(fl_ebr_node *));
/* Moves the epoch on if it can and frees (free_fn) what no reader can reach any more. */
void fl_ebr_reclaim(fl_ebr *d, fl_ebr_list *l, void (*free_fn)(fl_ebr_node *));
/* Frees everything (no reader may be inside). */
void fl_ebr_drain(fl_ebr_list *l, void (*free_fn)(fl_ebr_node *));

#endif
