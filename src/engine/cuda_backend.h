/* The GPU backend as the engine sees it (implemented in cuda/, stand-in in src/engine/no_cuda.c).
 * The engine validates requests on the host; the backend only computes. */
#ifndef FLAME_ENGINE_CUDA_BACKEND_H
#define FLAME_ENGINE_CUDA_BACKEND_H

#include "core/options.h"
#include "engine/batch_profiles.h"
#include "kvcache/kvlayout.h"
#include "model/model_cfg.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fl_cuda_engine fl_cuda_engine;
struct fl_kv_cache;

/* Uploads the model's weights to `device` in cfg->dtype (FLAME_ERR_NOMEM with the numbers
 * when they exceed cfg->device_memory_budget), creates the cuBLASLt handle and stream. */
flame_status fl_cuda_engine_create(const fl_model_cfg *mc, const fl_weights *w, int64_t num_items,
                                   const struct flame_config *cfg, int device, fl_cuda_engine **out);
void fl_cuda_engine_destroy(fl_cuda_engine *g);
/* The stage times of one pass, us: the host's planning and staging (tokens), then the
 * device's own times from CUDA events: the index upload (h2d; 0 when the pass replays a CUDA
 * graph, which holds the upload: it then counts in compute), the forward pass and the scores'
 * copy back. */
typedef struct fl_cuda_times {
    uint64_t tokens_us, h2d_us, compute_us, d2h_us;
    bool h2d_timed;
} fl_cuda_times;

/* Scores validated requests (one pass) into host `scores`; `times` (may be NULL) gets the
 * pass's stage times. Serialized per engine. */
flame_status fl_cuda_score(fl_cuda_engine *g, const flame_request *reqs, size_t n, float *scores,
                           fl_cuda_times *times);
/* flame_score_batch_topk's pass on the device: validated requests (one pass) scored and their
 * k best candidates by column `task` selected there; ids/scores [n, k] on the host, ranked
 * as src/engine/topk_select.h ranks. */
flame_status fl_cuda_score_topk(fl_cuda_engine *g, const flame_request *reqs, size_t n, uint32_t k, uint32_t task,
                                int64_t *ids, float *scores, fl_cuda_times *times);
/* Gives the engine its KV cache: the bookkeeping `kv` (the caller's; it outlives g) and one
 * device allocation for all its blocks, laid out by lay (elements of the compute dtype),
 * counted in the device bytes and checked against FLAME_OPT_DEVICE_MEMORY_BUDGET
 * (FLAME_ERR_NOMEM with the numbers). Before the first score. */
flame_status fl_cuda_kv_attach(fl_cuda_engine *g, struct fl_kv_cache *kv, const fl_kv_layout *lay);
/* Device bytes held now: weights, activation buffers, workspace, KV cache blocks. */
uint64_t fl_cuda_device_bytes(const fl_cuda_engine *g);
uint64_t fl_cuda_weight_bytes(const fl_cuda_engine *g);
/* CUDA graphs captured and replays made, over all executors. */
void fl_cuda_graph_counts(const fl_cuda_engine *g, uint64_t *captures, uint64_t *replays);
/* Gives an engine without batch profiles of its own these (a scheduler's); an engine that has
 * some keeps them. Thread-safe; a pass reads the set in force when it starts. */
void fl_cuda_adopt_profiles(fl_cuda_engine *g, const fl_batch_profiles *ps);
/* Runs each batch profile's full shape twice on every executor (largest first) so that its
 * buffers, kernels, GEMM plans and CUDA graph are ready before the first request; waits for
 * every executor. FLAME_OK without profiles or under the dot head; a failure (e.g.
 * FLAME_ERR_NOMEM under the memory budget) leaves the engine usable. */
flame_status fl_cuda_warm_profiles(fl_cuda_engine *g);
/* Passes padded to a batch profile and the padding tokens they computed. */
void fl_cuda_profile_counts(const fl_cuda_engine *g, uint64_t *passes, uint64_t *padding_tokens);

#ifdef __cplusplus
}
#endif
#endif
