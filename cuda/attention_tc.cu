// SUMI attention on tensor cores for fp16/bf16, FlashAttention-2 style (Dao 2023,
// arXiv:2307.08691): one CTA owns one tile of 16 queries (FL_ATTN_QT) of one head; its SPLIT
// warps take turns over the visible history keys, 32 at a time (warp w: steps w, w + SPLIT,
// ...), so a long history is walked by several warps at once. Each warp computes S = Q K^T and
// O += P V with mma.sync m16n8k16 (float32 accumulation) and keeps an online softmax per row
// in registers (Milakov & Gimelshein 2018); P stays in registers, as the accumulator layout of
// S is the A-operand layout of P V. A candidate's own key is one extra scalar step (warp 0).
// The warps' partial results are merged in shared memory with the usual rescaling
// (flash-decoding: o = sum_w o_w 2^(m_w - M) / sum_w l_w 2^(m_w - M)).
//
// A launch too small to fill the GPU with long histories (a KV-cache hit: 128 candidates
// against 1,024 cached keys are 8 tiles a head) splits each tile's keys further, across a
// thread-block cluster of up to 8 CTAs, when each keeps at least two steps of keys (sm_90;
// Flash-Decoding, Dao et al. 2023, with the cluster's distributed shared memory in place of a
// workspace and a second launch): CTA z of the cluster takes key steps z * SPLIT + w, merges
// its warps, and the CTAs then merge their partial states, each writing a share of the tile's
// outputs, in a fixed order (the same bits on every run).
//
// Fragment layouts (PTX ISA, "mma.m16n8k16"): lane = 4 g + t. A (16x16, row major): a0 =
// (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..). B (16x8): b0 = (k
// 2t..2t+1, n g), b1 = (k 2t+8.., n g). C (16x8): c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..).
//
// Precision: Q, K, V are the compute dtype; scores and the softmax are float; P enters the
// P V product as fp16 (11-bit mantissa) for fp16, and for bf16 as the sum of two bf16 terms
// (hi + lo, 16 bits) so bf16 loses nothing to the 8-bit mantissa of P.
#include <math.h>

#include <cooperative_groups.h>
#include <type_traits>

#include "attention_tc.cuh"
#include "half_pairs.cuh"

namespace {
using namespace fl_half_pairs;

constexpr int KT = 32; // keys per step

template <typename T> __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <> __device__ __forceinline__ void mma<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8x8 16-bit matrices from shared memory, transposed (PTX "ldmatrix"): register k holds
// matrix k's elements (2t, g) and (2t + 1, g) for lane 4g + t.
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void *p)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}


// Running softmax state of one query row, as one lane of its quad holds it.
struct row_state {
    float m = -INFINITY; // max score so far (log2 domain)
    float l = 0.0f;      // this lane's part of the sum of exp2(s - m)
    int nvis = 0;        // visible history keys
    int pos = -1;        // position in the sequence, -1 for a padding row
};

// Raises the row max to include `mx`; returns the factor that rescales the old sums, and in
// `base` the max to subtract (0 while nothing is visible, so exp2(-inf - base) = 0, never NaN).
__device__ __forceinline__ float raise_max(row_state &r, float mx, float &base)
{
    const float m_new = fmaxf(r.m, mx);
    base = m_new == -INFINITY ? 0.0f : m_new;
    const float alpha = fast_exp2(r.m - base); // r.m = -inf: 0
    r.m = m_new;
    return alpha;
}

// Warps per tile: 4 for head dims up to 64, 2 above (the staged keys fit in the default 48 KiB
// of shared memory). A launch of fewer tiles than the GPU has SMs (a few queries against a long
// history, as re-scoring a cached user is) takes twice as many: each SM then holds one CTA, and
// more warps walking its keys is the only parallelism there is.
template <int DH> __host__ __device__ constexpr int split_of() { return DH <= 64 ? 4 : 2; }
template <int DH> __host__ __device__ constexpr int wide_split_of() { return 2 * split_of<DH>(); }
constexpr int MAX_CLUSTER = 8; // CTAs a tile's keys are split across (the portable cluster size)
// Shared memory: the staged keys, reused for the warps' partial states [SPLIT][16][DH + 2] and,
// in a cluster, the CTA's merged state [16][DH + 2] after them.
template <typename T, int DH, int SPLIT> constexpr size_t smem_of()
{
    const size_t staging = (size_t)SPLIT * 2 * KT * (DH + 8) * sizeof(T);
    const size_t merge = (size_t)(SPLIT + 1) * FL_ATTN_QT * (DH + 2) * sizeof(float);
    return staging > merge ? staging : merge;
}

