/* The public SUMI attention call (flame/kernels.h): validation of the ragged batch on the host,
 * the CPU path over the engine's kernel (fl_cpu_attention_sumi), the GPU path through
 * cuda/kernels_api.cu. All three masks are SUMI masks of the engine's kernels:
 *   SUMI    n_hist = n_s, queries at positions 0..len-1;
 *   CAUSAL  n_hist = len (every row is history), positions 0..len-1;
 *   NONE    n_hist = len, every query at position len-1 (so it sees keys 0..len-1). */
#include <stdlib.h>
#include <string.h>

#include "core/abi.h"
#include "core/pool.h"
#include "cpu/kernels.h"
#include "kernels/kernels_gpu.h"

#define MAX_THREADS 1024

static size_t dtype_bytes(flame_dtype d)
{
    return d == FLAME_DTYPE_F32 ? 4 : 2;
}

/* Checks a cumulative count array and returns the sequence lengths in it through len(s). */
static flame_status check_cumulative(const char *name, const int64_t *cu, int64_t num_seqs)
{
    if (cu[0] != 0)
        return fl_error(FLAME_ERR_INVALID_ARG, "attention: %s[0] = %lld, not 0", name, (long long)cu[0]);
    for (int64_t s = 0; s < num_seqs; s++)
        if (cu[s + 1] < cu[s] || cu[s + 1] - cu[s] > INT32_MAX)
            return fl_error(FLAME_ERR_INVALID_ARG,
                            "attention: sequence %lld: %s[%lld] = %lld is outside %s[%lld] = %lld .. +2^31-1", (long long)s,
                            name, (long long)(s + 1), (long long)cu[s + 1], name, (long long)s, (long long)cu[s]);
    return FLAME_OK;
}

/* Bytes from the start of a [rows, ld] array to the end of its last row's `cols` used columns. */
static size_t extent(int64_t rows, int64_t ld, int64_t cols, size_t esize)
{
    return ((size_t)(rows - 1) * (size_t)ld + (size_t)cols) * esize;
}

/* True when an element of the [rows, lda] array a (its first cola columns) is also one of the
 * [rows, ldb] array b (its first colb columns). Of one row stride L (arrays side by side in the
 * rows of one buffer, such as a fused [Q K V O] row) it is exact: row i of a is the bytes
 * [a + i L, a + i L + wa) and row j of b [b + j L, b + j L + wb), which meet iff
 * -wb < d + k L < wa for d = b - a and some k = j - i in [-(rows - 1), rows - 1]; as wa, wb <= L
 * (strides are checked first), d + k L can only be m or m - L, with m = d mod L. Of different
 * strides the whole spans are compared (refusing some layouts that share no element). */
static bool overlaps(const void *a, int64_t lda, int64_t cola, const void *b, int64_t ldb, int64_t colb, int64_t rows,
                     size_t esize)
{
    if (!fl_ranges_overlap(a, extent(rows, lda, cola, esize), b, extent(rows, ldb, colb, esize))) return false;
    if (lda != ldb || rows == 1) return true; /* one row each: the spans are the rows */
    const int64_t L = lda * (int64_t)esize, wa = cola * (int64_t)esize, wb = colb * (int64_t)esize;
    const int64_t d = (int64_t)((uintptr_t)b - (uintptr_t)a);
    const int64_t m = ((d % L) + L) % L, q = (d - m) / L; /* d = q L + m, 0 <= m < L */
    const int64_t kmax = rows - 1;
    return (m < wa && llabs(q) <= kmax) || (m - L > -wb && llabs(q + 1) <= kmax); /* k = -q, or -q - 1 */
}

static flame_status check_ld(const char *name, int64_t ld, int64_t need, int64_t rows)
{
    if (ld < need || ld > (INT64_C(1) << 40) || fl_product_exceeds(rows, ld, INT64_C(1) << 50))
        return fl_error(FLAME_ERR_INVALID_ARG, "attention: %s %lld is outside %lld..2^40 (or rows x %s exceeds 2^50)",
                        name, (long long)ld, (long long)need, name);
    return FLAME_OK;
}

typedef struct attn_job {
    const fl_attn_seq *seqs;
    bool none_mask;
    int32_t heads, dh;
    const float *q, *k, *v;
    int64_t ldq, ldkv, ldo, longest;
    float *out;
    char *mem;
    size_t per; /* scratch bytes of one worker */
} attn_job;

