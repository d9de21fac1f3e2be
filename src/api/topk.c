/* flame_score_batch_topk: full-sort retrieval. On a backend with device top-k (the GPU's:
 * engine/backend.h score_topk) the scores stay on the device, which selects each request's k
 * best (cuda/topk.cu) and sends back only those. Elsewhere the requests are scored by flame_score_batch into scratch memory (nothing of the caller's is
 * written until every request has scored), then each request's candidates are ranked by one
 * task's score with a size-k heap: O(m log k) per request of m candidates. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/abi.h"
#include "engine/engine.h"
#include "engine/topk_select.h"

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
    if (stride % _Alignof(flame_request) != 0)
        return fl_error(FLAME_ERR_INVALID_ARG,
                        "request 0: struct_size = %zu is not a multiple of %zu, so it is no sizeof(flame_request)",
                        stride, (size_t)_Alignof(flame_request));
    /* the scratch holds every score; its size comes from the requests as the library reads
     * them (the struct_size rule), and flame_score_batch validates them all */
    size_t total = 0;
    bool device = engine->ops->score_topk != NULL; /* the device kernel counts candidates in 32 bits */
    for (size_t r = 0; r < num_requests; r++) {
        /* each element must be a struct of the stride's size, checked before it is read as one
         * (fl_struct_in reads its own struct_size bytes), as flame_score_batch checks it */
        if ((st = fl_request_stride_check(requests, stride, r))) return st;
        flame_request q;
        memset(&q, 0, sizeof q);
        st = fl_struct_in("flame_request", &q, sizeof q, (const char *)requests + r * stride);
        if (st) return st;
        if (q.num_candidates > (SIZE_MAX / sizeof(float) - total) / (size_t)tasks)
            return fl_error(FLAME_ERR_INVALID_ARG, "request %zu: %zu candidates overflow the scores", r, q.num_candidates);
        total += q.num_candidates * (size_t)tasks;
        if (q.num_candidates > INT32_MAX) device = false;
    }
    if (device && total) {
        const fl_topk_spec spec = {k, task, ids, scores};
        return fl_score_topk_device(engine, requests, num_requests, stride, &spec);
    }
    float *sc = malloc((total ? total : 1) * sizeof *sc);
    fl_ranked *heap = malloc((size_t)k * sizeof *heap);
    if (!sc || !heap) {
        free(sc);
        free(heap);
        return fl_error(FLAME_ERR_NOMEM, "out of memory for %zu scores", total);
    }
    st = flame_score_batch(engine, requests, num_requests, sc, total);
    /* validated: the outputs must not be any request's memory, which the selection still reads
     * (the candidates' ids) while it writes them */
    const fl_out_range outs[2] = {{ids, need * sizeof *ids, "ids"}, {scores, need * sizeof *scores, "scores"}};
    if (!st) st = fl_check_outputs_apart(requests, num_requests, stride, NULL, outs, 2);
    if (!st) {
        size_t off = 0;
        for (size_t r = 0; r < num_requests; r++) {
            flame_request q;
            memset(&q, 0, sizeof q);
            fl_struct_in("flame_request", &q, sizeof q, (const char *)requests + r * stride);
            const size_t kept = fl_topk_select(sc + off, q.num_candidates, tasks, task, q.candidates, k, heap);
            fl_topk_write(heap, kept, k, ids + r * k, scores + r * k);
            off += q.num_candidates * (size_t)tasks;
        }
    }
    free(sc);
    free(heap);
    return st;
}
