/*
 * libflame: the engine's kernels for custom pipelines: the table-batched embedding bag and
 * SUMI attention, on the CPU and on CUDA GPUs.
 *
 * Part of the public API; included by flame/flame.h, and usable on its own. The conventions at
 * the top of flame/flame.h (statuses, ownership, units, the struct_size rule) hold here too.
 *
 * Devices: a call runs on FLAME_DEVICE_CPU (host pointers, `threads` threads: the calling one
 * and libflame's own pool, the one the CPU engine uses; bitwise the same result for any count) or on CUDA
 * device N >= 0. On a GPU every tensor (tables when borrowed, Q/K/V, outputs) is device memory
 * of that device, the work is enqueued on the caller's cudaStream_t (passed as `void *`; NULL is
 * the legacy default stream) and the call returns without waiting for it: libflame never
 * synchronizes a device or stream in these calls (creating and destroying a GPU embedding bag
 * does, see there). The index arrays (ids, bag offsets, cumulative counts) are host memory by
 * default: they are validated on the host before anything is enqueued, then copied to the
 * device on the caller's stream through page-locked staging memory owned by libflame, so the
 * caller may reuse them as soon as the call returns, and a bad value is reported by the call
 * itself. The embedding bag also takes them as device memory (device_indices in
 * flame_embedding_bag_batch), for pipelines whose ids are already on the GPU: they are then
 * validated by a kernel on the caller's stream before the lookup, and a bad value is reported
 * later, by flame_embedding_bag_index_status. The attention call's cumulative counts stay host
 * memory: the call plans its tiles from them on the host (the work list the kernels run, the
 * longest sequences first), as varlen FlashAttention plans its grid from a host max_seqlen; they
 * are num_seqs + 1 integers, which a caller holding them on the GPU copies back once per batch.
 * The calling thread's current CUDA device
 * is left as it was. The stream must belong to the call's device, and it must not be capturing
 * a CUDA graph (the index data is staged per call, so a replay could not repeat it: refused with
 * FLAME_ERR_UNSUPPORTED). Device pointers are checked to be memory the device can access (its
 * own, managed, or page-locked host memory): a pageable host pointer is FLAME_ERR_INVALID_ARG
 * rather than a fault that would poison the caller's CUDA context. A build without CUDA
 * (make CUDA=0) returns FLAME_ERR_UNSUPPORTED for every GPU call; a build with CUDA on a machine
 * without a usable GPU returns FLAME_ERR_NO_DEVICE.
 *
 * Validation: every length is checked against every other length describing the same array,
 * every id against its table, every offset and cumulative count against its neighbours, before
 * any kernel runs; a bad value is FLAME_ERR_INVALID_ARG with a message naming the table or
 * sequence, the bag or index and the value, and then nothing is written.
 *
 * docs/kernels.md describes the layouts with examples.
 */
#ifndef FLAME_KERNELS_H
#define FLAME_KERNELS_H

#include "flame/flame.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The device index of the host (CPU) path. */
#define FLAME_DEVICE_CPU (-1)

/* Element types of tables and tensors. */
typedef enum flame_dtype {
    FLAME_DTYPE_F32 = 0,  /* IEEE binary32 */
    FLAME_DTYPE_F16 = 1,  /* IEEE binary16 */
    FLAME_DTYPE_BF16 = 2, /* bfloat16 (the top 16 bits of a binary32) */
    FLAME_DTYPE_INT8 = 3  /* tables only: int8 rows, row r worth scale_r * q + bias_r (row-wise quantization) */
} flame_dtype;

/* ---------------------------------------------------------------- embedding bag */

typedef struct flame_embedding_bag flame_embedding_bag;

/* How a bag's rows are pooled. With per-id weights w_i: sum = sum_i w_i row_i,
 * mean = (sum_i w_i row_i) / n. An empty bag (n = 0) gives zeros under both. */
typedef enum flame_pooling { FLAME_POOLING_SUM = 0, FLAME_POOLING_MEAN = 1 } flame_pooling;

/* How the tables' pooled rows form an output row. */
typedef enum flame_combine {
    FLAME_COMBINE_CONCAT = 0, /* table t owns columns col_t .. col_t + dim_t - 1, tables in order
                               * (col_0 = 0, col_t+1 = col_t + dim_t); width = sum of dims */
    FLAME_COMBINE_SUM = 1     /* every table has the same dim; the pooled rows are added; width = dim */
} flame_combine;

