// cuBLASLt wrapper. Row-major y = x W^T is column-major y^T = W x^T: A = W (transposed),
// B = x, m = out, n = rows, k = in. A plan (descriptors, layouts, heuristic's algorithm) is
// cached per shape, dtype, epilogue and pointer alignment, with the row count rounded up to
// a power of two: token counts vary from call to call, and one heuristic query (tens of us)
// per distinct count would cost more than the GEMM. The layouts then take the exact count;
// should the cached algorithm refuse it, an exact plan is made.
#include <stdlib.h>
#include <string.h>

#include "cublaslt_loader.cuh"
#include "gemm.cuh"

#define MAX_PLANS 64

struct fl_gemm_key {
    int64_t rows, ldx, ldw, ldy;
    int32_t in, out;
    int32_t ab, yt, epi, beta, align; // align: 16-byte alignment bits of x, w, y, bias
    bool operator==(const fl_gemm_key &o) const { return memcmp(this, &o, sizeof *this) == 0; }
};

struct fl_gemm_plan {
    fl_gemm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
};

flame_status fl_gemm_init(fl_gemm_ctx *g, size_t workspace_bytes)
{
    if (!fl_cublaslt()) return FLAME_ERR_NO_DEVICE; /* the message says which library is missing */
    FL_CUBLAS_TRY(fl_cublaslt()->cublasLtCreate(&g->lt));
    FL_CUDA_TRY(cudaMalloc(&g->workspace, workspace_bytes));
    g->workspace_bytes = workspace_bytes;
    g->plans = static_cast<fl_gemm_plan *>(calloc(MAX_PLANS, sizeof(fl_gemm_plan)));
    if (!g->plans) return fl_error(FLAME_ERR_NOMEM, "out of memory for GEMM plans");
    return FLAME_OK;
}

static void free_plan(fl_gemm_plan *p)
{
    fl_cublaslt()->cublasLtMatmulDescDestroy(p->desc);
    fl_cublaslt()->cublasLtMatrixLayoutDestroy(p->a);
    fl_cublaslt()->cublasLtMatrixLayoutDestroy(p->b);
    fl_cublaslt()->cublasLtMatrixLayoutDestroy(p->c);
}

void fl_gemm_destroy(fl_gemm_ctx *g)
{
    for (int i = 0; i < g->num_plans; i++) free_plan(&g->plans[i]);
    free(g->plans);
    if (g->workspace) cudaFree(g->workspace);
    if (g->lt) fl_cublaslt()->cublasLtDestroy(g->lt);
    *g = fl_gemm_ctx{};
}

static int align_bits(const void *x, const void *w, const void *y, const void *bias)
{
    return (((uintptr_t)x & 15) == 0) | (((uintptr_t)w & 15) == 0) << 1 | (((uintptr_t)y & 15) == 0) << 2 |
           (((uintptr_t)bias & 15) == 0) << 3;
}

static uint32_t min_align(const void *p)
{
    uint32_t a = 16;
    while (a > 1 && ((uintptr_t)p & (a - 1))) a >>= 1;
    return a;
}

