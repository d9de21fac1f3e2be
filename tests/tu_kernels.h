/* Shared by the public-kernel tests (C and nvcc): random tables and lookups, random ragged
 * attention batches, and their float64 references. Include after testutil.h. */
#ifndef FLAME_TU_KERNELS_H
#define FLAME_TU_KERNELS_H

#include <stdbool.h>

#include "flame/kernels.h"

/* ---- embedding bag */

/* k / 64 for k in -64..64: exact in fp16, bf16 and float32, so every dtype stores the same value */
static inline float tuk_value(void)
{
    return (float)(tu_below(129) - 64) / 64.0f;
}

/* bits of an fp16 / bf16 holding v exactly (v = 0 or normal) */
static inline uint16_t tuk_f16_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    if ((u & 0x7fffffffu) == 0) return (uint16_t)(u >> 16);
    const uint32_t sign = (u >> 16) & 0x8000u, exp = ((u >> 23) & 0xffu) - 127u + 15u, man = (u >> 13) & 0x3ffu;
    return (uint16_t)(sign | (exp << 10) | man);
}
static inline uint16_t tuk_bf16_bits(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return (uint16_t)(u >> 16);
}

typedef struct tuk_table {
    flame_dtype dtype;
    flame_pooling pooling;
    int64_t rows;
    int32_t dim;
    void *data;    /* [rows, dim] in dtype */
    float *qp;     /* INT8: [rows, 2] */
    double *value; /* [rows, dim]: what each element is worth */
} tuk_table;

static inline void tuk_table_fill(tuk_table *t, flame_dtype dtype, int64_t rows, int32_t dim, flame_pooling pooling)
{
    t->dtype = dtype;
    t->pooling = pooling;
    t->rows = rows;
    t->dim = dim;
    const size_t n = (size_t)rows * (size_t)dim;
    const size_t es = dtype == FLAME_DTYPE_F32 ? 4 : dtype == FLAME_DTYPE_INT8 ? 1 : 2;
    t->data = malloc(n * es + 1);
    t->value = (double *)malloc(n * sizeof(double) + 1);
    t->qp = NULL;
    if (dtype == FLAME_DTYPE_INT8) {
        t->qp = (float *)malloc((size_t)rows * 2 * sizeof(float));
        for (int64_t r = 0; r < rows; r++) {
            t->qp[2 * r] = tu_below(8) == 0 ? 0.0f : 0.05f * tu_uniform();
            t->qp[2 * r + 1] = tu_uniform();
        }
    }
    for (size_t i = 0; i < n; i++) {
        const int64_t r = (int64_t)(i / (size_t)dim);
        switch (dtype) {
        case FLAME_DTYPE_F32: {
            const float v = tu_uniform();
            ((float *)t->data)[i] = v;
            t->value[i] = v;
            break;
        }
        case FLAME_DTYPE_F16: {
            const float v = tuk_value();
            ((uint16_t *)t->data)[i] = tuk_f16_bits(v);
            t->value[i] = v;
            break;
        }
        case FLAME_DTYPE_BF16: {
            const float v = tuk_value();
            ((uint16_t *)t->data)[i] = tuk_bf16_bits(v);
            t->value[i] = v;
            break;
        }
        case FLAME_DTYPE_INT8: {
            const int8_t q = (int8_t)(tu_below(256) - 128);
            ((int8_t *)t->data)[i] = q;
            t->value[i] = (double)t->qp[2 * r] * q + (double)t->qp[2 * r + 1];
            break;
        }
        }
    }
}

static inline void tuk_table_free(tuk_table *t)
{
    free(t->data);
    free(t->qp);
    free(t->value);
}

static inline flame_embedding_table tuk_desc(const tuk_table *t)
{
    flame_embedding_table d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.dtype = t->dtype;
    d.pooling = t->pooling;
    d.rows = t->rows;
    d.dim = t->dim;
    d.data = t->data;
    d.qparams = t->qp;
    return d;
}

/* One table's random lookups: bags of 0..max_bag ids (offsets), or one id per bag. */
typedef struct tuk_lookup {
    int64_t *ids, *offsets;
    float *weights;
    int64_t num_ids;
} tuk_lookup;

static inline void tuk_lookup_fill(tuk_lookup *l, const tuk_table *t, int64_t batch, bool single, bool weighted,
                                   int max_bag)
{
    l->offsets = single ? NULL : (int64_t *)malloc((size_t)(batch + 1) * sizeof(int64_t));
    int64_t n = 0;
    if (!single) {
        l->offsets[0] = 0;
        for (int64_t b = 0; b < batch; b++) l->offsets[b + 1] = l->offsets[b] + tu_below(max_bag + 1);
        n = l->offsets[batch];
    } else {
        n = batch;
    }
    l->num_ids = n;
    l->ids = (int64_t *)malloc((size_t)(n + 1) * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) l->ids[i] = tu_below(t->rows);
    l->weights = NULL;
    if (weighted) {
        l->weights = (float *)malloc((size_t)(n + 1) * sizeof(float));
        for (int64_t i = 0; i < n; i++) l->weights[i] = 2.0f * tu_uniform();
    }
}

