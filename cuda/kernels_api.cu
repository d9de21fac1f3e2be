// The GPU side of the public kernels (flame/kernels.h, src/kernels/kernels_gpu.h): table
// uploads, the index arrays' way to the device, and the launches of the engine's embedding bag
// and attention dispatcher on the caller's stream.
//
// No call here waits for a stream or the device. Host index data reaches the device as
//   host arrays -> page-locked staging block (written in place: the attention plan, or the
//   embedding bag's ids packed as they are validated) -> cudaMemcpyAsync -> the block's device
//   twin -> kernels,
// all on the caller's stream. A staging block is a page-locked host buffer and a device buffer
// of the same size, both made once (the device one with cudaMallocAsync on the stream that first
// needs it) and never freed while the process runs, so a call allocates nothing (a per-call
// cudaMallocAsync from the default pool, whose release threshold of 0 hands its memory back at
// every synchronization, would map it again on the next call). A block is reused once an event
// recorded after the last kernel that reads it has completed (cudaEventQuery, which never
// waits); while every block is still in flight a new one is made, up to MAX_BLOCKS or
// MAX_POOL_BYTES (host bytes; the device twins as many), beyond which the oldest is waited for
// (back-pressure on a caller that enqueues faster than its stream runs).
#include <algorithm>
#include <atomic>
#include <mutex>
#include <string.h>
#include <type_traits>
#include <vector>

#include "attention_wgmma.cuh"
#include "kernels.cuh"

extern "C" {
#include "kernels/kernels_gpu.h"
#include "kernels/tbe_pack.h"
}

namespace {

// The calling thread's current device, set to `device` for the scope and restored after.
struct device_scope {
    int prev = -1;
    bool changed = false;
    cudaError_t err = cudaSuccess;
    explicit device_scope(int device)
    {
        err = cudaGetDevice(&prev);
        if (err == cudaSuccess && prev != device) {
            err = cudaSetDevice(device);
            changed = err == cudaSuccess;
        }
    }
    ~device_scope()
    {
        if (changed) cudaSetDevice(prev);
    }
};

#define SCOPE(device)                                                                                          \
    device_scope scope_(device);                                                                               \
    FL_CUDA_TRY(scope_.err)

struct stage_block {
    int device;
    void *host;
    void *dev; // the device twin, made on first use (stage_to_device)
    size_t cap;
    cudaEvent_t done;
    uint64_t used; // release order, for waiting on the oldest
};

constexpr int MAX_BLOCKS = 64;
constexpr size_t MAX_POOL_BYTES = (size_t)256 << 20;
constexpr size_t MIN_BLOCK = 64 * 1024;

std::mutex pool_mu;
std::vector<stage_block *> pool_free; // blocks not handed out (their last copy may still run)
int pool_count = 0;                   // blocks made, handed out or not
size_t pool_bytes = 0;                // their bytes
uint64_t pool_clock = 0;

// A staging block of at least `bytes` on the current device whose previous copy is done: a
// free one whose event has completed, else a new one, else (64 blocks or 256 MiB made) the
// oldest free one that is large enough, once its copy is done. Blocks are never freed while
// the process runs (cudaFreeHost could synchronize the device).
flame_status stage_acquire(int device, size_t bytes, stage_block **out)
{
    *out = nullptr;
    size_t cap = MIN_BLOCK;
    while (cap < bytes) cap *= 2;
    std::unique_lock<std::mutex> lk(pool_mu);
    stage_block *oldest = nullptr;
    size_t oldest_at = 0;
    for (size_t i = 0; i < pool_free.size(); i++) {
        stage_block *b = pool_free[i];
        if (b->device != device || b->cap < bytes) continue;
        if (cudaEventQuery(b->done) == cudaSuccess) {
            pool_free.erase(pool_free.begin() + (long)i);
            *out = b;
            return FLAME_OK;
        }
        (void)cudaGetLastError(); // cudaErrorNotReady is no error of the caller's
        if (!oldest || b->used < oldest->used) {
            oldest = b;
            oldest_at = i;
        }
    }
    if (oldest && (pool_count >= MAX_BLOCKS || pool_bytes + cap > MAX_POOL_BYTES)) {
        pool_free.erase(pool_free.begin() + (long)oldest_at);
        lk.unlock();
        const cudaError_t e = cudaEventSynchronize(oldest->done); // back-pressure
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            std::lock_guard<std::mutex> g(pool_mu);
            pool_free.push_back(oldest);
            return fl_error(FLAME_ERR_INTERNAL, "staging: cudaEventSynchronize: %s", cudaGetErrorString(e));
        }
        *out = oldest;
        return FLAME_OK;
    }
    pool_count++;
    pool_bytes += cap;
    lk.unlock();
    stage_block *b = new (std::nothrow) stage_block{device, nullptr, nullptr, cap, nullptr, 0};
    cudaError_t e = b ? cudaHostAlloc(&b->host, cap, cudaHostAllocPortable) : cudaErrorMemoryAllocation;
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&b->done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (b && b->host) cudaFreeHost(b->host);
        delete b;
        std::lock_guard<std::mutex> g(pool_mu);
        pool_count--;
        pool_bytes -= cap;
        return fl_error(FLAME_ERR_NOMEM, "staging: %zu bytes of page-locked memory: %s", cap, cudaGetErrorString(e));
    }
    *out = b;
    return FLAME_OK;
}

