/* The item cache: lookups (lock-free hits), single-flight fills, writes, lifetime and stats. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "icache/icache.h"
#include "core/abi.h"
#include "metrics/histogram.h"

/* A coarse monotonic clock (a few ns to read, ~4 ms resolution): TTLs are seconds. */
static uint64_t default_clock(void *user)
{
    (void)user;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static uint64_t ttl_for(const struct flame_item_cache *c, int64_t key, uint64_t prev_hits)
{
    uint64_t ttl;
    if (c->ttl_fn) {
        ttl = c->ttl_fn(key, prev_hits, c->ttl_user);
    } else {
        uint64_t h = prev_hits < c->hot_hits ? prev_hits : c->hot_hits;
        ttl = c->cold_ttl + (uint64_t)((double)(c->hot_ttl - c->cold_ttl) * (double)h / (double)c->hot_hits);
    }
    return ttl ? ttl : 1;
}

static void entry_free(fl_ebr_node *n)
{
    free((char *)n - offsetof(fl_entry, retired));
}

/* The chain link that points at e (lock held). */
static _Atomic(fl_entry *) *link_to(fl_shard *sh, const fl_entry *e, uint64_t h)
{
    _Atomic(fl_entry *) *p = &sh->buckets[h & sh->mask];
    for (fl_entry *cur; (cur = atomic_load_explicit(p, memory_order_relaxed)) != e;) p = &cur->hnext;
    return p;
}

void fl_entry_remove(fl_shard *sh, fl_entry *e, uint64_t h)
{
    atomic_store(link_to(sh, e, h), atomic_load_explicit(&e->hnext, memory_order_relaxed)); /* e->hnext stays */
    fl_s3_unlink(sh, e);
    sh->entries--;
    sh->bytes -= fl_entry_bytes(e);
    fl_ebr_retire(sh->ebr, &sh->retired, &e->retired, entry_free); /* after the queue links: they share memory */
}

/* Installs a value for key (shard lock held), replacing the old entry in place (its queue
 * position and S3-FIFO count carry over; its hits become the popularity of the new TTL). */
static flame_status install(struct flame_item_cache *c, fl_shard *sh, int64_t key, uint64_t h, const uint8_t *blob,
                            uint32_t len, uint64_t now)
{
    if (!blob) len = 0;
    size_t padded = ((size_t)len + 7) & ~(size_t)7; /* hits copy whole words */
    fl_entry *e = malloc(sizeof *e + padded);
    if (!e) return fl_error(FLAME_ERR_NOMEM, "out of memory caching id %lld", (long long)key);
    fl_entry *old = fl_shard_find(sh, key, h);
    uint64_t ttl = blob ? ttl_for(c, key, old ? atomic_load_explicit(&old->hits, memory_order_relaxed) : 0) : c->neg_ttl;
    memset(e, 0, sizeof *e);
    e->key = key;
    e->len = len;
    e->negative = !blob;
    /* saturated: a TTL past the clock's range (UINT64_MAX: never) must not wrap to the past */
    e->expires = fl_sat_add_u64(now, ttl);
    e->refresh_at = blob && c->refresh_pct
                        ? fl_sat_add_u64(now, ttl / 100 * c->refresh_pct + ttl % 100 * c->refresh_pct / 100)
                        : UINT64_MAX;
    if (blob) {
        memcpy(fl_entry_blob(e), blob, len);
        memset(fl_entry_blob(e) + len, 0, padded - len);
    }
    /* everything above is published by the seq_cst store that links e */
    if (old) {
        atomic_init(&e->hnext, atomic_load_explicit(&old->hnext, memory_order_relaxed));
        fl_s3_replace(sh, old, e);
        atomic_store(link_to(sh, old, h), e);
        sh->bytes -= fl_entry_bytes(old);
        sh->bytes += fl_entry_bytes(e);
        fl_ebr_retire(sh->ebr, &sh->retired, &old->retired, entry_free);
    } else {
        _Atomic(fl_entry *) *head = &sh->buckets[h & sh->mask];
        atomic_init(&e->hnext, atomic_load_explicit(head, memory_order_relaxed));
        fl_s3_insert(sh, e);
        atomic_store(head, e);
        sh->entries++;
        sh->bytes += fl_entry_bytes(e);
    }
    fl_s3_make_room(sh, e, now);
    return FLAME_OK;
}

/* A superseded flight is invisible: joining it could hand out a value older than a write
 * the caller has already seen complete. */
fl_flight *fl_flight_find(fl_shard *sh, int64_t key)
{
    fl_flight *f = sh->flights;
    while (f && (f->key != key || f->superseded)) f = f->next;
    return f;
}

fl_flight *fl_flight_start(fl_shard *sh, int64_t key)
{
    fl_flight *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->key = key;
    f->refs = 1;
    pthread_cond_init(&f->cv, NULL);
    f->next = sh->flights;
    sh->flights = f;
    return f;
}

static void flight_unref(fl_flight *f)
{
    if (--f->refs) return;
    pthread_cond_destroy(&f->cv);
    free(f->blob);
    free(f);
}

void fl_flight_finish(struct flame_item_cache *c, fl_shard *sh, fl_flight *f, flame_status st, const uint8_t *blob,
                      uint32_t len, uint64_t now)
{
    fl_flight **p = &sh->flights;
    while (*p != f) p = &(*p)->next;
    *p = f->next;
    if (!st && !f->superseded) {
        uint64_t h = fl_hash64(f->key);
        install(c, sh, f->key, h, blob, len, now); /* out of memory: served, not cached */
    }
    f->status = st;
    f->negative = !blob;
    if (!st && blob && f->refs > 1) {
        f->blob = malloc(len);
        if (f->blob) memcpy(f->blob, blob, len);
        else f->status = FLAME_ERR_NOMEM;
        f->len = len;
    }
    f->done = true;
    pthread_cond_broadcast(&f->cv);
    flight_unref(f);
}

/* A call's generator for the sampled hit counts (xorshift64, never 0). */
typedef struct hit_ctx {
    uint64_t rng;
} hit_ctx;

/* Counts a hit of e as FL_HITS_EXACT says (a plain store, not an atomic add: two hits of one
 * entry at the same instant may count once); returns the count including this hit. A hot
 * entry is only read: past FL_HITS_EXACT its count is rarely written, its S3-FIFO counter not
 * at all once saturated. (Selecting the store's address without a branch, a local sink for
 * skipped writes, gave 15% more hits/s in calls of 64 ids but 18% fewer in one-id calls.) */
static inline uint64_t count_hit(fl_entry *e, hit_ctx *x)
{
    uint64_t n = atomic_load_explicit(&e->hits, memory_order_relaxed);
    if (n < FL_HITS_EXACT) {
        atomic_store_explicit(&e->hits, n + 1, memory_order_relaxed);
    } else {
        x->rng ^= x->rng << 13, x->rng ^= x->rng >> 7, x->rng ^= x->rng << 17;
        uint64_t d = 1ull << (63 - __builtin_clzll(n / FL_HITS_EXACT));
        if (!(x->rng & (d - 1))) atomic_store_explicit(&e->hits, n + d, memory_order_relaxed);
    }
    uint8_t f = atomic_load_explicit(&e->freq, memory_order_relaxed);
    if (f < FL_FREQ_MAX) atomic_store_explicit(&e->freq, (uint8_t)(f + 1), memory_order_relaxed);
    return n + 1;
}

enum { SERVE_NO = 0, SERVE_HIT = 1, SERVE_STALE = 2 };

/* Serves key from e if it is fresh, or stale with a refresh pending; the lock is not needed
 * (the caller holds it or is inside an epoch). Hot entries are only read: their hit count
 * and S3-FIFO counter saturate, and the refresh flag is set once, by one caller. */
static inline int serve(struct flame_item_cache *c, fl_entry *e, uint64_t now, hit_ctx *x, bool *schedule)
{
    int r;
    if (now < e->expires)
        r = SERVE_HIT;
    else if (atomic_load_explicit(&e->refresh_pending, memory_order_relaxed))
        r = SERVE_STALE;
    else
        return SERVE_NO;
    uint64_t hits = count_hit(e, x);
    if (now >= e->refresh_at && hits >= c->refresh_min_hits &&
        !atomic_load_explicit(&e->refresh_pending, memory_order_relaxed)) {
        uint8_t idle = 0;
        if (atomic_compare_exchange_strong(&e->refresh_pending, &idle, 1)) *schedule = true;
    }
    return r;
}

typedef struct pending {
    size_t idx;
    fl_flight *f;
    fl_shard *sh;
} pending;

static flame_status put_result(flame_feature_batch *out, size_t i, const uint8_t *blob, uint32_t len)
{
    if (blob) return fl_batch_put_blob(out, i, blob, len);
    out->rec[i] = (fl_rec_ref){.state = FL_REC_MISSING};
    return FLAME_OK;
}

/* The lookups of one call: their misses and the flights they start or join. */
typedef struct lookup {
    struct flame_item_cache *c;
    const int64_t *ids;
    size_t n;
    flame_feature_batch *out;
    uint64_t now;
    hit_ctx x;
    uint64_t served[3];
    pending *lead, *join;
    size_t nlead, njoin;
} lookup;

/* Id i, found absent or expired without the lock: decided under it (a writer may just have
 * installed it): a hit after all, or a miss that starts or joins a flight. */
static flame_status lookup_locked(lookup *L, size_t i, fl_shard *sh, uint64_t h)
{
    flame_status st = FLAME_OK;
    bool schedule = false;
    int64_t key = L->ids[i];
    pthread_mutex_lock(&sh->lock);
    fl_entry *e = fl_shard_find(sh, key, h);
    int r = e ? serve(L->c, e, L->now, &L->x, &schedule) : SERVE_NO;
    if (r) {
        L->served[r]++;
        st = put_result(L->out, i, e->negative ? NULL : fl_entry_blob(e), e->len);
    } else {
        sh->misses++;
        if (!L->lead) {
            L->lead = malloc(L->n * sizeof *L->lead);
            L->join = malloc(L->n * sizeof *L->join);
        }
        fl_flight *f = L->lead && L->join ? fl_flight_find(sh, key) : NULL;
        if (f) {
            f->refs++;
            L->join[L->njoin++] = (pending){i, f, sh};
        } else if (L->lead && L->join && (f = fl_flight_start(sh, key))) {
            L->lead[L->nlead++] = (pending){i, f, sh};
        } else {
            st = fl_error(FLAME_ERR_NOMEM, "out of memory fetching id %lld", (long long)key);
        }
    }
    pthread_mutex_unlock(&sh->lock);
    if (schedule) fl_refresh_schedule(L->c, key, 0, 0);
    return st;
}

/* A call's lookups run as a software pipeline: the bucket head of id i + 2 * FL_AHEAD and the
 * entry of id i + FL_AHEAD are prefetched while id i is served, so the cache misses of a
 * batch overlap instead of queueing one by one (a hit is otherwise two dependent misses). */
#define FL_AHEAD 8
#define FL_RING (2 * FL_AHEAD)

typedef struct ahead {
    uint64_t h[FL_RING];
    fl_shard *sh[FL_RING];
} ahead;

static inline void ahead_bucket(const struct flame_item_cache *c, ahead *a, const int64_t *ids, size_t j)
{
    fl_shard *sh = a->sh[j % FL_RING] = fl_shard_of(c, ids[j], &a->h[j % FL_RING]);
    __builtin_prefetch(&sh->buckets[a->h[j % FL_RING] & sh->mask]);
}

static inline void ahead_entry(const ahead *a, size_t j)
{
    const fl_shard *sh = a->sh[j % FL_RING];
    const char *e = (const char *)atomic_load_explicit(&sh->buckets[a->h[j % FL_RING] & sh->mask], memory_order_relaxed);
    if (e) __builtin_prefetch(e), __builtin_prefetch(e + sizeof(fl_entry)); /* header, record */
}

static flame_status get_into(struct flame_item_cache *c, const int64_t *ids, size_t n, flame_feature_batch *out,
                             fl_fetch_time *ft);

flame_status fl_icache_get(struct flame_item_cache *c, const int64_t *ids, size_t n, flame_feature_batch *out,
                           fl_fetch_time *ft)
{
    fl_fetch_time unused;
    if (!ft) ft = &unused;
    *ft = (fl_fetch_time){0};
    int64_t *copy = NULL; /* ids read back from out (a bag of its records) are read from a copy */
    const int64_t *own = ids;
    flame_status st = fl_batch_own_ids(out, &own, n, &copy);
    if (st) return st;
    st = get_into(c, own, n, out, ft);
    free(copy);
    return st;
}

static flame_status get_into(struct flame_item_cache *c, const int64_t *ids, size_t n, flame_feature_batch *out,
                             fl_fetch_time *ft)
{
    flame_status st = fl_batch_reset(out, n);
    if (st || n == 0) return st;
    lookup L = {.c = c, .ids = ids, .n = n, .out = out, .now = fl_now(c)};
    ahead a;
    unsigned slot = fl_ebr_slot();
    L.x.rng = atomic_load_explicit(&c->counts[slot].rng, memory_order_relaxed) | 1;
    /* one read-side section for the lookups; it ends before any fetch or wait */
    uint64_t epoch = fl_ebr_enter(&c->ebr, slot);
    for (size_t j = 0; j < n && j < FL_RING; j++) ahead_bucket(c, &a, ids, j);
    for (size_t j = 0; j < n && j < FL_AHEAD; j++) ahead_entry(&a, j);
    for (size_t i = 0; i < n && !st; i++) {
        uint64_t h = a.h[i % FL_RING];
        fl_shard *sh = a.sh[i % FL_RING];
        if (i + FL_RING < n) ahead_bucket(c, &a, ids, i + FL_RING); /* i's slot is free now */
        if (i + FL_AHEAD < n) ahead_entry(&a, i + FL_AHEAD);
        bool schedule = false;
        fl_entry *e = fl_shard_find(sh, ids[i], h);
        int r = e ? serve(c, e, L.now, &L.x, &schedule) : SERVE_NO;
        if (!r) {
            st = lookup_locked(&L, i, sh, h);
            continue;
        }
        L.served[r]++; /* the hit path: no lock, no shared write on a hot entry */
        st = e->negative ? put_result(out, i, NULL, 0) : fl_batch_put_padded(out, i, fl_entry_blob(e), e->len);
        if (schedule) fl_refresh_schedule(c, ids[i], 0, 0);
    }
    fl_ebr_leave(&c->ebr, slot, epoch);
    if (L.served[SERVE_HIT]) atomic_fetch_add_explicit(&c->counts[slot].hits, L.served[SERVE_HIT], memory_order_relaxed);
    if (L.served[SERVE_STALE])
        atomic_fetch_add_explicit(&c->counts[slot].stale, L.served[SERVE_STALE], memory_order_relaxed);
    atomic_store_explicit(&c->counts[slot].rng, L.x.rng, memory_order_relaxed);
    pending *lead = L.lead, *join = L.join;
    size_t nlead = L.nlead, njoin = L.njoin;
    /* the fetch time: the source's calls and the waits on other calls' flights, on the stage
     * clock (the cache's own clock may be a host's or a test's) */
    ft->missed = nlead || njoin;
    /* our own fetch first, then the waits: a call never waits before its flights are done */
    if (nlead) {
        int64_t *keys = malloc(nlead * sizeof *keys);
        flame_feature_batch *got = NULL;
        flame_status fst = keys ? flame_feature_batch_create(c->num_slots, &got) : FLAME_ERR_NOMEM;
        if (!fst) {
            for (size_t k = 0; k < nlead; k++) keys[k] = ids[lead[k].idx];
            atomic_fetch_add(&c->fetches, 1);
            const uint64_t t0 = fl_now_us();
            fst = fl_source_fetch(c->source, keys, nlead, got);
            ft->us += fl_now_us() - t0;
        } else {
            fst = fl_error(FLAME_ERR_NOMEM, "out of memory for a fetch of %zu ids", nlead);
        }
        uint64_t done_at = fl_now(c);
        /* a fetch of several ids refused for a record (FORMAT, INVALID_ARG) is made again id by
         * id, as refreshes are: one bad record must not fail the flights of the others (nor the
         * calls that joined them). A source that failed as a whole (UNAVAILABLE, a timeout) is
         * not asked again per id: that would multiply its timeouts by the batch's size. */
        const bool isolate = got && nlead > 1 && (fst == FLAME_ERR_FORMAT || fst == FLAME_ERR_INVALID_ARG);
        flame_status first = FLAME_OK;
        char first_msg[256] = "";
        if (isolate)
            fl_log(FLAME_LOG_WARN, "item cache: fetch of %zu ids failed (%s); fetching them one by one", nlead,
                   flame_last_error());
        for (size_t k = 0; k < nlead; k++) {
            flame_status kst = fst;
            size_t at = k;
            if (isolate) {
                atomic_fetch_add(&c->fetches, 1);
                const uint64_t t0 = fl_now_us();
                kst = fl_source_fetch(c->source, &keys[k], 1, got);
                ft->us += fl_now_us() - t0;
                at = 0;
                if (kst && !first) {
                    first = kst;
                    snprintf(first_msg, sizeof first_msg, "%s", flame_last_error());
                }
                done_at = fl_now(c);
            }
            uint32_t len = 0, state = 0;
            const uint8_t *blob = kst ? NULL : fl_batch_blob(got, at, &len, &state);
            pthread_mutex_lock(&lead[k].sh->lock);
            fl_flight_finish(c, lead[k].sh, lead[k].f, kst, blob, len, done_at);
            pthread_mutex_unlock(&lead[k].sh->lock);
            if (!kst && !st) st = put_result(out, lead[k].idx, blob, len);
        }
        if (isolate) {
            if (first && !st) st = fl_error(first, "%s", first_msg);
        } else if (fst && !st) {
            st = fst;
        }
        flame_feature_batch_destroy(got);
        free(keys);
    }
    const uint64_t waits_from = njoin ? fl_now_us() : 0;
    for (size_t k = 0; k < njoin; k++) {
        fl_flight *f = join[k].f;
        pthread_mutex_lock(&join[k].sh->lock);
        while (!f->done) pthread_cond_wait(&f->cv, &join[k].sh->lock);
        flame_status fst = f->status;
        if (!fst && !st) st = put_result(out, join[k].idx, f->negative ? NULL : f->blob, f->len);
        if (fst && !st)
            st = fl_error(fst, "the fetch of id %lld (made by another call) failed with %s", (long long)f->key,
                          flame_status_string(fst));
        flight_unref(f);
        pthread_mutex_unlock(&join[k].sh->lock);
    }
    if (njoin) ft->us += fl_now_us() - waits_from;
    free(lead);
    free(join);
    return st;
}

/* ---- public */

/* The caller's params (NULL: all defaults) with every 0 replaced by its default, checked. */
static flame_status read_params(const flame_item_cache_params *given, flame_item_cache_params *p)
{
    *p = (flame_item_cache_params){.struct_size = sizeof *p};
    if (given) {
        flame_status st = fl_struct_in("flame_item_cache_params", p, sizeof *p, given);
        if (st) return st;
    }
    const uint64_t year = 31536000000000ull; /* us */
    struct {
        const char *name;
        uint64_t *v, def, lo, hi;
    } f[] = {{"max_entries", &p->max_entries, 1000000, 1, 1ull << 32},
             {"max_bytes", &p->max_bytes, 1ull << 30, 4096, 1ull << 48},
             {"hot_ttl_us", &p->hot_ttl_us, 30ull * 60 * 1000000, 1, year},
             {"cold_ttl_us", &p->cold_ttl_us, 60ull * 1000000, 1, year},
             {"hot_hits", &p->hot_hits, 32, 1, 1ull << 32},
             {"negative_ttl_us", &p->negative_ttl_us, 10ull * 1000000, 1, year},
             {"refresh_min_hits", &p->refresh_min_hits, 2, 1, 1ull << 32},
             {"retry_min_us", &p->retry_min_us, 100000, 1, year},
             {"retry_max_us", &p->retry_max_us, 30ull * 1000000, 1, year}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (!*f[i].v) *f[i].v = f[i].def;
        if (*f[i].v < f[i].lo || *f[i].v > f[i].hi)
            return fl_error(FLAME_ERR_INVALID_ARG, "flame_item_cache_params.%s = %llu is out of range [%llu, %llu]",
                            f[i].name, (unsigned long long)*f[i].v, (unsigned long long)f[i].lo,
                            (unsigned long long)f[i].hi);
    }
    if (!p->shards) p->shards = 64;
    if (p->shards > 4096)
        return fl_error(FLAME_ERR_INVALID_ARG, "flame_item_cache_params.shards = %u is out of range [1, 4096]",
                        p->shards);
    if (!p->refresh_percent) p->refresh_percent = 80;
    if (p->refresh_percent > 100)
        return fl_error(FLAME_ERR_INVALID_ARG,
                        "flame_item_cache_params.refresh_percent = %u is out of range [1, 100] (100: no refresh-ahead)",
                        p->refresh_percent);
    if (p->manual_refresh != 0 && p->manual_refresh != 1)
        return fl_error(FLAME_ERR_INVALID_ARG, "flame_item_cache_params.manual_refresh = %d, expected 0 or 1",
                        (int)p->manual_refresh);
    if (p->hot_ttl_us < p->cold_ttl_us)
        return fl_error(FLAME_ERR_INVALID_ARG,
                        "flame_item_cache_params.hot_ttl_us = %llu is below cold_ttl_us = %llu",
                        (unsigned long long)p->hot_ttl_us, (unsigned long long)p->cold_ttl_us);
    if (p->retry_max_us < p->retry_min_us)
        return fl_error(FLAME_ERR_INVALID_ARG,
                        "flame_item_cache_params.retry_max_us = %llu is below retry_min_us = %llu",
                        (unsigned long long)p->retry_max_us, (unsigned long long)p->retry_min_us);
    return FLAME_OK;
}

FLAME_API flame_status flame_item_cache_create(flame_feature_source *source, const flame_item_cache_params *params,
                                               flame_item_cache **out)
{
    fl_clear_error();
    if (out) *out = NULL;
    if (!source || !out) return fl_error(FLAME_ERR_INVALID_ARG, "flame_item_cache_create: NULL source or out");
    flame_item_cache_params p;
    flame_status st = read_params(params, &p);
    if (st) return st;
    struct flame_item_cache *c = aligned_alloc(64, sizeof *c);
    if (!c) return fl_error(FLAME_ERR_NOMEM, "out of memory allocating an item cache");
    memset(c, 0, sizeof *c);
    atomic_init(&c->refs, 1);
    fl_ebr_init(&c->ebr);
    for (unsigned i = 0; i < FL_EBR_STRIPES; i++) atomic_init(&c->counts[i].rng, fl_hash64(i + 1) | 1);
    c->source = source;
    fl_source_retain(source);
    c->num_slots = source->num_slots;
    c->clock = p.clock_fn ? p.clock_fn : default_clock;
    c->clock_user = p.clock_fn ? p.clock_user : NULL;
    c->ttl_fn = p.ttl_fn;
    c->ttl_user = p.ttl_user;
    c->hot_ttl = p.hot_ttl_us, c->cold_ttl = p.cold_ttl_us;
    c->hot_hits = p.hot_hits, c->neg_ttl = p.negative_ttl_us;
    c->refresh_pct = p.refresh_percent == 100 ? 0 : p.refresh_percent; /* 0 inside: no refresh-ahead */
    c->refresh_min_hits = p.refresh_min_hits;
    c->retry_min = p.retry_min_us, c->retry_max = p.retry_max_us;
    while ((1ull << c->shard_bits) < (uint64_t)p.shards) c->shard_bits++;
    /* fewer shards than asked when the bounds are small: each shard bounds its own share and
     * keeps the entry it just took even above it, so more shards than entries (or than 64 KiB
     * shares of the bytes) would hold up to a shard's count over the cache's bounds */
    while (c->shard_bits > 0 && ((1ull << c->shard_bits) > p.max_entries || (p.max_bytes >> c->shard_bits) < 65536))
        c->shard_bits--;
    c->nshards = 1u << c->shard_bits;
    pthread_mutex_init(&c->rq_lock, NULL);
    pthread_cond_init(&c->rq_cv, NULL);
    c->shards = aligned_alloc(64, c->nshards * sizeof(fl_shard));
    if (!c->shards) goto nomem;
    memset(c->shards, 0, c->nshards * sizeof(fl_shard));
    for (uint32_t i = 0; i < c->nshards; i++) {
        /* the shares add up to the bounds exactly: the first max_entries % nshards take one more */
        const uint64_t per_entries = p.max_entries / c->nshards + (i < p.max_entries % c->nshards);
        const uint64_t per_bytes = p.max_bytes / c->nshards;
        fl_shard *sh = &c->shards[i];
        pthread_mutex_init(&sh->lock, NULL);
        sh->ebr = &c->ebr;
        sh->max_entries = per_entries;
        sh->max_bytes = per_bytes;
        sh->small_max = per_entries / 10 ? per_entries / 10 : 1;
        uint64_t nb = 1;
        while (nb < per_entries) nb *= 2;
        sh->mask = nb - 1;
        sh->buckets = calloc(nb, sizeof *sh->buckets);
        if (!sh->buckets || fl_ghost_init(&sh->ghost, per_entries)) goto nomem;
    }
    if (!p.manual_refresh) {
        if (pthread_create(&c->thread, NULL, fl_refresh_thread, c) != 0) {
            flame_item_cache_destroy(c);
            return fl_error(FLAME_ERR_INTERNAL, "cannot start the item cache refresh thread");
        }
        c->has_thread = true;
    }
    *out = c;
    return FLAME_OK;
nomem:
    if (!c->shards) c->nshards = 0;
    flame_item_cache_destroy(c);
    return fl_error(FLAME_ERR_NOMEM, "out of memory allocating an item cache of %llu entries",
                    (unsigned long long)p.max_entries);
}

void fl_icache_retain(struct flame_item_cache *c)
{
    atomic_fetch_add(&c->refs, 1);
}

void fl_icache_release(struct flame_item_cache *c)
{
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1) return;
    if (c->has_thread) {
        /* the last reference may go on the refresh thread itself (a fetch callback that drops
         * it, e.g. a garbage-collecting host language): it cannot join itself, so it frees the
         * cache once it is out of the refresh it is in */
        const pthread_t th = c->thread; /* once free_on_exit is published, c may be freed by th */
        const bool self = pthread_equal(pthread_self(), th);
        pthread_mutex_lock(&c->rq_lock);
        c->stop = true;
        /* nor can it be joined while it waits for an asynchronous fetch: the thread dropping the
         * reference may be the one that would complete it (the host's completion thread
         * releasing the cache before it calls flame_feature_batch_complete) */
        const bool awaiting = c->refresh_got && fl_batch_awaiting(c->refresh_got);
        c->free_on_exit = self || awaiting;
        pthread_cond_broadcast(&c->rq_cv);
        pthread_mutex_unlock(&c->rq_lock);
        if (self || awaiting) {
            pthread_detach(th);
            return;
        }
        pthread_join(th, NULL);
    }
    fl_icache_free(c);
}

