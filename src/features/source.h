/* Feature sources: one fetch contract (ids in, records out) behind callback, file and Redis
 * implementations (never installed). */
#ifndef FLAME_CACHE_SOURCE_H
#define FLAME_CACHE_SOURCE_H

#include <stdatomic.h>

#include "features/record.h"

typedef struct fl_source_ops {
    /* out is reset to n records; the implementation writes each one or fails */
    flame_status (*fetch)(struct flame_feature_source *s, const int64_t *ids, size_t n, flame_feature_batch *out);
    void (*destroy)(struct flame_feature_source *s);
} fl_source_ops;

struct flame_feature_source {
    const fl_source_ops *ops;
    int32_t num_slots;
    atomic_int refs;
    bool async; /* a fetch returns only once the host completes it (flame_feature_batch_complete) */
};

void fl_source_init(struct flame_feature_source *s, const fl_source_ops *ops, int32_t num_slots);
void fl_source_retain(struct flame_feature_source *s);
void fl_source_release(struct flame_feature_source *s);
/* Resets out, fetches, and checks every record was written. */
flame_status fl_source_fetch(struct flame_feature_source *s, const int64_t *ids, size_t n, flame_feature_batch *out);

/* An in-memory id -> record table, filled from a feature file (docs/features.md). */
typedef struct fl_feature_table {
    int32_t num_slots, num_dense;
    size_t count, mask;    /* records; open-addressing table size - 1 */
    int64_t *keys;         /* [mask + 1] */
    uint64_t *offs;        /* [mask + 1] offset + 1 into blobs (0 = empty slot) */
    uint32_t *lens;
    uint8_t *blobs;
    size_t used, cap;
} fl_feature_table;

flame_status fl_feature_table_read(const char *path, fl_feature_table *t);
void fl_feature_table_free(fl_feature_table *t);
/* The blob of id, or NULL. */
const uint8_t *fl_feature_table_find(const fl_feature_table *t, int64_t id, uint32_t *len);

/* 64-bit mix for int64 keys (murmur3 fmix64): spreads sequential ids over shards and buckets. */
static inline uint64_t fl_hash64(int64_t key)
{
    uint64_t h = (uint64_t)key;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

#endif