template <typename T, int DH, int SPLIT>
__global__ void __launch_bounds__(32 * SPLIT)
    attn_tc_kernel(const fl_attn_tile *tiles, const int32_t *qpos, float scale_log2, const T *q, int64_t ldq,
                   const T *k, const T *v, int64_t ldkv, T *out, int64_t ldo)
{
    constexpr int DHP = DH + 8;     // smem row stride in elements: rows start 4 banks apart
    constexpr int NT_O = DH / 8;    // output n-tiles
    constexpr int KS = DH / 16;     // k-steps of Q K^T
    constexpr int CH = DH / 8;      // 16-byte chunks per row
    constexpr int BATCH = CH <= 8 ? CH : CH / 2; // chunks per lane loaded together: KT * CH / 32 = CH per lane
    static_assert(CH % BATCH == 0, "whole batches");
    constexpr bool is_half = std::is_same<T, __half>::value;
    extern __shared__ uint4 smem_tc[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    T *ks = reinterpret_cast<T *>(smem_tc) + (size_t)warp * 2 * KT * DHP;
    T *vs = ks + KT * DHP;
    const fl_attn_tile tile = tiles[blockIdx.x];
    const int64_t col = (int64_t)blockIdx.y * DH;
    const int n = tile.n_hist;

    row_state rs[2]; // rows g and g + 8
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = g + 8 * i;
        if (r < tile.nq) {
            rs[i].pos = tile.qpos_idx < 0 ? tile.pos0 + r : qpos[tile.qpos_idx + r];
            rs[i].nvis = rs[i].pos < n ? rs[i].pos + 1 : n;
        }
    }
    const int p_last = tile.qpos_idx < 0 ? tile.pos0 + tile.nq - 1 : qpos[tile.qpos_idx + tile.nq - 1];
    const int kend = p_last < n ? p_last + 1 : n; // positions ascend within a tile
    const int p_first = tile.qpos_idx < 0 ? tile.pos0 : qpos[tile.qpos_idx];
    const int nvis_first = p_first < n ? p_first + 1 : n; // the fewest keys any row of the tile sees

    // Q as A fragments, straight from global memory (read once); padding rows are zeros
    uint32_t qa[KS][4];
    const T *q0 = q + (tile.q_row + g) * ldq + col + 2 * t, *q8 = q0 + 8 * ldq;
    const bool r0 = g < tile.nq, r8 = g + 8 < tile.nq;
#pragma unroll
    for (int s = 0; s < KS; s++) {
        qa[s][0] = r0 ? *reinterpret_cast<const uint32_t *>(q0 + 16 * s) : 0u;
        qa[s][1] = r8 ? *reinterpret_cast<const uint32_t *>(q8 + 16 * s) : 0u;
        qa[s][2] = r0 ? *reinterpret_cast<const uint32_t *>(q0 + 16 * s + 8) : 0u;
        qa[s][3] = r8 ? *reinterpret_cast<const uint32_t *>(q8 + 16 * s + 8) : 0u;
    }
    float o[NT_O][4];
#pragma unroll
    for (int j = 0; j < NT_O; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

    // key steps: warp w of cluster rank z takes z * SPLIT + w, then every (CTAs x SPLIT)-th
    const int z = (int)blockIdx.z, nz = (int)gridDim.z;
    for (int kb = (z * SPLIT + warp) * KT; kb < kend; kb += nz * SPLIT * KT) {
        // stage K and V rows kb..kb+KT-1 (rows past kend as zeros: 0 * garbage could be NaN);
        // up to 8 chunks of each per lane are loaded before any is stored, so their memory
        // latencies overlap instead of adding up
#pragma unroll
        for (int c0 = 0; c0 < KT * CH; c0 += 32 * BATCH) {
            uint4 kv[BATCH], vv[BATCH];
#pragma unroll
            for (int u = 0; u < BATCH; u++) {
                const int c = c0 + 32 * u + lane, r = c / CH, e = (c % CH) * 8;
                kv[u] = vv[u] = make_uint4(0, 0, 0, 0);
                if (kb + r < kend) {
                    const int64_t off = (tile.seq_row + kb + r) * ldkv + col + e;
                    kv[u] = *reinterpret_cast<const uint4 *>(k + off);
                    vv[u] = *reinterpret_cast<const uint4 *>(v + off);
                }
            }
#pragma unroll
            for (int u = 0; u < BATCH; u++) {
                const int c = c0 + 32 * u + lane, r = c / CH, e = (c % CH) * 8;
                *reinterpret_cast<uint4 *>(ks + r * DHP + e) = kv[u];
                *reinterpret_cast<uint4 *>(vs + r * DHP + e) = vv[u];
            }
        }
        __syncwarp();
        // S = Q K^T for 16 rows x 32 keys (4 n-tiles of 8 keys)
        float sc[KT / 8][4];
#pragma unroll
        for (int j = 0; j < KT / 8; j++) {
            sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
            const T *kr = ks + (j * 8 + g) * DHP + 2 * t;
#pragma unroll
            for (int s = 0; s < KS; s++)
                mma<T>(sc[j], qa[s], *reinterpret_cast<const uint32_t *>(kr + 16 * s),
                       *reinterpret_cast<const uint32_t *>(kr + 16 * s + 8));
        }
        // mask (key visible iff key < nvis of the row) unless the step is wholly visible to the
        // tile's first (least-seeing) row; padding rows need no mask, they are never written
        float mx[2] = {-INFINITY, -INFINITY};
        const bool full = kb + KT <= nvis_first;
#pragma unroll
        for (int j = 0; j < KT / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = kb + j * 8 + 2 * t + (e & 1), i = e >> 1;
                if (!full && key >= rs[i].nvis) sc[j][e] = -INFINITY;
                mx[i] = fmaxf(mx[i], sc[j][e]);
            }
        float base[2], alpha[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            alpha[i] = raise_max(rs[i], quad_max(mx[i]) * scale_log2, base[i]); // scale > 0: max commutes
            rs[i].l *= alpha[i];
        }
#pragma unroll
        for (int j = 0; j < NT_O; j++) {
            o[j][0] *= alpha[0];
            o[j][1] *= alpha[0];
            o[j][2] *= alpha[1];
            o[j][3] *= alpha[1];
        }
        uint32_t pa[KT / 16][4], pl[KT / 16][4]; // P as A fragments (hi, and lo for bf16)
#pragma unroll
        for (int j = 0; j < KT / 8; j++) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                p[e] = fast_exp2(fmaf(sc[j][e], scale_log2, -base[e >> 1]));
                rs[e >> 1].l += p[e];
            }
            // n-tile j of S is half of k-step j/2 of P: c0,c1 -> a0 (or a2), c2,c3 -> a1 (or a3)
            const int s = j >> 1, h = (j & 1) * 2;
            pa[s][h] = pack<T>(p[0], p[1]);
            pa[s][h + 1] = pack<T>(p[2], p[3]);
            if (!is_half) {
                const float2 hi0 = unpack<T>(pa[s][h]), hi1 = unpack<T>(pa[s][h + 1]);
                pl[s][h] = pack<T>(p[0] - hi0.x, p[1] - hi0.y);
                pl[s][h + 1] = pack<T>(p[2] - hi1.x, p[3] - hi1.y);
            }
        }
        // O += P V: B = V (k = key, n = dim), b0 = keys 2t, 2t+1 of column g. One transposing
        // ldmatrix.x4 gives b0, b1 of two n-tiles: matrices (keys +0, dims +0), (keys +8, dims
        // +0), (keys +0, dims +8), (keys +8, dims +8); lane i addresses row i % 8 of matrix i / 8
#pragma unroll
        for (int s = 0; s < KT / 16; s++)
#pragma unroll
            for (int j = 0; j < NT_O; j += 2) {
                const int mi = lane >> 3;
                uint32_t b[4];
                ldsm_x4_trans(b, vs + (16 * s + (mi & 1) * 8 + (lane & 7)) * DHP + 8 * j + (mi >> 1) * 8);
                mma<T>(o[j], pa[s], b[0], b[1]);
                mma<T>(o[j + 1], pa[s], b[2], b[3]);
                if (!is_half) {
                    mma<T>(o[j], pl[s], b[0], b[1]);
                    mma<T>(o[j + 1], pl[s], b[2], b[3]);
                }
            }
        __syncwarp(); // the next step overwrites the staged rows
    }

    // a candidate also sees its own key: one more softmax step with that single score (warp 0
    // of the cluster's first CTA)
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const bool self = warp == 0 && z == 0 && rs[i].pos >= n; // padding rows have pos -1
        const int64_t row = (tile.seq_row + (self ? rs[i].pos : 0)) * ldkv + col + 2 * t;
        float part = 0.0f;
        if (self)