static flame_status make_plan(fl_gemm_ctx *g, const fl_gemm_key &k, const void *x, const void *w, const void *y,
                              const void *bias, fl_gemm_plan *p)
{
    p->key = k;
    FL_CUBLAS_TRY(fl_cublaslt()->cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    FL_CUBLAS_TRY(fl_cublaslt()->cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    FL_CUBLAS_TRY(fl_cublaslt()->cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (k.epi == FL_EPI_BIAS) epi = CUBLASLT_EPILOGUE_BIAS;
    if (k.epi == FL_EPI_BIAS_RELU) epi = CUBLASLT_EPILOGUE_RELU_BIAS;
    if (k.epi == FL_EPI_BIAS_GELU_TANH) epi = CUBLASLT_EPILOGUE_GELU_BIAS;
    FL_CUBLAS_TRY(fl_cublaslt()->cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (k.epi != FL_EPI_NONE) {
        cudaDataType_t bt = (cudaDataType_t)k.yt;
        FL_CUBLAS_TRY(fl_cublaslt()->cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    FL_CUBLAS_TRY(fl_cublaslt()->cublasLtMatrixLayoutCreate(&p->a, (cudaDataType_t)k.ab, k.in, k.out, k.ldw));
    FL_CUBLAS_TRY(fl_cublaslt()->cublasLtMatrixLayoutCreate(&p->b, (cudaDataType_t)k.ab, k.in, k.rows, k.ldx));
    FL_CUBLAS_TRY(fl_cublaslt()->cublasLtMatrixLayoutCreate(&p->c, (cudaDataType_t)k.yt, k.out, k.rows, k.ldy));
    cublasLtMatmulPreference_t pref;
    FL_CUBLAS_TRY(fl_cublaslt()->cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = g->workspace_bytes;
    uint32_t aa = min_align(w), ab = min_align(x), ac = min_align(y), ad = min_align(bias ? bias : y);
    fl_cublaslt()->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    fl_cublaslt()->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa);
    fl_cublaslt()->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab);
    fl_cublaslt()->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof ac);
    fl_cublaslt()->cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof ac);
    (void)ad;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = fl_cublaslt()->cublasLtMatmulAlgoGetHeuristic(g->lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &res, &found);
    fl_cublaslt()->cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
        free_plan(p);
        return fl_error(FLAME_ERR_UNSUPPORTED, "cuBLASLt has no algorithm for [%lld x %d] . [%d x %d]^T (epilogue %d): %s",
                        (long long)k.rows, k.in, k.out, k.in, k.epi, fl_cublas_status_name(st));
    }
    p->algo = res.algo;
    return FLAME_OK;
}

flame_status fl_gemm(fl_gemm_ctx *g, cudaStream_t s, const fl_gemm_args &a)
{
    const int64_t rows = a.rows;
    const int32_t in = a.in, out = a.out;
    const void *x = a.x, *w = a.w, *bias = a.bias;
    void *y = a.y;
    const float beta = a.beta;
    const fl_epilogue epi = a.epi;
    if (rows == 0 || out == 0) return FLAME_OK;
    fl_gemm_key k;
    memset(&k, 0, sizeof k); // padding takes part in the comparison
    int64_t bucket = 16;
    while (bucket < rows) bucket <<= 1;
    k.rows = bucket;
    k.ldx = a.ldx;
    k.ldw = a.ldw;
    k.ldy = a.ldy;
    k.in = in;
    k.out = out;
    k.ab = a.ab;
    k.yt = a.yt;
    k.epi = epi;
    k.beta = beta != 0.0f;
    k.align = align_bits(x, w, y, bias);
    fl_gemm_plan *p = nullptr;
    for (int i = 0; i < g->num_plans && !p; i++)
        if (g->plans[i].key == k) p = &g->plans[i];
    if (!p) {
        fl_gemm_plan fresh;
        FL_TRY(make_plan(g, k, x, w, y, bias, &fresh));
        if (g->num_plans == MAX_PLANS) free_plan(&g->plans[--g->num_plans]); // drop the oldest
        memmove(g->plans + 1, g->plans, g->num_plans * sizeof *g->plans);
        g->plans[0] = fresh;
        g->num_plans++;
        p = &g->plans[0];
    }
    if (epi != FL_EPI_NONE)
        FL_CUBLAS_TRY(fl_cublaslt()->cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    const uint64_t n = (uint64_t)rows;
    FL_CUBLAS_TRY(fl_cublaslt()->cublasLtMatrixLayoutSetAttribute(p->b, CUBLASLT_MATRIX_LAYOUT_COLS, &n, sizeof n));
    FL_CUBLAS_TRY(fl_cublaslt()->cublasLtMatrixLayoutSetAttribute(p->c, CUBLASLT_MATRIX_LAYOUT_COLS, &n, sizeof n));
    const float alpha = 1.0f;
    cublasStatus_t st = fl_cublaslt()->cublasLtMatmul(g->lt, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c, &p->algo,
                                       g->workspace, g->workspace_bytes, s);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
        fl_gemm_plan exact; // the bucket's algorithm does not take this row count
        k.rows = rows;
        FL_TRY(make_plan(g, k, x, w, y, bias, &exact));
        if (epi != FL_EPI_NONE)
            fl_cublaslt()->cublasLtMatmulDescSetAttribute(exact.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
        st = fl_cublaslt()->cublasLtMatmul(g->lt, exact.desc, &alpha, w, exact.a, x, exact.b, &beta, y, exact.c, y, exact.c,
                            &exact.algo, g->workspace, g->workspace_bytes, s);
        free_plan(&exact);
    }
    if (st != CUBLAS_STATUS_SUCCESS)
        return fl_error(FLAME_ERR_INTERNAL, "cublasLtMatmul [%lld x %d] . [%d x %d]^T: %s", (long long)rows, in, out,
                        in, fl_cublas_status_name(st));
    return FLAME_OK;
}
