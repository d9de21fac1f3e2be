/* LayerNorm with an optional fused residual add (contract in kernels.h). */
#include <math.h>

#include "cpu/kernels.h"

void fl_cpu_layernorm(int64_t rows, int32_t d, const float *x, int64_t ldx, const float *residual, int64_t ldr,
                      const float *w, const float *b, float eps, bool eps_inside_sqrt, float *out, int64_t ldo)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ldx;
        const float *rr = residual ? residual + r * ldr : NULL;
        float *o = out + r * ldo;
        double sum = 0.0;
        for (int32_t j = 0; j < d; j++) {
            float z = rr ? xr[j] + rr[j] : xr[j];
            o[j] = z; /* z staged in out: out may alias x, each element is read before written */
            sum += z;
        }
        double mean = sum / d, var = 0.0;
        for (int32_t j = 0; j < d; j++) {
            double c = o[j] - mean;
            var += c * c;
        }
        var /= d;
        double inv = eps_inside_sqrt ? 1.0 / sqrt(var + eps) : 1.0 / (sqrt(var) + eps);
        float fmean = (float)mean, finv = (float)inv;
        for (int32_t j = 0; j < d; j++) o[j] = (o[j] - fmean) * finv * w[j] + b[j];
    }
}
