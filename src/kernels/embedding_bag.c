/* The public embedding bag (flame/kernels.h): the handle, the validation of every table and
 * lookup on the host, and the CPU path; the GPU path is in cuda/kernels_api.cu. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/abi.h"
#include "cpu/kernels.h"
#include "kernels/kernels_gpu.h"
#include "kernels/tbe_cpu.h"
#include "kernels/tbe_pack.h"

#define MAX_ROWS (INT64_C(1) << 40)
#define MAX_DIM 16384
#define MAX_THREADS 1024

struct flame_embedding_bag {
    int32_t device;
    bool sum_combine;
    int32_t num_tables;
    int32_t width;
    fl_tbe_table t[FL_TBE_MAX_TABLES];
    pthread_rwlock_t lock; /* CPU: forwards read, updates write */
    /* GPU: the device_indices forwards' index record, its host mirror and the lock of its reads */
    fl_tbe_index_record *record, *mirror;
    pthread_mutex_t record_lock;
};

static bool cpu_device(const flame_embedding_bag *b)
{
    return b->device == FLAME_DEVICE_CPU;
}

static size_t dtype_bytes(flame_dtype d)
{
    return d == FLAME_DTYPE_F32 ? 4 : d == FLAME_DTYPE_INT8 ? 1 : 2;
}

/* The dtype's name, or its number when it is none of them (buf: the caller's, for that case). */
static const char *dtype_name_in(flame_dtype d, char buf[24])
{
    switch (d) {
    case FLAME_DTYPE_F32: return "F32";
    case FLAME_DTYPE_F16: return "F16";
    case FLAME_DTYPE_BF16: return "BF16";
    case FLAME_DTYPE_INT8: return "INT8";
    }
    snprintf(buf, 24, "%d (unknown)", (int)d);
    return buf;
}
#define dtype_name(d) dtype_name_in((d), (char[24]){0})

/* An array the kernels load as typed elements must be aligned to them (misaligned: undefined
 * behaviour on a CPU, a fault on a GPU). table < 0: not a table's. */
static flame_status check_aligned(const char *who, int table, const char *name, const void *p, size_t align)
{
    if (!fl_misaligned(p, align)) return FLAME_OK;
    if (table < 0)
        return fl_error(FLAME_ERR_INVALID_ARG, "%s: %s is not aligned to its %zu-byte elements (address %p)", who, name,
                        align, p);
    return fl_error(FLAME_ERR_INVALID_ARG, "%s: table %d: %s is not aligned to its %zu-byte elements (address %p)", who,
                    table, name, align, p);
}

static flame_status check_qparams(int32_t table, int64_t first_row, const float *qp, int64_t n)
{
    for (int64_t i = 0; i < 2 * n; i++)
        if (!isfinite(qp[i]))
            return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %d row %lld: %s %g is not finite", table,
                            (long long)(first_row + i / 2), i % 2 ? "bias" : "scale", (double)qp[i]);
    return FLAME_OK;
}

static void free_tables(flame_embedding_bag *b)
{
    for (int i = 0; i < b->num_tables; i++) {
        fl_tbe_table *t = &b->t[i];
        if (!t->owned) continue;
        if (b->device == FLAME_DEVICE_CPU) {
            fl_aligned_free(t->data);
            fl_aligned_free(t->qparams);
        } else {
            fl_gpu_kernels_free(b->device, t->data);
            fl_gpu_kernels_free(b->device, t->qparams);
        }
    }
}

