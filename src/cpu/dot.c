/* Dot-product scoring of table rows (the dot head): out[c * stride] = <h, table[row(c)]>.
 * Compiled for AVX-512, AVX2+FMA and baseline x86-64, picked at load time (target_clones), so
 * scoring never depends on how the BLAS library recognised the CPU. Four rows share each
 * load of h; sixteen partial sums per row in a fixed order, so every clone gives the same
 * bits and results never depend on the thread or the batch. */
#include "cpu/kernels.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) &&        \
    !defined(__SANITIZE_THREAD__)
#define FL_CLONES __attribute__((target_clones("arch=skylake-avx512", "arch=haswell", "default")))
#else
#define FL_CLONES
#endif

/* Pairwise sum of 16 partial sums: a fixed tree. */
static inline float sum16(const float *a)
{
    float b[8];
    for (int i = 0; i < 8; i++) b[i] = a[i] + a[i + 8];
    return ((b[0] + b[4]) + (b[2] + b[6])) + ((b[1] + b[5]) + (b[3] + b[7]));
}

static inline const float *row_of(const float *table, int32_t d, const int64_t *ids, int64_t first, int64_t c)
{
    return table + (ids ? ids[c] : first + c) * (int64_t)d;
}

FL_CLONES void fl_cpu_dot_rows(const float *h, int32_t d, const float *table, const int64_t *ids, int64_t first,
                               int64_t n, float *out, int64_t stride)
{
    const int32_t dv = d & ~15; /* the 16-wide part; the tail is summed last */
    int64_t c = 0;
    for (; c + 4 <= n; c += 4) {
        const float *r0 = row_of(table, d, ids, first, c), *r1 = row_of(table, d, ids, first, c + 1),
                    *r2 = row_of(table, d, ids, first, c + 2), *r3 = row_of(table, d, ids, first, c + 3);
        float a0[16] = {0}, a1[16] = {0}, a2[16] = {0}, a3[16] = {0};
        for (int32_t j = 0; j < dv; j += 16)
            for (int u = 0; u < 16; u++) {
                const float x = h[j + u];
                a0[u] += x * r0[j + u];
                a1[u] += x * r1[j + u];
                a2[u] += x * r2[j + u];
                a3[u] += x * r3[j + u];
            }
        float s0 = sum16(a0), s1 = sum16(a1), s2 = sum16(a2), s3 = sum16(a3);
        for (int32_t j = dv; j < d; j++) {
            s0 += h[j] * r0[j];
            s1 += h[j] * r1[j];
            s2 += h[j] * r2[j];
            s3 += h[j] * r3[j];
        }
        out[c * stride] = s0;
        out[(c + 1) * stride] = s1;
        out[(c + 2) * stride] = s2;
        out[(c + 3) * stride] = s3;
    }
    for (; c < n; c++) {
        const float *r = row_of(table, d, ids, first, c);
        float a[16] = {0};
        for (int32_t j = 0; j < dv; j += 16)
            for (int u = 0; u < 16; u++) a[u] += h[j + u] * r[j + u];
        float s = sum16(a);
        for (int32_t j = dv; j < d; j++) s += h[j] * r[j];
        out[c * stride] = s;
    }
}

/* Rows per thread below which splitting costs more than it saves. */
#define MIN_ROWS_PER_THREAD 1024

void fl_cpu_dot_rows_mt(const float *h, int32_t d, const float *table, const int64_t *ids, int64_t first, int64_t n,
                        float *out, int64_t stride, int threads)
{
    int64_t parts = n / MIN_ROWS_PER_THREAD;
    if (parts > threads) parts = threads;
    if (parts <= 1) {
        fl_cpu_dot_rows(h, d, table, ids, first, n, out, stride);
        return;
    }
    /* Each thread scores a contiguous quarter (say) of the rows: with two cores the halves of a
     * 3 MB table stay in the two L2 caches from call to call. Every score is computed by the
     * same code whatever the split, so results do not depend on the thread count. */
#ifdef _OPENMP
#pragma omp parallel for num_threads(parts) schedule(static)
#endif
    for (int64_t p = 0; p < parts; p++) {
        const int64_t lo = n * p / parts, hi = n * (p + 1) / parts;
        fl_cpu_dot_rows(h, d, table, ids ? ids + lo : NULL, first + lo, hi - lo, out + lo * stride, stride);
    }
}

