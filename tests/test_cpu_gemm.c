/* libflame's own CPU GEMM and dot-head kernels (src/cpu/gemm.c, src/cpu/dot.c, src/cpu/ids.c)
 * against a float64 reference on fresh random inputs: odd sizes, row and column tails, strided
 * outputs whose gaps must stay untouched, every instruction set this CPU runs (they must agree
 * bit for bit, and with any thread split). Outputs are poisoned with NaN first. */
#include "testutil.h"
#include "cpu/kernels.h"

static int setup(void **state)
{
    tu_seed();
    return 0;
}

static float *randf(size_t n)
{
    float *x = malloc((n ? n : 1) * sizeof *x);
    tu_fill(x, n);
    return x;
}

static double act_ref(double v, fl_act_kind a)
{
    switch (a) {
    case FL_KACT_RELU: return v > 0 ? v : 0;
    case FL_KACT_GELU_ERF: return 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
    case FL_KACT_GELU_TANH: return 0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    default: return v;
    }
}

/* Each element within 1e-5 of the float64 value relative to the size of what was summed
 * (sum |x_k w_k| + |bias| + |old|, the scale of float32 rounding), so one near-cancelling
 * output cannot make the bound meaningless, and no NaN ever passes. */
static void assert_close(const float *got, const double *want, const double *scale, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        if (!(err <= 1e-5 * (scale[i] > 1.0 ? scale[i] : 1.0)))
            fail_msg("%s: element %zu = %.9g, float64 %.9g (error %.3g, scale %.3g)", what, i, (double)got[i],
                     want[i], err, scale[i]);
    }
}

static int isas(fl_cpu_isa *list)
{
    int n = 0;
    fl_cpu_isa top = fl_cpu_isa_detect();
    for (int i = FL_ISA_BASE; i <= (int)top; i++) list[n++] = (fl_cpu_isa)i;
    return n;
}

/* C = act(A W^T + bias + old): packed weights, every isa, 1..4 threads, strided C. */
static void test_gemm_packed(void **state)
{
    fl_cpu_isa list[3];
    const int nisa = isas(list);
    print_message("# instruction sets tested: %d (up to %s)\n", nisa, fl_cpu_isa_name(list[nisa - 1]));
    for (int rep = 0; rep < 60; rep++) {
        /* sizes around the tile edges (6 rows, 16/32 columns) and odd depths */
        const int64_t rows = rep < 6 ? rep + 1 : 1 + tu_below(rep % 3 ? 20 : 200);
        const int64_t n = rep % 5 == 0 ? 1 + tu_below(16) : 1 + tu_below(150);
        const int32_t k = rep % 7 == 0 ? 1 + (int32_t)tu_below(5) : 1 + (int32_t)tu_below(300);
        const fl_act_kind act = (fl_act_kind)(rep % 4);
        const bool with_bias = rep % 3 != 1, acc = rep % 2 && act == FL_KACT_NONE;
        const int64_t lda = k + tu_below(3), ldc = n + tu_below(4);
        float *a = randf((size_t)(rows * lda)), *w = randf((size_t)(n * k)), *bias = randf((size_t)n);
        float *old = randf((size_t)(rows * ldc));
        float *bp = malloc(fl_cpu_pack_floats(k, n) * sizeof(float));
        fl_cpu_pack(w, k, k, n, bp);
        double *want = malloc((size_t)(rows * n) * sizeof(double)), *scale = malloc((size_t)(rows * n) * sizeof(double));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0, sc = 0;
                for (int32_t kk = 0; kk < k; kk++) {
                    s += (double)a[r * lda + kk] * w[j * k + kk];
                    sc += fabs((double)a[r * lda + kk] * w[j * k + kk]);
                }
                if (with_bias) s += bias[j], sc += fabs(bias[j]);
                if (acc) s += old[r * ldc + j], sc += fabs(old[r * ldc + j]);
                want[r * n + j] = act_ref(s, act);
                scale[r * n + j] = sc;
            }
        float *first = NULL;
        float *c = malloc((size_t)(rows * ldc) * sizeof(float)), *got = malloc((size_t)(rows * n) * sizeof(float));
        for (int i = 0; i < nisa; i++)
            for (int threads = 1; threads <= 4; threads += 3) {
                if (acc)
                    memcpy(c, old, (size_t)(rows * ldc) * sizeof(float));
                else
                    tu_poison(c, (size_t)(rows * ldc));
                for (int64_t r = 0; r < rows; r++) /* the gaps: a sentinel that must survive */
                    for (int64_t j = n; j < ldc; j++) c[r * ldc + j] = 7.0f;
                fl_cpu_gemm_packed_mt(list[i], rows, n, k, a, lda, bp, with_bias ? bias : NULL, acc, act, c, ldc,
                                      threads);
                for (int64_t r = 0; r < rows; r++) {
                    memcpy(got + r * n, c + r * ldc, (size_t)n * sizeof(float));
                    for (int64_t j = n; j < ldc; j++) assert_true(c[r * ldc + j] == 7.0f);
                }
                assert_close(got, want, scale, (size_t)(rows * n), fl_cpu_isa_name(list[i]));
                if (!first) {
                    first = malloc((size_t)(rows * n) * sizeof(float));
                    memcpy(first, got, (size_t)(rows * n) * sizeof(float));
                } else if (memcmp(first, got, (size_t)(rows * n) * sizeof(float)) != 0) {
                    fail_msg("isa %s, %d threads: not the bits of the scalar kernel (rows %lld n %lld k %d)",
                             fl_cpu_isa_name(list[i]), threads, (long long)rows, (long long)n, k);
                }
            }
        free(first);
        free(a);
        free(w);
        free(bias);
        free(old);
        free(bp);
        free(want);
        free(scale);
        free(c);
        free(got);
    }
}

