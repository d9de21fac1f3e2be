/* Epoch-based reclamation: stripes, retirement and reclamation (epoch.h says why it is safe). */
#include <string.h>

#include "icache/epoch.h"

/* stripe + 1 of this thread, 0 before its first use; threads take stripes in turn */
static _Thread_local unsigned tls_slot;
static atomic_uint next_slot;

unsigned fl_ebr_slot(void)
{
    unsigned s = tls_slot;
    if (!s) s = tls_slot = atomic_fetch_add_explicit(&next_slot, 1, memory_order_relaxed) % FL_EBR_STRIPES + 1;
    return s - 1;
}

void fl_ebr_init(fl_ebr *d)
{
    memset(d, 0, sizeof *d);
    atomic_init(&d->epoch, 2); /* E - 1 never wraps */
}

/* E -> E + 1 once no reader of E - 1 is left (readers are of E or E - 1). */
static uint64_t try_advance(fl_ebr *d)
{
    uint64_t e = atomic_load(&d->epoch);
    for (unsigned i = 0; i < FL_EBR_STRIPES; i++)
        if (atomic_load(&d->stripe[i].active[(e - 1) & 1])) return e;
    if (atomic_compare_exchange_strong(&d->epoch, &e, e + 1)) return e + 1;
    return e; /* another writer moved it */
}

void fl_ebr_retire(fl_ebr *d, fl_ebr_list *l, fl_ebr_node *n, void (*free_fn)(fl_ebr_node *))
{
    n->epoch = atomic_load(&d->epoch); /* seq_cst, after the unlink */
    n->next = NULL;
    if (l->tail)
        l->tail->next = n;
    else
        l->head = n;
    l->tail = n;
    l->count++;
    if (++l->since >= FL_EBR_BATCH) fl_ebr_reclaim(d, l, free_fn);
}

void fl_ebr_reclaim(fl_ebr *d, fl_ebr_list *l, void (*free_fn)(fl_ebr_node *))
{
    l->since = 0;
    if (!l->head) return;
    /* retired at E: readers that could reach it are of E or older, all gone at E + 2; move on
     * (at most twice) until the newest is free, or a reader is in the way */
    uint64_t e = atomic_load(&d->epoch);
    for (int step = 0; step < 2 && l->tail->epoch + 2 > e; step++) {
        uint64_t moved = try_advance(d);
        if (moved == e) break;
        e = moved;
    }
    while (l->head && l->head->epoch + 2 <= e) {
        fl_ebr_node *n = l->head;
        l->head = n->next;
        l->count--;
        free_fn(n);
    }
    if (!l->head) l->tail = NULL;
}

void fl_ebr_drain(fl_ebr_list *l, void (*free_fn)(fl_ebr_node *))
{
    while (l->head) {
        fl_ebr_node *n = l->head;
        l->head = n->next;
        free_fn(n);
    }
    l->tail = NULL;
    l->count = l->since = 0;
}
