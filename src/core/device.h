/* What the GPU side offers this process (implemented in cuda/ or src/engine/no_cuda.c). */
#ifndef FLAME_CORE_DEVICE_H
#define FLAME_CORE_DEVICE_H

#include <stdio.h>

#include "core/common.h"

#ifdef __cplusplus
extern "C" {
#endif
/* Number of usable CUDA devices; 0 with the reason in `why` when there are none. */
int fl_cuda_device_count(char *why, size_t why_len);
/* Page-locks host memory for DMA (cudaHostRegister, portable to every context): 0 on success,
 * -1 with the reason in `why`. The pinned pool calls these; it treats failure as "pageable". */
int fl_cuda_host_register(void *p, size_t bytes, char *why, size_t why_len);
void fl_cuda_host_unregister(void *p);
#ifdef __cplusplus
}
#endif

#endif
