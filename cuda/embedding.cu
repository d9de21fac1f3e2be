// Table-batched embedding bag (FBGEMM TBE style): one launch for every token and feature.
// A group of lanes owns one token (sum combine: all features add into the same columns,
// accumulated in registers and written once) or one (token, feature) bag (concat: disjoint
// columns). The group is as wide as a row has 16-byte vectors (up to a warp), so short rows
// do not leave most of a warp idle. Rows are read with 16-byte vector loads, four rows in
// flight per lane, accumulated in float.
#include "kernels.cuh"

template <typename T, int VEC> struct vec_load;
template <typename T> struct vec_load<T, 1> {
    __device__ static void add(const T *p, float *acc, float w) { acc[0] += w * to_f(*p); }
};
template <typename T, int VEC> struct vec_load {
    static_assert(VEC * sizeof(T) == 16, "16-byte vectors");
    __device__ static void add(const T *p, float *acc, float w)
    {
        uint4 raw = __ldg(reinterpret_cast<const uint4 *>(p));
        const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
        for (int v = 0; v < VEC; v++) acc[v] += w * to_f(e[v]);
    }
};

template <typename T, typename OutT, int VEC, bool CONCAT>
__global__ void __launch_bounds__(256) emb_kernel(const fl_dev_features fs, int64_t tokens, OutT *out, int64_t ldo,
                                                  int lanes)
{
    const int64_t thread = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t item = thread / lanes; // lanes: a power of two <= 32, so groups never straddle warps
    const int sub = (int)(thread % lanes);
    const int64_t items = CONCAT ? tokens * fs.count : tokens;
    if (item >= items) return;
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
            const T *tab = static_cast<const T *>(fe.table) + c0;
            int64_t b = t, e = t + 1;
            if (fe.offsets) {
                b = fe.offsets[t];
                e = fe.offsets[t + 1];
            }
            if (e == b) continue; // empty bag: zeros for sum and mean
            const float w = fe.pooling == 1 ? 1.0f / (float)(e - b) : 1.0f;
            int64_t i = b;
            for (; i + 4 <= e; i += 4) { // four independent rows in flight
                const int64_t r0 = fe.ids[i], r1 = fe.ids[i + 1], r2 = fe.ids[i + 2], r3 = fe.ids[i + 3];
                vec_load<T, VEC>::add(tab + r0 * dim, acc, w);
                vec_load<T, VEC>::add(tab + r1 * dim, acc, w);
                vec_load<T, VEC>::add(tab + r2 * dim, acc, w);
                vec_load<T, VEC>::add(tab + r3 * dim, acc, w);
            }
            for (; i < e; i++) vec_load<T, VEC>::add(tab + fe.ids[i] * dim, acc, w);
        }
#pragma unroll
        for (int v = 0; v < VEC; v++) dst[c0 + v] = from_f<OutT>(acc[v]);
    }
}

template <typename T, typename OutT, int VEC>
static void launch(const fl_dev_features &fs, int64_t tokens, OutT *out, int64_t ldo, cudaStream_t s)
{
    int widest = 1; // vectors in the widest row
    for (int f = 0; f < fs.count; f++) widest = fs.f[f].dim / VEC > widest ? fs.f[f].dim / VEC : widest;
    int lanes = 1;
    while (lanes < widest && lanes < 32) lanes <<= 1;
    const int64_t items = fs.concat ? tokens * fs.count : tokens;
    const unsigned blocks = ceil_div(items * lanes, 256);
    if (fs.concat)
        emb_kernel<T, OutT, VEC, true><<<blocks, 256, 0, s>>>(fs, tokens, out, ldo, lanes);
    else
        emb_kernel<T, OutT, VEC, false><<<blocks, 256, 0, s>>>(fs, tokens, out, ldo, lanes);
}

template <typename T, typename OutT>
flame_status fl_cuda_embedding_bag(const fl_dev_features &fs, int64_t tokens, OutT *out, int64_t ldo, cudaStream_t s)
{
    if (tokens == 0 || fs.count == 0) return FLAME_OK;
    constexpr int V = 16 / sizeof(T);
    bool vec = true; // 16-byte loads need every row to start 16-byte aligned
    for (int f = 0; f < fs.count; f++) vec = vec && fs.f[f].dim % V == 0 && ((uintptr_t)fs.f[f].table & 15) == 0;
    if (vec)
        launch<T, OutT, V>(fs, tokens, out, ldo, s);
    else
        launch<T, OutT, 1>(fs, tokens, out, ldo, s);
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}

#define INSTANTIATE(T, O)                                                                                      \
    template flame_status fl_cuda_embedding_bag<T, O>(const fl_dev_features &, int64_t, O *, int64_t, cudaStream_t);
INSTANTIATE(float, float)
INSTANTIATE(__half, float)
INSTANTIATE(__nv_bfloat16, float)
INSTANTIATE(float, __half)
INSTANTIATE(__half, __half)
INSTANTIATE(__nv_bfloat16, __nv_bfloat16)
INSTANTIATE(float, __nv_bfloat16)
INSTANTIATE(__half, __nv_bfloat16)
INSTANTIATE(__nv_bfloat16, __half)
