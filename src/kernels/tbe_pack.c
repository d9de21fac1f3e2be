/* The host-index checks of the public embedding bag: offsets one table at a time (batch + 1
 * values each), then the ids and weights of every table in chunks spread over libflame's pool.
 * A chunk is scanned with a branch-free reduction (sign bits of each id and of rows - 1 - id;
 * exponent bits of each weight), which the compiler vectorizes (-O3), and copied to
 * the staging block while it is still in cache; only a chunk that holds a bad value is scanned
 * again, element by element, for the first one. */
#include <stdlib.h>
#include <string.h>

#include "core/pool.h"
#include "kernels/tbe_pack.h"

#define CHUNK 16384 /* ids a task (128 KiB of ids: one pass stays in the core's cache) */

/* The lengths and offsets of table t's lookups. */
flame_status fl_tbe_index_error(const fl_tbe_index_record *r, int64_t rows)
{
    const long long bg = (long long)r->bag, ix = (long long)r->index, v = (long long)r->value;
    const long long n = (long long)r->num_ids;
    const int t = r->table;
    switch (r->kind) {
    case FL_TBE_BAD_OFFSET_START:
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %d bag 0: offsets[0] = %lld, not 0", t, v);
    case FL_TBE_BAD_OFFSET_ORDER:
        return fl_error(FLAME_ERR_INVALID_ARG,
                        "embedding bag: table %d bag %lld: offsets[%lld] = %lld is outside offsets[%lld] = %lld .. "
                        "num_ids = %lld", t, bg, ix, v, bg, (long long)r->prev, n);
    case FL_TBE_BAD_OFFSET_END:
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %d: offsets[batch = %lld] = %lld but num_ids = "
                        "%lld", t, ix, v, n);
    case FL_TBE_BAD_ID:
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %d bag %lld: ids[%lld] = %lld is outside 0..%lld",
                        t, bg, ix, v, (long long)(rows - 1));
    case FL_TBE_BAD_WEIGHT:
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %d bag %lld: weights[%lld] = %g is not finite", t,
                        bg, ix, r->weight);
    }
    return fl_error(FLAME_ERR_INTERNAL, "embedding bag: index record of kind %d", r->kind);
}

static flame_status check_offsets(int t, const fl_tbe_lookup *lk, int64_t batch)
{
    if (lk->num_ids < 0)
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %d: num_ids %lld is negative", t,
                        (long long)lk->num_ids);
    if (lk->num_ids > 0 && !lk->ids)
        return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %d: ids is NULL with num_ids %lld", t,
                        (long long)lk->num_ids);
    if (!lk->offsets) {
        if (lk->num_ids != batch)
            return fl_error(FLAME_ERR_INVALID_ARG, "embedding bag: table %d: num_ids %lld without offsets (one id per "
                            "bag) must equal batch %lld", t, (long long)lk->num_ids, (long long)batch);
        return FLAME_OK;
    }
    fl_tbe_index_record r = {.table = t, .num_ids = lk->num_ids};
    if (lk->offsets[0] != 0) {
        r.kind = FL_TBE_BAD_OFFSET_START;
        r.value = lk->offsets[0];
        return fl_tbe_index_error(&r, 0);
    }
    for (int64_t b = 0; b < batch; b++)
        if (lk->offsets[b + 1] < lk->offsets[b] || lk->offsets[b + 1] > lk->num_ids) {
            r.kind = FL_TBE_BAD_OFFSET_ORDER;
            r.bag = b;
            r.index = b + 1;
            r.value = lk->offsets[b + 1];
            r.prev = lk->offsets[b];
            return fl_tbe_index_error(&r, 0);
        }
    if (lk->offsets[batch] != lk->num_ids) {
        r.kind = FL_TBE_BAD_OFFSET_END;
        r.index = batch;
        r.value = lk->offsets[batch];
        return fl_tbe_index_error(&r, 0);
    }
    return FLAME_OK;
}

/* The message for table t's bad id (sub 0) or weight (sub 1) at index i; its offsets are valid. */
static flame_status value_error(int t, const fl_tbe_table *tab, const fl_tbe_lookup *lk, int64_t batch, int64_t i,
                                int sub)
{
    int64_t bag = i; /* without offsets, one id a bag */
    if (lk->offsets) { /* the first bag b with offsets[b + 1] > i */
        int64_t lo = 0, hi = batch - 1;
        while (lo < hi) {
            const int64_t mid = lo + (hi - lo) / 2;
            if (lk->offsets[mid + 1] > i)
                hi = mid;
            else
                lo = mid + 1;
        }
        bag = lo;
    }
    fl_tbe_index_record r = {.kind = sub == 0 ? FL_TBE_BAD_ID : FL_TBE_BAD_WEIGHT, .table = t, .bag = bag, .index = i};
    if (sub == 0)
        r.value = lk->ids[i];
    else
        r.weight = (double)lk->weights[i];
    return fl_tbe_index_error(&r, tab->rows);
}

