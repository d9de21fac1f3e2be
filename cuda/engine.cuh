// The GPU engine's state: weights in the compute dtype, buffers, stream, GEMM context.
#pragma once

#include <pthread.h>

#include <vector>

#include "gemm.cuh"
#include "kernels.cuh"

extern "C" {
#include "engine/cuda_backend.h"
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
};

// Consecutive dot-head requests scoring one contiguous id range: one GEMM.
struct fl_dot_group {
    int64_t sel0, count, first_id, num, out;
};

struct fl_cuda_engine {
    int device = 0;
    cudaStream_t stream = nullptr;
    bool own_stream = false;
    pthread_mutex_t lock;
    fl_dtype_opt dtype = FL_COMPUTE_FP32;
    cudaDataType_t ab = CUDA_R_32F; // the compute dtype as cuBLASLt names it
    fl_model_cfg cfg;
    int64_t num_items = 0;
    fl_gemm_ctx gemm;
    // weights
    void *tables[FL_MAX_TABLES] = {};
    fl_dev_linear proj;
    float *position = nullptr;
    float *input_ln_w = nullptr, *input_ln_b = nullptr, *final_ln_w = nullptr, *final_ln_b = nullptr;
    fl_dev_block *blocks = nullptr;  // host array of device pointers
    fl_dev_linear tasks[FL_MAX_TASKS][FL_MAX_TASK_LAYERS];
    // memory
    uint64_t budget = 0, weight_bytes = 0, buffer_bytes = 0;
    void **allocs = nullptr; // every weight allocation, freed at destroy
    size_t num_allocs = 0;
    uint8_t *arena = nullptr; // activations + device copy of the staging, grown as needed
    size_t arena_bytes = 0;
    uint8_t *staging = nullptr; // pinned host buffer for the per-call index data
    size_t staging_bytes = 0;
    // per-call host plans, kept to reuse their memory
    std::vector<fl_seq_plan> seqs;
    std::vector<fl_dot_group> groups;
};


// Device allocation within the engine's memory budget (FLAME_ERR_NOMEM naming both numbers).
flame_status fl_dev_reserve(fl_cuda_engine *g, uint64_t bytes, const char *what);
