/* Table-batched embedding bag on the CPU (contract in kernels.h). */
#include <string.h>

#include "cpu/kernels.h"

static inline void add_row(float *restrict dst, const float *restrict src, int32_t dim, float scale)
{
    for (int32_t j = 0; j < dim; j++) dst[j] += scale * src[j];
}

/* An int8 row, dequantized on the fly: value = qscale * q + qbias (rounded to float32 as the
 * F32-dequantized table's value would be), then added with the pooling weight. */
static inline void add_row_q8(float *restrict dst, const int8_t *restrict q, int32_t dim, const float *qparams,
                              float scale)
{
    const float qscale = qparams[0], qbias = qparams[1];
    for (int32_t j = 0; j < dim; j++) {
        const float v = qscale * (float)q[j] + qbias;
        dst[j] += scale * v;
    }
}

static inline void add_id(const fl_emb_feature *fe, float *dst, int64_t id, float scale)
{
    if (fe->table_q8)
        add_row_q8(dst, fe->table_q8 + id * (int64_t)fe->dim, fe->dim, fe->qparams + 2 * id, scale);
    else if (fe->table_h16)
        fl_cpu_add_row_half(dst, fe->table_h16 + id * (int64_t)fe->dim, fe->dim, scale, fe->h16_kind);
    else
        add_row(dst, fe->table + id * (int64_t)fe->dim, fe->dim, scale);
}

/* Rows are gathered at random from tables far larger than the caches, so a lookup waits on
 * memory: the rows PF ids ahead (and an int8 row's scale and bias, which live in another
 * array) are prefetched, keeping several misses in flight. */
#define PF 8

static inline void prefetch_id(const fl_emb_feature *fe, int64_t id)
{
    const char *row;
    size_t bytes;
    if (fe->table_q8) {
        row = (const char *)(fe->table_q8 + id * (int64_t)fe->dim);
        bytes = (size_t)fe->dim;
        __builtin_prefetch(fe->qparams + 2 * id);
    } else if (fe->table_h16) {
        row = (const char *)(fe->table_h16 + id * (int64_t)fe->dim);
        bytes = (size_t)fe->dim * sizeof(uint16_t);
    } else {
        row = (const char *)(fe->table + id * (int64_t)fe->dim);
        bytes = (size_t)fe->dim * sizeof(float);
    }
    for (size_t k = 0; k < bytes; k += 64) __builtin_prefetch(row + k);
    __builtin_prefetch(row + bytes - 1);
}

void fl_cpu_embedding_bag(const fl_emb_feature *features, int num_features, int64_t num_tokens, float *out,
                          int64_t ldo, int32_t width)
{
    for (int64_t t = 0; t < num_tokens; t++) {
        float *row = out + t * ldo;
        memset(row, 0, (size_t)width * sizeof *row);
        for (int f = 0; f < num_features; f++) {
            const fl_emb_feature *fe = &features[f];
            float *dst = row + fe->out_col;
            if (!fe->offsets) {
                if (t == 0)
                    for (int64_t k = 0; k < PF && k < num_tokens; k++) prefetch_id(fe, fe->ids[k]);
                if (t + PF < num_tokens) prefetch_id(fe, fe->ids[t + PF]);
                add_id(fe, dst, fe->ids[t], 1.0f);
                continue;
            }
            int64_t begin = fe->offsets[t], end = fe->offsets[t + 1];
            if (end == begin) continue; /* empty bag: zeros for sum and mean */
            /* mean pooling scales each row by 1/n rather than dividing the sum afterwards, so
             * a concatenated neighbour feature's columns are never touched */
            float scale = fe->pooling == FL_KPOOL_MEAN ? 1.0f / (float)(end - begin) : 1.0f;
            for (int64_t i = begin; i < end && i < begin + PF; i++) prefetch_id(fe, fe->ids[i]);
            for (int64_t i = begin; i < end; i++) {
                if (i + PF < end) prefetch_id(fe, fe->ids[i + PF]);
                add_id(fe, dst, fe->ids[i], scale);
            }
        }
    }
}