// Hands a block back after everything that reads it (its copy, the kernels reading its device
// twin) was enqueued on `s`.
void stage_release(stage_block *b, cudaStream_t s)
{
    if (cudaEventRecord(b->done, s) != cudaSuccess) { // cannot tell when the copy ends: wait for it
        (void)cudaGetLastError();
        cudaStreamSynchronize(s);
        (void)cudaGetLastError();
    }
    std::lock_guard<std::mutex> g(pool_mu);
    b->used = ++pool_clock;
    pool_free.push_back(b);
}

// Hands back a block nothing was enqueued for (its event still marks its previous use).
void stage_giveback(stage_block *b)
{
    std::lock_guard<std::mutex> g(pool_mu);
    pool_free.push_back(b);
}

// The block's device twin (made once, on s) holds a copy of its first `bytes`, enqueued on s.
// On failure the block is given back.
flame_status stage_to_device(stage_block *b, size_t bytes, cudaStream_t s)
{
    cudaError_t e = cudaSuccess;
    if (!b->dev) e = cudaMallocAsync(&b->dev, b->cap, s);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        b->dev = nullptr;
        stage_giveback(b);
        return fl_error(e == cudaErrorMemoryAllocation ? FLAME_ERR_NOMEM : FLAME_ERR_INTERNAL,
                        "staging: %zu bytes on device %d: %s", b->cap, b->device, cudaGetErrorString(e));
    }
    e = cudaMemcpyAsync(b->dev, b->host, bytes, cudaMemcpyHostToDevice, s);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        stage_release(b, s);
        return fl_error(FLAME_ERR_INTERNAL, "copying %zu bytes of indices to device %d: %s", bytes, b->device,
                        cudaGetErrorString(e));
    }
    return FLAME_OK;
}

// Index data is staged per call, so a call cannot be captured into a CUDA graph (a replay
// would copy whatever a reused staging block then holds): refused before anything is enqueued.
flame_status not_capturing(cudaStream_t s)
{
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    const cudaError_t e = cudaStreamIsCapturing(s, &cs);
    if (e != cudaSuccess) (void)cudaGetLastError();
    if (e != cudaSuccess || cs != cudaStreamCaptureStatusNone)
        return fl_error(FLAME_ERR_UNSUPPORTED, "the stream is being captured into a CUDA graph (%s): these calls stage "
                        "their index data per call and cannot be replayed", e != cudaSuccess ? cudaGetErrorString(e) : "active");
    return FLAME_OK;
}

