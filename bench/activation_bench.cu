// activation-bench: the GPU engine's erf-GELU pass (fl_cuda_activation, cuda/rows.cu) over an
// FFN's activations [rows, 2048] in fp16 and bf16, in place, as the engine runs it after the
// bias GEMM, against a device-to-device copy of the same bytes in the same run (what the pass
// would take if memory alone bounded it); bench/torch_activation.py times PyTorch's F.gelu on
// the same shapes. Each timed launch runs on its own fresh copy of the input (a GELU of a GELU
// would see other values than the engine's pass does). Time: median over --reps groups of 20
// back-to-back launches timed with CUDA events, per launch; GB/s counts the bytes read and
// written. One JSON line per (rows, dtype) on stdout.
//
//   bench/activation-bench [--reps N] [--rows R ...]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "kernels.cuh"
#include "cli_args.h"

#define CK(call)                                                                                               \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "activation-bench: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_),       \
                    __FILE__, __LINE__);                                                                       \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

static const int COLS = 2048;

__host__ __device__ static inline uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// pre-activations as a bias GEMM leaves them: roughly normal, scale 2 (a sum of four uniforms)
template <typename T> __global__ void fill_kernel(T *x, size_t n, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < 4; k++) s += (float)(mix64(seed ^ mix64(4 * i + k)) >> 40) * (1.0f / 16777216.0f) - 0.5f;
        x[i] = from_f<T>(2.0f * s);
    }
}

static const int GROUP = 20; // launches per timed group, each on its own copy of the input

// `prep` (untimed) before each group, then GROUP launches launch(0..GROUP-1)
template <typename P, typename F> static double time_us(P &&prep, F &&launch, int reps)
{
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    prep();
    for (int i = 0; i < GROUP; i++) launch(i); // warm-up
    std::vector<double> ts;
    for (int r = 0; r < reps; r++) {
        prep();
        CK(cudaEventRecord(a));
        for (int i = 0; i < GROUP; i++) launch(i);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms = 0.0f;
        CK(cudaEventElapsedTime(&ms, a, b));
        ts.push_back(ms * 1000.0 / GROUP);
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
}

template <typename T> static void run(int64_t rows, const char *dtype, int reps)
{
    const size_t n = (size_t)rows * COLS, bytes = n * sizeof(T);
    T *src;
    CK(cudaMalloc(&src, bytes));
    fill_kernel<T><<<1024, 256>>>(src, n, 0xace0000ull + (uint64_t)rows);
    CK(cudaGetLastError());
    T *copies;
    CK(cudaMalloc(&copies, bytes * GROUP));
    auto refresh = [&] {
        for (int i = 0; i < GROUP; i++) CK(cudaMemcpyAsync(copies + i * n, src, bytes, cudaMemcpyDeviceToDevice, 0));
    };
    if (fl_cuda_activation<T>(copies, rows, COLS, COLS, 1, 0) != FLAME_OK) {
        fprintf(stderr, "activation-bench: %s\n", flame_last_error());
        exit(1);
    }
    const double lib = time_us(refresh, [&](int i) { fl_cuda_activation<T>(copies + i * n, rows, COLS, COLS, 1, 0); }, reps);
    const double copy = time_us([] {}, [&](int i) { cudaMemcpyAsync(copies + i * n, src, bytes, cudaMemcpyDeviceToDevice, 0); }, reps);
    CK(cudaFree(copies));
    CK(cudaGetLastError());
    const double gb = 2.0 * (double)bytes / 1e3; // read and written, GB/s = gb / us
    printf("{\"rows\": %lld, \"cols\": %d, \"dtype\": \"%s\", \"us\": %.2f, \"gbps\": %.0f, \"copy_us\": %.2f, "
           "\"copy_gbps\": %.0f, \"of_copy\": %.3f}\n",
           (long long)rows, COLS, dtype, lib, gb / lib, copy, gb / copy, copy / lib);
    fflush(stdout);
    CK(cudaFree(src));
}

int main(int argc, char **argv)
{
    int reps = 15;
    std::vector<int64_t> rows;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            { long long v_; if (!cli_int("activation-bench", "--reps", argv[++i], 1, 1000000, &v_)) return 2; reps = (int)v_; }
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            { long long v_; if (!cli_int("activation-bench", "--rows", argv[++i], 1, 1LL << 31, &v_)) return 2; rows.push_back(v_); }
        else {
            fprintf(stderr, "usage: %s [--reps N] [--rows R ...]\n", argv[0]);
            return 2;
        }
    }
    if (rows.empty()) rows = {384, 3072, 49152}; // B1 L256 M128, B8 L256 M128, B32 L1024 M512 tokens
    for (int64_t r : rows) {
        run<__half>(r, "fp16", reps);
        run<__nv_bfloat16>(r, "bf16", reps);
    }
    return 0;
}
