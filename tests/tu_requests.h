/* Random requests for the GPU suites: a batch owning its id arrays, and side bags of 0..3 ids
 * (exactly 3 when full) for a request's history and candidates. Header-only, like the other
 * test helpers; include after testutil.h. */
#ifndef FLAME_TU_REQUESTS_H
#define FLAME_TU_REQUESTS_H

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
    int64_t *p = (int64_t *)calloc(n + 1, sizeof *p);
    b->bufs[b->nbufs++] = p;
    return p;
}

/* User r's side bags: for each of the model's side features, a bag per history item (n) and per
 * candidate (mc) of 0..3 ids below side_rows[slot] (3 when full), set on the request. */
static inline void tu_batch_side_bags(tu_batch *b, size_t r, int num_side, const int64_t *side_rows, size_t n,
                                      size_t mc, bool full)
{
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

static inline void tu_batch_free(tu_batch *b)
{
    for (int i = 0; i < b->nbufs; i++) free(b->bufs[i]);
}

#endif