void fl_icache_free(struct flame_item_cache *c)
{
    for (uint32_t i = 0; i < c->nshards; i++) {
        fl_shard *sh = &c->shards[i];
        for (uint64_t b = 0; sh->buckets && b <= sh->mask; b++)
            for (fl_entry *e = atomic_load(&sh->buckets[b]), *next; e; e = next) {
                next = atomic_load(&e->hnext);
                free(e);
            }
        fl_ebr_drain(&sh->retired, entry_free);
        free(sh->buckets);
        fl_ghost_free(&sh->ghost);
        pthread_mutex_destroy(&sh->lock);
    }
    free(c->shards);
    free(c->rq);
    pthread_mutex_destroy(&c->rq_lock);
    pthread_cond_destroy(&c->rq_cv);
    fl_source_release(c->source);
    free(c);
}

FLAME_API void flame_item_cache_destroy(flame_item_cache *c)
{
    fl_icache_release(c);
}

FLAME_API flame_status flame_item_cache_set_clock(flame_item_cache *c, flame_clock_fn fn, void *user)
{
    fl_clear_error();
    if (!c) return fl_error(FLAME_ERR_INVALID_ARG, "flame_item_cache_set_clock: cache is NULL");
    pthread_mutex_lock(&c->rq_lock); /* the refresh thread reads the clock under this lock */
    c->clock = fn ? fn : default_clock;
    c->clock_user = fn ? user : NULL;
    pthread_mutex_unlock(&c->rq_lock);
    return FLAME_OK;
}

