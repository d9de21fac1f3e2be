// Device top-k of score segments (topk.cuh). Keys are the scores mapped to unsigned integers
// in the same order (negative: bits inverted; positive: sign bit set; NaN: 0, below all), so
// the k-th largest is found by a most-significant-digit radix select: 4 passes of 8 bits,
// each a histogram of the candidates that still match the chosen prefix.
#include "topk.cuh"

namespace {

constexpr int THREADS = 512;
constexpr int MAX_K = 1024;

__device__ __forceinline__ uint32_t order_key(float f)
{
    if (f != f) return 0u;                               // NaN: below every number
    const uint32_t u = f == 0.0f ? 0u : __float_as_uint(f); // -0 as +0: they compare equal
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// (key, position) packed so that a larger value ranks first: key high, position inverted low
__device__ __forceinline__ uint64_t packed(uint32_t key, int i)
{
    return ((uint64_t)key << 32) | (0xFFFFFFFFu - (uint32_t)i);
}

__global__ void __launch_bounds__(THREADS) topk_kernel(const float *scores, const fl_topk_seg *segs, int tasks,
                                                       int task, int k, int32_t *pos_out, float *val_out,
                                                       int32_t *meta)
{
    __shared__ uint32_t hist[256];
    __shared__ uint32_t warp_ties[THREADS / 32];
    __shared__ uint64_t buf[MAX_K];
    __shared__ uint32_t s_prefix, s_mask, s_need, s_above, s_ties;
    const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    const fl_topk_seg sg = segs[r];
    const float *sc = scores + sg.off + task;
    const int m = sg.count, kk = m < k ? m : k;
    if (kk == 0) {
        if (tid == 0) meta[2 * r] = meta[2 * r + 1] = 0;
        return;
    }
    if (tid == 0) s_prefix = s_mask = s_above = s_ties = 0, s_need = (uint32_t)kk;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += THREADS) hist[i] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix, mask = s_mask;
        for (int i = tid; i < m; i += THREADS) {
            const uint32_t key = order_key(sc[(int64_t)i * tasks]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) { // the digit of the need-th largest among those matching the prefix
            uint32_t cum = 0;
            int b = 255;
            for (; b > 0; b--) {
                if (cum + hist[b] >= s_need) break;
                cum += hist[b];
            }
            s_need -= cum;
            s_prefix = prefix | ((uint32_t)b << shift);
            s_mask = mask | (255u << shift);
        }
        __syncthreads();
    }
    const uint32_t kth = s_prefix, take = s_need; // take of the candidates at the k-th key
    const int above = kk - (int)take;
    for (int i = tid; i < m; i += THREADS) { // every candidate above the k-th key, in any order
        const uint32_t key = order_key(sc[(int64_t)i * tasks]);
        if (key > kth) buf[atomicAdd(&s_above, 1u)] = packed(key, i);
    }
    // the earliest `take` at the k-th key, in candidate order: a block-wide count per chunk
    for (int c0 = 0; c0 < m; c0 += THREADS) {
        const int i = c0 + tid;
        const bool eq = i < m && order_key(sc[(int64_t)i * tasks]) == kth;
        const uint32_t bal = __ballot_sync(0xFFFFFFFFu, eq);
        if (lane == 0) warp_ties[wid] = __popc(bal);
        __syncthreads();
        uint32_t before = s_ties, total = 0;
        for (int w = 0; w < THREADS / 32; w++) {
            if (w < wid) before += warp_ties[w];
            total += warp_ties[w];
        }
        const uint32_t rank = before + __popc(bal & ((1u << lane) - 1u));
        if (eq && rank < take) buf[above + rank] = packed(kth, i);
        __syncthreads(); // s_ties and warp_ties read by all
        if (tid == 0) s_ties += total;
        __syncthreads();
        if (s_ties > take) break; // uniform: one tie more than taken is enough to know
    }
    int P = 1;
    while (P < kk) P <<= 1;
    for (int i = kk + tid; i < P; i += THREADS) buf[i] = 0; // below every candidate
    __syncthreads();
    for (int size = 2; size <= P; size <<= 1) // bitonic sort, descending
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < P / 2; i += THREADS) {
                const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                const bool desc = (lo & size) == 0;
                const uint64_t a = buf[lo], b = buf[hi];
                if ((a < b) == desc) buf[lo] = b, buf[hi] = a;
            }
            __syncthreads();
        }
    for (int j = tid; j < kk; j += THREADS) {
        const int i = (int)(0xFFFFFFFFu - (uint32_t)buf[j]);
        pos_out[(int64_t)r * k + j] = i;
        val_out[(int64_t)r * k + j] = sc[(int64_t)i * tasks];
    }
    if (tid == 0) {
        meta[2 * r] = kk;
        meta[2 * r + 1] = s_ties > take;
    }
}

} // namespace

flame_status fl_cuda_topk(const float *scores, const fl_topk_seg *segs, int32_t nseg, int32_t tasks, int32_t task,
                          int32_t k, int32_t *pos, float *val, int32_t *meta, cudaStream_t s)
{
    if (nseg == 0) return FLAME_OK;
    if (k < 1 || k > MAX_K || tasks < 1 || task < 0 || task >= tasks)
        return fl_error(FLAME_ERR_INTERNAL, "device top-k: k %d, task %d of %d", k, task, tasks);
    topk_kernel<<<(unsigned)nseg, THREADS, 0, s>>>(scores, segs, tasks, task, k, pos, val, meta);
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}
