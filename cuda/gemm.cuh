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

// One GEMM: y[rows, out] = x[rows, in] . w[out, in]^T (+ bias[out]) (+ beta * y), then the
// epilogue's activation (ReLU, or GELU in its tanh form, cuBLASLt's GELU). Row-major, leading
// dims in elements. x and w are `ab` typed, y and bias `yt` typed; float32 accumulation and
// scale (CUBLAS_COMPUTE_32F: no TF32, so fp32 stays fp32). beta is 0 or 1 (residual add in
// place). Callers name the fields (designated initializers, in declaration order); what they
// leave out is the default here.
struct fl_gemm_args {
    int64_t rows = 0;
    int32_t in = 0, out = 0;
    const void *x = nullptr;
    int64_t ldx = 0;
    const void *w = nullptr;
    int64_t ldw = 0;
    cudaDataType_t ab = CUDA_R_32F;
    const void *bias = nullptr; // [out], yt typed; required by the bias epilogues
    void *y = nullptr;
    int64_t ldy = 0;
    cudaDataType_t yt = CUDA_R_32F;
    float beta = 0.0f;
    fl_epilogue epi = FL_EPI_NONE;
};
flame_status fl_gemm(fl_gemm_ctx *g, cudaStream_t s, const fl_gemm_args &a);
