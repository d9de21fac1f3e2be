/* Creating, attaching and checking the shared-memory object of the user cache. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ucache/user_cache.h"
#include "core/abi.h"

static flame_status check_name(const char *name)
{
    if (!name) return fl_error(FLAME_ERR_INVALID_ARG, "name is NULL");
    size_t n = strnlen(name, 252); /* (no need to read further to refuse it) */
    if (n > 251)
        return fl_error(FLAME_ERR_INVALID_ARG, "shm name '%.40s...' is invalid: longer than '/' then 250 characters",
                        name);
    if (n < 2 || name[0] != '/' || strchr(name + 1, '/'))
        return fl_error(FLAME_ERR_INVALID_ARG,
                        "shm name '%s' is invalid: expected '/' then 1..250 characters without '/'", name);
    /* "/." and "/.." name the shm directory and its parent, never an object */
    if (!strcmp(name, "/.") || !strcmp(name, "/.."))
        return fl_error(FLAME_ERR_INVALID_ARG, "shm name '%s' is invalid: '.' and '..' are no object names", name);
    return FLAME_OK;
}

static _Atomic(void (*)(void)) create_hook;

void fl_uc_set_create_hook(void (*hook)(void))
{
    atomic_store(&create_hook, hook);
}

static _Atomic(void (*)(void)) before_lock_hook;

void fl_uc_set_before_lock_hook(void (*hook)(void))
{
    atomic_store(&before_lock_hook, hook);
}

static flame_status check_params(const flame_user_cache_params *p)
{
    if (p->capacity > (1ull << 32))
        return fl_error(FLAME_ERR_INVALID_ARG, "capacity %llu is outside 1..2^32", (unsigned long long)p->capacity);
    if (p->num_slots > 64)
        return fl_error(FLAME_ERR_INVALID_ARG, "num_slots %u is outside 1..64", p->num_slots);
    if (p->max_ids > 65536) return fl_error(FLAME_ERR_INVALID_ARG, "max_ids %u is above 65536", p->max_ids);
    if (p->max_dense > 65536) return fl_error(FLAME_ERR_INVALID_ARG, "max_dense %u is above 65536", p->max_dense);
    if (p->ttl_us < 0) return fl_error(FLAME_ERR_INVALID_ARG, "ttl_us %lld is negative", (long long)p->ttl_us);
    if (p->mode & ~0777u) return fl_error(FLAME_ERR_INVALID_ARG, "mode %o has bits outside 0777", p->mode);
    return FLAME_OK;
}

/* The header a table of these params has (fixed fields only). */
static fl_uc_header expected_header(const flame_user_cache_params *p)
{
    fl_uc_header h = {.layout_version = FL_UC_LAYOUT_VERSION, .header_bytes = FL_UC_HEADER_BYTES,
                      .byte_order = FL_UC_BYTE_ORDER, .mutex_abi = FL_UC_MUTEX_ABI, .ways = FL_UC_WAYS,
                      .capacity = p->capacity, .num_slots = p->num_slots, .max_ids = p->max_ids,
                      .max_dense = p->max_dense, .ttl_us = p->ttl_us};
    memcpy(h.magic, FL_UC_MAGIC, 8);
    h.num_buckets = (p->capacity + FL_UC_WAYS - 1) / FL_UC_WAYS;
    if (h.num_buckets < 2) h.num_buckets = 2; /* two distinct buckets per user */
    h.record_words = (uint32_t)fl_uc_record_words(p->num_slots, p->max_ids, p->max_dense);
    h.record_bytes = h.record_words * 8ull;
    h.bucket_bytes = sizeof(fl_uc_bucket) + FL_UC_WAYS * h.record_bytes;
    h.total_bytes = FL_UC_HEADER_BYTES + h.num_buckets * h.bucket_bytes;
    return h;
}

static fl_uc_layout layout_of(const fl_uc_header *h)
{
    return (fl_uc_layout){.capacity = h->capacity, .num_buckets = h->num_buckets, .bucket_bytes = h->bucket_bytes,
                          .record_bytes = h->record_bytes, .total_bytes = h->total_bytes, .num_slots = h->num_slots,
                          .max_ids = h->max_ids, .max_dense = h->max_dense, .record_words = h->record_words,
                          .ttl_us = h->ttl_us};
}

