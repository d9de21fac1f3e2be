// Page-locking of host buffers for the pinned pool (src/mem/pinned_pool.c).
#include <cuda_runtime.h>

#include "core/device.h"

extern "C" int fl_cuda_host_register(void *p, size_t bytes, char *why, size_t why_len)
{
    // Portable: the pages count as pinned for every CUDA context of the process, so engines on
    // different devices can share one pool.
    cudaError_t err = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    if (err != cudaSuccess) {
        snprintf(why, why_len, "cudaHostRegister(%zu bytes) failed: %s", bytes, cudaGetErrorString(err));
        (void)cudaGetLastError(); // clear the error so later CUDA calls do not see it
        return -1;
    }
    return 0;
}

extern "C" void fl_cuda_host_unregister(void *p)
{
    if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}
