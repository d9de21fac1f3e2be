/* The GPU activation pass (cuda/rows.cu fl_cuda_activation) against float64 references: erf-GELU
 * on every fp16 and every bf16 bit pattern, and on float32 values across the range with the
 * special values; tanh-GELU and ReLU on random values; both paths: 16-byte vectors (contiguous
 * and strided rows) and one element at a time (column counts that are not a multiple of a
 * vector), and more rows than one launch has blocks along y; ld-padding poisoned first, which
 * must stay untouched. erf-GELU is
 * x/2 (1 + erf(x / sqrt 2)) with float32 erf, then one rounding to the dtype: within one ulp
 * of the dtype plus 1e-6 |x| (the cancellation in 1 + erf for x < 0 is what the second term
 * bounds). Skipped with a message where no GPU is usable; FLAME_REQUIRE_GPU turns the skip
 * into a failure. */
#include <math.h>
#include <string.h>

#include <vector>

extern "C" {
#include "testutil.h"
#include "tu_gpu.h"
}
#include "kernels.cuh"
#include "tu_cuda.cuh"

/* GELU in float64 with erfc for x < 0, so the tail is exact to double precision (1 + erf(x)
 * would cancel) */
static double gelu_ref(double x)
{
    if (isnan(x)) return x;
    if (x == INFINITY) return x;
    if (x == -INFINITY) return NAN; /* x/2 (1 + erf(-inf)) = -inf * 0, as the formula evaluates */
    return x < 0 ? 0.5 * x * erfc(-x / sqrt(2.0)) : 0.5 * x * (2.0 - erfc(x / sqrt(2.0)));
}

static double gelu_tanh_ref(double x)
{
    return 0.5 * x * (1.0 + tanh(0.79788456080286536 * (x + 0.044715 * x * x * x)));
}

/* the spacing of dtype T's values at |y| (subnormal spacing below the normal range) */
template <typename T> static double ulp_of(double y);
template <> double ulp_of<__half>(double y)
{
    int e;
    frexp(fabs(y), &e);
    return ldexp(1.0, (e - 11 < -24 ? -24 : e - 11));
}
template <> double ulp_of<__nv_bfloat16>(double y)
{
    int e;
    frexp(fabs(y), &e);
    return ldexp(1.0, (e - 8 < -133 ? -133 : e - 8));
}
template <> double ulp_of<float>(double y)
{
    int e;
    frexp(fabs(y), &e);
    return ldexp(1.0, (e - 24 < -149 ? -149 : e - 24));
}

static uint16_t bits_of(__half h) { return __half_as_ushort(h); }
static uint16_t bits_of(__nv_bfloat16 h) { return __bfloat16_as_ushort(h); }
template <typename T> static T of_bits(uint16_t b);
template <> __half of_bits<__half>(uint16_t b) { return __ushort_as_half(b); }
template <> __nv_bfloat16 of_bits<__nv_bfloat16>(uint16_t b) { return __ushort_as_bfloat16(b); }

/* How results compare with the exact value rounded once to the dtype (from float64 through
 * float32: a double rounding, which can differ from one rounding only where the float32 value
 * falls on a midpoint of two dtype values): the share that equal it, and the largest error in
 * ulps where |x| <= 4 (beyond, the tails' error is bounded by 1e-6 |x| rather than by ulps of
 * a value near 0). */
struct stats {
    int64_t checked = 0, rounded = 0;
    double worst_ulps = 0.0;
};

/* Runs the pass over x laid out [rows, cols] with row stride ld (ld > cols: the gap poisoned
 * with `poison`), in place; returns the result rows, checks the gap. */
template <typename T>
static std::vector<T> run_pass(const std::vector<T> &x, int64_t rows, int32_t cols, int64_t ld, int act, T poison)
{
    std::vector<T> host((size_t)(rows * ld), poison);
    for (int64_t r = 0; r < rows; r++)
        for (int32_t c = 0; c < cols; c++) host[(size_t)(r * ld + c)] = x[(size_t)(r * cols + c)];
    T *d = nullptr;
    CK(cudaMalloc(&d, host.size() * sizeof(T)));
    CK(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    assert_int_equal(fl_cuda_activation<T>(d, rows, cols, ld, act, nullptr), FLAME_OK);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(host.data(), d, host.size() * sizeof(T), cudaMemcpyDeviceToHost));
    CK(cudaFree(d));
    std::vector<T> out((size_t)(rows * cols));
    for (int64_t r = 0; r < rows; r++) {
        for (int32_t c = 0; c < cols; c++) out[(size_t)(r * cols + c)] = host[(size_t)(r * ld + c)];
        for (int64_t c = cols; c < ld; c++)
            if (memcmp(&host[(size_t)(r * ld + c)], &poison, sizeof(T)))
                fail_msg("row %lld column %lld past the %d columns was written", (long long)r, (long long)c, cols);
    }
    return out;
}

