/* Stand-in for cuda/ when the library is built without CUDA (make CUDA=0). */
#include "core/device.h"

int fl_cuda_device_count(char *why, size_t why_len)
{
    snprintf(why, why_len, "this libflame was built without CUDA (make CUDA=0 or no nvcc)");
    return 0;
}