/* ---- int8 tables: score = scale * <h, q> + bias * sum(h), straight from the int8 rows */

#define MIN_Q8_BYTES_PER_THREAD ((uint64_t)1 << 18)

static inline const int8_t *row_q8(const int8_t *table, int32_t d, const int64_t *ids, int64_t first, int64_t c,
                                   int64_t *r)
{
    *r = ids ? ids[c] : first + c;
    return table + *r * (int64_t)d;
}

FL_CLONES static void dot_rows_q8(const float *h, int32_t d, float hsum, const int8_t *table, const float *qparams,
                                  const int64_t *ids, int64_t first, int64_t n, float *out, int64_t stride)
{
    const int32_t dv = d & ~15;
    int64_t c = 0;
    for (; c + 4 <= n; c += 4) {
        int64_t k0, k1, k2, k3;
        const int8_t *r0 = row_q8(table, d, ids, first, c, &k0), *r1 = row_q8(table, d, ids, first, c + 1, &k1),
                     *r2 = row_q8(table, d, ids, first, c + 2, &k2), *r3 = row_q8(table, d, ids, first, c + 3, &k3);
        float a0[16] = {0}, a1[16] = {0}, a2[16] = {0}, a3[16] = {0};
        for (int32_t j = 0; j < dv; j += 16)
            for (int u = 0; u < 16; u++) {
                const float x = h[j + u];
                a0[u] += x * (float)r0[j + u];
                a1[u] += x * (float)r1[j + u];
                a2[u] += x * (float)r2[j + u];
                a3[u] += x * (float)r3[j + u];
            }
        float s0 = sum16(a0), s1 = sum16(a1), s2 = sum16(a2), s3 = sum16(a3);
        for (int32_t j = dv; j < d; j++) {
            s0 += h[j] * (float)r0[j];
            s1 += h[j] * (float)r1[j];
            s2 += h[j] * (float)r2[j];
            s3 += h[j] * (float)r3[j];
        }
        out[c * stride] = qparams[2 * k0] * s0 + qparams[2 * k0 + 1] * hsum;
        out[(c + 1) * stride] = qparams[2 * k1] * s1 + qparams[2 * k1 + 1] * hsum;
        out[(c + 2) * stride] = qparams[2 * k2] * s2 + qparams[2 * k2 + 1] * hsum;
        out[(c + 3) * stride] = qparams[2 * k3] * s3 + qparams[2 * k3 + 1] * hsum;
    }
    for (; c < n; c++) {
        int64_t k;
        const int8_t *r = row_q8(table, d, ids, first, c, &k);
        float a[16] = {0};
        for (int32_t j = 0; j < dv; j += 16)
            for (int u = 0; u < 16; u++) a[u] += h[j + u] * (float)r[j + u];
        float s = sum16(a);
        for (int32_t j = dv; j < d; j++) s += h[j] * (float)r[j];
        out[c * stride] = qparams[2 * k] * s + qparams[2 * k + 1] * hsum;
    }
}

void fl_cpu_dot_rows_q8_mt(const float *h, int32_t d, const int8_t *table, const float *qparams, const int64_t *ids,
                           int64_t first, int64_t n, float *out, int64_t stride, int threads)
{
    float a[16] = {0}; /* sum(h) in the same fixed order as the dot products */
    const int32_t dv = d & ~15;
    for (int32_t j = 0; j < dv; j += 16)
        for (int u = 0; u < 16; u++) a[u] += h[j + u];
    float hsum = sum16(a);
    for (int32_t j = dv; j < d; j++) hsum += h[j];
    /* Split only past 256 KiB of int8 rows a thread (the float kernel's 1024 rows of 64
     * floats): smaller parts cost more to hand out than they save. */
    int64_t parts = (int64_t)((uint64_t)n * (uint64_t)d / MIN_Q8_BYTES_PER_THREAD);
    if (parts > threads) parts = threads;
    if (parts <= 1) {
        dot_rows_q8(h, d, hsum, table, qparams, ids, first, n, out, stride);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel for num_threads(parts) schedule(static)
#endif
    for (int64_t p = 0; p < parts; p++) {
        const int64_t lo = n * p / parts, hi = n * (p + 1) / parts;
        dot_rows_q8(h, d, hsum, table, qparams, ids ? ids + lo : NULL, first + lo, hi - lo, out + lo * stride, stride);
    }
}
