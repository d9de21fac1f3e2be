// Launch wrappers of the CUDA kernels. Same contracts as src/cpu/kernels.h; every wrapper
// launches nothing for an empty problem (never a grid of size 0) and checks the launch.
#pragma once

#include "common.cuh"

#define FL_CUDA_MAX_FEATURES 64

// One feature's bags over the packed tokens (device pointers).
struct fl_dev_feature {
    const void *table;      // [rows, dim] in the compute dtype, or int8 when qparams is set
    int32_t dim;
    int32_t pooling;        // 0 sum, 1 mean
    int32_t out_col;
    const int64_t *offsets; // [T + 1] or NULL: token t's bag is {ids[t]}
    const int64_t *ids;
    const float *qparams;   // int8 table: [rows, 2] (scale, bias), value = scale * q + bias; NULL: a float table
    const float *weights;   // per-id weights (ids' length): the bag pools w_i * row_i; NULL: all 1
    // the table's rows and the ids' length: read only by a lookup behind a validation launch
    // (skip_unless_clear set), which clamps every offset and id into them before using it
    int64_t rows, num_ids;
};

struct fl_dev_features {
    fl_dev_feature f[FL_CUDA_MAX_FEATURES];
    int32_t count;
    int32_t width;   // output row width (sum: dim; concat: sum of dims)
    int32_t concat;  // 1: features own disjoint columns
    // NULL, or the verdict of a validation launch enqueued just before: when it is not ~0 (a
    // bad index was found), the lookup writes nothing. With it set, the lookup is launched as
    // that launch's programmatic dependent (sm_90): it pools while the validation still runs,
    // with offsets and ids clamped into their arrays (so an unchecked value never addresses
    // memory outside them), and reads the verdict after waiting for the validation grid, before
    // its first write
    const unsigned long long *skip_unless_clear;
};
// The lookup takes the struct by value: 4,632 bytes of launch parameters with the tables'
// bounds, past the 4 KiB a launch could take before CUDA 12.1 (32,764 bytes since, with a
// driver of that release or later; the build needs the toolkit of 12.1 or later).
static_assert(sizeof(fl_dev_features) + 64 <= 32764, "the lookup's launch parameters");

// Table-batched embedding bag, one launch for all tokens and features:
// out[t, out_col:out_col+dim] += pool(bag) after the row is zeroed (see src/cpu/kernels.h).
// With per-id weights, row i of a bag enters as w_i * row_i (mean: divided by the bag's size).
// T is the float tables' dtype; features with qparams read int8 rows (16-byte vectors of 16
// values when every dim allows, else 8- or 4-byte vectors, else single values), dequantized
// in float. Accumulation in float.
template <typename T, typename OutT>
flame_status fl_cuda_embedding_bag(const fl_dev_features &fs, int64_t tokens, OutT *out, int64_t ldo, cudaStream_t s);

// Row-wise residual stream update on X (float, [rows, d], in place):
//   X += position[prow[r]] (when position != NULL and prow[r] >= 0)
//   mode LN_X:  X = LN(X); Y = X            (post-LN blocks, input LayerNorm)
//   mode LN_Y:  Y = LN(X); X unchanged      (pre-LN blocks, final LayerNorm)
//   mode COPY:  Y = X
// Y ([rows, ldy], compute dtype) may be NULL. LN statistics in float (two passes).
enum fl_row_mode { FL_ROW_LN_X = 0, FL_ROW_LN_Y = 1, FL_ROW_COPY = 2 };
// A LayerNorm's parameters: weight and bias [d], epsilon inside or outside the square root.
struct fl_dev_layernorm {
    const float *w = nullptr, *b = nullptr;
    float eps = 0.0f;
    bool eps_inside = false;
};
// Callers name the fields (designated initializers, in declaration order).
template <typename T> struct fl_rows_args {
    int64_t rows = 0;
    int32_t d = 0;
    float *X = nullptr;
    const float *position = nullptr; // [positions, d] or NULL
    const int32_t *prow = nullptr;   // [rows]: each row's position row, < 0 for none
    fl_dev_layernorm ln{};             // read in the LN modes
    fl_row_mode mode = FL_ROW_COPY;
    T *Y = nullptr;
    int64_t ldy = 0;
};
template <typename T> flame_status fl_cuda_rows(const fl_rows_args<T> &a, cudaStream_t s);

// dst[i, :] = src[rows[i], :] for `count` rows of `cols` elements.
template <typename T>
flame_status fl_cuda_gather(const T *src, int64_t lds, const int64_t *rows, int64_t count, int32_t cols, T *dst,
                            int64_t ldd, cudaStream_t s);

// In-place activation (1 gelu_erf, 2 gelu_tanh, 3 relu) over rows x cols.
template <typename T>
flame_status fl_cuda_activation(T *x, int64_t rows, int32_t cols, int64_t ld, int act, cudaStream_t s);

// In-place sigmoid over n values with a stride.
flame_status fl_cuda_sigmoid(float *x, int64_t n, int64_t stride, cudaStream_t s);

