/* Record encoding and flame_feature_batch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "features/record.h"

void fl_rec_encode(uint8_t *dst, int32_t num_slots, const int64_t *slot_offsets, const int64_t *ids,
                   const float *dense, size_t num_dense)
{
    size_t h = fl_rec_header_bytes(num_slots);
    memset(dst, 0, h);
    uint32_t v = (uint32_t)num_slots;
    memcpy(dst, &v, 4);
    v = (uint32_t)num_dense;
    memcpy(dst + 4, &v, 4);
    size_t nids = 0;
    for (int32_t s = 0; s < num_slots; s++) {
        v = (uint32_t)(slot_offsets[s + 1] - slot_offsets[s]);
        memcpy(dst + 8 + 4 * (size_t)s, &v, 4);
        nids += v;
    }
    if (nids) memcpy(dst + h, ids, 8 * nids);
    if (num_dense) memcpy(dst + h + 8 * nids, dense, 4 * num_dense);
}

/* The first value no record may hold, among ids[0..nids) and dense[0..nd): an id below 0 (ids
 * are table rows: the engine refuses one, the feature file a line holding one) or a dense value
 * that is NaN or infinite (the feature file's rule). Redis values pass fl_rec_check, callbacks'
 * records and puts flame_feature_batch_set; both ask this, so every source and a put agree with
 * the file's parser. Read with memcpy: a Redis value need not be aligned.
 * Returns 0 for none, 1 for the id at *at, 2 for the dense value at *at. */
static int first_bad_value(const void *ids, uint64_t nids, const void *dense, size_t nd, uint64_t *at)
{
    for (uint64_t k = 0; k < nids; k++) {
        int64_t v;
        memcpy(&v, (const uint8_t *)ids + 8 * k, 8);
        if (v < 0) return *at = k, 1;
    }
    for (size_t k = 0; k < nd; k++) {
        float x;
        memcpy(&x, (const uint8_t *)dense + 4 * k, 4);
        if (!isfinite(x)) return *at = k, 2;
    }
    return 0;
}

flame_status fl_rec_check(const uint8_t *blob, size_t len, int32_t num_slots, const char *what)
{
    if (len < 8) return fl_error(FLAME_ERR_FORMAT, "%s: record of %zu bytes is shorter than its 8-byte header", what, len);
    uint32_t ns = fl_rec_u32(blob, 0), nd = fl_rec_u32(blob, 1);
    if (ns != (uint32_t)num_slots)
        return fl_error(FLAME_ERR_FORMAT, "%s: record has %u slots, expected %d", what, ns, num_slots);
    if (nd > FL_MAX_DENSE) return fl_error(FLAME_ERR_FORMAT, "%s: record has %u dense values, limit %d", what, nd, FL_MAX_DENSE);
    if (len < fl_rec_header_bytes(num_slots))
        return fl_error(FLAME_ERR_FORMAT, "%s: record of %zu bytes is shorter than its header", what, len);
    uint64_t nids = 0;
    for (int32_t s = 0; s < num_slots; s++) nids += fl_rec_u32(blob, 2 + (size_t)s);
    size_t want = fl_rec_bytes(num_slots, nids, nd);
    if (len != want)
        return fl_error(FLAME_ERR_FORMAT, "%s: record is %zu bytes, its header implies %zu", what, len, want);
    const uint8_t *ids = blob + fl_rec_header_bytes(num_slots), *dense = ids + 8 * nids;
    uint64_t at;
    const int bad = first_bad_value(ids, nids, dense, nd, &at);
    if (bad == 1) {
        int32_t s = 0; /* the slot holding id number `at` */
        for (uint64_t end = fl_rec_u32(blob, 2); at >= end;) end += fl_rec_u32(blob, 2 + (size_t)++s);
        int64_t v;
        memcpy(&v, ids + 8 * at, 8);
        return fl_error(FLAME_ERR_FORMAT, "%s: slot %d: id %lld is negative", what, s, (long long)v);
    }
    if (bad == 2) {
        float x;
        memcpy(&x, dense + 4 * at, 4);
        return fl_error(FLAME_ERR_FORMAT, "%s: dense[%llu] = %g is not a finite float", what, (unsigned long long)at,
                        (double)x);
    }
    return FLAME_OK;
}