/* The fixed fields of the shared header, read once: every check is made on this copy, so a
 * process rewriting the header meanwhile cannot pass one check and fail the next. */
static fl_uc_header snapshot(const fl_uc_header *src)
{
    const volatile fl_uc_header *v = src;
    fl_uc_header h = {.layout_version = v->layout_version, .header_bytes = v->header_bytes,
                      .byte_order = v->byte_order, .mutex_abi = v->mutex_abi, .ways = v->ways,
                      .capacity = v->capacity, .num_buckets = v->num_buckets, .bucket_bytes = v->bucket_bytes,
                      .record_bytes = v->record_bytes, .total_bytes = v->total_bytes, .num_slots = v->num_slots,
                      .max_ids = v->max_ids, .max_dense = v->max_dense, .record_words = v->record_words,
                      .ttl_us = v->ttl_us};
    for (int i = 0; i < 8; i++) h.magic[i] = v->magic[i];
    return h;
}

flame_status fl_uc_check_size(flame_user_cache *c)
{
    struct stat sb;
    if (fstat(c->fd, &sb) != 0)
        return fl_error(FLAME_ERR_IO, "cannot stat shm '%s': %s", c->name, strerror(errno));
    if ((uint64_t)sb.st_size < c->lay.total_bytes)
        return fl_error(FLAME_ERR_IO, "shm '%s' is %lld bytes, its layout needs %llu: another process truncated it "
                        "(remove it with flame_user_cache_unlink and create it again)",
                        c->name, (long long)sb.st_size, (unsigned long long)c->lay.total_bytes);
    return FLAME_OK;
}

static flame_status map(flame_user_cache *c, int fd, size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return fl_error(FLAME_ERR_IO, "cannot map %zu bytes of shm '%s': %s", bytes, c->name, strerror(errno));
    c->base = p;
    c->bytes = bytes;
    c->hdr = p;
    return FLAME_OK;
}

static void unmap(flame_user_cache *c)
{
    if (c->base) munmap(c->base, c->bytes);
    c->base = NULL;
    c->hdr = NULL;
    c->bytes = 0;
}

/* Maps `bytes` of the object, dropping a mapping of another size. */
static flame_status remap(flame_user_cache *c, int fd, size_t bytes)
{
    if (c->base && c->bytes == bytes) return FLAME_OK;
    unmap(c);
    return map(c, fd, bytes);
}

/* flock, retried when a signal interrupts the wait. */
static int lock_file(int fd, int op)
{
    int rc;
    while ((rc = flock(fd, op)) != 0 && errno == EINTR) {
    }
    return rc;
}

/* posix_fallocate of the whole object, in pieces, each made again when a signal interrupts it:
 * tmpfs gives up an allocation with EINTR when a signal arrives during it, and throws away what
 * that call had reserved, so a large object reserved in one call could be interrupted for ever
 * by a periodic signal (a profiler's timer); a piece of 16 MiB takes a few milliseconds, and the
 * pieces already reserved stay. */
static int reserve(int fd, off_t bytes)
{
    const off_t piece = (off_t)16 << 20;
    for (off_t at = 0; at < bytes; at += piece) {
        const off_t len = bytes - at < piece ? bytes - at : piece;
        int rc;
        while ((rc = posix_fallocate(fd, at, len)) == EINTR) {
        }
        if (rc) return rc;
    }
    return 0;
}

/* Unlinks `name` if it still names the object open on fd, which this process made and whose
 * creator's lock it holds. The name may have been unlinked since (flame_user_cache_unlink) and
 * made again by another process, whose table an unlink by name alone removed; a
 * flame_user_cache_unlink and a new creation between the comparison and the unlink below (two
 * system calls) would still lose theirs: no call unlinks a name only if it names a given
 * object. A name that cannot be opened is left: it is gone or not ours (or ours, where this
 * process has no descriptor left: an unfinished table then, for a CREATE_OR_ATTACH to take). */