/* Copies (or borrows) table i's memory into the handle's form. */
static flame_status take_table(flame_embedding_bag *b, int i, const flame_embedding_table *in, bool borrow)
{
    fl_tbe_table *t = &b->t[i];
    const bool cpu = b->device == FLAME_DEVICE_CPU;
    t->dtype = in->dtype;
    t->pooling = in->pooling;
    t->rows = in->rows;
    t->dim = in->dim;
    const size_t n = (size_t)in->rows * (size_t)in->dim;
    if (borrow) {
        if (!cpu) { /* a host pointer would fault in the kernel: refused now */
            char what[64];
            snprintf(what, sizeof what, "table %d data", i);
            flame_status st = fl_gpu_kernels_check_pointer(b->device, in->data, what);
            snprintf(what, sizeof what, "table %d qparams", i);
            if (!st && in->qparams) st = fl_gpu_kernels_check_pointer(b->device, in->qparams, what);
            if (st) return st;
        }
        t->data = (void *)in->data;
        t->qparams = (float *)in->qparams;
        t->owned = false;
        return FLAME_OK;
    }
    t->owned = true;
    if (cpu) {
        t->data = fl_aligned_alloc(n * dtype_bytes(t->dtype));
        t->qparams = in->qparams ? fl_aligned_alloc((size_t)in->rows * 2 * sizeof(float)) : NULL;
        if (!t->data || (in->qparams && !t->qparams))
            return fl_error(FLAME_ERR_NOMEM, "embedding bag: table %d: %zu bytes", i, n * dtype_bytes(t->dtype));
        memcpy(t->data, in->data, n * dtype_bytes(t->dtype));
        if (in->qparams) memcpy(t->qparams, in->qparams, (size_t)in->rows * 2 * sizeof(float));
        return FLAME_OK;
    }
    flame_status st = fl_gpu_kernels_upload(b->device, in->data, n * dtype_bytes(t->dtype), &t->data);
    if (!st && in->qparams)
        st = fl_gpu_kernels_upload(b->device, in->qparams, (size_t)in->rows * 2 * sizeof(float), (void **)&t->qparams);
    return st;
}

