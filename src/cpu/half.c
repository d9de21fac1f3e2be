/* fp16 and bf16 on the CPU (contracts in kernels.h): table rows widened to float32 as they are
 * pooled, and float32 results rounded to fp16 or bf16 (to nearest, ties to even).
 *
 * Vector code for AVX-512F and AVX2 (+ F16C for fp16) with intrinsics, as src/cpu/dot.c does,
 * picked from the CPU's feature bits once; the base code is plain C that the compiler
 * vectorizes for baseline x86-64 where it can. Widening is exact (every fp16 and bf16 value is
 * a float32 value: F16C's vcvtph2ps, or a 16-bit shift for bf16) and the pooling step is the
 * float32 row's (one product, one sum, unfused), and the rounding is exact integer arithmetic
 * or vcvtps2ph with its rounding given in the instruction (the MXCSR's mode is not read): every
 * version gives the same bits. */
#include <string.h>

#include "cpu/kernels.h"

static inline float f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t bits_of_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. Branch-free selects, so the
 * loops over it vectorize; a subnormal's m * 2^-24 is a normal float32 (no dependence on the
 * MXCSR's denormals-are-zero). */
static inline float f16_value(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    const uint32_t normal = sign | ((e + 112u) << 23) | (m << 13);
    const uint32_t special = sign | 0x7f800000u | (m << 13); /* inf, NaN */
    const uint32_t sub = sign | bits_of_f32((float)m * 0x1p-24f);
    return f32_of_bits(e == 0 ? sub : e == 31 ? special : normal);
}

static inline float bf16_value(uint16_t h)
{
    return f32_of_bits((uint32_t)h << 16);
}

/* float32 bits -> fp16 bits, to nearest, ties to even, in integer arithmetic. */
static inline uint16_t f16_round(uint32_t u)
{
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    uint32_t h;
    if (a > 0x7f800000u) { /* NaN: quiet, the payload's top bits kept (as vcvtps2ph) */
        h = 0x7e00u | ((a >> 13) & 0x3ffu);
    } else if (a >= 0x477ff000u) { /* 65520 (65504 + half its spacing, a tie to even 2^16) and up */
        h = 0x7c00u;
    } else if (a >= 0x38800000u) { /* normal: 2^-14 and up; a carry out of the mantissa bumps the exponent */
        h = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
    } else { /* subnormal or zero: m = a's value * 2^24 rounded, m = 1024 the smallest normal */
        const uint32_t e = a >> 23, mant = (a & 0x7fffffu) | (e ? 0x800000u : 0u);
        uint32_t s = 126u - (e ? e : 1u); /* 14 and up; from 25 every value rounds to 0 */
        if (s > 31u) s = 31u;
        const uint32_t m = mant >> s, rem = mant & ((1u << s) - 1u), half = 1u << (s - 1u);
        h = m + (rem > half || (rem == half && (m & 1u)));
    }
    return (uint16_t)(sign | h);
}

/* float32 bits -> bf16 bits, to nearest, ties to even; a NaN keeps its top bits, made quiet
 * (a carry from its low bits could have made it an infinity). */
static inline uint16_t bf16_round(uint32_t u)
{
    const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, q = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

static void add_row_f16_base(float *restrict dst, const uint16_t *restrict src, int32_t n, float w)
{
    for (int32_t j = 0; j < n; j++) dst[j] += w * f16_value(src[j]);
}

static void add_row_bf16_base(float *restrict dst, const uint16_t *restrict src, int32_t n, float w)
{
    for (int32_t j = 0; j < n; j++) dst[j] += w * bf16_value(src[j]);
}

void fl_cpu_widen_half(float *dst, const void *src, int64_t n, fl_half_kind kind)
{
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, sizeof h);
        dst[i] = kind == FL_HALF_BF16 ? bf16_value(h) : f16_value(h);
    }
}

static void round_f16_base(uint16_t *restrict dst, const float *restrict src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = f16_round(bits_of_f32(src[i]));
}

