/* libflame's own GEMM for the encoder's layers and the dot head (contract in kernels.h).
 *
 * The right-hand matrix (a layer's fixed weights, or a slice of the item table) is packed in
 * panels of 16 output columns, k-major: panel[kk][u] = W[j0 + u][kk]. The micro-kernels keep a
 * tile of 6 rows x 32 columns (AVX-512: 12 zmm accumulators) or 6 x 16 (AVX2: 12 ymm) in
 * registers and stream the panel once per 6 rows. Every output is one fused multiply-add
 * chain over k in order, from 0, then + bias, then + the old value: the same bits whatever
 * the instruction set (the scalar version uses fmaf), the tile, the thread split or the
 * batch around it. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "core/pool.h"
#include "cpu/kernels.h"

#define NR 16 /* columns of a panel */
#define MR 6  /* rows of a tile */
#define RB 48 /* rows whose A block stays in L1 while the panels of a column pair pass */

size_t fl_cpu_pack_floats(int32_t k, int64_t n)
{
    return (size_t)((n + NR - 1) / NR) * NR * (size_t)k;
}

void fl_cpu_pack(const float *w, int64_t ldw, int32_t k, int64_t n, float *dst)
{
    for (int64_t j0 = 0; j0 < n; j0 += NR) {
        float *p = dst + (size_t)(j0 / NR) * NR * (size_t)k;
        const int64_t nc = n - j0 < NR ? n - j0 : NR;
        for (int64_t u = 0; u < nc; u++) {
            const float *src = w + (j0 + u) * ldw;
            for (int32_t kk = 0; kk < k; kk++) p[(size_t)kk * NR + u] = src[kk];
        }
        for (int64_t u = nc; u < NR; u++)
            for (int32_t kk = 0; kk < k; kk++) p[(size_t)kk * NR + u] = 0.0f;
    }
}

/* erf(x) as x P(x^2) / Q(x^2) on x clamped to [-4, 4] (beyond, erf is +-1 in float32): the
 * rational approximation of Eigen and XLA's float erf, absolute error 3.7e-7 evaluated in
 * float32 (GELU error < 1e-6), one fused multiply-add per term so the vector versions give
 * the same bits. A NaN stays NaN (the clamp's comparisons are false for it). */
static const float ERF_A[7] = {-2.72614225801306e-10f, 2.77068142495902e-08f, -2.10102402082508e-06f,
                               -5.69250639462346e-05f, -7.34990630326855e-04f, -2.95459980854025e-03f,
                               -1.60960333262415e-02f};
static const float ERF_B[5] = {-1.45660718464996e-05f, -2.13374055278905e-04f, -1.68282697438203e-03f,
                               -7.37332916720468e-03f, -1.42647390514189e-02f};
#define SQRT1_2 0.70710678118654752f

static inline float gelu_erf1(float v)
{
    float x = v * SQRT1_2;
    x = x < -4.0f ? -4.0f : x;
    x = x > 4.0f ? 4.0f : x;
    const float x2 = x * x;
    float p = ERF_A[0], q = ERF_B[0];
    for (int i = 1; i < 7; i++) p = fmaf(p, x2, ERF_A[i]);
    for (int i = 1; i < 5; i++) q = fmaf(q, x2, ERF_B[i]);
    return (0.5f * v) * (1.0f + (p * x) / q);
}

static inline float act1(float v, fl_act_kind act)
{
    switch (act) {
    case FL_KACT_RELU: return v > 0.0f ? v : 0.0f;
    case FL_KACT_GELU_ERF: return gelu_erf1(v);
    case FL_KACT_GELU_TANH: return 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    default: return v;
    }
}

/* The activation without a vector form here, over a stored tile. */
static inline void act_tile(int mr, int64_t nc, float *c, int64_t ldc, fl_act_kind act)
{
    if (act != FL_KACT_GELU_TANH) return;
    for (int r = 0; r < mr; r++)
        for (int64_t j = 0; j < nc; j++) c[r * ldc + j] = act1(c[r * ldc + j], act);
}