FLAME_API flame_status flame_feature_batch_create(int32_t num_slots, flame_feature_batch **out)
{
    fl_clear_error();
    if (out) *out = NULL;
    if (!out) return fl_error(FLAME_ERR_INVALID_ARG, "flame_feature_batch_create: out is NULL");
    if (num_slots < 0 || num_slots > FL_MAX_SLOTS)
        return fl_error(FLAME_ERR_INVALID_ARG, "num_slots = %d is out of range [0, %d]", num_slots, FL_MAX_SLOTS);
    flame_feature_batch *b = calloc(1, sizeof *b);
    if (!b) return fl_error(FLAME_ERR_NOMEM, "out of memory allocating a feature batch");
    b->num_slots = num_slots;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    *out = b;
    return FLAME_OK;
}

FLAME_API void flame_feature_batch_destroy(flame_feature_batch *b)
{
    if (!b) return;
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    free(b->rec);
    free(b->arena);
    free(b);
}

FLAME_API size_t flame_feature_batch_size(const flame_feature_batch *b)
{
    return b ? b->n : 0;
}

flame_status fl_batch_reset(flame_feature_batch *b, size_t n)
{
    /* the grown capacity (n + n / 2 + 8 records) must be a size that fits size_t */
    const size_t most = (SIZE_MAX / sizeof *b->rec - 8) / 2;
    if (n > most)
        return fl_error(FLAME_ERR_INVALID_ARG, "a batch of %zu records is too large (at most %zu)", n, most);
    if (n > b->cap_n) {
        size_t cap = n + n / 2 + 8;
        fl_rec_ref *r = realloc(b->rec, cap * sizeof *r);
        if (!r) return fl_error(FLAME_ERR_NOMEM, "out of memory for a batch of %zu records", n);
        b->rec = r;
        b->cap_n = cap;
    }
    if (n) memset(b->rec, 0, n * sizeof *b->rec);
    b->n = n;
    b->used = 0;
    b->refused[0] = '\0';
    return FLAME_OK;
}

/* Reserves len bytes (8-aligned) in the arena; returns the offset or UINT64_MAX. */
static uint64_t arena_take(flame_feature_batch *b, size_t len)
{
    size_t need = b->used + ((len + 7) & ~(size_t)7);
    if (need > b->cap) {
        size_t cap = need * 2 > 4096 ? need * 2 : 4096;
        uint8_t *p = realloc(b->arena, cap);
        if (!p) return UINT64_MAX;
        b->arena = p;
        b->cap = cap;
    }
    uint64_t off = b->used;
    b->used = need;
    return off;
}

/* The offset of [p, p + len) inside the arena's used bytes, or UINT64_MAX when it is not
 * there. Compared as integers: the arena and a caller's array are different objects. */
static uint64_t arena_offset(const flame_feature_batch *b, const void *p, size_t len)
{
    const uintptr_t a = (uintptr_t)b->arena, x = (uintptr_t)p;
    if (!b->arena || !p || !len || x < a || x - a >= b->used) return UINT64_MAX;
    return x - a;
}

flame_status fl_batch_own_ids(const flame_feature_batch *b, const int64_t **ids, size_t n, int64_t **copy)
{
    *copy = NULL;
    const uint64_t off = n ? arena_offset(b, *ids, 1) : UINT64_MAX;
    if (off == UINT64_MAX) return FLAME_OK;
    if (n > (b->used - off) / sizeof **ids) /* ids inside the records must end inside them too */
        return fl_error(FLAME_ERR_INVALID_ARG,
                        "ids lie in the output batch's records, but %zu ids run past their last byte", n);
    *copy = malloc(n * sizeof **copy);
    if (!*copy) return fl_error(FLAME_ERR_NOMEM, "out of memory copying %zu ids that lie in the output batch", n);
    memcpy(*copy, *ids, n * sizeof **copy);
    *ids = *copy;
    return FLAME_OK;
}

flame_status fl_batch_put_blob(flame_feature_batch *b, size_t i, const uint8_t *blob, size_t len)
{
    uint64_t off = arena_take(b, len);
    if (off == UINT64_MAX) return fl_error(FLAME_ERR_NOMEM, "out of memory for a record of %zu bytes", len);
    memcpy(b->arena + off, blob, len);
    b->rec[i] = (fl_rec_ref){.off = off, .len = (uint32_t)len, .state = FL_REC_FOUND};
    return FLAME_OK;
}