// FLAME_OK when p is memory kernels on `device` may read or write: device memory of that device,
// managed memory, or page-locked host memory; a pageable host pointer (or another device's) would
// fault in the kernel and poison the caller's CUDA context, so it is refused here.
// `table` >= 0: the name is "table <table> <what>" (formatted only for a message).
flame_status device_pointer(int device, const void *p, const char *what, int table = -1)
{
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, p);
    const bool foreign = e == cudaSuccess && a.type == cudaMemoryTypeDevice && a.device != device;
    if (e == cudaSuccess && a.type != cudaMemoryTypeUnregistered && !foreign) return FLAME_OK;
    char name[64];
    if (table >= 0)
        snprintf(name, sizeof name, "table %d %s", table, what);
    else
        snprintf(name, sizeof name, "%s", what);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fl_error(FLAME_ERR_INVALID_ARG, "%s %p is not memory CUDA knows (%s)", name, p, cudaGetErrorString(e));
    }
    if (a.type == cudaMemoryTypeUnregistered)
        return fl_error(FLAME_ERR_INVALID_ARG, "%s %p is pageable host memory, not memory of device %d", name, p, device);
    return fl_error(FLAME_ERR_INVALID_ARG, "%s %p is memory of device %d, not of device %d", name, p, a.device, device);
}

// ---- device indices: validation on the stream before the lookup

// One table's device index arrays, as the validation kernels read them.
struct tbe_check_table {
    const int64_t *ids, *offsets; // offsets NULL: bag b = {ids[b]}
    const float *weights;
    int64_t num_ids, rows;
};

struct tbe_check_args {
    tbe_check_table t[FL_TBE_MAX_TABLES];
    int64_t batch;
    int32_t num_tables;
};

constexpr unsigned long long NO_KEY = ~0ull;

__device__ __forceinline__ unsigned long long bad_key(int table, int phase, int64_t position, int sub)
{
    return ((unsigned long long)table << 56) | ((unsigned long long)phase << 55) |
           ((unsigned long long)position << 1) | (unsigned long long)sub;
}

// One thread of the last block: describes the record's key (the table, the bag, the value)
// unless an earlier forward's key is described already.
__device__ __forceinline__ void tbe_describe(const tbe_check_args &a, fl_tbe_index_record *rec)
{
    const unsigned long long key = *reinterpret_cast<volatile unsigned long long *>(&rec->key);
    if (key == NO_KEY || rec->detail_key != NO_KEY) return;
    const int t = (int)(key >> 56), phase = (int)((key >> 55) & 1), sub = (int)(key & 1);
    const int64_t pos = (int64_t)((key >> 1) & ((1ull << 54) - 1));
    // a key outside this launch's arrays is another launch's (forwards on unordered streams, which
    // the header asks callers not to do): left to that launch's last block, never read here
    if (t >= a.num_tables) return;
    const tbe_check_table &c = a.t[t];
    if (phase == 0 ? (!c.offsets || pos > a.batch) : pos >= c.num_ids) return;
    rec->table = t;
    rec->num_ids = c.num_ids;
    rec->index = pos;
    rec->weight = 0;
    rec->prev = 0;
    if (phase == 0) {
        rec->value = c.offsets[pos];
        if (pos == 0 && c.offsets[0] != 0) {
            rec->kind = FL_TBE_BAD_OFFSET_START;
            rec->bag = 0;
        } else if (pos > 0 && (c.offsets[pos] < c.offsets[pos - 1] || c.offsets[pos] > c.num_ids)) {
            rec->kind = FL_TBE_BAD_OFFSET_ORDER;
            rec->bag = pos - 1;
            rec->prev = c.offsets[pos - 1];
        } else {
            rec->kind = FL_TBE_BAD_OFFSET_END;
            rec->bag = pos > 0 ? pos - 1 : 0;
        }
    } else {
        int64_t bag = pos; // without offsets, one id a bag
        if (c.offsets) {   // the table's offsets are valid (an offset error has a smaller key)
            int64_t lo = 0, hi = a.batch - 1; // the first bag b with offsets[b + 1] > pos
            while (lo < hi) {
                const int64_t mid = lo + (hi - lo) / 2;
                if (c.offsets[mid + 1] > pos)
                    hi = mid;
                else
                    lo = mid + 1;
            }
            bag = lo;
        }
        rec->bag = bag;
        rec->kind = sub ? FL_TBE_BAD_WEIGHT : FL_TBE_BAD_ID;
        rec->value = c.ids[pos];
        if (sub) rec->weight = (double)c.weights[pos];
    }
    __threadfence();
    rec->detail_key = key;
}