/* ---- scalar: the reference order, for CPUs without AVX2 (and to test the others against) */

static void gemm_base(int64_t rows, int64_t n, int32_t k, const float *a, int64_t lda, const float *bp,
                      const float *bias, bool accumulate, fl_act_kind act, float *c, int64_t ldc)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) {
            const float *p = bp + (size_t)(j / NR) * NR * (size_t)k + j % NR;
            float s = 0.0f;
            for (int32_t kk = 0; kk < k; kk++) s = fmaf(a[r * lda + kk], p[(size_t)kk * NR], s);
            if (bias) s += bias[j];
            if (accumulate) s += c[r * ldc + j];
            c[r * ldc + j] = act1(s, act);
        }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_X86_KERNELS 1

/* ---- AVX-512: tiles of mr x (16 * np) */

#define T512 __attribute__((target("avx512f"), always_inline)) inline
#define T512_OUTER __attribute__((target("avx512f")))

static T512 __m512 gelu512(__m512 v)
{
    __m512 x = _mm512_mul_ps(v, _mm512_set1_ps(SQRT1_2));
    x = _mm512_max_ps(_mm512_set1_ps(-4.0f), x); /* max/min return the second operand for a NaN */
    x = _mm512_min_ps(_mm512_set1_ps(4.0f), x);
    const __m512 x2 = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(ERF_A[0]), q = _mm512_set1_ps(ERF_B[0]);
    for (int i = 1; i < 7; i++) p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(ERF_A[i]));
    for (int i = 1; i < 5; i++) q = _mm512_fmadd_ps(q, x2, _mm512_set1_ps(ERF_B[i]));
    const __m512 e = _mm512_div_ps(_mm512_mul_ps(p, x), q);
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), v), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

static T512 void tile512(const int mr, const int np, int32_t k, const float *a, int64_t lda, const float *p,
                         size_t ps, int64_t nc, const float *bias, bool accumulate, fl_act_kind act, float *c,
                         int64_t ldc)
{
    __m512 acc[MR][2];
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const float *p1 = p + ps;
    for (int32_t kk = 0; kk < k; kk++) {
        const __m512 b0 = _mm512_loadu_ps(p + (size_t)kk * NR);
        const __m512 b1 = np > 1 ? _mm512_loadu_ps(p1 + (size_t)kk * NR) : b0;
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            const __m512 x = _mm512_set1_ps(a[r * lda + kk]);
            acc[r][0] = _mm512_fmadd_ps(x, b0, acc[r][0]);
            if (np > 1) acc[r][1] = _mm512_fmadd_ps(x, b1, acc[r][1]);
        }
    }
    for (int h = 0; h < np; h++) {
        const int64_t left = nc - 16 * h;
        const __mmask16 m = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        const __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias + 16 * h) : _mm512_setzero_ps();
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            float *dst = c + r * ldc + 16 * h;
            __m512 v = acc[r][h];
            if (bias) v = _mm512_add_ps(v, bv);
            if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, dst));
            if (act == FL_KACT_RELU) v = _mm512_max_ps(v, _mm512_setzero_ps());
            if (act == FL_KACT_GELU_ERF) v = gelu512(v);
            _mm512_mask_storeu_ps(dst, m, v);
        }
    }
    act_tile(mr, nc, c, ldc, act);
}

