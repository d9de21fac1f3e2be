// Device discovery for the engine's device option.
#include <cuda_runtime.h>

#include "core/device.h"

extern "C" int fl_cuda_device_count(char *why, size_t why_len)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
        // the runtime's words for "no driver" read like a version problem: say what it means
        const bool no_driver = err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice;
        snprintf(why, why_len, "%s (cudaGetDeviceCount: %s)",
                 no_driver ? "no NVIDIA GPU or driver found" : "no usable CUDA device", cudaGetErrorString(err));
        (void)cudaGetLastError(); // clear the sticky error for later callers
        return 0;
    }
    if (n == 0) snprintf(why, why_len, "no CUDA device present");
    return n;
}