/* One table. A field left 0 takes its default (FLAME_DTYPE_F32, FLAME_POOLING_SUM). */
typedef struct flame_embedding_table {
    size_t struct_size;    /* sizeof(flame_embedding_table) */
    flame_dtype dtype;     /* F32, F16, BF16 or INT8 */
    flame_pooling pooling; /* SUM or MEAN */
    int64_t rows;          /* 1..2^40 */
    int32_t dim;           /* 1..16384 */
    const void *data;      /* [rows, dim] of dtype, row-major and contiguous */
    const float *qparams;  /* INT8: [rows, 2] float32 (scale, bias) per row, finite; else NULL */
} flame_embedding_table;

/* A field left 0 takes its default, so a zeroed struct (with struct_size, device, tables and
 * num_tables set) is valid. */
typedef struct flame_embedding_bag_params {
    size_t struct_size;                  /* sizeof(flame_embedding_bag_params) */
    int32_t device;                      /* FLAME_DEVICE_CPU or a CUDA device index */
    flame_combine combine;               /* CONCAT (default) or SUM */
    const flame_embedding_table *tables; /* [num_tables], element i at byte offset
                                          * i * tables[0].struct_size (as flame_score_batch reads
                                          * its requests); each read by the struct_size rule */
    size_t num_tables;                   /* 1..64 */
    int32_t borrow;                      /* 0 (default): data and qparams are copied at creation
                                          * (host memory; on a GPU uploaded to the device), each
                                          * table in its own dtype, and may be freed after the
                                          * call. 1: they are used in place and must outlive the
                                          * handle: host memory on the CPU, device memory of
                                          * `device` on a GPU (16-byte aligned rows read fastest);
                                          * every dtype either way, on every device */
    uint32_t reserved0;                  /* 0: what would be trailing padding (flame.h, "No padding") */
} flame_embedding_bag_params;

/*
 * flame_embedding_bag_create: makes a table-batched embedding bag over a set of tables.
 *
 * Parameters:
 *   params   the tables, their dtypes, pooling and layout (above); read during the call only
 *            (borrowed table memory excepted).
 *   out      receives the handle; NULL on failure.
 * Thread-safety: any thread; the handle is then used as described at each call.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL params/out/tables/data, struct_size outside
 *   8..4096 or tables[0].struct_size not a multiple of 8, a non-zero reserved0, num_tables
 *   outside 1..64, rows or dim
 *   out of range, an unknown dtype, pooling, combine or device, qparams missing for an INT8
 *   table or given for another, a non-finite scale or bias, data or qparams not aligned to
 *   their elements' size, dims that differ under SUMI combine, a borrowed GPU table not in
 *   memory of the device: the message names the table and
 *   the value); FLAME_ERR_UNSUPPORTED (a build without
 *   CUDA asked for a GPU; on a GPU, float tables of different dtypes in one handle; a CPU
 *   handle mixes any dtypes); FLAME_ERR_NO_DEVICE (no such GPU); FLAME_ERR_NOMEM. A GPU
 *   creation in copy mode uploads synchronously (cudaMemcpy).
 * Math: a row of an INT8 table is worth scale * q + bias, evaluated in float32; an F16 or BF16
 *   value is widened to float32 (exactly) as it is read, on the CPU as on a GPU, so such a table
 *   pools to the bits of the same values given as an F32 table on the CPU (and its rows take
 *   half the memory).
 */
FLAME_API flame_status flame_embedding_bag_create(const flame_embedding_bag_params *params,
                                                  flame_embedding_bag **out);

/*
 * flame_embedding_bag_destroy: frees the handle (and the tables it copied).
 *
 * Parameters:
 *   bag      the handle, or NULL (a no-op).
 * Thread-safety: not concurrently with any other call on the handle. On a GPU the copied
 *   tables are freed with cudaFree, which waits for work still using them, so lookups enqueued
 *   earlier finish first.
 * Returns: nothing.
 */
FLAME_API void flame_embedding_bag_destroy(flame_embedding_bag *bag);

/*
 * flame_embedding_bag_width: the number of columns of an output row.
 *
 * Parameters:
 *   bag      the handle.
 * Thread-safety: any thread, concurrently with every call but destroy.
 * Returns: the width (the sum of the dims under CONCAT, the common dim under SUM); 0 for NULL.
 */
