// kernels-api-bench: the public kernels (flame/kernels.h) on a GPU, against the internal
// kernels they wrap and the device's copy bandwidth, measured in the same run.
//
//   bench/kernels-api-bench [--json] [--reps N] [--rows R]
//
// Cases:
//   tbe_T26_B4096_P20_D128_fp16: 26 borrowed device tables of R rows (1M by default; 256-byte
//     rows), 4096 bags of 20 uniform ids per table from host arrays, sum pooling, concat,
//     output [4096, 26*128] fp16. Reported: the device time of one call (CUDA events around
//     the call: the ids' copy in and the kernel), the host time of one call (validation of the
//     2.1M ids and their staging), and the throughput of back-to-back calls (wall time of
//     --reps calls and one synchronization); GB/s = (rows read + output written) / time.
//     Peers: the internal kernel (fl_cuda_embedding_bag) on device-resident ids, and a
//     device-to-device cudaMemcpyAsync (GB/s read + written). Also the API on the same
//     device-resident ids (device_indices = 1: the validation kernel and the lookup), device
//     and host time of one call (on an idle stream the device time includes the call's host
//     work), and the device time per call of --reps calls enqueued back to back; and the host ids validated and staged by 8 threads
//     (flame_embedding_bag_batch.threads = 8; the default is the calling thread alone).
//   sumi_attn_b<B>_l<L>_m<M>_h8_dh<D>: B sequences of L history + M candidate rows, 8 heads of
//     D, fused QKV, fp16, at the attention benchmark's shapes (B1 L256 M128, B8 L256 M128, B1
//     L1024 M128, B8 L1024 M512 dh64; B32 L1024 M512, B8 L4096 M512 dh128): device and host
//     time of one call; at B8 L1024 M512 dh64 also against the internal dispatcher
//     (fl_cuda_attention) on a tile list uploaded beforehand.
//   launch overhead: host us of one call at batch 1 (TBE T26 P20 D128; attention one sequence
//     of 64 + 16 rows).
// Times are medians over --reps. Outputs are checked for NaN (poisoned first); the values are
// checked by tests/test_kernels_api_cuda.cu.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels.cuh"

extern "C" {
#include "flame/kernels.h"
#include "cli_args.h"
}

