// Shared by the CUDA kernel tests (nvcc): a checked CUDA call and the compute dtypes' round
// trips to float. Include after testutil.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define CK(call)                                                                                                \
    do {                                                                                                        \
        cudaError_t e_ = (call);                                                                                \
        if (e_ != cudaSuccess) fail_msg("%s: %s", #call, cudaGetErrorString(e_));                              \
    } while (0)

template <typename T> static T to_t(float x);
template <> __half to_t<__half>(float x) { return __float2half_rn(x); }
template <> __nv_bfloat16 to_t<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> float to_t<float>(float x) { return x; }
static inline float from_t(__half x) { return __half2float(x); }
static inline float from_t(__nv_bfloat16 x) { return __bfloat162float(x); }
static inline float from_t(float x) { return x; }