/* One result against its reference: NaN exactly where the reference is NaN, infinities equal,
 * else within one ulp of the dtype plus the formula's 1e-6 |x|. */
template <typename T> static void check_one(double x, double ref, double got, stats &s, const char *what)
{
    if (isnan(ref) || isnan(got)) {
        if (!(isnan(ref) && isnan(got))) fail_msg("%s(%.9g) = %.9g, expected %.9g", what, x, got, ref);
        return;
    }
    if (isinf(ref) || isinf(got)) {
        if (got != ref) fail_msg("%s(%.9g) = %.9g, expected %.9g", what, x, got, ref);
        return;
    }
    const double err = fabs(got - ref), ulp = ulp_of<T>(ref);
    if (!(err <= ulp + 1e-6 * fabs(x)))
        fail_msg("%s(%.9g) = %.9g, expected %.9g (error %.3g, %.2f ulps)", what, x, got, ref, err, err / ulp);
    s.checked++;
    if ((double)from_t(to_t<T>((float)ref)) == got) s.rounded++;
    if (fabs(x) <= 4.0 && err / ulp > s.worst_ulps) s.worst_ulps = err / ulp;
}

/* erf-GELU on all 65,536 patterns of a 16-bit dtype: contiguous rows, strided rows of whole
 * vectors, one element at a time; then the patterns repeated over 70,000 rows (more than the
 * 65,535 blocks a launch has along y, so threads take several rows) */
template <typename T> static void every_pattern(const char *name)
{
    std::vector<T> x(65536);
    std::vector<double> ref(65536);
    for (uint32_t b = 0; b < 65536; b++) {
        x[b] = of_bits<T>((uint16_t)b);
        ref[b] = gelu_ref(from_t(x[b]));
    }
    const T poison = of_bits<T>(0x7bcd);
    struct { int64_t rows; int32_t cols; int64_t ld; } shapes[] = {{64, 1024, 1024}, {256, 256, 264}, {512, 128, 131}};
    std::vector<T> first; /* the contiguous run's results, each checked against the reference */
    for (const auto &sh : shapes) {
        stats s;
        const std::vector<T> y = run_pass<T>(x, sh.rows, sh.cols, sh.ld, 1, poison);
        if (first.empty()) first = y;
        for (uint32_t b = 0; b < 65536; b++) check_one<T>(from_t(x[b]), ref[b], from_t(y[b]), s, name);
        /* signed zeros keep their sign: x/2 (1 + erf(x / sqrt 2)) at -0 is -0 */
        if (bits_of(y[0x8000]) != 0x8000 || bits_of(y[0]) != 0)
            fail_msg("%s: GELU(+-0) gave 0x%04x, 0x%04x", name, bits_of(y[0]), bits_of(y[0x8000]));
        fprintf(stderr, "# %s erf-GELU, %d columns (ld %lld): %lld finite results, %.2f%% the exact value rounded, "
                "worst %.2f ulps for |x| <= 4\n",
                name, sh.cols, (long long)sh.ld, (long long)s.checked, 100.0 * (double)s.rounded / (double)s.checked,
                s.worst_ulps);
    }
    const int64_t rows = 70000, cols = 128;
    std::vector<T> big((size_t)(rows * cols));
    for (size_t i = 0; i < big.size(); i++) big[i] = x[(i * 7919) & 0xffff];
    const std::vector<T> y = run_pass<T>(big, rows, cols, cols, 1, poison);
    for (size_t i = 0; i < big.size(); i++) /* the same value, the same bits */
        if (memcmp(&y[i], &first[(i * 7919) & 0xffff], sizeof(T)))
            fail_msg("%s: element %zu of %lld x %lld differs from the same input's result in the small run", name, i,
                     (long long)rows, (long long)cols);
}

static void test_gelu_every_fp16(void **state)
{
    (void)state;
    TU_NEED_GPU();
    every_pattern<__half>("fp16");
}

