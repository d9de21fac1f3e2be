// SUMI attention for Hopper (sm_90a), fp16/bf16, head dims 64 and 128: warpgroup MMA (wgmma)
// in the FlashAttention-3 layout (Shah et al. 2024, arXiv:2407.08608). One CTA owns 128
// queries of one (sequence, head): two warpgroups of 64 rows share key/value blocks of BN rows
// staged in shared memory while earlier blocks are used. Two ways of staging: lock-step (all
// threads copy block i + 1 while block i is used, two CTA barriers per block) and
// warp-specialised (a third warpgroup copies blocks three deep and signals them on mbarriers;
// the consumers release each stage and run at their own pace, optionally taking turns issuing
// QK^T, or overlapping each block's softmax with the previous block's P V product; the last
// also persistent, one CTA an SM taking (tile, head) items in turn).
// fl_cuda_attention_wg picks by head dim, CTA count and whether the caller gave work counters
// (measured, docs/benchmarks.md).
//
//   S = Q K^T : wgmma m64nBNk16, A = Q and B = K from shared memory (both K-major);
//   softmax   : online, in registers, base 2 with the scale folded into the exponent;
//   O += P V  : wgmma m64nDHk16, A = P from registers (the S accumulator layout is the A
//               fragment layout, converted to 16 bits in place), B = V from shared memory read
//               N-major (V's rows are keys, contiguous along the head dim).
//
// Every tile in shared memory is stored in the 128-byte swizzle the tensor cores read: rows of
// 64 values (128 bytes), 16-byte chunk c of row r at chunk c ^ (r % 8), 8-row atoms of 1024
// bytes; a head dim of 128 is two such column blocks. Staging is cp.async (16-byte, rows past
// the last visible key zero-filled), then fence.proxy.async so the tensor cores (async proxy)
// see the ordinary-proxy writes; in the TMA variants the producer's one thread has the tensor
// memory accelerator copy each whole key block (every row visible to some query of the tile)
// in [BN][64] boxes that land in this swizzle, and only the block holding the last visible key
// goes through cp.async.
//
// SUMI by block skipping: a tile's rows see keys [0, nvis) with nvis = pos + 1 for history rows
// and n_hist for candidates; a warpgroup walks blocks up to its last row's nvis and masks only
// blocks that cross its first row's nvis (the diagonal block, or a candidate tile's partial
// last block). Candidate-candidate blocks are never computed: a candidate's own key is one
// extra scalar score per row (CUDA cores) folded into the softmax before normalising.
//
// Order: item i is (tile, head) by item_order, with heads outermost (tile i % num_tiles of head
// i / num_tiles) for head dim 128 and innermost for 64; CTA i computes it, or a persistent CTA
// takes it in its turn. The tile list is sorted longest
// first over the whole batch, so with heads outermost the CTAs running at once work on one
// head, and a sequence's K/V blocks, read by each of its tiles, stay in L2 between those reads
// while the head's K/V of the batch (rows x DH x 4 bytes) fits there; with heads innermost
// consecutive CTAs took eight different heads of one tile, and K/V came from DRAM about once
// per tile length (L2 hit rate 40% at B32 L1024 M512 Dh128).
//
// Precision: scores and softmax in float32; P enters P V rounded to the input dtype (bf16: 8
// bits of mantissa, as FlashAttention and cuDNN do), accumulation in float32.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <type_traits>

#include <cuda.h> // CUtensorMap and its enums (the encoder is found at run time: no link to libcuda)
#include <cudaTypedefs.h>

#include "attention_wgmma.cuh"
#include "attention_wgmma_ops.cuh"
#include "half_pairs.cuh"

namespace {
using namespace fl_half_pairs;

constexpr int QT = FL_ATTN_QT_WG;   // queries per CTA
constexpr int THREADS = 2 * 128;    // two warpgroups of 64 query rows

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FL_WG_DEVICE 1
#endif

template <typename T, int N> struct mma;
template <> struct mma<__nv_bfloat16, 64> {
    template <int TB> static __device__ __forceinline__ void ss(float (&d)[32], uint64_t a, uint64_t b, int acc) { wg::ss_bf16_n64<TB>(d, a, b, acc); }
    template <int TB> static __device__ __forceinline__ void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int acc) { wg::rs_bf16_n64<TB>(d, a, b, acc); }
};
template <> struct mma<__nv_bfloat16, 128> {
    template <int TB> static __device__ __forceinline__ void ss(float (&d)[64], uint64_t a, uint64_t b, int acc) { wg::ss_bf16_n128<TB>(d, a, b, acc); }
    template <int TB> static __device__ __forceinline__ void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int acc) { wg::rs_bf16_n128<TB>(d, a, b, acc); }
};
template <> struct mma<__half, 64> {
    template <int TB> static __device__ __forceinline__ void ss(float (&d)[32], uint64_t a, uint64_t b, int acc) { wg::ss_f16_n64<TB>(d, a, b, acc); }
    template <int TB> static __device__ __forceinline__ void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int acc) { wg::rs_f16_n64<TB>(d, a, b, acc); }
};
template <> struct mma<__half, 128> {
    template <int TB> static __device__ __forceinline__ void ss(float (&d)[64], uint64_t a, uint64_t b, int acc) { wg::ss_f16_n128<TB>(d, a, b, acc); }
    template <int TB> static __device__ __forceinline__ void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int acc) { wg::rs_f16_n128<TB>(d, a, b, acc); }
};

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// keeps the compiler from touching accumulators across the asynchronous MMA
template <int N> __device__ __forceinline__ void fence_regs(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// Shared-memory matrix descriptor (PTX "wgmma" matrix descriptor): start address, leading and
// stride byte offsets (16-byte units), 128-byte swizzle. Atoms are 1024-byte aligned, so the
// base-offset field stays 0; a k-step inside a 128-byte row moves the start address only.
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | ((uint64_t)1 << 62);
}

// The descriptor d moved on by `bytes` (a k-step, a stage): only the address field, bits 0-13 in
// 16-byte units, changes, and without a carry out of it (every tile lies below 256 KiB), so one
// 32-bit add of the low word does it instead of building the descriptor again.
__device__ __forceinline__ uint64_t desc_plus(uint64_t d, uint32_t bytes)
{
    return ((d >> 32) << 32) | (uint32_t)((uint32_t)d + (bytes >> 4));
}

// Byte offset of row r, 16-byte chunk c (of DH / 8) in a swizzled [rows][DH] tile.
__device__ __forceinline__ uint32_t swz(int rows, int r, int c)
{
    return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

__device__ __forceinline__ void cp16(uint32_t dst, const void *src, bool ok)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp16_all(uint32_t dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }



// Thread tid's warpgroup, through a shuffle from lane 0: the compiler then knows it is
// warp-uniform and builds the matrix descriptors that depend on it in uniform registers.
__device__ __forceinline__ int warpgroup_of(int tid) { return __shfl_sync(~0u, tid >> 7, 0); }

// Which (tile, head) CTA `item` computes: heads outermost (head_major) or innermost (see Order
// at the top).
struct item_order {
    int32_t num_tiles, heads, head_major;
    __device__ __forceinline__ int64_t tile(int64_t item) const { return head_major ? item % num_tiles : item / heads; }
    __device__ __forceinline__ int64_t head(int64_t item) const { return head_major ? item / num_tiles : item % heads; }
};

template <int DH, int BN, int STAGES> struct layout {
    static constexpr int Q_BYTES = QT * DH * 2;
    static constexpr int KV_BYTES = BN * DH * 2; // one of K or V, one stage
    static constexpr int BAR = Q_BYTES + 2 * STAGES * KV_BYTES; // mbarriers (warp-specialised kernels)
    // the overlapped kernel's two item slots, after the Q tile's two mbarriers (the 144 bytes
    // are reserved by every kernel: one layout, no unused members)
    static constexpr int SLOTS = BAR + 16 * STAGES + 16;
    static constexpr int SMEM = SLOTS + 2 * 64 + 1024; // + slack to align to 1024
};

// What one thread knows of its tile: its two rows (i = 0: row g, 1: row g + 8 of its warp's
// 16), their positions and visible key counts, and its warpgroup's key span.
struct tile_rows {
    int pos[2], nvis[2];
    bool valid[2];
    int kend;    // keys the tile's last row sees (positions ascend within a tile)
    int wg_kend; // keys the warpgroup's last row sees: blocks from there on are skipped
    int wg_full; // keys every row of the warpgroup sees: blocks below need no mask
};

// Position of the tile's query r.
__device__ __forceinline__ int query_pos(const fl_attn_tile &tile, const int32_t *qpos, int r)
{
    return tile.qpos_idx < 0 ? tile.pos0 + r : qpos[tile.qpos_idx + r];
}

// Keys the query at position p sees: the history up to itself, or all of it (a candidate).
__device__ __forceinline__ int keys_seen(const fl_attn_tile &tile, int p) { return p < tile.n_hist ? p + 1 : tile.n_hist; }

__device__ __forceinline__ tile_rows rows_of(const fl_attn_tile &tile, const int32_t *qpos, int wg, int warp, int g)
{
    auto pos_of = [&](int r) { return query_pos(tile, qpos, r); };
    auto nvis_of = [&](int p) { return keys_seen(tile, p); };
    tile_rows tr;
    tr.kend = nvis_of(pos_of(tile.nq - 1));
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = wg * 64 + warp * 16 + g + 8 * i;
        tr.valid[i] = r < tile.nq;
        tr.pos[i] = tr.valid[i] ? pos_of(r) : -1;
        tr.nvis[i] = tr.valid[i] ? nvis_of(tr.pos[i]) : 0;
    }
    const int first = wg * 64, last = min(tile.nq, wg * 64 + 64) - 1;
    tr.wg_kend = first <= last ? nvis_of(pos_of(last)) : 0;
    tr.wg_full = first <= last ? nvis_of(pos_of(first)) : 0;
    return tr;
}