static inline void tuk_lookup_free(tuk_lookup *l)
{
    free(l->ids);
    free(l->offsets);
    free(l->weights);
}

static inline flame_embedding_bag_input tuk_input(const tuk_lookup *l)
{
    flame_embedding_bag_input in;
    memset(&in, 0, sizeof in);
    in.struct_size = sizeof in;
    in.ids = l->ids;
    in.offsets = l->offsets;
    in.num_ids = l->num_ids;
    in.weights = l->weights;
    return in;
}

/* want[b, width]: the pooled rows in float64 (concat or sum) */
static inline void tuk_tbe_reference(const tuk_table *t, const tuk_lookup *l, int nt, bool sum, int64_t batch,
                                     int32_t width, double *want)
{
    memset(want, 0, (size_t)batch * (size_t)width * sizeof(double));
    int32_t col = 0;
    for (int f = 0; f < nt; f++) {
        for (int64_t b = 0; b < batch; b++) {
            const int64_t i0 = l[f].offsets ? l[f].offsets[b] : b, i1 = l[f].offsets ? l[f].offsets[b + 1] : b + 1;
            const double scale = t[f].pooling == FLAME_POOLING_MEAN && i1 > i0 ? 1.0 / (double)(i1 - i0) : 1.0;
            for (int64_t i = i0; i < i1; i++) {
                const double w = scale * (l[f].weights ? (double)l[f].weights[i] : 1.0);
                for (int32_t j = 0; j < t[f].dim; j++)
                    want[b * width + (sum ? 0 : col) + j] += w * t[f].value[l[f].ids[i] * t[f].dim + j];
            }
        }
        col += t[f].dim;
    }
}

/* ---- attention */

/* A ragged batch: cumulative history and candidate counts (some sequences empty). */
typedef struct tuk_batch {
    int64_t num_seqs, rows;
    int64_t *cu_h, *cu_c;
} tuk_batch;

static inline void tuk_batch_fill(tuk_batch *b, int64_t num_seqs, int max_hist, int max_cand)
{
    b->num_seqs = num_seqs;
    b->cu_h = (int64_t *)malloc((size_t)(num_seqs + 1) * sizeof(int64_t));
    b->cu_c = (int64_t *)malloc((size_t)(num_seqs + 1) * sizeof(int64_t));
    b->cu_h[0] = b->cu_c[0] = 0;
    for (int64_t s = 0; s < num_seqs; s++) {
        const bool empty = tu_below(5) == 0;
        b->cu_h[s + 1] = b->cu_h[s] + (empty ? 0 : tu_below(max_hist + 1));
        b->cu_c[s + 1] = b->cu_c[s] + (empty ? 0 : tu_below(max_cand + 1));
    }
    b->rows = b->cu_h[num_seqs] + b->cu_c[num_seqs];
}

static inline void tuk_batch_free(tuk_batch *b)
{
    free(b->cu_h);
    free(b->cu_c);
}

/* want[rows, heads * dh] in float64 from q/k/v given as doubles with row strides */
static inline void tuk_attention_reference(const tuk_batch *b, flame_attention_mask mask, int32_t heads, int32_t dh,
                                           const double *q, int64_t ldq, const double *k, int64_t ldk,
                                           const double *v, int64_t ldv, double *want)
{
    const int64_t width = (int64_t)heads * dh;
    double *w = (double *)malloc((size_t)(b->rows + 1) * sizeof(double));
    for (int64_t s = 0; s < b->num_seqs; s++) {
        const int64_t n = b->cu_h[s + 1] - b->cu_h[s], m = b->cu_c[s + 1] - b->cu_c[s];
        const int64_t row0 = b->cu_h[s] + b->cu_c[s], len = n + m;
        for (int32_t h = 0; h < heads; h++)
            for (int64_t p = 0; p < len; p++) {
                double mx = -INFINITY;
                for (int64_t j = 0; j < len; j++) {
                    bool vis;
                    if (mask == FLAME_MASK_NONE)
                        vis = true;
                    else if (mask == FLAME_MASK_CAUSAL)
                        vis = j <= p;
                    else
                        vis = p < n ? j <= p : (j < n || j == p);
                    w[j] = -INFINITY;
                    if (!vis) continue;
                    double d = 0;
                    for (int32_t e = 0; e < dh; e++)
                        d += q[(row0 + p) * ldq + h * dh + e] * k[(row0 + j) * ldk + h * dh + e];
                    w[j] = d / sqrt((double)dh);
                    if (w[j] > mx) mx = w[j];
                }
                double sum = 0;
                for (int64_t j = 0; j < len; j++) {
                    w[j] = w[j] == -INFINITY ? 0.0 : exp(w[j] - mx);
                    sum += w[j];
                }
                for (int32_t e = 0; e < dh; e++) {
                    double o = 0;
                    for (int64_t j = 0; j < len; j++) o += w[j] * v[(row0 + j) * ldv + h * dh + e];
                    want[(row0 + p) * width + h * dh + e] = o / sum;
                }
            }
    }
    free(w);
}

#endif