flame_status flame_embedding_bag_create(const flame_embedding_bag_params *params, flame_embedding_bag **out)
{
    fl_clear_error();
    if (out) *out = NULL;
    if (!params || !out) return fl_error(FLAME_ERR_INVALID_ARG, "flame_embedding_bag_create: NULL params or out");
    flame_embedding_bag_params p = {0};
    flame_status st = fl_struct_in("flame_embedding_bag_params", &p, sizeof p, params);
    if (st) return st;
    if (p.device < FLAME_DEVICE_CPU)
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: device %d (FLAME_DEVICE_CPU or a CUDA device index)",
                        p.device);
    if (p.combine != FLAME_COMBINE_CONCAT && p.combine != FLAME_COMBINE_SUM)
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: combine %d is neither CONCAT (0) nor SUM (1)",
                        (int)p.combine);
    if (p.borrow != 0 && p.borrow != 1)
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: borrow %d (0 or 1)", p.borrow);
    if (p.num_tables < 1 || p.num_tables > FL_TBE_MAX_TABLES)
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: num_tables %zu is outside 1..%d", p.num_tables,
                        FL_TBE_MAX_TABLES);
    if (!p.tables) return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: tables is NULL");
    const size_t stride = fl_struct_size_of(p.tables);
    if ((st = fl_struct_size_check("flame_embedding_table", stride, sizeof(flame_embedding_table)))) return st;
    flame_embedding_table tabs[FL_TBE_MAX_TABLES];
    int64_t width = 0;
    flame_dtype float_dtype = FLAME_DTYPE_INT8; /* the float tables' dtype on a GPU; INT8: none yet */
    for (size_t i = 0; i < p.num_tables; i++) {
        const void *src = (const char *)p.tables + i * stride;
        if (fl_struct_size_of(src) != stride)
            return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: tables[%zu].struct_size %zu differs from tables[0]'s %zu",
                            i, fl_struct_size_of(src), stride);
        flame_embedding_table *t = &tabs[i];
        memset(t, 0, sizeof *t);
        if ((st = fl_struct_in("flame_embedding_table", t, sizeof *t, src))) return st;
        if ((unsigned)t->dtype > FLAME_DTYPE_INT8)
            return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %zu: dtype %d is unknown", i, (int)t->dtype);
        if (t->pooling != FLAME_POOLING_SUM && t->pooling != FLAME_POOLING_MEAN)
            return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %zu: pooling %d is neither SUM nor MEAN", i,
                            (int)t->pooling);
        if (t->rows < 1 || t->rows > MAX_ROWS)
            return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %zu: rows %lld is outside 1..2^40", i,
                            (long long)t->rows);
        if (t->dim < 1 || t->dim > MAX_DIM)
            return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %zu: dim %d is outside 1..%d", i, t->dim,
                            MAX_DIM);
        if (!t->data) return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %zu: data is NULL", i);
        if ((st = check_aligned("embedding bag", (int)i, "data", t->data, dtype_bytes(t->dtype))) ||
            (st = check_aligned("embedding bag", (int)i, "qparams", t->qparams, sizeof(float))))
            return st;
        if ((t->dtype == FLAME_DTYPE_INT8) != (t->qparams != NULL))
            return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %zu: qparams %s for a %s table", i,
                            t->qparams ? "given" : "missing", dtype_name(t->dtype));
        /* host-readable scales and biases are checked (borrowed device memory is the caller's) */
        if (t->qparams && !(p.borrow && p.device != FLAME_DEVICE_CPU) &&
            (st = check_qparams((int32_t)i, 0, t->qparams, t->rows)))
            return st;
        if (p.combine == FLAME_COMBINE_SUM && t->dim != tabs[0].dim)
            return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %zu: dim %d differs from table 0's %d under "
                            "SUM combine", i, t->dim, tabs[0].dim);
        width = p.combine == FLAME_COMBINE_SUM ? t->dim : width + t->dim;
        if (p.device != FLAME_DEVICE_CPU && t->dtype != FLAME_DTYPE_INT8) {
            if (float_dtype != FLAME_DTYPE_INT8 && float_dtype != t->dtype)
                return fl_error(FLAME_ERR_UNSUPPORTED, "embedding bag: table %zu is %s, an earlier float table %s (a GPU "
                                "handle's float tables share one dtype)", i, dtype_name(t->dtype), dtype_name(float_dtype));
            float_dtype = t->dtype;
        }
    }
    if (width > INT32_MAX / 2)
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: output width %lld is too large", (long long)width);
    if (p.device != FLAME_DEVICE_CPU && (st = fl_gpu_kernels_device(p.device))) return st;

    flame_embedding_bag *b = calloc(1, sizeof *b);
    if (!b) return fl_error(FLAME_ERR_NOMEM, "embedding bag: handle");
    b->device = p.device;
    b->sum_combine = p.combine == FLAME_COMBINE_SUM;
    b->width = (int32_t)width;
    int32_t col = 0;
    for (size_t i = 0; i < p.num_tables; i++) {
        b->num_tables = (int32_t)i + 1; /* what free_tables may need to free */
        if ((st = take_table(b, (int)i, &tabs[i], p.borrow == 1))) {
            free_tables(b);
            free(b);
            return st;
        }
        b->t[i].col = b->sum_combine ? 0 : col;
        col += tabs[i].dim;
    }
    if (!cpu_device(b) && (st = fl_gpu_tbe_record_create(b->device, &b->record, &b->mirror))) {
        free_tables(b);
        free(b);
        return st;
    }
    if (pthread_rwlock_init(&b->lock, NULL)) {
        fl_gpu_tbe_record_free(b->device, b->record, b->mirror);
        free_tables(b);
        free(b);
        return fl_error(FLAME_ERR_NOMEM, "embedding bag: lock");
    }
    if (pthread_mutex_init(&b->record_lock, NULL)) {
        pthread_rwlock_destroy(&b->lock);
        fl_gpu_tbe_record_free(b->device, b->record, b->mirror);
        free_tables(b);
        free(b);
        return fl_error(FLAME_ERR_NOMEM, "embedding bag: lock");
    }
    *out = b;
    return FLAME_OK;
}

void flame_embedding_bag_destroy(flame_embedding_bag *bag)
{
    if (!bag) return;
    if (!cpu_device(bag)) fl_gpu_tbe_record_free(bag->device, bag->record, bag->mirror);
    free_tables(bag);
    pthread_rwlock_destroy(&bag->lock);
    pthread_mutex_destroy(&bag->record_lock);
    free(bag);
}

int64_t flame_embedding_bag_width(const flame_embedding_bag *bag)
{
    return bag ? bag->width : 0;
}