FLAME_API int64_t flame_embedding_bag_width(const flame_embedding_bag *bag);

/* One table's lookups of a batch. */
typedef struct flame_embedding_bag_input {
    size_t struct_size;     /* sizeof(flame_embedding_bag_input) */
    const int64_t *ids;     /* [num_ids] row ids, each in 0..rows-1; host memory. NULL only with num_ids 0 */
    const int64_t *offsets; /* [batch + 1] host memory: bag b holds ids[offsets[b] .. offsets[b+1]);
                             * offsets[0] = 0, non-decreasing, offsets[batch] = num_ids.
                             * NULL: bag b is {ids[b]} and num_ids must equal batch */
    int64_t num_ids;        /* the length of ids (and of weights) */
    const float *weights;   /* [num_ids] finite per-id weights in host memory, or NULL (all 1) */
} flame_embedding_bag_input;

/* A field left 0 takes its default. */
typedef struct flame_embedding_bag_batch {
    size_t struct_size;                     /* sizeof(flame_embedding_bag_batch) */
    int64_t batch;                          /* bags per table = output rows, 0..2^31-1 */
    const flame_embedding_bag_input *inputs; /* [num_inputs], one per table in table order, element
                                             * i at byte offset i * inputs[0].struct_size */
    size_t num_inputs;                      /* must equal the handle's number of tables */
    void *out;                              /* [batch, ld_out] of out_dtype: host memory on the
                                             * CPU, device memory of the handle's GPU; only
                                             * columns 0..width-1 of each row are written */
    int64_t ld_out;                         /* row stride in elements, >= width; 0 = width */
    flame_dtype out_dtype;                  /* F32 (default), F16 or BF16, on every device and
                                             * for tables of any dtypes: each element is pooled
                                             * in float32 and rounded once to out_dtype, to
                                             * nearest with ties to even (see the forward's Math);
                                             * INT8 is refused */
    void *cuda_stream;                      /* GPU: the cudaStream_t to enqueue on (NULL: the legacy
                                             * default stream); CPU: ignored */
    int32_t threads;                        /* CPU: threads (the caller and libflame's pool, at most
                                             * 256 run), 0 = 1, 1..1024; GPU with host indices:
                                             * the threads that validate them and pack them into
                                             * the staging block; GPU device_indices: unused */
    int64_t device_indices;                 /* 0 (default): ids, offsets and weights are host memory,
                                             * validated before the call returns. 1 (GPU handles):
                                             * they are memory of the handle's device, read on
                                             * cuda_stream when the work runs (keep them alive and
                                             * unchanged until then); a validation kernel enqueued
                                             * before the lookup checks every offset, id and weight,
                                             * and when it finds a bad one it records it in the
                                             * handle's index record and the lookup writes nothing;
                                             * flame_embedding_bag_index_status reports it. Lengths
                                             * (batch, num_ids, the presence of offsets and weights)
                                             * are still checked by the call. A CPU handle ignores
                                             * it: its indices are host memory, checked at once.
                                             * (64 bits, so that the struct grew: a caller built
                                             * before this field, whose struct_size is smaller,
                                             * reads as 0 whatever its padding held) */
} flame_embedding_bag_batch;

