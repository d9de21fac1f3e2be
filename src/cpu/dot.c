/* Dot-product scoring of table rows (the dot head): out[c * stride] = <h, table[row(c)]>.
 * The float kernel is written for AVX-512 and AVX2+FMA (and plain C), picked from the CPU's
 * feature bits, so scoring never depends on how the BLAS library recognised the CPU; every
 * version gives the same bits, and results never depend on the thread or the batch. The
 * int8 kernel is compiled for the same sets by the compiler (target_clones). */
#include <math.h>

#include "core/pool.h"
#include "cpu/clones.h"
#include "cpu/kernels.h"


/* Pairwise sum of 16 partial sums: a fixed tree (the int8 kernel's). */
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

/* The float kernel: each row's 16 lane sums s[l] = fma chain over its 16-wide chunks (the
 * last one zero-padded), then the tree of the vector transpose below:
 *   G_g = (s[4g] + s[4g+2]) + (s[4g+1] + s[4g+3]),  score = (G_0 + G_1) + (G_2 + G_3).
 * The scalar version spells that order out; the AVX-512 one reduces 16 rows at once with
 * shuffles in the same order, the AVX2 one holds the 16 lanes in two registers: same bits. */
static inline float tree16(const float *s)
{
    float g[4];
    for (int i = 0; i < 4; i++) g[i] = (s[4 * i] + s[4 * i + 2]) + (s[4 * i + 1] + s[4 * i + 3]);
    return (g[0] + g[1]) + (g[2] + g[3]);
}