typedef struct pack_job {
    const fl_tbe_table *tables;
    const fl_tbe_lookup *lookups;
    int num_tables;
    unsigned char *dst;
    const size_t *at;
    int64_t first_task[FL_TBE_MAX_TABLES + 1]; /* table t's chunks are tasks first_task[t] .. [t + 1] - 1 */
    int64_t *bad;                               /* per task: 2 * index + sub of its first bad value, or -1 */
} pack_job;

static void pack_chunk(void *ctx, int64_t task, int worker)
{
    (void)worker;
    pack_job *j = ctx;
    int t = 0;
    while (j->first_task[t + 1] <= task) t++; /* at most 64 tables */
    const fl_tbe_lookup *lk = &j->lookups[t];
    const int64_t lo = (task - j->first_task[t]) * CHUNK;
    const int64_t n = lk->num_ids - lo < CHUNK ? lk->num_ids - lo : CHUNK;
    const int64_t *ids = lk->ids + lo;
    const uint64_t rows = (uint64_t)j->tables[t].rows;
    /* id in 0..rows-1 (rows <= 2^40) iff neither id nor rows - 1 - id has the sign bit: an OR and
     * a subtraction an element, which vectorize without a 64-bit compare */
    uint64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad |= (uint64_t)ids[i] | (rows - 1 - (uint64_t)ids[i]);
    bad >>= 63;
    const uint32_t *wbits = lk->weights ? (const uint32_t *)(const void *)(lk->weights + lo) : NULL;
    uint32_t wbad = 0;
    if (wbits)
        for (int64_t i = 0; i < n; i++) wbad |= (wbits[i] & 0x7f800000u) == 0x7f800000u; /* inf or NaN */
    j->bad[task] = -1;
    if (bad | wbad) {
        for (int64_t i = 0; i < n; i++) {
            if ((uint64_t)ids[i] >= rows) {
                j->bad[task] = 2 * (lo + i);
                break;
            }
            if (wbits && (wbits[i] & 0x7f800000u) == 0x7f800000u) {
                j->bad[task] = 2 * (lo + i) + 1;
                break;
            }
        }
        return;
    }
    if (j->dst) {
        memcpy(j->dst + j->at[3 * t] + (size_t)lo * sizeof(int64_t), ids, (size_t)n * sizeof(int64_t));
        if (wbits) memcpy(j->dst + j->at[3 * t + 2] + (size_t)lo * sizeof(float), wbits, (size_t)n * sizeof(float));
    }
}

flame_status fl_tbe_check_pack(const fl_tbe_table *tables, const fl_tbe_lookup *lookups, int num_tables,
                               int64_t batch, void *dst, const size_t *at, int threads)
{
    pack_job j = {.tables = tables, .lookups = lookups, .num_tables = num_tables, .dst = dst, .at = at};
    bool offsets_bad[FL_TBE_MAX_TABLES];
    for (int t = 0; t < num_tables; t++) {
        const fl_tbe_lookup *lk = &lookups[t];
        /* a table with bad offsets has no chunks: its error is reported in table order below */
        offsets_bad[t] = check_offsets(t, lk, batch) != FLAME_OK;
        const int64_t chunks = offsets_bad[t] ? 0 : (lk->num_ids + CHUNK - 1) / CHUNK;
        j.first_task[t + 1] = j.first_task[t] + chunks;
        if (!offsets_bad[t] && dst && lk->offsets)
            memcpy(j.dst + at[3 * t + 1], lk->offsets, (size_t)(batch + 1) * sizeof(int64_t));
    }
    const int64_t tasks = j.first_task[num_tables];
    j.bad = malloc((size_t)(tasks ? tasks : 1) * sizeof *j.bad);
    if (!j.bad) return fl_error(FLAME_ERR_NOMEM, "embedding bag: %lld index chunks", (long long)tasks);
    fl_parallel(threads, tasks, pack_chunk, &j);
    flame_status st = FLAME_OK;
    for (int t = 0; t < num_tables && !st; t++) {
        if (offsets_bad[t]) {
            st = check_offsets(t, &lookups[t], batch); /* again, for its message */
            break;
        }
        for (int64_t k = j.first_task[t]; k < j.first_task[t + 1]; k++)
            if (j.bad[k] >= 0) {
                st = value_error(t, &tables[t], &lookups[t], batch, j.bad[k] / 2, (int)(j.bad[k] % 2));
                break;
            }
    }
    free(j.bad);
    return st;
}
