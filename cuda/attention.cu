// SUMI attention on CUDA cores, exact in float: the fp32 path, and fp16/bf16 head dims or
// strides the tensor-core kernel (attention_tc.cu) does not take.
// One CTA = up to FL_ATTN_QT queries of one sequence and one head; 4 warps, each owning
// 4 queries. Key/value tiles of 32 rows are staged in shared memory (float, keys padded by
// one column so the 32 lanes' rows fall in 32 banks) and shared by all 16 queries; each
// warp keeps an online softmax per query (Milakov & Gimelshein 2018). A candidate's own key
// is one extra step after the history tiles.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "attention_tc.cuh"
#include "attention_wgmma.cuh"

#define KT 32

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ int query_pos(const fl_attn_tile &t, const int32_t *qpos, int qi)
{
    return t.qpos_idx < 0 ? t.pos0 + qi : qpos[t.qpos_idx + qi];
}

// Folds one score into a running softmax: m max, l sum of exp, o the weighted values.
template <int DPL>
__device__ __forceinline__ float rescale(float &m, float &l, float (&o)[DPL], float s_max)
{
    const float m_new = fmaxf(m, s_max);
    const float alpha = m == -INFINITY ? 0.0f : __expf(m - m_new);
    l *= alpha;
#pragma unroll
    for (int d = 0; d < DPL; d++) o[d] *= alpha;
    m = m_new;
    return m_new;
}

template <typename T, int DPL>
__global__ void __launch_bounds__(128) attn_kernel(const fl_attn_tile *tiles, const int32_t *qpos, int dh, float scale,
                                                   const T *q, int64_t ldq, const T *k, const T *v, int64_t ldkv,
                                                   T *out, int64_t ldo)
{
    extern __shared__ float smem[];
    const fl_attn_tile tile = tiles[blockIdx.x];
    const int h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *qs = smem;                    // [QT][dh], pre-scaled
    float *ks = qs + FL_ATTN_QT * dh;    // [KT][dh + 1]
    float *vs = ks + KT * (dh + 1);      // [KT][dh]
    const int64_t col = (int64_t)h * dh;
    for (int qi = warp; qi < tile.nq; qi += 4) { // a warp per row, lanes along the row: coalesced
        const T *src = q + (tile.q_row + qi) * ldq + col;
#pragma unroll
        for (int d = 0; d < DPL; d++)
            if (lane + 32 * d < dh) qs[qi * dh + lane + 32 * d] = to_f(src[lane + 32 * d]) * scale;
    }
    __syncthreads(); // queries staged (a sequence without history keys skips the tile loop)
    const int n = tile.n_hist;
    const int p_last = query_pos(tile, qpos, tile.nq - 1); // positions ascend within a tile
    const int kend = p_last < n ? p_last + 1 : n;

    // the warp's 4 queries are processed together: 4 independent chains hide the latency of
    // shared-memory loads and shuffles that a single query would wait on
    bool active[4];
    int pos[4];
    float m[4], l[4], o[4][DPL];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        active[j] = warp + 4 * j < tile.nq;
        pos[j] = active[j] ? query_pos(tile, qpos, warp + 4 * j) : 0;
        m[j] = -INFINITY;
        l[j] = 0.0f;
#pragma unroll
        for (int d = 0; d < DPL; d++) o[j][d] = 0.0f;
    }
    for (int kb = 0; kb < kend; kb += KT) {
        const int nk = kend - kb < KT ? kend - kb : KT;
        __syncthreads(); // the previous tile is done with
        for (int r = warp; r < nk; r += 4) {
            const T *kr = k + (tile.seq_row + kb + r) * ldkv + col, *vr = v + (tile.seq_row + kb + r) * ldkv + col;
#pragma unroll
            for (int d = 0; d < DPL; d++) {
                const int e = lane + 32 * d;
                if (e < dh) {
                    ks[r * (dh + 1) + e] = to_f(kr[e]);
                    vs[r * dh + e] = to_f(vr[e]);
                }
            }
        }
        __syncthreads();
        // lane = key: its score against each of the 4 queries
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (lane < nk) {
            const float *kr = ks + lane * (dh + 1), *q0 = qs + warp * dh;
#pragma unroll 8
            for (int e = 0; e < dh; e++) {
                const float kv = kr[e];
#pragma unroll
                for (int j = 0; j < 4; j++) acc[j] += q0[4 * j * dh + e] * kv;
            }
        }
        float pj[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            pj[j] = 0.0f;
            const int vis = (pos[j] < n ? pos[j] + 1 : n) - kb; // visible keys in this tile: lanes < vis
            if (!active[j] || vis <= 0) continue;                // warp-uniform
            const float s = lane < vis && lane < nk ? acc[j] : -INFINITY;
            const float m_new = rescale<DPL>(m[j], l[j], o[j], warp_max(s));
            pj[j] = s == -INFINITY ? 0.0f : __expf(s - m_new);
            l[j] += warp_sum(pj[j]);
        }
        for (int kk = 0; kk < nk; kk++) { // invisible keys carry weight 0
            float vrow[DPL];
#pragma unroll
            for (int d = 0; d < DPL; d++) vrow[d] = lane + 32 * d < dh ? vs[kk * dh + lane + 32 * d] : 0.0f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float pk = __shfl_sync(0xffffffffu, pj[j], kk);
#pragma unroll
                for (int d = 0; d < DPL; d++) o[j][d] += pk * vrow[d];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int qi = warp + 4 * j;
        if (!active[j]) continue;
        const int p = pos[j];
        if (p >= n) { // a candidate also sees itself
            const int64_t row = (tile.seq_row + p) * ldkv + col;
            float part = 0.0f;
#pragma unroll
            for (int d = 0; d < DPL; d++) {
                const int e = lane + 32 * d;
                if (e < dh) part += qs[qi * dh + e] * to_f(k[row + e]);
            }
            const float s = warp_sum(part);
            const float m_new = rescale<DPL>(m[j], l[j], o[j], s);
            const float ps = __expf(s - m_new);
            l[j] += ps;
#pragma unroll
            for (int d = 0; d < DPL; d++) {
                const int e = lane + 32 * d;
                if (e < dh) o[j][d] += ps * to_f(v[row + e]);
            }
        }
        const float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f; // no visible key: zeros, never NaN
#pragma unroll
        for (int d = 0; d < DPL; d++) {
            const int e = lane + 32 * d;
            if (e < dh) out[(tile.q_row + qi) * ldo + col + e] = from_f<T>(o[j][d] * inv);
        }
    }
}

