// embedding-bench: the table-batched embedding kernel (cuda/embedding.cuh, fl_cuda_embedding_bag)
// against the device's own copy bandwidth, measured in the same run.
//
//   bench/embedding-bench [--json] [--reps N] [--rows R] [--sets S]
//
// Cases (T tables x R rows each, B bags per table, P ids per bag, sum pooling, uniform ids,
// one launch for all tables, output [B, T*D] as FBGEMM TBE lays it out, in the table dtype):
//   rows of 64, 128, 256 and 512 bytes (fp16 and fp32), T26 B4096 P20;
//   int8 row-wise quantized rows of 64, 128, 256 and 512 values (as many bytes, plus an 8-byte
//   (scale, bias) pair read per row), T26 B4096 P20, output fp32;
//   the anchors' T26 B4096 P20 D128 fp16 and fp32, T8 B512 P1 D64 fp16, T26 B1 P20 D64 fp32.
// GB/s = (bytes of the rows read + bytes of the output written) / time; "gbps_with_ids" adds
// the 8-byte ids read, which is how ../shared/anchors counts F.embedding_bag's GB/s. For int8
// rows, the bytes read are the int8 values plus the 8 bytes of (scale, bias) of every row.
// Copy: cudaMemcpyAsync device to device, GB/s = bytes read + written.
// Each time is the median over --reps launches timed with CUDA events; consecutive launches
// read different id sets (--sets of them, together larger than L2) so L2 never holds the
// ids; the tables (R = 1M rows by default) are far larger than L2. Before timing, one launch
// of every case is checked against a float64 CPU reference on sampled bags (table values are
// a hash of (table, row, column), exact in fp16 and fp32, so the host needs no table copy; an
// int8 row's scale and bias are hashes of (table, row) chosen so that scale * q + bias and the
// sums of 20 of them are exact in float32).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "kernels.cuh"
#include "cli_args.h"

#define CK(call)                                                                                               \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "embedding-bench: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__,  \
                    __LINE__);                                                                                 \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

__host__ __device__ static inline uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Table value of (table f, row r, column c): k/128 with k in [-128, 127], exact in fp16/bf16/fp32.
__host__ __device__ static inline float table_value(uint64_t f, uint64_t r, uint64_t c)
{
    const uint64_t h = mix64(f * 0x100000001b3ull ^ mix64(r * 4096 + c));
    return (float)((int)(h & 255) - 128) / 128.0f;
}

__host__ __device__ static inline int64_t bag_id(uint64_t set, uint64_t f, uint64_t j, int64_t rows)
{
    return (int64_t)(mix64(set * 0x51ed270b27b8f3c5ull + f * 0x2545f4914f6cdd1dull + j) % (uint64_t)rows);
}

// int8 rows: q = a hash of (table, row, column) in [-128, 127]; scale = k / 4096 with k in
// [1, 64], bias = m / 256 with m in [-128, 127]: scale * q + bias is a multiple of 1/4096 below
// 2.6 in magnitude, exact in float32, and so are sums of a bag of them.
__host__ __device__ static inline int8_t q8_value(uint64_t f, uint64_t r, uint64_t c)
{
    return (int8_t)((int)(mix64(f * 0x100000001b3ull ^ mix64(r * 4096 + c)) & 255) - 128);
}
__host__ __device__ static inline float q8_scale(uint64_t f, uint64_t r)
{
    return (float)(1 + (int)(mix64(f * 0x9e3779b97f4a7c15ull + r * 2 + 1) & 63)) / 4096.0f;
}
__host__ __device__ static inline float q8_bias(uint64_t f, uint64_t r)
{
    return (float)((int)(mix64(f * 0x9e3779b97f4a7c15ull + r * 2 + 2) & 255) - 128) / 256.0f;
}

