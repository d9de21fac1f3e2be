/* SUMI attention on the CPU (contract in kernels.h).
 * Per head and block of queries: logits against the history keys with one GEMM, the mask
 * and softmax row by row, one GEMM against the history values, then each candidate's own
 * key/value term. Candidates never see each other, so no candidate-candidate block is
 * ever computed. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "cpu/kernels.h"

#define QBLOCK 64

size_t fl_cpu_attention_scratch(int64_t n_hist)
{
    return (size_t)QBLOCK * (size_t)(n_hist > 0 ? n_hist : 1);
}

static inline float dot(const float *a, const float *b, int32_t n)
{
    float s = 0.0f;
    for (int32_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void fl_cpu_attention_sumi(int64_t n_hist, int64_t n_cand, int32_t heads, int32_t dh, const float *q, int64_t ldq,
                           const int32_t *qpos, int64_t nq, const float *k, const float *v, int64_t ldkv,
                           const uint8_t *key_valid, float *out, int64_t ldo, float *scratch)
{
    (void)n_cand;
    const float scale = 1.0f / sqrtf((float)dh);
    for (int32_t h = 0; h < heads; h++) {
        const int64_t col = (int64_t)h * dh;
        for (int64_t i0 = 0; i0 < nq; i0 += QBLOCK) {
            const int64_t nb = nq - i0 < QBLOCK ? nq - i0 : QBLOCK;
            float *S = scratch; /* [nb, n_hist] */
            if (n_hist > 0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)nb, (blasint)n_hist, dh, scale,
                            q + i0 * ldq + col, (blasint)ldq, k + col, (blasint)ldkv, 0.0f, S, (blasint)n_hist);
            float self_w[QBLOCK];
            for (int64_t i = 0; i < nb; i++) {
                const int64_t p = qpos ? qpos[i0 + i] : i0 + i;
                const bool cand = p >= n_hist;
                const int64_t nvis = cand ? n_hist : p + 1; /* history keys 0..nvis-1 may be visible */
                float *row = S + i * n_hist;
                bool self_ok = cand && (!key_valid || key_valid[p]);
                float self_logit = self_ok ? scale * dot(q + (i0 + i) * ldq + col, k + p * ldkv + col, dh) : 0.0f;
                float mx = self_ok ? self_logit : -INFINITY;
                for (int64_t j = 0; j < nvis; j++)
                    if ((!key_valid || key_valid[j]) && row[j] > mx) mx = row[j];
                float sum = 0.0f;
                for (int64_t j = 0; j < n_hist; j++) {
                    float e = (j < nvis && (!key_valid || key_valid[j])) ? expf(row[j] - mx) : 0.0f;
                    row[j] = e;
                    sum += e;
                }
                float es = self_ok ? expf(self_logit - mx) : 0.0f;
                sum += es;
                /* no visible key: every weight stays 0 and the output row is zeros, never NaN */
                float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
                for (int64_t j = 0; j < n_hist; j++) row[j] *= inv;
                self_w[i] = es * inv;
            }
            float *o = out + i0 * ldo + col;
            if (n_hist > 0)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)nb, dh, (blasint)n_hist, 1.0f, S,
                            (blasint)n_hist, v + col, (blasint)ldkv, 0.0f, o, (blasint)ldo);
            else
                for (int64_t i = 0; i < nb; i++) memset(o + i * ldo, 0, (size_t)dh * sizeof(float));
            for (int64_t i = 0; i < nb; i++) {
                if (self_w[i] == 0.0f) continue;
                const int64_t p = qpos ? qpos[i0 + i] : i0 + i;
                const float *vp = v + p * ldkv + col;
                for (int32_t e = 0; e < dh; e++) o[i * ldo + e] += self_w[i] * vp[e];
            }
        }
    }
}