#pragma unroll
            for (int s = 0; s < KS; s++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const float2 qv = unpack<T>(qa[s][2 * h + i]);
                    const float2 kv = unpack<T>(*reinterpret_cast<const uint32_t *>(k + row + 16 * s + 8 * h));
                    part += qv.x * kv.x + qv.y * kv.y;
                }
        const float sself = quad_sum(part) * scale_log2; // every lane takes part in the shuffles
        if (!self) continue;
        float b;
        const float alpha = raise_max(rs[i], sself, b);
        const float ps = fast_exp2(sself - b);
        rs[i].l = rs[i].l * alpha + (t == 0 ? ps : 0.0f); // counted once per quad
#pragma unroll
        for (int j = 0; j < NT_O; j++) {
            const float2 vv = unpack<T>(*reinterpret_cast<const uint32_t *>(v + row + 8 * j));
            o[j][2 * i] = o[j][2 * i] * alpha + ps * vv.x;
            o[j][2 * i + 1] = o[j][2 * i + 1] * alpha + ps * vv.y;
        }
    }
    // merge the warps' partial softmax states: [SPLIT][16][DH] sums, then m and l per row
    __syncthreads(); // every warp is done with its staged keys
    float *ob = reinterpret_cast<float *>(smem_tc), *mb = ob + SPLIT * FL_ATTN_QT * DH, *lb = mb + SPLIT * FL_ATTN_QT;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = warp * FL_ATTN_QT + g + 8 * i;
        const float l = quad_sum(rs[i].l);
        if (t == 0) {
            mb[r] = rs[i].m;
            lb[r] = l;
        }
