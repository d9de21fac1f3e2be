/* The CUDA SUMI attention kernels against a float64 reference on fresh random inputs: the
 * tensor-core kernel (fp16, bf16), the Hopper wgmma kernel (fp16, bf16, head dims 64 and 128,
 * 128-query tiles, every variant: lock-step with key blocks of 64 and 128, warp-specialised,
 * warp-specialised taking turns, warp-specialised with the softmax overlapped, key blocks of
 * 64 and 128, one CTA an item or persistent (three CTAs running every item, handed out through
 * work counters, which must be left at zero, or a fixed assignment; and the engine's launch,
 * one CTA an SM; taking turns, staged by TMA, and with each item's last P V issued beside the
 * next item's first S); heads innermost for 64, outermost for 128) and the CUDA-core kernel (fp32,
 * and fp16/bf16 head dims the tensor-core kernel does not take), for tiles over whole sequences (every token
 * a query) and for the last block's selected queries (positions through qpos). Histories cross
 * the key steps and blocks (0, 1, 15..17, 31..33, 63..65, 127..129, 257, 4097, and 65,537 for
 * the selected queries), ragged batches, zero and one candidate; outputs are NaN-poisoned
 * before each run and rows no tile covers must stay poisoned. The wgmma tests are skipped
 * with a message on GPUs other than compute capability 9.0. FLAME_ATTN_QUICK=1 leaves out
 * the long histories (for runs under compute-sanitizer); FLAME_ATTN_FILTER runs the tests whose
 * names match its pattern. Skipped with a message where no GPU
 * is usable; FLAME_REQUIRE_GPU turns the skip into a failure. */
#include <vector>

extern "C" {
#include "testutil.h"
#include "tu_gpu.h"
}
#include "attention_tc.cuh"
#include "attention_wgmma.cuh"
#include "tu_cuda.cuh"

struct seq {
    int n, m;
    int64_t off; // first token row
};

/* out[row] for query position p of sequence s, head h, in float64 from the rounded inputs */
template <typename T>
static void reference(const std::vector<T> &qkv, int64_t ld, int d, int dh, const seq &s, int p, const T *qrow,
                      int h, double *o)
{
    const int n = s.n;
    std::vector<int> keys;
    for (int j = 0; j < (p < n ? p + 1 : n); j++) keys.push_back(j);
    if (p >= n) keys.push_back(p);
    std::vector<double> w(keys.size());
    double mx = -INFINITY;
    for (size_t i = 0; i < keys.size(); i++) {
        double acc = 0.0;
        const T *kr = &qkv[(s.off + keys[i]) * ld + d + h * dh];
        for (int e = 0; e < dh; e++) acc += (double)from_t(qrow[h * dh + e]) * from_t(kr[e]);
        w[i] = acc / sqrt((double)dh);
        mx = w[i] > mx ? w[i] : mx;
    }
    double l = 0.0;
    for (double &x : w) l += (x = exp(x - mx));
    for (int e = 0; e < dh; e++) o[e] = 0.0;
    for (size_t i = 0; i < keys.size(); i++) {
        const T *vr = &qkv[(s.off + keys[i]) * ld + 2 * d + h * dh];
        for (int e = 0; e < dh; e++) o[e] += w[i] / l * from_t(vr[e]);
    }
}

enum kernel { DISPATCH, TENSOR_CORES, WGMMA, DISPATCH_WG };

static bool quick(void) { return getenv("FLAME_ATTN_QUICK") != nullptr; }

/* `seqs` (n, m) packed as in the engine, fused QKV rows [T, 3d]. In `last` mode the queries
 * are only the candidates (a separate Q buffer [S, d], positions through qpos), as in the last
 * block. WGMMA and DISPATCH_WG build tiles of FL_ATTN_QT_WG queries (bn: the wgmma variant).
 * `check_every` > 1 compares only every such row with the reference (long histories). Returns
 * the normwise error (INFINITY on NaN or a clobbered row). */
/* max_keys of the tensor-core and dispatch launches: the longest history of the problem, or
 * this value when it is >= 0 (the hint overstated or unknown; it may change the split of the
 * keys, never the result) */
static int64_t keys_hint = -1;
/* whether the wgmma launches get work counters (the persistent kernel's greedy hand-out) or
 * not (its fixed assignment); the dispatch launches always get them, as in the engine */