// An L2 policy that keeps the lines it loads ahead of others (evict_last): the lookup launched
// next reads the same ids again, after other rows have streamed through the cache.
__device__ __forceinline__ uint64_t keep_policy()
{
    uint64_t p;
    asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}
__device__ __forceinline__ int64_t load_keep(const int64_t *a, uint64_t policy)
{
    int64_t x;
    asm volatile("ld.global.nc.L2::cache_hint.b64 %0, [%1], %2;\n" : "=l"(x) : "l"(a), "l"(policy));
    return x;
}

// Values a thread of tbe_check_kernel loads before it checks any: all in flight at once, so a
// launch of about one wave reads the ids at the memory's bandwidth instead of one dependent
// load after another.
constexpr int CHECK_THREADS = 256, CHECK_UNROLL = 8;
constexpr int64_t CHECK_CHUNK = (int64_t)CHECK_THREADS * CHECK_UNROLL; // positions a block checks a step

// blockIdx.y = table; each block checks chunks of CHECK_THREADS x CHECK_UNROLL consecutive
// positions of offsets[0..batch] (phase 0) then ids/weights (phase 1), and lowers rec->key to
// the smallest bad position's key. An earlier forward's error, once described, stays: the record
// keeps the first error until it is read. The last block to finish (counted in
// rec->blocks_done, set back to 0 by it) describes the key, so the lookup launched next finds the
// record complete without a third launch.
__global__ void __launch_bounds__(CHECK_THREADS) tbe_check_kernel(const __grid_constant__ tbe_check_args a,
                                                                  fl_tbe_index_record *rec)
{
#if __CUDA_ARCH__ >= 900
    // the lookup may launch now: it waits for this grid before it reads the verdict (embedding.cuh)
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
    const bool described = *reinterpret_cast<volatile unsigned long long *>(&rec->detail_key) != NO_KEY;
    const int t = (int)blockIdx.y;
    const tbe_check_table &c = a.t[t];
    const int64_t noff = c.offsets ? a.batch + 1 : 0, n = described ? 0 : noff + c.num_ids;
    unsigned long long mine = NO_KEY;
    const uint64_t keep = keep_policy();
    for (int64_t base = blockIdx.x * CHECK_CHUNK + threadIdx.x; base < n && mine == NO_KEY;
         base += gridDim.x * CHECK_CHUNK) {
        int64_t v[CHECK_UNROLL], prev[CHECK_UNROLL];
        float w[CHECK_UNROLL];
#pragma unroll
        for (int u = 0; u < CHECK_UNROLL; u++) {
            const int64_t j = base + (int64_t)u * CHECK_THREADS;
            const bool off = j < noff, id = !off && j < n;
            v[u] = off ? c.offsets[j] : id ? load_keep(c.ids + (j - noff), keep) : 0;
            prev[u] = off && j > 0 ? c.offsets[j - 1] : 0;
            w[u] = id && c.weights ? c.weights[j - noff] : 0.0f;
        }
        // in position order: a thread's first bad value is its smallest key
#pragma unroll
        for (int u = 0; u < CHECK_UNROLL; u++) {
            const int64_t j = base + (int64_t)u * CHECK_THREADS;
            if (mine != NO_KEY || j >= n) continue;
            if (j < noff) {
                const int64_t o = v[u];
                if ((j == 0 ? o != 0 : (o < prev[u] || o > c.num_ids)) || (j == a.batch && o != c.num_ids))
                    mine = bad_key(t, 0, j, 0);
            } else if (v[u] < 0 || v[u] >= c.rows) {
                mine = bad_key(t, 1, j - noff, 0);
            } else if (!isfinite(w[u])) {
                mine = bad_key(t, 1, j - noff, 1);
            }
        }
    }
    if (mine != NO_KEY) {
        atomicMin(reinterpret_cast<unsigned long long *>(&rec->key), mine);
        __threadfence();
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    __threadfence();
    if (atomicAdd(&rec->blocks_done, 1u) != gridDim.x * gridDim.y - 1) return;
    __threadfence(); // every block's atomicMin is visible from here
    rec->blocks_done = 0;
    if (!described) tbe_describe(a, rec);
}

template <typename T>
flame_status attention(const fl_attn_seq *seqs, int64_t num_seqs, int64_t rows, bool none_mask, int32_t heads,
                       int32_t dh, const void *qv, int64_t ldq, const void *kv, const void *vv, int64_t ldkv,
                       void *outv, int64_t ldo, bool fused, int device, cudaStream_t s)
{
    const T *q = static_cast<const T *>(qv), *k = static_cast<const T *>(kv), *v = static_cast<const T *>(vv);
    T *out = static_cast<T *>(outv);
    FL_TRY(not_capturing(s));
    FL_TRY(device_pointer(device, q, fused ? "qkv" : "q"));
    if (!fused) { // (fused: K and V are columns of the same array)
        FL_TRY(device_pointer(device, k, "k"));
        FL_TRY(device_pointer(device, v, "v"));
    }
    FL_TRY(device_pointer(device, out, "out"));
    int32_t tq = fl_cuda_attention_tile_queries((int32_t)sizeof(T), dh, rows, heads);
    if constexpr (!std::is_same<T, float>::value) // (the Hopper kernel takes fp16/bf16 only)
        if (tq == FL_ATTN_QT_WG && !fl_cuda_attention_wg_fits<T>(dh, q, ldq, k, v, ldkv, out, ldo)) tq = FL_ATTN_QT;
    if (none_mask && rows > INT32_MAX)
        return fl_error(FLAME_ERR_UNSUPPORTED, "attention: the NONE mask on a GPU takes up to 2^31-1 rows, not %lld",
                        (long long)rows);
    int64_t num_tiles = 0;
    for (int64_t i = 0; i < num_seqs; i++) num_tiles += ((int64_t)seqs[i].len + tq - 1) / tq;
    if (num_tiles == 0) return FLAME_OK;
    // the plan is written straight into a staging block: the tiles, then (NONE) each row's
    // query position, then the persistent Hopper kernel's two work counters, zero (the block is
    // this call's alone until the kernel has run, and the kernel leaves them zero)
    const size_t qpos_at = ((size_t)num_tiles * sizeof(fl_attn_tile) + 15) & ~(size_t)15;
    const size_t work_at = (qpos_at + (none_mask ? (size_t)rows * sizeof(int32_t) : 0) + 7) & ~(size_t)7;
    const size_t total = work_at + 2 * sizeof(uint32_t);
    stage_block *b;
    FL_TRY(stage_acquire(device, total, &b));
    fl_attn_tile *tiles = static_cast<fl_attn_tile *>(b->host);
    int32_t *qpos = reinterpret_cast<int32_t *>(static_cast<uint8_t *>(b->host) + qpos_at);
    memset(static_cast<uint8_t *>(b->host) + work_at, 0, 2 * sizeof(uint32_t));
    int64_t n = 0, max_keys = 0;
    for (int64_t i = 0; i < num_seqs; i++) {
        const fl_attn_seq &sq = seqs[i];
        max_keys = std::max<int64_t>(max_keys, sq.n_hist);
        for (int64_t q0 = 0; q0 < sq.len; q0 += tq) {
            const int32_t nq = (int32_t)(sq.len - q0 < tq ? sq.len - q0 : tq);
            tiles[n++] = {sq.row, sq.n_hist, nq, sq.row + q0, (int32_t)q0, none_mask ? (int32_t)(sq.row + q0) : -1};
        }
        if (none_mask) std::fill(qpos + sq.row, qpos + sq.row + sq.len, sq.len - 1);
    }
    if (tq == FL_ATTN_QT_WG) // the 128-query kernel runs tiles in list order: the longest first
        std::stable_sort(tiles, tiles + num_tiles, [](const fl_attn_tile &a, const fl_attn_tile &b) {
            const int64_t ka = a.qpos_idx < 0 ? std::min<int64_t>(a.pos0 + a.nq, a.n_hist) : a.n_hist;
            const int64_t kb = b.qpos_idx < 0 ? std::min<int64_t>(b.pos0 + b.nq, b.n_hist) : b.n_hist;
            return ka > kb;
        });
    FL_TRY(stage_to_device(b, total, s));
    uint8_t *dev = static_cast<uint8_t *>(b->dev);
    const flame_status st = fl_cuda_attention<T>(
        {.tiles = reinterpret_cast<const fl_attn_tile *>(dev), .num_tiles = num_tiles,
         .qpos = none_mask ? reinterpret_cast<const int32_t *>(dev + qpos_at) : nullptr, .heads = heads, .dh = dh,
         .q = q, .ldq = ldq, .k = k, .v = v, .ldkv = ldkv, .out = out, .ldo = ldo, .tile_q = tq,
         .max_keys = max_keys, .work = reinterpret_cast<uint32_t *>(dev + work_at)},
        s);
    stage_release(b, s); // after the kernels that read its device twin
    return st;
}

} // namespace