static void dot_rows_base(const float *h, int32_t d, const float *table, const int64_t *ids, int64_t first,
                          int64_t n, float *out, int64_t stride)
{
    for (int64_t c = 0; c < n; c++) {
        const float *r = row_of(table, d, ids, first, c);
        float s[16] = {0};
        for (int32_t j = 0; j < d; j += 16)
            for (int u = 0; u < 16 && j + u < d; u++) s[u] = fmaf(h[j + u], r[j + u], s[u]);
        out[c * stride] = tree16(s);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86_DOT 1

__attribute__((target("avx512f"))) static void dot_rows_512(const float *h, int32_t d, const float *table,
                                                             const int64_t *ids, int64_t first, int64_t n, float *out,
                                                             int64_t stride)
{
    const int32_t tail = d & 15;
    const __mmask16 tm = (__mmask16)((1u << tail) - 1u);
    for (int64_t c0 = 0; c0 < n; c0 += 16) {
        const int64_t nr = n - c0 < 16 ? n - c0 : 16;
        const float *r[16];
        for (int i = 0; i < 16; i++) /* rows past n repeat the last one; their lanes are not stored */
            r[i] = row_of(table, d, ids, first, c0 + (i < nr ? i : nr - 1));
        __m512 a[16];
        for (int i = 0; i < 16; i++) a[i] = _mm512_setzero_ps();
        int32_t j = 0;
        for (; j + 16 <= d; j += 16) {
            const __m512 x = _mm512_loadu_ps(h + j);
            for (int i = 0; i < 16; i++) a[i] = _mm512_fmadd_ps(x, _mm512_loadu_ps(r[i] + j), a[i]);
        }
        if (tail) {
            const __m512 x = _mm512_maskz_loadu_ps(tm, h + j);
            for (int i = 0; i < 16; i++) a[i] = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(tm, r[i] + j), a[i]);
        }
        __m512 x8[8], y4[4], z2[2];
        for (int i = 0; i < 8; i++)
            x8[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
        for (int i = 0; i < 4; i++)
            y4[i] = _mm512_add_ps(_mm512_shuffle_ps(x8[2 * i], x8[2 * i + 1], 0x44),
                                  _mm512_shuffle_ps(x8[2 * i], x8[2 * i + 1], 0xEE));
        for (int i = 0; i < 2; i++)
            z2[i] = _mm512_add_ps(_mm512_shuffle_f32x4(y4[2 * i], y4[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                                  _mm512_shuffle_f32x4(y4[2 * i], y4[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
        const __m512 w = _mm512_add_ps(_mm512_shuffle_f32x4(z2[0], z2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_f32x4(z2[0], z2[1], _MM_SHUFFLE(3, 1, 3, 1)));
        if (stride == 1) {
            _mm512_mask_storeu_ps(out + c0, (__mmask16)((1u << nr) - 1u), w);
        } else {
            float v[16];
            _mm512_storeu_ps(v, w);
            for (int64_t i = 0; i < nr; i++) out[(c0 + i) * stride] = v[i];
        }
    }
}

/* AVX2: a row's 16 lanes in two registers (lo: lanes 0-7 = groups 0, 1; hi: 8-15 = groups
 * 2, 3); 8 rows at a time, reduced with the AVX-512 kernel's pairings. */
__attribute__((target("avx2,fma"))) static void dot_rows_256(const float *h, int32_t d, const float *table,
                                                              const int64_t *ids, int64_t first, int64_t n,
                                                              float *out, int64_t stride)
{
    const int32_t tail = d & 15;
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(tail), idx);
    const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(tail - 8), idx);
    for (int64_t c0 = 0; c0 < n; c0 += 8) {
        const int64_t nr = n - c0 < 8 ? n - c0 : 8;
        const float *r[8];
        for (int i = 0; i < 8; i++) r[i] = row_of(table, d, ids, first, c0 + (i < nr ? i : nr - 1));
        __m256 lo[8], hi[8];
        for (int i = 0; i < 8; i++) lo[i] = hi[i] = _mm256_setzero_ps();
        int32_t j = 0;
        for (; j + 16 <= d; j += 16) {
            const __m256 x0 = _mm256_loadu_ps(h + j), x1 = _mm256_loadu_ps(h + j + 8);
            for (int i = 0; i < 8; i++) {
                lo[i] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(r[i] + j), lo[i]);
                hi[i] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(r[i] + j + 8), hi[i]);
            }
        }
        if (tail) {
            const __m256 x0 = _mm256_maskload_ps(h + j, m0), x1 = _mm256_maskload_ps(h + j + 8, m1);
            for (int i = 0; i < 8; i++) {
                lo[i] = _mm256_fmadd_ps(x0, _mm256_maskload_ps(r[i] + j, m0), lo[i]);
                hi[i] = _mm256_fmadd_ps(x1, _mm256_maskload_ps(r[i] + j + 8, m1), hi[i]);
            }
        }
        /* per 128-bit group, as the AVX-512 kernel: [r(4g)+r(4g+2), ., r(4g+1)+r(4g+3), .] then the pair sums */
        __m256 ylo[2], yhi[2];
        for (int q = 0; q < 2; q++) {
            __m256 xl[2], xh[2];
            for (int i = 0; i < 2; i++) {
                const int A = 4 * q + 2 * i, B = A + 1;
                xl[i] = _mm256_add_ps(_mm256_unpacklo_ps(lo[A], lo[B]), _mm256_unpackhi_ps(lo[A], lo[B]));
                xh[i] = _mm256_add_ps(_mm256_unpacklo_ps(hi[A], hi[B]), _mm256_unpackhi_ps(hi[A], hi[B]));
            }
            /* rows 4q..4q+3: [G0 | G1] in ylo, [G2 | G3] in yhi */
            ylo[q] = _mm256_add_ps(_mm256_shuffle_ps(xl[0], xl[1], 0x44), _mm256_shuffle_ps(xl[0], xl[1], 0xEE));
            yhi[q] = _mm256_add_ps(_mm256_shuffle_ps(xh[0], xh[1], 0x44), _mm256_shuffle_ps(xh[0], xh[1], 0xEE));
        }
        /* G0 + G1 and G2 + G3 (the 128-bit halves), then their sum: rows 0-3 | rows 4-7 */
        const __m256 g01 = _mm256_add_ps(_mm256_permute2f128_ps(ylo[0], ylo[1], 0x20),
                                         _mm256_permute2f128_ps(ylo[0], ylo[1], 0x31));
        const __m256 g23 = _mm256_add_ps(_mm256_permute2f128_ps(yhi[0], yhi[1], 0x20),
                                         _mm256_permute2f128_ps(yhi[0], yhi[1], 0x31));
        const __m256 w = _mm256_add_ps(g01, g23);
        float v[8];
        _mm256_storeu_ps(v, w);
        for (int64_t i = 0; i < nr; i++) out[(c0 + i) * stride] = v[i];
    }
}
#endif

void fl_cpu_dot_rows_isa(fl_cpu_isa isa, const float *h, int32_t d, const float *table, const int64_t *ids,
                         int64_t first, int64_t n, float *out, int64_t stride)
{
    if (n <= 0) return;
#ifdef HAVE_X86_DOT
    if (isa == FL_ISA_AVX512) {
        dot_rows_512(h, d, table, ids, first, n, out, stride);
        return;
    }
    if (isa == FL_ISA_AVX2) {
        dot_rows_256(h, d, table, ids, first, n, out, stride);
        return;
    }
#endif
    dot_rows_base(h, d, table, ids, first, n, out, stride);
}

void fl_cpu_dot_rows(const float *h, int32_t d, const float *table, const int64_t *ids, int64_t first, int64_t n,
                     float *out, int64_t stride)
{
    fl_cpu_dot_rows_isa(fl_cpu_isa_detect(), h, d, table, ids, first, n, out, stride);
}

/* Rows per thread below which splitting costs more than it saves. */
#define MIN_ROWS_PER_THREAD 1024

typedef struct dot_job {
    fl_cpu_isa isa;
    const float *h, *table;
    const int64_t *ids;
    int32_t d;
    int64_t first, n, stride, parts;
    float *out;
} dot_job;

static void dot_part(void *ctx, int64_t p, int worker)
{
    const dot_job *j = ctx;
    (void)worker;
    const int64_t lo = j->n * p / j->parts, hi = j->n * (p + 1) / j->parts;
    fl_cpu_dot_rows_isa(j->isa, j->h, j->d, j->table, j->ids ? j->ids + lo : NULL, j->first + lo, hi - lo,
                        j->out + lo * j->stride, j->stride);
}

void fl_cpu_dot_rows_mt(fl_cpu_isa isa, const float *h, int32_t d, const float *table, const int64_t *ids,
                        int64_t first, int64_t n, float *out, int64_t stride, int threads)
{
    int64_t parts = n / MIN_ROWS_PER_THREAD;
    if (parts > threads) parts = threads;
    if (parts <= 1) {
        fl_cpu_dot_rows_isa(isa, h, d, table, ids, first, n, out, stride);
        return;
    }
    /* Each part is a contiguous share of the rows: with two cores the halves of a 3 MB table
     * stay in the two L2 caches from call to call. Every score is computed by the same code
     * whatever the split, so results do not depend on the thread count. */
    dot_job j = {.isa = isa, .h = h, .table = table, .ids = ids, .d = d, .first = first, .n = n, .stride = stride, .parts = parts,
                 .out = out};
    fl_parallel((int)parts, parts, dot_part, &j);
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

typedef struct q8_job {
    const float *h;
    const int8_t *table;
    const float *qparams;
    const int64_t *ids;
    int32_t d;
    float hsum;
    int64_t first, n, stride, parts;
    float *out;
} q8_job;

static void q8_part(void *ctx, int64_t p, int worker)
{
    const q8_job *j = ctx;
    (void)worker;
    const int64_t lo = j->n * p / j->parts, hi = j->n * (p + 1) / j->parts;
    dot_rows_q8(j->h, j->d, j->hsum, j->table, j->qparams, j->ids ? j->ids + lo : NULL, j->first + lo, hi - lo,
                j->out + lo * j->stride, j->stride);
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
    q8_job j = {.h = h, .table = table, .qparams = qparams, .ids = ids, .d = d, .hsum = hsum, .first = first, .n = n,
                .stride = stride, .parts = parts, .out = out};
    fl_parallel((int)parts, parts, q8_part, &j);
}
