/* CPU kernels. Each family has one contract that the GPU version (cuda/) honours too.
 * Kernels know nothing of requests, models or caches: plain arrays, row-major, float32.
 * Preconditions (ids in range, valid CSR offsets) are checked by the caller before launch. */
#ifndef FLAME_CPU_KERNELS_H
#define FLAME_CPU_KERNELS_H

#include "core/common.h"

typedef enum fl_pooling_kind { FL_KPOOL_SUM = 0, FL_KPOOL_MEAN = 1 } fl_pooling_kind;
typedef enum fl_act_kind { FL_KACT_NONE = 0, FL_KACT_GELU_ERF, FL_KACT_GELU_TANH, FL_KACT_RELU } fl_act_kind;
/* Vector instruction sets of the own kernels, chosen from the CPU's feature bits. */
typedef enum fl_cpu_isa { FL_ISA_BASE = 0, FL_ISA_AVX2 = 1, FL_ISA_AVX512 = 2 } fl_cpu_isa;
/* The widest set this CPU and operating system run: AVX-512F, else AVX2 with FMA, else base
 * (read once, then cached). */
fl_cpu_isa fl_cpu_isa_detect(void);
/* Whether the CPU converts fp16 in vector registers (F16C), which the AVX2 level does not
 * imply (read once, then cached). */
bool fl_cpu_has_f16c(void);
const char *fl_cpu_isa_name(fl_cpu_isa isa);


/* fp16 (IEEE binary16) and bf16 (the top 16 bits of a binary32) values, held as 16-bit patterns. */
typedef enum fl_half_kind { FL_HALF_F16 = 0, FL_HALF_BF16 = 1 } fl_half_kind;

/* One feature's bags over a run of tokens, read from one table. */
typedef struct fl_emb_feature {
    const float *table;      /* [rows, dim]; unused when table_q8 or table_h16 is set */
    int64_t rows;
    int32_t dim;
    fl_pooling_kind pooling; /* sum, or mean over the bag (an empty bag gives zeros either way) */
    const int64_t *offsets;  /* [num_tokens + 1]: token t's ids are ids[offsets[t]..offsets[t+1]); NULL: ids[t] alone */
    const int64_t *ids;
    int32_t out_col;         /* first output column this feature adds into */
    const int8_t *table_q8;  /* non-NULL: an int8 table [rows, dim], row r worth qparams[2r] * q + qparams[2r + 1] */
    const float *qparams;    /* [rows, 2] (scale, bias) of table_q8 */
    const uint16_t *table_h16; /* non-NULL: an fp16 or bf16 table [rows, dim] (h16_kind) */
    fl_half_kind h16_kind;
} fl_emb_feature;

/* Table-batched embedding bag: for each token t and feature f,
 *   out[t, f.out_col : f.out_col + f.dim] += pool_{i in bag(t, f)} f.table[i, :]
 * after out[t, 0:width] is zeroed. Features sharing out_col 0 are summed ("sum" combine);
 * disjoint columns concatenate. One pass over the tokens, all features per token.
 * An int8 table's row is dequantized on the fly in float32, value = scale * q + bias (the
 * same float32 operations as a table dequantized once to F32, so both give the same bits); an
 * fp16 or bf16 table's values are widened to float32 (exactly) as they are read
 * (fl_cpu_add_row_half: the same bits as the table converted to F32 once). */
void fl_cpu_embedding_bag(const fl_emb_feature *features, int num_features, int64_t num_tokens, float *out,
                          int64_t ldo, int32_t width);

/* dst[j] += w * value(src[j]) for j in 0..n-1: each fp16 or bf16 value widened to float32
 * (exactly), then one float32 product and one float32 sum, unfused (a float32 row's operations:
 * a row gives the bits its float32 copy gives). Vector code for AVX-512F, and for AVX2 (bf16)
 * or AVX2 with F16C (fp16), picked from the CPU's feature bits; every isa gives the same bits. */
void fl_cpu_add_row_half(float *dst, const uint16_t *src, int32_t n, float w, fl_half_kind kind);
/* The same with the given instruction set (fl_cpu_isa_detect's or narrower; fp16 at AVX2 runs
 * the base code on a CPU without F16C). */
void fl_cpu_add_row_half_isa(fl_cpu_isa isa, float *dst, const uint16_t *src, int32_t n, float w,
                             fl_half_kind kind);

/* dst[i] = src[i] widened exactly to float32 (the values fl_cpu_add_row_half adds); src is n
 * 16-bit patterns at any address (a mapped file's bytes). */