static bool wg_counters = true;
/* the work counters: one pair for the whole run, zeroed once, as an engine executor's; every
 * persistent launch must leave them at zero for the next */
static uint32_t *work_counters(void)
{
    static uint32_t *w = nullptr;
    if (!w) {
        CK(cudaMalloc(&w, 2 * sizeof(uint32_t)));
        CK(cudaMemset(w, 0, 2 * sizeof(uint32_t)));
    }
    return w;
}

template <typename T>
static double run_problem(std::vector<seq> seqs, int dh, int heads, bool last, kernel which, int bn,
                          int check_every, double *worst_row)
{
    const int d = dh * heads;
    const int64_t ld = 3 * d;
    const int tq = which == WGMMA || which == DISPATCH_WG ? FL_ATTN_QT_WG : FL_ATTN_QT;
    int64_t T_rows = 0, S_rows = 0, max_n = 0;
    for (seq &s : seqs) {
        max_n = s.n > max_n ? s.n : max_n;
        s.off = T_rows;
        T_rows += s.n + s.m;
        S_rows += s.m;
    }
    std::vector<T> qkv((size_t)(T_rows * ld));
    for (T &x : qkv) x = to_t<T>(tu_uniform() * 2.0f);
    // queries: whole sequences (rows of qkv) or the candidates gathered into [S, d]
    std::vector<T> qsel((size_t)(S_rows * d + 1));
    std::vector<int32_t> qpos;
    std::vector<fl_attn_tile> tiles;
    std::vector<int64_t> qrow_of; // last mode: the token row of each selected query
    int64_t sel = 0;
    for (const seq &s : seqs) {
        if (!last) {
            for (int q0 = 0; q0 < s.n + s.m; q0 += tq)
                tiles.push_back({s.off, s.n, s.n + s.m - q0 < tq ? s.n + s.m - q0 : tq, s.off + q0, q0, -1});
            continue;
        }
        for (int i = 0; i < s.m; i++) {
            qpos.push_back(s.n + i);
            qrow_of.push_back(s.off + s.n + i);
            for (int e = 0; e < d; e++) qsel[(size_t)((sel + i) * d + e)] = qkv[(size_t)((s.off + s.n + i) * ld + e)];
        }
        for (int i0 = 0; i0 < s.m; i0 += tq)
            tiles.push_back({s.off, s.n, s.m - i0 < tq ? s.m - i0 : tq, sel + i0, 0, (int32_t)(sel + i0)});
        sel += s.m;
    }
    const int64_t out_rows = last ? S_rows : T_rows, ldq = last ? d : ld;
    const int64_t out_alloc = out_rows + 1; // one extra row no tile covers
    T *dqkv, *dq, *dout;
    fl_attn_tile *dtiles;
    int32_t *dqpos;
    uint32_t *dwork = work_counters();
    CK(cudaMalloc(&dqkv, qkv.size() * sizeof(T)));
    CK(cudaMalloc(&dq, qsel.size() * sizeof(T)));
    CK(cudaMalloc(&dout, (size_t)(out_alloc * d) * sizeof(T)));
    CK(cudaMalloc(&dtiles, (tiles.size() + 1) * sizeof(fl_attn_tile)));
    CK(cudaMalloc(&dqpos, (qpos.size() + 1) * sizeof(int32_t)));
    CK(cudaMemcpy(dqkv, qkv.data(), qkv.size() * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dq, qsel.data(), qsel.size() * sizeof(T), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dtiles, tiles.data(), tiles.size() * sizeof(fl_attn_tile), cudaMemcpyHostToDevice));
    if (!qpos.empty()) CK(cudaMemcpy(dqpos, qpos.data(), qpos.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    CK(cudaMemset(dout, 0xff, (size_t)(out_alloc * d) * sizeof(T))); // NaN in every dtype
    const T *q = last ? dq : dqkv;
    flame_status st;
    if (which == WGMMA) {
        if (!fl_cuda_attention_wg_fits<T>(dh, q, ldq, dqkv + d, dqkv + 2 * d, ld, dout, d))
            fail_msg("dh %d: the wgmma kernel should take this problem", dh);
        // the persistent variants on three CTAs: each runs many items through one key/value
        // ring and one Q tile, their barriers' phases wrapping many times
        const bool persistent = bn >= FL_WG_POVL64;
        st = fl_cuda_attention_wg<T>(dtiles, (int64_t)tiles.size(), dqpos, heads, dh, q, ldq, dqkv + d, dqkv + 2 * d,
                                     ld, dout, d, 0, bn, persistent ? 3 : 0, wg_counters ? dwork : nullptr);
    } else if (which == TENSOR_CORES) {
        if (!fl_cuda_attention_tc_fits<T>(dh, q, ldq, dqkv + d, dqkv + 2 * d, ld, dout, d))
            fail_msg("dh %d: the tensor-core kernel should take this problem", dh);
        st = fl_cuda_attention_tc<T>(dtiles, (int64_t)tiles.size(), dqpos, heads, dh, q, ldq, dqkv + d, dqkv + 2 * d,
                                     ld, dout, d, 0, keys_hint >= 0 ? keys_hint : max_n);
    } else {
        st = fl_cuda_attention<T>({.tiles = dtiles, .num_tiles = (int64_t)tiles.size(), .qpos = dqpos, .heads = heads,
                                   .dh = dh, .q = q, .ldq = ldq, .k = dqkv + d, .v = dqkv + 2 * d, .ldkv = ld,
                                   .out = dout, .ldo = d, .tile_q = tq,
                                   .max_keys = keys_hint >= 0 ? keys_hint : max_n, .work = dwork},
                                  0);
    }
    if (st) fail_msg("attention dh %d: %s", dh, flame_last_error());
    CK(cudaDeviceSynchronize());
    uint32_t left[2]; // a persistent launch leaves the counters at zero for the next
    CK(cudaMemcpy(left, dwork, sizeof left, cudaMemcpyDeviceToHost));
    if (left[0] || left[1]) fail_msg("dh %d: work counters left at %u, %u", dh, left[0], left[1]);
    std::vector<T> got((size_t)(out_alloc * d));
    CK(cudaMemcpy(got.data(), dout, got.size() * sizeof(T), cudaMemcpyDeviceToHost));
    cudaFree(dqkv);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dtiles);
    cudaFree(dqpos);

    double num = 0.0, den = 0.0;
    *worst_row = 0.0;
    std::vector<double> o(dh);
    int64_t row = 0;
    for (const seq &s : seqs) {
        const int first = last ? s.n : 0;
        for (int p = first; p < s.n + s.m; p++, row++) {
            if (check_every > 1 && row % check_every != 0 && p != s.n + s.m - 1) continue;
            const T *qr = last ? &qsel[(size_t)(row * d)] : &qkv[(size_t)((s.off + p) * ld)];
            for (int h = 0; h < heads; h++) {
                reference<T>(qkv, ld, d, dh, s, p, qr, h, o.data());
                for (int e = 0; e < dh; e++) {
                    const float g = from_t(got[(size_t)(row * d + h * dh + e)]);
                    if (isnan(g)) return INFINITY;
                    const double diff = fabs(g - o[e]);
                    num = diff > num ? diff : num;
                    *worst_row = diff > *worst_row ? diff : *worst_row;
                    den = fabs(o[e]) > den ? fabs(o[e]) : den;
                }
            }
        }
    }
    for (int e = 0; e < d; e++) // the row past every tile is untouched
        if (!isnan(from_t(got[(size_t)(out_rows * d + e)]))) return INFINITY;
    return den > 0 ? num / den : num;
}

/* One random problem: 1..4 sequences with histories from `hists` and 0..max_m candidates. */
template <typename T>
static double run_case(int dh, int heads, bool last, kernel which, double *worst_row, const int *hists, int nh,
                       int max_m, int bn = 0)
{
    const int nseq = 1 + (int)tu_below(4);
    std::vector<seq> seqs;
    for (int i = 0; i < nseq; i++) {
        seq s{hists[tu_below(nh)], (int)tu_below(max_m + 1), 0};
        if (s.n + s.m == 0) s.m = 1;
        seqs.push_back(s);
    }
    return run_problem<T>(seqs, dh, heads, last, which, bn, 1, worst_row);
}

static const int hist_choices[] = {0, 1, 15, 16, 17, 31, 32, 33, 64, 100, 257};
template <typename T> static double run_case(int dh, int heads, bool last, kernel which, double *worst_row)
{
    return run_case<T>(dh, heads, last, which, worst_row, hist_choices, 11, 40);
}

template <typename T> static void check(const char *name, kernel which, const int *dhs, int ndh, double tol)
{
    for (int i = 0; i < ndh; i++)
        for (int last = 0; last < 2; last++)
            for (int rep = 0; rep < 3; rep++) {
                const int heads = 1 + (int)tu_below(3);
                double worst;
                const double err = run_case<T>(dhs[i], heads, last, which, &worst);
                if (rep == 0)
                    fprintf(stderr, "# %s dh %d heads %d %s: relative error %.2e (max abs %.2e)\n", name, dhs[i], heads,
                            last ? "selected queries" : "whole sequences", err, worst);
                if (!(err < tol)) fail_msg("%s dh %d heads %d last %d: relative error %.3g >= %.3g", name, dhs[i], heads, last, err, tol);
            }
}

static const int tc_dhs[] = {16, 32, 48, 64, 128};
static const int core_dhs[] = {8, 24, 64, 128};

/* fp16: P enters P V in fp16 and the output is rounded to fp16 (2^-11). */
static void test_tensor_cores_fp16(void **state)
{
    TU_NEED_GPU();
    check<__half>("tc fp16", TENSOR_CORES, tc_dhs, 5, 2e-3);
}

/* bf16: output rounded to bf16 (2^-8); P is carried in two bf16 terms. */
static void test_tensor_cores_bf16(void **state)
{
    TU_NEED_GPU();
    check<__nv_bfloat16>("tc bf16", TENSOR_CORES, tc_dhs, 5, 8e-3);
}

/* Both widths of the tensor-core kernel: a launch of fewer CTAs than SMs (a few candidates
 * against a long history, as a KV-cache hit) takes twice the warps per tile and, on compute
 * capability 9.0 and later, splits each tile's keys across a cluster of CTAs when that leaves
 * each CTA at least two steps of its warps' keys (here 16 CTAs: clusters of 2 at head dim 64,
 * 4 at 128); one of more CTAs than SMs the usual count. Each problem is sized so that it takes
 * the width it names here. With the keys hint overstated, the random small problems of the
 * other tests take clusters of every size up to 8, many of whose CTAs get no keys at all. */
template <typename T> static void check_widths(const char *name, double tol)
{
    int device = 0, sms = 0;
    CK(cudaGetDevice(&device));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const int heads = 2;
    for (int dh : {64, 128}) {
        double worst;
        // wide: one user, 128 candidates (8 tiles a head) against 1,100 history keys
        const double wide = run_problem<T>({{1100, 128, 0}}, dh, heads, true, TENSOR_CORES, 0, 1, &worst);
        fprintf(stderr, "# %s dh %d wide (16 tiles x heads, clustered): relative error %.2e\n", name, dh, wide);
        if (!(wide < tol)) fail_msg("%s dh %d wide: relative error %.3g >= %.3g", name, dh, wide, tol);
        // the keys hint unknown (no split) and overstated (the largest clusters, also over a
        // sequence of 20 keys: CTAs with no keys at all)
        for (int64_t hint : {(int64_t)0, (int64_t)1 << 30}) {
            keys_hint = hint;
            const double e = run_problem<T>({{1100, 128, 0}, {20, 3, 0}}, dh, heads, true, TENSOR_CORES, 0, 1, &worst);
            keys_hint = -1;
            if (!(e < tol)) fail_msg("%s dh %d wide, keys hint %lld: relative error %.3g", name, dh, (long long)hint, e);
        }
        // random small problems (1..4 users, histories up to 257), clustered as far as the
        // launch allows
        keys_hint = (int64_t)1 << 30;
        for (int last = 0; last < 2; last++)
            for (int rep = 0; rep < 3; rep++) {
                const double e = run_case<T>(dh, 1 + (int)tu_below(3), last, TENSOR_CORES, &worst);
                if (!(e < tol)) {
                    keys_hint = -1;
                    fail_msg("%s dh %d random, clustered: relative error %.3g", name, dh, e);
                }
            }
        keys_hint = -1;
        // usual: enough users that the tiles outnumber the SMs
        const int users = (sms + 2 * heads * 25 - 1) / (heads * 25) + 1; // 25 tiles a user a head
        std::vector<seq> many((size_t)users, seq{300, 100, 0});
        if (users * 25 * heads < sms) fail_msg("%d users make %d CTAs, fewer than %d SMs", users, users * 25 * heads, sms);
        const double usual = run_problem<T>(many, dh, heads, false, TENSOR_CORES, 0, 7, &worst);
        fprintf(stderr, "# %s dh %d usual (%d CTAs): relative error %.2e\n", name, dh, users * 25 * heads, usual);
        if (!(usual < tol)) fail_msg("%s dh %d usual: relative error %.3g >= %.3g", name, dh, usual, tol);
    }
}

static void test_tensor_cores_widths(void **state)
{
    TU_NEED_GPU();
    check_widths<__half>("tc fp16", 2e-3);
    check_widths<__nv_bfloat16>("tc bf16", 8e-3);
}

/* The dispatcher: fp32 always runs the exact CUDA-core kernel; fp16 head dims that are not a
 * multiple of 16 (8, 24) run it too. */
static void test_dispatch(void **state)
{
    TU_NEED_GPU();
    check<float>("cuda cores fp32", DISPATCH, core_dhs, 4, 1e-5);
    check<__half>("dispatch fp16", DISPATCH, core_dhs, 4, 2e-3);
    check<__nv_bfloat16>("dispatch bf16", DISPATCH, core_dhs, 4, 8e-3);
}

/* A head dim the tensor-core kernel cannot take is refused with a message, never launched. */
static void test_tc_refuses(void **state)
{
    TU_NEED_GPU();
    fl_attn_tile t{};
    const __half *p = reinterpret_cast<const __half *>(256);
    assert_false(fl_cuda_attention_tc_fits<__half>(24, p, 72, p, p, 72, p, 24));
    assert_false(fl_cuda_attention_tc_fits<__half>(64, p, 192, p + 1, p + 1, 192, p, 64)); /* unaligned K/V */
    assert_int_equal(fl_cuda_attention_tc<__half>(&t, 1, nullptr, 1, 24, p, 72, p, p, 72, nullptr, 24, 0),
                     FLAME_ERR_UNSUPPORTED);
    assert_non_null(strstr(flame_last_error(), "head dim 24"));
}

/* The wgmma kernel needs compute capability 9.0; elsewhere its tests say so and pass. */
static bool need_wg(void)
{
    if (fl_cuda_attention_wg_device()) return true;
    fprintf(stderr, "# wgmma attention skipped: the GPU is not compute capability 9.0\n");
    return false;
}

/* Histories across the 64- and 128-key blocks and the 128-query tiles, up to 300 candidates
 * (several candidate tiles, a partial one), zero and one candidate, 1..4 ragged sequences, both
 * key blocks, whole sequences and selected queries. */
static const int wg_hists[] = {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257, 500};
template <typename T> static void check_wg(const char *name, int dh, double tol)
{
    for (int bn = FL_WG_LOCK64; bn <= FL_WG_LAST; bn++) /* every kernel variant */
        for (int last = 0; last < 2; last++)
            for (int rep = 0; rep < 4; rep++) {
                const int heads = 1 + (int)tu_below(3), max_m = rep == 0 ? 0 : rep == 1 ? 1 : 300;
                double worst;
                wg_counters = rep % 2 == 0; // the persistent variants: both ways of handing out items
                const double err = run_case<T>(dh, heads, last, WGMMA, &worst, wg_hists, 16, max_m, bn);
                wg_counters = true;
                if (rep == 3)
                    fprintf(stderr, "# %s dh %d variant %d heads %d %s: relative error %.2e (max abs %.2e)\n", name, dh, bn,
                            heads, last ? "selected queries" : "whole sequences", err, worst);
                if (!(err < tol))
                    fail_msg("%s dh %d variant %d heads %d last %d max_m %d: relative error %.3g >= %.3g", name, dh, bn, heads,
                             last, max_m, err, tol);
            }
    // more (tile, head) items than the GPU has SMs: several waves of CTAs, each CTA's rows and
    // heads from the item order (heads outermost for head dim 128); under FLAME_ATTN_QUICK
    // only the engine's choice with work counters (povl128pt) and the variants after it
    // (the persistent variants with and without work counters)
    for (int bn = quick() ? FL_WG_POVL128PT : FL_WG_LOCK64; bn <= FL_WG_LAST; bn++)
        for (int counters = 1; counters >= (bn >= FL_WG_POVL64 ? 0 : 1); counters--) {
            std::vector<seq> many;
            for (int i = 0; i < 14; i++) many.push_back({(int)tu_below(1100), (int)tu_below(200), 0});
            double worst;
            wg_counters = counters;
            const double err = run_problem<T>(many, dh, 2, false, WGMMA, bn, quick() ? 11 : 5, &worst);
            wg_counters = true;
            fprintf(stderr, "# %s dh %d variant %d%s, 14 sequences x 2 heads: relative error %.2e\n", name, dh, bn,
                    counters ? "" : " (fixed assignment)", err);
            if (!(err < tol))
                fail_msg("%s dh %d variant %d counters %d, 14 sequences: relative error %.3g >= %.3g", name, dh, bn,
                         counters, err, tol);
        }
    if (quick()) return;
    // the engine's launch: the default variant with work counters over more items than the GPU
    // has SMs (at head dim 128 the persistent kernel, one CTA an SM, items from the counters),
    // twice, the second launch on the counters the first left
    for (int run = 0; run < 2; run++) {
        std::vector<seq> big;
        for (int i = 0; i < 16; i++) big.push_back({600 + (int)tu_below(500), 100 + (int)tu_below(200), 0});
        double worst;
        const double err = run_problem<T>(big, dh, 2, run == 1, WGMMA, FL_WG_DEFAULT, 9, &worst);
        fprintf(stderr, "# %s dh %d default variant, 16 sequences x 2 heads, %s: relative error %.2e\n", name, dh,
                run ? "selected queries" : "whole sequences", err);
        if (!(err < tol)) fail_msg("%s dh %d default variant, 16 sequences: relative error %.3g >= %.3g", name, dh, err, tol);
    }
    // long histories: 4097 (every token a query, every 7th row checked), and 65,537 keys seen
    // by a few selected candidates (positions and rows well past 16 bits)
    double worst;
    for (int last = 0; last < 2; last++) {
        const double err = run_problem<T>({{4097, 130, 0}, {17, 3, 0}}, dh, 2, last, WGMMA, 0, last ? 1 : 7, &worst);
        fprintf(stderr, "# %s dh %d history 4097 %s: relative error %.2e\n", name, dh, last ? "selected" : "whole", err);
        if (!(err < tol)) fail_msg("%s dh %d history 4097 last %d: relative error %.3g", name, dh, last, err);
    }
    const double err = run_problem<T>({{65537, 3, 0}, {0, 1, 0}}, dh, 1, true, WGMMA, 0, 1, &worst);
    fprintf(stderr, "# %s dh %d history 65537 selected: relative error %.2e\n", name, dh, err);
    if (!(err < tol)) fail_msg("%s dh %d history 65537: relative error %.3g", name, dh, err);
}

/* fp16: P enters P V in fp16 and the output is rounded to fp16 (2^-11). */
static void test_wgmma_fp16(void **state)
{
    TU_NEED_GPU();
    if (!need_wg()) return;
    check_wg<__half>("wgmma fp16", 64, 3e-3);
    check_wg<__half>("wgmma fp16", 128, 3e-3);
}

/* bf16: P enters P V in bf16 (2^-8) and the output is rounded to bf16. */
static void test_wgmma_bf16(void **state)
{
    TU_NEED_GPU();
    if (!need_wg()) return;
    check_wg<__nv_bfloat16>("wgmma bf16", 64, 1e-2);
    check_wg<__nv_bfloat16>("wgmma bf16", 128, 1e-2);
}

/* The dispatcher with 128-query tiles runs the wgmma kernel; the tile size the engine asks for
 * is the wgmma one only for 16-bit dtypes, head dims 64/128, enough work and a 9.0 GPU. */
static void test_dispatch_wg(void **state)
{
    TU_NEED_GPU();
    assert_int_equal(fl_cuda_attention_tile_queries(4, 64, 1 << 20, 8), FL_ATTN_QT);
    assert_int_equal(fl_cuda_attention_tile_queries(2, 96, 1 << 20, 8), FL_ATTN_QT);
    assert_int_equal(fl_cuda_attention_tile_queries(2, 64, 16, 1), FL_ATTN_QT);
    assert_int_equal(fl_cuda_attention_tile_queries(2, 128, 1 << 20, 8), fl_cuda_attention_wg_device() ? FL_ATTN_QT_WG : FL_ATTN_QT);
    if (!need_wg()) return;
    static const int dhs[] = {64, 128};
    for (int i = 0; i < 2; i++)
        for (int last = 0; last < 2; last++) {
            double worst;
            const double err = run_case<__nv_bfloat16>(dhs[i], 2, last, DISPATCH_WG, &worst, wg_hists, 16, 200);
            if (!(err < 1e-2)) fail_msg("dispatch wg bf16 dh %d last %d: relative error %.3g", dhs[i], last, err);
        }
}

/* What the wgmma kernel cannot take is refused with a message naming it, never launched. */
static void test_wg_refuses(void **state)
{
    TU_NEED_GPU();
    fl_attn_tile t{};
    const __half *p = reinterpret_cast<const __half *>(256);
    assert_false(fl_cuda_attention_wg_fits<__half>(96, p, 288, p, p, 288, p, 96));
    assert_false(fl_cuda_attention_wg_fits<__half>(64, p, 192, p + 4, p + 4, 192, p, 64)); /* 8-byte aligned K/V */
    assert_int_equal(fl_cuda_attention_wg<__half>(&t, 1, nullptr, 1, 96, p, 288, p, p, 288, nullptr, 96, 0),
                     FLAME_ERR_UNSUPPORTED);
    assert_non_null(strstr(flame_last_error(), "got 96"));
    assert_int_equal(fl_cuda_attention<__half>({.tiles = &t, .num_tiles = 1, .heads = 1, .dh = 64, .q = p, .ldq = 192,
                                                .k = p, .v = p, .ldkv = 192, .ldo = 64, .tile_q = 32},
                                               0),
                     FLAME_ERR_INVALID_ARG);
    assert_non_null(strstr(flame_last_error(), "32 queries"));
    assert_int_equal(fl_cuda_attention<float>(
                         {.num_tiles = 1, .heads = 1, .dh = 64, .ldq = 192, .ldkv = 192, .ldo = 64, .tile_q = FL_ATTN_QT_WG},
                         0),
                     FLAME_ERR_UNSUPPORTED);
    assert_int_equal(fl_cuda_attention<__half>({.tiles = &t, .num_tiles = 1, .heads = 70000, .dh = 64, .q = p,
                                                .ldq = 192, .k = p, .v = p, .ldkv = 192, .ldo = 64},
                                               0),
                     FLAME_ERR_INVALID_ARG);
    assert_non_null(strstr(flame_last_error(), "70000 heads"));
    if (!need_wg()) return;
    assert_int_equal(fl_cuda_attention_wg<__half>(&t, (int64_t)1 << 30, nullptr, 8, 64, p, 192, p, p, 192,
                                                  const_cast<__half *>(p), 64, 0),
                     FLAME_ERR_INVALID_ARG);
    assert_non_null(strstr(flame_last_error(), "1073741824 tiles x 8 heads"));
}

int main(void)
{
    /* FLAME_ATTN_FILTER: a pattern of the tests to run (e.g. "test_tensor_cores*" under the
     * sanitizers, which take minutes over every kernel) */
    if (getenv("FLAME_ATTN_FILTER")) cmocka_set_test_filter(getenv("FLAME_ATTN_FILTER"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wgmma_fp16),
        cmocka_unit_test(test_wgmma_bf16),
        cmocka_unit_test(test_dispatch_wg),
        cmocka_unit_test(test_wg_refuses),
        cmocka_unit_test(test_tensor_cores_fp16),
        cmocka_unit_test(test_tensor_cores_bf16),
        cmocka_unit_test(test_tensor_cores_widths),
        cmocka_unit_test(test_dispatch),
        cmocka_unit_test(test_tc_refuses),
    };
    return cmocka_run_group_tests(tests, tu_gpu_setup, NULL);
}