#define CK(call)                                                                                               \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "kernels-api-bench: %s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)
#define FL(call)                                                                                               \
    do {                                                                                                       \
        flame_status s_ = (call);                                                                              \
        if (s_ != FLAME_OK) {                                                                                  \
            fprintf(stderr, "kernels-api-bench: %s: %s\n", #call, flame_last_error());                        \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

__global__ void fill_half(__half *x, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        x[i] = __float2half((float)((int)(h & 255) - 128) / 128.0f);
    }
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
}

static double now_us()
{
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static bool has_nan(const void *dev, size_t n_half)
{
    std::vector<__half> h(n_half);
    CK(cudaMemcpy(h.data(), dev, n_half * sizeof(__half), cudaMemcpyDeviceToHost));
    for (const __half &x : h)
        if (isnan(__half2float(x))) return true;
    return false;
}

struct tbe_result {
    double dev_us, host_us, thru_us, kernel_us, gbps, thru_gbps, kernel_gbps, copy_gbps, batch1_host_us;
    double devids_us, devids_host_us, devids_gbps; // the API on device-resident ids (device_indices)
    double devids_thru_us, devids_thru_gbps;       // the same, calls enqueued back to back
    double mt_us, mt_host_us, mt_gbps;             // host ids, validated and staged by 8 threads
    bool ok;
};

static tbe_result bench_tbe(int reps, int64_t rows, cudaStream_t s)
{
    const int T = 26, P = 20, D = 128;
    const int64_t B = 4096;
    tbe_result r{};
    __half *tab;
    const size_t n_tab = (size_t)T * rows * D;
    CK(cudaMalloc(&tab, n_tab * sizeof(__half)));
    fill_half<<<4096, 256, 0, s>>>(tab, n_tab, 1);
    CK(cudaGetLastError());
    std::vector<flame_embedding_table> t(T);
    for (int f = 0; f < T; f++) {
        t[f] = {sizeof(flame_embedding_table), FLAME_DTYPE_F16, FLAME_POOLING_SUM, rows, D, tab + (size_t)f * rows * D,
                nullptr};
    }
    flame_embedding_bag_params p = {sizeof p, 0, FLAME_COMBINE_CONCAT, t.data(), (size_t)T, 1};
    flame_embedding_bag *bag;
    FL(flame_embedding_bag_create(&p, &bag));
    // host ids and offsets (uniform ids), and the same on the device for the internal peer
    std::vector<int64_t> ids((size_t)T * B * P), off((size_t)T * (B + 1));
    uint64_t z = 12345;
    for (auto &x : ids) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        x = (int64_t)((z >> 20) % (uint64_t)rows);
    }
    for (int f = 0; f < T; f++)
        for (int64_t b = 0; b <= B; b++) off[(size_t)f * (B + 1) + b] = b * P;
    std::vector<flame_embedding_bag_input> in(T);
    for (int f = 0; f < T; f++)
        in[f] = {sizeof(flame_embedding_bag_input), ids.data() + (size_t)f * B * P, off.data() + (size_t)f * (B + 1),
                 B * P, nullptr};
    __half *out;
    const size_t n_out = (size_t)B * T * D;
    CK(cudaMalloc(&out, n_out * sizeof(__half)));
    CK(cudaMemset(out, 0xff, n_out * sizeof(__half)));
    flame_embedding_bag_batch q = {sizeof q, B, in.data(), (size_t)T, out, 0, FLAME_DTYPE_F16, s, 0, 0};
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    FL(flame_embedding_bag_forward(bag, &q)); // warm-up (staging, pools)
    CK(cudaStreamSynchronize(s));
    r.ok = !has_nan(out, n_out);
    std::vector<double> dev, host;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(e0, s));
        const double h0 = now_us();
        FL(flame_embedding_bag_forward(bag, &q));
        host.push_back(now_us() - h0);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        dev.push_back(ms * 1e3);
    }
    r.dev_us = median(dev), r.host_us = median(host);
    const double t0 = now_us();
    for (int i = 0; i < reps; i++) FL(flame_embedding_bag_forward(bag, &q));
    CK(cudaStreamSynchronize(s));
    r.thru_us = (now_us() - t0) / reps;
    // the same host ids, validated and staged by 8 threads (flame_embedding_bag_batch.threads)
    flame_embedding_bag_batch q8 = q;
    q8.threads = 8;
    std::vector<double> mdev, mhost;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(e0, s));
        const double h0 = now_us();
        FL(flame_embedding_bag_forward(bag, &q8));
        mhost.push_back(now_us() - h0);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        mdev.push_back(ms * 1e3);
    }
    r.mt_us = median(mdev), r.mt_host_us = median(mhost);
    // the internal kernel on device-resident ids
    int64_t *dids;
    CK(cudaMalloc(&dids, (ids.size() + off.size()) * sizeof(int64_t)));
    CK(cudaMemcpy(dids, ids.data(), ids.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dids + ids.size(), off.data(), off.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
    fl_dev_features fs{};
    fs.count = T, fs.width = T * D, fs.concat = 1;
    for (int f = 0; f < T; f++) {
        fs.f[f].table = tab + (size_t)f * rows * D;
        fs.f[f].dim = D;
        fs.f[f].out_col = f * D;
        fs.f[f].ids = dids + (size_t)f * B * P;
        fs.f[f].offsets = dids + ids.size() + (size_t)f * (B + 1);
    }
    std::vector<double> ker;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(e0, s));
        FL((fl_cuda_embedding_bag<__half, __half>(fs, B, out, (int64_t)T * D, s)));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ker.push_back(ms * 1e3);
    }
    r.kernel_us = median(ker);
    // the API on the same device-resident ids (device_indices = 1): the validation kernel and
    // the lookup, no staging
    std::vector<flame_embedding_bag_input> din(T);
    for (int f = 0; f < T; f++)
        din[f] = {sizeof(flame_embedding_bag_input), dids + (size_t)f * B * P, dids + ids.size() + (size_t)f * (B + 1),
                  B * P, nullptr};
    flame_embedding_bag_batch qd = {sizeof qd, B, din.data(), (size_t)T, out, 0, FLAME_DTYPE_F16, s, 0, 1};
    CK(cudaMemsetAsync(out, 0xff, n_out * sizeof(__half), s));
    FL(flame_embedding_bag_forward(bag, &qd));
    FL(flame_embedding_bag_index_status(bag, s)); // waits: every id was valid
    r.ok = r.ok && !has_nan(out, n_out);
    std::vector<double> ddev, dhost;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(e0, s));
        const double h0 = now_us();
        FL(flame_embedding_bag_forward(bag, &qd));
        dhost.push_back(now_us() - h0);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        ddev.push_back(ms * 1e3);
    }
    FL(flame_embedding_bag_index_status(bag, s));
    r.devids_us = median(ddev), r.devids_host_us = median(dhost);
    // back to back, as a pipeline calls it: each call's host work (pointer checks, the launches)
    // runs while the device still works on the calls before it; device time per call, events
    // around all of them
    CK(cudaEventRecord(e0, s));
    for (int i = 0; i < reps; i++) FL(flame_embedding_bag_forward(bag, &qd));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    {
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        r.devids_thru_us = ms * 1e3 / reps;
    }
    FL(flame_embedding_bag_index_status(bag, s));
    const double bytes = (double)T * B * P * D * 2 + (double)n_out * 2;
    r.gbps = bytes / r.dev_us / 1e3, r.thru_gbps = bytes / r.thru_us / 1e3, r.kernel_gbps = bytes / r.kernel_us / 1e3;
    r.devids_gbps = bytes / r.devids_us / 1e3;
    r.devids_thru_gbps = bytes / r.devids_thru_us / 1e3;
    r.mt_gbps = bytes / r.mt_us / 1e3;
    // copy bandwidth: 1 GiB device to device
    void *a, *b;
    const size_t cb = (size_t)1 << 30;
    CK(cudaMalloc(&a, cb));
    CK(cudaMalloc(&b, cb));
    std::vector<double> cp;
    for (int i = 0; i < std::max(3, reps / 4); i++) {
        CK(cudaEventRecord(e0, s));
        CK(cudaMemcpyAsync(b, a, cb, cudaMemcpyDeviceToDevice, s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        cp.push_back(ms * 1e3);
    }
    r.copy_gbps = 2.0 * cb / median(cp) / 1e3;
    // batch 1: the host cost of one call
    std::vector<flame_embedding_bag_input> in1(T);
    for (int f = 0; f < T; f++) in1[f] = {sizeof(flame_embedding_bag_input), ids.data() + (size_t)f * P, off.data(), P, nullptr};
    flame_embedding_bag_batch q1 = {sizeof q1, 1, in1.data(), (size_t)T, out, 0, FLAME_DTYPE_F16, s, 0, 0};
    std::vector<double> h1;
    for (int i = 0; i < reps; i++) {
        const double h0 = now_us();
        FL(flame_embedding_bag_forward(bag, &q1));
        h1.push_back(now_us() - h0);
        CK(cudaStreamSynchronize(s));
    }
    r.batch1_host_us = median(h1);
    flame_embedding_bag_destroy(bag);
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(dids));
    CK(cudaFree(out));
    CK(cudaFree(tab));
    return r;
}