T512_OUTER static void gemm512(int64_t rows, int64_t n, int32_t k, const float *a, int64_t lda, const float *bp,
                               const float *bias, bool accumulate, fl_act_kind act, float *c, int64_t ldc)
{
    const size_t ps = (size_t)NR * (size_t)k;
    for (int64_t r0 = 0; r0 < rows; r0 += RB) {
        const int64_t r1 = rows - r0 < RB ? rows : r0 + RB;
        for (int64_t j0 = 0; j0 < n; j0 += 2 * NR) {
            const int64_t nc = n - j0 < 2 * NR ? n - j0 : 2 * NR;
            const float *p = bp + (size_t)(j0 / NR) * ps;
            const float *bj = bias ? bias + j0 : NULL;
            for (int64_t r = r0; r < r1; r += MR) {
                const int mr = r1 - r < MR ? (int)(r1 - r) : MR;
                const float *ar = a + r * lda;
                float *cr = c + r * ldc + j0;
#define T(MRC, NPC) tile512(MRC, NPC, k, ar, lda, p, ps, nc, bj, accumulate, act, cr, ldc)
                if (nc > NR) {
                    switch (mr) {
                    case 6: T(6, 2); break;
                    case 5: T(5, 2); break;
                    case 4: T(4, 2); break;
                    case 3: T(3, 2); break;
                    case 2: T(2, 2); break;
                    default: T(1, 2); break;
                    }
                } else {
                    switch (mr) {
                    case 6: T(6, 1); break;
                    case 5: T(5, 1); break;
                    case 4: T(4, 1); break;
                    case 3: T(3, 1); break;
                    case 2: T(2, 1); break;
                    default: T(1, 1); break;
                    }
                }
#undef T
            }
        }
    }
}

/* ---- AVX2 + FMA: tiles of mr x 16 (two ymm per row) */

#define T256 __attribute__((target("avx2,fma"), always_inline)) inline
#define T256_OUTER __attribute__((target("avx2,fma")))

static T256 __m256i lanes_below(int64_t left)
{
    const int32_t l = left < 0 ? 0 : left > 8 ? 8 : (int32_t)left;
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(l), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static T256 __m256 gelu256(__m256 v)
{
    __m256 x = _mm256_mul_ps(v, _mm256_set1_ps(SQRT1_2));
    x = _mm256_max_ps(_mm256_set1_ps(-4.0f), x);
    x = _mm256_min_ps(_mm256_set1_ps(4.0f), x);
    const __m256 x2 = _mm256_mul_ps(x, x);
    __m256 p = _mm256_set1_ps(ERF_A[0]), q = _mm256_set1_ps(ERF_B[0]);
    for (int i = 1; i < 7; i++) p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(ERF_A[i]));
    for (int i = 1; i < 5; i++) q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(ERF_B[i]));
    const __m256 e = _mm256_div_ps(_mm256_mul_ps(p, x), q);
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), v), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

static T256 void tile256(const int mr, int32_t k, const float *a, int64_t lda, const float *p, int64_t nc,
                         const float *bias, bool accumulate, fl_act_kind act, float *c, int64_t ldc)
{
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int32_t kk = 0; kk < k; kk++) {
        const __m256 b0 = _mm256_loadu_ps(p + (size_t)kk * NR), b1 = _mm256_loadu_ps(p + (size_t)kk * NR + 8);
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            const __m256 x = _mm256_broadcast_ss(a + r * lda + kk);
            acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
        }
    }
    for (int h = 0; h < 2; h++) {
        const int64_t left = nc - 8 * h;
        if (left <= 0) break;
        const __m256i m = lanes_below(left);
        const __m256 bv = bias ? _mm256_maskload_ps(bias + 8 * h, m) : _mm256_setzero_ps();
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            float *dst = c + r * ldc + 8 * h;
            __m256 v = acc[r][h];
            if (bias) v = _mm256_add_ps(v, bv);
            if (accumulate) v = _mm256_add_ps(v, _mm256_maskload_ps(dst, m));
            if (act == FL_KACT_RELU) v = _mm256_max_ps(v, _mm256_setzero_ps());
            if (act == FL_KACT_GELU_ERF) v = gelu256(v);
            _mm256_maskstore_ps(dst, m, v);
        }
    }
    act_tile(mr, nc, c, ldc, act);
}

