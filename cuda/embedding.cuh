// Table-batched embedding bag (FBGEMM TBE style): one launch for every token and feature.
// A group of lanes owns one token (sum combine: all features add into the same columns,
// accumulated in registers and written once) or one (token, feature) bag (concat: disjoint
// columns). The group is as wide as a row has vectors (up to a warp), so short rows do not
// leave most of a warp idle. Rows are read with 16-byte vector loads, four rows in flight per
// lane, accumulated in float.
//
// Per-id weights (the public embedding bag's, flame/kernels.h): a separate instantiation (W),
// so the engine's unweighted lookups load no weights.
//
// int8 tables (docs/model-format.md, "int8 tables"): when any feature reads one, a lane takes
// VEC = 16 columns of a row at a time (one 16-byte load of int8 values, two or four of a
// float table's), or 8 or 4 when a dim is not a multiple of 16 (8- or 4-byte int8 loads),
// else single values; each row's (scale, bias) comes in one 8-byte load, and the value
// scale * q + bias is pooled in float.
//
// The templates live here; cuda/embedding_<table dtype>.cu instantiate fl_cuda_embedding_bag for
// one table dtype and the three output dtypes each, so that the build compiles the 216 kernels
// (dtypes x vector widths x concat x int8 x weights) in three translation units at once rather
// than in one that takes minutes alone.
#pragma once

#include "kernels.cuh"

__device__ __forceinline__ float to_f(int8_t x) { return (float)x; }

// VEC consecutive values of a row as float: VEC * sizeof(T) bytes in 16-byte vectors, or in one
// 8-, 4- or 2-byte vector when the span is shorter (p is aligned to the span or to 16 bytes).
template <typename T, int VEC> __device__ __forceinline__ void load_vals(const T *p, float *v)
{
    constexpr int BYTES = VEC * (int)sizeof(T);
    if constexpr (VEC == 1) {
        v[0] = to_f(*p);
    } else if constexpr (BYTES >= 16) {
        static_assert(BYTES % 16 == 0, "whole 16-byte vectors");
        constexpr int PER = 16 / (int)sizeof(T);
#pragma unroll
        for (int k = 0; k < BYTES / 16; k++) {
            const uint4 raw = __ldg(reinterpret_cast<const uint4 *>(p) + k);
            const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
            for (int j = 0; j < PER; j++) v[k * PER + j] = to_f(e[j]);
        }
    } else if constexpr (BYTES == 8) {
        const uint2 raw = __ldg(reinterpret_cast<const uint2 *>(p));
        const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
        for (int j = 0; j < VEC; j++) v[j] = to_f(e[j]);
    } else if constexpr (BYTES == 4) {
        const unsigned raw = __ldg(reinterpret_cast<const unsigned *>(p));
        const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
        for (int j = 0; j < VEC; j++) v[j] = to_f(e[j]);
    } else {
        static_assert(BYTES == 2, "2-byte span");
        const unsigned short raw = __ldg(reinterpret_cast<const unsigned short *>(p));
        const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
        for (int j = 0; j < VEC; j++) v[j] = to_f(e[j]);
    }
}

// acc += w * row[c0 .. c0 + VEC) of a float table
template <typename T, int VEC> __device__ __forceinline__ void add_row(const T *row, float *acc, float w)
{
    float v[VEC];
    load_vals<T, VEC>(row, v);
#pragma unroll
    for (int j = 0; j < VEC; j++) acc[j] += w * v[j];
}

// acc += w * (scale * q + bias) over q = row[c0 .. c0 + VEC) of an int8 table, sb = (scale, bias)
template <int VEC> __device__ __forceinline__ void add_row_q8(const int8_t *row, float2 sb, float *acc, float w)
{
    float v[VEC];
    load_vals<int8_t, VEC>(row, v);
#pragma unroll
    for (int j = 0; j < VEC; j++) acc[j] += w * fmaf(sb.x, v[j], sb.y);
}

// Row i's pooling weight: the bag's (1 or 1/n), times the per-id weight when W.
template <bool W> __device__ __forceinline__ float weight_of(const fl_dev_feature &fe, int64_t i, float w)
{
    if constexpr (W) return fe.weights ? w * __ldg(fe.weights + i) : w;
    return w;
}

// Row id i of a bag; unchecked (a lookup running before its validation ends) clamped into the
// table: a bad id then reads some row of it, and the verdict keeps the result from being written.
template <bool UNCHECKED> __device__ __forceinline__ int64_t row_id(const fl_dev_feature &fe, int64_t i)
{
    const int64_t r = fe.ids[i];
    return UNCHECKED ? min(max(r, (int64_t)0), fe.rows - 1) : r;
}

