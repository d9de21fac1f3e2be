// SUMI attention for Hopper (sm_90a), fp16/bf16, head dims 64 and 128: warpgroup MMA (wgmma)
// in the FlashAttention-3 layout (Shah et al. 2024, arXiv:2407.08608). One CTA owns 128
// queries of one (sequence, head): two warpgroups of 64 rows share key/value blocks of BN rows
// staged in shared memory, two stages deep (block i + 1 is in flight while block i is used).
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
// see the ordinary-proxy writes.
//
// SUMI by block skipping: a tile's rows see keys [0, nvis) with nvis = pos + 1 for history rows
// and n_hist for candidates; a warpgroup walks blocks up to its last row's nvis and masks only
// blocks that cross its first row's nvis (the diagonal block, or a candidate tile's partial
// last block). Candidate-candidate blocks are never computed: a candidate's own key is one
// extra scalar score per row (CUDA cores) folded into the softmax before normalising.
//
// Precision: scores and softmax in float32; P enters P V rounded to the input dtype (bf16: 8
// bits of mantissa, as FlashAttention and cuDNN do), accumulation in float32.
#include <math.h>
#include <stdint.h>

#include <type_traits>

#include "attention_wgmma.cuh"
#include "attention_wgmma_ops.cuh"

namespace {

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

// Byte offset of row r, 16-byte chunk c (of DH / 8) in a swizzled [rows][DH] tile.
__device__ __forceinline__ uint32_t swz(int rows, int r, int c)
{
    return (uint32_t)((c >> 3) * rows * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

__device__ __forceinline__ void cp16(uint32_t dst, const void *src, bool ok)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

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

template <int DH, int BN> struct layout {
    static constexpr int Q_BYTES = QT * DH * 2;
    static constexpr int KV_BYTES = BN * DH * 2; // one of K or V, one stage
    static constexpr int SMEM = Q_BYTES + 4 * KV_BYTES + 1024; // + slack to align to 1024
};

template <typename T, int DH, int BN>
__global__ void __launch_bounds__(THREADS, 1)
    attn_wg_kernel(const fl_attn_tile *tiles, const int32_t *qpos, int heads, float scale_log2, const T *q,
                   int64_t ldq, const T *k, const T *v, int64_t ldkv, T *out, int64_t ldo)
{
#ifdef FL_WG_DEVICE
    using L = layout<DH, BN>;
    constexpr int CH = DH / 8; // 16-byte chunks per row
    extern __shared__ uint8_t smem_raw[];
    const uint32_t base = ((uint32_t)__cvta_generic_to_shared(smem_raw) + 1023u) & ~1023u;
    const uint32_t qs = base, ks0 = base + L::Q_BYTES, vs0 = ks0 + 2 * L::KV_BYTES;

    const int64_t item = blockIdx.x;
    const fl_attn_tile tile = tiles[item / heads];
    const int64_t col = (int64_t)(item % heads) * DH;
    const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int n = tile.n_hist;
    auto pos_of = [&](int r) { return tile.qpos_idx < 0 ? tile.pos0 + r : qpos[tile.qpos_idx + r]; };
    auto nvis_of = [&](int p) { return p < n ? p + 1 : n; };
    const int kend = nvis_of(pos_of(tile.nq - 1)); // positions ascend within a tile

    // this thread's rows (i = 0: row g, 1: row g + 8 of its warp's 16) and its warpgroup's span
    int pos[2], nvis[2];
    bool valid[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = wg * 64 + warp * 16 + g + 8 * i;
        valid[i] = r < tile.nq;
        pos[i] = valid[i] ? pos_of(r) : -1;
        nvis[i] = valid[i] ? nvis_of(pos[i]) : 0;
    }
    const int wg_first = wg * 64, wg_last = min(tile.nq, wg * 64 + 64) - 1;
    const int wg_kend = wg_first <= wg_last ? nvis_of(pos_of(wg_last)) : 0;
    const int wg_full = wg_first <= wg_last ? nvis_of(pos_of(wg_first)) : 0; // keys every row sees

    const int nblk = (kend + BN - 1) / BN;
    auto load_kv = [&](int blk, int stage) {
        const int kb = blk * BN;
        const uint32_t kd = ks0 + stage * L::KV_BYTES, vd = vs0 + stage * L::KV_BYTES;
#pragma unroll
        for (int c0 = 0; c0 < BN * CH; c0 += THREADS) {
            const int c = c0 + tid, r = c / CH, ch = c % CH;
            const bool ok = kb + r < kend;
            const int64_t off = (tile.seq_row + (ok ? kb + r : 0)) * ldkv + col + ch * 8;
            cp16(kd + swz(BN, r, ch), k + off, ok);
            cp16(vd + swz(BN, r, ch), v + off, ok);
        }
    };
    if (nblk > 0) {
#pragma unroll
        for (int c0 = 0; c0 < QT * CH; c0 += THREADS) {
            const int c = c0 + tid, r = c / CH, ch = c % CH;
            const bool ok = r < tile.nq;
            cp16(qs + swz(QT, r, ch), q + (tile.q_row + (ok ? r : 0)) * ldq + col + ch * 8, ok);
        }
        load_kv(0, 0);
        cp_commit();
    }

    float o[DH / 2];
#pragma unroll
    for (int j = 0; j < DH / 2; j++) o[j] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int blk = 0; blk < nblk; blk++) {
        const int stage = blk & 1, kb = blk * BN;
        if (blk + 1 < nblk) {
            load_kv(blk + 1, stage ^ 1);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        fence_async_smem();
        __syncthreads();
        if (kb < wg_kend) { // warpgroup-uniform
            const uint32_t kd = ks0 + stage * L::KV_BYTES, vd = vs0 + stage * L::KV_BYTES;
            float s[BN / 2];
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < DH / 16; kk++)
                mma<T, BN>::template ss<0>(s, desc(qs + (kk >> 2) * QT * 128 + wg * 64 * 128 + (kk & 3) * 32, 16, 1024),
                                           desc(kd + (kk >> 2) * BN * 128 + (kk & 3) * 32, 16, 1024), kk > 0);
            wg_commit();
            wg_wait0();
            fence_regs(s);
            // accumulator element 4j + e: row g + 8 (e >> 1), key kb + 8j + 2t + (e & 1)
            float mx[2] = {-INFINITY, -INFINITY};
            const bool masked = kb + BN > wg_full;
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = e >> 1;
                    if (masked && kb + 8 * j + 2 * t + (e & 1) >= nvis[i]) s[4 * j + e] = -INFINITY;
                    mx[i] = fmaxf(mx[i], s[4 * j + e]);
                }
            float sub[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const float m_new = fmaxf(m[i], quad_max(mx[i]) * scale_log2); // scale > 0: max commutes
                sub[i] = m_new == -INFINITY ? 0.0f : m_new; // nothing visible yet: exp2(-inf) = 0, never NaN
                const float alpha = fast_exp2(m[i] - sub[i]);
                m[i] = m_new;
                l[i] *= alpha;
#pragma unroll
                for (int j = 0; j < DH / 8; j++) {
                    o[4 * j + 2 * i] *= alpha;
                    o[4 * j + 2 * i + 1] *= alpha;
                }
            }
            uint32_t p[BN / 16][4];
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                float e4[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    e4[e] = fast_exp2(fmaf(s[4 * j + e], scale_log2, -sub[e >> 1]));
                    l[e >> 1] += e4[e];
                }
                // n-tile j of S is half of k-step j / 2 of P: (c0, c1) -> a0 or a2, (c2, c3) -> a1 or a3
                p[j >> 1][(j & 1) * 2] = pack<T>(e4[0], e4[1]);
                p[j >> 1][(j & 1) * 2 + 1] = pack<T>(e4[2], e4[3]);
            }
            fence_regs(o); // the rescaled accumulators and P are written before the fence
            wg_fence();
#pragma unroll
            for (int ks = 0; ks < BN / 16; ks++)
                mma<T, DH>::template rs<1>(o, p[ks], desc(vd + ks * 16 * 128, BN * 128, 1024), 1);
            wg_commit();
            wg_wait0();
            fence_regs(o);
        }
        __syncthreads(); // the stage is refilled by the next iteration's prefetch
    }

