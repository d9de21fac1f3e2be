/* NUMA-local memory and thread binding over libnuma, with an honest plain-memory fallback. */
#ifndef FLAME_MEM_NUMA_H
#define FLAME_MEM_NUMA_H

#include "core/common.h"

/* What this process uses (decided once, on first use). */
flame_numa_mode fl_numa_mode(void);
/* Nodes allocations may name: 0..fl_numa_num_nodes()-1 (1 in the fallbacks). */
int fl_numa_num_nodes(void);
/* FLAME_OK, or FLAME_ERR_INVALID_ARG naming the node when it is neither
 * FLAME_NUMA_NODE_LOCAL nor a node of this machine. */
flame_status fl_numa_check_node(int32_t node);
/* Page-aligned, zero-filled, lazily backed memory on `node` (already checked); NULL when the
 * kernel refuses the mapping. Free with fl_numa_free and the same size. */
void *fl_numa_alloc(size_t bytes, int32_t node);
void fl_numa_free(void *p, size_t bytes);

/* Tests only: pretend detection gave `mode` (-1 goes back to what the machine says). */
void fl_numa_force_mode(int mode);

#endif