// One attention work item: up to FL_ATTN_QT queries of one sequence, or up to FL_ATTN_QT_WG
// for the Hopper kernel (fl_cuda_attention_tile_queries says which list a launch wants).
#define FL_ATTN_QT 16
#define FL_ATTN_QT_WG 128
struct fl_attn_tile {
    int64_t seq_row;   // first token row of the sequence in K/V
    int32_t n_hist;    // history tokens of the sequence
    int32_t nq;        // queries in this tile (<= FL_ATTN_QT)
    int64_t q_row;     // first query row in Q / out
    int32_t pos0;      // position of the first query when qpos == NULL (consecutive positions)
    int32_t qpos_idx;  // index into qpos of the first query, or -1 for consecutive positions
};

// SUMI attention (contract of fl_cpu_attention_sumi): history query p sees keys <= p, a
// candidate query sees every history key and itself; no visible key gives zeros.
// q [rows, ldq], k and v [rows, ldkv] (head h at columns h*dh), out [rows, ldo]; dh <= 128.
// tile_q: the queries per tile the list was built with, FL_ATTN_QT or FL_ATTN_QT_WG (the
// latter only where fl_cuda_attention_tile_queries gave it; else FLAME_ERR_UNSUPPORTED).
// Queries within a tile are in ascending positions; tiles may come in any order.
// Callers name the fields (designated initializers, in declaration order).
template <typename T> struct fl_attn_args {
    const fl_attn_tile *tiles = nullptr; // [num_tiles], device memory
    int64_t num_tiles = 0;
    const int32_t *qpos = nullptr;       // query positions the tiles index (qpos_idx >= 0), or NULL
    int32_t heads = 0, dh = 0;
    const T *q = nullptr;
    int64_t ldq = 0;
    const T *k = nullptr, *v = nullptr;
    int64_t ldkv = 0;
    T *out = nullptr;
    int64_t ldo = 0;
    int32_t tile_q = FL_ATTN_QT;
    // at least the history keys any query of the launch sees (0: unknown); a hint that decides
    // how a small launch splits its keys (fl_cuda_attention_tc), never what it computes
    int64_t max_keys = 0;
    // two uint32 counters in device memory, zero before the first launch and left zero by each,
    // through which the persistent Hopper kernel hands out (tile, head) items (launches that may
    // run at once need their own); NULL: that kernel runs one CTA an item
    uint32_t *work = nullptr;
};
template <typename T> flame_status fl_cuda_attention(const fl_attn_args<T> &a, cudaStream_t s);

// The tile size fl_cuda_attention wants for `queries` queries (all tiles of the launch) of
// `heads` heads of dim dh, elements of elem_bytes (2: fp16/bf16, 4: fp32), on the current
// device: FL_ATTN_QT_WG where the Hopper kernel takes the dtype and head dim and the work is
// large enough for it to win (measured, see docs/benchmarks.md), else FL_ATTN_QT. The
// caller's buffers must meet the alignment of fl_cuda_attention_wg_fits (the engine's do).
int32_t fl_cuda_attention_tile_queries(int32_t elem_bytes, int32_t dh, int64_t queries, int32_t heads);

// scores[o[i]] = <h[hrow[i], :], table[ids[i], :]> for n candidates (dot head, gathered rows).
template <typename T>
flame_status fl_cuda_dot_gather(const T *h, int64_t ldh, const int64_t *hrow, const T *table, int32_t d,
                                const int64_t *ids, const int64_t *o, int64_t n, float *scores, cudaStream_t s);

// The last layer (width 1) and sigmoid of SUMI tasks, all tasks in one launch. A task's input
// row is either the head input (ys, its first `width` columns) or its slice of the stacked
// hidden layer (hid, columns col..col+width); w is the layer's weight row (compute dtype).
struct fl_task_tail {
    int32_t task, col, width, from_hidden;
    const void *w;
    const float *b;
};
// scores[r * num_tasks + task] = sigmoid(b + <input row r, w>) for every row and tail.
template <typename T>
flame_status fl_cuda_task_tails(const fl_task_tail *tails, int32_t count, const T *ys, int64_t ldys, const T *hid,
                                int64_t ldh, int64_t rows, int32_t num_tasks, float *scores, cudaStream_t s);

// One K/V row of the KV cache's device blocks (src/kvcache/kvlayout.h): `off` is the byte
// offset of its layer-0 K row in the block storage, `ws` its row in the K/V workspace.
struct fl_kv_dev_row {
    uint64_t off;
    int64_t ws;
};
// For each of `count` rows: the K row at blocks + off + layer_off and the V row kv_stride bytes
// after it, to (to_blocks false) or from (true) the workspace's row ws, whose K takes
// row_bytes at ws * ld_bytes and whose V follows it.
flame_status fl_cuda_kv_blocks(uint8_t *blocks, const fl_kv_dev_row *rows, int64_t count, uint64_t layer_off,
                               uint64_t kv_stride, void *ws, int64_t ld_bytes, int64_t row_bytes, bool to_blocks,
                               cudaStream_t s);
// Packs float segments: for each i < nseg, seg[3i+2] floats from src + seg[3i] to dst + seg[3i+1]
// (seg on the device; a padded pass's scores into the caller's order).
flame_status fl_cuda_copy_segments(const float *src, const int64_t *seg, int32_t nseg, float *dst, cudaStream_t s);
// dst row map[i] (ld_dst bytes apart) = src row i (ld_src bytes apart), `bytes` bytes a row
// (multiples of 2: rows of 2- or 4-byte elements).
flame_status fl_cuda_scatter_rows(const void *src, int64_t ld_src, const int64_t *map, int64_t count, int64_t bytes,
                                  void *dst, int64_t ld_dst, cudaStream_t s);