void fl_cpu_widen_half(float *dst, const void *src, int64_t n, fl_half_kind kind);

/* dst[i] = src[i] rounded to fp16 or bf16, to nearest with ties to even (IEEE 754
 * roundTiesToEven, whatever the floating-point environment): subnormal results are kept, a
 * magnitude past the largest finite value plus half its spacing (fp16: 65520 and above; bf16:
 * (2 - 2^-8) 2^127 and above) becomes infinity of its sign, infinities stay, and a NaN stays a
 * NaN of its sign with the quiet bit set. Vector code as fl_cpu_add_row_half; the same bits on
 * every isa. */
void fl_cpu_round_half(uint16_t *dst, const float *src, int64_t n, fl_half_kind kind);
void fl_cpu_round_half_isa(fl_cpu_isa isa, uint16_t *dst, const float *src, int64_t n, fl_half_kind kind);

/* out = LN(x + residual) row-wise over d columns (residual may be NULL; out may alias x):
 *   LN(z) = (z - mean) / sqrt(var + eps) * w + b     (eps_inside_sqrt)
 *   LN(z) = (z - mean) / (sqrt(var) + eps) * w + b   (otherwise); biased variance,
 * accumulated in double. Ba et al., "Layer Normalization", 2016. */
void fl_cpu_layernorm(int64_t rows, int32_t d, const float *x, int64_t ldx, const float *residual, int64_t ldr,
                      const float *w, const float *b, float eps, bool eps_inside_sqrt, float *out, int64_t ldo);

/* y = act(x W^T + bias + beta * y): x [rows, in], W [out, in] (torch.nn.Linear layout),
 * y [rows, out]. beta 0 (y is write-only) or 1 (residual add; act must be NONE). GEMM via CBLAS. */
void fl_cpu_linear(int64_t rows, int32_t in, int32_t out, const float *x, int64_t ldx, const float *w,
                   const float *bias, float beta, fl_act_kind act, float *y, int64_t ldy);

/* Elementwise activation in place over rows x cols (ld-strided). gelu_erf: x/2 (1 + erf(x/sqrt 2));
 * gelu_tanh: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (Hendrycks & Gimpel 2016); relu. */
void fl_cpu_activation(int64_t rows, int32_t cols, float *x, int64_t ld, fl_act_kind act);

/* Scratch floats fl_cpu_attention_sumi needs for a sequence of n_hist history tokens and heads
 * of width dh (one block of query rows' logits over the history, and its transposed queries). */
size_t fl_cpu_attention_scratch(int64_t n_hist, int32_t dh);

/* SUMI attention for one sequence of T = n_hist + n_cand tokens, H heads of width dh
 * (head h = columns h*dh .. h*dh+dh-1 of each row):
 *   query at position p < n_hist sees keys j <= p (causal history);
 *   query at position p >= n_hist (a candidate) sees every history key and key p itself;
 *   key_valid (optional, [T]) removes padding keys; a query that sees no key outputs zeros.
 * out_i = softmax_j(q_i . k_j / sqrt(dh)) v_j over the visible j (Vaswani et al. 2017).
 * q: [nq rows, ldq], the queries for positions qpos[0..nq) (NULL: positions 0..nq-1), ascending.
 * k, v: [T rows, ldkv]. out: [nq rows, ldo]. scratch: fl_cpu_attention_scratch(n_hist, dh) floats.
 * A row's output bits depend only on its query and its visible keys and values: not on the
 * other rows of the call (qpos, nq) nor on the instruction set. */
void fl_cpu_attention_sumi(int64_t n_hist, int64_t n_cand, int32_t heads, int32_t dh, const float *q, int64_t ldq,
                           const int32_t *qpos, int64_t nq, const float *k, const float *v, int64_t ldkv,
                           const uint8_t *key_valid, float *out, int64_t ldo, float *scratch);

/* Dot-product scores for table rows: out[c * stride] = <h, table[row_c, :]> over d columns,
 * row_c = ids[c], or first + c when ids is NULL (a contiguous range). */
void fl_cpu_dot_rows(const float *h, int32_t d, const float *table, const int64_t *ids, int64_t first, int64_t n,
                     float *out, int64_t stride);

/* fl_cpu_dot_rows with the given instruction set (fl_cpu_isa_detect's or narrower): the same bits
 * for every isa. */
