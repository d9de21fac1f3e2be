/* flame_score_batch_topk: full-sort retrieval on top of flame_score_batch. The requests are
 * scored into scratch memory (nothing of the caller's is written until every request has
 * scored), then each request's candidates are ranked by one task's score with a size-k heap:
 * O(m log k) per request of m candidates, k <= FLAME_TOPK_MAX. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/abi.h"
#include "engine/engine.h"

typedef struct ranked {
    float score;
    int64_t id;
    size_t pos; /* candidate index in its request */
} ranked;

/* a ranks before b: higher score (NaN below every number), then lower item id, then the
 * earlier candidate */
static int before(const ranked *a, const ranked *b)
{
    const int an = isnan(a->score), bn = isnan(b->score);
    if (an != bn) return bn;
    if (!an && a->score != b->score) return a->score > b->score;
    if (a->id != b->id) return a->id < b->id;
    return a->pos < b->pos;
}

/* min-heap by rank: the root is the worst of the k kept */
static void sift_down(ranked *h, size_t n, size_t i)
{
    for (;;) {
        size_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && before(&h[w], &h[l])) w = l;
        if (r < n && before(&h[w], &h[r])) w = r;
        if (w == i) return;
        const ranked t = h[i];
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
static size_t select_k(const float *sc, size_t m, int32_t tasks, uint32_t task, const int64_t *cand, uint32_t k,
                       ranked *heap)
{
    size_t n = 0;
    for (size_t i = 0; i < m; i++) {
        const ranked x = {sc[i * (size_t)tasks + task], cand[i], i};
        if (n < k) {
            heap[n++] = x;
            if (n == k)
                for (size_t j = k / 2; j-- > 0;) sift_down(heap, k, j);
        } else if (before(&x, &heap[0])) {
            heap[0] = x;
            sift_down(heap, k, 0);
        }
    }
    qsort(heap, n, sizeof *heap, cmp_rank);
    return n;
}

FLAME_API flame_status flame_score_batch_topk(flame_engine *engine, const flame_request *requests,
                                              size_t num_requests, uint32_t k, uint32_t task, int64_t *ids,
                                              float *scores, size_t out_len)
{
    fl_clear_error();
    if (!engine) return fl_error(FLAME_ERR_INVALID_ARG, "engine is NULL");
    if (k < 1 || k > FLAME_TOPK_MAX)
        return fl_error(FLAME_ERR_INVALID_ARG, "k = %u is out of range [1, %d]", k, FLAME_TOPK_MAX);
    const int32_t tasks = engine->model->cfg.num_tasks;
    if (task >= (uint32_t)tasks)
        return fl_error(FLAME_ERR_INVALID_ARG, "task %u: the model scores %d task(s)", task, (int)tasks);
    if (num_requests && !requests)
        return fl_error(FLAME_ERR_INVALID_ARG, "requests is NULL with num_requests %zu", num_requests);
    if (num_requests > SIZE_MAX / k)
        return fl_error(FLAME_ERR_INVALID_ARG, "%zu requests x k %u overflow", num_requests, k);
    const size_t need = num_requests * k;
    if (out_len < need)
        return fl_error(FLAME_ERR_BUFFER_TOO_SMALL, "ids and scores have room for %zu entries, %zu request(s) x k %u need %zu",
                        out_len, num_requests, k, need);
    if (need && (!ids || !scores)) return fl_error(FLAME_ERR_INVALID_ARG, "ids or scores is NULL");
    if (!num_requests) return flame_score_batch(engine, requests, 0, NULL, 0);
    const size_t stride = requests->struct_size;
    flame_status st = fl_struct_size_check("flame_request", stride, sizeof(flame_request));
    if (st) return st;
    /* the scratch holds every score; its size comes from the requests as the library reads
     * them (the struct_size rule), and flame_score_batch validates them all */
    size_t total = 0;
    for (size_t r = 0; r < num_requests; r++) {
        flame_request q;
        memset(&q, 0, sizeof q);
        st = fl_struct_in("flame_request", &q, sizeof q, (const char *)requests + r * stride);
        if (st) return st;
        if (q.num_candidates > (SIZE_MAX / sizeof(float) - total) / (size_t)tasks)
            return fl_error(FLAME_ERR_INVALID_ARG, "request %zu: %zu candidates overflow the scores", r, q.num_candidates);
        total += q.num_candidates * (size_t)tasks;
    }
    float *sc = malloc((total ? total : 1) * sizeof *sc);
    ranked *heap = malloc((size_t)k * sizeof *heap);
    if (!sc || !heap) {
        free(sc);
        free(heap);
        return fl_error(FLAME_ERR_NOMEM, "out of memory for %zu scores", total);
    }
    st = flame_score_batch(engine, requests, num_requests, sc, total);
    if (!st) {
        size_t off = 0;
        for (size_t r = 0; r < num_requests; r++) {
            flame_request q;
            memset(&q, 0, sizeof q);
            fl_struct_in("flame_request", &q, sizeof q, (const char *)requests + r * stride);
            const size_t kept = select_k(sc + off, q.num_candidates, tasks, task, q.candidates, k, heap);
            for (size_t j = 0; j < k; j++) {
                ids[r * k + j] = j < kept ? heap[j].id : -1;
                scores[r * k + j] = j < kept ? heap[j].score : -INFINITY;
            }
            off += q.num_candidates * (size_t)tasks;
        }
    }
    free(sc);
    free(heap);
    return st;
}
