/* Ranking of scored candidates (topk_select.h). */
#include "engine/topk_select.h"

#include <math.h>
#include <stdlib.h>

/* a ranks before b: higher score (NaN below every number), then lower item id, then the
 * earlier candidate */
static int before(const fl_ranked *a, const fl_ranked *b)
{
    const int an = isnan(a->score), bn = isnan(b->score);
    if (an != bn) return bn;
    if (!an && a->score != b->score) return a->score > b->score; /* -0 == +0 */
    if (a->id != b->id) return a->id < b->id;
    return a->pos < b->pos;
}

/* min-heap by rank: the root is the worst of the k kept */
static void sift_down(fl_ranked *h, size_t n, size_t i)
{
    for (;;) {
        size_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && before(&h[w], &h[l])) w = l;
        if (r < n && before(&h[w], &h[r])) w = r;
        if (w == i) return;
        const fl_ranked t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static int cmp_rank(const void *a, const void *b)
{
    return before(a, b) ? -1 : before(b, a) ? 1 : 0;
}

/* The k best of one request's m candidates into heap[0..kept), best first. */
size_t fl_topk_select(const float *sc, size_t m, int32_t tasks, uint32_t task, const int64_t *cand, uint32_t k,
                       fl_ranked *heap)
{
    size_t n = 0;
    for (size_t i = 0; i < m; i++) {
        const fl_ranked x = {sc[i * (size_t)tasks + task], cand[i], i};
        if (n < k) {
            heap[n++] = x;
            if (n == k)
                for (size_t j = k / 2; j-- > 0;) sift_down(heap, k, j);
        } else if (before(&x, &heap[0])) {
            heap[0] = x;
            sift_down(heap, k, 0);
        }
    }
    fl_ranked_sort(heap, n);
    return n;
}

void fl_ranked_sort(fl_ranked *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_rank);
}

void fl_topk_write(const fl_ranked *v, size_t kept, uint32_t k, int64_t *ids, float *scores)
{
    for (size_t j = 0; j < k; j++) {
        ids[j] = j < kept ? v[j].id : -1;
        scores[j] = j < kept ? v[j].score : -INFINITY;
    }
}
