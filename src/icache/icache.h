/* The item cache (never installed): shards, entries, S3-FIFO queues, single-flight and the
 * refresh queue. Writers hold the shard's lock. A hit takes no lock: readers walk the hash
 * chains inside an epoch (epoch.h) with seq_cst pointer loads; writers publish and unlink
 * with seq_cst stores and retire what they unlink. An entry's key, value, TTL and refresh
 * time never change once published (a new value is a new entry); what a hit updates (hit
 * count, S3-FIFO counter, refresh flag) is atomic. */
#ifndef FLAME_CACHE_ICACHE_H
#define FLAME_CACHE_ICACHE_H

#include <stdatomic.h>

#include "icache/epoch.h"
#include "features/source.h"
#include "core/options.h"

enum { FL_Q_SMALL = 0, FL_Q_MAIN = 1 };
#define FL_FREQ_MAX 3
/* Hits of an entry are counted one by one up to this, then with probability 1/d in steps of d
 * (d = count / FL_HITS_EXACT rounded down to a power of two): an unbiased estimate whose
 * writes die out, so hot entries stay read-only on the hit path (no cache-line ping-pong).
 * Counts are plain stores, not atomic adds: two hits of one entry at the same instant may
 * count once. */
#define FL_HITS_EXACT 1024

typedef struct fl_entry {
    /* read by lock-free readers */
    int64_t key;
    _Atomic(struct fl_entry *) hnext; /* hash chain */
    uint64_t expires;                 /* us, cache clock */
    uint64_t refresh_at;              /* us; a hit from here on may schedule a refresh */
    _Atomic uint64_t hits;            /* hits this lifetime (popularity for the next TTL) */
    uint32_t len;                     /* record bytes (0 when negative) */
    _Atomic uint8_t freq;             /* S3-FIFO access counter, 0..FL_FREQ_MAX */
    _Atomic uint8_t refresh_pending;  /* a refresh is queued, in flight or waiting to retry */
    uint8_t negative;
    /* writers only */
    uint8_t queue;
    union {
        struct {
            struct fl_entry *qprev, *qnext; /* queue links: qprev toward the head (oldest) */
        };
        fl_ebr_node retired; /* once unlinked */
    };
    /* the record follows, 8-byte aligned and padded to 8 bytes */
} fl_entry;

static inline uint8_t *fl_entry_blob(fl_entry *e)
{
    return (uint8_t *)(e + 1);
}
static inline uint64_t fl_entry_bytes(const fl_entry *e)
{
    return sizeof(fl_entry) + ((e->len + 7) & ~7u);
}

typedef struct fl_queue {
    fl_entry *head, *tail; /* head = oldest */
    uint64_t count;
} fl_queue;

/* Keys recently evicted from the small queue: a FIFO ring plus an open-addressing index. */
typedef struct fl_ghost {
    int64_t *ring;
    uint64_t cap, pushes;
    int64_t *keys;  /* index: key */
    uint64_t *pos;  /* index: ring position + 1, 0 = empty */
    uint64_t mask;
} fl_ghost;

/* One fetch in progress for one key (single-flight). */
typedef struct fl_flight {
    struct fl_flight *next;
    int64_t key;
    int refs;           /* the fetching call + the calls waiting on it */
    bool superseded;    /* a put/invalidate came after it started: do not install */
    bool done;
    flame_status status;
    bool negative;
    uint8_t *blob;      /* result copy for waiters */
    uint32_t len;
    pthread_cond_t cv;  /* waits on the shard lock */
} fl_flight;

typedef struct fl_shard {
    /* read by lock-free readers: a line of its own, never written after creation */
    _Atomic(fl_entry *) *buckets;
    uint64_t mask;
    /* writers (lock held) */
    _Alignas(64) pthread_mutex_t lock;
    fl_queue small, main;
    fl_ghost ghost;
    fl_flight *flights;
    fl_ebr *ebr;
    fl_ebr_list retired;
    uint64_t entries, bytes, max_entries, max_bytes, small_max;
    uint64_t misses, evictions;
} __attribute__((aligned(64))) fl_shard;

/* Hits and stale serves, counted per thread stripe (fl_ebr_slot): a hit writes no shared line.
 * rng: the stripe's generator for sampled hit counts, carried from call to call. */
typedef struct fl_hit_count {
    _Alignas(64) _Atomic uint64_t hits, stale, rng;
} fl_hit_count;

typedef struct fl_refresh_item {
    int64_t key;
    uint64_t due;    /* cache clock us */
    uint64_t delay;  /* last retry delay, 0 before the first failure */
} fl_refresh_item;