/*
 * flame_embedding_bag_forward: pools one batch of bags from every table into out.
 *
 * Parameters:
 *   bag      the handle.
 *   batch    the lookups and the output (above): out[b, col_t + j] = pool over bag b of table t
 *            of row[j] (CONCAT), or the sum over the tables (SUM); rows [batch, width], dtype
 *            out_dtype, accumulated in float32 and rounded once to out_dtype.
 * Thread-safety: concurrent forwards on one handle are safe (they only read the tables);
 *   device_indices forwards also share the handle's index record, see
 *   flame_embedding_bag_index_status for how they are ordered. On
 *   the CPU a forward and flame_embedding_bag_update_rows exclude each other (a forward sees a
 *   row before or after an update, never half of one). On a GPU, work on one stream runs in
 *   the order it was enqueued: a forward enqueued after an update on the same stream sees the
 *   new rows; across streams the caller orders them (events).
 *   GPU: enqueued on cuda_stream; returns before it runs (out is complete when the stream is).
 * Returns: FLAME_OK (batch 0 writes and enqueues nothing); FLAME_ERR_INVALID_ARG (NULL
 *   bag/batch, NULL out with batch > 0, struct_size outside 8..4096, num_inputs not the
 *   number of tables, batch, ld_out or threads out of range, batch x ld_out above 2^50, an
 *   out_dtype other than F32, F16 or BF16 (named), num_ids above 2^47, offsets that do not start at 0,
 *   decrease, or end elsewhere than num_ids, num_ids != batch without offsets, an id outside
 *   0..rows-1, a non-finite weight, ids, offsets, weights or out not aligned to their
 *   elements' size (8, 8, 4, out_dtype's), an out that overlaps any table's ids, offsets,
 *   weights, rows or qparams (rows are written while later bags still read them; out's extent is
 *   counted in out_dtype's elements): the message names
 *   the table, the bag and the value, and nothing is written or enqueued; on a GPU also an
 *   out that is not memory of the device, and under device_indices an ids, offsets or weights
 *   array that is not, or a device_indices other than 0 or 1; the values of device indices
 *   are not checked here but on the stream, see flame_embedding_bag_index_status);
 *   FLAME_ERR_UNSUPPORTED (cuda_stream is capturing a CUDA graph);
 *   FLAME_ERR_NOMEM (on the CPU, the float32 rows an F16/BF16 output is pooled into: a few
 *   tens of KiB a thread, or one output row each when rows are wider; checked before anything
 *   is written); FLAME_ERR_INTERNAL (a CUDA call failed; the message names it).
 * Math: table-batched embedding bag as in FBGEMM's TBE (Khudia et al., arXiv:2101.05615) and
 *   torch.nn.functional.embedding_bag: out = sum_i w_i * row(ids_i), divided by n under MEAN,
 *   in float32. An F16 or BF16 output is that float32 value rounded once, to nearest with ties
 *   to even (IEEE 754 roundTiesToEven; the GPU's __float2half_rn and __float2bfloat16_rn, the
 *   CPU's vcvtps2ph or the same rule in integer arithmetic, whatever the floating-point
 *   environment): subnormal results are kept, a magnitude from the largest finite value plus
 *   half its spacing on (F16: 65520; BF16: (2 - 2^-8) * 2^127) becomes infinity of its sign,
 *   and a NaN (only from non-finite table values) stays a NaN. On the CPU the F16/BF16 output
 *   is bitwise the F32 output rounded so, on any number of threads.
 */
FLAME_API flame_status flame_embedding_bag_forward(flame_embedding_bag *bag, const flame_embedding_bag_batch *batch);

/*
 * flame_embedding_bag_update_rows: replaces rows first_row .. first_row + num_rows - 1 of one
 * table in place (online embedding updates).
 *
 * Parameters:
 *   bag         the handle.
 *   table       the table index, 0..num_tables-1.
 *   first_row   the first row replaced; with num_rows within 0..rows.
 *   num_rows    rows replaced; 0 does nothing.
 *   values      [num_rows, dim] in the table's dtype as given at creation (the handle's rows are
 *               held in it, so the values are copied as they are), host memory, read during
 *               the call only.
 *   values_dtype the dtype of values; must be the table's (a check against a mixed-up table).
 *   qparams     INT8 tables: [num_rows, 2] (scale, bias) float32 in host memory, finite; else NULL.
 *   cuda_stream GPU: the stream the copy is enqueued on (NULL: legacy default); CPU: ignored.
 * Thread-safety: CPU: excludes concurrent forwards and updates of the handle (a lock).
 *   GPU: ordered with the forwards by the stream (see flame_embedding_bag_forward). On every
 *   device a borrowed table is the caller's memory and is written there.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL bag, NULL values with num_rows > 0, table
 *   or the row range out of range, values_dtype not the table's dtype, qparams missing for an
 *   INT8 table or given for another, a non-finite scale or bias, values or qparams not aligned
 *   to their elements' size, values or qparams that overlap any part of the rows they replace
 *   (their values or their qparams): the message names the table, the row and the value;
 *   nothing is written); FLAME_ERR_UNSUPPORTED (cuda_stream is capturing
 *   a CUDA graph); FLAME_ERR_NOMEM; FLAME_ERR_INTERNAL (a CUDA call failed).
 */
