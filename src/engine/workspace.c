/* Per-call scratch: a pool of arenas so concurrent calls never share buffers and a steady
 * state allocates nothing. */
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "engine/cpu_plan.h"
#include "engine/engine.h"

fl_workspace *fl_workspace_acquire(struct flame_engine *e)
{
    pthread_mutex_lock(&e->pool_lock);
    fl_workspace *ws = e->free_list;
    if (ws) e->free_list = ws->next;
    pthread_mutex_unlock(&e->pool_lock);
    if (ws) return ws;
    ws = calloc(1, sizeof *ws);
    /* a second workspace means calls run at once: where the CPU backend's GEMMs go to the BLAS
     * (a CPU without AVX2), each one's BLAS threads then compete for the cores (32 callers with
     * 2 BLAS threads each ran 55x slower than with 1); libflame's own pool is shared instead */
    if (ws && atomic_fetch_add(&e->workspaces, 1) == 1 && e->cpu && e->cpu->isa == FL_ISA_BASE &&
        fl_blas_threads() > 1 && !atomic_exchange(&e->warned_blas_threads, true))
        fl_log(FLAME_LOG_WARN,
               "calls run concurrently on this engine while OpenBLAS runs %d threads a call: their threads "
               "oversubscribe the cores and throughput can fall by an order of magnitude; with concurrent callers "
               "set OPENBLAS_NUM_THREADS=1, or score through a flame_scheduler with one worker per core "
               "(docs/scheduler.md)",
               fl_blas_threads());
    return ws;
}

void fl_workspace_release(struct flame_engine *e, fl_workspace *ws)
{
    pthread_mutex_lock(&e->pool_lock);
    ws->next = e->free_list;
    e->free_list = ws;
    pthread_mutex_unlock(&e->pool_lock);
}

flame_status fl_workspace_reserve(struct flame_engine *e, fl_workspace *ws, size_t bytes)
{
    ws->used = 0;
    if (bytes <= ws->cap) return FLAME_OK;
    size_t cap = bytes + bytes / 4; /* headroom so slowly growing requests do not realloc each call */
    uint8_t *p = fl_aligned_alloc(cap);
    if (!p) return fl_error(FLAME_ERR_NOMEM, "out of memory for %zu bytes of scratch", cap);
    fl_aligned_free(ws->base);
    atomic_fetch_add(&e->scratch_bytes, cap - ws->cap);
    ws->base = p;
    ws->cap = cap;
    uint_fast64_t prev = atomic_load(&e->max_workspace_bytes);
    while (cap > prev && !atomic_compare_exchange_weak(&e->max_workspace_bytes, &prev, cap)) {
    }
    return FLAME_OK;
}

void *fl_workspace_take(fl_workspace *ws, size_t bytes)
{
    void *p = ws->base + ws->used;
    ws->used += fl_ws_round(bytes);
    return p;
}

void *fl_workspace_grow(void **buf, size_t *cap, size_t bytes)
{
    if (bytes <= *cap) return *buf;
    void *p = realloc(*buf, bytes + bytes / 4);
    if (!p) return NULL;
    *buf = p;
    *cap = bytes + bytes / 4;
    return p;
}
