/* libflame's one CPU thread pool (never installed).
 *
 * fl_parallel runs the tasks 0..n-1 of one job on the calling thread and up to threads - 1
 * pool threads. Tasks are claimed one at a time from a shared counter, and the caller waits
 * only for tasks already claimed: a pool thread that another process keeps off its core
 * simply takes no part, instead of holding every thread at a barrier (what an OpenMP team
 * does, which made a loaded 2-core machine score 30x slower). One job runs at a time; a call
 * made while another caller's job runs does its tasks alone, on its own thread. Which thread
 * runs a task never changes what it computes, so callers get the same bits either way. */
#ifndef FLAME_CORE_POOL_H
#define FLAME_CORE_POOL_H

#include <stdint.h>

/* One task: `worker` is 0 for the calling thread, else 1..threads-1 (a slice of scratch). */
typedef void (*fl_task_fn)(void *ctx, int64_t task, int worker);

/* Runs fn(ctx, t, w) for every t in [0, n); returns when all have run. threads <= 1 or
 * n <= 1: in order on the calling thread. */
void fl_parallel(int threads, int64_t n, fl_task_fn fn, void *ctx);

/* Bounds of part p of [0, n) split into `parts` near-equal contiguous parts. */
static inline int64_t fl_part_lo(int64_t n, int64_t parts, int64_t p)
{
    return n * p / parts;
}

#endif