__global__ void fill_q8(int8_t *tab, float *qparams, int64_t rows, int32_t dim, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t per = rows * dim, f = i / per, r = (i / dim) % rows;
        tab[i] = q8_value((uint64_t)f, (uint64_t)r, (uint64_t)(i % dim));
        if (i % dim == 0) {
            qparams[2 * (f * rows + r)] = q8_scale((uint64_t)f, (uint64_t)r);
            qparams[2 * (f * rows + r) + 1] = q8_bias((uint64_t)f, (uint64_t)r);
        }
    }
}

template <typename T> __device__ inline T cvt(float x);
template <> __device__ inline float cvt<float>(float x) { return x; }
template <> __device__ inline __half cvt<__half>(float x) { return __float2half_rn(x); }

template <typename T> __global__ void fill_tables(T *tab, int64_t rows, int32_t dim, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t per = rows * dim;
        tab[i] = cvt<T>(table_value((uint64_t)(i / per), (uint64_t)((i / dim) % rows), (uint64_t)(i % dim)));
    }
}

// ids [T][B*P] and offsets [T][B+1] of one set
__global__ void fill_ids(int64_t *ids, int64_t *offsets, int set, int T, int64_t B, int P, int64_t rows)
{
    const int64_t n = (int64_t)T * B * P;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t f = i / (B * P), j = i % (B * P);
        ids[i] = bag_id((uint64_t)set, (uint64_t)f, (uint64_t)j, rows);
    }
    const int64_t no = (int64_t)T * (B + 1);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < no; i += (int64_t)gridDim.x * blockDim.x)
        offsets[i] = (i % (B + 1)) * P;
}

