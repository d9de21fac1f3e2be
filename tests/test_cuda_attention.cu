/* The CUDA SUMI attention kernels against a float64 reference on fresh random inputs: the
 * tensor-core kernel (fp16, bf16) and the CUDA-core kernel (fp32, and fp16/bf16 head dims the
 * tensor-core kernel does not take), for tiles over whole sequences (every token a query) and
 * for the last block's selected queries (positions through qpos). Histories cross the 32-key
 * steps (0, 1, 31..33, 100+ keys), outputs are NaN-poisoned before each run and rows no tile
 * covers must stay poisoned. Skipped with a message where no GPU is usable; FLAME_REQUIRE_GPU
 * turns the skip into a failure. */
#include <vector>

extern "C" {
#include "testutil.h"
#include "tu_gpu.h"
}
#include "attention_tc.cuh"
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

enum kernel { DISPATCH, TENSOR_CORES };

/* One random problem: `nseq` sequences packed as in the engine, fused QKV rows [T, 3d]. In
 * `last` mode the queries are only the candidates (a separate Q buffer [S, d], positions
 * through qpos), as in the last block. Returns the normwise error (INFINITY on NaN or a
 * clobbered row). */
template <typename T> static double run_case(int dh, int heads, bool last, kernel which, double *worst_row)
{
    const int d = dh * heads, nseq = 1 + (int)tu_below(4);
    const int64_t ld = 3 * d;
    static const int hist_choices[] = {0, 1, 15, 16, 17, 31, 32, 33, 64, 100, 257};
    std::vector<seq> seqs;
    int64_t T_rows = 0, S_rows = 0;
    for (int i = 0; i < nseq; i++) {
        seq s{hist_choices[tu_below(11)], (int)tu_below(41), T_rows};
        if (s.n + s.m == 0) s.m = 1;
        seqs.push_back(s);
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
            for (int q0 = 0; q0 < s.n + s.m; q0 += FL_ATTN_QT)
                tiles.push_back({s.off, s.n, s.n + s.m - q0 < FL_ATTN_QT ? s.n + s.m - q0 : FL_ATTN_QT, s.off + q0, q0, -1});
            continue;
        }
        for (int i = 0; i < s.m; i++) {
            qpos.push_back(s.n + i);
            qrow_of.push_back(s.off + s.n + i);
            for (int e = 0; e < d; e++) qsel[(size_t)((sel + i) * d + e)] = qkv[(size_t)((s.off + s.n + i) * ld + e)];
        }
        for (int i0 = 0; i0 < s.m; i0 += FL_ATTN_QT)
            tiles.push_back({s.off, s.n, s.m - i0 < FL_ATTN_QT ? s.m - i0 : FL_ATTN_QT, sel + i0, 0, (int32_t)(sel + i0)});
        sel += s.m;
    }
    const int64_t out_rows = last ? S_rows : T_rows, ldq = last ? d : ld;
    const int64_t out_alloc = out_rows + 1; // one extra row no tile covers
    T *dqkv, *dq, *dout;
    fl_attn_tile *dtiles;
    int32_t *dqpos;
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
    if (which == TENSOR_CORES) {
        if (!fl_cuda_attention_tc_fits<T>(dh, q, ldq, dqkv + d, dqkv + 2 * d, ld, dout, d))
            fail_msg("dh %d: the tensor-core kernel should take this problem", dh);
        st = fl_cuda_attention_tc<T>(dtiles, (int64_t)tiles.size(), dqpos, heads, dh, q, ldq, dqkv + d, dqkv + 2 * d,
                                     ld, dout, d, 0);
    } else {
        st = fl_cuda_attention<T>(dtiles, (int64_t)tiles.size(), dqpos, heads, dh, q, ldq, dqkv + d, dqkv + 2 * d, ld,
                                  dout, d, 0);
    }
    if (st) fail_msg("attention dh %d: %s", dh, flame_last_error());
    CK(cudaDeviceSynchronize());
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tensor_cores_fp16),
        cmocka_unit_test(test_tensor_cores_bf16),
        cmocka_unit_test(test_dispatch),
        cmocka_unit_test(test_tc_refuses),
    };
    return cmocka_run_group_tests(tests, tu_gpu_setup, NULL);
}
