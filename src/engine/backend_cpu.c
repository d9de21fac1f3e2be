/* The CPU backend (engine/backend.h): the forward pass of engine/forward.c on the engine's
 * thread pool, the kernels and packed weights of engine/cpu_plan.h, the KV cache's blocks in
 * host memory. */
#include "cpu/kernels.h"
#include "engine/backend.h"
#include "engine/cpu_plan.h"
#include "engine/engine.h"
#include "kvcache/kvcache.h"

static flame_status cpu_create(struct flame_engine *e, int device)
{
    (void)device;
    if (strcmp(e->cfg.dtype, "fp32") != 0)
        fl_log(FLAME_LOG_INFO, "FLAME_OPT_DTYPE '%s': the CPU computes in fp32", e->cfg.dtype);
    return fl_cpu_plan_create(e->model, e->threads, e->cfg.cpu_kernels, &e->cpu);
}

static void cpu_destroy(struct flame_engine *e)
{
    fl_cpu_plan_destroy(e->cpu);
    e->cpu = NULL;
}

/* compute: the pass less its token assembly */
static flame_status cpu_score(struct flame_engine *e, fl_workspace *ws, const flame_request *reqs, size_t n,
                              float *scores, fl_pass_times *times)
{
    const uint64_t t0 = fl_now_us();
    ws->tokens_us = 0;
    const flame_status st = fl_forward_cpu(e, ws, reqs, n, scores);
    const uint64_t pass = fl_now_us() - t0;
    *times = (fl_pass_times){.tokens_us = ws->tokens_us, .compute_us = pass > ws->tokens_us ? pass - ws->tokens_us : 0};
    return st;
}

static uint64_t cpu_no_bytes(const struct flame_engine *e)
{
    return 0;
}

static void cpu_graph_counts(const struct flame_engine *e, uint64_t *captures, uint64_t *replays)
{
    *captures = *replays = 0;
}

static int32_t cpu_kv_elem_bytes(const struct flame_engine *e)
{
    return (int32_t)sizeof(float);
}

static flame_status cpu_kv_place(struct flame_engine *e)
{
    const uint64_t bytes = (uint64_t)fl_kv_num_blocks(e->kv) * fl_kv_block_bytes(e->kv);
    e->kv_blocks = fl_aligned_alloc((size_t)bytes);
    if (!e->kv_blocks)
        return fl_error(FLAME_ERR_NOMEM, "out of memory for the KV cache's %llu bytes of blocks", (unsigned long long)bytes);
    const fl_model_cfg *c = &e->model->cfg;
    fl_log(FLAME_LOG_INFO, "KV cache: %d blocks of %d tokens, %llu bytes a token (%d layers, K and V, d_model %d, fp32)",
           fl_kv_num_blocks(e->kv), e->kv_lay.block_tokens, (unsigned long long)fl_kv_token_bytes(&e->kv_lay),
           c->num_blocks, c->d_model);
    return FLAME_OK;
}

static flame_status cpu_warm_profiles(struct flame_engine *e)
{
    return FLAME_OK;
}

static void cpu_profile_counts(const struct flame_engine *e, uint64_t *passes, uint64_t *padding_tokens)
{
    *passes = *padding_tokens = 0;
}

/* one call already uses the engine's threads */
static uint32_t cpu_workers(const struct flame_engine *e, uint32_t cap)
{
    return 1;
}

const fl_backend_ops fl_backend_cpu = {
    .name = "cpu",
    .device_copies = false,
    .threaded_checks = true,
    .host_scratch = true,
    .cuda_graphs = false,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .score = cpu_score,
    .score_topk = NULL,
    .device_bytes = cpu_no_bytes,
    .weight_bytes = cpu_no_bytes,
    .graph_counts = cpu_graph_counts,
    .kv_elem_bytes = cpu_kv_elem_bytes,
    .kv_place = cpu_kv_place,
    .workers = cpu_workers,
    .adopt_profiles = NULL,
    .warm_profiles = cpu_warm_profiles,
    .profile_counts = cpu_profile_counts,
};
