/* Allocations by address (addr_table.h). */
#include "mem/addr_table.h"

#include <stdint.h>
#include <stdlib.h>

/* Fibonacci hashing of the page number: allocations are page-aligned, so the low 12 bits
 * carry nothing. */
static size_t slot_of(const void *addr, size_t size)
{
    return (size_t)(((uint64_t)(uintptr_t)addr >> 12) * 0x9e3779b97f4a7c15ull >> 32) & (size - 1);
}

bool fl_addr_table_grow(fl_addr_table *t)
{
    const size_t size = t->size ? t->size * 2 : 64;
    fl_addr_entry **slots = calloc(size, sizeof *slots);
    if (!slots) return false;
    for (size_t i = 0; i < t->size; i++) {
        for (fl_addr_entry *e = t->slots[i], *next; e; e = next) {
            next = e->next;
            const size_t s = slot_of(e->addr, size);
            e->next = slots[s];
            slots[s] = e;
        }
    }
    free(t->slots);
    t->slots = slots;
    t->size = size;
    return true;
}

bool fl_addr_table_add(fl_addr_table *t, fl_addr_entry *e)
{
    if (t->count >= t->size && !fl_addr_table_grow(t) && !t->size) return false;
    const size_t s = slot_of(e->addr, t->size);
    e->next = t->slots[s];
    t->slots[s] = e;
    t->count++;
    return true;
}

fl_addr_entry *fl_addr_table_take(fl_addr_table *t, const void *addr)
{
    if (!t->size) return NULL;
    fl_addr_entry **link = &t->slots[slot_of(addr, t->size)];
    while (*link && (*link)->addr != addr) link = &(*link)->next;
    fl_addr_entry *e = *link;
    if (e) {
        *link = e->next;
        t->count--;
    }
    return e;
}

void fl_addr_table_drain(fl_addr_table *t, void (*each)(fl_addr_entry *e, void *ctx), void *ctx)
{
    for (size_t i = 0; i < t->size; i++) {
        for (fl_addr_entry *e = t->slots[i], *next; e; e = next) {
            next = e->next;
            each(e, ctx);
        }
    }
    free(t->slots);
    *t = (fl_addr_table){0};
}
