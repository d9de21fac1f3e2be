// Row-wise kernels: the residual-stream update with LayerNorm, row gathers, activations,
// sigmoid. One warp per row; statistics in float with two passes (mean, then centred
// variance) so a large mean never cancels the digits that matter.
#include "kernels.cuh"

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T>
__global__ void __launch_bounds__(256) rows_kernel(int64_t rows, int32_t d, float *X, const float *position,
                                                   const int32_t *prow, const float *w, const float *b, float eps,
                                                   bool inside, int mode, T *Y, int64_t ldy)
{
    const int lane = threadIdx.x & 31;
    const int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    if (r >= rows) return;
    float *x = X + r * d;
    const float *p = position && prow && prow[r] >= 0 ? position + (int64_t)prow[r] * d : nullptr;
    float sum = 0.0f;
    for (int j = lane; j < d; j += 32) {
        float z = x[j] + (p ? p[j] : 0.0f);
        if (p) x[j] = z;
        sum += z;
    }
    if (mode == FL_ROW_COPY) {
        if (Y)
            for (int j = lane; j < d; j += 32) Y[r * ldy + j] = from_f<T>(x[j]);
        return;
    }
    const float mean = warp_sum(sum) / (float)d;
    float var = 0.0f;
    for (int j = lane; j < d; j += 32) {
        float c = x[j] - mean;
        var += c * c;
    }
    var = warp_sum(var) / (float)d;
    const float inv = inside ? rsqrtf(var + eps) : 1.0f / (sqrtf(var) + eps);
    for (int j = lane; j < d; j += 32) {
        float o = (x[j] - mean) * inv * w[j] + b[j];
        if (mode == FL_ROW_LN_X) x[j] = o;
        if (Y) Y[r * ldy + j] = from_f<T>(o);
    }
}

// VEC consecutive floats as one access (VEC 4: 16 bytes).
template <int VEC> __device__ __forceinline__ void load_vec(const float *src, float *dst)
{
    if constexpr (VEC == 4) {
        const float4 v = *reinterpret_cast<const float4 *>(src);
        dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
    } else {
#pragma unroll
        for (int u = 0; u < VEC; u++) dst[u] = src[u];
    }
}
template <int VEC> __device__ __forceinline__ void store_vec(float *dst, const float *src)
{
    if constexpr (VEC == 4)
        *reinterpret_cast<float4 *>(dst) = make_float4(src[0], src[1], src[2], src[3]);
    else
#pragma unroll
        for (int u = 0; u < VEC; u++) dst[u] = src[u];
}
template <typename T, int VEC> __device__ __forceinline__ void store_vec(T *dst, const float *src)
{
    struct alignas(sizeof(T) * VEC) vec_t {
        T v[VEC];
    } o;
#pragma unroll
    for (int u = 0; u < VEC; u++) o.v[u] = from_f<T>(src[u]);
    *reinterpret_cast<vec_t *>(dst) = o;
}

// The same with the row in registers (PER values per lane, d <= 32 * PER): one read of X
// instead of three, every load of a row (X, position, LN weights) in flight at once, and with
// VEC 4 (d a multiple of 128) 16-byte accesses: lane l holds elements 4 l + 128 i + u.
template <typename T, int PER, int VEC>
__global__ void __launch_bounds__(128) rows_reg_kernel(int64_t rows, int32_t d, float *X, const float *position,
                                                       const int32_t *prow, const float *w, const float *b, float eps,
                                                       bool inside, int mode, T *Y, int64_t ldy)
{
    constexpr int NV = PER / VEC;
    const int lane = threadIdx.x & 31;
    const int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5;
    if (r >= rows) return;
    float *x = X + r * d;
    const float *p = position && prow && prow[r] >= 0 ? position + (int64_t)prow[r] * d : nullptr;
    const bool ln = mode != FL_ROW_COPY;
    float z[PER], wv[PER], bv[PER];
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int j = VEC * lane + 32 * VEC * i;
        float *zi = z + VEC * i, *wi = wv + VEC * i, *bi = bv + VEC * i;
        if (j < d) { // VEC 4: d % 128 == 0, so a vector is wholly in or out
            load_vec<VEC>(x + j, zi);
            if (ln) {
                load_vec<VEC>(w + j, wi);
                load_vec<VEC>(b + j, bi);
            }
            if (p) {
                float pv[VEC];
                load_vec<VEC>(p + j, pv);
#pragma unroll
                for (int u = 0; u < VEC; u++) zi[u] += pv[u];
                store_vec<VEC>(x + j, zi);
            }
        } else {
#pragma unroll
            for (int u = 0; u < VEC; u++) zi[u] = wi[u] = bi[u] = 0.0f;
        }
    }
    if (!ln) {
        if (Y)
#pragma unroll
            for (int i = 0; i < NV; i++)
                if (VEC * lane + 32 * VEC * i < d) store_vec<T, VEC>(Y + r * ldy + VEC * lane + 32 * VEC * i, z + VEC * i);
        return;
    }
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < PER; i++) sum += z[i]; // out-of-row slots are 0
    const float mean = warp_sum(sum) / (float)d;
    float var = 0.0f;