static void unlink_if_ours(const char *name, int fd)
{
    struct stat mine, named;
    if (fstat(fd, &mine) != 0 || mine.st_nlink == 0) return;
    /* the caller's mode may deny its owner reading: ours then could not be opened to compare */
    if (!(mine.st_mode & S_IRUSR) && fchmod(fd, (mine.st_mode & 0777) | S_IRUSR) != 0) return;
    int other = shm_open(name, O_RDONLY, 0);
    if (other < 0) return;
    /* (closing another descriptor of the object keeps our flock: it belongs to fd's open file) */
    bool same = fstat(other, &named) == 0 && named.st_dev == mine.st_dev && named.st_ino == mine.st_ino;
    close(other);
    if (same) shm_unlink(name);
}

/* Makes the object open on fd, whose creator's lock the caller holds and whose state sb gives,
 * a ready table of p: a new object (create()), or one whose creator died before it was ready
 * (take_over()). On failure the object is left unfinished and nothing stays mapped. */
static flame_status initialise(flame_user_cache *c, int fd, const struct stat *sb, const flame_user_cache_params *p)
{
    fl_uc_header want = expected_header(p);
    /* the umask may have cleared bits the caller asked for */
    if ((sb->st_mode & 0777) != p->mode && fchmod(fd, p->mode) != 0)
        return fl_error(FLAME_ERR_IO, "cannot set the mode of shm '%s' to %o: %s", c->name, p->mode,
                        strerror(errno));
    /* What a dead creator left past the header page goes: it may be bucket heads of another
     * layout, which would read as records (the table relies on zeros). The header page stays:
     * attachers waiting for the table have it mapped, and would fault reading `ready` from a
     * page past the end of the object. */
    int rc = 0;
    if (sb->st_size > FL_UC_HEADER_BYTES && ftruncate(fd, FL_UC_HEADER_BYTES) != 0) rc = errno;
    if (!rc) rc = reserve(fd, (off_t)want.total_bytes);
    if (rc)
        return fl_error(rc == ENOSPC ? FLAME_ERR_NOMEM : FLAME_ERR_IO, "cannot reserve %llu bytes for shm '%s': %s",
                        (unsigned long long)want.total_bytes, c->name, strerror(rc));
    flame_status st = remap(c, fd, want.total_bytes);
    if (st != FLAME_OK) return st;
    c->lay = layout_of(&want);
    /* magic and version first: an object whose creator dies from here on is known for a user
     * cache that was never finished, not taken for someone else's */
    memcpy(c->hdr, &want, offsetof(fl_uc_header, ready));
    void (*hook)(void) = atomic_load(&create_hook);
    if (hook) hook(); /* tests make the creator slow, or stop and kill it, here */
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    for (uint64_t i = 0; i < want.num_buckets; i++) {
        fl_uc_bucket *b = (fl_uc_bucket *)(c->base + FL_UC_HEADER_BYTES + i * want.bucket_bytes);
        pthread_mutex_init(&b->mu, &a);
        for (unsigned w = 0; w < FL_UC_WAYS; w++) atomic_init(&b->hint[w], FL_UC_NO_KEY);
    }
    pthread_mutexattr_destroy(&a);
    /* fixed fields only, then the counters: a taken-over header page kept whatever was there */
    memcpy((char *)c->hdr + offsetof(fl_uc_header, byte_order), (char *)&want + offsetof(fl_uc_header, byte_order),
           offsetof(fl_uc_header, puts) - offsetof(fl_uc_header, byte_order));
    atomic_store_explicit(&c->hdr->puts, 0, memory_order_relaxed);
    atomic_store_explicit(&c->hdr->evictions, 0, memory_order_relaxed);
    atomic_store_explicit(&c->hdr->recoveries, 0, memory_order_relaxed);
    atomic_store_explicit(&c->hdr->removes, 0, memory_order_relaxed);
    atomic_store_explicit(&c->hdr->ready, FL_UC_READY, memory_order_release);
    return FLAME_OK;
}