/* One sequence, on the scratch of the worker that runs it. */
static void attn_seq(void *ctx, int64_t s, int worker)
{
    const attn_job *j = ctx;
    const fl_attn_seq *sq = &j->seqs[s];
    if (sq->len == 0) return;
    char *mine = j->mem + j->per * (size_t)worker;
    float *scratch = (float *)mine;
    int32_t *qpos = j->none_mask ? (int32_t *)(mine + fl_cpu_attention_scratch(j->longest, j->dh) * sizeof(float)) : NULL;
    if (j->none_mask)
        for (int32_t i = 0; i < sq->len; i++) qpos[i] = sq->len - 1;
    fl_cpu_attention_sumi(sq->n_hist, sq->len - sq->n_hist, j->heads, j->dh, j->q + sq->row * j->ldq, j->ldq, qpos,
                          sq->len, j->k + sq->row * j->ldkv, j->v + sq->row * j->ldkv, j->ldkv, NULL,
                          j->out + sq->row * j->ldo, j->ldo, scratch);
}

/* The sequences spread over `threads` threads of libflame's pool (core/pool.h), one task a
 * sequence; each sequence is computed by the same code whichever thread runs it. */
static flame_status cpu_attention(const fl_attn_seq *seqs, int64_t num_seqs, bool none_mask, int32_t heads, int32_t dh,
                                  const float *q, int64_t ldq, const float *k, const float *v, int64_t ldkv, float *out,
                                  int64_t ldo, int threads)
{
    int64_t longest = 0;
    for (int64_t s = 0; s < num_seqs; s++) longest = seqs[s].len > longest ? seqs[s].len : longest;
    if (threads > num_seqs) threads = (int)num_seqs;
    /* every thread's scratch is allocated before anything is computed, so a failure writes nothing */
    const size_t per = fl_cpu_attention_scratch(longest, dh) * sizeof(float) + (none_mask ? (size_t)longest * 4 : 0);
    if (threads < 1) threads = 1;
    char *mem = malloc(per * (size_t)threads);
    if (!mem) return fl_error(FLAME_ERR_NOMEM, "attention: %zu bytes of scratch", per * (size_t)threads);
    attn_job j = {.seqs = seqs, .none_mask = none_mask, .heads = heads, .dh = dh, .q = q, .k = k, .v = v, .ldq = ldq,
                  .ldkv = ldkv, .ldo = ldo, .longest = longest, .out = out, .mem = mem, .per = per};
    fl_parallel(threads, num_seqs, attn_seq, &j);
    free(mem);
    return FLAME_OK;
}