#pragma unroll
        for (int j = 0; j < NT_O; j++)
            *reinterpret_cast<float2 *>(ob + r * DH + 8 * j + 2 * t) = make_float2(o[j][2 * i], o[j][2 * i + 1]);
    }
    __syncthreads();
    // the CTA's state per row: alone, the output; in a cluster, (o, m, l) for the cluster merge
    float *cob = lb + SPLIT * FL_ATTN_QT, *cmb = cob + FL_ATTN_QT * DH, *clb = cmb + FL_ATTN_QT;
    for (int idx = threadIdx.x; idx < tile.nq * (DH / 2); idx += 32 * SPLIT) {
        const int r = idx / (DH / 2), c = 2 * (idx % (DH / 2));
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < SPLIT; w++) mx = fmaxf(mx, mb[w * FL_ATTN_QT + r]);
        float l = 0.0f, o0 = 0.0f, o1 = 0.0f;
        if (mx != -INFINITY)
#pragma unroll
            for (int w = 0; w < SPLIT; w++) {
                const int wr = w * FL_ATTN_QT + r;
                const float f = fast_exp2(mb[wr] - mx); // a warp that saw no key: 0
                const float2 ov = *reinterpret_cast<const float2 *>(ob + wr * DH + c);
                l += lb[wr] * f;
                o0 += ov.x * f;
                o1 += ov.y * f;
            }
        if (nz > 1) {
            *reinterpret_cast<float2 *>(cob + r * DH + c) = make_float2(o0, o1);
            if (c == 0) cmb[r] = mx, clb[r] = l;
            continue;
        }
        const float inv = l > 0.0f ? 1.0f / l : 0.0f; // no visible key: zeros, never NaN
        *reinterpret_cast<uint32_t *>(out + (tile.q_row + r) * ldo + col + c) = pack<T>(o0 * inv, o1 * inv);
    }
    if (nz == 1) return;