extern "C" flame_status fl_gpu_kernels_device(int device)
{
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fl_error(FLAME_ERR_NO_DEVICE, "device %d: no usable CUDA device (%s)", device, cudaGetErrorString(e));
    }
    if (device >= n)
        return fl_error(FLAME_ERR_NO_DEVICE, "device %d: this machine has %d CUDA device%s", device, n, n == 1 ? "" : "s");
    return FLAME_OK;
}

extern "C" flame_status fl_gpu_kernels_upload(int device, const void *host, size_t bytes, void **dev)
{
    *dev = nullptr;
    if (bytes == 0) return FLAME_OK;
    SCOPE(device);
    FL_CUDA_TRY(cudaMalloc(dev, bytes));
    const cudaError_t e = cudaMemcpy(*dev, host, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(*dev);
        *dev = nullptr;
        return fl_error(FLAME_ERR_INTERNAL, "uploading %zu bytes to device %d: %s", bytes, device, cudaGetErrorString(e));
    }
    return FLAME_OK;
}

extern "C" flame_status fl_gpu_kernels_check_pointer(int device, const void *p, const char *what)
{
    SCOPE(device);
    return device_pointer(device, p, what);
}

extern "C" void fl_gpu_kernels_free(int device, void *dev)
{
    if (!dev) return;
    device_scope scope(device);
    cudaFree(dev);
}