FLAME_API flame_status flame_embedding_bag_update_rows(flame_embedding_bag *bag, int32_t table, int64_t first_row,
                                                       int64_t num_rows, const void *values, flame_dtype values_dtype,
                                                       const float *qparams, void *cuda_stream);

/*
 * flame_embedding_bag_index_status: reports (and clears) the first bad offset, id or weight that
 * the device_indices forwards of a GPU handle found on the device.
 *
 * Parameters:
 *   bag          the handle.
 *   cuda_stream  the stream the forwards were enqueued on (NULL: the legacy default stream).
 *                The call enqueues a read and a reset of the handle's index record on it and
 *                then waits for that stream: the only device_indices call that synchronizes,
 *                made when the caller asks (once per batch, or once per many: the record is
 *                sticky, it keeps the first error until this call clears it, and every
 *                device_indices lookup enqueued while it is set writes nothing, so no error is
 *                lost and no output after one is silently wrong).
 * Thread-safety: the record is one per handle, so the device_indices forwards of one handle
 *   and this call must run one after the other on the device: on one stream (this call then
 *   reports the forwards enqueued before it), or ordered across streams by the caller
 *   (cudaStreamWaitEvent). Unordered ones still read nothing outside their own arrays, but the
 *   error reported may then be another forward's, land in the next report, or be reported as
 *   FLAME_ERR_INTERNAL "undescribed" (their validation launches share one count of finished
 *   blocks; this call resets it). Calls from
 *   several threads are safe (a lock serializes the reads of the record).
 * Returns: FLAME_OK when no bad value was recorded (always on a CPU handle, whose forwards
 *   report at once); FLAME_ERR_INVALID_ARG with the message of a host-index forward (the table,
 *   the bag, the index and the value: "table 2 bag 17: ids[301] = 5000 is outside 0..999",
 *   "offsets[5] = 3 is outside ...", "weights[4] = nan is not finite") for the first bad value
 *   in the order table, offsets before ids, index; FLAME_ERR_INVALID_ARG for a NULL bag;
 *   FLAME_ERR_UNSUPPORTED (cuda_stream is capturing a CUDA graph); FLAME_ERR_INTERNAL (a CUDA
 *   call failed; the message names it).
 */
FLAME_API flame_status flame_embedding_bag_index_status(flame_embedding_bag *bag, void *cuda_stream);

/* ---------------------------------------------------------------- SUMI attention */

/* Which keys a query sees. Positions count from 0 at a sequence's first row; a sequence s has
 * n_s history rows (positions 0..n_s-1) followed by m_s candidate rows (n_s..n_s+m_s-1). */
typedef enum flame_attention_mask {
    FLAME_MASK_SUMI = 0,   /* history query p sees keys 0..p; a candidate sees every history key
                            * and itself, never another candidate (single user, multiple items) */
    FLAME_MASK_CAUSAL = 1, /* query p sees keys 0..p of its sequence (candidates included) */
    FLAME_MASK_NONE = 2    /* every query sees every key of its sequence */
} flame_attention_mask;

