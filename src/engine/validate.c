/* Request validation: every id, offset and length is checked before any computation, so a
 * bad request gets a message naming the value and the scores buffer stays untouched. */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/abi.h"
#include "core/pool.h"
#include "cpu/kernels.h"
#include "engine/engine.h"

#define BAD(...) fl_error(FLAME_ERR_INVALID_ARG, __VA_ARGS__)

/* GEMM dimensions go to CBLAS as 32-bit ints; a pass's token count is bounded again in
 * fl_forward_bytes' caller. */

/* A slot's bags over n tokens: offsets[0] == 0, non-decreasing, and offsets[n] == num_ids,
 * so the ids read are exactly the array the caller described (none dropped, none past it). */
static flame_status check_csr(size_t r, const char *what, const char *feature, int slot, const flame_bags *side,
                              size_t n)
{
    if (!side) return FLAME_OK; /* no bags: allowed only without tokens (checked by the caller) */
    const flame_bags *b = &side[slot];
    if (n == 0) {
        if (b->num_ids)
            return BAD("request %zu: %s side feature '%s' (slot %d): num_ids = %zu, but there are no %s tokens", r,
                       what, feature, slot, b->num_ids, what);
        return FLAME_OK;
    }
    if (!b->offsets) return BAD("request %zu: %s side feature '%s' (slot %d): offsets is NULL", r, what, feature, slot);
    if (b->offsets[0] != 0)
        return BAD("request %zu: %s side feature '%s' (slot %d): offsets[0] = %lld, expected 0", r, what, feature, slot,
                   (long long)b->offsets[0]);
    for (size_t t = 0; t < n; t++)
        if (b->offsets[t + 1] < b->offsets[t])
            return BAD("request %zu: %s side feature '%s' (slot %d): offsets[%zu] = %lld < offsets[%zu] = %lld (token "
                       "%zu's bag)",
                       r, what, feature, slot, t + 1, (long long)b->offsets[t + 1], t, (long long)b->offsets[t], t);
    if ((uint64_t)b->offsets[n] != b->num_ids)
        return BAD("request %zu: %s side feature '%s' (slot %d): offsets[%zu] (the end of token %zu's bag) = %lld, "
                   "but num_ids = %zu",
                   r, what, feature, slot, n, n - 1, (long long)b->offsets[n], b->num_ids);
    if (b->num_ids && !b->ids)
        return BAD("request %zu: %s side feature '%s' (slot %d): ids is NULL with num_ids %zu", r, what, feature, slot,
                   b->num_ids);
    return FLAME_OK;
}

/* Item ids must fit every table that item ids index (num_items, the smallest of them), so a
 * history item can also be a candidate; side ids must fit their own table. */
static flame_status check_id(size_t r, const char *what, size_t token, const struct flame_model *m, int f, int64_t id)
{
    const fl_model_cfg *c = &m->cfg;
    const fl_table_cfg *t = &c->tables[c->features[f].table];
    bool item = c->features[f].side_slot < 0;
    int64_t limit = item ? m->num_items : t->rows;
    if (id < 0 || id >= limit)
        return BAD("request %zu: %s token %zu, feature '%s' (table '%s'): id %lld out of range [0, %lld)%s", r, what,
                   token, c->features[f].name, item ? c->tables[m->num_items_table].name : t->name, (long long)id,
                   (long long)limit, item ? " (item ids index every item table)" : "");
    return FLAME_OK;
}

/* What check_tokens checks: the tokens' item ids, their side bags, or both. */
enum { ITEMS = 1, BAGS = 2 };