static flame_status create(flame_user_cache *c, const flame_user_cache_params *p, int *exists)
{
    int fd = shm_open(c->name, O_RDWR | O_CREAT | O_EXCL, p->mode);
    if (fd < 0) {
        *exists = errno == EEXIST;
        return fl_error(FLAME_ERR_IO, "cannot create shm '%s': %s", c->name, strerror(errno));
    }
    void (*before_lock)(void) = atomic_load(&before_lock_hook);
    if (before_lock) before_lock(); /* tests stop the creator here */
    /* Held until `ready`: initialising a large table takes seconds, and attachers wait as long
     * as the lock is held; the kernel drops it with a creator that dies, which attachers then
     * tell from a slow one. (An attacher testing the lock may hold it for an instant.) */
    struct stat sb;
    flame_status st = FLAME_OK;
    if (lock_file(fd, LOCK_EX) != 0 || fstat(fd, &sb) != 0) {
        st = fl_error(FLAME_ERR_IO, "cannot lock shm '%s': %s", c->name, strerror(errno));
    } else if (sb.st_size != 0) {
        /* Sized before we held the lock: we were so slow to take it (over 1 s) that a
         * CREATE_OR_ATTACH took the object for one whose creator had died, and made it its
         * table (take_over()). It is theirs: not to initialise again, nor to unlink. */
        close(fd);
        *exists = 1;
        return fl_error(FLAME_ERR_IO, "cannot create shm '%s': another process initialised the object first",
                        c->name);
    }
    if (st == FLAME_OK) st = initialise(c, fd, &sb, p);
    if (st != FLAME_OK) {
        /* before close, which drops the lock: from then on a CREATE_OR_ATTACH may take the
         * object over, and the name would be theirs */
        unlink_if_ours(c->name, fd);
        unmap(c);
        close(fd);
        return st;
    }
    c->fd = fd;
    lock_file(fd, LOCK_UN);
    return FLAME_OK;
}

static const char *libc_name(uint32_t libc)
{
    return libc == 1 ? "glibc" : libc == 2 ? "bionic" : libc == 3 ? "another C library (not glibc)" : "an unknown C library";
}

#define CHECK_FIELD(field, fmt, cast)                                                                         \
    if (h->field != want.field)                                                                               \
        return fl_error(FLAME_ERR_FORMAT, "shm '%s' has " #field " " fmt ", expected " fmt, c->name,             \
                        (cast)h->field, (cast)want.field);

/* Checks a ready header against this build (and the caller's params, if any); on success the
 * layout it describes becomes the handle's. */
static flame_status check_header(flame_user_cache *c, const flame_user_cache_params *p, size_t size)
{
    const fl_uc_header snap = snapshot(c->hdr), *h = &snap;
    if (memcmp(h->magic, FL_UC_MAGIC, 8) != 0)
        return fl_error(FLAME_ERR_FORMAT, "shm '%s' is not a libflame user cache (bad magic)", c->name);
    if (h->byte_order != FL_UC_BYTE_ORDER)
        return fl_error(FLAME_ERR_FORMAT, "shm '%s' was written with another byte order", c->name);
    if (h->layout_version != FL_UC_LAYOUT_VERSION)
        return fl_error(FLAME_ERR_FORMAT, "shm '%s' has layout version %u; this libflame reads version %u", c->name,
                        h->layout_version, FL_UC_LAYOUT_VERSION);
    flame_user_cache_params mine = {sizeof mine, h->capacity, h->num_slots, h->max_ids, h->max_dense, 0600, h->ttl_us};
    if (!h->capacity || !h->num_slots || !h->max_ids) /* a creator never writes 0: open gives them defaults */
        return fl_error(FLAME_ERR_FORMAT, "shm '%s' header is out of range: capacity %llu, num_slots %u, max_ids %u",
                        c->name, (unsigned long long)h->capacity, h->num_slots, h->max_ids);
    if (check_params(&mine) != FLAME_OK)
        return fl_error(FLAME_ERR_FORMAT, "shm '%s' header is out of range: %s", c->name, flame_last_error());
    fl_uc_header want = expected_header(p ? p : &mine);
    CHECK_FIELD(header_bytes, "%u", unsigned)
    if (h->mutex_abi != want.mutex_abi)
        return fl_error(FLAME_ERR_FORMAT, "shm '%s' was made by a process of %s with %u-byte mutexes; this one is %s "
                        "with %u-byte mutexes, whose process-shared mutexes cannot lock them", c->name,
                        libc_name(h->mutex_abi >> 16), h->mutex_abi & 0xffffu, libc_name(FL_UC_LIBC),
                        FL_UC_MUTEX_ABI & 0xffffu);
    CHECK_FIELD(ways, "%u", unsigned)
    CHECK_FIELD(capacity, "%llu", unsigned long long)
    CHECK_FIELD(num_slots, "%u", unsigned)
    CHECK_FIELD(max_ids, "%u", unsigned)
    CHECK_FIELD(max_dense, "%u", unsigned)
    CHECK_FIELD(ttl_us, "%lld", long long)
    CHECK_FIELD(num_buckets, "%llu", unsigned long long)
    CHECK_FIELD(record_words, "%u", unsigned)
    CHECK_FIELD(record_bytes, "%llu", unsigned long long)
    CHECK_FIELD(bucket_bytes, "%llu", unsigned long long)
    CHECK_FIELD(total_bytes, "%llu", unsigned long long)
    if (size != want.total_bytes)
        return fl_error(FLAME_ERR_FORMAT, "shm '%s' is %zu bytes, its header says %llu", c->name, size,
                        (unsigned long long)want.total_bytes);
    c->lay = layout_of(&want);
    return FLAME_OK;
}

