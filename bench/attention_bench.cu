// attention-bench: the SUMI attention kernels (fl_cuda_attention, cuda/attention*.cu) on the
// engine's layout: B users of L history items and M candidates each, packed as in the engine
// (fused QKV rows [B (L + M), 3 H Dh], bf16), every token a query (a block before the last).
//
//   bench/attention-bench [--reps N] [--dump DIR] [--last] [--shape B,L,M,H,Dh ...] [--variant NAME ...]
//
// --last: only the candidates are queries, as in the last block and a KV-cache hit (M queries
// a user against L + 1 keys each); it adds `tc16x1`, the tensor-core kernel without the
// cluster split of small launches, to compare with tc16 (which takes it where it applies).
//
// Variants: tc16 (mma.sync, 16-query tiles); on compute capability 9.0 the wgmma kernels over
// 128-query tiles, longest first as the engine orders them: lock64 / lock128 (lock-step, key
// blocks of 64 / 128), ws (a producer warp stages blocks three deep), wspp (ws, the warpgroups
// taking turns on the tensor cores), ovl64 / ovl128 (ws with each warpgroup's softmax
// overlapped with its previous P V product, key blocks of 64 / 128), povl64 / povl128 (the
// same kernels persistent, one CTA an SM, items handed out through work counters; povl128f
// with a fixed assignment instead; povl128p with the warpgroups taking turns issuing their
// products; povl128t / povl128pt, povl128 / povl128p with whole key blocks and Q tiles staged
// by the tensor memory accelerator; povl128pc, povl128pt with each item's last P V issued beside
// the next item's first S); and `auto`, fl_cuda_attention as the engine calls it (the
// tile size fl_cuda_attention_tile_queries picks, work counters given). Before timing, every
// variant's output is compared with tc16's (normwise max |diff| / max |ref|), and with a float64 CPU
// reference on 64 sampled rows per head. Time: median over --reps groups of 10 back-to-back
// launches timed with CUDA events, per launch. Useful FLOPs = 4 B H Dh (L (L + 1) / 2 + M L + M)
// (the pairs the SUMI mask allows). --dump DIR writes qkv_<shape>.bin and out_<shape>.bin (raw
// bf16) for bench/torch_attention.py to check the PyTorch peers against. One JSON line per
// (shape, variant) on stdout; --variant NAME (repeatable) times only those variants (and tc16,
// which every output is checked against).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include "attention_tc.cuh"
#include "attention_wgmma.cuh"
#include "kernels.cuh"
#include "cli_args.h"

