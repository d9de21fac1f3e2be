/* Feature records (docs/features.md): the one encoding used in batches, in the item cache and
 * as the Redis value, so a record is copied, never re-encoded, on its way to the engine.
 *   u32 num_slots | u32 num_dense | u32 count[num_slots] | zero pad to 8 bytes |
 *   i64 ids[sum(count)] | f32 dense[num_dense]          (little-endian)
 * A blob whose start is 8-byte aligned has its ids aligned too. */
#ifndef FLAME_CACHE_RECORD_H
#define FLAME_CACHE_RECORD_H

#include <pthread.h>
#include <string.h>

#include "core/common.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the record encoding is little-endian; add byte swaps for this host"
#endif

#define FL_MAX_SLOTS 64
#define FL_MAX_DENSE 65536

static inline size_t fl_rec_header_bytes(int32_t num_slots)
{
    return (8 + 4 * (size_t)num_slots + 7) & ~(size_t)7;
}
static inline size_t fl_rec_bytes(int32_t num_slots, uint64_t num_ids, size_t num_dense)
{
    return fl_rec_header_bytes(num_slots) + 8 * num_ids + 4 * num_dense;
}
static inline uint32_t fl_rec_u32(const uint8_t *blob, size_t i)
{
    uint32_t v;
    memcpy(&v, blob + 4 * i, 4);
    return v;
}
/* Slot s's ids: *count of them starting at the returned pointer (aligned if blob is). */
static inline const int64_t *fl_rec_slot(const uint8_t *blob, int32_t s, size_t *count)
{
    int32_t ns = (int32_t)fl_rec_u32(blob, 0);
    size_t first = 0;
    for (int32_t i = 0; i < s; i++) first += fl_rec_u32(blob, 2 + (size_t)i);
    *count = fl_rec_u32(blob, 2 + (size_t)s);
    return (const int64_t *)(const void *)(blob + fl_rec_header_bytes(ns)) + first;
}

/* Encodes into dst (fl_rec_bytes of room); offsets as flame_feature_batch_set. */
void fl_rec_encode(uint8_t *dst, int32_t num_slots, const int64_t *slot_offsets, const int64_t *ids,
                   const float *dense, size_t num_dense);
/* Checks a blob of len bytes decodes to a record of num_slots slots whose ids are >= 0 and
 * whose dense values are finite (what the feature file takes); FLAME_ERR_FORMAT otherwise, the
 * message naming `what`. */
flame_status fl_rec_check(const uint8_t *blob, size_t len, int32_t num_slots, const char *what);

/* The batch behind flame_feature_batch. */
enum { FL_REC_UNSET = 0, FL_REC_FOUND = 1, FL_REC_MISSING = 2 };
typedef struct fl_rec_ref {
    uint64_t off;
    uint32_t len;
    uint32_t state;
} fl_rec_ref;

struct flame_feature_batch {
    int32_t num_slots;
    size_t n, cap_n;
    fl_rec_ref *rec;
    uint8_t *arena; /* 8-aligned blobs */
    size_t used, cap;
    /* flame_feature_batch_set's first refusal since the reset: a callback may drop its status,
     * so the fetch that then fails quotes it (an async callback's came on another thread),
     * with the id of the record it refused (refused_index, when within the batch) */
    char refused[200];
    size_t refused_index;
    /* async completion */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int armed; /* an asynchronous fetch was started into the batch and not yet waited out */
    int done;
    flame_status status;
};

/* Resizes to n records, all unset. */
flame_status fl_batch_reset(flame_feature_batch *b, size_t n);
/* The ids to read while b is reset and rewritten: *ids left as it is, or, when it lies in b's
 * records (a bag read back from b), replaced by a copy the caller frees (*copy).
 * FLAME_ERR_INVALID_ARG: such ids run past the records; FLAME_ERR_NOMEM. */
flame_status fl_batch_own_ids(const flame_feature_batch *b, const int64_t **ids, size_t n, int64_t **copy);
/* Copies a valid blob into record i. */
flame_status fl_batch_put_blob(flame_feature_batch *b, size_t i, const uint8_t *blob, size_t len);
/* fl_batch_put_blob for a blob readable up to len rounded up to 8 bytes (an item cache
 * entry's): small ones are copied in words, inline. */
static inline flame_status fl_batch_put_padded(flame_feature_batch *b, size_t i, const uint8_t *blob, size_t len)
{
    size_t bytes = (len + 7) & ~(size_t)7;
    if (bytes > 64 || b->used + bytes > b->cap) return fl_batch_put_blob(b, i, blob, len);
    uint8_t *dst = b->arena + b->used;
    for (size_t w = 0; w < bytes; w += 8) memcpy(dst + w, blob + w, 8);
    b->rec[i] = (fl_rec_ref){.off = b->used, .len = (uint32_t)len, .state = FL_REC_FOUND};
    b->used += bytes;
    return FLAME_OK;
}
/* Record i's blob (NULL if missing or unset; *state says which). */
static inline const uint8_t *fl_batch_blob(const flame_feature_batch *b, size_t i, uint32_t *len, uint32_t *state)
{
    *state = b->rec[i].state;
    *len = b->rec[i].len;
    return b->rec[i].state == FL_REC_FOUND ? b->arena + b->rec[i].off : NULL;
}
/* For async sources: arm before the call, then wait for flame_feature_batch_complete. */
void fl_batch_arm(flame_feature_batch *b);
flame_status fl_batch_wait(flame_feature_batch *b);
/* Whether an asynchronous fetch into b was started and has not completed yet. */
bool fl_batch_awaiting(flame_feature_batch *b);

#endif
