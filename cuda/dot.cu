// Dot head over gathered candidate rows: one warp per candidate, float accumulation.
#include "kernels.cuh"

template <typename T>
__global__ void dot_kernel(const T *h, int64_t ldh, const int64_t *hrow, const T *table, int32_t d, const int64_t *ids,
                           const int64_t *o, int64_t n, float *scores)
{
    const int lane = threadIdx.x & 31;
    const int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    if (i >= n) return;
    const T *a = h + hrow[i] * ldh, *b = table + ids[i] * d;
    float s = 0.0f;
    for (int e = lane; e < d; e += 32) s += to_f(a[e]) * to_f(b[e]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) scores[o[i]] = s;
}

template <typename T>
flame_status fl_cuda_dot_gather(const T *h, int64_t ldh, const int64_t *hrow, const T *table, int32_t d,
                                const int64_t *ids, const int64_t *o, int64_t n, float *scores, cudaStream_t s)
{
    if (n == 0) return FLAME_OK;
    dot_kernel<T><<<ceil_div(n * 32, 256), 256, 0, s>>>(h, ldh, hrow, table, d, ids, o, n, scores);
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}

template flame_status fl_cuda_dot_gather<float>(const float *, int64_t, const int64_t *, const float *, int32_t,
                                                const int64_t *, const int64_t *, int64_t, float *, cudaStream_t);
template flame_status fl_cuda_dot_gather<__half>(const __half *, int64_t, const int64_t *, const __half *, int32_t,
                                                 const int64_t *, const int64_t *, int64_t, float *, cudaStream_t);
template flame_status fl_cuda_dot_gather<__nv_bfloat16>(const __nv_bfloat16 *, int64_t, const int64_t *,
                                                        const __nv_bfloat16 *, int32_t, const int64_t *,
                                                        const int64_t *, int64_t, float *, cudaStream_t);