struct attn_result {
    double dev_us, host_us, internal_us, batch1_host_us;
    bool ok;
};

struct attn_shape {
    int B, L, M, dh;
};
// the attention benchmark's shapes (bench/attention_bench.cu), 8 heads; the first is the one
// also timed against the internal dispatcher
static const attn_shape ATTN_SHAPES[] = {{8, 1024, 512, 64}, {1, 256, 128, 64},  {8, 256, 128, 64},
                                         {1, 1024, 128, 64}, {32, 1024, 512, 128}, {8, 4096, 512, 128}};

static attn_result bench_attention(int reps, cudaStream_t s, attn_shape shape, bool internal)
{
    const int Bs = shape.B, L = shape.L, M = shape.M, H = 8, dh = shape.dh, w = H * dh;
    const int64_t rows = (int64_t)Bs * (L + M);
    attn_result r{};
    __half *qkv, *out;
    CK(cudaMalloc(&qkv, (size_t)rows * 3 * w * sizeof(__half)));
    CK(cudaMalloc(&out, (size_t)rows * w * sizeof(__half)));
    fill_half<<<4096, 256, 0, s>>>(qkv, (size_t)rows * 3 * w, 2);
    CK(cudaMemsetAsync(out, 0xff, (size_t)rows * w * sizeof(__half), s));
    std::vector<int64_t> ch(Bs + 1), cc(Bs + 1);
    for (int i = 0; i <= Bs; i++) ch[i] = (int64_t)i * L, cc[i] = (int64_t)i * M;
    flame_attention_params p{};
    p.struct_size = sizeof p;
    p.device = 0, p.dtype = FLAME_DTYPE_F16, p.mask = FLAME_MASK_SUMI, p.heads = H, p.head_dim = dh;
    p.num_seqs = Bs, p.cu_history = ch.data(), p.cu_candidates = cc.data(), p.rows = rows;
    p.qkv = qkv, p.ld_qkv = 3 * w, p.out = out, p.ld_out = w, p.cuda_stream = s;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    FL(flame_sumi_attention(&p));
    CK(cudaStreamSynchronize(s));
    r.ok = !has_nan(out, (size_t)rows * w);
    std::vector<double> dev, host;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(e0, s));
        const double h0 = now_us();
        FL(flame_sumi_attention(&p));
        host.push_back(now_us() - h0);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        dev.push_back(ms * 1e3);
    }
    r.dev_us = median(dev), r.host_us = median(host);
    if (!internal) {
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
        CK(cudaFree(qkv));
        CK(cudaFree(out));
        return r;
    }
    // the internal dispatcher on a tile list built and uploaded beforehand (as the engine does)
    const int32_t tq = fl_cuda_attention_tile_queries(2, dh, rows, H);
    std::vector<fl_attn_tile> tiles;
    for (int i = 0; i < Bs; i++)
        for (int64_t q0 = 0; q0 < L + M; q0 += tq)
            tiles.push_back({(int64_t)i * (L + M), L, (int32_t)std::min<int64_t>(tq, L + M - q0), (int64_t)i * (L + M) + q0,
                             (int32_t)q0, -1});
    if (tq == FL_ATTN_QT_WG)
        std::stable_sort(tiles.begin(), tiles.end(), [](const fl_attn_tile &a, const fl_attn_tile &b) {
            return std::min(a.pos0 + a.nq, a.n_hist) > std::min(b.pos0 + b.nq, b.n_hist);
        });
    fl_attn_tile *dt;
    CK(cudaMalloc(&dt, tiles.size() * sizeof(fl_attn_tile)));
    CK(cudaMemcpy(dt, tiles.data(), tiles.size() * sizeof(fl_attn_tile), cudaMemcpyHostToDevice));
    std::vector<double> in;
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(e0, s));
        FL(fl_cuda_attention<__half>({.tiles = dt, .num_tiles = (int64_t)tiles.size(), .heads = H, .dh = dh, .q = qkv,
                                      .ldq = 3 * w, .k = qkv + w, .v = qkv + 2 * w, .ldkv = 3 * w, .out = out,
                                      .ldo = w, .tile_q = tq},
                                     s));
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        in.push_back(ms * 1e3);
    }
    r.internal_us = median(in);
    // batch 1: one sequence of 64 + 16 rows
    int64_t ch1[2] = {0, 64}, cc1[2] = {0, 16};
    flame_attention_params p1 = p;
    p1.num_seqs = 1, p1.cu_history = ch1, p1.cu_candidates = cc1, p1.rows = 80;
    std::vector<double> h1;
    for (int i = 0; i < reps; i++) {
        const double h0 = now_us();
        FL(flame_sumi_attention(&p1));
        h1.push_back(now_us() - h0);
        CK(cudaStreamSynchronize(s));
    }
    r.batch1_host_us = median(h1);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaFree(dt));
    CK(cudaFree(qkv));
    CK(cudaFree(out));
    return r;
}

