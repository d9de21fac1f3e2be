/* Writes an in-memory model (a random one) as a flame model file, some of its tables int8
 * row-wise quantized (docs/model-format.md, "int8 tables"). Tests only: reads the model's
 * internal float views, so it includes the library's private headers. */
#ifndef FLAME_TU_MODEL_FILE_H
#define FLAME_TU_MODEL_FILE_H

#include "testutil.h"
#include "model/model.h"

/* Row-wise min/max quantization, as flame.quant.quantize_rows does: scale = (max - min) / 255,
 * bias = min + 128 scale, q = round((x - bias) / scale) clamped to [-128, 127]; a constant row
 * gets scale 0, bias = its value, q = 0. */
static inline void tu_quantize_row(const float *x, int32_t dim, int8_t *q, float *scale, float *bias)
{
    float lo = x[0], hi = x[0];
    for (int32_t j = 1; j < dim; j++) {
        lo = x[j] < lo ? x[j] : lo;
        hi = x[j] > hi ? x[j] : hi;
    }
    *scale = (float)(((double)hi - lo) / 255.0);
    if (*scale == 0.0f) {
        *bias = lo;
        memset(q, 0, (size_t)dim);
        return;
    }
    *bias = (float)((double)lo + 128.0 * *scale);
    for (int32_t j = 0; j < dim; j++) {
        double v = nearbyint(((double)x[j] - *bias) / *scale);
        q[j] = (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v);
    }
}

/* The float32 value an int8 entry stands for, computed as the engine does. */
static inline float tu_dequantize(int8_t q, float scale, float bias)
{
    return scale * (float)q + bias;
}

typedef struct tu_tensor_out {
    char name[112];
    const char *dtype;
    int64_t shape[2];
    int ndim;
    void *data; /* owned */
    size_t bytes;
} tu_tensor_out;

/* Writes model `m` (created from config text `cfg`) to tu_tmpdir()/name and returns the path
 * (a static buffer). Table t is quantized when bit t of q8_mask is set: stored as I8 rows plus
 * "tables.{name}.qparams", or, with `dequantized`, stored as F32 holding the dequantized values
 * (the same model as a float file). Everything else is F32. F32 tensors come first, then the
 * I8 ones, with no holes (as safetensors writers lay them out). */
static inline const char *tu_write_model(const char *name, flame_model *model, const char *cfg, uint64_t q8_mask,
                                         bool dequantized)
{
    struct flame_model *m = model;
    size_t n = 0;
    fl_tensor_spec *specs = fl_tensor_specs(m, &n);
    if (!specs) abort();
    tu_tensor_out *outs = calloc(2 * n, sizeof *outs);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const fl_tensor_spec *s = &specs[i];
        const size_t count = (size_t)s->shape[0] * (size_t)(s->ndim == 2 ? s->shape[1] : 1);
        const float *src = *s->slot;
        if (!src) abort(); /* a float model only */
        if (s->table < 0 || !(q8_mask >> s->table & 1)) {
            tu_tensor_out o = {.dtype = "F32", .shape = {s->shape[0], s->shape[1]}, .ndim = s->ndim,
                               .data = malloc(count * 4), .bytes = count * 4};
            snprintf(o.name, sizeof o.name, "%s", s->name);
            memcpy(o.data, src, count * 4);
            outs[k++] = o;
            continue;
        }
        const int64_t rows = s->shape[0];
        const int32_t dim = (int32_t)s->shape[1];
        int8_t *q = malloc(count + 1);
        float *qp = malloc((size_t)rows * 2 * sizeof(float));
        for (int64_t r = 0; r < rows; r++) tu_quantize_row(src + r * dim, dim, q + r * dim, &qp[2 * r], &qp[2 * r + 1]);
        if (dequantized) {
            float *v = malloc(count * 4);
            for (int64_t r = 0; r < rows; r++)
                for (int32_t j = 0; j < dim; j++) v[r * dim + j] = tu_dequantize(q[r * dim + j], qp[2 * r], qp[2 * r + 1]);
            tu_tensor_out o = {.dtype = "F32", .shape = {rows, dim}, .ndim = 2, .data = v, .bytes = count * 4};
            snprintf(o.name, sizeof o.name, "%s", s->name);
            outs[k++] = o;
            free(q);
            free(qp);
            continue;
        }
        tu_tensor_out w = {.dtype = "I8", .shape = {rows, dim}, .ndim = 2, .data = q, .bytes = count};
        snprintf(w.name, sizeof w.name, "%s", s->name);
        tu_tensor_out p = {.dtype = "F32", .shape = {rows, 2}, .ndim = 2, .data = qp, .bytes = (size_t)rows * 8};
        snprintf(p.name, sizeof p.name, "tables.%s.qparams", m->cfg.tables[s->table].name);
        outs[k++] = w;
        outs[k++] = p;
    }
    free(specs);
    /* the header: F32 first, then I8 */
    size_t cap = 4096 + strlen(cfg) * 2 + k * 256, len = 0;
    char *h = malloc(cap);
    len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"flame.config\":\"");
    for (const char *c = cfg; *c; c++) {
        if (*c == '"' || *c == '\\') h[len++] = '\\';
        h[len++] = *c;
    }
    len += (size_t)snprintf(h + len, cap - len, "\"}");
    uint64_t off = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < k; i++) {
            if ((strcmp(outs[i].dtype, "I8") == 0) != (pass == 1)) continue;
            len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", outs[i].name,
                                    outs[i].dtype, (long long)outs[i].shape[0]);
            if (outs[i].ndim == 2) len += (size_t)snprintf(h + len, cap - len, ",%lld", (long long)outs[i].shape[1]);
            len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                                    (unsigned long long)(off + outs[i].bytes));
            off += outs[i].bytes;
        }
    len += (size_t)snprintf(h + len, cap - len, "}");
    uint8_t *data = malloc(off + 1);
    size_t at = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < k; i++) {
            if ((strcmp(outs[i].dtype, "I8") == 0) != (pass == 1)) continue;
            memcpy(data + at, outs[i].data, outs[i].bytes);
            at += outs[i].bytes;
        }
    const char *path = tu_write_st(name, h, 0, data, off);
    for (size_t i = 0; i < k; i++) free(outs[i].data);
    free(outs);
    free(h);
    free(data);
    return path;
}

#endif