/* Whether another open file description holds the creator's lock (create()). */
static bool creator_alive(int fd)
{
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
        flock(fd, LOCK_UN);
        return false;
    }
    return errno == EWOULDBLOCK || errno == EINTR;
}

/* Whether an object no creator holds, not ready, is a table of this layout whose creator died
 * before it was ready (take_over() may initialise it): empty (the creator died before it
 * reserved it), or beginning with the magic and this layout version (written first). */
static bool unfinished_table(const flame_user_cache *c, const struct stat *sb)
{
    if (sb->st_size == 0) return true;
    if (sb->st_size < FL_UC_HEADER_BYTES || !c->base) return false;
    const volatile fl_uc_header *h = c->hdr;
    for (int i = 0; i < 8; i++)
        if (h->magic[i] != FL_UC_MAGIC[i]) return false;
    return h->layout_version == FL_UC_LAYOUT_VERSION;
}

/* Why an object no creator holds never became ready. */
static flame_status unfinished(const flame_user_cache *c, const struct stat *sb)
{
    if (sb->st_size == 0)
        return fl_error(FLAME_ERR_IO, "shm '%s' is empty: its creator died before initialising it? "
                        "FLAME_USER_CACHE_CREATE_OR_ATTACH initialises it, or remove it with flame_user_cache_unlink",
                        c->name);
    if (c->base && memcmp(c->hdr->magic, FL_UC_MAGIC, 8) == 0) {
        /* an older layout may keep no `ready` where this one does */
        uint32_t version = ((const volatile fl_uc_header *)c->hdr)->layout_version;
        if (version != FL_UC_LAYOUT_VERSION)
            return fl_error(FLAME_ERR_FORMAT, "shm '%s' has layout version %u; this libflame reads version %u",
                            c->name, version, FL_UC_LAYOUT_VERSION);
        return fl_error(FLAME_ERR_IO, "shm '%s' was never fully initialised (its creator died?); "
                        "FLAME_USER_CACHE_CREATE_OR_ATTACH initialises it again, or remove it with "
                        "flame_user_cache_unlink", c->name);
    }
    return fl_error(FLAME_ERR_FORMAT, "shm '%s' is not a libflame user cache (%lld bytes, no ready header)", c->name,
                    (long long)sb->st_size);
}

/* Why an attach failed that open() may retry: the name was absent, or its object was unlinked
 * before it became ready with no creator left to finish it. */
typedef enum { ATTACH_FAILED, ATTACH_ABSENT, ATTACH_UNLINKED } attach_failure;

/* Makes an object whose creator died before it was ready (no process has held the creator's
 * lock for 1 s) a table of p, as its creator would have: with the creator's lock taken, so that
 * of the processes doing this at once one initialises it, and the others, waiting for the lock,
 * find it ready. What may have changed before we held the lock is looked at again under it:
 * the name may have been unlinked, another process may have taken the object over first. Only
 * what unfinished_table() says is taken: never a ready table, another layout version, or an
 * object that is no user cache. On FLAME_OK the object is ready (ours or the other taker's)
 * and mapped whole. */
