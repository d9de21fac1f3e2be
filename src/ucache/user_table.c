/* get/put/remove/stats of the user cache: two-choice buckets of 8 ways. A user lives in one of
 * its two buckets; gets read lock-free, writers lock both buckets (lower index first). */
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "ucache/user_cache.h"
#include "core/abi.h"

/* Readers spin this many times on a record a writer is inside before they wait for (or
 * recover) the bucket's lock: a live writer holds a record for well under a microsecond. */
#define SPIN_LIMIT 2000

static inline uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void buckets_of(const flame_user_cache *c, int64_t user, uint64_t *b1, uint64_t *b2)
{
    uint64_t n = c->lay.num_buckets, h = mix((uint64_t)user + 0x9e3779b97f4a7c15ull);
    *b1 = h % n;
    *b2 = mix(h) % n;
    if (*b2 == *b1) *b2 = (*b1 + 1) % n;
}

/* now - t in us, saturated at INT64_MAX, 0 for a time in the future: written-at times come
 * from the shared table, so any value may turn up. */
static int64_t age_of(int64_t now, int64_t t)
{
    if (t >= now) return 0;
    uint64_t d = (uint64_t)now - (uint64_t)t;
    return d > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)d;
}

static flame_status lock_error(const flame_user_cache *c, uint64_t bucket, int rc)
{
    return fl_error(FLAME_ERR_IO, "shm '%s': the lock of bucket %llu is unusable (%s): another process overwrote it",
                    c->name, (unsigned long long)bucket, strerror(rc));
}

/* Locks buckets i1 and i2, lower index first; on failure neither is held. */
static flame_status lock_two(flame_user_cache *c, fl_uc_bucket *b[2], uint64_t i1, uint64_t i2)
{
    int lo = i1 < i2 ? 0 : 1, rc = fl_uc_lock(c, b[lo]);
    if (rc) return lock_error(c, lo ? i2 : i1, rc);
    if ((rc = fl_uc_lock(c, b[1 - lo])) != 0) {
        fl_uc_unlock(b[lo]);
        return lock_error(c, lo ? i1 : i2, rc);
    }
    return FLAME_OK;
}

static flame_status check_features(const flame_user_features *f)
{
    if (!f->slot_lens) return fl_error(FLAME_ERR_INVALID_ARG, "features->slot_lens is NULL");
    return FLAME_OK;
}

static flame_status put(flame_user_cache *c, int64_t user, const flame_user_features *f)
{
    if (!c) return fl_error(FLAME_ERR_INVALID_ARG, "cache is NULL");
    flame_status st = check_features(f);
    if (st != FLAME_OK) return st;
    const fl_uc_layout *h = &c->lay;
    if (f->num_ids > h->max_ids)
        return fl_error(FLAME_ERR_INVALID_ARG, "user %lld: num_ids %zu is above the table's max_ids %u",
                        (long long)user, f->num_ids, h->max_ids);
    if (f->num_dense > h->max_dense)
        return fl_error(FLAME_ERR_INVALID_ARG, "user %lld: num_dense %zu is above the table's max_dense %u",
                        (long long)user, f->num_dense, h->max_dense);
    if ((f->num_ids && !f->ids) || (f->num_dense && !f->dense))
        return fl_error(FLAME_ERR_INVALID_ARG, "user %lld: features->%s is NULL with a non-zero count",
                        (long long)user, f->num_ids && !f->ids ? "ids" : "dense");
    /* a struct a get filled (its capacities set) put back after FLAME_ERR_BUFFER_TOO_SMALL
     * holds the counts needed, not those its arrays hold: reading them overran the arrays */
    if (f->ids_capacity && f->num_ids > f->ids_capacity)
        return fl_error(FLAME_ERR_INVALID_ARG, "user %lld: num_ids %zu is above features->ids_capacity %zu",
                        (long long)user, f->num_ids, f->ids_capacity);
    if (f->dense_capacity && f->num_dense > f->dense_capacity)
        return fl_error(FLAME_ERR_INVALID_ARG, "user %lld: num_dense %zu is above features->dense_capacity %zu",
                        (long long)user, f->num_dense, f->dense_capacity);
    uint64_t sum = 0;
    for (uint32_t s = 0; s < h->num_slots; s++) sum += f->slot_lens[s];
    if (sum != f->num_ids)
        return fl_error(FLAME_ERR_INVALID_ARG, "user %lld: slot_lens sum to %llu, num_ids is %zu", (long long)user,
                        (unsigned long long)sum, f->num_ids);

    if ((st = fl_uc_check_size(c)) != FLAME_OK) return st;
    uint64_t i1, i2;
    buckets_of(c, user, &i1, &i2);
    fl_uc_bucket *b[2] = {fl_uc_bucket_at(c, i1), fl_uc_bucket_at(c, i2)};
    if ((st = lock_two(c, b, i1, i2)) != FLAME_OK) return st;
    int64_t now = fl_uc_now_us();
    /* the user's own record, else an empty way (in the emptier bucket), else an expired one,
     * else the least recently written one */
    int pick_b = -1, pick_w = -1, empty_b = -1, empty_w = -1, old_b = 0, old_w = 0;
    int64_t old_t = INT64_MAX;
    for (int k = 0; k < 2 && pick_b < 0; k++) {
        for (unsigned w = 0; w < FL_UC_WAYS; w++) {
            _Atomic uint64_t *r = fl_uc_record(c, b[k], w);
            uint64_t meta = atomic_load_explicit(&r[FL_UC_META], memory_order_relaxed);
            if (!(meta & FL_UC_LIVE)) {
                uint32_t live_k = atomic_load_explicit(&b[k]->live, memory_order_relaxed);
                if (empty_b < 0 || live_k < atomic_load_explicit(&b[empty_b]->live, memory_order_relaxed))
                    empty_b = k, empty_w = (int)w;
                continue;
            }
            if ((int64_t)atomic_load_explicit(&r[FL_UC_KEY], memory_order_relaxed) == user) {
                pick_b = k, pick_w = (int)w;
                break;
            }
            int64_t t = (int64_t)atomic_load_explicit(&r[FL_UC_TIME], memory_order_relaxed);
            if (h->ttl_us > 0 && age_of(now, t) > h->ttl_us) t = INT64_MIN / 2 + t / 2; /* expired first, oldest first */
            if (t < old_t) old_t = t, old_b = k, old_w = (int)w;
        }
    }
    if (pick_b < 0 && empty_b >= 0) {
        pick_b = empty_b, pick_w = empty_w;
        atomic_fetch_add_explicit(&b[pick_b]->live, 1, memory_order_relaxed);
    } else if (pick_b < 0) {
        pick_b = old_b, pick_w = old_w;
        atomic_fetch_add(&c->hdr->evictions, 1);
    }
    fl_uc_write(c, b[pick_b], (unsigned)pick_w, user, f, now);
    atomic_fetch_add(&c->hdr->puts, 1);
    fl_uc_unlock(b[i1 < i2 ? 1 : 0]);
    fl_uc_unlock(b[i1 < i2 ? 0 : 1]);
    return FLAME_OK;
}

