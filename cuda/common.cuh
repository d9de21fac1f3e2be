// Shared by the CUDA sources: error mapping, the compute dtypes and their dispatch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cublasLt.h>
#include <stdint.h>

extern "C" {
#include "core/common.h"
#include "core/options.h"
}

// Records the failing CUDA call (file:line) as the per-thread message and maps it to a status.
#define FL_CUDA_TRY(call)                                                                                      \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess) {                                                                               \
            (void)cudaGetLastError();                                                                          \
            return fl_error(e_ == cudaErrorMemoryAllocation ? FLAME_ERR_NOMEM : FLAME_ERR_INTERNAL,            \
                            "%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, __LINE__);       \
        }                                                                                                      \
    } while (0)

// cublasGetStatusString lives in libcublas; we link only cuBLASLt.
static inline const char *fl_cublas_status_name(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_(other)";
    }
}

#define FL_CUBLAS_TRY(call)                                                                                    \
    do {                                                                                                       \
        cublasStatus_t s_ = (call);                                                                            \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                                       \
            return fl_error(s_ == CUBLAS_STATUS_ALLOC_FAILED ? FLAME_ERR_NOMEM : FLAME_ERR_INTERNAL,            \
                            "%s failed: %s (%s:%d)", #call, fl_cublas_status_name(s_), __FILE__, __LINE__);    \
    } while (0)

// Checked after every launch: a bad configuration surfaces here, not as a later silent error.
#define FL_LAUNCH_CHECK() FL_CUDA_TRY(cudaGetLastError())

#define FL_TRY(...) /* variadic: template arguments carry commas */                                        \
    do {                                                                                                       \
        flame_status t_ = (__VA_ARGS__);                                                                       \
        if (t_ != FLAME_OK) return t_;                                                                         \
    } while (0)

// Load/store a compute-dtype value as float.
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr cudaDataType_t value = CUDA_R_32F; };
template <> struct dtype_of<__half> { static constexpr cudaDataType_t value = CUDA_R_16F; };
template <> struct dtype_of<__nv_bfloat16> { static constexpr cudaDataType_t value = CUDA_R_16BF; };

// The one dtype dispatch of the CUDA sources (the idiom of FlashAttention's static_switch.h):
// runs the lambda with T bound to the element type of DTYPE, and gives what it returns.
//   fl_dtype_opt (the engine's compute dtype): FL_COMPUTE_FP16 __half, FL_COMPUTE_BF16
//     __nv_bfloat16, FL_COMPUTE_FP32 float;
//   flame_dtype (the public kernels'): FLAME_DTYPE_F16, FLAME_DTYPE_BF16, anything else float
//     (FLAME_DTYPE_F32; an int8 table's float side is float too).
//   cudaDataType_t (cuBLASLt's): CUDA_R_16F, CUDA_R_16BF, anything else (CUDA_R_32F) float.
//   return FL_DTYPE_SWITCH(g->dtype, T, [&] { return run<T>(g, p); });
// Nested switches bind different names (T, OutT).
static inline fl_dtype_opt fl_dtype_compute(fl_dtype_opt d) { return d; }
static inline fl_dtype_opt fl_dtype_compute(flame_dtype d)
{
    return d == FLAME_DTYPE_F16 ? FL_COMPUTE_FP16 : d == FLAME_DTYPE_BF16 ? FL_COMPUTE_BF16 : FL_COMPUTE_FP32;
}
static inline fl_dtype_opt fl_dtype_compute(cudaDataType_t d)
{
    return d == CUDA_R_16F ? FL_COMPUTE_FP16 : d == CUDA_R_16BF ? FL_COMPUTE_BF16 : FL_COMPUTE_FP32;
}
#define FL_DTYPE_SWITCH(DTYPE, T, ...)                                                                         \
    [&] {                                                                                                      \
        switch (fl_dtype_compute(DTYPE)) {                                                                     \
        case FL_COMPUTE_FP16: {                                                                                \
            using T = __half;                                                                                  \
            return __VA_ARGS__();                                                                              \
        }                                                                                                      \
        case FL_COMPUTE_BF16: {                                                                                \
            using T = __nv_bfloat16;                                                                           \
            return __VA_ARGS__();                                                                              \
        }                                                                                                      \
        default: {                                                                                             \
            using T = float;                                                                                   \
            return __VA_ARGS__();                                                                              \
        }                                                                                                      \
        }                                                                                                      \
    }()

static inline unsigned ceil_div(int64_t a, int64_t b) { return (unsigned)((a + b - 1) / b); }
