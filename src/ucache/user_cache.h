/* Internals of the shared-memory user cache: the handle, bucket access, locking with crash
 * recovery, seqlock record reads and writes. */
#ifndef FLAME_CACHE_USER_CACHE_H
#define FLAME_CACHE_USER_CACHE_H

#include "ucache/user_layout.h"

/* The layout as validated at attach (or made at creation), private to the process: another
 * process can rewrite the shared header, so no size or bound is ever read from it again. */
typedef struct fl_uc_layout {
    uint64_t capacity, num_buckets, bucket_bytes, record_bytes, total_bytes;
    uint32_t num_slots, max_ids, max_dense, record_words;
    int64_t ttl_us;
} fl_uc_layout;

struct flame_user_cache {
    fl_uc_header *hdr;              /* in the mapping: only its counters are used after attach */
    fl_uc_layout lay;
    unsigned char *base;            /* the whole mapping */
    size_t bytes;
    int fd;                         /* kept to see the object truncated under the mapping */
    char name[256];
    _Atomic uint64_t hits, misses, expired, corrupt; /* this handle's gets */
    atomic_int refs;                /* the caller's + one per engine using the handle */
};

/* FLAME_ERR_IO if the shared object is now shorter than the mapping (another process truncated
 * it: touching the missing pages would raise SIGBUS). */
flame_status fl_uc_check_size(flame_user_cache *c);

/* References held by engines (flame_engine_set_user_cache); the last release unmaps. */
void fl_uc_retain(flame_user_cache *c);
void fl_uc_release(flame_user_cache *c);

static inline fl_uc_bucket *fl_uc_bucket_at(const flame_user_cache *c, uint64_t i)
{
    return (fl_uc_bucket *)(c->base + FL_UC_HEADER_BYTES + i * c->lay.bucket_bytes);
}
static inline _Atomic uint64_t *fl_uc_record(const flame_user_cache *c, fl_uc_bucket *b, unsigned way)
{
    return (_Atomic uint64_t *)((unsigned char *)b + sizeof(fl_uc_bucket) + way * c->lay.record_bytes);
}

/* Record words for a record bound (also used to check a header on attach). */
uint64_t fl_uc_record_words(uint32_t num_slots, uint32_t max_ids, uint32_t max_dense);

/* Locks a bucket; if its previous owner died holding it, drops the records it left half
 * written, recounts `live`, marks the mutex consistent and counts a recovery (logged by the
 * unlock that leaves the thread holding no bucket lock). Returns 0, or the error of a mutex
 * another process overwrote (the bucket is then not locked). */
int fl_uc_lock(flame_user_cache *c, fl_uc_bucket *b);
void fl_uc_unlock(fl_uc_bucket *b);

/* Seqlock write of a record (bucket locked): live with the features, or empty if f is NULL. */
void fl_uc_write(flame_user_cache *c, fl_uc_bucket *b, unsigned way, int64_t user, const flame_user_features *f,
                 int64_t now_us);

typedef enum { FL_UC_MISS, FL_UC_HIT, FL_UC_TORN, FL_UC_CORRUPT } fl_uc_read_result;
/* One seqlock read attempt of way `way` for `user`. FL_UC_TORN: a writer was inside, try
 * again. FL_UC_CORRUPT: a stable record for `user` that no writer of this layout makes (counts
 * beyond the bounds, slot lengths not summing to the ids; with `locked`, a seq left odd), as
 * only another process overwriting the table can leave. On FL_UC_HIT, *meta and *time are the
 * record's; the features are copied only when they fit the capacities (the caller checks the
 * counts in *meta). */
fl_uc_read_result fl_uc_read(const flame_user_cache *c, fl_uc_bucket *b, unsigned way, int64_t user, bool locked,
                             flame_user_features *f, uint64_t *meta, int64_t *time);

/* The clock of written-at times and TTLs: CLOCK_MONOTONIC in us (system-wide on one host). */
int64_t fl_uc_now_us(void);

/* Tests only: replace the clock (NULL = CLOCK_MONOTONIC); call `hook` inside every record
 * write, after the seq went odd and half of the ids were written (NULL = none). */
void fl_uc_set_clock(int64_t (*now_us)(void));
void fl_uc_set_write_hook(void (*hook)(void));
/* Tests only: call `hook` inside every creation (or takeover of an unfinished table), after
 * the magic and the layout version are written and before the buckets are initialised, the
 * creator's lock held (NULL = none). */
void fl_uc_set_create_hook(void (*hook)(void));
/* Tests only: call `hook` inside every creation, after the object is made, and every takeover
 * of an unfinished table, before the creator's lock is taken (NULL = none). */
void fl_uc_set_before_lock_hook(void (*hook)(void));

#endif
