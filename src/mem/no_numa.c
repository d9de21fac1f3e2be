/* Stand-in for libnuma when the library is built without it (make WITH_NUMA=0). The public
 * flame_numa_* calls refuse with FLAME_ERR_UNSUPPORTED, as the CUDA stand-in does for GPU
 * engines; inside the library (the pinned pool) memory is a plain anonymous mapping, as in the
 * no-NUMA fallback of src/mem/numa.c, so node FLAME_NUMA_NODE_LOCAL and node 0 work. */
#include <sys/mman.h>

#include "mem/numa.h"

#define WHY "this libflame was built without libnuma (make WITH_NUMA=0)"

flame_numa_mode fl_numa_mode(void)
{
    return FLAME_NUMA_FALLBACK_NO_NUMA;
}

int fl_numa_num_nodes(void)
{
    return 1;
}

void fl_numa_force_mode(int mode)
{
    (void)mode; /* nothing to force: there is one mode */
}

flame_status fl_numa_check_node(int32_t node)
{
    if (node == FLAME_NUMA_NODE_LOCAL || node == 0) return FLAME_OK;
    return fl_error(FLAME_ERR_INVALID_ARG, "NUMA node %d does not exist: %s, so there is only node 0", (int)node, WHY);
}

void *fl_numa_alloc(size_t bytes, int32_t node)
{
    (void)node;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void fl_numa_free(void *p, size_t bytes)
{
    if (p) munmap(p, bytes);
}

FLAME_API flame_status flame_numa_get_info(flame_numa_info *info)
{
    fl_clear_error();
    return fl_error(FLAME_ERR_UNSUPPORTED, "flame_numa_get_info: %s", WHY);
}

FLAME_API flame_status flame_numa_alloc(size_t bytes, int32_t node, void **out)
{
    fl_clear_error();
    if (out) *out = NULL;
    return fl_error(FLAME_ERR_UNSUPPORTED, "flame_numa_alloc: %s", WHY);
}

FLAME_API void flame_numa_free(void *ptr, size_t bytes)
{
    (void)ptr, (void)bytes; /* flame_numa_alloc never handed anything out */
}

FLAME_API flame_status flame_numa_bind_thread(int32_t node)
{
    fl_clear_error();
    return fl_error(FLAME_ERR_UNSUPPORTED, "flame_numa_bind_thread: %s", WHY);
}
