/* Where a token's K or V row of one layer lies in the KV cache's block storage (kvcache.h),
 * the same for the host blocks of the CPU engine and the device blocks of the GPU engine:
 * block b holds [layers][2 (K, V)][block_tokens][d_model] elements of the compute dtype,
 * contiguous, so a layer's K rows of one block are one copy. */
#ifndef FLAME_KVCACHE_KVLAYOUT_H
#define FLAME_KVCACHE_KVLAYOUT_H

#include <stdint.h>

typedef struct fl_kv_layout {
    int32_t layers, d, block_tokens, elem_bytes;
} fl_kv_layout;

/* Bytes one token takes over all layers, K and V. */
static inline uint64_t fl_kv_token_bytes(const fl_kv_layout *l)
{
    return 2ull * (uint64_t)l->layers * (uint64_t)l->d * (uint64_t)l->elem_bytes;
}

/* Byte offset of row `row` (0..block_tokens-1) of layer `layer`'s K (kv 0) or V (kv 1) in block `block`. */
static inline uint64_t fl_kv_row_offset(const fl_kv_layout *l, int32_t block, int32_t layer, int kv, int32_t row)
{
    const uint64_t row_bytes = (uint64_t)l->d * (uint64_t)l->elem_bytes;
    return (uint64_t)block * (uint64_t)l->block_tokens * fl_kv_token_bytes(l) +
           (((uint64_t)layer * 2 + (uint64_t)kv) * (uint64_t)l->block_tokens + (uint64_t)row) * row_bytes;
}

#endif
