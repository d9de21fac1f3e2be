/* e^x in float32 as plain C that GCC vectorises: a loop calling fl_cpu_expf over an array
 * compiles to vector code in every FL_CLONES version (libm's expf is a call per element, which
 * dominated the blocked attention softmax). Only IEEE basic operations without FMA, so the
 * scalar, AVX2 and AVX-512 versions give the same bits.
 * Method (Cephes expf, S. L. Moshier): x = n ln2 + r with |r| <= ln2/2, ln2 split in a part
 * whose product with n is exact and a remainder (Cody-Waite); e^r by a degree-7 polynomial;
 * 2^n applied as two normal powers 2^(n/2) 2^(n - n/2), so results that overflow give +inf and
 * results below FLT_MIN round once into the subnormals (to 0 below 2^-150).
 * Relative error below 2e-7 wherever e^x is a normal float; exactly 0 for x = -inf and every
 * x <= -104, +inf for x >= 89 and +inf, NaN for NaN, 1 for 0. */
#ifndef FLAME_CPU_EXPF_H
#define FLAME_CPU_EXPF_H

#include <stdint.h>
#include <string.h>

static inline float fl_cpu_pow2i(int32_t n) /* 2^n for -126 <= n <= 127 */
{
    const uint32_t bits = (uint32_t)(n + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float fl_cpu_expf(float x)
{
    /* clamp to where e^x rounds to 0 or overflows; -inf and NaN land on -105 (NaN restored below) */
    float xc = x > -105.0f ? x : -105.0f;
    xc = xc < 89.0f ? xc : 89.0f;
    /* n = round(x / ln2): adding 1.5 * 2^23 rounds to an integer in float32 (|x / ln2| < 2^22) */
    const float nf = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    /* 0.693359375 has 9 significant bits: nf * it is exact, and so is the subtraction (Sterbenz) */
    const float r = (xc - nf * 0.693359375f) - nf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float er = (p * (r * r) + r) + 1.0f;
    const int32_t n = (int32_t)nf, n1 = n / 2; /* n in [-152, 129]: both halves are normal powers */
    const float y = er * fl_cpu_pow2i(n1) * fl_cpu_pow2i(n - n1);
    return x != x ? x : y;
}

#endif