/* The lengths of table t's device-resident lookups (their values are checked on the device). */
static flame_status check_device_lookup(int t, const fl_tbe_lookup *lk, int64_t batch)
{
    if (lk->num_ids < 0) /* (above 2^47: refused for both kinds of indices in the forward) */
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %d: num_ids %lld is outside 0..2^47", t,
                        (long long)lk->num_ids);
    if (lk->num_ids > 0 && !lk->ids)
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %d: ids is NULL with num_ids %lld", t,
                        (long long)lk->num_ids);
    if (!lk->offsets && lk->num_ids != batch)
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %d: num_ids %lld without offsets (one id per "
                        "bag) must equal batch %lld", t, (long long)lk->num_ids, (long long)batch);
    return FLAME_OK;
}

/* out's extent, and out against every array the forward reads: rows are written while later
 * bags still read their offsets, ids and weights (and the tables), so an output over any of
 * them would change indices after they were checked. */
static flame_status check_out(const flame_embedding_bag *bag, const flame_embedding_bag_batch *q,
                              const fl_tbe_lookup *lk, int64_t ld)
{
    if (fl_product_exceeds(q->batch, ld, INT64_C(1) << 50))
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: batch %lld x ld_out %lld exceeds 2^50 elements",
                        (long long)q->batch, (long long)ld);
    const size_t out_bytes = ((size_t)(q->batch - 1) * (size_t)ld + (size_t)bag->width) * dtype_bytes(q->out_dtype);
    for (int t = 0; t < bag->num_tables; t++) {
        const fl_tbe_lookup *l = &lk[t];
        const fl_tbe_table *tb = &bag->t[t];
        const struct {
            const char *name;
            const void *p;
            size_t bytes;
        } in[5] = {{"ids", l->ids, (size_t)l->num_ids * sizeof(int64_t)},
                   {"offsets", l->offsets, l->offsets ? (size_t)(q->batch + 1) * sizeof(int64_t) : 0},
                   {"weights", l->weights, l->weights ? (size_t)l->num_ids * sizeof(float) : 0},
                   {"table", tb->data, (size_t)tb->rows * (size_t)tb->dim * dtype_bytes(tb->dtype)},
                   {"qparams", tb->qparams, tb->qparams ? (size_t)tb->rows * 2 * sizeof(float) : 0}};
        for (int i = 0; i < 5; i++)
            if (fl_ranges_overlap(q->out, out_bytes, in[i].p, in[i].bytes))
                return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: out overlaps table %d's %s", t, in[i].name);
    }
    return FLAME_OK;
}

