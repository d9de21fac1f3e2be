/* SUMI attention on the CPU (contract in kernels.h).
 * Row by row: the logits against the visible history keys, the softmax, the weighted sum of
 * the history values, then a candidate's own key/value term. Candidates never see each other,
 * so no candidate-candidate block is ever computed. No BLAS call: a history is a few to a few
 * hundred keys (tiny GEMMs a BLAS packs for), and the engine runs requests and heads on its
 * own threads, where BLAS threads would oversubscribe the cores. */
#include <math.h>

#include "cpu/clones.h"
#include "cpu/kernels.h"


size_t fl_cpu_attention_scratch(int64_t n_hist)
{
    return (size_t)(n_hist > 0 ? n_hist : 1); /* one query row's weights */
}

/* q . k over n in a fixed order (16 partial sums, then a fixed tree); vectorised by the
 * compiler for the CPU it is compiled for, the same bits for every version. */
static inline float dot(const float *a, const float *b, int32_t n)
{
    float acc[16] = {0};
    int32_t j = 0;
    for (; j + 16 <= n; j += 16)
        for (int u = 0; u < 16; u++) acc[u] += a[j + u] * b[j + u];
    float s = 0.0f;
    for (int u = 0; u < 8; u++) acc[u] += acc[u + 8];
    s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (; j < n; j++) s += a[j] * b[j];
    return s;
}

/* One query row: w[j] = softmax weights over the visible history keys (0 elsewhere), *self_w
 * its own key's weight (candidates), then out = sum_j w[j] v_j + self_w v_p. */
FL_CLONES static void attend_row(int64_t n_hist, int64_t p, int32_t dh, float scale, const float *qi, const float *k,
                                 const float *v, int64_t ldkv, const uint8_t *key_valid, float *w, float *o)
{
    const bool cand = p >= n_hist;
    const int64_t nvis = cand ? n_hist : p + 1; /* history keys 0..nvis-1 may be visible */
    const bool self_ok = cand && (!key_valid || key_valid[p]);
    const float self_logit = self_ok ? scale * dot(qi, k + p * ldkv, dh) : 0.0f;
    float mx = self_ok ? self_logit : -INFINITY;
    for (int64_t j = 0; j < nvis; j++) {
        if (key_valid && !key_valid[j]) {
            w[j] = -INFINITY;
            continue;
        }
        w[j] = scale * dot(qi, k + j * ldkv, dh);
        if (w[j] > mx) mx = w[j];
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < nvis; j++) {
        const float e = w[j] == -INFINITY ? 0.0f : expf(w[j] - mx);
        w[j] = e;
        sum += e;
    }
    const float es = self_ok ? expf(self_logit - mx) : 0.0f;
    sum += es;
    /* no visible key: every weight stays 0 and the output row is zeros, never NaN */
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int32_t e = 0; e < dh; e++) o[e] = 0.0f;
    for (int64_t j = 0; j < nvis; j++) {
        const float wj = w[j] * inv;
        if (wj == 0.0f) continue;
        const float *vj = v + j * ldkv;
        for (int32_t e = 0; e < dh; e++) o[e] += wj * vj[e];
    }
    const float sw = es * inv;
    if (sw != 0.0f) {
        const float *vp = v + p * ldkv;
        for (int32_t e = 0; e < dh; e++) o[e] += sw * vp[e];
    }
}

void fl_cpu_attention_sumi(int64_t n_hist, int64_t n_cand, int32_t heads, int32_t dh, const float *q, int64_t ldq,
                           const int32_t *qpos, int64_t nq, const float *k, const float *v, int64_t ldkv,
                           const uint8_t *key_valid, float *out, int64_t ldo, float *scratch)
{
    (void)n_cand;
    const float scale = 1.0f / sqrtf((float)dh);
    for (int32_t h = 0; h < heads; h++) {
        const int64_t col = (int64_t)h * dh;
        for (int64_t i = 0; i < nq; i++) {
            const int64_t p = qpos ? qpos[i] : i;
            attend_row(n_hist, p, dh, scale, q + i * ldq + col, k + col, v + col, ldkv, key_valid, scratch,
                       out + i * ldo + col);
        }
    }
}