// rows_of with the spans known (item_slot): only the thread's own rows' positions are read.
__device__ __forceinline__ tile_rows rows_of_spans(const fl_attn_tile &tile, const int32_t *qpos, int wg, int warp,
                                                   int g, int kend, int wg_kend, int wg_full)
{
    tile_rows tr;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = wg * 64 + warp * 16 + g + 8 * i;
        tr.valid[i] = r < tile.nq;
        tr.pos[i] = tr.valid[i] ? query_pos(tile, qpos, r) : -1;
        tr.nvis[i] = tr.valid[i] ? keys_seen(tile, tr.pos[i]) : 0;
    }
    tr.kend = kend;
    tr.wg_kend = wg_kend;
    tr.wg_full = wg_full;
    return tr;
}

// Online softmax state of a thread's two rows and its part of their output.
template <int DH> struct row_acc {
    float o[DH / 2];
    float m[2], l[2]; // max (log2 domain, scaled) and this lane's part of the sum of exp2
    __device__ __forceinline__ void init()
    {
#pragma unroll
        for (int j = 0; j < DH / 2; j++) o[j] = 0.0f;
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.0f;
    }
};

// S = Q K^T for the warpgroup's 64 rows against one key block (qa: the warpgroup's Q rows,
// kd: the block's K), issued and committed, not waited for.
template <typename T, int DH, int BN>
__device__ __forceinline__ void issue_s(float (&s)[BN / 2], uint32_t qa, uint32_t kd)
{
    const uint64_t qd0 = desc(qa, 16, 1024), kd0 = desc(kd, 16, 1024);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < DH / 16; kk++)
        mma<T, BN>::template ss<0>(s, desc_plus(qd0, (kk >> 2) * QT * 128 + (kk & 3) * 32),
                                   desc_plus(kd0, (kk >> 2) * BN * 128 + (kk & 3) * 32), kk > 0);
    wg_commit();
}

// Softmax of the scores of one block (S complete in registers), in place: s then holds the
// unnormalised probabilities exp2(s * scale - m); the running max and sums are updated, and
// alpha is the factor the output must be rescaled by (the output itself is left alone: a P V
// product may still be accumulating into it). MASK: the block crosses the first row's visible
// keys (kb + BN > wg_full), so scores of keys a row does not see become -inf; the other blocks,
// most of a long history, take the form without the compares and selects (see softmax_any).
template <int DH, int BN, bool MASK>
__device__ __forceinline__ void softmax_s(row_acc<DH> &a, float (&s)[BN / 2], const tile_rows &tr, int kb, int t,
                                          float scale_log2, float (&alpha)[2])
{
    // accumulator element 4j + e: row g + 8 (e >> 1), key kb + 8j + 2t + (e & 1)
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = e >> 1;
            if (MASK && kb + 8 * j + 2 * t + (e & 1) >= tr.nvis[i]) s[4 * j + e] = -INFINITY;
            mx[i] = fmaxf(mx[i], s[4 * j + e]);
        }
    float sub[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const float m_new = fmaxf(a.m[i], quad_max(mx[i]) * scale_log2); // scale > 0: max commutes
        sub[i] = m_new == -INFINITY ? 0.0f : m_new; // nothing visible yet: exp2(-inf) = 0, never NaN
        alpha[i] = fast_exp2(a.m[i] - sub[i]);
        a.m[i] = m_new;
        a.l[i] *= alpha[i];
    }
#pragma unroll
    for (int j = 0; j < BN / 2; j++) {
        s[j] = fast_exp2(fmaf(s[j], scale_log2, -sub[(j >> 1) & 1]));
        a.l[(j >> 1) & 1] += s[j];
    }
}

// softmax_s in the form the block needs (warpgroup-uniform branch).
template <int DH, int BN>
__device__ __forceinline__ void softmax_any(row_acc<DH> &a, float (&s)[BN / 2], const tile_rows &tr, int kb, int t,
                                            float scale_log2, float (&alpha)[2])
{
    if (kb + BN > tr.wg_full)
        softmax_s<DH, BN, true>(a, s, tr, kb, t, scale_log2, alpha);
    else
        softmax_s<DH, BN, false>(a, s, tr, kb, t, scale_log2, alpha);
}

// The probabilities as the A operand of P V: n-tile j of S is half of k-step j / 2 of P,
// (c0, c1) -> a0 or a2, (c2, c3) -> a1 or a3.
template <typename T, int BN>
__device__ __forceinline__ void pack_p(const float (&s)[BN / 2], uint32_t (&p)[BN / 16][4])
{
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
        p[j >> 1][(j & 1) * 2] = pack<T>(s[4 * j], s[4 * j + 1]);
        p[j >> 1][(j & 1) * 2 + 1] = pack<T>(s[4 * j + 2], s[4 * j + 3]);
    }
}

template <typename T, int DH, int BN>
__device__ __forceinline__ void softmax_p(row_acc<DH> &a, float (&s)[BN / 2], const tile_rows &tr, int kb, int t,
                                          float scale_log2, uint32_t (&p)[BN / 16][4], float (&alpha)[2])
{
    softmax_any<DH, BN>(a, s, tr, kb, t, scale_log2, alpha);
    pack_p<T, BN>(s, p);
}

template <int DH> __device__ __forceinline__ void rescale(row_acc<DH> &a, const float (&alpha)[2])
{
#pragma unroll
    for (int j = 0; j < DH / 8; j++) {
        a.o[4 * j] *= alpha[0];
        a.o[4 * j + 1] *= alpha[0];
        a.o[4 * j + 2] *= alpha[1];
        a.o[4 * j + 3] *= alpha[1];
    }
}

// O += P V for one block (vd: the block's V), issued and committed, not waited for.
template <typename T, int DH, int BN>
__device__ __forceinline__ void issue_pv(row_acc<DH> &a, const uint32_t (&p)[BN / 16][4], uint32_t vd)
{
    fence_regs(a.o); // the rescaled accumulators and P are written before the fence
    const uint64_t vd0 = desc(vd, BN * 128, 1024);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < BN / 16; ks++) mma<T, DH>::template rs<1>(a.o, p[ks], desc_plus(vd0, ks * 16 * 128), 1);
    wg_commit();
}

// Softmax of one block, then O += P V (waited for).
template <typename T, int DH, int BN>
__device__ __forceinline__ void softmax_pv(row_acc<DH> &a, float (&s)[BN / 2], const tile_rows &tr, int kb, int t,
                                           uint32_t vd, float scale_log2)
{
    uint32_t p[BN / 16][4];
    float alpha[2];
    softmax_p<T, DH, BN>(a, s, tr, kb, t, scale_log2, p, alpha);
    rescale(a, alpha);
    issue_pv<T, DH, BN>(a, p, vd);
    wg_wait0();
    fence_regs(a.o);
}

// The rows normalised by their sums and written (a row with no visible key: zeros, never NaN).
template <typename T, int DH>
__device__ __forceinline__ void store_rows(const row_acc<DH> &a, const tile_rows &tr, const fl_attn_tile &tile, int row0,
                                           int t, T *out, int64_t ldo, int64_t col)
{
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; i++) { // both rows' shuffles before any store
        const float lsum = quad_sum(a.l[i]);
        inv[i] = lsum > 0.0f ? 1.0f / lsum : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (!tr.valid[i]) continue;
        T *orow = out + (tile.q_row + row0 + 8 * i) * ldo + col + 2 * t;
#pragma unroll
        for (int j = 0; j < DH / 8; j++)
            *reinterpret_cast<uint32_t *>(orow + 8 * j) = pack<T>(a.o[4 * j + 2 * i] * inv[i], a.o[4 * j + 2 * i + 1] * inv[i]);
    }
}