flame_status flame_embedding_bag_forward(flame_embedding_bag *bag, const flame_embedding_bag_batch *batch)
{
    fl_clear_error();
    if (!bag || !batch) return fl_error(FLAME_ERR_INVALID_ARG, "flame_embedding_bag_forward: NULL bag or batch");
    flame_embedding_bag_batch q = {0};
    flame_status st = fl_struct_in("flame_embedding_bag_batch", &q, sizeof q, batch);
    if (st) return st;
    if (q.batch < 0 || q.batch > INT32_MAX)
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: batch %lld is outside 0..2^31-1", (long long)q.batch);
    if (q.num_inputs != (size_t)bag->num_tables)
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: num_inputs %zu, the handle has %d tables", q.num_inputs,
                        bag->num_tables);
    if (!q.inputs) return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: inputs is NULL");
    const bool cpu = bag->device == FLAME_DEVICE_CPU;
    if (q.out_dtype != FLAME_DTYPE_F32 && q.out_dtype != FLAME_DTYPE_F16 && q.out_dtype != FLAME_DTYPE_BF16)
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: out_dtype %s is not written by the %s (F32, F16 or BF16)",
                        dtype_name(q.out_dtype), cpu ? "CPU" : "GPU");
    const int64_t ld = q.ld_out ? q.ld_out : bag->width;
    if (ld < bag->width || ld > (INT64_C(1) << 40))
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: ld_out %lld is outside width %d..2^40",
                        (long long)q.ld_out, bag->width);
    if (q.threads < 0 || q.threads > MAX_THREADS)
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: threads %d is outside 0..%d", q.threads, MAX_THREADS);
    if (q.device_indices != 0 && q.device_indices != 1)
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: device_indices %lld (0 or 1)",
                        (long long)q.device_indices);
    const bool on_device = q.device_indices == 1 && !cpu; /* a CPU handle's indices are host memory */
    const size_t stride = fl_struct_size_of(q.inputs);
    if ((st = fl_struct_size_check("flame_embedding_bag_input", stride, sizeof(flame_embedding_bag_input)))) return st;
    fl_tbe_lookup lk[FL_TBE_MAX_TABLES];
    for (int t = 0; t < bag->num_tables; t++) {
        const void *src = (const char *)q.inputs + (size_t)t * stride;
        if (fl_struct_size_of(src) != stride)
            return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: inputs[%d].struct_size %zu differs from inputs[0]'s %zu",
                            t, fl_struct_size_of(src), stride);
        flame_embedding_bag_input in = {0};
        if ((st = fl_struct_in("flame_embedding_bag_input", &in, sizeof in, src))) return st;
        lk[t] = (fl_tbe_lookup){in.ids, in.offsets, in.num_ids, in.weights};
        if ((st = check_aligned("embedding bag", t, "ids", in.ids, sizeof(int64_t))) ||
            (st = check_aligned("embedding bag", t, "offsets", in.offsets, sizeof(int64_t))) ||
            (st = check_aligned("embedding bag", t, "weights", in.weights, sizeof(float))))
            return st;
        if (in.num_ids > (INT64_C(1) << 47)) /* (a negative one: each path's own checks) */
            return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %d: num_ids %lld is outside 0..2^47", t,
                            (long long)in.num_ids);
        if (on_device && (st = check_device_lookup(t, &lk[t], q.batch))) return st;
    }
    const int threads = q.threads ? q.threads : 1;
    /* host indices: checked here, except where a GPU forward checks them as it stages them */
    if (!on_device && (cpu || q.batch == 0 || !q.out) &&
        (st = fl_tbe_check_pack(bag->t, lk, bag->num_tables, q.batch, NULL, NULL, threads)))
        return st;
    if (q.batch == 0) return FLAME_OK; /* nothing to write or launch */
    if (!q.out) return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: out is NULL with batch %lld", (long long)q.batch);
    if ((st = check_aligned("embedding bag", -1, "out", q.out, dtype_bytes(q.out_dtype))) ||
        (st = check_out(bag, &q, lk, ld)))
        return st;
    if (on_device)
        return fl_gpu_tbe_forward_device(bag->device, bag->t, bag->num_tables, bag->sum_combine, bag->width, lk,
                                         q.batch, q.out, ld, q.out_dtype, q.cuda_stream, bag->record);
    if (!cpu)
        return fl_gpu_tbe_forward(bag->device, bag->t, bag->num_tables, bag->sum_combine, bag->width, lk, q.batch,
                                  q.out, ld, q.out_dtype, q.cuda_stream, threads);
    pthread_rwlock_rdlock(&bag->lock);
    st = fl_tbe_cpu_forward(bag->t, bag->num_tables, lk, q.batch, q.out, ld, q.out_dtype, bag->width, threads);
    pthread_rwlock_unlock(&bag->lock);
    return st;
}

flame_status flame_embedding_bag_index_status(flame_embedding_bag *bag, void *cuda_stream)
{
    fl_clear_error();
    if (!bag) return fl_error(FLAME_ERR_INVALID_ARG, "flame_embedding_bag_index_status: NULL bag");
    if (cpu_device(bag)) return FLAME_OK;
    pthread_mutex_lock(&bag->record_lock);
    flame_status st = fl_gpu_tbe_record_read(bag->device, bag->record, bag->mirror, cuda_stream);
    fl_tbe_index_record r = *bag->mirror;
    pthread_mutex_unlock(&bag->record_lock);
    if (st) return st;
    if (r.key == UINT64_MAX) return FLAME_OK;
    if (r.detail_key != r.key) /* the validation launch describes its key before it ends */
        return fl_error(FLAME_ERR_INTERNAL, "embedding bag: index record key %llx undescribed",
                        (unsigned long long)r.key);
    return fl_tbe_index_error(&r, r.table >= 0 && r.table < bag->num_tables ? bag->t[r.table].rows : 0);
}