/* Looks for `user` in one bucket. 1 hit, 0 miss; *corrupt counts the records for `user` that
 * were refused (fl_uc_read). */
static int find(flame_user_cache *c, fl_uc_bucket *b, int64_t user, flame_user_features *f, uint64_t *meta,
                int64_t *time, int *corrupt)
{
    for (unsigned w = 0; w < FL_UC_WAYS; w++) {
        if (atomic_load_explicit(&b->hint[w], memory_order_acquire) != user) continue;
        fl_uc_read_result r = FL_UC_TORN;
        for (int spin = 0; spin < SPIN_LIMIT && r == FL_UC_TORN; spin++) {
            r = fl_uc_read(c, b, w, user, false, f, meta, time);
            if (r == FL_UC_TORN && spin % 64 == 63) sched_yield();
        }
        if (r == FL_UC_TORN) {
            /* the writer is slow or dead: its lock makes it finish, or recovers the bucket */
            if (fl_uc_lock(c, b) == 0) {
                r = fl_uc_read(c, b, w, user, true, f, meta, time);
                fl_uc_unlock(b);
            } else {
                r = FL_UC_CORRUPT;
            }
        }
        if (r == FL_UC_HIT) return 1;
        *corrupt += r == FL_UC_CORRUPT;
    }
    return 0;
}

static flame_status get(flame_user_cache *c, int64_t user, flame_user_features *f, int32_t *found)
{
    if (!c || !found) return fl_error(FLAME_ERR_INVALID_ARG, "%s is NULL", c ? "found" : "cache");
    flame_status st = check_features(f);
    if (st != FLAME_OK) return st;
    if ((f->ids_capacity && !f->ids) || (f->dense_capacity && !f->dense))
        return fl_error(FLAME_ERR_INVALID_ARG, "features->%s is NULL with a non-zero capacity",
                        f->ids_capacity && !f->ids ? "ids" : "dense");
    if ((st = fl_uc_check_size(c)) != FLAME_OK) return st;
    uint64_t i1, i2, meta = 0;
    int64_t time = 0;
    int corrupt = 0;
    buckets_of(c, user, &i1, &i2);
    int hit = find(c, fl_uc_bucket_at(c, i1), user, f, &meta, &time, &corrupt) ||
              find(c, fl_uc_bucket_at(c, i2), user, f, &meta, &time, &corrupt);
    if (corrupt) {
        if (atomic_fetch_add_explicit(&c->corrupt, (uint64_t)corrupt, memory_order_relaxed) == 0)
            fl_log(FLAME_LOG_WARN, "user cache '%s': a record of user %lld is malformed (another process overwrote "
                   "the table?); read as a miss, counted in flame_user_cache_stats.corrupt", c->name, (long long)user);
    }
    int64_t age = hit ? age_of(fl_uc_now_us(), time) : 0;
    if (hit && c->lay.ttl_us > 0 && age > c->lay.ttl_us) {
        atomic_fetch_add_explicit(&c->expired, 1, memory_order_relaxed);
        hit = 0;
    }
    *found = hit;
    if (!hit) {
        atomic_fetch_add_explicit(&c->misses, 1, memory_order_relaxed);
        return FLAME_OK;
    }
    atomic_fetch_add_explicit(&c->hits, 1, memory_order_relaxed);
    f->num_ids = fl_uc_meta_ids(meta);
    f->num_dense = fl_uc_meta_dense(meta);
    f->age_us = age;
    if (f->num_ids > f->ids_capacity || f->num_dense > f->dense_capacity)
        return fl_error(FLAME_ERR_BUFFER_TOO_SMALL,
                        "user %lld has %zu ids and %zu dense values; capacities are %zu and %zu", (long long)user,
                        f->num_ids, f->num_dense, f->ids_capacity, f->dense_capacity);
    return FLAME_OK;
}

