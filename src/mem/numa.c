/* flame_numa_*: libnuma when it can help (>= 2 nodes), plain mmap'ed memory otherwise. */
#define _GNU_SOURCE /* sched_getcpu */
#include <numa.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "core/abi.h"
#include "mem/addr_table.h"
#include "mem/numa.h"

static pthread_once_t detect_once = PTHREAD_ONCE_INIT;
static flame_numa_mode detected;
static atomic_int forced = -1; /* test override of `detected` */

static void detect(void)
{
    if (numa_available() < 0) {
        detected = FLAME_NUMA_FALLBACK_NO_NUMA;
    } else if (numa_num_configured_nodes() < 2) {
        detected = FLAME_NUMA_FALLBACK_ONE_NODE;
    } else {
        detected = FLAME_NUMA_LIBNUMA;
    }
}

flame_numa_mode fl_numa_mode(void)
{
    int f = atomic_load(&forced);
    if (f >= 0) return (flame_numa_mode)f;
    pthread_once(&detect_once, detect);
    return detected;
}

int fl_numa_num_nodes(void)
{
    /* node numbers may be sparse: fl_numa_check_node checks membership too */
    return fl_numa_mode() == FLAME_NUMA_LIBNUMA ? numa_max_node() + 1 : 1;
}

void fl_numa_force_mode(int mode)
{
    atomic_store(&forced, mode);
}

static const char *mode_reason(flame_numa_mode m)
{
    return m == FLAME_NUMA_FALLBACK_NO_NUMA ? "numa_available() < 0, plain memory"
                                            : "one NUMA node, plain memory";
}

flame_status fl_numa_check_node(int32_t node)
{
    if (node == FLAME_NUMA_NODE_LOCAL) return FLAME_OK;
    flame_numa_mode m = fl_numa_mode();
    if (m != FLAME_NUMA_LIBNUMA) {
        if (node == 0) return FLAME_OK;
        return fl_error(FLAME_ERR_INVALID_ARG, "NUMA node %d does not exist: this machine has 1 node (%s)", (int)node,
                        mode_reason(m));
    }
    if (node < 0 || node >= fl_numa_num_nodes() || !numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)node))
        return fl_error(FLAME_ERR_INVALID_ARG, "NUMA node %d does not exist (nodes 0..%d, possibly sparse)", (int)node,
                        fl_numa_num_nodes() - 1);
    return FLAME_OK;
}

void *fl_numa_alloc(size_t bytes, int32_t node)
{
    if (fl_numa_mode() == FLAME_NUMA_LIBNUMA)
        return node == FLAME_NUMA_NODE_LOCAL ? numa_alloc_local(bytes) : numa_alloc_onnode(bytes, node);
    /* The same kind of memory libnuma hands out (an anonymous mapping), minus the policy, so
     * both paths free alike and large requests stay untouched until used. */
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void fl_numa_free(void *p, size_t bytes)
{
    if (p) munmap(p, bytes); /* numa_free is munmap too; this way a forced mode frees alike */
}

/* ---------------------------------------------------------------- public */

/* The allocations flame_numa_alloc handed out, by address: flame_numa_free unmaps only those,
 * whole. A free is munmap, which takes any address, so a second free of a pointer, or a
 * foreign one, unmapped whatever had been mapped there since (another allocation, a malloc
 * arena): a crash far from the mistake. Allocations are few and large, so one lock will do. */
typedef struct block {
    fl_addr_entry e; /* e.addr: the mapping */
    size_t bytes;
} block;

static pthread_mutex_t blocks_mu = PTHREAD_MUTEX_INITIALIZER;
static fl_addr_table blocks; /* process-lifetime */

FLAME_API flame_status flame_numa_get_info(flame_numa_info *info)
{
    fl_clear_error();
    if (!info) return fl_error(FLAME_ERR_INVALID_ARG, "info is NULL");
    flame_numa_mode m = fl_numa_mode();
    flame_numa_info v = {.struct_size = sizeof v, .mode = m, .num_nodes = fl_numa_num_nodes()};
    if (m == FLAME_NUMA_LIBNUMA) {
        int cpu = sched_getcpu();
        int node = cpu >= 0 ? numa_node_of_cpu(cpu) : -1;
        v.current_node = node >= 0 ? node : 0;
    }
    return fl_struct_out("flame_numa_info", info, &v, sizeof v);
}

FLAME_API flame_status flame_numa_alloc(size_t bytes, int32_t node, void **out)
{
    fl_clear_error();
    if (!out) return fl_error(FLAME_ERR_INVALID_ARG, "out is NULL");
    *out = NULL;
    if (bytes == 0) return fl_error(FLAME_ERR_INVALID_ARG, "bytes is 0");
    flame_status st = fl_numa_check_node(node);
    if (st != FLAME_OK) return st;
    block *b = malloc(sizeof *b);
    void *p = b ? fl_numa_alloc(bytes, node) : NULL;
    if (!p) {
        free(b);
        return fl_error(FLAME_ERR_NOMEM, "cannot map %zu bytes on NUMA node %d", bytes, (int)node);
    }
    *b = (block){.e.addr = p, .bytes = bytes};
    pthread_mutex_lock(&blocks_mu);
    bool filed = fl_addr_table_add(&blocks, &b->e);
    pthread_mutex_unlock(&blocks_mu);
    if (!filed) {
        fl_numa_free(p, bytes);
        free(b);
        return fl_error(FLAME_ERR_NOMEM, "cannot record an allocation of %zu bytes on NUMA node %d", bytes, (int)node);
    }
    *out = p;
    return FLAME_OK;
}

FLAME_API void flame_numa_free(void *ptr, size_t bytes)
{
    if (!ptr) return;
    pthread_mutex_lock(&blocks_mu);
    block *b = (block *)fl_addr_table_take(&blocks, ptr); /* e is its first member */
    pthread_mutex_unlock(&blocks_mu);
    if (!b) {
        fl_log(FLAME_LOG_WARN, "flame_numa_free(%p, %zu): not an allocation of flame_numa_alloc, or freed already; "
               "left alone", ptr, bytes);
        return;
    }
    if (b->bytes != bytes)
        fl_log(FLAME_LOG_WARN, "flame_numa_free(%p, %zu): allocated with %zu bytes; those are unmapped", ptr, bytes,
               b->bytes);
    fl_numa_free(ptr, b->bytes);
    free(b);
}

FLAME_API flame_status flame_numa_bind_thread(int32_t node)
{
    fl_clear_error();
    if (node == FLAME_NUMA_NODE_LOCAL)
        return fl_error(FLAME_ERR_INVALID_ARG, "node FLAME_NUMA_NODE_LOCAL (-1) names no node to bind to");
    flame_status st = fl_numa_check_node(node);
    if (st != FLAME_OK) return st;
    if (fl_numa_mode() != FLAME_NUMA_LIBNUMA) return FLAME_OK; /* every CPU and page is on node 0 already */
    if (numa_run_on_node(node) != 0)
        return fl_error(FLAME_ERR_INVALID_ARG, "numa_run_on_node(%d) failed (node without CPUs, or not allowed)",
                        (int)node);
    numa_set_preferred(node); /* later first touches of this thread land on the node too */
    return FLAME_OK;
}
