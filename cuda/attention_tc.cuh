// The tensor-core SUMI attention (fp16/bf16); fl_cuda_attention dispatches to it.
#pragma once

#include "kernels.cuh"

// True when the head dim is a multiple of 16 up to 128 and the strides and pointers allow
// 16-byte K/V loads and 4-byte Q/out accesses.
template <typename T>
bool fl_cuda_attention_tc_fits(int32_t dh, const T *q, int64_t ldq, const T *k, const T *v, int64_t ldkv,
                               const T *out, int64_t ldo);

// Same contract as fl_cuda_attention; FLAME_ERR_UNSUPPORTED when it does not fit. A launch of
// fewer tiles x heads than SMs takes twice the warps a tile and, on compute capability 9.0 and
// later, splits each tile's keys across a cluster of CTAs when max_keys (fl_attn_args) leaves
// each CTA of the cluster at least two steps of those warps' keys (0, unknown: no split).
template <typename T>
flame_status fl_cuda_attention_tc(const fl_attn_tile *tiles, int64_t num_tiles, const int32_t *qpos, int32_t heads,
                                  int32_t dh, const T *q, int64_t ldq, const T *k, const T *v, int64_t ldkv, T *out,
                                  int64_t ldo, cudaStream_t s, int64_t max_keys = 0);