FLAME_API flame_status flame_user_cache_remove(flame_user_cache *c, int64_t user, int32_t *removed)
{
    fl_clear_error();
    if (!c) return fl_error(FLAME_ERR_INVALID_ARG, "cache is NULL");
    flame_status st = fl_uc_check_size(c);
    if (st != FLAME_OK) return st;
    uint64_t i1, i2;
    buckets_of(c, user, &i1, &i2);
    fl_uc_bucket *b[2] = {fl_uc_bucket_at(c, i1), fl_uc_bucket_at(c, i2)};
    if ((st = lock_two(c, b, i1, i2)) != FLAME_OK) return st;
    int done = 0;
    for (int k = 0; k < 2 && !done; k++) {
        for (unsigned w = 0; w < FL_UC_WAYS && !done; w++) {
            _Atomic uint64_t *r = fl_uc_record(c, b[k], w);
            if ((atomic_load_explicit(&r[FL_UC_META], memory_order_relaxed) & FL_UC_LIVE) &&
                (int64_t)atomic_load_explicit(&r[FL_UC_KEY], memory_order_relaxed) == user) {
                fl_uc_write(c, b[k], w, user, NULL, 0);
                atomic_fetch_sub_explicit(&b[k]->live, 1, memory_order_relaxed);
                done = 1;
            }
        }
    }
    fl_uc_unlock(b[i1 < i2 ? 1 : 0]);
    fl_uc_unlock(b[i1 < i2 ? 0 : 1]);
    if (done) atomic_fetch_add(&c->hdr->removes, 1);
    if (removed) *removed = done;
    return FLAME_OK;
}

FLAME_API flame_status flame_user_cache_get_stats(flame_user_cache *c, flame_user_cache_stats *out)
{
    fl_clear_error();
    if (!c || !out) return fl_error(FLAME_ERR_INVALID_ARG, "%s is NULL", c ? "stats" : "cache");
    flame_status st = fl_struct_size_check("flame_user_cache_stats", out->struct_size, sizeof *out);
    if (st) return st;
    if ((st = fl_uc_check_size(c)) != FLAME_OK) return st;
    flame_user_cache_stats v = {.struct_size = sizeof v}, *s = &v;
    const fl_uc_layout *h = &c->lay;
    uint64_t records = 0;
    for (uint64_t i = 0; i < h->num_buckets; i++)
        records += atomic_load_explicit(&fl_uc_bucket_at(c, i)->live, memory_order_relaxed);
    s->capacity = h->num_buckets * FL_UC_WAYS;
    s->records = records;
    s->table_bytes = h->total_bytes;
    s->record_bytes = h->record_bytes;
    s->hits = atomic_load(&c->hits);
    s->misses = atomic_load(&c->misses);
    s->expired = atomic_load(&c->expired);
    s->puts = atomic_load(&c->hdr->puts);
    s->evictions = atomic_load(&c->hdr->evictions);
    s->recoveries = atomic_load(&c->hdr->recoveries);
    s->corrupt = atomic_load(&c->corrupt);
    return fl_struct_out("flame_user_cache_stats", out, &v, sizeof v);
}

/* The public entry points read the caller's flame_user_features by the rule of core/abi.h;
 * get writes its counts back whatever it returns (BUFFER_TOO_SMALL reports them). */
FLAME_API flame_status flame_user_cache_put(flame_user_cache *c, int64_t user, const flame_user_features *f)
{
    fl_clear_error();
    if (!f) return fl_error(FLAME_ERR_INVALID_ARG, "features is NULL");
    flame_user_features v = {0};
    flame_status st = fl_struct_in("flame_user_features", &v, sizeof v, f);
    return st ? st : put(c, user, &v);
}

FLAME_API flame_status flame_user_cache_get(flame_user_cache *c, int64_t user, flame_user_features *f,
                                            int32_t *found)
{
    fl_clear_error();
    if (!f) return fl_error(FLAME_ERR_INVALID_ARG, "features is NULL");
    flame_user_features v = {0};
    flame_status st = fl_struct_in("flame_user_features", &v, sizeof v, f);
    if (st) return st;
    st = get(c, user, &v, found);
    fl_struct_out("flame_user_features", f, &v, sizeof v); /* (its size was checked above) */
    return st;
}