// One feature's bag for columns c0 .. c0 + VEC of the lane, four rows in flight. UNCHECKED is a
// parameter of the loop, not a test in it: the checked lookup (the engine's) keeps the loop it
// had without the clamps.
template <typename T, int VEC, bool W, bool UNCHECKED>
__device__ __forceinline__ void pool_float(const fl_dev_feature &fe, int64_t b, int64_t e, int c0, float w,
                                           float *acc)
{
    const T *tab = static_cast<const T *>(fe.table) + c0;
    const int dim = fe.dim;
    int64_t i = b;
    for (; i + 4 <= e; i += 4) {
        const int64_t r0 = row_id<UNCHECKED>(fe, i), r1 = row_id<UNCHECKED>(fe, i + 1),
                      r2 = row_id<UNCHECKED>(fe, i + 2), r3 = row_id<UNCHECKED>(fe, i + 3);
        add_row<T, VEC>(tab + r0 * dim, acc, weight_of<W>(fe, i, w));
        add_row<T, VEC>(tab + r1 * dim, acc, weight_of<W>(fe, i + 1, w));
        add_row<T, VEC>(tab + r2 * dim, acc, weight_of<W>(fe, i + 2, w));
        add_row<T, VEC>(tab + r3 * dim, acc, weight_of<W>(fe, i + 3, w));
    }
    for (; i < e; i++) add_row<T, VEC>(tab + row_id<UNCHECKED>(fe, i) * dim, acc, weight_of<W>(fe, i, w));
}

template <int VEC, bool W, bool UNCHECKED>
__device__ __forceinline__ void pool_q8(const fl_dev_feature &fe, int64_t b, int64_t e, int c0, float w, float *acc)
{
    const int8_t *tab = static_cast<const int8_t *>(fe.table) + c0;
    const float2 *qp = reinterpret_cast<const float2 *>(fe.qparams);
    const int dim = fe.dim;
    int64_t i = b;
    for (; i + 4 <= e; i += 4) {
        const int64_t r0 = row_id<UNCHECKED>(fe, i), r1 = row_id<UNCHECKED>(fe, i + 1),
                      r2 = row_id<UNCHECKED>(fe, i + 2), r3 = row_id<UNCHECKED>(fe, i + 3);
        const float2 s0 = __ldg(qp + r0), s1 = __ldg(qp + r1), s2 = __ldg(qp + r2), s3 = __ldg(qp + r3);
        add_row_q8<VEC>(tab + r0 * dim, s0, acc, weight_of<W>(fe, i, w));
        add_row_q8<VEC>(tab + r1 * dim, s1, acc, weight_of<W>(fe, i + 1, w));
        add_row_q8<VEC>(tab + r2 * dim, s2, acc, weight_of<W>(fe, i + 2, w));
        add_row_q8<VEC>(tab + r3 * dim, s3, acc, weight_of<W>(fe, i + 3, w));
    }
    for (; i < e; i++) {
        const int64_t r = row_id<UNCHECKED>(fe, i);
        add_row_q8<VEC>(tab + r * dim, __ldg(qp + r), acc, weight_of<W>(fe, i, w));
    }
}

// Q8: some feature reads an int8 table (each feature's qparams says which); W: some feature
// has per-id weights (each feature's weights says which).
template <typename T, typename OutT, int VEC, bool CONCAT, bool Q8, bool W>
__global__ void __launch_bounds__(256) emb_kernel(const fl_dev_features fs, int64_t tokens, OutT *out, int64_t ldo,
                                                  int lanes)
{
    const int64_t thread = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t item = thread / lanes; // lanes: a power of two <= 32, so groups never straddle warps
    const int sub = (int)(thread % lanes);
    const int64_t items = CONCAT ? tokens * fs.count : tokens;
    if (item >= items) return;
    const bool unchecked = fs.skip_unless_clear != nullptr; // see fl_dev_features::skip_unless_clear
    bool cleared = !unchecked;
    const int64_t t = CONCAT ? item / fs.count : item;
    const int f0 = CONCAT ? (int)(item % fs.count) : 0, f1 = CONCAT ? f0 + 1 : fs.count;
    const int dim = fs.f[f0].dim; // sum combine: every feature has the same dim
    OutT *dst = out + t * ldo + fs.f[f0].out_col;
    for (int c0 = sub * VEC; c0 < dim; c0 += lanes * VEC) {
        float acc[VEC];
#pragma unroll
        for (int v = 0; v < VEC; v++) acc[v] = 0.0f;
        for (int f = f0; f < f1; f++) {
            const fl_dev_feature &fe = fs.f[f];
            int64_t b = t, e = t + 1;
            if (fe.offsets) {
                b = fe.offsets[t];
                e = fe.offsets[t + 1];
            }
            if (unchecked) { // the bag's span inside the ids, empty in a table without rows
                b = min(max(b, (int64_t)0), fe.num_ids);
                e = fe.rows > 0 ? min(max(e, b), fe.num_ids) : b;
            }
            if (e == b) continue; // empty bag: zeros for sum and mean
            const float w = fe.pooling == 1 ? 1.0f / (float)(e - b) : 1.0f;
            if (Q8 && fe.qparams) {
                if (unchecked)
                    pool_q8<VEC, W, true>(fe, b, e, c0, w, acc);
                else
                    pool_q8<VEC, W, false>(fe, b, e, c0, w, acc);
            } else if (unchecked) {
                pool_float<T, VEC, W, true>(fe, b, e, c0, w, acc);
            } else {
                pool_float<T, VEC, W, false>(fe, b, e, c0, w, acc);
            }
        }
        if (!cleared) { // the validation grid has ended and its verdict is visible after the wait
#if __CUDA_ARCH__ >= 900
            asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
            if (*reinterpret_cast<const volatile unsigned long long *>(fs.skip_unless_clear) != ~0ull) return;
            cleared = true;
        }
#pragma unroll
        for (int v = 0; v < VEC; v++) dst[c0 + v] = from_f<OutT>(acc[v]);
    }
}