#define CK(call)                                                                                               \
    do {                                                                                                       \
        cudaError_t e_ = (call);                                                                               \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "attention-bench: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__,  \
                    __LINE__);                                                                                 \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)
#define FK(call)                                                                                               \
    do {                                                                                                       \
        flame_status s_ = (call);                                                                              \
        if (s_ != FLAME_OK) {                                                                                  \
            fprintf(stderr, "attention-bench: %s: %s\n", #call, flame_last_error());                          \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

typedef __nv_bfloat16 bf16;

__host__ __device__ static inline uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// uniform in [-2, 2), fresh per (seed, element)
__global__ void fill_kernel(bf16 *x, size_t n, uint64_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = __float2bfloat16_rn((float)((mix64(seed ^ mix64(i)) >> 11) * (4.0 / 9007199254740992.0) - 2.0));
}

struct shape {
    int B, L, M, H, Dh;
};

static bool last_only = false; // --last: queries are the candidates only

static std::string name_of(const shape &s)
{
    char b[96];
    snprintf(b, sizeof b, "b%d_l%d_m%d_h%d_dh%d%s", s.B, s.L, s.M, s.H, s.Dh, last_only ? "_last" : "");
    return b;
}

// the first query position of a user
static int first_query(const shape &s) { return last_only ? s.L : 0; }

static std::vector<fl_attn_tile> tiles_of(const shape &s, int tq)
{
    std::vector<fl_attn_tile> t;
    const int S = s.L + s.M;
    for (int b = 0; b < s.B; b++)
        for (int q0 = first_query(s); q0 < S; q0 += tq)
            t.push_back({(int64_t)b * S, s.L, S - q0 < tq ? S - q0 : tq, (int64_t)b * S + q0, q0, -1});
    if (tq == FL_ATTN_QT_WG) // longest first, as the engine orders them
        std::stable_sort(t.begin(), t.end(), [](const fl_attn_tile &a, const fl_attn_tile &b) {
            const int ka = std::min(a.pos0 + a.nq, a.n_hist), kb = std::min(b.pos0 + b.nq, b.n_hist);
            return ka > kb;
        });
    return t;
}

static float bf(bf16 x) { return __bfloat162float(x); }

// float64 reference for query row p of sequence b, head h
static void reference(const std::vector<bf16> &qkv, const shape &s, int b, int p, int h, double *o)
{
    const int d = s.H * s.Dh, S = s.L + s.M;
    const int64_t ld = 3 * d, row0 = (int64_t)b * S;
    std::vector<int> keys;
    for (int j = 0; j < (p < s.L ? p + 1 : s.L); j++) keys.push_back(j);
    if (p >= s.L) keys.push_back(p);
    std::vector<double> w(keys.size());
    double mx = -INFINITY;
    const bf16 *qr = &qkv[(size_t)((row0 + p) * ld + h * s.Dh)];
    for (size_t i = 0; i < keys.size(); i++) {
        const bf16 *kr = &qkv[(size_t)((row0 + keys[i]) * ld + d + h * s.Dh)];
        double acc = 0.0;
        for (int e = 0; e < s.Dh; e++) acc += (double)bf(qr[e]) * bf(kr[e]);
        w[i] = acc / sqrt((double)s.Dh);
        mx = std::max(mx, w[i]);
    }
    double l = 0.0;
    for (double &x : w) l += (x = exp(x - mx));
    for (int e = 0; e < s.Dh; e++) o[e] = 0.0;
    for (size_t i = 0; i < keys.size(); i++) {
        const bf16 *vr = &qkv[(size_t)((row0 + keys[i]) * ld + 2 * d + h * s.Dh)];
        for (int e = 0; e < s.Dh; e++) o[e] += w[i] / l * bf(vr[e]);
    }
}

int main(int argc, char **argv)
{
    int reps = 15, failed = 0;
    const char *dump = nullptr;
    std::vector<shape> shapes;
    std::vector<std::string> only; // --variant: the variants to time besides tc16 (the reference)
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            { long long v_; if (!cli_int("attention-bench", "--reps", argv[++i], 1, 1000000, &v_)) return 2; reps = (int)v_; }
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc)
            dump = argv[++i];
        else if (!strcmp(argv[i], "--last"))
            last_only = true;
        else if (!strcmp(argv[i], "--variant") && i + 1 < argc)
            only.push_back(argv[++i]);
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
            shape s;
            if (sscanf(argv[++i], "%d,%d,%d,%d,%d", &s.B, &s.L, &s.M, &s.H, &s.Dh) != 5) return 2;
            shapes.push_back(s);
        } else {
            fprintf(stderr, "usage: %s [--reps N] [--dump DIR] [--last] [--shape B,L,M,H,Dh ...] [--variant NAME ...]\n", argv[0]);
            return 2;
        }
    }
    if (shapes.empty())
        shapes = {{1, 256, 128, 8, 64},  {8, 256, 128, 8, 64},    {1, 1024, 128, 8, 64},
                  {8, 1024, 512, 8, 64}, {32, 1024, 512, 8, 128}, {8, 4096, 512, 8, 128}};
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    fprintf(stderr, "# %s, %d SMs, compute capability %d.%d\n", prop.name, prop.multiProcessorCount, prop.major, prop.minor);
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    uint32_t *work; // the persistent variants' work counters (each launch leaves them at zero)
    CK(cudaMalloc(&work, 2 * sizeof(uint32_t)));
    CK(cudaMemset(work, 0, 2 * sizeof(uint32_t)));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (const shape &s : shapes) {
        const int d = s.H * s.Dh, S = s.L + s.M;
        const int64_t rows = (int64_t)s.B * S, ld = 3 * d;
        const double flops = 4.0 * s.B * s.H * s.Dh * ((last_only ? 0.0 : (double)s.L * (s.L + 1) / 2) + (double)s.M * s.L + s.M);
        bf16 *qkv, *out, *ref;
        CK(cudaMalloc(&qkv, (size_t)(rows * ld) * sizeof(bf16)));
        CK(cudaMalloc(&out, (size_t)(rows * d) * sizeof(bf16)));
        CK(cudaMalloc(&ref, (size_t)(rows * d) * sizeof(bf16)));
        fill_kernel<<<1024, 256, 0, st>>>(qkv, (size_t)(rows * ld), 0x5eed0000ull + shapes.size() * 977 + s.L * 31 + s.B);
        CK(cudaGetLastError());
        std::vector<bf16> hq((size_t)(rows * ld));
        CK(cudaMemcpyAsync(hq.data(), qkv, hq.size() * sizeof(bf16), cudaMemcpyDeviceToHost, st));
        CK(cudaStreamSynchronize(st));
        if (dump) {
            FILE *f = fopen((std::string(dump) + "/qkv_" + name_of(s) + ".bin").c_str(), "wb");
            if (f) fwrite(hq.data(), sizeof(bf16), hq.size(), f), fclose(f);
        }

        struct variant {
            const char *name;
            int tq, bn; // bn: the wgmma variant; < 0: through fl_cuda_attention
        };
        std::vector<variant> vs = {{"tc16", FL_ATTN_QT, -1}};
        if (last_only) vs.push_back({"tc16x1", FL_ATTN_QT, -2}); // bn -2: fl_cuda_attention_tc, max_keys unknown: no cluster
        if (fl_cuda_attention_wg_device()) {
            vs.push_back({"lock64", FL_ATTN_QT_WG, FL_WG_LOCK64});
            vs.push_back({"lock128", FL_ATTN_QT_WG, FL_WG_LOCK128});
            vs.push_back({"ws", FL_ATTN_QT_WG, FL_WG_WS});
            vs.push_back({"wspp", FL_ATTN_QT_WG, FL_WG_WS_PP});
            vs.push_back({"ovl64", FL_ATTN_QT_WG, FL_WG_OVL64});
            vs.push_back({"ovl128", FL_ATTN_QT_WG, FL_WG_OVL128});
            vs.push_back({"povl64", FL_ATTN_QT_WG, FL_WG_POVL64});
            vs.push_back({"povl128", FL_ATTN_QT_WG, FL_WG_POVL128});
            vs.push_back({"povl128f", FL_ATTN_QT_WG, FL_WG_POVL128}); // the fixed assignment, no work counters
            vs.push_back({"povl128p", FL_ATTN_QT_WG, FL_WG_POVL128P}); // the warpgroups taking turns
            vs.push_back({"povl128t", FL_ATTN_QT_WG, FL_WG_POVL128T}); // whole key blocks and Q tiles by TMA
            vs.push_back({"povl128pt", FL_ATTN_QT_WG, FL_WG_POVL128PT}); // turns and TMA
            vs.push_back({"povl128pc", FL_ATTN_QT_WG, FL_WG_POVL128PC}); // and items chained
        }
        const int tq_auto = fl_cuda_attention_tile_queries(2, s.Dh, rows - (int64_t)s.B * first_query(s), s.H);
        vs.push_back({"auto", tq_auto, -1});
        std::vector<bf16> hout((size_t)(rows * d)), href((size_t)(rows * d));
        for (const variant &v : vs) {
            if (!only.empty() && strcmp(v.name, "tc16") && std::find(only.begin(), only.end(), v.name) == only.end())
                continue;
            const std::vector<fl_attn_tile> t = tiles_of(s, v.tq);
            fl_attn_tile *dt;
            CK(cudaMalloc(&dt, t.size() * sizeof(fl_attn_tile)));
            CK(cudaMemcpy(dt, t.data(), t.size() * sizeof(fl_attn_tile), cudaMemcpyHostToDevice));
            bf16 *o = v.bn < 0 && v.tq == FL_ATTN_QT && !strcmp(v.name, "tc16") ? ref : out;
            auto launch = [&]() {
                if (v.bn == -2)
                    FK(fl_cuda_attention_tc<bf16>(dt, (int64_t)t.size(), nullptr, s.H, s.Dh, qkv, ld, qkv + d, qkv + 2 * d,
                                                  ld, o, d, st, 0));
                else if (v.bn < 0)
                    FK(fl_cuda_attention<bf16>({.tiles = dt, .num_tiles = (int64_t)t.size(), .heads = s.H, .dh = s.Dh,
                                                .q = qkv, .ldq = ld, .k = qkv + d, .v = qkv + 2 * d, .ldkv = ld,
                                                .out = o, .ldo = d, .tile_q = v.tq, .max_keys = s.L,
                                                .work = work},
                                               st));
                else
                    FK(fl_cuda_attention_wg<bf16>(dt, (int64_t)t.size(), nullptr, s.H, s.Dh, qkv, ld, qkv + d,
                                                  qkv + 2 * d, ld, o, d, st, v.bn, 0,
                                                  strcmp(v.name, "povl128f") ? work : nullptr));
            };
            CK(cudaMemsetAsync(o, 0xff, (size_t)(rows * d) * sizeof(bf16), st)); // NaN: every element must be written
            launch();
            CK(cudaStreamSynchronize(st));
            std::vector<bf16> &h = o == ref ? href : hout;
            CK(cudaMemcpy(h.data(), o, h.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
            double vs_tc = 0.0, den_tc = 0.0;
            bool nan = false;
            for (size_t i = 0; i < h.size(); i++) {
                if ((int)(i / d % S) < first_query(s)) continue; // not a query row: never written
                const double a = bf(h[i]), b = bf(href[i]);
                if (isnan(a)) nan = true;
                vs_tc = std::max(vs_tc, fabs(a - b));
                den_tc = std::max(den_tc, fabs(b));
            }
            // float64 reference on sampled rows of every head
            double num = 0.0, den = 0.0;
            std::vector<double> r(s.Dh);
            for (int k = 0; k < 64; k++) {
                const int q0 = first_query(s), b = (int)(mix64(k * 7 + 1) % s.B);
                const int p = k < 2 ? (k ? S - 1 : std::max(q0, s.L - 1)) : q0 + (int)(mix64(k) % (S - q0));
                for (int hh = 0; hh < s.H; hh++) {
                    reference(hq, s, b, p, hh, r.data());
                    for (int e = 0; e < s.Dh; e++) {
                        const double g = bf(h[(size_t)(((int64_t)b * S + p) * d + hh * s.Dh + e)]);
                        num = std::max(num, fabs(g - r[e]));
                        den = std::max(den, fabs(r[e]));
                    }
                }
            }
            const double err = nan ? INFINITY : num / den;
            if (dump && !strcmp(v.name, "auto")) {
                FILE *f = fopen((std::string(dump) + "/out_" + name_of(s) + ".bin").c_str(), "wb");
                if (f) fwrite(h.data(), sizeof(bf16), h.size(), f), fclose(f);
            }
            for (int i = 0; i < 3; i++) launch();
            std::vector<float> ts;
            for (int rp = 0; rp < reps; rp++) {
                CK(cudaEventRecord(e0, st));
                for (int i = 0; i < 10; i++) launch();
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                ts.push_back(ms * 100.0f); // us per launch
            }
            std::sort(ts.begin(), ts.end());
            const double us = ts[ts.size() / 2];
            printf("{\"shape\": \"%s\", \"variant\": \"%s\", \"tile_q\": %d, \"us\": %.2f, \"min_us\": %.2f, "
                   "\"useful_tflops\": %.1f, \"rel_err_f64\": %.2e, \"rel_diff_tc16\": %.2e}\n",
                   name_of(s).c_str(), v.name, v.tq, us, ts[0], flops / us * 1e-6, err, vs_tc / den_tc);
            fflush(stdout);
            if (!(err < 1e-2)) {
                fprintf(stderr, "attention-bench: %s %s: relative error %.3g vs float64\n", name_of(s).c_str(), v.name, err);
                failed = 1;
            }
            cudaFree(dt);
        }
        cudaFree(qkv);
        cudaFree(out);
        cudaFree(ref);
    }
    return failed;
}
