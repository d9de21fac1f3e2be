/* fp16 and bf16 to float32 on the host, exact (every fp16 and bf16 value is a float32 value). */
#ifndef FLAME_KERNELS_HALF_H
#define FLAME_KERNELS_HALF_H

#include <stdint.h>
#include <string.h>

static inline float fl_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float fl_bf16_to_f32(uint16_t h)
{
    return fl_bits_f32((uint32_t)h << 16);
}

/* IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; subnormals, inf and NaN kept. */
static inline float fl_f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return fl_bits_f32(sign | 0x7f800000u | (man << 13)); /* inf, NaN */
    if (exp != 0) return fl_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24, exact in float32 */
    const float v = (float)man * 5.9604644775390625e-8f;
    return sign ? -v : v;
}

#endif