static flame_status take_over(flame_user_cache *c, int fd, const flame_user_cache_params *p, attach_failure *why)
{
    void (*before_lock)(void) = atomic_load(&before_lock_hook);
    if (before_lock) before_lock(); /* tests gather the takers here */
    if (lock_file(fd, LOCK_EX) != 0)
        return fl_error(FLAME_ERR_IO, "cannot lock shm '%s': %s", c->name, strerror(errno));
    struct stat sb = {0};
    flame_status st = FLAME_OK;
    if (fstat(fd, &sb) != 0) {
        st = fl_error(FLAME_ERR_IO, "cannot stat shm '%s': %s", c->name, strerror(errno));
    } else if (sb.st_nlink == 0) { /* a new object may be made under the name: open() looks again */
        *why = ATTACH_UNLINKED;
        st = fl_error(FLAME_ERR_IO, "shm '%s' was removed before its creator finished it", c->name);
    } else if (sb.st_size >= FL_UC_HEADER_BYTES) {
        st = remap(c, fd, (size_t)sb.st_size);
    }
    bool ready = st == FLAME_OK && sb.st_size >= FL_UC_HEADER_BYTES &&
                 atomic_load_explicit(&c->hdr->ready, memory_order_acquire) == FL_UC_READY;
    if (st == FLAME_OK && !ready) /* (ready: another process took it over first) */
        st = unfinished_table(c, &sb) ? initialise(c, fd, &sb, p) : unfinished(c, &sb);
    lock_file(fd, LOCK_UN);
    return st;
}

/* On failure nothing stays mapped, and *why says whether the name may be looked up again. With
 * take_over, an unfinished table is initialised as a table of p (take_over()), else reported. */