/* flame_feature_batch_set, b not NULL. */
static flame_status batch_set(flame_feature_batch *b, size_t index, const int64_t *slot_offsets, const int64_t *ids,
                              size_t num_ids, const float *dense, size_t num_dense)
{
    if (index >= b->n) return fl_error(FLAME_ERR_INVALID_ARG, "record index %zu is out of range [0, %zu)", index, b->n);
    if (b->num_slots && !slot_offsets) return fl_error(FLAME_ERR_INVALID_ARG, "record %zu: slot_offsets is NULL", index);
    if (num_dense > FL_MAX_DENSE)
        return fl_error(FLAME_ERR_INVALID_ARG, "record %zu: num_dense = %zu exceeds %d", index, num_dense, FL_MAX_DENSE);
    if (num_dense && !dense) return fl_error(FLAME_ERR_INVALID_ARG, "record %zu: dense is NULL", index);
    if (b->num_slots && slot_offsets[0] != 0)
        return fl_error(FLAME_ERR_INVALID_ARG, "record %zu: slot_offsets[0] = %lld, expected 0", index,
                        (long long)slot_offsets[0]);
    for (int32_t s = 0; s < b->num_slots; s++) {
        if (slot_offsets[s + 1] < slot_offsets[s])
            return fl_error(FLAME_ERR_INVALID_ARG, "record %zu: slot_offsets[%d] = %lld is below slot_offsets[%d] = %lld",
                            index, s + 1, (long long)slot_offsets[s + 1], s, (long long)slot_offsets[s]);
        if (slot_offsets[s + 1] - slot_offsets[s] > UINT32_MAX)
            return fl_error(FLAME_ERR_INVALID_ARG, "record %zu: slot %d holds %lld ids, more than %u", index, s,
                            (long long)(slot_offsets[s + 1] - slot_offsets[s]), UINT32_MAX);
    }
    /* the ids the offsets address must be exactly the array given: fewer would drop ids
     * silently, more would be read past its end */
    const uint64_t end = b->num_slots ? (uint64_t)slot_offsets[b->num_slots] : 0;
    if (end != num_ids) {
        if (b->num_slots)
            return fl_error(FLAME_ERR_INVALID_ARG,
                            "record %zu: slot_offsets[%d] (the end of slot %d's bag) = %llu, but num_ids = %zu", index,
                            b->num_slots, b->num_slots - 1, (unsigned long long)end, num_ids);
        return fl_error(FLAME_ERR_INVALID_ARG, "record %zu: num_ids = %zu, but the records have no slots", index,
                        num_ids);
    }
    const uint64_t nids = end;
    if (nids && !ids) return fl_error(FLAME_ERR_INVALID_ARG, "record %zu: ids is NULL with num_ids %zu", index, num_ids);
    uint64_t at;
    const int bad = first_bad_value(ids, nids, dense, num_dense, &at);
    if (bad == 1) {
        int32_t s = 0; /* the slot whose bag holds ids[at] (the offsets were checked above) */
        while ((uint64_t)slot_offsets[s + 1] <= at) s++;
        return fl_error(FLAME_ERR_INVALID_ARG, "record %zu: slot %d: id %lld (ids[%llu]) is negative", index, s,
                        (long long)ids[at], (unsigned long long)at);
    }
    if (bad == 2)
        return fl_error(FLAME_ERR_INVALID_ARG, "record %zu: dense[%llu] = %g is not a finite float", index,
                        (unsigned long long)at, (double)dense[at]);
    size_t len = fl_rec_bytes(b->num_slots, nids, num_dense);
    if (len > UINT32_MAX) return fl_error(FLAME_ERR_INVALID_ARG, "record %zu: %zu bytes is too large", index, len);
    /* an input may be a record of this batch read back (a callback copying a repeated id's
     * record): growing the arena moves it, so it is found again by its offset */
    const uint64_t in_ids = arena_offset(b, ids, 8 * nids), in_dense = arena_offset(b, dense, 4 * num_dense);
    uint64_t off = arena_take(b, len);
    if (off == UINT64_MAX) return fl_error(FLAME_ERR_NOMEM, "out of memory for a record of %zu bytes", len);
    if (in_ids != UINT64_MAX) ids = (const int64_t *)(const void *)(b->arena + in_ids);
    if (in_dense != UINT64_MAX) dense = (const float *)(const void *)(b->arena + in_dense);
    fl_rec_encode(b->arena + off, b->num_slots, slot_offsets, ids, dense, num_dense);
    b->rec[index] = (fl_rec_ref){.off = off, .len = (uint32_t)len, .state = FL_REC_FOUND};
    return FLAME_OK;
}