#pragma unroll
    for (int i = 0; i < NV; i++)
        if (VEC * lane + 32 * VEC * i < d)
#pragma unroll
            for (int u = 0; u < VEC; u++) var += (z[VEC * i + u] - mean) * (z[VEC * i + u] - mean);
    var = warp_sum(var) / (float)d;
    const float inv = inside ? rsqrtf(var + eps) : 1.0f / (sqrtf(var) + eps);
#pragma unroll
    for (int i = 0; i < NV; i++) {
        const int j = VEC * lane + 32 * VEC * i;
        if (j >= d) continue;
        float o[VEC];
#pragma unroll
        for (int u = 0; u < VEC; u++) o[u] = (z[VEC * i + u] - mean) * inv * wv[VEC * i + u] + bv[VEC * i + u];
        if (mode == FL_ROW_LN_X) store_vec<VEC>(x + j, o);
        if (Y) store_vec<T, VEC>(Y + r * ldy + j, o);
    }
}

template <typename T> flame_status fl_cuda_rows(const fl_rows_args<T> &a, cudaStream_t s)
{
    const int64_t rows = a.rows, ldy = a.ldy;
    const int32_t d = a.d;
    float *X = a.X;
    const float *position = a.position, *ln_w = a.ln.w, *ln_b = a.ln.b;
    const int32_t *prow = a.prow;
    const float eps = a.ln.eps;
    const bool eps_inside = a.ln.eps_inside;
    const fl_row_mode mode = a.mode;
    T *Y = a.Y;
    if (rows == 0) return FLAME_OK;
    // 16-byte accesses need d % 128 == 0 and 16-byte aligned rows of X, Y and the position table
    const bool vec = d % 128 == 0 && ldy % 4 == 0 && ((uintptr_t)X | (uintptr_t)Y | (uintptr_t)position) % 16 == 0;
    const unsigned grid = ceil_div(rows * 32, 128);
#define ROWS_REG(PER, VEC)                                                                                     \
    rows_reg_kernel<T, PER, VEC><<<grid, 128, 0, s>>>(rows, d, X, position, prow, ln_w, ln_b, eps, eps_inside, \
                                                      (int)mode, Y, ldy)
    if (d <= 64)
        ROWS_REG(2, 1);
    else if (d <= 128 && vec)
        ROWS_REG(4, 4);
    else if (d <= 128)
        ROWS_REG(4, 1);
    else if (d <= 256 && vec)
        ROWS_REG(8, 4);
    else if (d <= 256)
        ROWS_REG(8, 1);
    else if (d <= 512 && vec)
        ROWS_REG(16, 4);
    else if (d <= 512)
        ROWS_REG(16, 1);
    else if (d <= 1024 && vec)
        ROWS_REG(32, 4);
    else if (d <= 1024)
        ROWS_REG(32, 1);
    else
        rows_kernel<T><<<ceil_div(rows * 32, 256), 256, 0, s>>>(rows, d, X, position, prow, ln_w, ln_b, eps,
                                                                eps_inside, (int)mode, Y, ldy);
#undef ROWS_REG
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}