struct flame_item_cache {
    /* set at creation (and by the set_* hooks before sharing): read by every hit */
    struct flame_feature_source *source;
    int32_t num_slots;
    fl_shard *shards;
    uint32_t nshards, shard_bits;
    uint64_t hot_ttl, cold_ttl, hot_hits, neg_ttl, refresh_pct, refresh_min_hits, retry_min, retry_max;
    flame_clock_fn clock;
    void *clock_user;
    flame_ttl_fn ttl_fn;
    void *ttl_user;
    pthread_t thread;
    bool has_thread;
    /* written while the cache is in use: on lines of their own, away from the fields above */
    _Alignas(64) pthread_mutex_t rq_lock; /* refresh queue */
    pthread_cond_t rq_cv;
    fl_refresh_item *rq;
    size_t rq_len, rq_cap;
    bool stop;
    bool free_on_exit; /* the last reference went on the refresh thread, or while it waited for an
                          asynchronous fetch: it frees the cache as it exits */
    flame_feature_batch *refresh_got; /* the refresh thread's batch while it fetches into it */
    _Alignas(64) atomic_int refs;
    atomic_uint_fast64_t refreshes, refresh_failures, fetches;
    fl_ebr ebr;
    fl_hit_count counts[FL_EBR_STRIPES];
};

static inline uint64_t fl_now(const struct flame_item_cache *c)
{
    return c->clock(c->clock_user);
}
static inline fl_shard *fl_shard_of(const struct flame_item_cache *c, int64_t key, uint64_t *h)
{
    *h = fl_hash64(key);
    return &c->shards[c->shard_bits ? *h >> (64 - c->shard_bits) : 0];
}
/* Lock held, or inside an epoch (seq_cst loads: epoch.h). */
static inline fl_entry *fl_shard_find(const fl_shard *sh, int64_t key, uint64_t h)
{
    fl_entry *e = atomic_load(&sh->buckets[h & sh->mask]);
    while (e && e->key != key) e = atomic_load(&e->hnext);
    return e;
}

/* ---- icache.c */
void fl_icache_retain(struct flame_item_cache *c);
void fl_icache_release(struct flame_item_cache *c);
/* Frees everything of a cache nobody references (the refresh thread stopped or is this one). */
void fl_icache_free(struct flame_item_cache *c);
/* What a lookup spent on the feature source (the engine's SOURCE_FETCH stage, flame/metrics.h):
 * `us`, on the stage clock (fl_now_us), the time of its own fetches of the ids it missed and
 * of its waits for other calls' fetches of them; `missed`: it missed an id (fetched or waited),
 * also when that took under 1 us. Refresh-ahead fetches are no lookup's. */
typedef struct fl_fetch_time {
    uint64_t us;
    bool missed;
} fl_fetch_time;

/* flame_item_cache_get without the argument checks; `ft` (may be NULL) gets the lookup's
 * fetch time. A lookup whose ids all hit reads no clock. */
flame_status fl_icache_get(struct flame_item_cache *c, const int64_t *ids, size_t n, flame_feature_batch *out,
                           fl_fetch_time *ft);
/* Ends a flight (shard lock held): installs a successful, not superseded result and wakes
 * the waiters. blob NULL with status OK = the source does not know the key. */
void fl_flight_finish(struct flame_item_cache *c, fl_shard *sh, fl_flight *f, flame_status st, const uint8_t *blob,
                      uint32_t len, uint64_t now);
fl_flight *fl_flight_find(fl_shard *sh, int64_t key);
fl_flight *fl_flight_start(fl_shard *sh, int64_t key);
/* Removes an entry from the hash chain and its queue and retires it (shard lock held). */
void fl_entry_remove(fl_shard *sh, fl_entry *e, uint64_t h);

/* ---- s3fifo.c: queue placement and eviction (shard lock held) */
void fl_s3_insert(fl_shard *sh, fl_entry *e);
void fl_s3_replace(fl_shard *sh, fl_entry *old, fl_entry *e);
void fl_s3_unlink(fl_shard *sh, fl_entry *e);
/* Evicts until the shard is within its bounds; never evicts `keep` unless it alone is over. */
void fl_s3_make_room(fl_shard *sh, const fl_entry *keep, uint64_t now);
flame_status fl_ghost_init(fl_ghost *g, uint64_t cap);
void fl_ghost_free(fl_ghost *g);

/* ---- refresh.c */
/* Queues a refresh of key due at `due` after `delay` (0: first attempt). */
void fl_refresh_schedule(struct flame_item_cache *c, int64_t key, uint64_t due, uint64_t delay);
/* Runs the refreshes due now; returns the number of ids fetched. */
uint64_t fl_refresh_run(struct flame_item_cache *c);
void *fl_refresh_thread(void *arg);

#endif