T256_OUTER static void gemm256(int64_t rows, int64_t n, int32_t k, const float *a, int64_t lda, const float *bp,
                               const float *bias, bool accumulate, fl_act_kind act, float *c, int64_t ldc)
{
    const size_t ps = (size_t)NR * (size_t)k;
    for (int64_t r0 = 0; r0 < rows; r0 += RB) {
        const int64_t r1 = rows - r0 < RB ? rows : r0 + RB;
        for (int64_t j0 = 0; j0 < n; j0 += NR) {
            const int64_t nc = n - j0 < NR ? n - j0 : NR;
            const float *p = bp + (size_t)(j0 / NR) * ps;
            const float *bj = bias ? bias + j0 : NULL;
            for (int64_t r = r0; r < r1; r += MR) {
                const int mr = r1 - r < MR ? (int)(r1 - r) : MR;
                const float *ar = a + r * lda;
                float *cr = c + r * ldc + j0;
#define T(MRC) tile256(MRC, k, ar, lda, p, nc, bj, accumulate, act, cr, ldc)
                switch (mr) {
                case 6: T(6); break;
                case 5: T(5); break;
                case 4: T(4); break;
                case 3: T(3); break;
                case 2: T(2); break;
                default: T(1); break;
                }
#undef T
            }
        }
    }
}
#endif

void fl_cpu_gemm_packed(fl_cpu_isa isa, int64_t rows, int64_t n, int32_t k, const float *a, int64_t lda,
                        const float *bp, const float *bias, bool accumulate, fl_act_kind act, float *c, int64_t ldc)
{
    if (rows <= 0 || n <= 0) return;
#ifdef HAVE_X86_KERNELS
    if (isa == FL_ISA_AVX512) {
        gemm512(rows, n, k, a, lda, bp, bias, accumulate, act, c, ldc);
        return;
    }
    if (isa == FL_ISA_AVX2) {
        gemm256(rows, n, k, a, lda, bp, bias, accumulate, act, c, ldc);
        return;
    }
#endif
    gemm_base(rows, n, k, a, lda, bp, bias, accumulate, act, c, ldc);
}

/* Multiply-adds a thread takes at least: below it the hand-out costs more than it saves. */
#define MIN_MACS_PER_PART ((int64_t)1 << 17)

static int parts_of(int64_t macs, int threads)
{
    int64_t p = macs / MIN_MACS_PER_PART;
    return p < 1 ? 1 : p > threads ? threads : (int)p;
}

typedef struct packed_job {
    fl_cpu_isa isa;
    int64_t rows, n, tiles, pairs;
    int32_t k;
    const float *a, *bp, *bias;
    int64_t lda, ldc;
    bool accumulate, by_rows;
    fl_act_kind act;
    float *c;
    int parts;
} packed_job;

static void packed_part(void *ctx, int64_t p, int worker)
{
    const packed_job *j = ctx;
    (void)worker;
    if (j->by_rows) {
        const int64_t lo = fl_part_lo(j->tiles, j->parts, p) * MR, hi = fl_part_lo(j->tiles, j->parts, p + 1) * MR;
        const int64_t end = hi < j->rows ? hi : j->rows;
        fl_cpu_gemm_packed(j->isa, end - lo, j->n, j->k, j->a + lo * j->lda, j->lda, j->bp, j->bias, j->accumulate,
                           j->act, j->c + lo * j->ldc, j->ldc);
    } else {
        const int64_t lo = fl_part_lo(j->pairs, j->parts, p) * 2 * NR, hi = fl_part_lo(j->pairs, j->parts, p + 1) * 2 * NR;
        const int64_t end = hi < j->n ? hi : j->n;
        if (end > lo)
            fl_cpu_gemm_packed(j->isa, j->rows, end - lo, j->k, j->a, j->lda, j->bp + (size_t)(lo / NR) * NR * j->k,
                               j->bias ? j->bias + lo : NULL, j->accumulate, j->act, j->c + lo, j->ldc);
    }
}