FLAME_API flame_status flame_feature_batch_set(flame_feature_batch *b, size_t index, const int64_t *slot_offsets,
                                               const int64_t *ids, size_t num_ids, const float *dense,
                                               size_t num_dense)
{
    fl_clear_error();
    if (!b) return fl_error(FLAME_ERR_INVALID_ARG, "flame_feature_batch_set: batch is NULL");
    flame_status st = batch_set(b, index, slot_offsets, ids, num_ids, dense, num_dense);
    if (st && !b->refused[0]) {
        snprintf(b->refused, sizeof b->refused, "%s", flame_last_error());
        b->refused_index = index;
    }
    return st;
}

FLAME_API flame_status flame_feature_batch_set_missing(flame_feature_batch *b, size_t index)
{
    fl_clear_error();
    if (!b) return fl_error(FLAME_ERR_INVALID_ARG, "flame_feature_batch_set_missing: batch is NULL");
    if (index >= b->n) return fl_error(FLAME_ERR_INVALID_ARG, "record index %zu is out of range [0, %zu)", index, b->n);
    b->rec[index] = (fl_rec_ref){.state = FL_REC_MISSING};
    return FLAME_OK;
}

static flame_status get_checked(const flame_feature_batch *b, size_t index, const char *fn)
{
    if (!b) return fl_error(FLAME_ERR_INVALID_ARG, "%s: batch is NULL", fn);
    if (index >= b->n) return fl_error(FLAME_ERR_INVALID_ARG, "record index %zu is out of range [0, %zu)", index, b->n);
    if (b->rec[index].state == FL_REC_UNSET) return fl_error(FLAME_ERR_INVALID_ARG, "record %zu was never written", index);
    return FLAME_OK;
}

FLAME_API flame_status flame_feature_batch_get_slot(const flame_feature_batch *b, size_t index, int32_t slot,
                                                    int32_t *found, const int64_t **ids, size_t *count)
{
    fl_clear_error();
    flame_status st = get_checked(b, index, "flame_feature_batch_get_slot");
    if (st) return st;
    if (!found || !ids || !count) return fl_error(FLAME_ERR_INVALID_ARG, "flame_feature_batch_get_slot: NULL output");
    if (slot < 0 || slot >= b->num_slots)
        return fl_error(FLAME_ERR_INVALID_ARG, "slot %d is out of range [0, %d)", slot, b->num_slots);
    if (b->rec[index].state == FL_REC_MISSING) {
        *found = 0, *ids = NULL, *count = 0;
        return FLAME_OK;
    }
    *found = 1;
    *ids = fl_rec_slot(b->arena + b->rec[index].off, slot, count);
    return FLAME_OK;
}

FLAME_API flame_status flame_feature_batch_get_dense(const flame_feature_batch *b, size_t index, const float **dense,
                                                     size_t *count)
{
    fl_clear_error();
    flame_status st = get_checked(b, index, "flame_feature_batch_get_dense");
    if (st) return st;
    if (!dense || !count) return fl_error(FLAME_ERR_INVALID_ARG, "flame_feature_batch_get_dense: NULL output");
    *dense = NULL, *count = 0;
    if (b->rec[index].state == FL_REC_MISSING) return FLAME_OK;
    const uint8_t *blob = b->arena + b->rec[index].off;
    uint64_t nids = 0;
    for (int32_t s = 0; s < b->num_slots; s++) nids += fl_rec_u32(blob, 2 + (size_t)s);
    *count = fl_rec_u32(blob, 1);
    *dense = (const float *)(const void *)(blob + fl_rec_header_bytes(b->num_slots) + 8 * nids);
    return FLAME_OK;
}

void fl_batch_arm(flame_feature_batch *b)
{
    pthread_mutex_lock(&b->mu);
    b->armed = 1;
    b->done = 0;
    b->status = FLAME_OK;
    pthread_mutex_unlock(&b->mu);
}

FLAME_API void flame_feature_batch_complete(flame_feature_batch *b, flame_status status)
{
    if (!b) return;
    pthread_mutex_lock(&b->mu);
    b->done = 1;
    b->status = status;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

flame_status fl_batch_wait(flame_feature_batch *b)
{
    pthread_mutex_lock(&b->mu);
    while (!b->done) pthread_cond_wait(&b->cv, &b->mu);
    flame_status st = b->status;
    b->armed = 0;
    pthread_mutex_unlock(&b->mu);
    return st;
}

bool fl_batch_awaiting(flame_feature_batch *b)
{
    pthread_mutex_lock(&b->mu);
    const bool awaiting = b->armed && !b->done;
    pthread_mutex_unlock(&b->mu);
    return awaiting;
}