/* Checks the features of tokens [first, first + count) of one token list (history or candidates). */
static flame_status check_tokens(size_t r, const char *what, const struct flame_model *m, const int64_t *items,
                                 const flame_bags *side, size_t total, size_t first, size_t count, int parts)
{
    if (total == 0 && !side) return FLAME_OK; /* no tokens and no bags (&side[s] would be undefined) */
    const fl_model_cfg *c = &m->cfg;
    for (int f = 0; f < c->num_features; f++) {
        int s = c->features[f].side_slot;
        if ((s < 0 && !(parts & ITEMS)) || (s >= 0 && !(parts & BAGS))) continue;
        if (s >= 0) {
            flame_status st = check_csr(r, what, c->features[f].name, s, side, total);
            if (st) return st;
        }
        for (size_t t = first; t < first + count; t++) {
            if (s < 0) {
                flame_status st = check_id(r, what, t, m, f, items[t]);
                if (st) return st;
                continue;
            }
            for (int64_t i = side[s].offsets[t]; i < side[s].offsets[t + 1]; i++) {
                flame_status st = check_id(r, what, t, m, f, side[s].ids[i]);
                if (st) return st;
            }
        }
    }
    return FLAME_OK;
}

/* A request that gives item ids only, for the engine's item cache to fill its bags. */
static bool ids_only(const fl_model_cfg *c, const flame_request *q)
{
    return c->num_side > 0 && !q->history_side && (c->head != FLAME_HEAD_SUMI || !q->candidate_side);
}

/* True when q scores the same candidate array (same memory, same length, same bags) as the
 * request before it, which was validated already: batches of users scoring one catalogue
 * share it, and checking 12k ids per user would be most of a batch's serial time. */
static bool same_candidates(const flame_request *q, const flame_request *prev)
{
    return prev && q->candidates == prev->candidates && q->num_candidates == prev->num_candidates &&
           q->candidate_side == prev->candidate_side;
}

/* mode FL_CHECK_DEFER_BAGS: the bags of an id-only request are left for fl_validate_resolved. */
static flame_status check_request(const struct flame_model *m, size_t r, const flame_request *q,
                                  const flame_request *prev, fl_check_mode mode)
{
    const fl_model_cfg *c = &m->cfg;
    if (q->history_len && !q->history) return BAD("request %zu: history is NULL with history_len %zu", r, q->history_len);
    if (q->num_candidates && !q->candidates)
        return BAD("request %zu: candidates is NULL with num_candidates %zu", r, q->num_candidates);
    if (q->num_candidates > FL_MAX_CANDIDATES)
        return BAD("request %zu: num_candidates = %zu exceeds %d", r, q->num_candidates, FL_MAX_CANDIDATES);
    if (q->num_side_features != (size_t)c->num_side)
        return BAD("request %zu: num_side_features = %zu, the model has %d", r, q->num_side_features, c->num_side);
    bool sumi = c->head == FLAME_HEAD_SUMI;
    const int parts = mode == FL_CHECK_DEFER_BAGS && ids_only(c, q) ? ITEMS : ITEMS | BAGS;
    if (c->num_side && sumi && q->history_len && q->num_candidates && !q->history_side != !q->candidate_side)
        return BAD("request %zu: %s is NULL but %s is not: give the bags of both, or of neither to send item ids "
                   "only (resolved by the engine's item cache, FLAME_OPT_ITEM_CACHE)",
                   r, q->history_side ? "candidate_side" : "history_side", q->history_side ? "history_side" : "candidate_side");
    if (c->num_side && q->history_len && !q->history_side && (parts & BAGS))
        return BAD("request %zu: history_side is NULL, the model needs %d side features (give the bags, or give the "
                   "engine an item cache, FLAME_OPT_ITEM_CACHE, to send item ids only)",
                   r, c->num_side);
    if (c->num_side && sumi && q->num_candidates && !q->candidate_side && (parts & BAGS))
        return BAD("request %zu: candidate_side is NULL, the model needs %d side features (give the bags, or give the "
                   "engine an item cache, FLAME_OPT_ITEM_CACHE, to send item ids only)",
                   r, c->num_side);
    /* the whole history, not only the window: ids that fall out of it are not read, but a bad
     * one still says the caller's data is wrong */
    flame_status st =
        check_tokens(r, "history", m, q->history, q->history_side, q->history_len, 0, q->history_len, parts);
    if (st) return st;
    if (same_candidates(q, prev) && prev->num_side_features == q->num_side_features) return FLAME_OK;
    if (sumi)
        return check_tokens(r, "candidate", m, q->candidates, q->candidate_side, q->num_candidates, 0,
                            q->num_candidates, parts);
    const fl_table_cfg *t = &c->tables[m->num_items_table];
    const int64_t i = fl_cpu_first_out_of_range(q->candidates, q->num_candidates, m->num_items);
    if (i >= 0)
        return BAD("request %zu: candidate %lld (table '%s'): id %lld out of range [0, %lld)", r, (long long)i, t->name,
                   (long long)q->candidates[i], (long long)m->num_items);
    return FLAME_OK;
}