static float half_to_float(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { // subnormal
            float v = ldexpf((float)man, -24);
            return sign ? -v : v;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

struct result {
    char name[96];
    const char *dtype, *out_dtype;
    int T, P, D, row_bytes;
    int64_t B, rows;
    double us, gbps, gbps_with_ids, max_abs_err;
    int64_t checked_bags;
    bool ok;
};

static double median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct bench_ctx {
    void *tables = nullptr;   // one allocation, reused by every case
    size_t table_bytes = 0;
    float *qparams = nullptr; // int8 cases: [T * rows, 2] (scale, bias)
    int64_t rows = 1000000; // as ../shared/anchors: 1M rows per table
    int sets = 8, reps = 50;
    cudaStream_t stream;
    cudaEvent_t ev0, ev1;
};

static double host_out_value(const __half &v)
{
    uint16_t bits;
    memcpy(&bits, &v, 2);
    return half_to_float(bits);
}
static double host_out_value(const float &v) { return v; }

// T: the table dtype (float, __half, or int8_t: int8 rows with (scale, bias) per row); O: the
// output dtype.
template <typename T, typename O = T>
static result run_case(bench_ctx &cx, const char *name, int T_, int64_t B, int P, int D)
{
    constexpr bool q8 = sizeof(T) == 1;
    result r{};
    snprintf(r.name, sizeof r.name, "%s", name);
    r.dtype = q8 ? "int8" : sizeof(T) == 2 ? "fp16" : "fp32";
    r.out_dtype = sizeof(O) == 2 ? "fp16" : "fp32";
    r.T = T_, r.B = B, r.P = P, r.D = D, r.rows = cx.rows, r.row_bytes = D * (int)sizeof(T);
    const int64_t rows = cx.rows, n_tab = (int64_t)T_ * rows * D;
    if ((size_t)n_tab * sizeof(T) > cx.table_bytes) {
        fprintf(stderr, "embedding-bench: %s needs %zu bytes of tables, %zu allocated\n", name,
                (size_t)n_tab * sizeof(T), cx.table_bytes);
        exit(1);
    }
    T *tab = static_cast<T *>(cx.tables);
    if constexpr (q8)
        fill_q8<<<4096, 256, 0, cx.stream>>>(tab, cx.qparams, rows, D, n_tab);
    else
        fill_tables<T><<<4096, 256, 0, cx.stream>>>(tab, rows, D, n_tab);
    CK(cudaGetLastError());
    // id sets: enough that together they exceed L2 (64 MiB on an H200 is ample)
    const int64_t n_ids = (int64_t)T_ * B * P, n_off = (int64_t)T_ * (B + 1);
    const size_t set_bytes = (size_t)(n_ids + n_off) * sizeof(int64_t);
    int sets = cx.sets;
    while ((size_t)sets * set_bytes < (128u << 20) && sets < 64) sets *= 2;
    int64_t *idbuf;
    CK(cudaMalloc(&idbuf, (size_t)sets * set_bytes));
    for (int s = 0; s < sets; s++) {
        int64_t *ids = idbuf + (size_t)s * (n_ids + n_off);
        fill_ids<<<1024, 256, 0, cx.stream>>>(ids, ids + n_ids, s, T_, B, P, rows);
        CK(cudaGetLastError());
    }
    O *out;
    const size_t out_elems = (size_t)B * T_ * D;
    CK(cudaMalloc(&out, out_elems * sizeof(O)));
    std::vector<fl_dev_features> fsets(sets);
    for (int s = 0; s < sets; s++) {
        fl_dev_features &fs = fsets[s];
        memset(&fs, 0, sizeof fs);
        fs.count = T_;
        fs.width = T_ * D;
        fs.concat = 1;
        const int64_t *ids = idbuf + (size_t)s * (n_ids + n_off);
        for (int f = 0; f < T_; f++) {
            fs.f[f].table = tab + (size_t)f * rows * D;
            fs.f[f].dim = D;
            fs.f[f].pooling = 0;
            fs.f[f].out_col = f * D;
            fs.f[f].ids = ids + (size_t)f * B * P;
            fs.f[f].offsets = ids + n_ids + (size_t)f * (B + 1);
            fs.f[f].qparams = q8 ? cx.qparams + (size_t)f * rows * 2 : nullptr;
        }
    }
    // an int8 case reads only int8 features: the float-table type argument is then unused
    using TT = typename std::conditional<q8, O, T>::type;
    auto launch = [&](int s) {
        flame_status st = fl_cuda_embedding_bag<TT, O>(fsets[s], B, out, (int64_t)T_ * D, cx.stream);
        if (st != FLAME_OK) {
            fprintf(stderr, "embedding-bench: %s: fl_cuda_embedding_bag: %s: %s\n", name, flame_status_string(st),
                    flame_last_error());
            exit(1);
        }
    };

    // correctness of one launch (set 0) on sampled bags, against float64
    CK(cudaMemsetAsync(out, 0xff, out_elems * sizeof(O), cx.stream)); // poison: NaN in fp16 and fp32
    launch(0);
    CK(cudaStreamSynchronize(cx.stream));
    std::vector<O> host_out(out_elems);
    CK(cudaMemcpy(host_out.data(), out, out_elems * sizeof(O), cudaMemcpyDeviceToHost));
    const int64_t samples = std::min<int64_t>(B * T_, 3000);
    double max_err = 0;
    bool ok = true;
    uint64_t pick = 7;
    for (int64_t k = 0; k < samples; k++) {
        // the first and last bags of every table, then random ones
        int64_t b, f;
        if (k < 2 * T_) {
            f = k % T_;
            b = k < T_ ? 0 : B - 1;
        } else {
            const uint64_t h = mix64(pick++);
            b = (int64_t)(h % (uint64_t)B);
            f = (int64_t)((h >> 32) % (uint64_t)T_);
        }
        for (int c = 0; c < D; c++) {
            double ref = 0;
            for (int p = 0; p < P; p++) {
                const int64_t id = bag_id(0, (uint64_t)f, (uint64_t)(b * P + p), rows);
                if (q8)
                    ref += (double)q8_scale((uint64_t)f, (uint64_t)id) * q8_value((uint64_t)f, (uint64_t)id, (uint64_t)c) +
                           (double)q8_bias((uint64_t)f, (uint64_t)id);
                else
                    ref += table_value((uint64_t)f, (uint64_t)id, (uint64_t)c);
            }
            const size_t at = (size_t)b * T_ * D + (size_t)f * D + c;
            const double got = host_out_value(host_out[at]);
            const double err = fabs(got - ref), tol = sizeof(O) == 2 ? 1e-3 + fabs(ref) * 1e-3 : 1e-5;
            if (!(err <= tol)) { // NaN fails too
                if (ok)
                    fprintf(stderr, "embedding-bench: %s: bag (b=%lld, table %lld) column %d: got %g, expected %g\n",
                            name, (long long)b, (long long)f, c, got, ref);
                ok = false;
            }
            if (err > max_err || err != err) max_err = err;
        }
    }
    r.max_abs_err = max_err;
    r.checked_bags = samples;
    r.ok = ok;

    // timing
    for (int w = 0; w < 3; w++) launch(w % sets);
    std::vector<float> ms(cx.reps);
    for (int i = 0; i < cx.reps; i++) {
        CK(cudaEventRecord(cx.ev0, cx.stream));
        launch((i + 1) % sets);
        CK(cudaEventRecord(cx.ev1, cx.stream));
        CK(cudaEventSynchronize(cx.ev1));
        CK(cudaEventElapsedTime(&ms[i], cx.ev0, cx.ev1));
    }
    r.us = median(ms) * 1e3;
    const double rows_bytes = (double)n_ids * (D * sizeof(T) + (q8 ? 8 : 0)), out_bytes = (double)out_elems * sizeof(O);
    r.gbps = (rows_bytes + out_bytes) / (r.us * 1e-6) / 1e9;
    r.gbps_with_ids = (rows_bytes + out_bytes + (double)n_ids * 8) / (r.us * 1e-6) / 1e9;
    CK(cudaFree(out));
    CK(cudaFree(idbuf));
    return r;
}

static double copy_gbps(bench_ctx &cx, size_t bytes)
{
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemsetAsync(a, 1, bytes, cx.stream));
    for (int w = 0; w < 3; w++) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, cx.stream));
    std::vector<float> ms(cx.reps);
    for (int i = 0; i < cx.reps; i++) {
        CK(cudaEventRecord(cx.ev0, cx.stream));
        if (i & 1)
            CK(cudaMemcpyAsync(a, b, bytes, cudaMemcpyDeviceToDevice, cx.stream));
        else
            CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, cx.stream));
        CK(cudaEventRecord(cx.ev1, cx.stream));
        CK(cudaEventSynchronize(cx.ev1));
        CK(cudaEventElapsedTime(&ms[i], cx.ev0, cx.ev1));
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * (double)bytes / (median(ms) * 1e-3) / 1e9;
}

