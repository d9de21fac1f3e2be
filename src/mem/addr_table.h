/* Memory handed out, found again by its address: a chained hash table of entries the caller
 * owns (each embeds its key and its chain link), doubled as it fills. The NUMA allocator
 * and the pinned pool keep their allocations here, so that a free of a pointer they never
 * handed out, or handed out and took back already, is recognised instead of unmapping
 * whatever lives there. Not thread-safe: the owner locks around every call. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

typedef struct fl_addr_entry {
    const void *addr;
    struct fl_addr_entry *next;
} fl_addr_entry;

typedef struct fl_addr_table {
    fl_addr_entry **slots;
    size_t size;  /* 0 or a power of two */
    size_t count; /* entries filed */
} fl_addr_table;

/* Doubles the slots (64 the first time); false when out of memory (the table is kept). */
bool fl_addr_table_grow(fl_addr_table *t);

/* Files e under e->addr, growing the table first when it holds as many entries as slots (if
 * that fails the chains grow longer). False only when the table has no slots and none can be
 * allocated. */
bool fl_addr_table_add(fl_addr_table *t, fl_addr_entry *e);

/* Unfiles and returns the entry filed under addr, or NULL. */
fl_addr_entry *fl_addr_table_take(fl_addr_table *t, const void *addr);

/* Calls each(entry, ctx) for every filed entry (it may free the entry), then frees the slots;
 * the table is empty after. */
void fl_addr_table_drain(fl_addr_table *t, void (*each)(fl_addr_entry *e, void *ctx), void *ctx);
