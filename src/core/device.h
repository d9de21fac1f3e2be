/* What the GPU side offers this process (implemented in cuda/ or src/core/no_cuda.c). */
#ifndef FLAME_CORE_DEVICE_H
#define FLAME_CORE_DEVICE_H

#include <stdio.h>

#include "core/common.h"

#ifdef __cplusplus
extern "C" {
#endif
/* Number of usable CUDA devices; 0 with the reason in `why` when there are none. */
int fl_cuda_device_count(char *why, size_t why_len);
#ifdef __cplusplus
}
#endif

#endif
