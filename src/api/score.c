/* flame_score / flame_score_batch: argument checks, validation of every request, then the
 * forward pass in slices of at most FLAME_OPT_MAX_BATCH requests. */
#include <stdio.h>

#include "core/abi.h"
#include "engine/engine.h"
#include "icache/icache.h"

/* Statistics of a call that succeeded: counters, and its stage times (flame/metrics.h).
 * Feature resolution is timed in its parts, FEATURES being their sum: the user cache's
 * (user_cached), the item cache's (item_cached), and within the latter the feature source's
 * (fetch.missed: the cache's lookup missed an id). */
typedef struct call_times {
    uint64_t start, user_cache, item_cache, tokens, h2d, compute, d2h;
    fl_fetch_time fetch;
    bool user_cached, item_cached, device_copies, h2d_timed;
} call_times;

static void count(flame_engine *engine, const flame_request *reqs, size_t num_requests, uint64_t uc_hits,
                  uint64_t uc_misses, uint64_t tokens, const call_times *t)
{
    atomic_fetch_add(&engine->calls, 1);
    atomic_fetch_add(&engine->requests, num_requests);
    uint64_t cands = 0;
    for (size_t r = 0; r < num_requests; r++) cands += reqs[r].num_candidates;
    atomic_fetch_add(&engine->candidates, cands);
    atomic_fetch_add(&engine->tokens, tokens);
    if (t->user_cached || t->item_cached)
        fl_hist_add(&engine->stage[FLAME_STAGE_FEATURES], t->user_cache + t->item_cache);
    if (t->user_cached) fl_hist_add(&engine->stage[FLAME_STAGE_USER_CACHE], t->user_cache);
    if (t->item_cached) fl_hist_add(&engine->stage[FLAME_STAGE_ITEM_CACHE], t->item_cache);
    if (t->fetch.missed) fl_hist_add(&engine->stage[FLAME_STAGE_SOURCE_FETCH], t->fetch.us);
    if (tokens) {
        fl_hist_add(&engine->stage[FLAME_STAGE_TOKENS], t->tokens);
        fl_hist_add(&engine->stage[FLAME_STAGE_COMPUTE], t->compute);
        if (t->device_copies && t->h2d_timed) fl_hist_add(&engine->stage[FLAME_STAGE_H2D], t->h2d);
        if (t->device_copies) fl_hist_add(&engine->stage[FLAME_STAGE_D2H], t->d2h);
    }
    fl_hist_add(&engine->stage[FLAME_STAGE_TOTAL], fl_now_us() - t->start);
    if (uc_hits) atomic_fetch_add(&engine->user_cache_hits, uc_hits);
    if (uc_misses) atomic_fetch_add(&engine->user_cache_misses, uc_misses);
}

/* The call's outputs share no byte with the requests or the arrays they point to: scores are
 * written pass by pass, so a later pass would read validated ids overwritten by scores. */
static flame_status outputs_apart(const flame_request *requests, const flame_request *reqs, size_t num_requests,
                                  size_t stride, const float *scores, uint64_t total, const fl_topk_spec *topk)
{
    fl_out_range outs[2] = {{scores, (size_t)total * sizeof(float), "scores"}};
    int num_outs = 1;
    if (topk) {
        const size_t n = num_requests * topk->k; /* (flame_score_batch_topk checked the product) */
        outs[0] = (fl_out_range){topk->ids, n * sizeof(int64_t), "ids"};
        outs[1] = (fl_out_range){topk->scores, n * sizeof(float), "scores"};
        num_outs = 2;
    }
    return fl_check_outputs_apart(requests, num_requests, stride, reqs, outs, num_outs);
}

/* `stride`: bytes between the caller's requests (their struct's size). `topk` (backends with
 * a score_topk only; NULL otherwise): each request's k best candidates into topk->ids/scores instead of
 * every score into `scores`. */
