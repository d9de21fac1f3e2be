// Linear layers through cuBLASLt with fused epilogues.
#pragma once

#include "common.cuh"

enum fl_epilogue { FL_EPI_NONE = 0, FL_EPI_BIAS, FL_EPI_BIAS_RELU, FL_EPI_BIAS_GELU_TANH };

struct fl_gemm_plan; // a cached (descriptors, layouts, algorithm) for one shape

struct fl_gemm_ctx {
    cublasLtHandle_t lt = nullptr;
    void *workspace = nullptr;
    size_t workspace_bytes = 0;
    fl_gemm_plan *plans = nullptr; // small cache, most recently made first
    int num_plans = 0;
};

flame_status fl_gemm_init(fl_gemm_ctx *g, size_t workspace_bytes);
void fl_gemm_destroy(fl_gemm_ctx *g);

// y[rows, out] = x[rows, in] . W[out, in]^T (+ bias[out]) (+ beta * y), then the epilogue's
// activation (ReLU, or GELU in its tanh form, cuBLASLt's GELU). Row-major, leading dims in
// elements. x and W are `ab` typed, y and bias `yt` typed; float32 accumulation and scale
// (CUBLAS_COMPUTE_32F: no TF32, so fp32 stays fp32). beta is 0 or 1 (residual add in place).
flame_status fl_gemm(fl_gemm_ctx *g, cudaStream_t s, int64_t rows, int32_t in, int32_t out, const void *x, int64_t ldx,
                     const void *w, int64_t ldw, cudaDataType_t ab, const void *bias, void *y, int64_t ldy,
                     cudaDataType_t yt, float beta, fl_epilogue epi);
