/* fp16 and bf16 for the tests: the exact value of a 16-bit pattern, and the correctly rounded
 * pattern of a value (to nearest, ties to even), found by a search over the format's values in
 * float64 rather than by the bit tricks of the code under test. Include after testutil.h. */
#ifndef FLAME_TU_HALF_H
#define FLAME_TU_HALF_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* The value of fp16 bits h, exact (NaN for a NaN pattern). */
static inline double tuh_f16_value(uint16_t h)
{
    const int e = (h >> 10) & 31, m = h & 1023;
    const double v = e == 31 ? (m ? NAN : INFINITY) : e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return h & 0x8000u ? -v : v;
}

/* The value of bf16 bits h, exact (the float32 whose top half h is). */
static inline double tuh_bf16_value(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline double tuh_value(bool bf16, uint16_t h)
{
    return bf16 ? tuh_bf16_value(h) : tuh_f16_value(h);
}

static inline bool tuh_is_nan(bool bf16, uint16_t h)
{
    return isnan(tuh_value(bf16, h));
}

/* The pattern of x rounded to nearest fp16 (bf16 when bf16), ties to the even pattern. The
 * non-negative finite patterns 0 .. inf-1 are in increasing order of value; the infinity
 * pattern stands for the first value past the largest finite one (2^16, 2^128), as IEEE 754's
 * overflow rule has it: a magnitude from the largest finite value plus half its spacing on
 * rounds to infinity. NaN: a NaN pattern of x's sign with the quiet bit. */
static inline uint16_t tuh_nearest(bool bf16, double x)
{
    const uint16_t inf = bf16 ? 0x7f80u : 0x7c00u, quiet = bf16 ? 0x40u : 0x200u;
    const uint16_t sign = signbit(x) ? 0x8000u : 0u;
    if (isnan(x)) return (uint16_t)(sign | inf | quiet);
    const double a = fabs(x), past = bf16 ? ldexp(1.0, 128) : 65536.0;
#define TUH_VAL(k) ((k) == inf ? past : tuh_value(bf16, (uint16_t)(k)))
    if (a >= past) return (uint16_t)(sign | inf);
    uint32_t lo = 0, hi = inf; /* val(lo) <= a < val(hi) */
    while (hi - lo > 1) {
        const uint32_t mid = (lo + hi) / 2;
        if (TUH_VAL(mid) <= a)
            lo = mid;
        else
            hi = mid;
    }
    const double dlo = a - TUH_VAL(lo), dhi = TUH_VAL(hi) - a;
#undef TUH_VAL
    const uint32_t k = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
    return (uint16_t)(sign | k);
}

#endif
