/* Linear layers through CBLAS plus the elementwise epilogues (contract in kernels.h). */
#include <cblas.h>
#include <math.h>

#include "cpu/kernels.h"

void fl_cpu_activation(int64_t rows, int32_t cols, float *x, int64_t ld, fl_act_kind act)
{
    if (act == FL_KACT_NONE) return;
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * ld;
        switch (act) {
        case FL_KACT_RELU:
            for (int32_t j = 0; j < cols; j++) row[j] = row[j] > 0.0f ? row[j] : 0.0f;
            break;
        case FL_KACT_GELU_ERF:
            for (int32_t j = 0; j < cols; j++) row[j] = 0.5f * row[j] * (1.0f + erff(row[j] * 0.70710678118654752f));
            break;
        case FL_KACT_GELU_TANH:
            for (int32_t j = 0; j < cols; j++) {
                float v = row[j];
                row[j] = 0.5f * v * (1.0f + tanhf(0.79788456080286536f * (v + 0.044715f * v * v * v)));
            }
            break;
        default: break;
        }
    }
}

void fl_cpu_linear(int64_t rows, int32_t in, int32_t out, const float *x, int64_t ldx, const float *w,
                   const float *bias, float beta, fl_act_kind act, float *y, int64_t ldy)
{
    if (rows == 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)rows, out, in, 1.0f, x, (blasint)ldx, w, in,
                beta, y, (blasint)ldy);
    if (bias)
        for (int64_t r = 0; r < rows; r++) {
            float *row = y + r * ldy;
            for (int32_t j = 0; j < out; j++) row[j] += bias[j];
        }
    fl_cpu_activation(rows, out, y, ldy, act);
}

void fl_cpu_sigmoid(float *x, int64_t n, int64_t stride)
{
    for (int64_t i = 0; i < n; i++) {
        float v = x[i * stride];
        /* split by sign so expf never overflows */
        x[i * stride] = v >= 0 ? 1.0f / (1.0f + expf(-v)) : expf(v) / (1.0f + expf(v));
    }
}

void fl_cpu_dot_gather(const float *h, int32_t d, const float *table, const int64_t *ids, int64_t n, float *out,
                       int64_t stride)
{
    for (int64_t c = 0; c < n; c++) {
        const float *row = table + ids[c] * (int64_t)d;
        /* eight partial sums: the compiler vectorizes this without -ffast-math, and the
         * order is fixed, so results never depend on the thread that computes them */
        float acc[8] = {0};
        int32_t j = 0;
        for (; j + 8 <= d; j += 8)
            for (int u = 0; u < 8; u++) acc[u] += h[j + u] * row[j + u];
        float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        for (; j < d; j++) s += h[j] * row[j];
        out[c * stride] = s;
    }
}