FLAME_API flame_status flame_item_cache_set_ttl_fn(flame_item_cache *c, flame_ttl_fn fn, void *user)
{
    fl_clear_error();
    if (!c) return fl_error(FLAME_ERR_INVALID_ARG, "flame_item_cache_set_ttl_fn: cache is NULL");
    pthread_mutex_lock(&c->rq_lock);
    c->ttl_fn = fn;
    c->ttl_user = user;
    pthread_mutex_unlock(&c->rq_lock);
    return FLAME_OK;
}

FLAME_API flame_status flame_item_cache_get(flame_item_cache *c, const int64_t *ids, size_t n,
                                            flame_feature_batch *out)
{
    fl_clear_error();
    if (!c || !out) return fl_error(FLAME_ERR_INVALID_ARG, "flame_item_cache_get: NULL cache or out");
    if (n && !ids) return fl_error(FLAME_ERR_INVALID_ARG, "ids is NULL with n %zu", n);
    if (out->num_slots != c->num_slots)
        return fl_error(FLAME_ERR_INVALID_ARG, "batch has %d slots, the cache's records %d", out->num_slots, c->num_slots);
    return fl_icache_get(c, ids, n, out, NULL);
}

/* Cancels the installation of fetches in flight for key (lock held). */
static void supersede(fl_shard *sh, int64_t key)
{
    for (fl_flight *f = sh->flights; f; f = f->next)
        if (f->key == key) f->superseded = true;
}

