/* SUMI attention on the CPU (contract in kernels.h).
 * Blocks of QB query rows, so that each key and value row is read once per block instead of
 * once per query row (row by row the kernel was bound by re-reading K and V). Per block and head:
 *   1. logits S[j][r] = q_r . k_j / sqrt(dh) for every key some row of the block may see, with
 *      the block's queries transposed to [dh][QB]: one key's products for all rows are a vector;
 *   2. each row's softmax over its own visible keys (the others are -inf, weight 0);
 *   3. O[e][r] = sum_j w_j[r] v_j[e], EC columns e at a time held in registers;
 *   4. out_r = O[.][r] / sum_r plus a candidate's own key/value term.
 * Each lane runs the same operations in the same order whichever rows share its block (an
 * invisible key adds exact zeros to sums that start at +0, as long as its value row is finite:
 * 0 x inf is NaN, as in the GPU kernels and every fused attention), so a row's output depends
 * only on its query and its visible keys, and every clone gives the same bits. Candidates never see
 * each other, so no candidate-candidate block is computed. No BLAS call: a history is a few to
 * a few thousand keys (tiny GEMMs a BLAS packs for), and the engine runs requests and heads on
 * its own threads, where BLAS threads would oversubscribe the cores. */
#include <math.h>

#include "cpu/clones.h"
#include "cpu/expf.h"
#include "cpu/kernels.h"

enum {
    QB = 16, /* query rows per block: one AVX-512 vector of float32 */
    KB = 8,  /* keys in flight in the logit loop (independent add chains) */
    EC = 8,  /* output columns accumulated in registers in the P.V loop */
};
_Static_assert(KB == 8 && EC == 8, "the logit and P.V loops share add_products8, which names its 8 accumulators");

size_t fl_cpu_attention_scratch(int64_t n_hist, int32_t dh)
{
    const size_t keys = (size_t)(n_hist > 0 ? n_hist : 0), width = (size_t)(dh > 0 ? dh : 1);
    return (keys + width) * QB; /* logits then weights [n_hist][QB], transposed queries [dh][QB] */
}

/* q . k over n in a fixed order (16 partial sums, then a fixed tree); a candidate's own key. */
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

/* acc[b][r] += a[r] * x[b] for the KB = EC = 8 rows b of acc and the QB lanes r: the step both
 * the logits (a = one query column, x = 8 keys' values there) and P.V (a = one key's weights,
 * x = its value in 8 columns) repeat. One statement per b in a single lane loop, so each
 * accumulator row is a vector register: written as a loop over b, GCC 12 vectorised across b
 * with shuffles instead, and the kernel ran 2.4x slower. */
static inline void add_products8(float acc[8][QB], const float *a, const float x[8])
{
    float *a0 = acc[0], *a1 = acc[1], *a2 = acc[2], *a3 = acc[3], *a4 = acc[4], *a5 = acc[5], *a6 = acc[6],
          *a7 = acc[7];
    const float x0 = x[0], x1 = x[1], x2 = x[2], x3 = x[3], x4 = x[4], x5 = x[5], x6 = x[6], x7 = x[7];
    for (int r = 0; r < QB; r++) {
        const float ar = a[r];
        a0[r] += ar * x0;
        a1[r] += ar * x1;
        a2[r] += ar * x2;
        a3[r] += ar * x3;
        a4[r] += ar * x4;
        a5[r] += ar * x5;
        a6[r] += ar * x6;
        a7[r] += ar * x7;
    }
}

/* s[j][r] = scale * (qt[.][r] . k_j) for j < nk, each lane summed over e in ascending order. */
static inline void logits(const float *qt, int32_t dh, const float *k, int64_t ldkv, int64_t nk, float scale,
                          float *s)
{
    int64_t j = 0;
    for (; j + KB <= nk; j += KB) {
        float acc[KB][QB] = {{0}};
        const float *k0 = k + j * ldkv;
        for (int32_t e = 0; e < dh; e++) {
            const float *ke = k0 + e;
            const float x[KB] = {ke[0],        ke[ldkv],     ke[2 * ldkv], ke[3 * ldkv],
                                 ke[4 * ldkv], ke[5 * ldkv], ke[6 * ldkv], ke[7 * ldkv]};
            add_products8(acc, qt + (size_t)e * QB, x);
        }
        for (int b = 0; b < KB; b++)
            for (int r = 0; r < QB; r++) s[(j + b) * QB + r] = scale * acc[b][r];
    }
    for (; j < nk; j++) {
        float acc[QB] = {0};
        const float *kj = k + j * ldkv;
        for (int32_t e = 0; e < dh; e++)
            for (int r = 0; r < QB; r++) acc[r] += qt[(size_t)e * QB + r] * kj[e];
        for (int r = 0; r < QB; r++) s[j * QB + r] = scale * acc[r];
    }
}

/* Per-row results of the softmax, applied when the output rows are written. */
typedef struct row_norm {
    float inv[QB];       /* 1 / sum of the row's weights (0 when it sees no key) */
    float self_w[QB];    /* a candidate's own key's normalised weight (0 for history rows) */
    const float *vp[QB]; /* a candidate's own value row */
} row_norm;