static void test_gelu_every_bf16(void **state)
{
    (void)state;
    TU_NEED_GPU();
    every_pattern<__nv_bfloat16>("bf16");
}

/* float32: random values over [-12, 12] and log-uniform magnitudes up to 1e30, and the
 * special values; contiguous and strided rows of whole vectors, and one element at a time */
static void test_gelu_fp32(void **state)
{
    (void)state;
    TU_NEED_GPU();
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f, 5.65f, -5.65f, 5.66f, -5.66f, 40.0f, -40.0f};
    const int32_t widths[][2] = {{1024, 1024}, {1024, 1028}, {1023, 1027}}; /* cols, ld */
    for (const auto &w : widths) {
        const int32_t cols = w[0];
        const int64_t rows = 64;
        std::vector<float> x((size_t)(rows * cols));
        for (size_t i = 0; i < x.size(); i++) {
            if (i < sizeof specials / sizeof *specials) x[i] = specials[i];
            else if (i % 2) x[i] = (tu_uniform() * 2.0f - 1.0f) * 12.0f;
            else x[i] = (i % 4 ? 1.0f : -1.0f) * powf(10.0f, tu_uniform() * 60.0f - 30.0f);
        }
        stats s;
        const std::vector<float> y = run_pass<float>(x, rows, cols, w[1], 1, 123.0f);
        for (size_t i = 0; i < x.size(); i++) check_one<float>(x[i], gelu_ref(x[i]), y[i], s, "fp32");
        fprintf(stderr, "# fp32 erf-GELU, %d columns (ld %d): %.2f%% the exact value rounded, worst %.2f ulps for |x| <= 4\n",
                cols, w[1], 100.0 * (double)s.rounded / (double)s.checked, s.worst_ulps);
    }
}

/* tanh-GELU and ReLU, each dtype, both paths: tanh-GELU within 2 ulps of the dtype plus 1e-6
 * (tanhf), ReLU exact */
template <typename T> static void other_acts(const char *name)
{
    const int32_t widths[][2] = {{64, 64}, {64, 72}, {63, 71}}; /* cols, ld */
    for (const auto &w : widths) {
        const int32_t cols = w[0];
        const int64_t rows = 40;
        std::vector<T> x((size_t)(rows * cols));
        for (T &v : x) v = to_t<T>((tu_uniform() * 2.0f - 1.0f) * 8.0f);
        const T poison = to_t<T>(-77.0f);
        const std::vector<T> t = run_pass<T>(x, rows, cols, w[1], 2, poison);
        const std::vector<T> r = run_pass<T>(x, rows, cols, w[1], 3, poison);
        for (size_t i = 0; i < x.size(); i++) {
            const double xv = from_t(x[i]), ref = gelu_tanh_ref(xv);
            if (!(fabs(from_t(t[i]) - ref) <= 2.0 * ulp_of<T>(ref) + 1e-6))
                fail_msg("%s tanh-GELU(%.9g) = %.9g, expected %.9g", name, xv, (double)from_t(t[i]), ref);
            const double relu = xv > 0 ? xv : 0.0;
            if (from_t(r[i]) != relu) fail_msg("%s ReLU(%.9g) = %.9g", name, xv, (double)from_t(r[i]));
        }
    }
}

static void test_tanh_gelu_relu(void **state)
{
    (void)state;
    TU_NEED_GPU();
    other_acts<__half>("fp16");
    other_acts<__nv_bfloat16>("bf16");
    other_acts<float>("fp32");
}

/* nothing to do launches nothing and succeeds */
static void test_empty(void **state)
{
    (void)state;
    TU_NEED_GPU();
    assert_int_equal(fl_cuda_activation<__half>(nullptr, 0, 64, 64, 1, nullptr), FLAME_OK);
    assert_int_equal(fl_cuda_activation<__half>(nullptr, 5, 0, 64, 1, nullptr), FLAME_OK);
    assert_int_equal(fl_cuda_activation<__half>(nullptr, 5, 64, 64, 0, nullptr), FLAME_OK);
    CK(cudaDeviceSynchronize());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gelu_every_fp16), cmocka_unit_test(test_gelu_every_bf16),
        cmocka_unit_test(test_gelu_fp32),       cmocka_unit_test(test_tanh_gelu_relu),
        cmocka_unit_test(test_empty),
    };
    return cmocka_run_group_tests(tests, tu_gpu_setup, NULL);
}