void fl_cpu_gemm_packed_mt(fl_cpu_isa isa, int64_t rows, int64_t n, int32_t k, const float *a, int64_t lda,
                           const float *bp, const float *bias, bool accumulate, fl_act_kind act, float *c,
                           int64_t ldc, int threads)
{
    if (rows <= 0 || n <= 0) return;
    const int parts = parts_of(rows * n * (int64_t)k, threads);
    if (parts <= 1) {
        fl_cpu_gemm_packed(isa, rows, n, k, a, lda, bp, bias, accumulate, act, c, ldc);
        return;
    }
    /* Split the rows in whole tiles when there are enough of them, else the column pairs:
     * either way each output is computed by the same tile code, so the split never shows.
     * Twice as many parts as threads: a thread that starts late leaves less to the others. */
    const int64_t tiles = (rows + MR - 1) / MR, pairs = (n + 2 * NR - 1) / (2 * NR);
    packed_job j = {.isa = isa, .rows = rows, .n = n, .tiles = tiles, .pairs = pairs, .k = k, .a = a, .bp = bp,
                    .bias = bias, .lda = lda, .ldc = ldc, .accumulate = accumulate, .act = act, .c = c,
                    .by_rows = tiles >= 2 * parts || tiles >= pairs};
    const int64_t units = j.by_rows ? tiles : pairs;
    j.parts = (int)(2 * parts < units ? 2 * parts : units);
    fl_parallel(parts, j.parts, packed_part, &j);
}

/* Columns of B one thread packs and multiplies at a time: about 64 KiB of panels (L2). */
static int64_t nt_chunk(int32_t k)
{
    int64_t c = ((int64_t)16384 / (k > 0 ? k : 1)) & ~(int64_t)(2 * NR - 1);
    return c < 2 * NR ? 2 * NR : c > 512 ? 512 : c;
}

size_t fl_cpu_gemm_nt_scratch(int32_t k)
{
    return fl_cpu_pack_floats(k, nt_chunk(k));
}

typedef struct nt_job {
    fl_cpu_isa isa;
    int64_t rows, n, chunk;
    int32_t k;
    const float *a, *b;
    int64_t lda, ldb, ldc;
    float *c, *scratch;
    size_t per;
} nt_job;

/* One chunk of B's rows: packed into the running thread's scratch, then multiplied. */
static void nt_chunk_task(void *ctx, int64_t ch, int worker)
{
    const nt_job *j = ctx;
    float *pk = j->scratch + (size_t)worker * j->per;
    const int64_t j0 = ch * j->chunk, nc = j->n - j0 < j->chunk ? j->n - j0 : j->chunk;
    fl_cpu_pack(j->b + j0 * j->ldb, j->ldb, j->k, nc, pk);
    fl_cpu_gemm_packed(j->isa, j->rows, nc, j->k, j->a, j->lda, pk, NULL, false, FL_KACT_NONE, j->c + j0, j->ldc);
}

void fl_cpu_gemm_nt_mt(fl_cpu_isa isa, int64_t rows, int64_t n, int32_t k, const float *a, int64_t lda,
                       const float *b, int64_t ldb, float *c, int64_t ldc, float *scratch, int threads)
{
    if (rows <= 0 || n <= 0) return;
    const int64_t chunk = nt_chunk(k), chunks = (n + chunk - 1) / chunk;
    nt_job j = {.isa = isa, .rows = rows, .n = n, .chunk = chunk, .k = k, .a = a, .b = b, .lda = lda, .ldb = ldb,
                .ldc = ldc, .c = c, .scratch = scratch, .per = fl_cpu_gemm_nt_scratch(k)};
    fl_parallel(parts_of(rows * n * (int64_t)k, threads), chunks, nt_chunk_task, &j);
}