/* out[r][e0 + c] = acc[c][r] * inv[r] + self_w[r] * vp[r][e0 + c], c < ncol, r < nrows. */
static inline void store_cols(const float *acc, int ncol, int32_t e0, const row_norm *rn, int64_t nrows, float *out,
                              int64_t ldo)
{
    for (int64_t r = 0; r < nrows; r++) {
        float *o = out + r * ldo + e0;
        const float inv = rn->inv[r], sw = rn->self_w[r];
        if (sw != 0.0f)
            for (int c = 0; c < ncol; c++) o[c] = acc[c * QB + r] * inv + sw * rn->vp[r][e0 + c];
        else
            for (int c = 0; c < ncol; c++) o[c] = acc[c * QB + r] * inv;
    }
}

/* One block of nrows <= QB query rows (positions pos[]) of one head. */
FL_CLONES static void attend_block(int64_t n_hist, const int64_t *pos, int64_t nrows, int32_t dh, float scale,
                                   const float *q, int64_t ldq, const float *k, const float *v, int64_t ldkv,
                                   const uint8_t *key_valid, float *out, int64_t ldo, float *scratch)
{
    float *s = scratch, *qt = scratch + (size_t)(n_hist > 0 ? n_hist : 0) * QB;
    int32_t lim[QB];   /* row r may see history keys j < lim[r] */
    float self[QB];    /* a candidate's scaled own logit; -inf when it has none */
    row_norm rn;
    int64_t nk = 0;    /* keys any row of the block may see */
    for (int64_t r = 0; r < QB; r++) {
        const bool real = r < nrows, cand = real && pos[r] >= n_hist;
        lim[r] = !real ? 0 : (int32_t)(cand ? n_hist : pos[r] + 1);
        if (lim[r] > nk) nk = lim[r];
        const bool self_ok = cand && (!key_valid || key_valid[pos[r]]);
        self[r] = self_ok ? scale * dot(q + r * ldq, k + pos[r] * ldkv, dh) : -INFINITY;
        rn.vp[r] = cand ? v + pos[r] * ldkv : NULL;
        for (int32_t e = 0; e < dh; e++) qt[(size_t)e * QB + r] = real ? q[r * ldq + e] : 0.0f;
    }

    logits(qt, dh, k, ldkv, nk, scale, s);

    float mx[QB], sum[QB];
    for (int r = 0; r < QB; r++) mx[r] = self[r];
    for (int64_t j = 0; j < nk; j++) {
        float *sj = s + j * QB;
        const int32_t jj = (int32_t)j;
        const bool valid = !key_valid || key_valid[j];
        for (int r = 0; r < QB; r++) {
            const float x = valid && jj < lim[r] ? sj[r] : -INFINITY;
            sj[r] = x;
            mx[r] = x > mx[r] ? x : mx[r];
        }
    }
    for (int r = 0; r < QB; r++) {
        if (mx[r] == -INFINITY) mx[r] = 0.0f; /* no visible key: every weight is exp(-inf) = 0 */
        sum[r] = 0.0f;
    }
    for (int64_t j = 0; j < nk; j++) {
        float *sj = s + j * QB;
        for (int r = 0; r < QB; r++) {
            const float w = fl_cpu_expf(sj[r] - mx[r]);
            sj[r] = w;
            sum[r] += w;
        }
    }
    for (int r = 0; r < QB; r++) {
        const float es = fl_cpu_expf(self[r] - mx[r]);
        sum[r] += es;
        /* no visible key: the output row is zeros, never NaN */
        rn.inv[r] = sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f;
        rn.self_w[r] = es * rn.inv[r];
    }

    int32_t e0 = 0;
    for (; e0 + EC <= dh; e0 += EC) {
        float acc[EC][QB] = {{0}};
        for (int64_t j = 0; j < nk; j++) {
            if (key_valid && !key_valid[j]) continue; /* a padding key's value row may hold anything */
            add_products8(acc, s + j * QB, v + j * ldkv + e0);
        }
        store_cols(&acc[0][0], EC, e0, &rn, nrows, out, ldo);
    }
    for (; e0 < dh; e0++) {
        float acc[QB] = {0};
        for (int64_t j = 0; j < nk; j++) {
            if (key_valid && !key_valid[j]) continue;
            const float x = v[j * ldkv + e0], *wj = s + j * QB;
            for (int r = 0; r < QB; r++) acc[r] += wj[r] * x;
        }
        store_cols(acc, 1, e0, &rn, nrows, out, ldo);
    }
}

void fl_cpu_attention_sumi(int64_t n_hist, int64_t n_cand, int32_t heads, int32_t dh, const float *q, int64_t ldq,
                           const int32_t *qpos, int64_t nq, const float *k, const float *v, int64_t ldkv,
                           const uint8_t *key_valid, float *out, int64_t ldo, float *scratch)
{
    (void)n_cand;
    const float scale = 1.0f / sqrtf((float)dh);
    for (int64_t i0 = 0; i0 < nq; i0 += QB) {
        const int64_t nrows = nq - i0 < QB ? nq - i0 : QB;
        int64_t pos[QB];
        for (int64_t r = 0; r < nrows; r++) pos[r] = qpos ? qpos[i0 + r] : i0 + r;
        for (int32_t h = 0; h < heads; h++) {
            const int64_t col = (int64_t)h * dh;
            attend_block(n_hist, pos, nrows, dh, scale, q + i0 * ldq + col, ldq, k + col, v + col, ldkv, key_valid,
                         out + i0 * ldo + col, ldo, scratch);
        }
    }
}