template <typename T>
__global__ void gather_kernel(const T *src, int64_t lds, const int64_t *rows, int64_t count, int32_t cols, T *dst,
                              int64_t ldd)
{
    const int64_t i = blockIdx.y * (int64_t)gridDim.x + blockIdx.x;
    if (i >= count) return;
    const T *s = src + rows[i] * lds;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) dst[i * ldd + j] = s[j];
}

template <typename T>
flame_status fl_cuda_gather(const T *src, int64_t lds, const int64_t *rows, int64_t count, int32_t cols, T *dst,
                            int64_t ldd, cudaStream_t s)
{
    if (count == 0) return FLAME_OK;
    const unsigned gx = count < 65535 ? (unsigned)count : 65535u;
    gather_kernel<T><<<dim3(gx, ceil_div(count, gx)), 128, 0, s>>>(src, lds, rows, count, cols, dst, ldd);
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}

__device__ __forceinline__ float activate(float v, int act)
{
    if (act == 1) return 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    if (act == 2) return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    return act == 3 && v < 0.0f ? 0.0f : v;
}

// VEC consecutive elements per thread (one 16-byte access when VEC * sizeof(T) == 16); rows
// along grid.y, so no thread divides a 64-bit index.
template <typename T, int VEC> __global__ void act_kernel(T *x, int64_t rows, int32_t cols, int64_t ld, int act)
{
    struct alignas(sizeof(T) * VEC) vec_t {
        T v[VEC];
    };
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (c >= cols) return;
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        vec_t *p = reinterpret_cast<vec_t *>(x + r * ld + c);
        vec_t a = *p;
#pragma unroll
        for (int i = 0; i < VEC; i++) a.v[i] = from_f<T>(activate(to_f(a.v[i]), act));
        *p = a;
    }
}

template <typename T>
flame_status fl_cuda_activation(T *x, int64_t rows, int32_t cols, int64_t ld, int act, cudaStream_t s)
{
    if (rows == 0 || cols == 0 || act == 0) return FLAME_OK;
    constexpr int VEC = 16 / sizeof(T);
    const bool vec = cols % VEC == 0 && ld % VEC == 0 && (uintptr_t)x % 16 == 0;
    const dim3 grid(ceil_div(vec ? cols / VEC : cols, 128), rows < 65535 ? (unsigned)rows : 65535u);
    if (vec)
        act_kernel<T, VEC><<<grid, 128, 0, s>>>(x, rows, cols, ld, act);
    else
        act_kernel<T, 1><<<grid, 128, 0, s>>>(x, rows, cols, ld, act);
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}

__global__ void sigmoid_kernel(float *x, int64_t n, int64_t stride)
{
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i * stride];
    x[i * stride] = v >= 0.0f ? 1.0f / (1.0f + expf(-v)) : expf(v) / (1.0f + expf(v));
}

flame_status fl_cuda_sigmoid(float *x, int64_t n, int64_t stride, cudaStream_t s)
{
    if (n == 0) return FLAME_OK;
    sigmoid_kernel<<<ceil_div(n, 256), 256, 0, s>>>(x, n, stride);
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}

// One CTA a segment: dst[seg[3i+1] ..] = src[seg[3i] ..], seg[3i+2] floats (0: nothing).
__global__ void copy_segments_kernel(const float *src, const int64_t *seg, float *dst)
{
    const int64_t from = seg[3 * blockIdx.x], to = seg[3 * blockIdx.x + 1], n = seg[3 * blockIdx.x + 2];
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[to + i] = src[from + i];
}

flame_status fl_cuda_copy_segments(const float *src, const int64_t *seg, int32_t nseg, float *dst, cudaStream_t s)
{
    if (nseg == 0) return FLAME_OK;
    copy_segments_kernel<<<nseg, 256, 0, s>>>(src, seg, dst);
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}

#define INSTANTIATE(T)                                                                                         \
    template flame_status fl_cuda_rows<T>(const fl_rows_args<T> &, cudaStream_t);                             \
    template flame_status fl_cuda_gather<T>(const T *, int64_t, const int64_t *, int64_t, int32_t, T *, int64_t,  \
                                            cudaStream_t);                                                     \
    template flame_status fl_cuda_activation<T>(T *, int64_t, int32_t, int64_t, int, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(__half)
INSTANTIATE(__nv_bfloat16)
