/* The GPU gate of the GPU test suites: a group setup that finds out whether a GPU is usable,
 * and TU_NEED_GPU(), which skips a test with the reason printed once (or fails it when
 * FLAME_REQUIRE_GPU is set, as make test-gpu does). Include after testutil.h. */
#ifndef FLAME_TU_GPU_H
#define FLAME_TU_GPU_H

#include "core/device.h"

static char tu_no_gpu_reason[256];
static int tu_have_gpu;

static inline int tu_gpu_setup(void **state)
{
    (void)state;
    tu_seed();
    tu_have_gpu = fl_cuda_device_count(tu_no_gpu_reason, sizeof tu_no_gpu_reason) > 0;
    if (!tu_have_gpu) fprintf(stderr, "# GPU tests skipped: %s\n", tu_no_gpu_reason);
    return 0;
}

#define TU_NEED_GPU()                                                                                           \
    do {                                                                                                        \
        if (!tu_have_gpu) {                                                                                     \
            if (getenv("FLAME_REQUIRE_GPU")) fail_msg("FLAME_REQUIRE_GPU is set but %s", tu_no_gpu_reason);    \
            skip();                                                                                             \
        }                                                                                                       \
    } while (0)

#endif
