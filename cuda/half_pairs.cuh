// What both tensor-core attention kernels (mma.sync and wgmma) need in registers: pairs of
// 16-bit floats in one 32-bit register (the fp16/bf16 operand format of their fragments), and
// the online softmax's exp2 and reductions over the 4 lanes that hold one fragment row.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace fl_half_pairs {

// Two floats as a packed pair (lo in the low 16 bits), rounded to nearest.
template <typename T> __device__ __forceinline__ uint32_t pack(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack<__half>(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}
template <> __device__ __forceinline__ uint32_t pack<__nv_bfloat16>(float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}
template <typename T> __device__ __forceinline__ float2 unpack(uint32_t v);
template <> __device__ __forceinline__ float2 unpack<__half>(uint32_t v)
{
    return __half22float2(*reinterpret_cast<__half2 *>(&v));
}
template <> __device__ __forceinline__ float2 unpack<__nv_bfloat16>(uint32_t v)
{
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&v));
}

// 2^x in one instruction (MUFU.EX2, relative error ~2^-22; -inf gives 0).
__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

} // namespace fl_half_pairs