/* The dot head's batched form: C = H T^T with T unpacked (packed as it streams), the same bits
 * as fl_cpu_gemm_packed on the packed table, for any thread count. */
static void test_gemm_nt(void **state)
{
    fl_cpu_isa list[3];
    const int nisa = isas(list);
    for (int rep = 0; rep < 12; rep++) {
        const int64_t rows = 2 + tu_below(40), n = 1 + tu_below(rep % 2 ? 3000 : 100);
        const int32_t k = rep % 3 == 0 ? 64 : 1 + (int32_t)tu_below(130);
        const int64_t ldb = k + tu_below(2), ldc = n + tu_below(3);
        float *h = randf((size_t)(rows * k)), *t = randf((size_t)(n * ldb));
        float *bp = malloc(fl_cpu_pack_floats(k, n) * sizeof(float));
        fl_cpu_pack(t, ldb, k, n, bp);
        float *ref = malloc((size_t)(rows * ldc) * sizeof(float)), *c = malloc((size_t)(rows * ldc) * sizeof(float));
        float *scratch = malloc(4 * fl_cpu_gemm_nt_scratch(k) * sizeof(float));
        double *want = malloc((size_t)(rows * n) * sizeof(double)), *scale = malloc((size_t)(rows * n) * sizeof(double));
        float *got = malloc((size_t)(rows * n) * sizeof(float));
        for (int64_t r = 0; r < rows; r++)
            for (int64_t j = 0; j < n; j++) {
                double s = 0, sc = 0;
                for (int32_t kk = 0; kk < k; kk++) {
                    s += (double)h[r * k + kk] * t[j * ldb + kk];
                    sc += fabs((double)h[r * k + kk] * t[j * ldb + kk]);
                }
                want[r * n + j] = s;
                scale[r * n + j] = sc;
            }
        for (int i = 0; i < nisa; i++) {
            tu_poison(ref, (size_t)(rows * ldc));
            fl_cpu_gemm_packed(list[i], rows, n, k, h, k, bp, NULL, false, FL_KACT_NONE, ref, ldc);
            for (int threads = 1; threads <= 4; threads++) {
                tu_poison(c, (size_t)(rows * ldc));
                fl_cpu_gemm_nt_mt(list[i], rows, n, k, h, k, t, ldb, c, ldc, scratch, threads);
                for (int64_t r = 0; r < rows; r++) {
                    memcpy(got + r * n, c + r * ldc, (size_t)n * sizeof(float));
                    if (memcmp(got + r * n, ref + r * ldc, (size_t)n * sizeof(float)))
                        fail_msg("isa %s, %d threads, row %lld: the streamed packing changed the bits",
                                 fl_cpu_isa_name(list[i]), threads, (long long)r);
                }
                assert_close(got, want, scale, (size_t)(rows * n), "gemm_nt");
            }
        }
        free(h);
        free(t);
        free(bp);
        free(ref);
        free(c);
        free(scratch);
        free(want);
        free(scale);
        free(got);
    }
}

/* The single-user dot head on every isa: gathered and contiguous rows, odd widths (16-lane
 * tails) and row counts (16-row tails), strided output; all isas and thread splits agree. */