// A candidate also sees its own key: one more softmax step with that single score; then the
// rows are normalised and written.
template <typename T, int DH>
__device__ __forceinline__ void finish(row_acc<DH> &a, const tile_rows &tr, const fl_attn_tile &tile, int row0, int t,
                                       float scale_log2, const T *q, int64_t ldq, const T *k, const T *v,
                                       int64_t ldkv, T *out, int64_t ldo, int64_t col)
{
    constexpr int CH = DH / 8;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const bool self = tr.valid[i] && tr.pos[i] >= tile.n_hist;
        const int r = row0 + 8 * i;
        float part = 0.0f;
        if (self) {
            const T *qr = q + (tile.q_row + r) * ldq + col, *kr = k + (tile.seq_row + tr.pos[i]) * ldkv + col;
#pragma unroll
            for (int c = t; c < CH; c += 4) {
                const uint4 qv = *reinterpret_cast<const uint4 *>(qr + 8 * c);
                const uint4 kv = *reinterpret_cast<const uint4 *>(kr + 8 * c);
                const uint32_t qw[4] = {qv.x, qv.y, qv.z, qv.w}, kw[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const float2 x = unpack<T>(qw[u]), y = unpack<T>(kw[u]);
                    part = fmaf(x.x, y.x, fmaf(x.y, y.y, part));
                }
            }
        }
        const float sself = quad_sum(part) * scale_log2; // every lane takes part in the shuffles
        if (!self) continue;
        const float m_new = fmaxf(a.m[i], sself);
        const float alpha = fast_exp2(a.m[i] - m_new), ps = fast_exp2(sself - m_new);
        a.m[i] = m_new;
        a.l[i] = a.l[i] * alpha + (t == 0 ? ps : 0.0f); // counted once per quad
        const T *vr = v + (tile.seq_row + tr.pos[i]) * ldkv + col + 2 * t;
#pragma unroll
        for (int j = 0; j < DH / 8; j++) {
            const float2 vv = unpack<T>(*reinterpret_cast<const uint32_t *>(vr + 8 * j));
            a.o[4 * j + 2 * i] = a.o[4 * j + 2 * i] * alpha + ps * vv.x;
            a.o[4 * j + 2 * i + 1] = a.o[4 * j + 2 * i + 1] * alpha + ps * vv.y;
        }
    }
    store_rows<T, DH>(a, tr, tile, row0, t, out, ldo, col);
}

// A whole key block (every row visible to some query of the tile) into swizzled tiles: thread
// `me` of NTHR copies 16-byte column chunk me % CH of rows me / CH + i RSTEP. Rows RSTEP apart
// (a multiple of 8) share their swizzle, so the copies go to constant offsets from the thread's
// first slot while two pointers walk the rows: about three instructions a copy, against a dozen
// when each row's address and swizzle are worked out again (the producer warps issued a quarter
// of the kernel's instructions that way, taking issue slots from the consumers).
template <int DH, int BN, int NTHR>
__device__ __forceinline__ void stage_kv_whole(uint32_t kd, uint32_t vd, const fl_attn_tile &tile, int kb,
                                               const void *k, const void *v, int64_t ldkv, int64_t col, int me)
{
    constexpr int CH = DH / 8, RSTEP = NTHR / CH;
    static_assert(NTHR % CH == 0 && BN % RSTEP == 0 && RSTEP % 8 == 0, "whole rounds, one swizzle per thread");
    const int ch = me % CH, r0 = me / CH;
    const int64_t row_bytes = ldkv * 2, step = RSTEP * row_bytes;
    const int64_t first = ((tile.seq_row + kb + r0) * ldkv + col + ch * 8) * 2;
    const uint8_t *kp = static_cast<const uint8_t *>(k) + first, *vp = static_cast<const uint8_t *>(v) + first;
    const uint32_t slot = swz(BN, r0, ch);
#pragma unroll
    for (int i = 0; i < BN / RSTEP; i++) {
        cp16_all(kd + slot + i * RSTEP * 128, kp);
        cp16_all(vd + slot + i * RSTEP * 128, vp);
        kp += step;
        vp += step;
    }
}

// Stages rows [kb, kb + BN) of K and V (rows from kend on as zeros) into swizzled tiles, the
// 16-byte chunks split over NTHR threads (this one: `me`), all copies issued back to back.
template <int DH, int BN, int NTHR>
__device__ __forceinline__ void stage_kv(uint32_t kd, uint32_t vd, const fl_attn_tile &tile, int kb, int kend,
                                         const void *k, const void *v, int64_t ldkv, int64_t col, int me)
{
    constexpr int CH = DH / 8;
    static_assert(BN * CH % NTHR == 0, "whole rounds");
    if (kb + BN <= kend) {
        stage_kv_whole<DH, BN, NTHR>(kd, vd, tile, kb, k, v, ldkv, col, me);
        return;
    }
    const uint8_t *kp = static_cast<const uint8_t *>(k), *vp = static_cast<const uint8_t *>(v);
#pragma unroll
    for (int c0 = 0; c0 < BN * CH; c0 += NTHR) {
        const int c = c0 + me, r = c / CH, ch = c % CH;
        const bool ok = kb + r < kend;
        const int64_t off = ((tile.seq_row + (ok ? kb + r : 0)) * ldkv + col + ch * 8) * 2;
        cp16(kd + swz(BN, r, ch), kp + off, ok);
        cp16(vd + swz(BN, r, ch), vp + off, ok);
    }
}

// stage_kv for a producer warpgroup with few registers: one 16-byte column chunk per thread,
// rows stepped through in a loop (unrolled, the 32 addresses of a block would not fit); the
// last block, which holds kend, row by row.
template <int DH, int BN, int NTHR>
__device__ __forceinline__ void stage_kv_lean(uint32_t kd, uint32_t vd, const fl_attn_tile &tile, int kb, int kend,
                                              const void *k, const void *v, int64_t ldkv, int64_t col, int me)
{
    constexpr int CH = DH / 8, RSTEP = NTHR / CH;
    static_assert(NTHR % CH == 0 && BN % RSTEP == 0, "whole rounds");
    if (kb + BN <= kend) {
        stage_kv_whole<DH, BN, NTHR>(kd, vd, tile, kb, k, v, ldkv, col, me);
        return;
    }
    const int ch = me % CH;
    const int64_t first = (tile.seq_row * ldkv + col + ch * 8) * 2, row_bytes = ldkv * 2;
    const uint8_t *kp = static_cast<const uint8_t *>(k) + first, *vp = static_cast<const uint8_t *>(v) + first;
#pragma unroll 2
    for (int r = me / CH; r < BN; r += RSTEP) {
        const bool ok = kb + r < kend;
        const int64_t off = (ok ? kb + r : 0) * row_bytes;
        cp16(kd + swz(BN, r, ch), kp + off, ok);
        cp16(vd + swz(BN, r, ch), vp + off, ok);
    }
}

// Rows [r0, r0 + rows) of the tile's queries (rows from nq on as zeros) into the swizzled Q tile.
template <int DH>
__device__ __forceinline__ void stage_q(uint32_t qs, const fl_attn_tile &tile, const void *q, int64_t ldq,
                                        int64_t col, int r0, int rows, int me, int nthr)
{
    constexpr int CH = DH / 8;
    const uint8_t *qp = static_cast<const uint8_t *>(q);
    for (int c = me; c < rows * CH; c += nthr) {
        const int r = r0 + c / CH, ch = c % CH;
        const bool ok = r < tile.nq;
        cp16(qs + swz(QT, r, ch), qp + ((tile.q_row + (ok ? r : 0)) * ldq + col + ch * 8) * 2, ok);
    }
}

