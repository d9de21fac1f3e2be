// The GPU engine's state: weights in the compute dtype (shared), and executors, each with
// its own stream, GEMM workspace, buffers and captured CUDA graphs, so concurrent calls run
// on different executors and their copies and kernels overlap.
#pragma once

#include <pthread.h>

#include <atomic>

#include <vector>

#include "gemm.cuh"
#include "graphs.cuh"
#include "kernels.cuh"

extern "C" {
#include "core/slot_pool.h"
#include "engine/batch_profiles.h"
#include "engine/cuda_backend.h"
#include "kvcache/kvcache.h"
#include "kvcache/kvlayout.h"
}

struct fl_dev_linear {
    void *w = nullptr;    // [out, in], compute dtype
    void *b = nullptr;    // [out], compute dtype (bt == ab) or float (bt == CUDA_R_32F)
    int32_t out = 0, in = 0;
};

struct fl_dev_block {
    fl_dev_linear qkv;            // q, k, v fused: [3d, d], bias in the compute dtype
    fl_dev_linear o, fc2;         // float bias: they add into the float residual stream
    fl_dev_linear fc1;            // bias in the compute dtype
    float *ln1_w, *ln1_b, *ln2_w, *ln2_b;
};

struct fl_seq_plan {
    int64_t start, n, m, off, sel0, nsel, out; // out: first score of the request
    // KV cache: history rows 0..p0-1 come from the cache (only rows p0..n-1 and the
    // candidates are tokens of the pass, from `off`); kv: the sequence's first row in the K/V
    // workspace, which holds all its n + m rows
    int64_t p0, kv;
    // dot head: the candidates are one run of consecutive ids (scored by one GEMM over that
    // range of the item table, no gather)
    bool contig;
};

// Consecutive dot-head requests scoring one contiguous id range: one GEMM.
struct fl_dot_group {
    int64_t sel0, count, first_id, num, out;
};

struct fl_cuda_executor {
    cudaStream_t stream = nullptr;
    bool own_stream = false;
    fl_gemm_ctx gemm;
    uint8_t *arena = nullptr; // device: a copy of the staging, then the activations
    size_t arena_bytes = 0;
    uint8_t *staging = nullptr; // pinned host: the per-call index data
    size_t staging_bytes = 0;
    std::vector<fl_seq_plan> seqs; // per-call plans, kept to reuse their memory
    std::vector<fl_dot_group> groups;
    std::vector<uint64_t> kv_prefix; // a KV-cache request's prefix hashes ([n + 1])
    // padded passes: the largest capacity of each multi-id side slot's ids so far (a power of
    // two); it only grows, so a profile's signature settles after a few passes
    int64_t side_cap[FL_MAX_FEATURES] = {};
    std::vector<int64_t> signature; // this pass's (its memory kept from call to call)
    fl_graph_cache graphs;
    uint32_t *attn_work = nullptr; // device: the attention kernel's work counters (fl_attn_args::work)
    // the stage timers of a pass (flame/metrics.h): before the upload, after it (uncaptured
    // passes only), after the forward pass, after the scores' copy back
    cudaEvent_t ev[4] = {};
};

struct fl_cuda_engine {
    int device = 0;
    flame_pinned_pool *pinned = nullptr; // staging buffers: NUMA-local pages registered with CUDA
    fl_dtype_opt dtype = FL_COMPUTE_FP32;
    cudaDataType_t ab = CUDA_R_32F; // the compute dtype as cuBLASLt names it
    fl_model_cfg cfg;
    int64_t num_items = 0;
    bool use_graphs = true;
    bool attention_portable = false; // FLAME_OPT_CUDA_ATTENTION = 1
    // batch profiles (FLAME_OPT_BATCH_PROFILES, or a scheduler's given once): passes are
    // padded to them (cuda/forward.cu). Published once, read by every pass without a lock.
    fl_batch_profiles own_profiles = {}, adopted_profiles = {};
    std::atomic<const fl_batch_profiles *> profiles{nullptr};
    std::atomic<uint64_t> profile_passes{0}, profile_padding{0};
    // weights
    void *tables[FL_MAX_TABLES] = {}; // compute dtype; for an int8 table only the dot head's dequantized copy
    int8_t *tables_q8[FL_MAX_TABLES] = {}; // int8 tables that features read, as stored
    float *qparams[FL_MAX_TABLES] = {};    // their [rows, 2] (scale, bias)
    fl_dev_linear proj;
    float *position = nullptr;
    float *input_ln_w = nullptr, *input_ln_b = nullptr, *final_ln_w = nullptr, *final_ln_b = nullptr;
    fl_dev_block *blocks = nullptr; // host array of device pointers
    fl_dev_linear tasks[FL_MAX_TASKS][FL_MAX_TASK_LAYERS];
    // SUMI head: the first layers of the two-layer tasks that share one activation are one
    // stacked [head_stack_width, d] GEMM (tasks[t][0] point into it); the width-1 last layers
    // of those tasks and of the one-layer tasks run as one fused launch (head_tails)
    fl_dev_linear head_stack;
    fl_activation head_stack_act = FL_ACT_RELU;
    int32_t head_stack_width = 0;
    int32_t task_col[FL_MAX_TASKS] = {};      // a stacked task's first column in the stacked output
    bool task_fused[FL_MAX_TASKS] = {};       // its last layer is one of head_tails
    fl_task_tail *head_tails = nullptr;       // device array
    int32_t num_tails = 0;
    void **allocs = nullptr; // every weight allocation, freed at destroy
    size_t num_allocs = 0;
    // executors, handed out first come, first served (core/slot_pool.h says why)
    fl_cuda_executor *ex = nullptr;
    int num_ex = 0;
    fl_slot_pool ex_pool = {};
    pthread_mutex_t pool_lock;
    // the user-history KV cache (docs/kv-cache.md): the engine's bookkeeping (src/kvcache),
    // and its blocks in device memory, one allocation of kv_bytes laid out by kv_lay
    fl_kv_cache *kv = nullptr;
    fl_kv_layout kv_lay = {};
    uint8_t *kv_blocks = nullptr;
    // device memory, under pool_lock once executors exist
    uint64_t budget = 0, weight_bytes = 0, buffer_bytes = 0, workspace_bytes = 0, kv_bytes = 0;
};

// Checks that `bytes` more fit the engine's memory budget (FLAME_ERR_NOMEM naming the numbers).
flame_status fl_dev_reserve(fl_cuda_engine *g, uint64_t bytes, const char *what);
