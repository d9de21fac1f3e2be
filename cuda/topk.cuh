// Device top-k of score segments (cuda/topk.cu): the GPU engine's flame_score_batch_topk.
#pragma once

#include "common.cuh"

// One request's scores: count candidates from scores[off], tasks floats a candidate.
struct fl_topk_seg {
    int64_t off;
    int32_t count;
    int32_t pad;
};

// Per segment r, the k best candidates (k <= 1024) by column `task`: score descending (NaN
// last, -0 as +0), ties by the earlier candidate; pos[r * k + j] (candidate index) and val
// (its score) for j < kept, meta[2r] = kept = min(k, count), meta[2r + 1] = 1 when candidates
// with the k-th score were left out (the caller's tie rule may pick others). One CTA a
// segment: a 4-pass radix select of the k-th score, the candidates above it, the earliest at
// it, and a bitonic sort in shared memory.
flame_status fl_cuda_topk(const float *scores, const fl_topk_seg *segs, int32_t nseg, int32_t tasks, int32_t task,
                          int32_t k, int32_t *pos, float *val, int32_t *meta, cudaStream_t s);