// Lock-step kernel: all 256 threads stage each block (cp.async, two stages), both warpgroups
// use it between two CTA barriers.
template <typename T, int DH, int BN>
__global__ void __launch_bounds__(THREADS, 1)
    attn_wg_kernel(const fl_attn_tile *tiles, const int32_t *qpos, item_order ord, float scale_log2, const T *q,
                   int64_t ldq, const T *k, const T *v, int64_t ldkv, T *out, int64_t ldo)
{
#ifdef FL_WG_DEVICE
    using L = layout<DH, BN, 2>;
    extern __shared__ uint8_t smem_raw[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t qs = base, ks0 = base + L::Q_BYTES, vs0 = ks0 + 2 * L::KV_BYTES;
    const int64_t item = blockIdx.x;
    const fl_attn_tile tile = tiles[ord.tile(item)];
    const int64_t col = (int64_t)ord.head(item) * DH;
    const int tid = threadIdx.x, wg = warpgroup_of(tid), warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2,
              t = lane & 3;
    const tile_rows tr = rows_of(tile, qpos, wg, warp, g);
    const int nblk = (tr.kend + BN - 1) / BN;
    if (nblk > 0) {
        stage_q<DH>(qs, tile, q, ldq, col, 0, QT, tid, THREADS);
        stage_kv<DH, BN, THREADS>(ks0, vs0, tile, 0, tr.kend, k, v, ldkv, col, tid);
        cp_commit();
    }
    row_acc<DH> a;
    a.init();
    for (int blk = 0; blk < nblk; blk++) {
        const int stage = blk & 1, kb = blk * BN;
        if (blk + 1 < nblk) {
            stage_kv<DH, BN, THREADS>(ks0 + (stage ^ 1) * L::KV_BYTES, vs0 + (stage ^ 1) * L::KV_BYTES, tile, kb + BN,
                                      tr.kend, k, v, ldkv, col, tid);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        fence_async_smem();
        __syncthreads();
        if (kb < tr.wg_kend) { // warpgroup-uniform
            float s[BN / 2];
            issue_s<T, DH, BN>(s, qs + wg * 64 * 128, ks0 + stage * L::KV_BYTES);
            wg_wait0();
            fence_regs(s);
            softmax_pv<T, DH, BN>(a, s, tr, kb, t, vs0 + stage * L::KV_BYTES, scale_log2);
        }
        __syncthreads(); // the stage is refilled by the next iteration's prefetch
    }
    finish<T, DH>(a, tr, tile, wg * 64 + warp * 16 + g, t, scale_log2, q, ldq, k, v, ldkv, out, ldo, col);
#endif
}

__device__ __forceinline__ void mbar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// the barrier's current phase completes when this thread's earlier cp.async copies have landed
__device__ __forceinline__ void mbar_arrive_cp(uint32_t bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// one arrival that also makes the phase wait for `bytes` more from the tensor memory accelerator
__device__ __forceinline__ void mbar_arrive_tx(uint32_t bar, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// A [box rows][64] tile at (column c0, row c1) of the tensor `map` describes, into shared memory at
// dst in the 128-byte swizzle (the layout swz() addresses), its bytes counted on mbarrier bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity)
{
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
__device__ __forceinline__ void named_sync(int id, int count) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }
__device__ __forceinline__ void named_arrive(int id, int count) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory"); }

constexpr int WS_THREADS = THREADS + 128; // two consumer warpgroups and a producer warpgroup

// Warp-specialised kernel: warpgroup 2 stages key/value blocks into STAGES buffers (cp.async,
// completion signalled on a `full` mbarrier per stage); the two warpgroups wait for a block,
// use it and release it on the stage's `empty` mbarrier, each at its own pace. PINGPONG: the
// warpgroups take turns issuing S = QK^T (named barriers 3 and 4), so one's softmax runs under
// the other's matrix products (FlashAttention-3's inter-warpgroup schedule).
template <typename T, int DH, int BN, int STAGES, bool PINGPONG>
__global__ void __launch_bounds__(WS_THREADS, 1)
    attn_ws_kernel(const fl_attn_tile *tiles, const int32_t *qpos, item_order ord, float scale_log2, const T *q,
                   int64_t ldq, const T *k, const T *v, int64_t ldkv, T *out, int64_t ldo)
{
#ifdef FL_WG_DEVICE
    using L = layout<DH, BN, STAGES>;
    extern __shared__ uint8_t smem_raw[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t qs = base, ks0 = base + L::Q_BYTES, vs0 = ks0 + STAGES * L::KV_BYTES;
    const uint32_t full0 = base + L::BAR, empty0 = full0 + 8 * STAGES;
    const int64_t item = blockIdx.x;
    const fl_attn_tile tile = tiles[ord.tile(item)];
    const int64_t col = (int64_t)ord.head(item) * DH;
    const int tid = threadIdx.x, wg = warpgroup_of(tid), warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2,
              t = lane & 3;
    if (tid == 0)
        for (int st = 0; st < STAGES; st++) {
            mbar_init(full0 + 8 * st, 128); // the producer's 128 threads
            mbar_init(empty0 + 8 * st, 8); // lane 0 of each consumer warp
        }
    __syncthreads();
    if (wg == 2) { // producer warpgroup
        const tile_rows tr = rows_of(tile, qpos, 0, 0, 0);
        const int nblk = (tr.kend + BN - 1) / BN;
        for (int blk = 0; blk < nblk; blk++) {
            const int st = blk % STAGES;
            if (blk >= STAGES) mbar_wait(empty0 + 8 * st, (uint32_t)((blk / STAGES - 1) & 1));
            stage_kv<DH, BN, 128>(ks0 + st * L::KV_BYTES, vs0 + st * L::KV_BYTES, tile, blk * BN, tr.kend, k, v, ldkv,
                                  col, tid - THREADS);
            mbar_arrive_cp(full0 + 8 * st);
        }
        cp_wait<0>();
        return;
    }
    const tile_rows tr = rows_of(tile, qpos, wg, warp, g);
    const int nblk = (tr.kend + BN - 1) / BN;
    if (nblk > 0) { // the warpgroup's own 64 query rows
        stage_q<DH>(qs, tile, q, ldq, col, wg * 64, 64, tid & 127, 128);
        cp_commit();
        cp_wait<0>();
        fence_async_smem();
        named_sync(1 + wg, 128);
    }
    row_acc<DH> a;
    a.init();
    if (PINGPONG && wg == 1 && nblk > 0) named_arrive(3, 256); // warpgroup 0 goes first
    for (int blk = 0; blk < nblk; blk++) {
        const int st = blk % STAGES, kb = blk * BN;
        mbar_wait(full0 + 8 * st, (uint32_t)((blk / STAGES) & 1));
        fence_async_smem(); // the copies (generic proxy) are read by the tensor cores (async proxy)
        // warpgroup-uniform; skipped blocks keep the turns balanced. Each branch issues and
        // waits for its own matrix products (split across branches, ptxas serialises them)
        const bool work = kb < tr.wg_kend, pass = PINGPONG && !(wg == 1 && blk == nblk - 1);
        if (PINGPONG) named_sync(3 + wg, 256);
        if (work) {
            float s[BN / 2];
            issue_s<T, DH, BN>(s, qs + wg * 64 * 128, ks0 + st * L::KV_BYTES);
            if (pass) named_arrive(3 + (wg ^ 1), 256);
            wg_wait0();
            fence_regs(s);
            softmax_pv<T, DH, BN>(a, s, tr, kb, t, vs0 + st * L::KV_BYTES, scale_log2);
        } else if (pass) {
            named_arrive(3 + (wg ^ 1), 256);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(empty0 + 8 * st);
    }
    finish<T, DH>(a, tr, tile, wg * 64 + warp * 16 + g, t, scale_log2, q, ldq, k, v, ldkv, out, ldo, col);
#endif
}

template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// keeps P (the A operand of an in-flight P V) in its registers until the product has read it
template <int N> __device__ __forceinline__ void keep_regs(uint32_t (&p)[N][4])
{
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(p[i][0]), "+r"(p[i][1]), "+r"(p[i][2]), "+r"(p[i][3])::"memory");
}

// P set to zeros, each in a register of its own: with one zero the compiler shares, ptxas has
// no registers of P's own to hand the products and serialises them (C7511).
template <int N> __device__ __forceinline__ void zero_p(uint32_t (&p)[N][4])
{
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("mov.b32 %0, 0;\n" : "=r"(p[i][e]));
}

// Registers per thread after the split (setmaxnreg): the producer only computes addresses, the
// consumers hold S, P and O at once. 128 x 40 + 256 x 232 = 64,512 = the 168 x 384 the CTA is
// launched with (__launch_bounds__(384, 1)).
constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;

// K, V and Q as the tensor memory accelerator reads them (TMA variants; encode_kv): [rows][heads
// x dh] with ldkv- (ldq-) element row strides, in boxes of [BN (QT) rows][64 columns] (128
// bytes: one swizzle span). Only whole key blocks and whole Q tiles are read this way, whose
// rows all belong to the item's sequence (keys [seq_row, seq_row + kend), queries [q_row, q_row
// + QT)), so the maps need no bound tighter than the buffer can have; the block holding kend
// and a Q tile of fewer rows are copied by cp.async, which zero-fills the rows past them.
struct kv_maps {
    CUtensorMap k, v, q; // q: the Q tile of a full item (QT rows), in [QT][64] boxes
};

// Warp-specialised kernel with the softmax of block j overlapped with the P V product of
// block j - 1 inside each warpgroup (FlashAttention-3's intra-warpgroup pipelining): per block,
// issue S_j = Q K_j^T and O += P_{j-1} V_{j-1}, wait for S_j only, compute P_j while the tensor
// cores accumulate O, then wait for O and rescale it by the factor block j's max brought. The
// producer warpgroup stages the Q tile and the key/value blocks (STAGES deep); a stage is
// released once its V has been used, so two stages are held at a time (K_j and V_{j-1}) and
// STAGES >= 3 keeps one in flight.
//
// Persistent: a CTA computes items in turn. With work counters (`work`: two 32-bit counters
// in device memory, zero at launch) each CTA takes the next item of the longest-first list as
// it gets to one, as the hardware hands out CTAs (a greedy schedule: the last items, the
// shortest, even out the CTAs' ends); without one, CTA b takes items b, 2G - 1 - b, 2G + b, ...
// of the G-CTA grid. The key/value ring and the Q tile run on across items: the producer
// stages the next item's first block and, once both warpgroups' last S = Q K^T has completed,
// its Q tile, while the consumers finish the previous one. With a grid of every item (one item
// a CTA) this is the one-shot kernel. The last CTA to take its last item (its add returned the
// item count or more) sets the counters back to zero for the next launch on the stream.
//
// The producer publishes each item to the consumers in a shared-memory slot (two, by round
// parity): the item's index (>= the item count: no more work), its tile descriptor and its key
// spans, so the consumers never wait for a global load of them. Named barriers hand a slot over
// (SLOT_FULL: the producer arrives once written, the consumers wait) and back (SLOT_FREE: the
// consumers arrive once read, the producer waits before writing it again), so
// compute-sanitizer's racecheck sees the order too (it does not follow mbarriers for ordinary
// loads and stores).
struct item_slot {
    fl_attn_tile tile;
    int64_t item;
    // the tile's key spans (tile_rows' kend, and wg_kend and wg_full of each warpgroup), worked
    // out by the producer when it fetches the item, an item ahead: a candidate tile's spans
    // come from query positions in global memory, whose latency would otherwise open each
    // item of the consumers
    int32_t kend, wg_kend[2], wg_full[2];
};
constexpr int SLOT_FULL = 2, SLOT_FREE = 4; // + the round's parity; 1 is the producer's own
constexpr int TURN = 6;                     // + the warpgroup: its turn to issue products (PINGPONG)

template <typename T, int DH, int BN, int STAGES, bool PINGPONG, bool TMA, bool CHAIN>
__global__ void __launch_bounds__(WS_THREADS, 1)
    attn_ovl_kernel(const fl_attn_tile *tiles, const int32_t *qpos, item_order ord, float scale_log2, const T *q,
                    int64_t ldq, const T *k, const T *v, int64_t ldkv, T *out, int64_t ldo, uint32_t *work,
                    const __grid_constant__ kv_maps maps)
{
#ifdef FL_WG_DEVICE
    static_assert(STAGES >= 2, "K_j and V_{j-1} are held at once");
    using L = layout<DH, BN, STAGES>;
    static_assert(sizeof(item_slot) <= 64, "two slots fit their space");
    extern __shared__ uint8_t smem_raw[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t qs = base, ks0 = base + L::Q_BYTES, vs0 = ks0 + STAGES * L::KV_BYTES;
    const uint32_t full0 = base + L::BAR, empty0 = full0 + 8 * STAGES, q_full = empty0 + 8 * STAGES, q_empty = q_full + 8;
    item_slot *slots = reinterpret_cast<item_slot *>(smem_raw + (base - (uint32_t)__cvta_generic_to_shared(smem_raw)) + L::SLOTS);
    const int64_t n_items = (int64_t)ord.num_tiles * ord.heads;
    const int tid = threadIdx.x, wg = warpgroup_of(tid), warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2,
              t = lane & 3;
    if (tid == 0) {
        for (int st = 0; st < STAGES; st++) {
            mbar_init(full0 + 8 * st, 128); // the producer's 128 threads
            mbar_init(empty0 + 8 * st, 8);  // lane 0 of each consumer warp
        }
        mbar_init(q_full, 128); // the producer's copies
        mbar_init(q_empty, 8);
    }
    __syncthreads();
    if (wg == 2) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
        const int me = tid - THREADS;
        // The item of round r into slot r % 2 (thread 0, once the consumers have read round
        // r - 2's), then known to all producer threads (barrier 1: thread 0 writes the slot
        // again only after every producer thread passed round r + 1's, so after it read round
        // r's) and handed to the consumers.
        auto fetch = [&](int64_t round) {
            item_slot &sl = slots[round & 1];
            if (round >= 2) named_sync(SLOT_FREE + (int)(round & 1), WS_THREADS);
            if (me == 0) {
                int64_t item;
                if (work) {
                    item = atomicAdd(work, 1u);
                } else {
                    const int64_t gs = gridDim.x, b = blockIdx.x;
                    item = round * gs + ((round & 1) ? gs - 1 - b : b);
                }
                if (item < n_items) {
                    const fl_attn_tile tile = tiles[ord.tile(item)];
                    sl.tile = tile;
                    const tile_rows t0 = rows_of(tile, qpos, 0, 0, 0), t1 = rows_of(tile, qpos, 1, 0, 0);
                    sl.kend = t0.kend;
                    sl.wg_kend[0] = t0.wg_kend;
                    sl.wg_kend[1] = t1.wg_kend;
                    sl.wg_full[0] = t0.wg_full;
                    sl.wg_full[1] = t1.wg_full;
                }
                sl.item = item;
            }
            named_sync(1, 128);
            const int64_t got = sl.item;
            named_arrive(SLOT_FULL + (int)(round & 1), WS_THREADS);
            return got;
        };
        // An item's Q rows and its candidates' own key and value rows (read by finish) into L2,
        // an item ahead: the Q tile is then staged from L2 in the short time between the
        // consumers' last S = Q K^T of one item and their first of the next.
        auto prefetch_item = [&](const fl_attn_tile &tile, int64_t item) {
            if (me >= tile.nq) return;
            const int64_t col = (int64_t)ord.head(item) * DH;
            const int pos = query_pos(tile, qpos, me);
            const T *qr = q + (tile.q_row + me) * ldq + col;
            const T *kr = k + (tile.seq_row + pos) * ldkv + col, *vr = v + (tile.seq_row + pos) * ldkv + col;
#pragma unroll
            for (int c = 0; c < DH; c += 64) { // 128-byte lines
                asm volatile("prefetch.global.L2 [%0];\n" ::"l"(qr + c));
                if (pos >= tile.n_hist) {
                    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(kr + c));
                    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(vr + c));
                }
            }
        };
        uint32_t ring = 0; // blocks staged so far: the ring's stage and phase run on across items
        int64_t item = fetch(0);
        if (item < n_items) prefetch_item(slots[0].tile, item);
        for (int64_t round = 0;; round++) {
            if (item >= n_items) { // no more work: the consumers read that from the slot
                // the last slot they read and freed, so no barrier is left half arrived at
                if (round >= 1) named_sync(SLOT_FREE + (int)((round - 1) & 1), WS_THREADS);
                break;
            }
            const fl_attn_tile tile = slots[round & 1].tile;
            const int64_t col = (int64_t)ord.head(item) * DH;
            const int kend = slots[round & 1].kend;
            const int nblk = (kend + BN - 1) / BN;
            auto stage_block = [&](int blk) {
                const uint32_t at = ring + blk, st = at % STAGES;
                if (at >= STAGES) mbar_wait(empty0 + 8 * st, ((at / STAGES) - 1) & 1);
                const int kb = blk * BN;
                if (TMA && kb + BN <= kend && tile.seq_row + kb <= INT32_MAX - BN) {
                    // a whole block: one thread issues its boxes (K and V, DH / 64 column spans
                    // each) and counts their bytes on the stage's barrier; the others arrive, so
                    // the barrier counts 128 arrivals on either path
                    const uint32_t bar = full0 + 8 * st;
                    if (me == 0) {
                        mbar_arrive_tx(bar, 2 * L::KV_BYTES);
#pragma unroll
                        for (int cb = 0; cb < DH / 64; cb++) {
                            const int c0 = (int)col + 64 * cb, c1 = (int)(tile.seq_row + kb);
                            tma_load_2d(ks0 + st * L::KV_BYTES + cb * BN * 128, &maps.k, c0, c1, bar);
                            tma_load_2d(vs0 + st * L::KV_BYTES + cb * BN * 128, &maps.v, c0, c1, bar);
                        }
                    } else {
                        mbar_arrive(bar);
                    }
                    return;
                }
                stage_kv_lean<DH, BN, 128>(ks0 + st * L::KV_BYTES, vs0 + st * L::KV_BYTES, tile, kb, kend, k, v,
                                           ldkv, col, me);
                mbar_arrive_cp(full0 + 8 * st);
            };
            if (nblk > 0) stage_block(0); // the ring usually has room before the Q tile is free
            if (round > 0) mbar_wait(q_empty, (uint32_t)(round - 1) & 1);
            if (TMA && nblk > 0 && tile.nq == QT && tile.q_row <= INT32_MAX - QT) {
                // a full Q tile: one thread's boxes, counted in bytes on q_full as a key block's
                if (me == 0) {
                    mbar_arrive_tx(q_full, L::Q_BYTES);
#pragma unroll
                    for (int cb = 0; cb < DH / 64; cb++)
                        tma_load_2d(qs + cb * QT * 128, &maps.q, (int)col + 64 * cb, (int)tile.q_row, q_full);
                } else {
                    mbar_arrive(q_full);
                }
            } else {
                if (nblk > 0) stage_q<DH>(qs, tile, q, ldq, col, 0, QT, me, 128);
                mbar_arrive_cp(q_full);
            }
            const int64_t next = fetch(round + 1);
            if (next < n_items) prefetch_item(slots[(round + 1) & 1].tile, next);
            for (int blk = 1; blk < nblk; blk++) stage_block(blk);
            ring += nblk;
            item = next;
        }
        cp_wait<0>();
        if (me == 0 && work) { // the last producer to fetch its last item resets (only producer thread 0s add)
            __threadfence();
            if (atomicAdd(work + 1, 1u) == gridDim.x - 1) {
                __threadfence(); // every other CTA's last add on work[0] comes before
                atomicExch(work, 0u);
                atomicExch(work + 1, 0u);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
    const uint32_t qa = qs + wg * 64 * 128;
    uint32_t ring = 0;
    // PINGPONG: the warpgroups take turns issuing their products (FlashAttention-3's
    // inter-warpgroup schedule), so one's softmax runs under the other's products rather than
    // both contending at once. Each takes nblk + 1 turns an item (S_0; S_j with P_{j-1} V_{j-1};
    // the last P V; then an empty turn for each block past its rows, after which it hands that
    // block back), strictly alternating, warpgroup 0 first: bar.sync on its own barrier,
    // bar.arrive on the other's, so at most one arrival is ever pending. No wait closes a cycle
    // with the ring: turn t waits for block t, staged once both warpgroups released block
    // t - STAGES, which the other did by its turn t - 1 (STAGES >= 2). Warpgroup 1's last pass
    // is taken up by warpgroup 0 after the last item.
    auto turn_wait = [&]() {
        if (PINGPONG) named_sync(TURN + wg, 256);
    };
    auto turn_pass = [&]() {
        if (PINGPONG) named_arrive(TURN + (wg ^ 1), 256);
    };
    if (PINGPONG && wg == 1) named_arrive(TURN, 256);
    if constexpr (CHAIN) {
        // (A trial beside the default's loop in the else branch, written out in full so that the
        // default's code stays as measured; they share the loop over blocks line for line, and
        // one of the two goes once both are timed in one run.)
        // Chained items: an item's last P V is issued in the next item's first turn, beside its
        // S_0, so that S_0's softmax runs under it as every later block's does under the previous
        // P V; the item is finished once that product is complete. Every first turn issues a
        // P V: with nothing pending P is zero (and O is cleared after it), so there is one code
        // path around the products. The decision is the tile's (both warpgroups' rows see all of
        // its blocks), so both warpgroups take the same turns.
        row_acc<DH> a;
        a.init();
        uint32_t p[BN / 16][4];
        zero_p(p);
        bool pend = false;
        uint32_t pend_at = 0;
        fl_attn_tile ptile = {};
        int64_t pcol = 0;
        const int row0 = wg * 64 + warp * 16 + g;
        auto release_at = [&](uint32_t at) {
            __syncwarp();
            if (lane == 0) mbar_arrive(empty0 + 8 * (at % STAGES));
        };
        auto finish_pending = [&]() {
            const tile_rows ptr = rows_of_spans(ptile, qpos, wg, warp, g, 0, 0, 0); // finish reads pos and valid only
            finish<T, DH>(a, ptr, ptile, row0, t, scale_log2, q, ldq, k, v, ldkv, out, ldo, pcol);
        };
        for (int64_t round = 0;; round++) {
            named_sync(SLOT_FULL + (int)(round & 1), WS_THREADS);
            const item_slot &sl = slots[round & 1];
            const int64_t item = sl.item;
            if (item >= n_items) break;
            const fl_attn_tile tile = sl.tile;
            const int32_t kend = sl.kend, wg_kend = sl.wg_kend[wg], wg_full = sl.wg_full[wg];
            const int32_t kend_other = sl.wg_kend[wg ^ 1];
            named_arrive(SLOT_FREE + (int)(round & 1), WS_THREADS);
            mbar_wait(q_full, (uint32_t)round & 1);
            fence_async_smem(); // the Q tile's copies (generic proxy) are read by the tensor cores
            const int64_t col = (int64_t)ord.head(item) * DH;
            const tile_rows tr = rows_of_spans(tile, qpos, wg, warp, g, kend, wg_kend, wg_full);
            const int nblk = (tr.kend + BN - 1) / BN;
            const int nwork = min(nblk, (tr.wg_kend + BN - 1) / BN); // blocks this warpgroup's rows see
            const bool chain = nblk > 0 && nwork == nblk && (kend_other + BN - 1) / BN == nblk;
            auto wait_full = [&](int blk) {
                const uint32_t at = ring + blk;
                mbar_wait(full0 + 8 * (at % STAGES), (at / STAGES) & 1);
                fence_async_smem(); // the copies (generic proxy) are read by the tensor cores (async proxy)
            };
            auto release = [&](int blk) { release_at(ring + blk); };
            auto release_q = [&]() { // this warpgroup's last S = Q K^T has completed
                __syncwarp();
                if (lane == 0) mbar_arrive(q_empty);
            };
            auto kv_at = [&](int blk) { return ((ring + blk) % STAGES) * L::KV_BYTES; };
            if (nwork > 0) {
                float s[BN / 2], alpha[2];
                wait_full(0);
                const uint32_t vat = pend ? pend_at : ring; // nothing pending: P is zero, this item's first V does
                turn_wait();
                issue_s<T, DH, BN>(s, qa, ks0 + kv_at(0));
                issue_pv<T, DH, BN>(a, p, vs0 + (vat % STAGES) * L::KV_BYTES);
                turn_pass();
                wg_wait<1>();
                fence_regs(s);
                if (nwork == 1) release_q();
                const float om0 = a.m[0], om1 = a.m[1], ol0 = a.l[0], ol1 = a.l[1];
                a.m[0] = a.m[1] = -INFINITY; // this item's row state; O is the previous item's still
                a.l[0] = a.l[1] = 0.0f;
                softmax_any<DH, BN>(a, s, tr, 0, t, scale_log2, alpha);
                wg_wait0();
                keep_regs(p);
                fence_regs(a.o);
                pack_p<T, BN>(s, p);
                if (pend) {
                    release_at(pend_at);
                    const float nm0 = a.m[0], nm1 = a.m[1], nl0 = a.l[0], nl1 = a.l[1];
                    a.m[0] = om0, a.m[1] = om1, a.l[0] = ol0, a.l[1] = ol1;
                    finish_pending();
                    a.m[0] = nm0, a.m[1] = nm1, a.l[0] = nl0, a.l[1] = nl1;
                    pend = false;
                }
    #pragma unroll
                for (int j = 0; j < DH / 2; j++) a.o[j] = 0.0f;
                for (int blk = 1; blk < nwork; blk++) {
                    wait_full(blk);
                    turn_wait();
                    issue_s<T, DH, BN>(s, qa, ks0 + kv_at(blk));
                    issue_pv<T, DH, BN>(a, p, vs0 + kv_at(blk - 1));
                    turn_pass();
                    wg_wait<1>(); // S_j is done (groups complete in order); P_{j-1} V_{j-1} may run on
                    fence_regs(s);
                    if (blk == nwork - 1) release_q(); // the item's last read of the Q tile is done
                    softmax_any<DH, BN>(a, s, tr, blk * BN, t, scale_log2, alpha);
                    wg_wait0();
                    keep_regs(p);
                    fence_regs(a.o);
                    release(blk - 1);
                    rescale(a, alpha);
                    pack_p<T, BN>(s, p);
                }
                if (!chain) {
                    turn_wait();
                    issue_pv<T, DH, BN>(a, p, vs0 + kv_at(nwork - 1));
                    turn_pass();
                    wg_wait0();
                    keep_regs(p);
                    fence_regs(a.o);
                    release(nwork - 1);
                }
            } else {
                // S_0's turn, empty but for a pending P V; with the nblk below, nblk + 1 turns
                if (pend) {
                    turn_wait();
                    issue_pv<T, DH, BN>(a, p, vs0 + (pend_at % STAGES) * L::KV_BYTES);
                    turn_pass();
                    wg_wait0();
                    keep_regs(p);
                    fence_regs(a.o);
                    release_at(pend_at);
                    finish_pending();
                    pend = false;
                } else {
                    turn_wait();
                    turn_pass();
                }
                a.init();
                release_q();
            }
            for (int blk = nwork; blk < nblk; blk++) { // blocks past this warpgroup's rows: handed back
                turn_wait();
                turn_pass();
                wait_full(blk);
                release(blk);
            }
            if (chain) {
                pend = true;
                pend_at = ring + nwork - 1;
                ptile = tile;
                pcol = col;
            } else {
                finish<T, DH>(a, tr, tile, row0, t, scale_log2, q, ldq, k, v, ldkv, out, ldo, col);
                a.init();
                zero_p(p);
            }
            ring += nblk;
        }
        if (pend) { // the last item's P V, in a turn of its own
            turn_wait();
            issue_pv<T, DH, BN>(a, p, vs0 + (pend_at % STAGES) * L::KV_BYTES);
            turn_pass();
            wg_wait0();
            keep_regs(p);
            fence_regs(a.o);
            release_at(pend_at);
            finish_pending();
        }
    } else {
        for (int64_t round = 0;; round++) {
            named_sync(SLOT_FULL + (int)(round & 1), WS_THREADS);
            const item_slot &sl = slots[round & 1];
            const int64_t item = sl.item;
            if (item >= n_items) break;
            const fl_attn_tile tile = sl.tile;
            const int32_t kend = sl.kend, wg_kend = sl.wg_kend[wg], wg_full = sl.wg_full[wg];
            named_arrive(SLOT_FREE + (int)(round & 1), WS_THREADS);
            mbar_wait(q_full, (uint32_t)round & 1);
            fence_async_smem(); // the Q tile's copies (generic proxy) are read by the tensor cores
            const int64_t col = (int64_t)ord.head(item) * DH;
            const tile_rows tr = rows_of_spans(tile, qpos, wg, warp, g, kend, wg_kend, wg_full);
            const int nblk = (tr.kend + BN - 1) / BN;
            const int nwork = min(nblk, (tr.wg_kend + BN - 1) / BN); // blocks this warpgroup's rows see
            auto wait_full = [&](int blk) {
                const uint32_t at = ring + blk;
                mbar_wait(full0 + 8 * (at % STAGES), (at / STAGES) & 1);
                fence_async_smem(); // the copies (generic proxy) are read by the tensor cores (async proxy)
            };
            auto release = [&](int blk) {
                __syncwarp();
                if (lane == 0) mbar_arrive(empty0 + 8 * ((ring + blk) % STAGES));
            };
            auto release_q = [&]() { // this warpgroup's last S = Q K^T has completed
                __syncwarp();
                if (lane == 0) mbar_arrive(q_empty);
            };
            auto kv_at = [&](int blk) { return ((ring + blk) % STAGES) * L::KV_BYTES; };
            row_acc<DH> a;
            a.init();
            if (nwork > 0) {
                float s[BN / 2], alpha[2];
                uint32_t p[BN / 16][4];
                wait_full(0);
                turn_wait();
                issue_s<T, DH, BN>(s, qa, ks0 + kv_at(0));
                turn_pass();
                wg_wait0();
                fence_regs(s);
                if (nwork == 1) release_q(); // its only S = Q K^T has completed: the next Q may come in
                softmax_any<DH, BN>(a, s, tr, 0, t, scale_log2, alpha); // O is still zero: alpha not needed
                pack_p<T, BN>(s, p);
                for (int blk = 1; blk < nwork; blk++) {
                    wait_full(blk);
                    turn_wait();
                    issue_s<T, DH, BN>(s, qa, ks0 + kv_at(blk));
                    issue_pv<T, DH, BN>(a, p, vs0 + kv_at(blk - 1));
                    turn_pass();
                    wg_wait<1>(); // S_j is done (groups complete in order); P_{j-1} V_{j-1} may run on
                    fence_regs(s);
                    if (blk == nwork - 1) release_q(); // the item's last read of the Q tile is done
                    softmax_any<DH, BN>(a, s, tr, blk * BN, t, scale_log2, alpha);
                    wg_wait0();
                    keep_regs(p);
                    fence_regs(a.o);
                    release(blk - 1);
                    rescale(a, alpha);
                    pack_p<T, BN>(s, p);
                }
                turn_wait();
                issue_pv<T, DH, BN>(a, p, vs0 + kv_at(nwork - 1));
                turn_pass();
                wg_wait0();
                keep_regs(p);
                fence_regs(a.o);
                release(nwork - 1);
            } else {
                turn_wait(); // S_0's turn, empty; with the nblk below, nblk + 1 as on the other path
                turn_pass();
                release_q();
            }
            for (int blk = nwork; blk < nblk; blk++) { // blocks past this warpgroup's rows: handed back
                turn_wait();
                turn_pass();
                wait_full(blk);
                release(blk);
            }
            ring += nblk;
            finish<T, DH>(a, tr, tile, wg * 64 + warp * 16 + g, t, scale_log2, q, ldq, k, v, ldkv, out, ldo, col);
        }
    }
    if (PINGPONG && wg == 0) named_sync(TURN, 256); // warpgroup 1's last pass: none is left pending
#endif
}

template <typename T, int DH, int BN>
flame_status launch(const fl_attn_tile *tiles, int64_t num_tiles, const int32_t *qpos, int32_t heads, const T *q,
                    int64_t ldq, const T *k, const T *v, int64_t ldkv, T *out, int64_t ldo, cudaStream_t s, int head_major)
{
    constexpr int smem = layout<DH, BN, 2>::SMEM;
    // above the default 48 KiB; set on every launch, as the attribute is per device
    FL_CUDA_TRY(cudaFuncSetAttribute(attn_wg_kernel<T, DH, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)DH);
    attn_wg_kernel<T, DH, BN><<<(unsigned)(num_tiles * heads), THREADS, smem, s>>>(tiles, qpos, item_order{(int32_t)num_tiles, heads, head_major}, scale_log2, q,
                                                                                   ldq, k, v, ldkv, out, ldo);
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}

template <typename T, int DH, int BN, int STAGES, bool PP>
flame_status launch_ws(const fl_attn_tile *tiles, int64_t num_tiles, const int32_t *qpos, int32_t heads, const T *q,
                       int64_t ldq, const T *k, const T *v, int64_t ldkv, T *out, int64_t ldo, cudaStream_t s, int head_major)
{
    constexpr int smem = layout<DH, BN, STAGES>::SMEM;
    static_assert(smem <= 227 * 1024, "shared memory of one CTA");
    FL_CUDA_TRY(cudaFuncSetAttribute(attn_ws_kernel<T, DH, BN, STAGES, PP>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)DH);
    attn_ws_kernel<T, DH, BN, STAGES, PP><<<(unsigned)(num_tiles * heads), WS_THREADS, smem, s>>>(
        tiles, qpos, item_order{(int32_t)num_tiles, heads, head_major}, scale_log2, q, ldq, k, v, ldkv, out, ldo);
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}

// The driver's tensor-map encoder, looked up once through the runtime (the library does not
// link libcuda); NULL where the driver has none.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder()
{
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050 // the unversioned lookup is deprecated from 12.5 on
        const cudaError_t e =
            cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
#else
        const cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &found);
#endif
        if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) {
            (void)cudaGetLastError();
            p = nullptr;
        }
        return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }();
    return fn;
}

// K, V or Q for the TMA variants (kv_maps): columns [0, heads x dh), boxes of [box_rows][64] in the
// 128-byte swizzle. The rows a launch reads are not known here, so the map declares as many as
// the kernel's 32-bit row coordinate reaches or 2^40 bytes hold, whichever is fewer: more than
// any device's memory has (rows past the declared ones would read as zeros). False where the
// encoder is missing or refuses the layout.
template <typename T> bool encode_kv(CUtensorMap *m, const T *base, int64_t cols, int64_t ldkv, int box_rows)
{
    const PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
    const int64_t row_bytes = ldkv * (int64_t)sizeof(T);
    if (!enc || ldkv < cols || row_bytes >= ((int64_t)1 << 40)) return false;
    const int64_t rows = std::min<int64_t>(INT32_MAX, ((int64_t)1 << 40) / row_bytes);
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)row_bytes};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, elem_strides[2] = {1, 1};
    const CUtensorMapDataType type =
        std::is_same<T, __half>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    return enc(m, type, 2, const_cast<T *>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) ==
           CUDA_SUCCESS;
}

// ctas: the grid, at most one CTA an item (0: one an item, the one-shot form); work: the
// counters of the greedy schedule (attn_ovl_kernel), or NULL. TMA: whole key blocks and Q
// tiles through the tensor memory accelerator; where K, V or Q cannot be described to it, the
// cp.async form.
template <typename T, int DH, int BN, int STAGES, bool PINGPONG = false, bool TMA = false, bool CHAIN = false>
flame_status launch_ovl(const fl_attn_tile *tiles, int64_t num_tiles, const int32_t *qpos, int32_t heads, const T *q,
                        int64_t ldq, const T *k, const T *v, int64_t ldkv, T *out, int64_t ldo, cudaStream_t s, int head_major,
                        int64_t ctas, uint32_t *work)
{
    kv_maps maps;
    memset(&maps, 0, sizeof maps);
    if constexpr (TMA) {
        if (!encode_kv<T>(&maps.k, k, (int64_t)heads * DH, ldkv, BN) ||
            !encode_kv<T>(&maps.v, v, (int64_t)heads * DH, ldkv, BN) ||
            !encode_kv<T>(&maps.q, q, (int64_t)heads * DH, ldq, QT))
            return launch_ovl<T, DH, BN, STAGES, PINGPONG, false, CHAIN>(tiles, num_tiles, qpos, heads, q, ldq, k, v, ldkv,
                                                                         out, ldo, s, head_major, ctas, work);
    }
    constexpr int smem = layout<DH, BN, STAGES>::SMEM;
    static_assert(smem <= 227 * 1024, "shared memory of one CTA");
    FL_CUDA_TRY(cudaFuncSetAttribute(attn_ovl_kernel<T, DH, BN, STAGES, PINGPONG, TMA, CHAIN>,
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)DH);
    const int64_t items = num_tiles * heads, grid = ctas > 0 && ctas < items ? ctas : items;
    attn_ovl_kernel<T, DH, BN, STAGES, PINGPONG, TMA, CHAIN><<<(unsigned)grid, WS_THREADS, smem, s>>>(
        tiles, qpos, item_order{(int32_t)num_tiles, heads, head_major}, scale_log2, q, ldq, k, v, ldkv, out, ldo,
        grid < items ? work : nullptr, maps);
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}

} // namespace