static void test_dot_rows_isas(void **state)
{
    fl_cpu_isa list[3];
    const int nisa = isas(list);
    for (int rep = 0; rep < 40; rep++) {
        const int32_t d = rep < 3 ? 64 : 1 + (int32_t)tu_below(150);
        const int64_t rows = 1 + tu_below(rep % 4 ? 200 : 5000), n = 1 + tu_below(rows);
        const int64_t stride = 1 + (rep % 3 == 2) * 2;
        const bool gather = rep % 2;
        float *h = randf((size_t)d), *table = randf((size_t)(rows * d));
        int64_t *ids = malloc((size_t)n * sizeof(int64_t));
        for (int64_t i = 0; i < n; i++) ids[i] = tu_below(rows);
        const int64_t first = gather ? 0 : tu_below(rows - n + 1);
        double *want = malloc((size_t)n * sizeof(double)), *scale = malloc((size_t)n * sizeof(double));
        for (int64_t i = 0; i < n; i++) {
            const float *r = table + (gather ? ids[i] : first + i) * d;
            double s = 0, sc = 0;
            for (int32_t j = 0; j < d; j++) s += (double)h[j] * r[j], sc += fabs((double)h[j] * r[j]);
            want[i] = s;
            scale[i] = sc;
        }
        float *out = malloc((size_t)(n * stride) * sizeof(float)), *got = malloc((size_t)n * sizeof(float));
        float *first_bits = malloc((size_t)n * sizeof(float));
        for (int i = 0; i < nisa; i++) {
            tu_poison(out, (size_t)(n * stride));
            for (int64_t c = 0; c < n; c++)
                for (int64_t g = 1; g < stride; g++) out[c * stride + g] = 7.0f;
            fl_cpu_dot_rows_isa(list[i], h, d, table, gather ? ids : NULL, first, n, out, stride);
            for (int64_t c = 0; c < n; c++) {
                got[c] = out[c * stride];
                for (int64_t g = 1; g < stride; g++) assert_true(out[c * stride + g] == 7.0f);
            }
            assert_close(got, want, scale, (size_t)n, fl_cpu_isa_name(list[i]));
            if (i == 0)
                memcpy(first_bits, got, (size_t)n * sizeof(float));
            else if (memcmp(first_bits, got, (size_t)n * sizeof(float)))
                fail_msg("isa %s: not the bits of the scalar kernel (d %d, n %lld)", fl_cpu_isa_name(list[i]), d,
                         (long long)n);
        }
        /* the detected isa, split over threads */
        for (int threads = 1; threads <= 3; threads++) {
            tu_poison(out, (size_t)(n * stride));
            fl_cpu_dot_rows_mt(fl_cpu_isa_detect(), h, d, table, gather ? ids : NULL, first, n, out, stride, threads);
            for (int64_t c = 0; c < n; c++) assert_true(memcmp(&out[c * stride], &first_bits[c], sizeof(float)) == 0);
        }
        free(h);
        free(table);
        free(ids);
        free(want);
        free(scale);
        free(out);
        free(got);
        free(first_bits);
    }
}

/* The id scans behind validation and the contiguity check. */
static void test_id_scans(void **state)
{
    for (int rep = 0; rep < 200; rep++) {
        const size_t n = (size_t)tu_below(rep % 2 ? 10000 : 40);
        int64_t *ids = malloc((n ? n : 1) * sizeof(int64_t));
        const int64_t base = tu_below(1000), limit = base + (int64_t)n + tu_below(3);
        for (size_t i = 0; i < n; i++) ids[i] = base + (int64_t)i;
        assert_true(fl_cpu_ids_contiguous(ids, n));
        assert_int_equal(fl_cpu_first_out_of_range(ids, n, limit), -1);
        if (n == 0) {
            free(ids);
            continue;
        }
        const size_t at = (size_t)tu_below((int64_t)n);
        const int64_t keep = ids[at];
        ids[at] = keep + 1 + tu_below(5); /* breaks the run (one id alone is always a run); may still be in range */
        assert_true(fl_cpu_ids_contiguous(ids, n) == (n == 1));
        ids[at] = rep % 3 == 0 ? -1 - tu_below(5) : rep % 3 == 1 ? limit : INT64_MIN;
        assert_int_equal(fl_cpu_first_out_of_range(ids, n, limit), (int64_t)at);
        if (at + 1 < n) { /* a second bad id later: the first is named */
            ids[n - 1] = -7;
            assert_int_equal(fl_cpu_first_out_of_range(ids, n, limit), (int64_t)at);
        }
        free(ids);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_packed),
        cmocka_unit_test(test_gemm_nt),
        cmocka_unit_test(test_dot_rows_isas),
        cmocka_unit_test(test_id_scans),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
