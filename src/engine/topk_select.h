/* Ranking of scored candidates for flame_score_batch_topk, shared by the host path
 * (src/api/topk.c) and the GPU engine (which selects on the device and ranks the few it
 * returns, or falls back to this selection when ties at the k-th score need the id rule). */
#ifndef FL_TOPK_SELECT_H
#define FL_TOPK_SELECT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fl_ranked {
    float score;
    int64_t id;
    size_t pos; /* candidate index in its request */
} fl_ranked;

/* Sorts v best first: higher score (NaN below every number, -0 equal to +0), then lower item
 * id, then the earlier candidate. */
void fl_ranked_sort(fl_ranked *v, size_t n);
/* The k best of m candidates (score of candidate i: sc[i * tasks + task], item id cand[i])
 * into heap [k], best first (a size-k heap, O(m log k)). Returns how many: min(k, m). */
size_t fl_topk_select(const float *sc, size_t m, int32_t tasks, uint32_t task, const int64_t *cand, uint32_t k,
                      fl_ranked *heap);
/* ids/scores [k] of one request: the kept entries, then -1 / -INFINITY. */
void fl_topk_write(const fl_ranked *v, size_t kept, uint32_t k, int64_t *ids, float *scores);

#ifdef __cplusplus
}
#endif

#endif