/* A field left 0 takes its default (device 0 is a GPU: set FLAME_DEVICE_CPU for the host). */
typedef struct flame_attention_params {
    size_t struct_size;           /* sizeof(flame_attention_params) */
    int32_t device;               /* FLAME_DEVICE_CPU or a CUDA device index */
    flame_dtype dtype;            /* of Q, K, V and out: CPU F32; GPU F16, BF16 (F32 too, on CUDA cores) */
    flame_attention_mask mask;    /* SUMI (default), CAUSAL or NONE */
    int32_t heads;                /* 1..65535 */
    int32_t head_dim;             /* 1..1024 on the CPU, 1..128 on a GPU; head h = columns h*head_dim ..
                                   * (h+1)*head_dim - 1 of a row */
    int64_t num_seqs;             /* sequences, 0..2^31-1 */
    const int64_t *cu_history;    /* [num_seqs + 1] host memory on every device (see the top of
                                   * this header): cu_history[0] = 0, non-decreasing;
                                   * n_s = cu_history[s+1] - cu_history[s] */
    const int64_t *cu_candidates; /* [num_seqs + 1] likewise for m_s; NULL: no candidates */
    int64_t rows;                 /* packed rows: cu_history[num_seqs] + cu_candidates[num_seqs];
                                   * sequence s occupies rows cu_history[s] + cu_candidates[s] ..,
                                   * its history first; each n_s + m_s <= 2^31-1 */
    const void *qkv;              /* fused QKV [rows, ld_qkv]: Q at column 0, K at heads*head_dim, V
                                   * at 2*heads*head_dim; NULL: q, k and v below */
    int64_t ld_qkv;               /* elements, >= 3 * heads * head_dim */
    const void *q, *k, *v;        /* separate Q, K, V [rows, ld_q / ld_k / ld_v] (qkv NULL) */
    int64_t ld_q, ld_k, ld_v;     /* elements, each >= heads * head_dim; ld_k = ld_v */
    void *out;                    /* [rows, ld_out], packed as Q; no element of it may be one of Q, K
                                   * or V (checked exactly for arrays of one row stride, such as
                                   * out beside them in a fused [Q K V O] row; over the arrays'
                                   * whole spans when the strides differ) */
    int64_t ld_out;               /* elements, >= heads * head_dim */
    void *cuda_stream;            /* GPU: the cudaStream_t to enqueue on (NULL: legacy default); CPU: ignored */
    int32_t threads;              /* CPU: threads over the sequences (the caller and libflame's
                                   * pool, at most 256 run; one sequence takes one thread, no BLAS
                                   * call), 0 = 1, 1..1024; GPU: ignored */
    uint32_t reserved0;           /* 0: what would be trailing padding (flame.h, "No padding") */
} flame_attention_params;

/*
 * flame_sumi_attention: masked multi-head attention over a ragged batch of packed sequences
 * (as varlen FlashAttention takes them), the engine's kernels.
 *
 * Parameters:
 *   params   shapes, pointers, strides, mask and device (above); read during the call only.
 *            out[r, head h] = softmax over the keys row r sees (mask) of q_r . k_j / sqrt(head_dim),
 *            applied to v_j; a query that sees no key (never under these masks) gives zeros.
 *            Q, K and V are expected finite: a key a row does not see enters with weight 0, and
 *            where its value row holds an inf or NaN (0 x inf = NaN) the rows that share its
 *            block get NaN, on every device, as in FlashAttention and cuDNN's fused attention.
 *            Empty sequences (n_s = m_s = 0) are allowed; rows 0 enqueues nothing.
 * Thread-safety: any thread, concurrently. GPU: enqueued on cuda_stream, returns before it
 *   runs. The GPU runs the engine's fastest kernel for the shape: Hopper warpgroup MMA for
 *   F16/BF16 head dims 64 and 128 with 16-byte aligned rows on compute capability 9.0 and
 *   enough work, else tensor-core mma.sync (head dims multiple of 16), else CUDA cores.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL params/out/Q/K/V with rows > 0, struct_size
 *   outside 8..4096, a non-zero reserved0, an unknown mask, dtype or device, heads, head_dim,
 *   num_seqs, threads or a
 *   stride out of range, qkv given together with q/k/v, cumulative counts that do not start at 0,
 *   decrease, or total other than rows, a sequence longer than 2^31-1, Q, K, V or out not
 *   aligned to their elements' size, out overlapping Q, K or V (see out above), on a GPU a Q, K, V or out
 *   that is not memory of the device: the message names the sequence or array and the value;
 *   nothing is written); FLAME_ERR_UNSUPPORTED (a dtype other than F32 on the CPU, head_dim above
 *   128 on a GPU, ld_k != ld_v, the NONE mask over more than 2^31-1 rows on a GPU, cuda_stream
 *   capturing a CUDA graph, a build without CUDA asked for a GPU); FLAME_ERR_NO_DEVICE (no such GPU); FLAME_ERR_NOMEM; FLAME_ERR_INTERNAL (a CUDA call
 *   failed).
 * Math: scaled dot-product attention (Vaswani et al., arXiv:1706.03762) with the SUMI mask of
 *   HSTU (arXiv:2402.17152) and FLAME (arXiv:2509.22681); the GPU kernels use the online
 *   softmax of FlashAttention-2 (arXiv:2307.08691), in float32 for fp16/bf16 inputs.
 */
FLAME_API flame_status flame_sumi_attention(const flame_attention_params *params);

#ifdef __cplusplus
}
#endif
#endif