    // a candidate also sees its own key: one more softmax step with that single score
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const bool self = valid[i] && pos[i] >= n;
        const int r = wg * 64 + warp * 16 + g + 8 * i;
        float part = 0.0f;
        if (self) {
            const T *qr = q + (tile.q_row + r) * ldq + col, *kr = k + (tile.seq_row + pos[i]) * ldkv + col;
#pragma unroll
            for (int c = t; c < CH; c += 4) {
                const uint4 qv = *reinterpret_cast<const uint4 *>(qr + 8 * c);
                const uint4 kv = *reinterpret_cast<const uint4 *>(kr + 8 * c);
                const uint32_t qw[4] = {qv.x, qv.y, qv.z, qv.w}, kw[4] = {kv.x, kv.y, kv.z, kv.w};
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const float2 a = unpack<T>(qw[u]), b = unpack<T>(kw[u]);
                    part = fmaf(a.x, b.x, fmaf(a.y, b.y, part));
                }
            }
        }
        const float sself = quad_sum(part) * scale_log2; // every lane takes part in the shuffles
        if (!self) continue;
        const float m_new = fmaxf(m[i], sself);
        const float alpha = fast_exp2(m[i] - m_new), ps = fast_exp2(sself - m_new);
        m[i] = m_new;
        l[i] = l[i] * alpha + (t == 0 ? ps : 0.0f); // counted once per quad
        const T *vr = v + (tile.seq_row + pos[i]) * ldkv + col + 2 * t;