static void round_bf16_base(uint16_t *restrict dst, const float *restrict src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_round(bits_of_f32(src[i]));
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86_HALF 1

/* ---- AVX-512F: 16 values a vector (vcvtph2ps and vcvtps2ph zmm are AVX-512F); the last n % 16
 * through a zero-padded copy of the 16-bit values and masked float loads and stores */

#define T512 __attribute__((target("avx512f")))

T512 static inline __m512 load16_f16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

T512 static inline __m512 load16_bf16(const uint16_t *p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

#define ADD_ROW_512(name, load)                                                                                \
    T512 static void name(float *dst, const uint16_t *src, int32_t n, float w)                                \
    {                                                                                                          \
        const __m512 vw = _mm512_set1_ps(w);                                                                   \
        int32_t j = 0;                                                                                         \
        for (; j + 32 <= n; j += 32) {                                                                         \
            const __m512 a = load(src + j), b = load(src + j + 16);                                            \
            _mm512_storeu_ps(dst + j, _mm512_add_ps(_mm512_loadu_ps(dst + j), _mm512_mul_ps(vw, a)));          \
            _mm512_storeu_ps(dst + j + 16, _mm512_add_ps(_mm512_loadu_ps(dst + j + 16), _mm512_mul_ps(vw, b))); \
        }                                                                                                      \
        for (; j + 16 <= n; j += 16)                                                                           \
            _mm512_storeu_ps(dst + j, _mm512_add_ps(_mm512_loadu_ps(dst + j), _mm512_mul_ps(vw, load(src + j)))); \
        if (j < n) {                                                                                           \
            uint16_t tail[16] = {0};                                                                           \
            memcpy(tail, src + j, (size_t)(n - j) * sizeof *tail);                                             \
            const __mmask16 m = (__mmask16)((1u << (n - j)) - 1u);                                             \
            const __m512 d = _mm512_maskz_loadu_ps(m, dst + j);                                                \
            _mm512_mask_storeu_ps(dst + j, m, _mm512_add_ps(d, _mm512_mul_ps(vw, load(tail))));                \
        }                                                                                                      \
    }
ADD_ROW_512(add_row_f16_512, load16_f16)
ADD_ROW_512(add_row_bf16_512, load16_bf16)

T512 static inline __m256i round16_f16(__m512 x)
{
    return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

T512 static inline __m256i round16_bf16(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x), hi = _mm512_srli_epi32(u, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40))));
}

#define ROUND_512(name, round)                                                                                 \
    T512 static void name(uint16_t *dst, const float *src, int64_t n)                                         \
    {                                                                                                          \
        int64_t i = 0;                                                                                         \
        for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(dst + i), round(_mm512_loadu_ps(src + i))); \
        if (i < n) {                                                                                           \
            const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);                                             \
            uint16_t tail[16];                                                                                 \
            _mm256_storeu_si256((__m256i *)tail, round(_mm512_maskz_loadu_ps(m, src + i)));                    \
            memcpy(dst + i, tail, (size_t)(n - i) * sizeof *tail);                                             \
        }                                                                                                      \
    }
ROUND_512(round_f16_512, round16_f16)
ROUND_512(round_bf16_512, round16_bf16)

/* ---- AVX2 (F16C for fp16): 8 values a vector, the last n % 8 through zero-padded copies */

#define T256 __attribute__((target("avx2")))
#define T256H __attribute__((target("avx2,f16c")))

T256H static inline __m256 load8_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

T256 static inline __m256 load8_bf16(const uint16_t *p)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

