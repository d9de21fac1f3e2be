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

/* Multiply-adds up to which a GEMM may bypass a weak BLAS (see fl_cpu_linear). */
#define SMALL_GEMM_MACS (1 << 22)

void fl_cpu_linear(int64_t rows, int32_t in, int32_t out, const float *x, int64_t ldx, const float *w,
                   const float *bias, float beta, fl_act_kind act, float *y, int64_t ldy)
{
    if (rows == 0) return;
    if (beta == 0.0f && (int64_t)rows * in * out <= SMALL_GEMM_MACS && fl_blas_is_weak()) {
        /* A BLAS without vector kernels on this CPU: small GEMMs (an encoder's projections for
         * one user) as dot products of rows with libflame's own vector kernel. */
        for (int64_t r = 0; r < rows; r++) fl_cpu_dot_rows(x + r * ldx, in, w, NULL, 0, out, y + r * ldy, 1);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)rows, out, in, 1.0f, x, (blasint)ldx, w, in,
                    beta, y, (blasint)ldy);
    }
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
