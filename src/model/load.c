/* flame_model_load: map, validate, bind weights (docs/model-format.md). */
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cpu/kernels.h"
#include "model/model.h"
#include "model/safetensors.h"

/* FLAME_ERR_FORMAT naming the tensor and the first NaN or Inf among its float32 values: one
 * such weight makes every score NaN. The blocks are scanned branch-free (vectorized); only a
 * block holding a bad value is searched for its index. */
static flame_status check_finite(const fl_st_tensor *t, const float *x, uint64_t count)
{
    const uint64_t block = 4096;
    for (uint64_t b0 = 0; b0 < count; b0 += block) {
        const uint64_t b1 = count - b0 < block ? count : b0 + block;
        uint32_t bad = 0;
        for (uint64_t i = b0; i < b1; i++) {
            uint32_t u;
            memcpy(&u, &x[i], 4);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
        if (!bad) continue;
        for (uint64_t i = b0; i < b1; i++) {
            if (isfinite(x[i])) continue;
            char at[64] = "";
            if (t->ndim == 2 && t->shape[1] > 0)
                snprintf(at, sizeof at, " (row %llu, column %llu)", (unsigned long long)(i / (uint64_t)t->shape[1]),
                         (unsigned long long)(i % (uint64_t)t->shape[1]));
            return fl_error(FLAME_ERR_FORMAT, "tensor '%s' (%s): value %llu%s is %g; weights must be finite", t->name,
                            t->dtype_name, (unsigned long long)i, at, (double)x[i]);
        }
    }
    return FLAME_OK;
}

/* Converts one tensor to float32 into an owned buffer, then drops the mapped pages it came
 * from so the model does not keep two copies resident. */
static flame_status convert(struct flame_model *m, const fl_st_file *f, const fl_st_tensor *t, const float **slot,
                            uint64_t count)
{
    float *dst = fl_aligned_alloc(count * sizeof(float));
    if (!dst) return fl_error(FLAME_ERR_NOMEM, "out of memory converting tensor '%s' (%llu floats)", t->name,
                              (unsigned long long)count);
    const uint8_t *src = f->data + t->begin;
    if (t->dtype == FL_DTYPE_F32)
        memcpy(dst, src, count * sizeof(float));
    else
        fl_cpu_widen_half(dst, src, (int64_t)count, t->dtype == FL_DTYPE_BF16 ? FL_HALF_BF16 : FL_HALF_F16);
    flame_status st = fl_model_own(m, dst);
    if (!st) st = check_finite(t, dst, count);
    if (st) return st;
    *slot = dst;
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)src + page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t hi = ((uintptr_t)src + (t->end - t->begin)) & ~(uintptr_t)(page - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
    return FLAME_OK;
}

/* FLAME_ERR_FORMAT unless t has exactly the shape [d0] (d1 == 0) or [d0, d1]. */
static flame_status check_shape(const fl_st_tensor *t, int64_t d0, int64_t d1)
{
    const int ndim = d1 > 0 ? 2 : 1;
    bool same = t->ndim == ndim && t->shape[0] == d0 && (ndim == 1 || t->shape[1] == d1);
    if (same) return FLAME_OK;
    char got[160] = "";
    for (int d = 0; d < t->ndim; d++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (ndim == 2)
        return fl_error(FLAME_ERR_FORMAT, "tensor '%s' has shape [%s], expected [%lld, %lld]", t->name, got,
                        (long long)d0, (long long)d1);
    return fl_error(FLAME_ERR_FORMAT, "tensor '%s' has shape [%s], expected [%lld]", t->name, got, (long long)d0);
}

/* An int8 table (docs/model-format.md, "int8 tables"): the I8 rows are used in the mapping,
 * and "tables.{name}.qparams" [rows, 2] F32 gives each row's scale and bias, checked finite
 * here (rows x 8 bytes, read once). */
static flame_status bind_q8_table(struct flame_model *m, fl_st_file *f, const fl_st_tensor *t, const fl_tensor_spec *s)
{
    const fl_table_cfg *tc = &m->cfg.tables[s->table];
    char name[96];
    snprintf(name, sizeof name, "tables.%s.qparams", tc->name);
    fl_st_tensor *qp = fl_st_find(f, name);
    if (!qp)
        return fl_error(FLAME_ERR_FORMAT, "missing tensor '%s': '%s' is I8, so it needs its per-row scale and bias "
                                          "([%lld, 2], F32)", name, t->name, (long long)tc->rows);
    qp->used = true;
    if (qp->dtype != FL_DTYPE_F32)
        return fl_error(FLAME_ERR_FORMAT, "tensor '%s' has dtype %s, expected F32 (the per-row scale and bias of '%s')",
                        name, qp->dtype_name, t->name);
    flame_status st = check_shape(qp, tc->rows, 2);
    if (st) return st;
    const uint8_t *src = f->data + qp->begin;
    const float *params = (const float *)src;
    if ((uintptr_t)src & 3) { /* misaligned: copied once */
        float *copy = fl_aligned_alloc((size_t)tc->rows * 2 * sizeof(float));
        if (!copy) return fl_error(FLAME_ERR_NOMEM, "out of memory copying tensor '%s'", name);
        memcpy(copy, src, (size_t)tc->rows * 2 * sizeof(float));
        if ((st = fl_model_own(m, copy))) return st;
        params = copy;
    }
    for (int64_t r = 0; r < tc->rows; r++) {
        for (int k = 0; k < 2; k++)
            if (!isfinite(params[2 * r + k]))
                return fl_error(FLAME_ERR_FORMAT, "tensor '%s': row %lld has a non-finite %s (%g)", name, (long long)r,
                                k ? "bias" : "scale", (double)params[2 * r + k]);
        /* every dequantized value scale * q + bias (|q| <= 128) must be a finite float32 */
        const double reach = 128.0 * fabs((double)params[2 * r]) + fabs((double)params[2 * r + 1]);
        if (reach > FLT_MAX)
            return fl_error(FLAME_ERR_FORMAT,
                            "tensor '%s': row %lld: scale %g and bias %g give values beyond float32 (|scale| * 128 + "
                            "|bias| = %g)",
                            name, (long long)r, (double)params[2 * r], (double)params[2 * r + 1], reach);
    }
    m->w.tables_q8[s->table] = (const int8_t *)(f->data + t->begin);
    m->w.qparams[s->table] = params;
    *s->slot = NULL; /* no float view: every reader dequantizes on the fly */
    m->weight_bytes += (uint64_t)tc->rows * (uint64_t)tc->dim + (uint64_t)tc->rows * 2 * sizeof(float);
    return FLAME_OK;
}

static flame_status bind(struct flame_model *m, fl_st_file *f, const fl_tensor_spec *s)
{
    fl_st_tensor *t = fl_st_find(f, s->name);
    if (!t) return fl_error(FLAME_ERR_FORMAT, "missing tensor '%s'", s->name);
    t->used = true;
    flame_status st = check_shape(t, s->shape[0], s->ndim == 2 ? s->shape[1] : 0);
    if (st) return st;
    if (t->dtype == FL_DTYPE_I8) {
        if (s->table < 0)
            return fl_error(FLAME_ERR_FORMAT, "tensor '%s' has dtype I8; only embedding tables (tables.<name>.weight) "
                                              "may be int8", s->name);
        return bind_q8_table(m, f, t, s);
    }
    uint64_t count = (uint64_t)s->shape[0] * (uint64_t)(s->ndim == 2 ? s->shape[1] : 1);
    m->weight_bytes += count * sizeof(float);
    const uint8_t *src = f->data + t->begin;
    if (t->dtype == FL_DTYPE_F32 && ((uintptr_t)src & 3) == 0) {
        *s->slot = (const float *)src; /* used in place: no copy */
        return check_finite(t, (const float *)src, count);
    }
    return convert(m, f, t, s->slot, count);
}

/* The error for a tensor nothing claimed; qparams of a float table get their own message. */
static flame_status unexpected(const struct flame_model *m, fl_st_file *f, const fl_st_tensor *t)
{
    const fl_model_cfg *c = &m->cfg;
    for (int i = 0; i < c->num_tables; i++) {
        char qname[96], wname[96];
        snprintf(qname, sizeof qname, "tables.%s.qparams", c->tables[i].name);
        if (strcmp(t->name, qname)) continue;
        snprintf(wname, sizeof wname, "tables.%s.weight", c->tables[i].name);
        const fl_st_tensor *w = fl_st_find(f, wname);
        return fl_error(FLAME_ERR_FORMAT, "unexpected tensor '%s': '%s' is %s, not I8 (only int8 tables have qparams)",
                        t->name, wname, w ? w->dtype_name : "absent");
    }
    return fl_error(FLAME_ERR_FORMAT, "unexpected tensor '%s' (not implied by flame.config)", t->name);
}

static flame_status bind_all(struct flame_model *m, fl_st_file *f)
{
    if (!f->config_json) return fl_error(FLAME_ERR_FORMAT, "no \"flame.config\" in __metadata__ (not a flame model; "
                                                           "see docs/model-format.md)");
    flame_status st = fl_config_parse(f->config_json, strlen(f->config_json), &m->cfg);
    if (st) return st;
    m->w.blocks = calloc(m->cfg.num_blocks ? m->cfg.num_blocks : 1, sizeof *m->w.blocks);
    size_t n = 0;
    fl_tensor_spec *specs = m->w.blocks ? fl_tensor_specs(m, &n) : NULL;
    if (!specs) return fl_error(FLAME_ERR_NOMEM, "out of memory listing model tensors");
    for (size_t i = 0; i < n && !st; i++) st = bind(m, f, &specs[i]);
    free(specs);
    for (size_t i = 0; i < f->num_tensors && !st; i++)
        if (!f->tensors[i].used) st = unexpected(m, f, &f->tensors[i]);
    if (!st) fl_model_finish(m);
    return st;
}

flame_status fl_model_load_file(struct flame_model *m, const char *path)
{
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; the S_ISREG check refuses it */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return fl_error(FLAME_ERR_IO, "cannot open: %s", strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return fl_error(FLAME_ERR_IO, "not a regular file");
    }
    if (sb.st_size < 8) {
        close(fd);
        return fl_error(FLAME_ERR_FORMAT, "file is %lld bytes, too short for a safetensors header",
                        (long long)sb.st_size);
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return fl_error(FLAME_ERR_IO, "cannot map: %s", strerror(errno));
    m->map = map;
    m->map_len = (size_t)sb.st_size;
    fl_st_file f;
    flame_status st = fl_st_parse(map, (uint64_t)sb.st_size, &f);
    if (st) return st;
    st = bind_all(m, &f);
    fl_st_free(&f);
    return st;
}

FLAME_API flame_status flame_model_load(const char *path, flame_model **out)
{
    fl_clear_error();
    if (out) *out = NULL;
    if (!path || !out) return fl_error(FLAME_ERR_INVALID_ARG, "flame_model_load: NULL path or out");
    struct flame_model *m = fl_model_alloc();
    if (!m) return fl_error(FLAME_ERR_NOMEM, "out of memory allocating a model");
    flame_status st = fl_model_load_file(m, path);
    if (st) {
        fl_model_release(m);
        char detail[1024];
        snprintf(detail, sizeof detail, "%s", flame_last_error());
        return fl_error(st, "'%s': %s", path, detail); /* every message names the file */
    }
    fl_log(FLAME_LOG_INFO, "loaded '%s': d_model %d, %d blocks, %llu weight bytes", path, m->cfg.d_model,
           m->cfg.num_blocks, (unsigned long long)m->weight_bytes);
    *out = m;
    return FLAME_OK;
}