int main(int argc, char **argv)
{
    bench_ctx cx;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) { long long v_; if (!cli_int("embedding-bench", "--reps", argv[++i], 1, 1000000, &v_)) return 2; cx.reps = (int)v_; }
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc) { long long v_; if (!cli_int("embedding-bench", "--rows", argv[++i], 1, 1LL << 31, &v_)) return 2; cx.rows = (int64_t)v_; }
        else if (!strcmp(argv[i], "--sets") && i + 1 < argc) { long long v_; if (!cli_int("embedding-bench", "--sets", argv[++i], 1, 1024, &v_)) return 2; cx.sets = (int)v_; }
        else {
            fprintf(stderr, "usage: embedding-bench [--json] [--reps N] [--rows R] [--sets S]\n");
            return 2;
        }
    }
    if (cx.reps < 1 || cx.rows < 1 || cx.sets < 1) {
        fprintf(stderr, "embedding-bench: --reps, --rows and --sets must be positive\n");
        return 2;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    CK(cudaStreamCreateWithFlags(&cx.stream, cudaStreamNonBlocking));
    CK(cudaEventCreate(&cx.ev0));
    CK(cudaEventCreate(&cx.ev1));
    // the largest case: 26 tables of 512-byte rows
    cx.table_bytes = (size_t)26 * cx.rows * 512;
    CK(cudaMalloc(&cx.tables, cx.table_bytes));
    CK(cudaMalloc(&cx.qparams, (size_t)26 * cx.rows * 2 * sizeof(float)));

    const double copy = copy_gbps(cx, (size_t)1 << 30);
    std::vector<result> res;
    char name[96];
    for (int rb : {64, 128, 256, 512}) {
        snprintf(name, sizeof name, "rows_%dB_fp16_T26_B4096_P20", rb);
        res.push_back(run_case<__half>(cx, name, 26, 4096, 20, rb / 2));
        snprintf(name, sizeof name, "rows_%dB_fp32_T26_B4096_P20", rb);
        res.push_back(run_case<float>(cx, name, 26, 4096, 20, rb / 4));
        snprintf(name, sizeof name, "rows_%dB_int8_T26_B4096_P20", rb); // rb values of 1 byte
        res.push_back(run_case<int8_t, float>(cx, name, 26, 4096, 20, rb));
    }
    res.push_back(run_case<__half>(cx, "T26_B4096_P20_D128_fp16", 26, 4096, 20, 128));
    res.push_back(run_case<float>(cx, "T26_B4096_P20_D128_fp32", 26, 4096, 20, 128));
    res.push_back(run_case<__half>(cx, "T8_B512_P1_D64_fp16", 8, 512, 1, 64));
    res.push_back(run_case<float>(cx, "T26_B1_P20_D64_fp32", 26, 1, 20, 64));

    bool all_ok = true;
    for (const result &r : res) all_ok = all_ok && r.ok;
    if (json) {
        printf("{\"device\":\"%s\",\"sms\":%d,\"l2_bytes\":%d,\"rows_per_table\":%lld,\"reps\":%d,\"copy_gbps\":%.1f,"
               "\"correct\":%s,\"cases\":[",
               prop.name, prop.multiProcessorCount, prop.l2CacheSize, (long long)cx.rows, cx.reps, copy,
               all_ok ? "true" : "false");
        for (size_t i = 0; i < res.size(); i++) {
            const result &r = res[i];
            printf("%s{\"name\":\"%s\",\"dtype\":\"%s\",\"out_dtype\":\"%s\",\"T\":%d,\"B\":%lld,\"P\":%d,"
                   "\"D\":%d,\"row_bytes\":%d,\"us\":%.3f,\"gbps\":%.1f,\"gbps_with_ids\":%.1f,\"copy_fraction\":%.4f,"
                   "\"max_abs_err\":%.3g,\"checked_bags\":%lld,\"correct\":%s}",
                   i ? "," : "", r.name, r.dtype, r.out_dtype, r.T, (long long)r.B, r.P, r.D, r.row_bytes, r.us, r.gbps,
                   r.gbps_with_ids, r.gbps / copy, r.max_abs_err, (long long)r.checked_bags, r.ok ? "true" : "false");
        }
        printf("]}\n");
    } else {
        printf("%s, %d SMs, L2 %d bytes; %lld rows per table, median of %d launches\n", prop.name,
               prop.multiProcessorCount, prop.l2CacheSize, (long long)cx.rows, cx.reps);
        printf("device-to-device copy: %.1f GB/s (read + written)\n", copy);
        printf("%-32s %10s %10s %12s %8s %s\n", "case", "us", "GB/s", "GB/s+ids", "of copy", "check");
        for (const result &r : res)
            printf("%-32s %10.2f %10.1f %12.1f %7.1f%% %s (max err %.2g, %lld bags)\n", r.name, r.us, r.gbps,
                   r.gbps_with_ids, 100.0 * r.gbps / copy, r.ok ? "ok" : "WRONG", r.max_abs_err,
                   (long long)r.checked_bags);
    }
    cudaFree(cx.tables);
    cudaFree(cx.qparams);
    return all_ok ? 0 : 1;
}
