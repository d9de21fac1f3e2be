/* The backend-operations table: what an engine's forward pass runs on (the CPU, or a CUDA
 * device), chosen once at engine creation. The engine, the API entry points, the metrics and
 * the scheduler's interface call through engine->ops and read its properties; only the backend
 * files (engine/backend_cpu.c, engine/backend_cuda.c) know a backend's own state (engine->cpu,
 * engine->gpu). Requests reach a backend validated; it only computes. Never installed. */
#ifndef FLAME_ENGINE_BACKEND_H
#define FLAME_ENGINE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flame/flame.h"

struct flame_engine;
struct fl_workspace;
struct fl_batch_profiles;

/* The stage times of one pass, us: token assembly (host planning and staging), the index
 * upload (h2d), the forward pass (compute) and the scores' copy back (d2h). h2d_timed is false
 * when the upload was not timed apart (a replayed CUDA graph holds it: it counts in compute). */
typedef struct fl_pass_times {
    uint64_t tokens_us, h2d_us, compute_us, d2h_us;
    bool h2d_timed;
} fl_pass_times;

typedef struct fl_backend_ops {
    const char *name; /* "cpu" or "cuda", for messages */
    /* properties, fixed for the backend */
    bool device_copies;   /* passes copy to and from a device: the H2D and D2H stages are timed */
    bool threaded_checks; /* request validation splits over the engine's threads (the CPU's pool) */
    bool host_scratch;    /* passes carve their scratch from the call's workspace, reserved up front */
    bool cuda_graphs;     /* passes may be captured and replayed as CUDA graphs (their counts are metrics) */

    /* Makes the backend's state for an engine whose model, cfg and threads are set; `device`
     * is the CUDA ordinal (-1 for the CPU). On failure nothing is left to destroy. */
    flame_status (*create)(struct flame_engine *e, int device);
    /* Frees what create made (also after a failed kv_place). */
    void (*destroy)(struct flame_engine *e);
    /* Scores n validated requests (one pass; n <= FLAME_OPT_MAX_BATCH) into host `scores`,
     * their concatenated [num_candidates, num_tasks] blocks. `ws` has been reserved for the
     * pass when host_scratch. *times gets the pass's stage times. */
    flame_status (*score)(struct flame_engine *e, struct fl_workspace *ws, const flame_request *reqs, size_t n,
                          float *scores, fl_pass_times *times);
    /* flame_score_batch_topk's pass with the k best candidates of each request by column
     * `task` selected on the device: ids/scores [n, k] on the host. NULL: the backend has no
     * device top-k (the API ranks on the host, engine/topk_select.h). */
    flame_status (*score_topk)(struct flame_engine *e, const flame_request *reqs, size_t n, uint32_t k, uint32_t task,
                               int64_t *ids, float *scores, fl_pass_times *times);
    /* Device bytes held now (weights, activations, workspace, KV cache blocks) and those of
     * the weights; 0 without a device. */
    uint64_t (*device_bytes)(const struct flame_engine *e);
    uint64_t (*weight_bytes)(const struct flame_engine *e);
    /* CUDA graphs captured and replays made (0 without graphs). */
    void (*graph_counts)(const struct flame_engine *e, uint64_t *captures, uint64_t *replays);
    /* Bytes of one element of the KV cache's rows: the compute dtype's. */
    int32_t (*kv_elem_bytes)(const struct flame_engine *e);
    /* Places the blocks of the engine's KV cache (e->kv, laid out by e->kv_lay) where the
     * passes read them: host memory or device memory. FLAME_ERR_NOMEM with the numbers. */
    flame_status (*kv_place)(struct flame_engine *e);
    /* Batches the backend runs at once, capped at `cap` (the scheduler's workers). */
    uint32_t (*workers)(const struct flame_engine *e, uint32_t cap);
    /* Gives an engine without batch profiles of its own these (a scheduler's); NULL: the
     * backend does not pad passes to batch profiles. */
    void (*adopt_profiles)(struct flame_engine *e, const struct fl_batch_profiles *ps);
    /* Readies every batch profile's shape before the first request; FLAME_OK when there is
     * nothing to warm. A failure leaves the engine usable. */
    flame_status (*warm_profiles)(struct flame_engine *e);
    /* Passes padded to a batch profile and the padding tokens they computed (0 without). */
    void (*profile_counts)(const struct flame_engine *e, uint64_t *passes, uint64_t *padding_tokens);
} fl_backend_ops;

extern const fl_backend_ops fl_backend_cpu;
extern const fl_backend_ops fl_backend_cuda; /* engine/backend_cuda.c over cuda/ (engine/no_cuda.c without CUDA) */

#endif