int main(int argc, char **argv)
{
    bool json = false;
    int reps = 50;
    int64_t rows = 1 << 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            { long long v_; if (!cli_int("kernels-api-bench", "--reps", argv[++i], 1, 1000000, &v_)) return 2; reps = (int)v_; }
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            { long long v_; if (!cli_int("kernels-api-bench", "--rows", argv[++i], 1, 1LL << 31, &v_)) return 2; rows = (int64_t)v_; }
        else {
            fprintf(stderr, "usage: kernels-api-bench [--json] [--reps N] [--rows R]\n");
            return 2;
        }
    }
    if (reps < 1 || rows < 1) {
        fprintf(stderr, "kernels-api-bench: --reps and --rows must be positive\n");
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const tbe_result t = bench_tbe(reps, rows, s);
    const size_t nshapes = sizeof ATTN_SHAPES / sizeof ATTN_SHAPES[0];
    std::vector<attn_result> as;
    for (size_t i = 0; i < nshapes; i++) as.push_back(bench_attention(reps, s, ATTN_SHAPES[i], i == 0));
    const attn_result a = as[0];
    bool attn_ok = true;
    char shapes_json[2048] = "", name[64];
    size_t used = 0;
    for (size_t i = 0; i < nshapes; i++) {
        const attn_shape &sh = ATTN_SHAPES[i];
        snprintf(name, sizeof name, "b%d_l%d_m%d_h8_dh%d", sh.B, sh.L, sh.M, sh.dh);
        used += (size_t)snprintf(shapes_json + used, sizeof shapes_json - used,
                                 "%s\"api_sumi_attn_%s_us\":%.2f,\"api_sumi_attn_%s_host_us\":%.2f", i ? "," : "", name,
                                 as[i].dev_us, name, as[i].host_us);
        attn_ok = attn_ok && as[i].ok;
    }
    if (json) {
        printf("{\"device\":\"%s\",\"reps\":%d,\"rows_per_table\":%lld,\"copy_gbps\":%.1f,"
               "\"api_tbe_T26_B4096_P20_D128_fp16_gbps\":%.1f,\"api_tbe_T26_B4096_P20_D128_fp16_us\":%.2f,"
               "\"api_tbe_T26_B4096_P20_D128_fp16_host_us\":%.2f,\"api_tbe_T26_B4096_P20_D128_fp16_back_to_back_gbps\":%.1f,"
               "\"internal_tbe_T26_B4096_P20_D128_fp16_gbps\":%.1f,\"api_tbe_256B_rows_gbps\":%.1f,"
               "\"api_tbe_T26_B4096_P20_D128_fp16_device_ids_gbps\":%.1f,\"api_tbe_T26_B4096_P20_D128_fp16_device_ids_us\":%.2f,"
               "\"api_tbe_T26_B4096_P20_D128_fp16_device_ids_host_us\":%.2f,"
               "\"api_tbe_T26_B4096_P20_D128_fp16_device_ids_back_to_back_gbps\":%.1f,"
               "\"api_tbe_256B_rows_device_ids_back_to_back_of_copy\":%.3f,"
               "\"api_tbe_T26_B4096_P20_D128_fp16_8_threads_gbps\":%.1f,\"api_tbe_T26_B4096_P20_D128_fp16_8_threads_host_us\":%.2f,"
               "\"api_tbe_256B_rows_of_copy\":%.3f,\"api_tbe_batch1_host_us\":%.2f,"
               "%s,\"internal_sumi_attn_b8_l1024_m512_h8_dh64_us\":%.2f,\"api_sumi_attn_batch1_host_us\":%.2f,"
               "\"outputs_finite\":%s}\n",
               prop.name, reps, (long long)rows, t.copy_gbps, t.gbps, t.dev_us, t.host_us, t.thru_gbps, t.kernel_gbps,
               t.gbps, t.devids_gbps, t.devids_us, t.devids_host_us, t.devids_thru_gbps, t.devids_thru_gbps / t.copy_gbps, t.mt_gbps, t.mt_host_us, t.gbps / t.copy_gbps, t.batch1_host_us, shapes_json, a.internal_us, a.batch1_host_us,
               t.ok && attn_ok ? "true" : "false");
    } else {
        printf("%s; median of %d; %lld rows per table\n", prop.name, reps, (long long)rows);
        printf("device-to-device copy              %10.1f GB/s\n", t.copy_gbps);
        printf("TBE T26 B4096 P20 D128 fp16, API   %10.2f us device %8.1f GB/s (%.2f of copy), host %.1f us, "
               "back to back %.1f GB/s\n", t.dev_us, t.gbps, t.gbps / t.copy_gbps, t.host_us, t.thru_gbps);
        printf("TBE same, internal kernel          %10.2f us device %8.1f GB/s (API/internal time %.2f)\n", t.kernel_us,
               t.kernel_gbps, t.dev_us / t.kernel_us);
        printf("TBE same, API on device ids        %10.2f us device %8.1f GB/s (%.2f of copy), host %.1f us, "
               "back to back %.1f GB/s (%.2f of copy)\n",
               t.devids_us, t.devids_gbps, t.devids_gbps / t.copy_gbps, t.devids_host_us, t.devids_thru_gbps,
               t.devids_thru_gbps / t.copy_gbps);
        printf("TBE same, API, host ids, 8 threads %10.2f us device %8.1f GB/s, host %.1f us\n", t.mt_us, t.mt_gbps,
               t.mt_host_us);
        printf("TBE batch 1, API host time         %10.2f us\n", t.batch1_host_us);
        printf("SUMI attention B8 L1024 M512 H8 dh64 fp16, API %8.2f us device, host %.1f us; internal %.2f us "
               "(API/internal %.2f)\n", a.dev_us, a.host_us, a.internal_us, a.dev_us / a.internal_us);
        for (size_t i = 1; i < nshapes; i++)
            printf("SUMI attention B%d L%d M%d H8 dh%d fp16, API %8.2f us device, host %.1f us\n", ATTN_SHAPES[i].B,
                   ATTN_SHAPES[i].L, ATTN_SHAPES[i].M, ATTN_SHAPES[i].dh, as[i].dev_us, as[i].host_us);
        printf("SUMI attention batch 1, API host time %7.2f us\n", a.batch1_host_us);
        printf("outputs finite: %s\n", t.ok && attn_ok ? "yes" : "NO");
    }
    CK(cudaStreamDestroy(s));
    return t.ok && attn_ok ? 0 : 1;
}
