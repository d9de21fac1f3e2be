/* Random requests for the GPU suites: a batch owning its id arrays, and side bags of 0..3 ids
 * (exactly 3 when full) for a request's history and candidates. Header-only, like the other
 * test helpers; include after testutil.h. */
#ifndef FLAME_TU_REQUESTS_H
#define FLAME_TU_REQUESTS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "flame/flame.h"

#define TU_BATCH_USERS 16
#define TU_BATCH_SIDE 4

typedef struct tu_batch {
    flame_request req[TU_BATCH_USERS];
    flame_bags bags[TU_BATCH_USERS][2][TU_BATCH_SIDE]; /* [user][history, candidates][slot] */
    int64_t *bufs[2 * TU_BATCH_USERS * (1 + 2 * TU_BATCH_SIDE)];
    int nbufs;
    size_t total; /* scores of the batch: candidates x tasks */
} tu_batch;

/* n + 1 zeroed ids the batch owns (one more, so an empty array is not NULL) */
static inline int64_t *tu_batch_ids(tu_batch *b, size_t n)
{
    assert_true(b->nbufs < (int)(sizeof b->bufs / sizeof *b->bufs));
    int64_t *p = (int64_t *)calloc(n + 1, sizeof *p);
    assert_non_null(p);
    b->bufs[b->nbufs++] = p;
    return p;
}

/* User r's side bags: for each of the model's side features, a bag per history item (n) and per
 * candidate (mc) of 0..3 ids below side_rows[slot] (3 when full), set on the request. */
static inline void tu_batch_side_bags(tu_batch *b, size_t r, int num_side, const int64_t *side_rows, size_t n,
                                      size_t mc, bool full)
{
    assert_true(r < TU_BATCH_USERS && num_side <= TU_BATCH_SIDE);
    flame_request *q = &b->req[r];
    for (int part = 0; part < 2 && num_side; part++) {
        const size_t count = part ? mc : n;
        for (int s = 0; s < num_side; s++) {
            int64_t *off = tu_batch_ids(b, count + 1), *ids = tu_batch_ids(b, 3 * count + 1);
            for (size_t t = 0; t < count; t++) {
                const int64_t k = full ? 3 : tu_below(4);
                for (int64_t i = 0; i < k; i++) ids[off[t] + i] = tu_below(side_rows[s]);
                off[t + 1] = off[t] + k;
            }
            b->bags[r][part][s] = (flame_bags){off, ids, (size_t)off[count]};
        }
        if (part)
            q->candidate_side = b->bags[r][1];
        else
            q->history_side = b->bags[r][0];
    }
}

/* What tu_make_batch draws. */
typedef struct tu_batch_spec {
    size_t users;    /* requests, at most TU_BATCH_USERS */
    size_t hist_max; /* histories of 0..hist_max ids (beyond max_len the window truncates) */
    size_t cand_max; /* candidates 1..cand_max */
    bool full;       /* every length at its bound (hist_max, cand_max) and every bag of 3 ids */
    bool edges;      /* user 0 has no history, user 1 no candidates */
    /* the candidates of users r % 3 != 2 are one contiguous id range (the dot head scores it
     * with one GEMM), the others random ids (gathered) */
    bool ranges;
    const int64_t *side_rows; /* per side slot: its ids are drawn below this; NULL without side features */
} tu_batch_spec;

/* Random requests for model m as spec says. Each user draws, in this order: its history length
 * and candidate count (none for an edge user or when full), the history ids, the range's first
 * id (ranges, for every user), the candidate ids, then its side bags (tu_batch_side_bags). */
static inline void tu_make_batch(tu_batch *b, const flame_model *m, const tu_batch_spec *spec)
{
    memset(b, 0, sizeof *b);
    flame_model_info info = {.struct_size = sizeof info};
    assert_int_equal(flame_model_get_info(m, &info), FLAME_OK);
    assert_true(spec->users <= TU_BATCH_USERS);
    assert_true(info.num_side_features == 0 || spec->side_rows);
    for (size_t r = 0; r < spec->users; r++) {
        size_t n = 0, mc = 0;
        if (!(spec->edges && r == 0))
            n = spec->full ? spec->hist_max : (size_t)tu_below((int64_t)spec->hist_max + 1);
        if (!(spec->edges && r == 1))
            mc = spec->full ? spec->cand_max : 1 + (size_t)tu_below((int64_t)spec->cand_max);
        int64_t *hist = tu_batch_ids(b, n), *cand = tu_batch_ids(b, mc);
        for (size_t i = 0; i < n; i++) hist[i] = tu_below(info.num_items);
        const int64_t c0 = spec->ranges ? tu_below(info.num_items - (int64_t)mc) : 0;
        const bool range = spec->ranges && r % 3 != 2;
        for (size_t i = 0; i < mc; i++) cand[i] = range ? c0 + (int64_t)i : tu_below(info.num_items);
        b->req[r] = (flame_request){.struct_size = sizeof(flame_request), .history = hist, .history_len = n,
                                    .candidates = cand, .num_candidates = mc,
                                    .num_side_features = (size_t)info.num_side_features};
        tu_batch_side_bags(b, r, info.num_side_features, spec->side_rows, n, mc, spec->full);
        b->total += mc * (size_t)info.num_tasks;
    }
}

static inline void tu_batch_free(tu_batch *b)
{
    for (int i = 0; i < b->nbufs; i++) free(b->bufs[i]);
}

#endif
