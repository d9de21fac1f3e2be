// Device discovery for the engine's device option. The CUDA forward pass itself is not part
// of this file; it is what the CUDA backend adds.
#include <cuda_runtime.h>

#include "core/device.h"

extern "C" int fl_cuda_device_count(char *why, size_t why_len)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        snprintf(why, why_len, "no usable CUDA device: %s", cudaGetErrorString(err));
        (void)cudaGetLastError(); // clear the sticky error for later callers
        return 0;
    }
    if (n == 0) snprintf(why, why_len, "no CUDA device present");
    return n;
}
