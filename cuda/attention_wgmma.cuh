// The Hopper SUMI attention (wgmma, sm_90a; attention_wgmma.cu); fl_cuda_attention dispatches
// to it for tile lists of FL_ATTN_QT_WG queries.
#pragma once

#include "kernels.cuh"

// True when the current device is compute capability 9.0 (the kernel exists only as sm_90a code).
bool fl_cuda_attention_wg_device(void);

// True on such a device for head dims 64 and 128 with 16-byte aligned Q, K, V rows (strides
// multiples of 8 values) and 4-byte aligned output pairs.
template <typename T>
bool fl_cuda_attention_wg_fits(int32_t dh, const T *q, int64_t ldq, const T *k, const T *v, int64_t ldkv,
                               const T *out, int64_t ldo);

// Kernel variants (attention_wgmma.cu), for tests and benchmarks: lock-step (all threads stage
// each key block, key blocks of 64 or 128), warp-specialised (a producer warpgroup stages
// blocks three deep), warp-specialised with the warpgroups taking turns on the tensor cores,
// warp-specialised with each warpgroup's softmax overlapped with its previous P V product
// (key blocks of 64 or 128), that kernel persistent (one CTA an SM running items in turn,
// the next item's Q and first block staged while the last one finishes), and the persistent
// kernel with the warpgroups taking turns issuing their products; the last two with whole key
// blocks staged by the tensor memory accelerator (TMA) instead of the producer's cp.async; and
// POVL128PC, POVL128PT with each item's last P V issued beside the next item's first S.
enum {
    FL_WG_DEFAULT = 0,
    FL_WG_LOCK64 = 1,
    FL_WG_LOCK128 = 2,
    FL_WG_WS = 3,
    FL_WG_WS_PP = 4,
    FL_WG_OVL64 = 5,
    FL_WG_OVL128 = 6,
    FL_WG_POVL64 = 7,
    FL_WG_POVL128 = 8,
    FL_WG_POVL128P = 9,
    FL_WG_POVL128T = 10,
    FL_WG_POVL128PT = 11,
    FL_WG_POVL128PC = 12,
    FL_WG_LAST = FL_WG_POVL128PC
};

// Contract of fl_cuda_attention for tiles of up to FL_ATTN_QT_WG queries, processed in list
// order (longest first keeps the last wave short). FLAME_ERR_UNSUPPORTED when it does not fit;
// INVALID_ARG when tiles x heads exceed one launch. max_ctas > 0 caps the persistent variants'
// grid (tests: many items a CTA); 0, one CTA an SM. work: two uint32 counters in device memory,
// zero before the first launch and left zero by each, through which the persistent variants
// hand out items as CTAs get to them (launches that may overlap need their own); NULL, a fixed
// assignment.
template <typename T>
flame_status fl_cuda_attention_wg(const fl_attn_tile *tiles, int64_t num_tiles, const int32_t *qpos, int32_t heads,
                                  int32_t dh, const T *q, int64_t ldq, const T *k, const T *v, int64_t ldkv, T *out,
                                  int64_t ldo, cudaStream_t s, int variant = FL_WG_DEFAULT, int max_ctas = 0,
                                  uint32_t *work = nullptr);
