/* Records of the user cache: seqlock reads (no lock, never a torn record), seqlock writes under
 * the bucket's robust mutex, and the repair of a bucket whose writer died. Every word of a
 * record is an atomic accessed relaxed, ordered by the seq word and fences (Boehm, "Can
 * seqlocks get along with programming language memory models?", MSPC 2012). */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "ucache/user_cache.h"

static _Atomic(int64_t (*)(void)) clock_hook; /* zero-initialised (no initializer: clang rejects one here) */
static _Atomic(void (*)(void)) write_hook;

void fl_uc_set_clock(int64_t (*now_us)(void))
{
    atomic_store(&clock_hook, now_us);
}

void fl_uc_set_write_hook(void (*hook)(void))
{
    atomic_store(&write_hook, hook);
}

int64_t fl_uc_now_us(void)
{
    int64_t (*f)(void) = atomic_load(&clock_hook);
    if (f) return f();
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

uint64_t fl_uc_record_words(uint32_t num_slots, uint32_t max_ids, uint32_t max_dense)
{
    uint64_t words = FL_UC_SLOTS + (num_slots + 1) / 2 + (uint64_t)max_ids + (max_dense + 1) / 2;
    return (words + 7) / 8 * 8; /* whole cache lines: a record never shares a line */
}

static inline uint64_t ld(_Atomic uint64_t *w)
{
    return atomic_load_explicit(w, memory_order_relaxed);
}
static inline void st(_Atomic uint64_t *w, uint64_t v)
{
    atomic_store_explicit(w, v, memory_order_relaxed);
}

/* Word offsets of the parts after the fixed words. */
static inline uint64_t ids_at(const fl_uc_layout *h)
{
    return FL_UC_SLOTS + (h->num_slots + 1) / 2;
}
static inline uint64_t dense_at(const fl_uc_layout *h)
{
    return ids_at(h) + h->max_ids;
}

void fl_uc_write(flame_user_cache *c, fl_uc_bucket *b, unsigned way, int64_t user, const flame_user_features *f,
                 int64_t now_us)
{
    const fl_uc_layout *h = &c->lay;
    _Atomic uint64_t *r = fl_uc_record(c, b, way);
    /* odd inside the write, even after it, whatever the seq was: under the lock only another
     * process overwriting the table leaves it odd, and counting on from there made the seq even
     * during this write (readers could take a half-written record) and odd after it */
    uint64_t seq = ld(&r[FL_UC_SEQ]) & ~1ull;
    st(&r[FL_UC_SEQ], seq + 1);
    atomic_thread_fence(memory_order_release); /* the odd seq is visible before any new word */
    atomic_store_explicit(&b->hint[way], f ? user : FL_UC_NO_KEY, memory_order_relaxed);
    st(&r[FL_UC_KEY], (uint64_t)user);
    if (f) {
        st(&r[FL_UC_META], fl_uc_meta(f->num_ids, f->num_dense));
        st(&r[FL_UC_TIME], (uint64_t)now_us);
        for (uint32_t s = 0; s < h->num_slots; s += 2) {
            uint64_t hi = s + 1 < h->num_slots ? f->slot_lens[s + 1] : 0;
            st(&r[FL_UC_SLOTS + s / 2], f->slot_lens[s] | hi << 32);
        }
        _Atomic uint64_t *ids = r + ids_at(h);
        size_t half = f->num_ids / 2;
        for (size_t i = 0; i < half; i++) st(&ids[i], (uint64_t)f->ids[i]);
        void (*hook)(void) = atomic_load(&write_hook);
        if (hook) hook(); /* tests stop (and kill) the writer here */
        for (size_t i = half; i < f->num_ids; i++) st(&ids[i], (uint64_t)f->ids[i]);
        _Atomic uint64_t *dense = r + dense_at(h);
        for (size_t i = 0; i < f->num_dense; i += 2) {
            uint32_t lo, hi = 0;
            memcpy(&lo, &f->dense[i], 4);
            if (i + 1 < f->num_dense) memcpy(&hi, &f->dense[i + 1], 4);
            st(&dense[i / 2], lo | (uint64_t)hi << 32);
        }
    } else {
        st(&r[FL_UC_META], 0);
    }
    atomic_store_explicit(&r[FL_UC_SEQ], seq + 2, memory_order_release);
}

fl_uc_read_result fl_uc_read(const flame_user_cache *c, fl_uc_bucket *b, unsigned way, int64_t user, bool locked,
                             flame_user_features *f, uint64_t *meta_out, int64_t *time_out)
{
    const fl_uc_layout *h = &c->lay;
    _Atomic uint64_t *r = fl_uc_record(c, b, way);
    uint64_t seq = atomic_load_explicit(&r[FL_UC_SEQ], memory_order_acquire);
    if (seq & 1) return locked ? FL_UC_CORRUPT : FL_UC_TORN; /* writers hold the lock while odd */
    fl_uc_read_result res = FL_UC_MISS;
    uint64_t meta = ld(&r[FL_UC_META]);
    uint32_t n_ids = fl_uc_meta_ids(meta), n_dense = fl_uc_meta_dense(meta);
    if ((int64_t)ld(&r[FL_UC_KEY]) == user && (meta & FL_UC_LIVE)) {
        res = FL_UC_HIT;
        *meta_out = meta;
        *time_out = (int64_t)ld(&r[FL_UC_TIME]);
        /* counts beyond the bounds are never indexed with: a write in progress (the seq check
         * below fails) or an overwritten record (it is not) */
        bool in_bounds = n_ids <= h->max_ids && n_dense <= h->max_dense;
        bool copy = in_bounds && n_ids <= f->ids_capacity && n_dense <= f->dense_capacity;
        uint64_t sum = 0;
        for (uint32_t s = 0; s < h->num_slots && in_bounds; s++) {
            uint64_t w = ld(&r[FL_UC_SLOTS + s / 2]);
            uint32_t len = (uint32_t)(s & 1 ? w >> 32 : w);
            sum += len;
            if (copy) f->slot_lens[s] = len;
        }
        if (copy) {
            _Atomic uint64_t *ids = r + ids_at(h);
            for (uint32_t i = 0; i < n_ids; i++) f->ids[i] = (int64_t)ld(&ids[i]);
            _Atomic uint64_t *dense = r + dense_at(h);
            for (uint32_t i = 0; i < n_dense; i++) {
                uint32_t bits = (uint32_t)(ld(&dense[i / 2]) >> (i & 1 ? 32 : 0));
                memcpy(&f->dense[i], &bits, 4);
            }
        }
        if (!in_bounds || sum != n_ids) res = FL_UC_CORRUPT; /* unless torn: decided below */
    }
    atomic_thread_fence(memory_order_acquire); /* the copies above complete before the re-check */
    return ld(&r[FL_UC_SEQ]) == seq ? res : locked ? FL_UC_CORRUPT : FL_UC_TORN;
}

/* Bucket locks this thread holds, and the recoveries it made under them, reported once it
 * holds none: the log hook is the host's code and may be slow, and a bucket lock held across
 * it would stall every process that uses that bucket. */
static _Thread_local unsigned locks_held;
static _Thread_local unsigned recovered, recovered_dropped;
static _Thread_local const flame_user_cache *recovered_in;

/* The owner died inside the bucket: a record with an odd seq was being written; its old value
 * is partly overwritten, so it is dropped (reads as a miss) and the seq made even again. */
static void repair(flame_user_cache *c, fl_uc_bucket *b)
{
    uint32_t live = 0, dropped = 0;
    for (unsigned w = 0; w < FL_UC_WAYS; w++) {
        _Atomic uint64_t *r = fl_uc_record(c, b, w);
        uint64_t seq = ld(&r[FL_UC_SEQ]);
        if (seq & 1) {
            st(&r[FL_UC_META], 0);
            atomic_store_explicit(&b->hint[w], FL_UC_NO_KEY, memory_order_relaxed);
            atomic_store_explicit(&r[FL_UC_SEQ], seq + 1, memory_order_release);
            dropped++;
        }
        live += (ld(&r[FL_UC_META]) & FL_UC_LIVE) != 0;
    }
    atomic_store_explicit(&b->live, live, memory_order_relaxed);
    atomic_fetch_add(&c->hdr->recoveries, 1);
    recovered++;
    recovered_dropped += dropped;
    recovered_in = c;
}

int fl_uc_lock(flame_user_cache *c, fl_uc_bucket *b)
{
    int rc = pthread_mutex_lock(&b->mu);
    if (rc == EOWNERDEAD) {
        repair(c, b);
        pthread_mutex_consistent(&b->mu);
        rc = 0;
    }
    locks_held += rc == 0;
    /* anything else (ENOTRECOVERABLE, EINVAL) only comes from a mutex another process
     * overwrote: every EOWNERDEAD is made consistent above */
    return rc;
}

void fl_uc_unlock(fl_uc_bucket *b)
{
    pthread_mutex_unlock(&b->mu);
    if (--locks_held == 0 && recovered) {
        fl_log(FLAME_LOG_WARN, "user cache '%s': recovered %u bucket lock(s) from a dead process; %u half-written "
               "record(s) dropped", recovered_in->name, recovered, recovered_dropped);
        recovered = recovered_dropped = 0;
    }
}