flame_status fl_check_side_bags(const struct flame_model *m, size_t r, const char *what, const flame_bags *side,
                                size_t n)
{
    const fl_model_cfg *c = &m->cfg;
    for (int f = 0; f < c->num_features; f++)
        if (c->features[f].side_slot >= 0) {
            flame_status st = check_csr(r, what, c->features[f].name, c->features[f].side_slot, side, n);
            if (st) return st;
        }
    return FLAME_OK;
}

flame_status fl_validate_requests(const struct flame_model *m, const flame_request *reqs, size_t n,
                                  uint64_t *total_scores, fl_check_mode mode)
{
    uint64_t total = 0;
    for (size_t r = 0; r < n; r++) {
        flame_status st = check_request(m, r, &reqs[r], r > 0 ? &reqs[r - 1] : NULL, mode);
        if (st) return st;
        uint64_t block;
        if (!fl_mul_u64(reqs[r].num_candidates, (uint64_t)m->cfg.num_tasks, &block) ||
            !fl_add_u64(total, block, &total))
            return BAD("request %zu: the number of scores overflows 64 bits", r);
    }
    *total_scores = total;
    return FLAME_OK;
}

flame_status fl_validate_resolved(const struct flame_model *m, const flame_request *given,
                                  const flame_request *resolved, size_t n)
{
    const fl_model_cfg *c = &m->cfg;
    for (size_t r = 0; r < n; r++) {
        if (!ids_only(c, &given[r])) continue;
        const flame_request *q = &resolved[r];
        flame_status st =
            check_tokens(r, "history", m, q->history, q->history_side, q->history_len, 0, q->history_len, BAGS);
        if (!st && c->head == FLAME_HEAD_SUMI)
            st = check_tokens(r, "candidate", m, q->candidates, q->candidate_side, q->num_candidates, 0,
                              q->num_candidates, BAGS);
        if (st) return st;
    }
    return FLAME_OK;
}

/* The outputs against one array of a request (what: "history", "candidate side bags", ...). */
static flame_status apart(const fl_out_range *outs, int num_outs, size_t r, const void *p, size_t bytes,
                          const char *what, int slot)
{
    for (int o = 0; o < num_outs; o++)
        if (fl_ranges_overlap(outs[o].p, outs[o].bytes, p, bytes)) {
            char name[64];
            if (slot < 0) snprintf(name, sizeof name, "%s", what);
            else snprintf(name, sizeof name, "%s of slot %d", what, slot);
            return BAD("request %zu: %s overlaps its %s (the library writes %s while it still reads requests)", r,
                       outs[o].name, name, outs[o].name);
        }
    return FLAME_OK;
}

static flame_status request_apart(const flame_request *q, size_t r, const fl_out_range *outs, int num_outs)
{
    flame_status st = apart(outs, num_outs, r, q->history, q->history_len * sizeof(int64_t), "history", -1);
    if (!st) st = apart(outs, num_outs, r, q->candidates, q->num_candidates * sizeof(int64_t), "candidates", -1);
    const flame_bags *sides[2] = {q->history_side, q->candidate_side};
    const size_t tokens[2] = {q->history_len, q->num_candidates};
    const char *names[2][3] = {{"history_side bags", "history_side offsets", "history_side ids"},
                               {"candidate_side bags", "candidate_side offsets", "candidate_side ids"}};
    for (int w = 0; w < 2 && !st; w++) {
        const flame_bags *side = sides[w];
        if (!side) continue;
        st = apart(outs, num_outs, r, side, q->num_side_features * sizeof *side, names[w][0], -1);
        for (size_t s = 0; s < q->num_side_features && !st && tokens[w]; s++) { /* no tokens: nothing is read */
            st = apart(outs, num_outs, r, side[s].offsets, (tokens[w] + 1) * sizeof(int64_t), names[w][1], (int)s);
            if (!st) st = apart(outs, num_outs, r, side[s].ids, side[s].num_ids * sizeof(int64_t), names[w][2], (int)s);
        }
    }
    return st;
}