// Whether `kernel`, as loaded for the current device, may start before the validation launch
// it follows ends: its wait for the validation grid exists only in code compiled for compute
// capability 9.0 or later, which also runs only on such a device, where programmatic dependent
// launches exist (a build whose newest code is compute_80 PTX, compiled by the driver for a
// Hopper GPU, has no wait, so its lookup starts after the validation as an ordinary launch).
template <typename K> static bool dependent_launch(K kernel)
{
    cudaFuncAttributes fa{};
    if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return fa.ptxVersion >= 90;
}

template <typename T, typename OutT, int VEC, bool Q8, bool W>
static void launch(const fl_dev_features &fs, int64_t tokens, OutT *out, int64_t ldo, cudaStream_t s)
{
    int widest = 1; // vectors in the widest row
    for (int f = 0; f < fs.count; f++) widest = fs.f[f].dim / VEC > widest ? fs.f[f].dim / VEC : widest;
    int lanes = 1;
    while (lanes < widest && lanes < 32) lanes <<= 1;
    const int64_t items = fs.concat ? tokens * fs.count : tokens;
    const unsigned blocks = ceil_div(items * lanes, 256);
    // behind a validation launch on sm_90: a programmatic dependent launch, its blocks start
    // pooling as the validation's blocks finish (see fl_dev_features::skip_unless_clear)
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cfg.attrs = &attr;
    auto go = [&](auto kernel) {
        cfg.numAttrs = fs.skip_unless_clear && dependent_launch(kernel) ? 1 : 0;
        cudaLaunchKernelEx(&cfg, kernel, fs, tokens, out, ldo, lanes);
    };
    if (fs.concat)
        go(emb_kernel<T, OutT, VEC, true, Q8, W>);
    else
        go(emb_kernel<T, OutT, VEC, false, Q8, W>);
}

// The vector width for the tables' dims and alignment (see fl_cuda_embedding_bag).
template <typename T, typename OutT, bool W>
static void launch_vec(const fl_dev_features &fs, int64_t tokens, OutT *out, int64_t ldo, cudaStream_t s, bool q8,
                       bool aligned)
{
    auto fits = [&](int vec) { // and every row to start on a vector boundary
        bool ok = aligned;
        for (int f = 0; f < fs.count; f++) ok = ok && fs.f[f].dim % vec == 0;
        return ok;
    };
    constexpr int V = 16 / sizeof(T);
    if (!q8 && fits(V))
        launch<T, OutT, V, false, W>(fs, tokens, out, ldo, s);
    else if (!q8)
        launch<T, OutT, 1, false, W>(fs, tokens, out, ldo, s);
    else if (fits(16))
        launch<T, OutT, 16, true, W>(fs, tokens, out, ldo, s);
    else if (fits(8))
        launch<T, OutT, 8, true, W>(fs, tokens, out, ldo, s);
    else if (fits(4))
        launch<T, OutT, 4, true, W>(fs, tokens, out, ldo, s);
    else
        launch<T, OutT, 1, true, W>(fs, tokens, out, ldo, s);
}

template <typename T, typename OutT>
flame_status fl_cuda_embedding_bag(const fl_dev_features &fs, int64_t tokens, OutT *out, int64_t ldo, cudaStream_t s)
{
    if (tokens == 0 || fs.count == 0) return FLAME_OK;
    bool q8 = false, aligned = true, weighted = false; // vector loads need every table 16-byte aligned (cudaMalloc's are)
    for (int f = 0; f < fs.count; f++) {
        q8 = q8 || fs.f[f].qparams != nullptr;
        weighted = weighted || fs.f[f].weights != nullptr;
        aligned = aligned && ((uintptr_t)fs.f[f].table & 15) == 0;
    }
    if (weighted) // the engine never weighs ids: its path keeps the kernels without the weight loads
        launch_vec<T, OutT, true>(fs, tokens, out, ldo, s, q8, aligned);
    else
        launch_vec<T, OutT, false>(fs, tokens, out, ldo, s, q8, aligned);
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}