static flame_status score(flame_engine *engine, const flame_request *requests, size_t num_requests, size_t stride,
                          float *scores, size_t scores_len, const fl_topk_spec *topk)
{
    if (!engine) return fl_error(FLAME_ERR_INVALID_ARG, "engine is NULL");
    if (num_requests && !requests) return fl_error(FLAME_ERR_INVALID_ARG, "requests is NULL with num_requests %zu",
                                                   num_requests);
    for (size_t r = 0; r < num_requests; r++) /* read in place: the reserved fields are checked here */
        if (fl_struct_reserved("flame_request", sizeof(flame_request), (const char *)requests + r * stride, stride)) {
            char detail[256];
            snprintf(detail, sizeof detail, "%s", flame_last_error());
            return fl_error(FLAME_ERR_INVALID_ARG, "request %zu: %s", r, detail);
        }
    fl_workspace *ws = NULL;
    const flame_request *reqs = requests;
    flame_status st = FLAME_OK;
    uint64_t uc_hits = 0, uc_misses = 0;
    const fl_backend_ops *ops = engine->ops;
    call_times t = {.start = fl_now_us(), .device_copies = ops->device_copies};
    if (fl_requests_need_prepare(requests, num_requests, stride)) { /* older layouts, user-cache histories */
        ws = fl_workspace_acquire(engine);
        if (!ws) return fl_error(FLAME_ERR_NOMEM, "out of memory allocating a workspace");
        st = fl_prepare_requests(engine, ws, requests, num_requests, stride, &reqs, &uc_hits, &uc_misses);
        t.user_cached = uc_hits + uc_misses > 0;
        if (t.user_cached) t.user_cache = fl_now_us() - t.start;
    }
    /* every check but those of the bags the item cache gives comes first, so a refused call
     * fetches nothing from the feature source (and caches nothing) */
    uint64_t total = 0;
    const bool resolve = engine->item_cache && num_requests;
    if (!st) st = fl_validate_requests_mt(engine->model, reqs, num_requests, &total,
                                          resolve ? FL_CHECK_DEFER_BAGS : FL_CHECK_ALL,
                                          ops->threaded_checks ? engine->threads : 1);
    if (!st) st = fl_kv_check_requests(engine, reqs, num_requests);
    if (!st && topk && !ops->score_topk)
        st = fl_error(FLAME_ERR_INTERNAL, "device top-k on a %s engine, which has none", ops->name);
    if (!st && !topk && total > scores_len)
        st = fl_error(FLAME_ERR_BUFFER_TOO_SMALL, "scores has room for %zu floats, %zu request(s) need %llu",
                      scores_len, num_requests, (unsigned long long)total);
    if (!st && !topk && total && !scores) st = fl_error(FLAME_ERR_INVALID_ARG, "scores is NULL");
    if (!st && (total || topk)) st = outputs_apart(requests, reqs, num_requests, stride, scores, total, topk);
    if (!st && resolve) { /* side features of id-only requests, from the cache */
        if (!ws) ws = fl_workspace_acquire(engine);
        if (!ws) return fl_error(FLAME_ERR_NOMEM, "out of memory allocating a workspace");
        const flame_request *given = reqs;
        const uint64_t t0 = fl_now_us();
        st = fl_resolve_features(engine, ws, reqs, num_requests, &reqs, &t.fetch);
        if (reqs != given) t.item_cached = true, t.item_cache = fl_now_us() - t0;
        if (!st && reqs != given) st = fl_validate_resolved(engine->model, given, reqs, num_requests);
    }
    if (st || total == 0) { /* an error, or nothing to write: no work */
        if (ws) fl_workspace_release(engine, ws);
        if (st) return st;
        count(engine, reqs, num_requests, uc_hits, uc_misses, 0, &t);
        return FLAME_OK;
    }
    if (!ws) ws = fl_workspace_acquire(engine);
    if (!ws) return fl_error(FLAME_ERR_NOMEM, "out of memory allocating a workspace");
    const int32_t tasks = engine->model->cfg.num_tasks;
    const size_t slice = (size_t)engine->cfg.max_batch;
    size_t need = 0;
    uint64_t all_tokens = 0;
    for (size_t r0 = 0; r0 < num_requests; r0 += slice) {
        int64_t tokens = 0;
        size_t b = fl_forward_bytes(engine, reqs + r0, num_requests - r0 < slice ? num_requests - r0 : slice,
                                    &tokens);
        if (tokens > INT32_MAX) { /* GEMM dimensions are 32-bit in CBLAS */
            fl_workspace_release(engine, ws);
            return fl_error(FLAME_ERR_INVALID_ARG,
                            "requests %zu.. hold %lld tokens in one pass, more than 2147483647; lower "
                            "FLAME_OPT_MAX_BATCH", r0, (long long)tokens);
        }
        if (b > need) need = b;
        all_tokens += (uint64_t)tokens;
    }
    /* all memory up front: no half-written scores (a device backend keeps its buffers on the device) */
    if (ops->host_scratch) st = fl_workspace_reserve(engine, ws, need);
    float *out = scores;
    t.h2d_timed = true;
    for (size_t r0 = 0; r0 < num_requests && !st; r0 += slice) {
        size_t n = num_requests - r0 < slice ? num_requests - r0 : slice;
        fl_pass_times pt = {0};
        st = topk ? ops->score_topk(engine, reqs + r0, n, topk->k, topk->task, topk->ids + r0 * topk->k,
                                    topk->scores + r0 * topk->k, &pt)
                  : ops->score(engine, ws, reqs + r0, n, out, &pt);
        t.tokens += pt.tokens_us, t.h2d += pt.h2d_us, t.compute += pt.compute_us, t.d2h += pt.d2h_us;
        t.h2d_timed &= pt.h2d_timed;
        for (size_t r = r0; r < r0 + n && !topk; r++) out += reqs[r].num_candidates * (size_t)tasks;
    }
    fl_workspace_release(engine, ws);
    if (st) return st;
    count(engine, reqs, num_requests, uc_hits, uc_misses, all_tokens, &t);
    return FLAME_OK;
}

FLAME_API flame_status flame_score_batch(flame_engine *engine, const flame_request *requests, size_t num_requests,
                                         float *scores, size_t scores_len)
{
    fl_clear_error();
    /* the array's element size is the caller's sizeof(flame_request), which requests[0]
     * gives: another flame.h's is read by the rule of core/abi.h */
    size_t stride = sizeof(flame_request);
    if (num_requests && requests) {
        stride = requests->struct_size;
        flame_status st = fl_struct_size_check("flame_request", stride, sizeof(flame_request));
        if (st) return st; /* (a multiple of 8, the struct's alignment: the elements stay aligned) */
    }
    return score(engine, requests, num_requests, stride, scores, scores_len, NULL);
}

FLAME_API flame_status flame_score(flame_engine *engine, const flame_request *request, float *scores,
                                   size_t scores_len)
{
    fl_clear_error();
    if (!request) return fl_error(FLAME_ERR_INVALID_ARG, "request is NULL");
    flame_status st = fl_struct_size_check("flame_request", request->struct_size, sizeof(flame_request));
    if (st) return st;
    return score(engine, request, 1, request->struct_size, scores, scores_len, NULL);
}

flame_status fl_score_topk_device(flame_engine *engine, const flame_request *requests, size_t num_requests, size_t stride,
                               const fl_topk_spec *topk)
{
    return score(engine, requests, num_requests, stride, NULL, 0, topk);
}