extern "C" flame_status fl_gpu_kernels_copy_in(int device, void *dev, const void *host, size_t bytes, void *stream)
{
    if (bytes == 0) return FLAME_OK;
    SCOPE(device);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    FL_TRY(not_capturing(s));
    stage_block *b;
    FL_TRY(stage_acquire(device, bytes, &b));
    memcpy(b->host, host, bytes);
    const cudaError_t e = cudaMemcpyAsync(dev, b->host, bytes, cudaMemcpyHostToDevice, s);
    stage_release(b, s);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return fl_error(FLAME_ERR_INTERNAL, "copying %zu bytes to device %d: %s", bytes, device, cudaGetErrorString(e));
    }
    return FLAME_OK;
}

// Both index modes (record NULL: host indices, staged; else device indices, validated on s).
static flame_status tbe_forward(int device, const fl_tbe_table *tables, int num_tables, bool sum_combine,
                                int32_t width, const fl_tbe_lookup *lookups, int64_t batch, void *out, int64_t ld_out,
                                flame_dtype out_dtype, void *stream, fl_tbe_index_record *record, int threads)
{
    SCOPE(device);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    FL_TRY(not_capturing(s));
    FL_TRY(device_pointer(device, out, "out"));
    const bool on_device = record != nullptr;
    size_t at[3 * FL_TBE_MAX_TABLES] = {}; // host indices: where table t's ids, offsets, weights are staged
    stage_block *b = nullptr;
    if (on_device) {
        tbe_check_args a{};
        a.batch = batch;
        a.num_tables = num_tables;
        int64_t most = 0;
        for (int t = 0; t < num_tables; t++) {
            const fl_tbe_lookup &lk = lookups[t];
            if (lk.num_ids > 0) FL_TRY(device_pointer(device, lk.ids, "ids", t));
            if (lk.offsets) FL_TRY(device_pointer(device, lk.offsets, "offsets", t));
            if (lk.weights && lk.num_ids > 0) FL_TRY(device_pointer(device, lk.weights, "weights", t));
            a.t[t] = {lk.ids, lk.offsets, lk.weights, lk.num_ids, tables[t].rows};
            most = std::max(most, lk.num_ids + (lk.offsets ? batch + 1 : 0));
        }
        // about one wave of blocks in all (each thread's loads all in flight, see CHECK_UNROLL):
        // more would wait for a second wave, and every block ends with an atomicAdd on the
        // record's one count
        int sms = 0;
        FL_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        // (blocks an SM holds: asked once a process; only the grid's size depends on it)
        static std::atomic<int> per_sm{0};
        if (per_sm.load(std::memory_order_relaxed) == 0) {
            int k = 0;
            FL_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&k, tbe_check_kernel, CHECK_THREADS, 0));
            per_sm.store(k > 0 ? k : 1, std::memory_order_relaxed);
        }
        const int64_t wave = (int64_t)sms * per_sm.load();
        const unsigned blocks = (unsigned)std::min<int64_t>((most + CHECK_CHUNK - 1) / CHECK_CHUNK,
                                                            std::max<int64_t>(1, wave / num_tables));
        tbe_check_kernel<<<dim3(blocks ? blocks : 1, (unsigned)num_tables), CHECK_THREADS, 0, s>>>(a, record);
        FL_CUDA_TRY(cudaGetLastError());
    } else {
        // the lengths first (num_ids >= 0 sizes the block), then the values as they are packed
        for (int t = 0; t < num_tables; t++) {
            if (lookups[t].num_ids < 0) // reported in the order of the host checks
                return fl_tbe_check_pack(tables, lookups, num_tables, batch, nullptr, nullptr, threads);
            if (lookups[t].num_ids > (INT64_C(1) << 47))
                return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %d: num_ids %lld is outside 0..2^47", t,
                                (long long)lookups[t].num_ids);
        }
        size_t total = 0;
        for (int t = 0; t < num_tables; t++) {
            const fl_tbe_lookup &lk = lookups[t];
            const size_t bytes[3] = {(size_t)lk.num_ids * sizeof(int64_t),
                                     lk.offsets ? (size_t)(batch + 1) * sizeof(int64_t) : 0,
                                     lk.weights ? (size_t)lk.num_ids * sizeof(float) : 0};
            for (int k = 0; k < 3; k++) {
                at[3 * t + k] = total;
                total += (bytes[k] + 15) & ~(size_t)15;
            }
        }
        FL_TRY(stage_acquire(device, total ? total : 16, &b));
        const flame_status st = fl_tbe_check_pack(tables, lookups, num_tables, batch, b->host, at, threads);
        if (st) {
            stage_giveback(b);
            return st;
        }
        FL_TRY(stage_to_device(b, total, s));
    }
    fl_dev_features fs{};
    fs.skip_unless_clear = on_device ? reinterpret_cast<const unsigned long long *>(&record->key) : nullptr;
    fs.count = num_tables;
    fs.width = width;
    fs.concat = sum_combine ? 0 : 1;
    flame_dtype float_dtype = FLAME_DTYPE_F32; // the tables' common float dtype (F32 when all are INT8)
    for (int t = 0; t < num_tables; t++) {
        const fl_tbe_table &tb = tables[t];
        fl_dev_feature &f = fs.f[t];
        f.table = tb.data;
        f.dim = tb.dim;
        f.pooling = tb.pooling == FLAME_POOLING_MEAN ? 1 : 0;
        f.out_col = tb.col;
        if (on_device) {
            f.ids = lookups[t].ids;
            f.offsets = lookups[t].offsets;
            f.weights = lookups[t].weights;
            f.rows = tb.rows;
            f.num_ids = lookups[t].num_ids;
        } else {
            const uint8_t *dev = static_cast<const uint8_t *>(b->dev);
            f.ids = reinterpret_cast<const int64_t *>(dev + at[3 * t]);
            f.offsets = lookups[t].offsets ? reinterpret_cast<const int64_t *>(dev + at[3 * t + 1]) : nullptr;
            f.weights = lookups[t].weights ? reinterpret_cast<const float *>(dev + at[3 * t + 2]) : nullptr;
        }
        f.qparams = tb.dtype == FLAME_DTYPE_INT8 ? tb.qparams : nullptr;
        if (tb.dtype != FLAME_DTYPE_INT8) float_dtype = tb.dtype;
    }
    // the tables' float type, then the output's
    const flame_status st = FL_DTYPE_SWITCH(float_dtype, T, [&] {
        return FL_DTYPE_SWITCH(out_dtype, OutT,
                               [&] { return fl_cuda_embedding_bag<T, OutT>(fs, batch, static_cast<OutT *>(out), ld_out, s); });
    });
    if (b) stage_release(b, s); // after the lookup that reads its device twin
    return st;
}

