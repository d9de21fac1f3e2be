/* The CUDA backend (engine/backend.h) over cuda/ (engine/cuda_backend.h; engine/no_cuda.c
 * stands in when the library is built without CUDA): the forward pass on the device's
 * executors, top-k on the device, the KV cache's blocks in device memory. */
#include "engine/backend.h"
#include "engine/cuda_backend.h"
#include "engine/engine.h"
#include "kvcache/kvcache.h"

static flame_status cuda_create(struct flame_engine *e, int device)
{
    const flame_model *m = e->model;
    flame_status st = fl_cuda_engine_create(&m->cfg, &m->w, m->num_items, &e->cfg, device, &e->gpu);
    if (st) return st;
    fl_log(FLAME_LOG_INFO, "engine on cuda:%d (%s), %llu bytes of device memory", device, e->cfg.dtype,
           (unsigned long long)fl_cuda_device_bytes(e->gpu));
    return FLAME_OK;
}

static void cuda_destroy(struct flame_engine *e)
{
    fl_cuda_engine_destroy(e->gpu);
    e->gpu = NULL;
}

static void pass_times(const fl_cuda_times *ct, fl_pass_times *times)
{
    *times = (fl_pass_times){.tokens_us = ct->tokens_us, .h2d_us = ct->h2d_us, .compute_us = ct->compute_us,
                             .d2h_us = ct->d2h_us, .h2d_timed = ct->h2d_timed};
}

/* the backend times its own stages (host planning, CUDA events); its buffers are on the device */
static flame_status cuda_score(struct flame_engine *e, fl_workspace *ws, const flame_request *reqs, size_t n,
                               float *scores, fl_pass_times *times)
{
    fl_cuda_times ct = {0};
    const flame_status st = fl_cuda_score(e->gpu, reqs, n, scores, &ct);
    pass_times(&ct, times);
    return st;
}

static flame_status cuda_score_topk(struct flame_engine *e, const flame_request *reqs, size_t n, uint32_t k,
                                    uint32_t task, int64_t *ids, float *scores, fl_pass_times *times)
{
    fl_cuda_times ct = {0};
    const flame_status st = fl_cuda_score_topk(e->gpu, reqs, n, k, task, ids, scores, &ct);
    pass_times(&ct, times);
    return st;
}

static uint64_t cuda_device_bytes(const struct flame_engine *e)
{
    return fl_cuda_device_bytes(e->gpu);
}

static uint64_t cuda_weight_bytes(const struct flame_engine *e)
{
    return fl_cuda_weight_bytes(e->gpu);
}

static void cuda_graph_counts(const struct flame_engine *e, uint64_t *captures, uint64_t *replays)
{
    fl_cuda_graph_counts(e->gpu, captures, replays);
}

/* the compute dtype: fp16 and bf16 take 2 bytes */
static int32_t cuda_kv_elem_bytes(const struct flame_engine *e)
{
    return fl_config_dtype(&e->cfg) != FL_COMPUTE_FP32 ? 2 : (int32_t)sizeof(float);
}

/* the blocks live on the device, in the engine's device bytes */
static flame_status cuda_kv_place(struct flame_engine *e)
{
    flame_status st = fl_cuda_kv_attach(e->gpu, e->kv, &e->kv_lay);
    if (st) return st;
    const fl_model_cfg *c = &e->model->cfg;
    fl_log(FLAME_LOG_INFO, "KV cache on the device: %d blocks of %d tokens, %llu bytes a token (%d layers, K and V, "
           "d_model %d, %s)", fl_kv_num_blocks(e->kv), e->kv_lay.block_tokens,
           (unsigned long long)fl_kv_token_bytes(&e->kv_lay), c->num_blocks, c->d_model, e->cfg.dtype);
    return FLAME_OK;
}

/* one batch an executor; a caller's CUDA stream is one executor */
static uint32_t cuda_workers(const struct flame_engine *e, uint32_t cap)
{
    const int64_t ex = e->cfg.cuda_stream ? 1 : e->cfg.cuda_executors;
    return (uint32_t)(ex < 1 ? 1 : ex > (int64_t)cap ? cap : ex);
}

static void cuda_adopt_profiles(struct flame_engine *e, const fl_batch_profiles *ps)
{
    fl_cuda_adopt_profiles(e->gpu, ps);
}

static flame_status cuda_warm_profiles(struct flame_engine *e)
{
    return fl_cuda_warm_profiles(e->gpu);
}

static void cuda_profile_counts(const struct flame_engine *e, uint64_t *passes, uint64_t *padding_tokens)
{
    fl_cuda_profile_counts(e->gpu, passes, padding_tokens);
}

const fl_backend_ops fl_backend_cuda = {
    .name = "cuda",
    .device_copies = true,
    .threaded_checks = false,
    .host_scratch = false,
    .cuda_graphs = true,
    .create = cuda_create,
    .destroy = cuda_destroy,
    .score = cuda_score,
    .score_topk = cuda_score_topk,
    .device_bytes = cuda_device_bytes,
    .weight_bytes = cuda_weight_bytes,
    .graph_counts = cuda_graph_counts,
    .kv_elem_bytes = cuda_kv_elem_bytes,
    .kv_place = cuda_kv_place,
    .workers = cuda_workers,
    .adopt_profiles = cuda_adopt_profiles,
    .warm_profiles = cuda_warm_profiles,
    .profile_counts = cuda_profile_counts,
};