flame_status fl_check_outputs_apart(const flame_request *requests, size_t num_requests, size_t stride,
                                    const flame_request *reqs, const fl_out_range *outs, int num_outs)
{
    for (int o = 0; o < num_outs; o++)
        if (fl_ranges_overlap(outs[o].p, outs[o].bytes, requests, num_requests * stride))
            return BAD("%s overlaps the requests (the library writes %s while it still reads them)", outs[o].name,
                       outs[o].name);
    for (size_t r = 0; r < num_requests; r++) {
        flame_request q;
        if (!reqs) {
            memset(&q, 0, sizeof q);
            fl_struct_in("flame_request", &q, sizeof q, (const char *)requests + r * stride);
        }
        flame_status st = request_apart(reqs ? &reqs[r] : &q, r, outs, num_outs);
        if (st) return st;
    }
    return FLAME_OK;
}

typedef struct val_job {
    const struct flame_model *m;
    const flame_request *reqs;
    size_t n;
    fl_check_mode mode;
    atomic_size_t first_bad; /* the lowest failing request seen, n when none */
} val_job;

/* Requests 8t .. 8t + 7; a failure lowers first_bad. */
static void val_task(void *ctx, int64_t t, int worker)
{
    val_job *j = ctx;
    (void)worker;
    const size_t r1 = (size_t)(t + 1) * 8 < j->n ? (size_t)(t + 1) * 8 : j->n;
    for (size_t r = (size_t)t * 8; r < r1; r++)
        if (check_request(j->m, r, &j->reqs[r], r > 0 ? &j->reqs[r - 1] : NULL, j->mode) != FLAME_OK) {
            size_t cur = atomic_load(&j->first_bad);
            while (r < cur && !atomic_compare_exchange_weak(&j->first_bad, &cur, r)) {
            }
            return;
        }
}

/* Ids a call checks at least before its requests are split over the threads. */
#define MIN_IDS_PARALLEL 65536

flame_status fl_validate_requests_mt(const struct flame_model *m, const flame_request *reqs, size_t n,
                                     uint64_t *total_scores, fl_check_mode mode, int threads)
{
    uint64_t ids = 0;
    for (size_t r = 0; r < n; r++) {
        ids += reqs[r].history_len;
        if (!(r > 0 && same_candidates(&reqs[r], &reqs[r - 1]))) ids += reqs[r].num_candidates;
    }
    if (threads <= 1 || n < 2 || ids < MIN_IDS_PARALLEL) return fl_validate_requests(m, reqs, n, total_scores, mode);
    /* Each request is checked on its own, so they split over the threads; a failure anywhere
     * sends the whole call through the serial pass, which names the first bad request exactly
     * as it always does (and sets the message on the calling thread). */
    val_job j = {.m = m, .reqs = reqs, .n = n, .mode = mode};
    atomic_init(&j.first_bad, n);
    fl_parallel(threads, (int64_t)((n + 7) / 8), val_task, &j);
    const size_t first_bad = atomic_load(&j.first_bad);
    if (first_bad < n) return fl_validate_requests(m, reqs, n, total_scores, mode);
    fl_clear_error(); /* the calling thread's share left no message, but be exact */
    uint64_t total = 0;
    for (size_t r = 0; r < n; r++) {
        uint64_t block;
        if (!fl_mul_u64(reqs[r].num_candidates, (uint64_t)m->cfg.num_tasks, &block) ||
            !fl_add_u64(total, block, &total))
            return BAD("request %zu: the number of scores overflows 64 bits", r);
    }
    *total_scores = total;
    return FLAME_OK;
}
