/* Stand-in for cuda/ when the library is built without CUDA (make CUDA=0). */
#include "core/device.h"

int fl_cuda_device_count(char *why, size_t why_len)
{
    snprintf(why, why_len, "this libflame was built without CUDA (make CUDA=0 or no nvcc)");
    return 0;
}

int fl_cuda_host_register(void *p, size_t bytes, char *why, size_t why_len)
{
    snprintf(why, why_len, "this libflame was built without CUDA: cannot pin %zu bytes at %p", bytes, p);
    return -1;
}

void fl_cuda_host_unregister(void *p)
{
    (void)p;
}