#define ADD_ROW_256(target, name, load)                                                                        \
    target static void name(float *dst, const uint16_t *src, int32_t n, float w)                                \
    {                                                                                                          \
        const __m256 vw = _mm256_set1_ps(w);                                                                   \
        int32_t j = 0;                                                                                         \
        for (; j + 16 <= n; j += 16) {                                                                         \
            const __m256 a = load(src + j), b = load(src + j + 8);                                             \
            _mm256_storeu_ps(dst + j, _mm256_add_ps(_mm256_loadu_ps(dst + j), _mm256_mul_ps(vw, a)));          \
            _mm256_storeu_ps(dst + j + 8, _mm256_add_ps(_mm256_loadu_ps(dst + j + 8), _mm256_mul_ps(vw, b)));  \
        }                                                                                                      \
        for (; j + 8 <= n; j += 8)                                                                             \
            _mm256_storeu_ps(dst + j, _mm256_add_ps(_mm256_loadu_ps(dst + j), _mm256_mul_ps(vw, load(src + j)))); \
        if (j < n) {                                                                                           \
            uint16_t tail[8] = {0};                                                                            \
            float v[8];                                                                                        \
            memcpy(tail, src + j, (size_t)(n - j) * sizeof *tail);                                             \
            _mm256_storeu_ps(v, _mm256_mul_ps(vw, load(tail)));                                                \
            for (int32_t k = 0; j + k < n; k++) dst[j + k] += v[k];                                            \
        }                                                                                                      \
    }
ADD_ROW_256(T256H, add_row_f16_256, load8_f16)
ADD_ROW_256(T256, add_row_bf16_256, load8_bf16)

T256H static inline __m128i round8_f16(__m256 x)
{
    return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

T256 static inline __m128i round8_bf16(__m256 x)
{
    const __m256i u = _mm256_castps_si256(x), hi = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m256i v = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)); /* each <= 0xffff */
}

#define ROUND_256(target, name, round)                                                                         \
    target static void name(uint16_t *dst, const float *src, int64_t n)                                         \
    {                                                                                                          \
        int64_t i = 0;                                                                                         \
        for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(dst + i), round(_mm256_loadu_ps(src + i)));    \
        if (i < n) {                                                                                           \
            float in[8] = {0};                                                                                 \
            uint16_t out[8];                                                                                   \
            memcpy(in, src + i, (size_t)(n - i) * sizeof *in);                                                 \
            _mm_storeu_si128((__m128i *)out, round(_mm256_loadu_ps(in)));                                      \
            memcpy(dst + i, out, (size_t)(n - i) * sizeof *out);                                               \
        }                                                                                                      \
    }
ROUND_256(T256H, round_f16_256, round8_f16)
ROUND_256(T256, round_bf16_256, round8_bf16)
#endif

void fl_cpu_add_row_half_isa(fl_cpu_isa isa, float *dst, const uint16_t *src, int32_t n, float w, fl_half_kind kind)
{
    const bool bf16 = kind == FL_HALF_BF16;
#ifdef HAVE_X86_HALF
    if (isa == FL_ISA_AVX512) {
        (bf16 ? add_row_bf16_512 : add_row_f16_512)(dst, src, n, w);
        return;
    }
    if (isa == FL_ISA_AVX2 && (bf16 || fl_cpu_has_f16c())) {
        (bf16 ? add_row_bf16_256 : add_row_f16_256)(dst, src, n, w);
        return;
    }
#endif
    (bf16 ? add_row_bf16_base : add_row_f16_base)(dst, src, n, w);
}

void fl_cpu_add_row_half(float *dst, const uint16_t *src, int32_t n, float w, fl_half_kind kind)
{
    fl_cpu_add_row_half_isa(fl_cpu_isa_detect(), dst, src, n, w, kind);
}

void fl_cpu_round_half_isa(fl_cpu_isa isa, uint16_t *dst, const float *src, int64_t n, fl_half_kind kind)
{
    const bool bf16 = kind == FL_HALF_BF16;
#ifdef HAVE_X86_HALF
    if (isa == FL_ISA_AVX512) {
        (bf16 ? round_bf16_512 : round_f16_512)(dst, src, n);
        return;
    }
    if (isa == FL_ISA_AVX2 && (bf16 || fl_cpu_has_f16c())) {
        (bf16 ? round_bf16_256 : round_f16_256)(dst, src, n);
        return;
    }
#endif
    (bf16 ? round_bf16_base : round_f16_base)(dst, src, n);
}

void fl_cpu_round_half(uint16_t *dst, const float *src, int64_t n, fl_half_kind kind)
{
    fl_cpu_round_half_isa(fl_cpu_isa_detect(), dst, src, n, kind);
}