#if __CUDA_ARCH__ >= 900
    // merge the cluster's CTAs through distributed shared memory; rank z writes every nz-th pair
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync(); // every CTA's state is in its shared memory
    // (a CTA's state is one mapa away: mapped in the loops, not kept in an indexed array, which
    // would live in local memory)
    for (int idx = z * 32 * SPLIT + threadIdx.x; idx < tile.nq * (DH / 2); idx += nz * 32 * SPLIT) {
        const int r = idx / (DH / 2), c = 2 * (idx % (DH / 2));
        float mx = -INFINITY;
        for (int w = 0; w < nz; w++) mx = fmaxf(mx, cluster.map_shared_rank(cmb, w)[r]);
        float l = 0.0f, o0 = 0.0f, o1 = 0.0f;
        if (mx != -INFINITY)
            for (int w = 0; w < nz; w++) {
                const float f = fast_exp2(cluster.map_shared_rank(cmb, w)[r] - mx);
                const float2 ov = *reinterpret_cast<const float2 *>(cluster.map_shared_rank(cob, w) + r * DH + c);
                l += cluster.map_shared_rank(clb, w)[r] * f;
                o0 += ov.x * f;
                o1 += ov.y * f;
            }
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        *reinterpret_cast<uint32_t *>(out + (tile.q_row + r) * ldo + col + c) = pack<T>(o0 * inv, o1 * inv);
    }
    cluster.sync(); // no CTA exits while another still reads its shared memory
#else
    __trap(); // the host launches clusters only on compute capability 9.0 and later
#endif
}

template <typename T, int DH>
flame_status launch(const fl_attn_tile *tiles, int64_t num_tiles, const int32_t *qpos, int32_t heads,
                    float scale_log2, const T *q, int64_t ldq, const T *k, const T *v, int64_t ldkv, T *out,
                    int64_t ldo, bool wide, int64_t most, int64_t max_keys, cudaStream_t s)
{
    constexpr int SPLIT = split_of<DH>(), WIDE = wide_split_of<DH>();
    static_assert(smem_of<T, DH, SPLIT>() <= 48 * 1024, "the default shared-memory limit");
    static_assert(smem_of<T, DH, WIDE>() <= 227 * 1024, "shared memory of one CTA");
    if (!wide) {
        const dim3 grid((unsigned)num_tiles, (unsigned)heads);
        attn_tc_kernel<T, DH, SPLIT><<<grid, 32 * SPLIT, smem_of<T, DH, SPLIT>(), s>>>(tiles, qpos, scale_log2, q, ldq,
                                                                                      k, v, ldkv, out, ldo);
        return FLAME_OK;
    }
    constexpr int smem = (int)smem_of<T, DH, WIDE>();
    // above the default 48 KiB; set on every launch, as the attribute is per device
    FL_CUDA_TRY(cudaFuncSetAttribute(attn_tc_kernel<T, DH, WIDE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    // a tile's CTAs along z, one cluster (z = 1: an ordinary launch): at most `most`, and each
    // keeps at least two steps of its warps' keys (WIDE * KT a step)
    const int64_t steps = (max_keys + WIDE * KT - 1) / (WIDE * KT);
    int64_t cluster = steps / 2 < most ? steps / 2 : most;
    if (cluster < 1) cluster = 1;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = (unsigned)cluster;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)num_tiles, (unsigned)heads, (unsigned)cluster);
    cfg.blockDim = dim3(32 * WIDE);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = cluster > 1 ? &attr : nullptr;
    cfg.numAttrs = cluster > 1 ? 1 : 0;
    FL_CUDA_TRY(cudaLaunchKernelEx(&cfg, attn_tc_kernel<T, DH, WIDE>, tiles, qpos, scale_log2, q, ldq, k, v, ldkv,
                                   out, ldo));
    return FLAME_OK;
}

} // namespace