FLAME_API flame_status flame_item_cache_put(flame_item_cache *c, int64_t id, const int64_t *slot_offsets,
                                            const int64_t *ids, size_t num_ids, const float *dense,
                                            size_t num_dense)
{
    fl_clear_error();
    if (!c) return fl_error(FLAME_ERR_INVALID_ARG, "flame_item_cache_put: cache is NULL");
    if (id < 0) /* ids are table rows: no source gives a record for a negative one either */
        return fl_error(FLAME_ERR_INVALID_ARG, "flame_item_cache_put: item id %lld is negative", (long long)id);
    /* encode through a one-record batch: the same checks as a source's records */
    flame_feature_batch *b;
    flame_status st = flame_feature_batch_create(c->num_slots, &b);
    if (!st) st = fl_batch_reset(b, 1);
    if (!st) st = flame_feature_batch_set(b, 0, slot_offsets, ids, num_ids, dense, num_dense);
    if (!st) {
        uint64_t h;
        fl_shard *sh = fl_shard_of(c, id, &h);
        pthread_mutex_lock(&sh->lock);
        supersede(sh, id);
        st = install(c, sh, id, h, b->arena + b->rec[0].off, b->rec[0].len, fl_now(c));
        pthread_mutex_unlock(&sh->lock);
    }
    flame_feature_batch_destroy(b);
    return st;
}