flame_status flame_embedding_bag_update_rows(flame_embedding_bag *bag, int32_t table, int64_t first_row,
                                             int64_t num_rows, const void *values, flame_dtype values_dtype,
                                             const float *qparams, void *cuda_stream)
{
    fl_clear_error();
    if (!bag) return fl_error(FLAME_ERR_INVALID_ARG, "flame_embedding_bag_update_rows: NULL bag");
    if (table < 0 || table >= bag->num_tables)
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag update: table %d is outside 0..%d", table,
                        bag->num_tables - 1);
    fl_tbe_table *t = &bag->t[table];
    if (first_row < 0 || num_rows < 0 || first_row > t->rows || num_rows > t->rows - first_row) {
        int64_t last;
        if (num_rows == INT64_MIN || __builtin_add_overflow(first_row, num_rows - 1, &last))
            return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag update: table %d: first_row %lld with num_rows %lld "
                            "is not within 0..%lld", table, (long long)first_row, (long long)num_rows,
                            (long long)(t->rows - 1));
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag update: table %d: rows %lld..%lld (%lld rows) are not "
                        "within 0..%lld", table, (long long)first_row, (long long)last, (long long)num_rows,
                        (long long)(t->rows - 1));
    }
    if (values_dtype != t->dtype)
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag update: table %d is %s, values_dtype %s", table,
                        dtype_name(t->dtype), dtype_name(values_dtype));
    if ((t->dtype == FLAME_DTYPE_INT8) != (qparams != NULL))
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag update: table %d: qparams %s for a %s table", table,
                        qparams ? "given" : "missing", dtype_name(t->dtype));
    if (num_rows == 0) return FLAME_OK;
    if (!values) return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag update: table %d: values is NULL", table);
    flame_status st;
    if ((st = check_aligned("embedding bag update", table, "values", values, dtype_bytes(t->dtype))) ||
        (st = check_aligned("embedding bag update", table, "qparams", qparams, sizeof(float))))
        return st;
    if (qparams && (st = check_qparams(table, first_row, qparams, num_rows))) return st;
    const size_t n = (size_t)num_rows * (size_t)t->dim, at = (size_t)first_row * (size_t)t->dim;
    const size_t esize = dtype_bytes(t->dtype);
    /* values or qparams over any part of the rows they replace (their values or their qparams):
     * a copy would read what it already wrote, or the checked qparams would be replaced by
     * values copied over them */
    const size_t qp_bytes = (size_t)num_rows * 2 * sizeof(float);
    const struct {
        const char *name;
        const void *p;
        size_t bytes;
    } src[2] = {{"values", values, n * dtype_bytes(t->dtype)}, {"qparams", qparams, qparams ? qp_bytes : 0}},
      dst[2] = {{"values", (char *)t->data + at * esize, n * esize},
                {"qparams", t->qparams ? t->qparams + 2 * first_row : NULL, t->qparams ? qp_bytes : 0}};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            if (fl_ranges_overlap(src[i].p, src[i].bytes, dst[j].p, dst[j].bytes))
                return fl_error(FLAME_ERR_INVALID_ARG,
                                "embedding bag update: table %d: %s overlaps rows %lld..%lld it replaces (their %s)",
                                table, src[i].name, (long long)first_row, (long long)(first_row + num_rows - 1),
                                dst[j].name);
    if (bag->device != FLAME_DEVICE_CPU) {
        st = fl_gpu_kernels_copy_in(bag->device, (char *)t->data + at * esize, values, n * esize, cuda_stream);
        if (!st && qparams)
            st = fl_gpu_kernels_copy_in(bag->device, t->qparams + 2 * first_row, qparams, qp_bytes, cuda_stream);
        return st;
    }
    pthread_rwlock_wrlock(&bag->lock);
    memcpy((char *)t->data + at * esize, values, n * esize);
    if (qparams) memcpy(t->qparams + 2 * first_row, qparams, qp_bytes);
    pthread_rwlock_unlock(&bag->lock);
    return FLAME_OK;
}