extern "C" flame_status fl_gpu_tbe_forward(int device, const fl_tbe_table *tables, int num_tables, bool sum_combine,
                                           int32_t width, const fl_tbe_lookup *lookups, int64_t batch, void *out,
                                           int64_t ld_out, flame_dtype out_dtype, void *stream, int threads)
{
    return tbe_forward(device, tables, num_tables, sum_combine, width, lookups, batch, out, ld_out, out_dtype, stream,
                       nullptr, threads);
}

extern "C" flame_status fl_gpu_tbe_forward_device(int device, const fl_tbe_table *tables, int num_tables,
                                                  bool sum_combine, int32_t width, const fl_tbe_lookup *lookups,
                                                  int64_t batch, void *out, int64_t ld_out, flame_dtype out_dtype,
                                                  void *stream, fl_tbe_index_record *record)
{
    return tbe_forward(device, tables, num_tables, sum_combine, width, lookups, batch, out, ld_out, out_dtype, stream,
                       record, 1);
}

extern "C" flame_status fl_gpu_tbe_record_create(int device, fl_tbe_index_record **record,
                                                 fl_tbe_index_record **mirror)
{
    *record = *mirror = nullptr;
    SCOPE(device);
    void *d = nullptr, *h = nullptr;
    fl_tbe_index_record clear;
    memset(&clear, 0xff, sizeof clear); // key = detail_key = ~0: nothing found
    clear.blocks_done = 0;
    clear.pad = 0;
    cudaError_t e = cudaMalloc(&d, sizeof(fl_tbe_index_record));
    // from pageable memory, so the copy is complete when it returns, before any stream uses it
    if (e == cudaSuccess) e = cudaMemcpy(d, &clear, sizeof clear, cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaHostAlloc(&h, sizeof(fl_tbe_index_record), cudaHostAllocPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (d) cudaFree(d);
        if (h) cudaFreeHost(h);
        return fl_error(FLAME_ERR_INTERNAL, "embedding bag: index record on device %d: %s", device, cudaGetErrorString(e));
    }
    *record = static_cast<fl_tbe_index_record *>(d);
    *mirror = static_cast<fl_tbe_index_record *>(h);
    return FLAME_OK;
}

extern "C" void fl_gpu_tbe_record_free(int device, fl_tbe_index_record *record, fl_tbe_index_record *mirror)
{
    device_scope scope(device);
    if (record) cudaFree(record);
    if (mirror) cudaFreeHost(mirror);
}

extern "C" flame_status fl_gpu_tbe_record_read(int device, fl_tbe_index_record *record, fl_tbe_index_record *mirror,
                                               void *stream)
{
    SCOPE(device);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    FL_TRY(not_capturing(s));
    FL_CUDA_TRY(cudaMemcpyAsync(mirror, record, sizeof *record, cudaMemcpyDeviceToHost, s));
    FL_CUDA_TRY(cudaMemsetAsync(record, 0xff, offsetof(fl_tbe_index_record, blocks_done), s));
    // (0 already after every ordered launch; reset too after unordered ones, which may mix counts)
    FL_CUDA_TRY(cudaMemsetAsync(&record->blocks_done, 0, sizeof record->blocks_done, s));
    FL_CUDA_TRY(cudaStreamSynchronize(s));
    return FLAME_OK;
}

extern "C" flame_status fl_gpu_attention(int device, flame_dtype dtype, const fl_attn_seq *seqs, int64_t num_seqs,
                                         int64_t rows, bool none_mask, int32_t heads, int32_t dh, const void *q,
                                         int64_t ldq, const void *k, const void *v, int64_t ldkv, void *out,
                                         int64_t ldo, bool fused, void *stream)
{
    SCOPE(device);
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    return FL_DTYPE_SWITCH(dtype, T, [&] {
        return attention<T>(seqs, num_seqs, rows, none_mask, heads, dh, q, ldq, k, v, ldkv, out, ldo, fused, device, s);
    });
}
