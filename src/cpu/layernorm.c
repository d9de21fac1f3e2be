/* LayerNorm with an optional fused residual add (contract in kernels.h). */
#include <math.h>

#include "cpu/kernels.h"

void fl_cpu_layernorm(int64_t rows, int32_t d, const float *x, int64_t ldx, const float *residual, int64_t ldr,
                      const float *w, const float *b, float eps, bool eps_inside_sqrt, float *out, int64_t ldo)
{
    /* Centering and scaling in double: with a small spread around a large mean, float32
     * (x - mean) loses the digits that matter. Passes 1-2 only read, pass 3 reads then writes
     * each element, so out may alias x. */
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ldx;
        const float *rr = residual ? residual + r * ldr : NULL;
        float *o = out + r * ldo;
        double sum = 0.0;
        for (int32_t j = 0; j < d; j++) sum += rr ? (double)xr[j] + rr[j] : (double)xr[j];
        double mean = sum / d, var = 0.0;
        for (int32_t j = 0; j < d; j++) {
            double c = (rr ? (double)xr[j] + rr[j] : (double)xr[j]) - mean;
            var += c * c;
        }
        var /= d;
        double inv = eps_inside_sqrt ? 1.0 / sqrt(var + eps) : 1.0 / (sqrt(var) + eps);
        for (int32_t j = 0; j < d; j++) {
            double z = rr ? (double)xr[j] + rr[j] : (double)xr[j];
            o[j] = (float)((z - mean) * inv * w[j] + b[j]);
        }
    }
}