template <typename T>
bool fl_cuda_attention_tc_fits(int32_t dh, const T *q, int64_t ldq, const T *k, const T *v, int64_t ldkv,
                               const T *out, int64_t ldo)
{
    const uintptr_t kv_bits = (uintptr_t)k | (uintptr_t)v, qo_bits = (uintptr_t)q | (uintptr_t)out;
    return dh % 16 == 0 && dh <= 128 && ldkv % 8 == 0 && kv_bits % 16 == 0 && ldq % 2 == 0 && ldo % 2 == 0 &&
           qo_bits % 4 == 0;
}

template <typename T>
flame_status fl_cuda_attention_tc(const fl_attn_tile *tiles, int64_t num_tiles, const int32_t *qpos, int32_t heads,
                                  int32_t dh, const T *q, int64_t ldq, const T *k, const T *v, int64_t ldkv, T *out,
                                  int64_t ldo, cudaStream_t s, int64_t max_keys)
{
    if (num_tiles == 0) return FLAME_OK;
    if (!fl_cuda_attention_tc_fits<T>(dh, q, ldq, k, v, ldkv, out, ldo))
        return fl_error(FLAME_ERR_UNSUPPORTED, "tensor-core attention: head dim %d or the row strides do not fit", dh);
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)dh); // softmax in base 2
    int device = 0, sms = 0;
    FL_CUDA_TRY(cudaGetDevice(&device));
    FL_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    int cc_major = 0;
    FL_CUDA_TRY(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device));
    const int64_t ctas = num_tiles * heads;
    const bool wide = ctas < sms;
    // fewer CTAs than SMs: twice the warps a tile and, on sm_90 and later, each tile's keys
    // split across a cluster of as many CTAs as keep the launch within one wave, each CTA
    // keeping at least two steps of keys (launch). Measured on an H200 (docs/benchmarks.md), 128
    // candidates of one user: clusters of 2 take 21 us against 30 over 4,096 keys, and 18
    // against 24 over 1,024 at head dim 128, but 11.3 against 10.7 over 256 keys at head dim 128
    // (two steps split in one each: the merge costs more than the halved walk saves).
    const int64_t most = wide && cc_major >= 9 ? (sms / ctas < MAX_CLUSTER ? sms / ctas : MAX_CLUSTER) : 1;
    flame_status st = FLAME_OK;
#define TC_LAUNCH(D)                                                                                           \
    st = launch<T, D>(tiles, num_tiles, qpos, heads, scale_log2, q, ldq, k, v, ldkv, out, ldo, wide, most,        \
                      max_keys, s)
    switch (dh / 16) {
    case 1: TC_LAUNCH(16); break;
    case 2: TC_LAUNCH(32); break;
    case 3: TC_LAUNCH(48); break;
    case 4: TC_LAUNCH(64); break;
    case 5: TC_LAUNCH(80); break;
    case 6: TC_LAUNCH(96); break;
    case 7: TC_LAUNCH(112); break;
    default: TC_LAUNCH(128); break;
    }
#undef TC_LAUNCH
    FL_TRY(st);
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}

#define INSTANTIATE(T)                                                                                         \
    template bool fl_cuda_attention_tc_fits<T>(int32_t, const T *, int64_t, const T *, const T *, int64_t,      \
                                               const T *, int64_t);                                            \
    template flame_status fl_cuda_attention_tc<T>(const fl_attn_tile *, int64_t, const int32_t *, int32_t,      \
                                                  int32_t, const T *, int64_t, const T *, const T *, int64_t, T *, \
                                                  int64_t, cudaStream_t, int64_t);
INSTANTIATE(__half)
INSTANTIATE(__nv_bfloat16)