FLAME_API flame_status flame_item_cache_invalidate(flame_item_cache *c, int64_t id)
{
    fl_clear_error();
    if (!c) return fl_error(FLAME_ERR_INVALID_ARG, "flame_item_cache_invalidate: cache is NULL");
    uint64_t h;
    fl_shard *sh = fl_shard_of(c, id, &h);
    pthread_mutex_lock(&sh->lock);
    supersede(sh, id);
    fl_entry *e = fl_shard_find(sh, id, h);
    if (e) fl_entry_remove(sh, e, h);
    pthread_mutex_unlock(&sh->lock);
    return FLAME_OK;
}

FLAME_API flame_status flame_item_cache_run_refresh(flame_item_cache *c, uint64_t *refreshed)
{
    fl_clear_error();
    if (!c) return fl_error(FLAME_ERR_INVALID_ARG, "flame_item_cache_run_refresh: cache is NULL");
    uint64_t n = fl_refresh_run(c);
    if (refreshed) *refreshed = n;
    return FLAME_OK;
}

FLAME_API flame_status flame_item_cache_get_stats(flame_item_cache *c, flame_item_cache_stats *out)
{
    fl_clear_error();
    if (!c || !out) return fl_error(FLAME_ERR_INVALID_ARG, "flame_item_cache_get_stats: NULL argument");
    flame_status st = fl_struct_size_check("flame_item_cache_stats", out->struct_size, sizeof *out);
    if (st) return st;
    flame_item_cache_stats v = {.struct_size = sizeof v}, *s = &v;
    for (uint32_t i = 0; i < c->nshards; i++) {
        fl_shard *sh = &c->shards[i];
        pthread_mutex_lock(&sh->lock);
        s->misses += sh->misses, s->evictions += sh->evictions, s->entries += sh->entries, s->bytes += sh->bytes;
        pthread_mutex_unlock(&sh->lock);
    }
    for (unsigned i = 0; i < FL_EBR_STRIPES; i++) {
        s->hits += atomic_load_explicit(&c->counts[i].hits, memory_order_relaxed);
        s->stale_serves += atomic_load_explicit(&c->counts[i].stale, memory_order_relaxed);
    }
    s->refreshes = atomic_load(&c->refreshes);
    s->refresh_failures = atomic_load(&c->refresh_failures);
    s->fetches = atomic_load(&c->fetches);
    return fl_struct_out("flame_item_cache_stats", out, &v, sizeof v);
}