void fl_cpu_dot_rows_isa(fl_cpu_isa isa, const float *h, int32_t d, const float *table, const int64_t *ids,
                         int64_t first, int64_t n, float *out, int64_t stride);

/* fl_cpu_dot_rows_isa split over up to `threads` threads of the pool (core/pool.h; bitwise the same result). */
void fl_cpu_dot_rows_mt(fl_cpu_isa isa, const float *h, int32_t d, const float *table, const int64_t *ids, int64_t first, int64_t n,
                        float *out, int64_t stride, int threads);

/* The dot head on an int8 table (rows r = ids[c], or first + c), straight from the int8 rows:
 *   out[c * stride] = scale_r * <h, q_r> + bias_r * sum(h)     (= <h, scale_r * q_r + bias_r>)
 * float32 accumulation in a fixed order; split over up to `threads` pool threads with a
 * bitwise-identical result whatever the split. */
void fl_cpu_dot_rows_q8_mt(const float *h, int32_t d, const int8_t *table, const float *qparams, const int64_t *ids,
                           int64_t first, int64_t n, float *out, int64_t stride, int threads);


/* True when the CBLAS library runs pre-AVX kernels on an AVX2 CPU (logged once). */
bool fl_blas_is_weak(void);
/* Threads the BLAS library runs one call on (OPENBLAS_NUM_THREADS). */
int fl_blas_threads(void);
/* The kernels the BLAS library picked for this CPU (OpenBLAS's core name). */
const char *fl_blas_name(void);

/* Index of the first id outside [0, limit), or -1 when all are inside. */
int64_t fl_cpu_first_out_of_range(const int64_t *ids, size_t n, int64_t limit);
/* True when ids[i] == ids[0] + i for every i (a contiguous range; n == 0 too). */
bool fl_cpu_ids_contiguous(const int64_t *ids, size_t n);

/* In-place logistic sigmoid over n values with the given stride. */
void fl_cpu_sigmoid(float *x, int64_t n, int64_t stride);

/* ---- libflame's own GEMM (src/cpu/gemm.c, src/cpu/isa.c) */

/* Floats of W [n, k] packed by fl_cpu_pack: ceil(n / 16) panels of 16 columns by k. */
size_t fl_cpu_pack_floats(int32_t k, int64_t n);
/* Packs W [n rows, k] (row stride ldw; a Linear's [out, in] weight, or table rows) into dst:
 * panel j holds dst[j][kk][u] = W[16 j + u][kk], columns past n zero. */
void fl_cpu_pack(const float *w, int64_t ldw, int32_t k, int64_t n, float *dst);

/* C = act(A Bp^T + bias + (accumulate ? C : 0)): A [rows, k] (lda), Bp W [n, k] packed by
 * fl_cpu_pack, bias [n] or NULL, C [rows, n] (ldc). act is applied last (a residual add with
 * an activation is not what layers do, but it is defined); gelu_erf evaluates erf with a
 * rational approximation (absolute error 3.7e-7, src/cpu/gemm.c), not libm's erff. Each output is one fused
 * multiply-add chain over k in order, then + bias, then + C: every isa gives the same bits,
 * whatever the rows around it. */
void fl_cpu_gemm_packed(fl_cpu_isa isa, int64_t rows, int64_t n, int32_t k, const float *a, int64_t lda,
                        const float *bp, const float *bias, bool accumulate, fl_act_kind act, float *c, int64_t ldc);
/* fl_cpu_gemm_packed split over up to `threads` pool threads (bitwise the same result). */
void fl_cpu_gemm_packed_mt(fl_cpu_isa isa, int64_t rows, int64_t n, int32_t k, const float *a, int64_t lda,
                           const float *bp, const float *bias, bool accumulate, fl_act_kind act, float *c,
                           int64_t ldc, int threads);
/* Scratch floats per thread of fl_cpu_gemm_nt_mt. */
size_t fl_cpu_gemm_nt_scratch(int32_t k);
/* C [rows, n] (ldc) = A [rows, k] (lda) B^T, B [n, k] (ldb) unpacked (the item table): B is
 * packed chunk by chunk into scratch (threads * fl_cpu_gemm_nt_scratch(k) floats) as it is
 * used, once for all rows. Same bits as fl_cpu_gemm_packed on the packed B, any split. */
void fl_cpu_gemm_nt_mt(fl_cpu_isa isa, int64_t rows, int64_t n, int32_t k, const float *a, int64_t lda,
                       const float *b, int64_t ldb, float *c, int64_t ldc, float *scratch, int threads);

#endif