bool fl_cuda_attention_wg_device(void)
{
    int dev = 0, major = 0, minor = 0; // the current device's (the runtime caches these)
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return major == 9 && minor == 0; // sm_90a machine code runs on compute capability 9.0 only
}

template <typename T>
bool fl_cuda_attention_wg_fits(int32_t dh, const T *q, int64_t ldq, const T *k, const T *v, int64_t ldkv,
                               const T *out, int64_t ldo)
{
    const uintptr_t bits = (uintptr_t)q | (uintptr_t)k | (uintptr_t)v;
    return (dh == 64 || dh == 128) && ldq % 8 == 0 && ldkv % 8 == 0 && bits % 16 == 0 && ldo % 2 == 0 &&
           (uintptr_t)out % 4 == 0 && fl_cuda_attention_wg_device();
}

template <typename T>
flame_status fl_cuda_attention_wg(const fl_attn_tile *tiles, int64_t num_tiles, const int32_t *qpos, int32_t heads,
                                  int32_t dh, const T *q, int64_t ldq, const T *k, const T *v, int64_t ldkv, T *out,
                                  int64_t ldo, cudaStream_t s, int variant, int max_ctas, uint32_t *work)
{
    if (num_tiles == 0) return FLAME_OK;
    if (!fl_cuda_attention_wg_fits<T>(dh, q, ldq, k, v, ldkv, out, ldo))
        return fl_error(FLAME_ERR_UNSUPPORTED,
                        "wgmma attention: needs a compute capability 9.0 GPU, head dim 64 or 128 (got %d) and "
                        "16-byte aligned rows", dh);
    if (heads <= 0 || num_tiles > INT32_MAX / heads)
        return fl_error(FLAME_ERR_INVALID_ARG, "wgmma attention: %lld tiles x %d heads exceed one launch (2^31 - 1 CTAs)",
                        (long long)num_tiles, heads);
    // measured on an H200 (docs/benchmarks.md): head dim 128, the producer warpgroup with the
    // softmax overlapped and 128-key blocks (B32 L1024 M512 420 us against 439 without the
    // overlap, B8 L4096 M512 777 against 839); 64, lock-step with 64-key blocks once the CTAs
    // fill the GPU (B8 L1024 M512 70 us against 81), the producer warpgroup below (B1 L1024
    // M128, 72 CTAs: 19.6 us against 23.3)
    // Head dim 128 with work counters: the overlapped kernel persistent, items handed out as
    // CTAs get to them (B32 L1024 M512 333-337 us against 381-382 one CTA an item; B8 L4096
    // M512 592-633 against 630-658, within the noise between machine instances); without them,
    // one CTA an item (the persistent form's fixed assignment leaves its CTAs 7-10% apart:
    // 355-364 and 673 us). With the warpgroups taking turns issuing their products
    // (FL_WG_POVL128P), an H100: B32 L1024 M512 341-343 us against 350, L4096 the same within the
    // noise; with whole key blocks staged by the tensor memory accelerator as well
    // (FL_WG_POVL128PT), the same run: 334-335 us against 346 (turns alone) and 350, L4096 579
    // against 603 and 595, so that is the default with work counters. Q tiles by TMA as well,
    // released once the item's last S = Q K^T is done, and each item's key spans worked out by
    // the producer: B32 L1024 M512 322-324 us against 335-340, B64 L512 M256 242 against
    // 249-251 (an H100, both builds in one run).
    const int which = variant                      ? variant
                      : dh == 128                  ? (work ? FL_WG_POVL128PT : FL_WG_OVL128)
                      : num_tiles * heads >= 132   ? FL_WG_LOCK64
                                                   : FL_WG_WS;
    // heads outermost for head dim 128 (B32 L1024 M512: 420 us against 430, L2 hit rate 68%
    // against 40%), innermost for 64 (B8 L1024 M512: 70 us against 83; with 128-byte rows of a
    // head, the heads of one tile read whole rows together)
    const int head_major = dh == 128;
    // the persistent forms: one CTA an SM (one fits: shared memory), or max_ctas
    int64_t ctas = 0;
    if (which >= FL_WG_POVL64) { // the persistent forms (every variant from there on)
        int dev = 0, sms = 0;
        FL_CUDA_TRY(cudaGetDevice(&dev));
        FL_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        ctas = max_ctas > 0 ? max_ctas : sms;
    }
#define ARGS tiles, num_tiles, qpos, heads, q, ldq, k, v, ldkv, out, ldo, s, head_major
    if (dh == 64) switch (which) {
        case FL_WG_LOCK64: return launch<T, 64, 64>(ARGS);
        case FL_WG_LOCK128: return launch<T, 64, 128>(ARGS);
        case FL_WG_WS: return launch_ws<T, 64, 128, 3, false>(ARGS);
        case FL_WG_WS_PP: return launch_ws<T, 64, 128, 3, true>(ARGS);
        case FL_WG_OVL64: return launch_ovl<T, 64, 64, 4>(ARGS, 0, nullptr);
        case FL_WG_POVL64: return launch_ovl<T, 64, 64, 4>(ARGS, ctas, work);
        case FL_WG_POVL128: return launch_ovl<T, 64, 128, 3>(ARGS, ctas, work);
        case FL_WG_POVL128P: return launch_ovl<T, 64, 128, 3, true>(ARGS, ctas, work);
        case FL_WG_POVL128T: return launch_ovl<T, 64, 128, 3, false, true>(ARGS, ctas, work);
        case FL_WG_POVL128PT: return launch_ovl<T, 64, 128, 3, true, true>(ARGS, ctas, work);
        case FL_WG_POVL128PC: return launch_ovl<T, 64, 128, 3, true, true, true>(ARGS, ctas, work);
        default: return launch_ovl<T, 64, 128, 3>(ARGS, 0, nullptr);
        }
    switch (which) {
    case FL_WG_LOCK64: return launch<T, 128, 64>(ARGS);
    case FL_WG_LOCK128: return launch<T, 128, 128>(ARGS);
    case FL_WG_WS: return launch_ws<T, 128, 64, 3, false>(ARGS);
    case FL_WG_WS_PP: return launch_ws<T, 128, 64, 3, true>(ARGS);
    case FL_WG_OVL64: return launch_ovl<T, 128, 64, 4>(ARGS, 0, nullptr);
    case FL_WG_POVL64: return launch_ovl<T, 128, 64, 4>(ARGS, ctas, work);
    case FL_WG_POVL128: return launch_ovl<T, 128, 128, 3>(ARGS, ctas, work);
    case FL_WG_POVL128P: return launch_ovl<T, 128, 128, 3, true>(ARGS, ctas, work);
    case FL_WG_POVL128T: return launch_ovl<T, 128, 128, 3, false, true>(ARGS, ctas, work);
    case FL_WG_POVL128PT: return launch_ovl<T, 128, 128, 3, true, true>(ARGS, ctas, work);
    case FL_WG_POVL128PC: return launch_ovl<T, 128, 128, 3, true, true, true>(ARGS, ctas, work);
    default: return launch_ovl<T, 128, 128, 3>(ARGS, 0, nullptr);
    }
#undef ARGS
}

#define INSTANTIATE(T)                                                                                         \
    template bool fl_cuda_attention_wg_fits<T>(int32_t, const T *, int64_t, const T *, const T *, int64_t,      \
                                               const T *, int64_t);                                            \
    template flame_status fl_cuda_attention_wg<T>(const fl_attn_tile *, int64_t, const int32_t *, int32_t,      \
                                                  int32_t, const T *, int64_t, const T *, const T *, int64_t, T *, \
                                                  int64_t, cudaStream_t, int, int, uint32_t *);
INSTANTIATE(__half)
INSTANTIATE(__nv_bfloat16)
