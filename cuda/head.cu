// The SUMI head's task tails: one warp per (row, task) computes the width-1 output layer and
// its sigmoid, so every task's tail is one launch instead of a GEMM and a sigmoid per task.
#include "kernels.cuh"

template <typename T>
__global__ void task_tail_kernel(const fl_task_tail *tails, int32_t count, const T *ys, int64_t ldys, const T *hid,
                                 int64_t ldh, int64_t rows, int32_t num_tasks, float *scores)
{
    const int lane = threadIdx.x & 31;
    const int64_t i = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    if (i >= rows * count) return;
    const int64_t r = i / count;
    const fl_task_tail tl = tails[i % count];
    const T *x = (tl.from_hidden ? hid + r * ldh : ys + r * ldys) + tl.col;
    const T *w = static_cast<const T *>(tl.w);
    float s = 0.0f;
    for (int e = lane; e < tl.width; e += 32) s += to_f(x[e]) * to_f(w[e]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane != 0) return;
    const float z = s + *tl.b; // sigmoid, as fl_cuda_sigmoid
    scores[r * num_tasks + tl.task] = z >= 0.0f ? 1.0f / (1.0f + expf(-z)) : expf(z) / (1.0f + expf(z));
}

template <typename T>
flame_status fl_cuda_task_tails(const fl_task_tail *tails, int32_t count, const T *ys, int64_t ldys, const T *hid,
                                int64_t ldh, int64_t rows, int32_t num_tasks, float *scores, cudaStream_t s)
{
    if (rows == 0 || count == 0) return FLAME_OK;
    task_tail_kernel<T><<<ceil_div(rows * count * 32, 256), 256, 0, s>>>(tails, count, ys, ldys, hid, ldh, rows,
                                                                         num_tasks, scores);
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}

#define INSTANTIATE(T)                                                                                         \
    template flame_status fl_cuda_task_tails<T>(const fl_task_tail *, int32_t, const T *, int64_t, const T *,  \
                                                int64_t, int64_t, int32_t, float *, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(__half)
INSTANTIATE(__nv_bfloat16)
