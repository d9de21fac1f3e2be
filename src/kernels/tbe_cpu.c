/* The CPU embedding bag of the public API. Unweighted lookups run the engine's kernel
 * (fl_cpu_embedding_bag) on slices of the batch, one per thread; per-id weights, which that
 * kernel does not take, run the loop below with the same float32 operations per row
 * (value = scale * q + bias for int8 rows, an fp16 or bf16 value widened exactly, then the
 * pooling weight times the value). An F16 or BF16 output is pooled in float32 a chunk of bags
 * at a time into the thread's scratch rows, which are then rounded into the output. */
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "core/pool.h"
#include "kernels/tbe_cpu.h"

/* Bags per thread below which a thread is not worth starting. */
#define MIN_BAGS_PER_THREAD 64
/* Threads that run at once at most (the pool's limit): the parts of a batch. */
#define MAX_PARTS 256
/* Floats of float32 rows a part pools before rounding them into an F16/BF16 output: 32 KiB,
 * so they are still in cache when read back (a single row may be wider). */
#define CHUNK_FLOATS 8192

static bool half_table(const fl_tbe_table *t)
{
    return t->dtype == FLAME_DTYPE_F16 || t->dtype == FLAME_DTYPE_BF16;
}

static fl_half_kind half_kind(flame_dtype d)
{
    return d == FLAME_DTYPE_BF16 ? FL_HALF_BF16 : FL_HALF_F16;
}

/* Bags b0..b1-1 into rows out[0..b1-b0) of stride ld. */
static void weighted(const fl_tbe_table *tables, int num_tables, const fl_tbe_lookup *lookups, int64_t b0,
                     int64_t b1, float *out, int64_t ld, int32_t width)
{
    for (int64_t b = b0; b < b1; b++) {
        float *row = out + (b - b0) * ld;
        memset(row, 0, (size_t)width * sizeof *row);
        for (int f = 0; f < num_tables; f++) {
            const fl_tbe_table *t = &tables[f];
            const fl_tbe_lookup *lk = &lookups[f];
            const int64_t i0 = lk->offsets ? lk->offsets[b] : b, i1 = lk->offsets ? lk->offsets[b + 1] : b + 1;
            if (i1 == i0) continue; /* empty bag: zeros for sum and mean */
            const float scale = t->pooling == FLAME_POOLING_MEAN ? 1.0f / (float)(i1 - i0) : 1.0f;
            float *restrict dst = row + t->col;
            for (int64_t i = i0; i < i1; i++) {
                const float w = lk->weights ? scale * lk->weights[i] : scale;
                const int64_t r = lk->ids[i];
                if (t->dtype == FLAME_DTYPE_INT8) {
                    const int8_t *restrict q = (const int8_t *)t->data + r * t->dim;
                    const float qs = t->qparams[2 * r], qb = t->qparams[2 * r + 1];
                    for (int32_t j = 0; j < t->dim; j++) dst[j] += w * (qs * (float)q[j] + qb);
                } else if (half_table(t)) {
                    fl_cpu_add_row_half(dst, (const uint16_t *)t->data + r * t->dim, t->dim, w, half_kind(t->dtype));
                } else {
                    const float *restrict src = (const float *)t->data + r * t->dim;
                    for (int32_t j = 0; j < t->dim; j++) dst[j] += w * src[j];
                }
            }
        }
    }
}

/* Bags b0..b1-1 into rows out[0..b1-b0) of stride ld. */
static void unweighted(const fl_tbe_table *tables, int num_tables, const fl_tbe_lookup *lookups, int64_t b0,
                       int64_t b1, float *out, int64_t ld, int32_t width)
{
    fl_emb_feature fe[FL_TBE_MAX_TABLES];
    for (int f = 0; f < num_tables; f++) {
        const fl_tbe_table *t = &tables[f];
        const fl_tbe_lookup *lk = &lookups[f];
        const bool q8 = t->dtype == FLAME_DTYPE_INT8, h16 = half_table(t);
        /* the kernel indexes offsets and ids by bag from its own 0: a slice starts at bag b0
         * (offsets keep their absolute values into ids) */
        fe[f] = (fl_emb_feature){
            .table = q8 || h16 ? NULL : (const float *)t->data,
            .rows = t->rows,
            .dim = t->dim,
            .pooling = t->pooling == FLAME_POOLING_MEAN ? FL_KPOOL_MEAN : FL_KPOOL_SUM,
            .offsets = lk->offsets ? lk->offsets + b0 : NULL,
            .ids = lk->offsets ? lk->ids : lk->ids + b0,
            .out_col = t->col,
            .table_q8 = q8 ? (const int8_t *)t->data : NULL,
            .qparams = q8 ? t->qparams : NULL,
            .table_h16 = h16 ? (const uint16_t *)t->data : NULL,
            .h16_kind = half_kind(t->dtype),
        };
    }
    fl_cpu_embedding_bag(fe, num_tables, b1 - b0, out, ld, width);
}

