/* First-come-first-served slot pool with direct hand-off (slot_pool.h says why). */
#include "core/slot_pool.h"

#include <stdlib.h>

#include "core/common.h"

struct fl_slot_waiter {
    pthread_cond_t cv; /* its own: a release wakes exactly the caller it serves */
    int slot;          /* -1 until a release hands one over */
    fl_slot_waiter *next;
};

flame_status fl_slot_pool_init(fl_slot_pool *p, int n)
{
    if (!p || n < 1) return fl_error(FLAME_ERR_INVALID_ARG, "slot pool of %d slots (at least 1)", n);
    p->free_slots = malloc((size_t)n * sizeof *p->free_slots);
    if (!p->free_slots) return fl_error(FLAME_ERR_NOMEM, "out of host memory");
    for (int i = 0; i < n; i++) p->free_slots[i] = n - 1 - i; /* slot 0 handed out first */
    p->num_free = p->capacity = n;
    p->head = p->tail = NULL;
    p->num_waiting = 0;
    p->waited = 0;
    pthread_mutex_init(&p->lock, NULL);
    return FLAME_OK;
}

void fl_slot_pool_destroy(fl_slot_pool *p)
{
    if (!p || !p->free_slots) return;
    pthread_mutex_destroy(&p->lock);
    free(p->free_slots);
    p->free_slots = NULL;
}

int fl_slot_acquire(fl_slot_pool *p)
{
    pthread_mutex_lock(&p->lock);
    if (p->num_free > 0 && !p->head) { /* nobody ahead: take one */
        const int slot = p->free_slots[--p->num_free];
        pthread_mutex_unlock(&p->lock);
        return slot;
    }
    fl_slot_waiter w;
    pthread_cond_init(&w.cv, NULL);
    w.slot = -1;
    w.next = NULL;
    if (p->tail)
        p->tail->next = &w;
    else
        p->head = &w;
    p->tail = &w;
    p->num_waiting++;
    p->waited++;
    while (w.slot < 0) pthread_cond_wait(&w.cv, &p->lock);
    pthread_mutex_unlock(&p->lock);
    pthread_cond_destroy(&w.cv); /* the releaser signalled under the lock, so it is done with w */
    return w.slot;
}

void fl_slot_release(fl_slot_pool *p, int slot)
{
    pthread_mutex_lock(&p->lock);
    fl_slot_waiter *w = p->head;
    if (w) { /* straight to the oldest waiter: no later caller can take it first */
        p->head = w->next;
        if (!p->head) p->tail = NULL;
        p->num_waiting--;
        w->slot = slot;
        pthread_cond_signal(&w->cv);
    } else {
        p->free_slots[p->num_free++] = slot;
    }
    pthread_mutex_unlock(&p->lock);
}

int fl_slot_pool_waiting(fl_slot_pool *p)
{
    pthread_mutex_lock(&p->lock);
    const int n = p->num_waiting;
    pthread_mutex_unlock(&p->lock);
    return n;
}