#pragma unroll
        for (int j = 0; j < DH / 8; j++) {
            const float2 vv = unpack<T>(*reinterpret_cast<const uint32_t *>(vr + 8 * j));
            o[4 * j + 2 * i] = o[4 * j + 2 * i] * alpha + ps * vv.x;
            o[4 * j + 2 * i + 1] = o[4 * j + 2 * i + 1] * alpha + ps * vv.y;
        }
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const float lsum = quad_sum(l[i]);
        if (!valid[i]) continue;
        const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f; // no visible key: zeros, never NaN
        const int r = wg * 64 + warp * 16 + g + 8 * i;
        T *orow = out + (tile.q_row + r) * ldo + col + 2 * t;
#pragma unroll
        for (int j = 0; j < DH / 8; j++)
            *reinterpret_cast<uint32_t *>(orow + 8 * j) = pack<T>(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
    }
#endif
}

template <typename T, int DH, int BN>
flame_status launch(const fl_attn_tile *tiles, int64_t num_tiles, const int32_t *qpos, int32_t heads, const T *q,
                    int64_t ldq, const T *k, const T *v, int64_t ldkv, T *out, int64_t ldo, cudaStream_t s)
{
    constexpr int smem = layout<DH, BN>::SMEM;
    // above the default 48 KiB; set on every launch, as the attribute is per device
    const cudaError_t e = cudaFuncSetAttribute(attn_wg_kernel<T, DH, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    FL_CUDA_TRY(e);
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)DH);
    attn_wg_kernel<T, DH, BN><<<(unsigned)(num_tiles * heads), THREADS, smem, s>>>(tiles, qpos, heads, scale_log2, q,
                                                                                   ldq, k, v, ldkv, out, ldo);
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
                                  int64_t ldo, cudaStream_t s, int bn)
{
    if (num_tiles == 0) return FLAME_OK;
    if (!fl_cuda_attention_wg_fits<T>(dh, q, ldq, k, v, ldkv, out, ldo))
        return fl_error(FLAME_ERR_UNSUPPORTED,
                        "wgmma attention: needs a compute capability 9.0 GPU, head dim 64 or 128 (got %d) and "
                        "16-byte aligned rows", dh);
    if (heads <= 0 || num_tiles > INT32_MAX / heads)
        return fl_error(FLAME_ERR_INVALID_ARG, "wgmma attention: %lld tiles x %d heads exceed one launch (2^31 - 1 CTAs)",
                        (long long)num_tiles, heads);
    if (bn == 0) bn = dh == 64 ? 128 : 128;
    if (dh == 64)
        return bn == 64 ? launch<T, 64, 64>(tiles, num_tiles, qpos, heads, q, ldq, k, v, ldkv, out, ldo, s)
                        : launch<T, 64, 128>(tiles, num_tiles, qpos, heads, q, ldq, k, v, ldkv, out, ldo, s);
    return bn == 64 ? launch<T, 128, 64>(tiles, num_tiles, qpos, heads, q, ldq, k, v, ldkv, out, ldo, s)
                    : launch<T, 128, 128>(tiles, num_tiles, qpos, heads, q, ldq, k, v, ldkv, out, ldo, s);
}

#define INSTANTIATE(T)                                                                                         \
    template bool fl_cuda_attention_wg_fits<T>(int32_t, const T *, int64_t, const T *, const T *, int64_t,      \
                                               const T *, int64_t);                                            \
    template flame_status fl_cuda_attention_wg<T>(const fl_attn_tile *, int64_t, const int32_t *, int32_t,      \
                                                  int32_t, const T *, int64_t, const T *, const T *, int64_t, T *, \
                                                  int64_t, cudaStream_t, int);
INSTANTIATE(__half)
INSTANTIATE(__nv_bfloat16)
