// cuBLASLt is loaded with dlopen when the first GPU engine is made, not linked: a CPU-only
// user of a CUDA-built libflame neither needs the CUDA libraries installed nor pays for
// mapping a half-gigabyte library at start.
#pragma once

#include "common.cuh"

struct fl_cublaslt_api {
#define FL_LT_FN(name) decltype(&::name) name;
    FL_LT_FN(cublasLtCreate)
    FL_LT_FN(cublasLtDestroy)
    FL_LT_FN(cublasLtMatmul)
    FL_LT_FN(cublasLtMatmulAlgoGetHeuristic)
    FL_LT_FN(cublasLtMatmulDescCreate)
    FL_LT_FN(cublasLtMatmulDescDestroy)
    FL_LT_FN(cublasLtMatmulDescSetAttribute)
    FL_LT_FN(cublasLtMatmulPreferenceCreate)
    FL_LT_FN(cublasLtMatmulPreferenceDestroy)
    FL_LT_FN(cublasLtMatmulPreferenceSetAttribute)
    FL_LT_FN(cublasLtMatrixLayoutCreate)
    FL_LT_FN(cublasLtMatrixLayoutDestroy)
    FL_LT_FN(cublasLtMatrixLayoutSetAttribute)
#undef FL_LT_FN
};

// The loaded entry points (once per process, thread-safe); NULL with the reason in
// flame_last_error() (FLAME_ERR_NO_DEVICE) when the library or a symbol is missing.
const fl_cublaslt_api *fl_cublaslt(void);