template <typename T> flame_status fl_cuda_attention(const fl_attn_args<T> &a, cudaStream_t s)
{
    const fl_attn_tile *tiles = a.tiles;
    const int64_t num_tiles = a.num_tiles, ldq = a.ldq, ldkv = a.ldkv, ldo = a.ldo;
    const int32_t *qpos = a.qpos;
    const int32_t heads = a.heads, dh = a.dh, tile_q = a.tile_q;
    const T *q = a.q, *k = a.k, *v = a.v;
    T *out = a.out;
    if (num_tiles == 0) return FLAME_OK;
    if (heads <= 0 || heads > 65535) return fl_error(FLAME_ERR_INVALID_ARG, "CUDA attention: %d heads (1..65535)", heads);
    if (tile_q == FL_ATTN_QT_WG) {
        if constexpr (!std::is_same<T, float>::value)
            return fl_cuda_attention_wg<T>(tiles, num_tiles, qpos, heads, dh, q, ldq, k, v, ldkv, out, ldo, s,
                                           FL_WG_DEFAULT, 0, a.work);
        return fl_error(FLAME_ERR_UNSUPPORTED, "CUDA attention: tiles of %d queries need fp16 or bf16", tile_q);
    }
    if (tile_q != FL_ATTN_QT)
        return fl_error(FLAME_ERR_INVALID_ARG, "CUDA attention: tiles of %d queries (%d or %d)", tile_q, FL_ATTN_QT,
                        FL_ATTN_QT_WG);
    if constexpr (!std::is_same<T, float>::value)
        if (fl_cuda_attention_tc_fits<T>(dh, q, ldq, k, v, ldkv, out, ldo))
            return fl_cuda_attention_tc<T>(tiles, num_tiles, qpos, heads, dh, q, ldq, k, v, ldkv, out, ldo, s, a.max_keys);
    if (dh > 128) return fl_error(FLAME_ERR_UNSUPPORTED, "CUDA attention supports head dims up to 128, not %d", dh);
    const size_t smem = sizeof(float) * ((size_t)FL_ATTN_QT * dh + (size_t)KT * (dh + 1) + (size_t)KT * dh);
    const float scale = 1.0f / sqrtf((float)dh);
    const dim3 grid((unsigned)num_tiles, (unsigned)heads);
    if (dh <= 32)
        attn_kernel<T, 1><<<grid, 128, smem, s>>>(tiles, qpos, dh, scale, q, ldq, k, v, ldkv, out, ldo);
    else if (dh <= 64)
        attn_kernel<T, 2><<<grid, 128, smem, s>>>(tiles, qpos, dh, scale, q, ldq, k, v, ldkv, out, ldo);
    else
        attn_kernel<T, 4><<<grid, 128, smem, s>>>(tiles, qpos, dh, scale, q, ldq, k, v, ldkv, out, ldo);
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}

int32_t fl_cuda_attention_tile_queries(int32_t elem_bytes, int32_t dh, int64_t queries, int32_t heads)
{
    if (elem_bytes != 2 || (dh != 64 && dh != 128) || !fl_cuda_attention_wg_device()) return FL_ATTN_QT;
    // 128-query CTAs win from about a third of the GPU's 132 SMs on (H200: 72 CTAs 22 us
    // against 28 us for 16-query tiles); below, 16-query tiles spread a small problem wider
    // (24 CTAs: 9.4 us against 8.7)
    const int64_t ctas = (queries + FL_ATTN_QT_WG - 1) / FL_ATTN_QT_WG * heads;
    return ctas >= 48 ? FL_ATTN_QT_WG : FL_ATTN_QT;
}

#define INSTANTIATE(T)                                                                                         \
    template flame_status fl_cuda_attention<T>(const fl_attn_args<T> &, cudaStream_t);
INSTANTIATE(float)
INSTANTIATE(__half)
INSTANTIATE(__nv_bfloat16)