flame_status flame_sumi_attention(const flame_attention_params *params)
{
    fl_clear_error();
    if (!params) return fl_error(FLAME_ERR_INVALID_ARG, "flame_sumi_attention: NULL params");
    flame_attention_params p = {0};
    flame_status st = fl_struct_in("flame_attention_params", &p, sizeof p, params);
    if (st) return st;
    const bool cpu = p.device == FLAME_DEVICE_CPU;
    if (p.device < FLAME_DEVICE_CPU)
        return fl_error(FLAME_ERR_INVALID_ARG, "attention: device %d (FLAME_DEVICE_CPU or a CUDA device index)", p.device);
    if ((unsigned)p.dtype > FLAME_DTYPE_BF16)
        return fl_error(FLAME_ERR_INVALID_ARG, "attention: dtype %d is not F32, F16 or BF16", (int)p.dtype);
    if ((unsigned)p.mask > FLAME_MASK_NONE)
        return fl_error(FLAME_ERR_INVALID_ARG, "attention: mask %d is not SUMI, CAUSAL or NONE", (int)p.mask);
    if (p.heads < 1 || p.heads > 65535)
        return fl_error(FLAME_ERR_INVALID_ARG, "attention: heads %d is outside 1..65535", p.heads);
    if (p.head_dim < 1 || p.head_dim > 1024)
        return fl_error(FLAME_ERR_INVALID_ARG, "attention: head_dim %d is outside 1..1024", p.head_dim);
    if (p.num_seqs < 0 || p.num_seqs > INT32_MAX)
        return fl_error(FLAME_ERR_INVALID_ARG, "attention: num_seqs %lld is outside 0..2^31-1", (long long)p.num_seqs);
    if (p.threads < 0 || p.threads > MAX_THREADS)
        return fl_error(FLAME_ERR_INVALID_ARG, "attention: threads %d is outside 0..%d", p.threads, MAX_THREADS);
    if (cpu && p.dtype != FLAME_DTYPE_F32)
        return fl_error(FLAME_ERR_UNSUPPORTED, "attention: the CPU computes F32 only, not dtype %d", (int)p.dtype);
    if (!cpu && p.head_dim > 128)
        return fl_error(FLAME_ERR_UNSUPPORTED, "attention: GPU head dims are 1..128, not %d", p.head_dim);
    if (!p.cu_history)
        return fl_error(FLAME_ERR_INVALID_ARG, "attention: cu_history is NULL (it has num_seqs + 1 = %lld entries)",
                        (long long)p.num_seqs + 1);
    if ((st = check_cumulative("cu_history", p.cu_history, p.num_seqs))) return st;
    if (p.cu_candidates && (st = check_cumulative("cu_candidates", p.cu_candidates, p.num_seqs))) return st;
    const int64_t total_hist = p.cu_history[p.num_seqs], total_cand = p.cu_candidates ? p.cu_candidates[p.num_seqs] : 0;
    if (total_hist > INT64_MAX - total_cand || total_hist + total_cand != p.rows)
        return fl_error(FLAME_ERR_INVALID_ARG, "attention: rows %lld, the sequences hold %lld history + %lld candidate rows",
                        (long long)p.rows, (long long)total_hist, (long long)total_cand);
    const int64_t width = (int64_t)p.heads * p.head_dim;
    const size_t esize = dtype_bytes(p.dtype);
    const void *q = p.q, *k = p.k, *v = p.v;
    int64_t ldq = p.ld_q, ldk = p.ld_k, ldv = p.ld_v;
    if (p.qkv) {
        if (p.q || p.k || p.v)
            return fl_error(FLAME_ERR_INVALID_ARG, "attention: qkv is given together with q, k or v");
        if ((st = check_ld("ld_qkv", p.ld_qkv, 3 * width, p.rows))) return st;
        q = p.qkv;
        k = (const char *)p.qkv + (size_t)width * esize;
        v = (const char *)p.qkv + 2 * (size_t)width * esize;
        ldq = ldk = ldv = p.ld_qkv;
    } else {
        if ((st = check_ld("ld_q", ldq, width, p.rows)) || (st = check_ld("ld_k", ldk, width, p.rows)) ||
            (st = check_ld("ld_v", ldv, width, p.rows)))
            return st;
        if (ldk != ldv)
            return fl_error(FLAME_ERR_UNSUPPORTED, "attention: ld_k %lld != ld_v %lld (K and V share one row stride)",
                            (long long)ldk, (long long)ldv);
    }
    if ((st = check_ld("ld_out", p.ld_out, width, p.rows))) return st;
    if (!cpu && (st = fl_gpu_kernels_device(p.device))) return st;
    if (p.rows == 0) return FLAME_OK; /* nothing to write or launch */
    if (!q || !k || !v || !p.out)
        return fl_error(FLAME_ERR_INVALID_ARG, "attention: %s is NULL with rows %lld",
                        !p.out ? "out" : p.qkv ? "qkv" : !q ? "q" : !k ? "k" : "v", (long long)p.rows);
    const struct { const char *name; const void *ptr; int64_t ld; } in[3] = {{"q", q, ldq}, {"k", k, ldk}, {"v", v, ldv}};
    for (int i = 0; i < 4; i++) {
        const void *ptr = i < 3 ? in[i].ptr : p.out;
        if (fl_misaligned(ptr, esize))
            return fl_error(FLAME_ERR_INVALID_ARG, "attention: %s%s is not aligned to its %zu-byte elements (address %p)",
                            i < 3 && p.qkv ? "qkv's " : "", i < 3 ? in[i].name : "out", esize, ptr);
    }
    for (int i = 0; i < 3; i++)
        if (overlaps(p.out, p.ld_out, width, in[i].ptr, in[i].ld, width, p.rows, esize))
            return fl_error(FLAME_ERR_INVALID_ARG, "attention: out overlaps %s%s (an element of out would be one of it)",
                            p.qkv ? "qkv's " : "", in[i].name);

    fl_attn_seq *seqs = malloc((size_t)(p.num_seqs ? p.num_seqs : 1) * sizeof *seqs);
    if (!seqs) return fl_error(FLAME_ERR_NOMEM, "attention: %lld sequences", (long long)p.num_seqs);
    for (int64_t s = 0; s < p.num_seqs; s++) {
        const int64_t n = p.cu_history[s + 1] - p.cu_history[s];
        const int64_t m = p.cu_candidates ? p.cu_candidates[s + 1] - p.cu_candidates[s] : 0;
        if (n + m > INT32_MAX) {
            free(seqs);
            return fl_error(FLAME_ERR_INVALID_ARG, "attention: sequence %lld: %lld rows exceed 2^31-1", (long long)s,
                            (long long)(n + m));
        }
        seqs[s].row = p.cu_history[s] + (p.cu_candidates ? p.cu_candidates[s] : 0);
        seqs[s].len = (int32_t)(n + m);
        seqs[s].n_hist = p.mask == FLAME_MASK_SUMI ? (int32_t)n : seqs[s].len;
    }
    const bool none = p.mask == FLAME_MASK_NONE;
    if (cpu)
        st = cpu_attention(seqs, p.num_seqs, none, p.heads, p.head_dim, q, ldq, k, v, ldk, p.out, p.ld_out,
                           p.threads ? p.threads : 1);
    else
        st = fl_gpu_attention(p.device, p.dtype, seqs, p.num_seqs, p.rows, none, p.heads, p.head_dim, q, ldq, k, v, ldk,
                              p.out, p.ld_out, p.qkv != NULL, p.cuda_stream);
    free(seqs);
    return st;
}
