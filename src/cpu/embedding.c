/* Table-batched embedding bag on the CPU (contract in kernels.h). */
#include <string.h>

#include "cpu/kernels.h"

static inline void add_row(float *restrict dst, const float *restrict src, int32_t dim, float scale)
{
    for (int32_t j = 0; j < dim; j++) dst[j] += scale * src[j];
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
                add_row(dst, fe->table + fe->ids[t] * (int64_t)fe->dim, fe->dim, 1.0f);
                continue;
            }
            int64_t begin = fe->offsets[t], end = fe->offsets[t + 1];
            if (end == begin) continue; /* empty bag: zeros for sum and mean */
            /* mean pooling scales each row by 1/n rather than dividing the sum afterwards, so
             * a concatenated neighbour feature's columns are never touched */
            float scale = fe->pooling == FL_KPOOL_MEAN ? 1.0f / (float)(end - begin) : 1.0f;
            for (int64_t i = begin; i < end; i++) add_row(dst, fe->table + fe->ids[i] * (int64_t)fe->dim, fe->dim, scale);
        }
    }
}