typedef struct tbe_job {
    const fl_tbe_table *tables;
    const fl_tbe_lookup *lookups;
    int num_tables;
    bool any_weights;
    int64_t batch, parts, ld;
    int32_t width;
    void *out;
    flame_dtype out_dtype;
    float *scratch; /* F16/BF16 output: chunk rows of width floats per part */
    int64_t chunk;
} tbe_job;

static void pool_rows(const tbe_job *j, int64_t b0, int64_t b1, float *rows, int64_t ld)
{
    if (j->any_weights)
        weighted(j->tables, j->num_tables, j->lookups, b0, b1, rows, ld, j->width);
    else
        unweighted(j->tables, j->num_tables, j->lookups, b0, b1, rows, ld, j->width);
}

static void tbe_part(void *ctx, int64_t p, int worker)
{
    const tbe_job *j = ctx;
    (void)worker;
    const int64_t b0 = j->batch * p / j->parts, b1 = j->batch * (p + 1) / j->parts;
    if (j->out_dtype == FLAME_DTYPE_F32) {
        pool_rows(j, b0, b1, (float *)j->out + b0 * j->ld, j->ld);
        return;
    }
    float *rows = j->scratch + (size_t)p * (size_t)j->chunk * (size_t)j->width;
    const fl_half_kind kind = half_kind(j->out_dtype);
    for (int64_t c0 = b0; c0 < b1; c0 += j->chunk) {
        const int64_t c1 = c0 + j->chunk < b1 ? c0 + j->chunk : b1;
        pool_rows(j, c0, c1, rows, j->width);
        for (int64_t b = c0; b < c1; b++)
            fl_cpu_round_half((uint16_t *)j->out + b * j->ld, rows + (b - c0) * j->width, j->width, kind);
    }
}

flame_status fl_tbe_cpu_forward(const fl_tbe_table *tables, int num_tables, const fl_tbe_lookup *lookups,
                                int64_t batch, void *out, int64_t ld, flame_dtype out_dtype, int32_t width,
                                int threads)
{
    bool any_weights = false;
    for (int f = 0; f < num_tables; f++) any_weights = any_weights || lookups[f].weights;
    int64_t parts = batch / MIN_BAGS_PER_THREAD;
    parts = parts < 1 ? 1 : parts > threads ? threads : parts;
    if (parts > MAX_PARTS) parts = MAX_PARTS;
    tbe_job j = {.tables = tables, .lookups = lookups, .num_tables = num_tables, .any_weights = any_weights,
                 .batch = batch, .parts = parts, .ld = ld, .width = width, .out = out, .out_dtype = out_dtype};
    if (out_dtype != FLAME_DTYPE_F32) {
        j.chunk = width < CHUNK_FLOATS ? CHUNK_FLOATS / width : 1;
        const size_t floats = (size_t)parts * (size_t)j.chunk * (size_t)width;
        if (!(j.scratch = malloc(floats * sizeof(float))))
            return fl_error(FLAME_ERR_NOMEM, "embedding bag: %zu bytes of float32 rows for a %s output",
                            floats * sizeof(float), out_dtype == FLAME_DTYPE_F16 ? "F16" : "BF16");
    }
    /* contiguous bag ranges, one task each, on libflame's pool (a bag's sum is the same code
     * whichever thread runs it, and so is its rounding) */
    fl_parallel((int)parts, parts, tbe_part, &j);
    free(j.scratch);
    return FLAME_OK;
}