static flame_status attach(flame_user_cache *c, const flame_user_cache_params *p, bool take_over_unfinished,
                           attach_failure *why)
{
    *why = ATTACH_FAILED;
    int fd = shm_open(c->name, O_RDWR, 0);
    if (fd < 0) {
        if (errno == ENOENT) *why = ATTACH_ABSENT;
        return fl_error(FLAME_ERR_IO, "cannot attach shm '%s': %s", c->name, strerror(errno));
    }
    /* wait for the creator as long as it lives and holds its lock, then 1 s more (a creator
     * takes the lock an instant after it makes the object) before reporting the object or
     * taking it over */
    struct stat sb = {0};
    flame_status st = FLAME_OK;
    for (int idle = 0;; idle = creator_alive(fd) ? 0 : idle + 1) {
        if (fstat(fd, &sb) != 0) {
            st = fl_error(FLAME_ERR_IO, "cannot stat shm '%s': %s", c->name, strerror(errno));
            break;
        }
        if ((size_t)sb.st_size >= FL_UC_HEADER_BYTES) {
            if (!c->base && (st = map(c, fd, (size_t)sb.st_size)) != FLAME_OK) break;
            if (atomic_load_explicit(&c->hdr->ready, memory_order_acquire) == FL_UC_READY) {
                /* the creator reserves in pieces: what was mapped may be the first few */
                if (fstat(fd, &sb) != 0)
                    st = fl_error(FLAME_ERR_IO, "cannot stat shm '%s': %s", c->name, strerror(errno));
                else
                    st = remap(c, fd, (size_t)sb.st_size);
                break;
            }
        }
        if (idle && sb.st_nlink == 0) { /* a creator that failed unlinks its object */
            *why = ATTACH_UNLINKED;
            st = fl_error(FLAME_ERR_IO, "shm '%s' was removed before its creator finished it", c->name);
            break;
        }
        if (idle == 100) {
            st = take_over_unfinished ? take_over(c, fd, p, why) : unfinished(c, &sb);
            break;
        }
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    if (st == FLAME_OK) st = check_header(c, p, c->bytes);
    if (st == FLAME_OK) {
        c->fd = fd;
        return FLAME_OK;
    }
    close(fd);
    unmap(c);
    return st;
}

FLAME_API flame_status flame_user_cache_open(const char *name, flame_user_cache_open_mode open_mode,
                                             const flame_user_cache_params *params, flame_user_cache **out)
{
    fl_clear_error();
    if (!out) return fl_error(FLAME_ERR_INVALID_ARG, "out is NULL");
    *out = NULL;
    flame_status st = check_name(name);
    if (st != FLAME_OK) return st;
    if (open_mode != FLAME_USER_CACHE_CREATE && open_mode != FLAME_USER_CACHE_ATTACH &&
        open_mode != FLAME_USER_CACHE_CREATE_OR_ATTACH)
        return fl_error(FLAME_ERR_INVALID_ARG, "open_mode %d is not a flame_user_cache_open_mode", (int)open_mode);
    flame_user_cache_params p = {sizeof p, 500000, 1, 32, 0, 0600, 0};
    if (params) { /* a zero field takes the default: a zeroed struct is a valid request */
        const flame_user_cache_params d = p;
        p = (flame_user_cache_params){0};
        if ((st = fl_struct_in("flame_user_cache_params", &p, sizeof p, params)) != FLAME_OK) return st;
        if (!p.capacity) p.capacity = d.capacity;
        if (!p.num_slots) p.num_slots = d.num_slots;
        if (!p.max_ids) p.max_ids = d.max_ids;
        if (!p.mode) p.mode = d.mode;
        if ((st = check_params(&p)) != FLAME_OK) return st;
    }

    flame_user_cache *c = calloc(1, sizeof *c);
    if (!c) return fl_error(FLAME_ERR_NOMEM, "cannot allocate a user cache handle");
    atomic_init(&c->refs, 1);
    c->fd = -1;
    snprintf(c->name, sizeof c->name, "%s", name);
    /* The name can be unlinked between a create finding it and the attach that follows, or
     * before the object it named was finished: then it is looked up again (CREATE_OR_ATTACH
     * creates it). Bounded, so that a process unlinking the name in a loop cannot hold us. */
    for (int round = 0;; round++) {
        int exists = 0;
        attach_failure why = ATTACH_FAILED;
        if (open_mode == FLAME_USER_CACHE_ATTACH) {
            st = attach(c, params ? &p : NULL, false, &why);
            if (why == ATTACH_ABSENT) break; /* (ATTACH does not create) */
        } else {
            st = create(c, &p, &exists);
            if (st != FLAME_OK && exists && open_mode == FLAME_USER_CACHE_CREATE_OR_ATTACH) {
                fl_clear_error();
                st = attach(c, &p, true, &why);
            }
        }
        if (st == FLAME_OK || why == ATTACH_FAILED || round == 100) break;
        fl_clear_error();
    }
    if (st != FLAME_OK) {
        flame_user_cache_destroy(c);
        return st;
    }
    *out = c;
    return FLAME_OK;
}

FLAME_API flame_status flame_user_cache_get_params(const flame_user_cache *cache, flame_user_cache_params *params)
{
    fl_clear_error();
    if (!cache || !params) return fl_error(FLAME_ERR_INVALID_ARG, "%s is NULL", cache ? "params" : "cache");
    flame_status st = fl_struct_size_check("flame_user_cache_params", params->struct_size, sizeof *params);
    if (st) return st;
    const fl_uc_layout *h = &cache->lay;
    flame_user_cache_params v = {.struct_size = sizeof v, .mode = 0 /* not kept in the table */};
    v.capacity = h->capacity;
    v.num_slots = h->num_slots;
    v.max_ids = h->max_ids;
    v.max_dense = h->max_dense;
    v.ttl_us = h->ttl_us;
    return fl_struct_out("flame_user_cache_params", params, &v, sizeof v);
}

void fl_uc_retain(flame_user_cache *c)
{
    atomic_fetch_add(&c->refs, 1);
}

void fl_uc_release(flame_user_cache *c)
{
    if (!c || atomic_fetch_sub(&c->refs, 1) != 1) return;
    if (c->base) munmap(c->base, c->bytes);
    if (c->fd >= 0) close(c->fd);
    free(c);
}

FLAME_API void flame_user_cache_destroy(flame_user_cache *cache)
{
    fl_uc_release(cache);
}

FLAME_API flame_status flame_user_cache_unlink(const char *name)
{
    fl_clear_error();
    flame_status st = check_name(name);
    if (st != FLAME_OK) return st;
    if (shm_unlink(name) != 0) return fl_error(FLAME_ERR_IO, "cannot unlink shm '%s': %s", name, strerror(errno));
    return FLAME_OK;
}
