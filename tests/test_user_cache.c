/* The shared-memory user cache: round trips, a creation that signals interrupt, a failed
 * creation removing its own object and only its own, attach from another process (also during
 * a long creation), header checks, CREATE_OR_ATTACH taking over a table whose creator died
 * (and nothing else), a writer killed inside a write, readers racing a writer (threads and
 * processes) never seeing a torn record, eviction when full, TTL, the layout an attacher reads
 * back, and throughput on the default-size table. */
#define _GNU_SOURCE /* fallocate */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "testutil.h"
#include "ucache/user_cache.h"

static char name[64];

/* The library's posix_fallocate is this one (the program's definition comes first): while
 * fallocate_eintrs is above 0 it fails with EINTR, as tmpfs does when a signal arrives during
 * the allocation, and so does every call for more than fallocate_longest bytes (when set: a
 * periodic signal that always arrives before so long an allocation ends); else it reserves
 * the bytes as tmpfs does. */
static atomic_int fallocate_eintrs, fallocate_calls;
static atomic_llong fallocate_longest;
/* When set, the next call runs this instead (once) and returns what it returns. */
static _Atomic(int (*)(void)) fallocate_instead;
static atomic_int fallocate_delay_ms; /* each call first sleeps so long */

int posix_fallocate(int fd, off_t offset, off_t len)
{
    atomic_fetch_add(&fallocate_calls, 1);
    int (*instead)(void) = atomic_exchange(&fallocate_instead, (int (*)(void))NULL);
    if (instead) return instead();
    int delay = atomic_load(&fallocate_delay_ms);
    if (delay) nanosleep(&(struct timespec){delay / 1000, delay % 1000 * 1000 * 1000}, NULL);
    int n = atomic_load(&fallocate_eintrs);
    if (n > 0) {
        atomic_store(&fallocate_eintrs, n - 1);
        return EINTR;
    }
    long long longest = atomic_load(&fallocate_longest);
    if (longest > 0 && len > longest) return EINTR;
    return fallocate(fd, 0, offset, len) ? errno : 0;
}

static int setup(void **state)
{
    static int n;
    snprintf(name, sizeof name, "/flame-test-%d-%d", (int)getpid(), n++);
    return 0;
}

static int teardown(void **state)
{
    fl_uc_set_clock(NULL);
    fl_uc_set_write_hook(NULL);
    fl_uc_set_create_hook(NULL);
    fl_uc_set_before_lock_hook(NULL);
    atomic_store(&fallocate_eintrs, 0);
    atomic_store(&fallocate_delay_ms, 0);
    atomic_store(&fallocate_instead, (int (*)(void))NULL);
    flame_user_cache_unlink(name); /* may already be gone */
    return 0;
}

static flame_user_cache_params params(uint64_t capacity, uint32_t slots, uint32_t max_ids, uint32_t max_dense)
{
    return (flame_user_cache_params){.struct_size = sizeof(flame_user_cache_params), .capacity = capacity,
                                     .num_slots = slots, .max_ids = max_ids, .max_dense = max_dense, .mode = 0600};
}

static flame_user_cache *open_cache(flame_user_cache_open_mode mode, const flame_user_cache_params *p)
{
    flame_user_cache *c = NULL;
    flame_status st = flame_user_cache_open(name, mode, p, &c);
    if (st != FLAME_OK) fail_msg("open %s: %s", name, flame_last_error());
    return c;
}

static flame_user_cache_stats stats_of(flame_user_cache *c)
{
    flame_user_cache_stats s = {.struct_size = sizeof s};
    assert_int_equal(flame_user_cache_get_stats(c, &s), FLAME_OK);
    return s;
}

/* A self-checking record of (user, version) under a bound of max_ids / max_dense (1 slot or
 * more): its counts and every value follow from user and version, so any mix of two writes
 * is detected. */
typedef struct rec {
    int64_t ids[64];
    uint32_t lens[4];
    float dense[8];
    flame_user_features f;
} rec;

static void make_rec(rec *r, int64_t user, uint64_t v, uint32_t slots, uint32_t max_ids, uint32_t max_dense)
{
    memset(r, 0, sizeof *r);
    size_t n = (size_t)(v % (max_ids + 1));
    /* unsigned arithmetic: users span all of int64 */
    for (size_t i = 0; i < n; i++) r->ids[i] = (int64_t)((uint64_t)user * 1000003u + v * 131 + i);
    for (uint32_t s = 0; s < slots; s++) r->lens[s] = (uint32_t)(n / slots + (s < n % slots));
    size_t d = max_dense ? (size_t)(v % (max_dense + 1)) : 0;
    for (size_t i = 0; i < d; i++) r->dense[i] = (float)(v % 1000) + 0.25f * (float)i;
    r->f = (flame_user_features){.struct_size = sizeof r->f, .ids = r->ids, .num_ids = n, .slot_lens = r->lens,
                                 .dense = r->dense, .num_dense = d};
}

static flame_user_features out_features(rec *r)
{
    memset(r, 0x7f, sizeof *r);
    return (flame_user_features){.struct_size = sizeof(flame_user_features), .ids = r->ids, .slot_lens = r->lens,
                                 .dense = r->dense, .ids_capacity = 64, .dense_capacity = 8};
}

/* 1 if `got` is exactly make_rec(user, v) for the version v its first id implies. */
static int consistent(const flame_user_features *got, int64_t user, uint32_t slots, uint32_t max_ids,
                      uint32_t max_dense)
{
    if (got->num_ids == 0 && got->num_dense == 0) return 1;
    /* recover v modulo the bounds from the payload, then rebuild and compare */
    uint64_t v = got->num_ids ? ((uint64_t)got->ids[0] - (uint64_t)user * 1000003u) / 131 : 0;
    if (!got->num_ids) return 1; /* dense-only records are checked by the id-carrying ones */
    rec want;
    make_rec(&want, user, v, slots, max_ids, max_dense);
    if (want.f.num_ids != got->num_ids || want.f.num_dense != got->num_dense) return 0;
    if (memcmp(want.ids, got->ids, got->num_ids * 8) != 0) return 0;
    if (memcmp(want.lens, got->slot_lens, slots * 4) != 0) return 0;
    return memcmp(want.dense, got->dense, got->num_dense * 4) == 0;
}

static void test_put_get_remove(void **state)
{
    flame_user_cache_params p = params(1000, 3, 16, 5);
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    int64_t users[] = {42, -7, INT64_MIN, INT64_MAX, 0};
    for (size_t u = 0; u < 5; u++) {
        rec in, out;
        make_rec(&in, users[u], 13 + u, 3, 16, 5);
        assert_int_equal(flame_user_cache_put(c, users[u], &in.f), FLAME_OK);
        flame_user_features f = out_features(&out);
        int32_t found = -1;
        assert_int_equal(flame_user_cache_get(c, users[u], &f, &found), FLAME_OK);
        assert_int_equal(found, 1);
        assert_int_equal(f.num_ids, in.f.num_ids);
        assert_int_equal(f.num_dense, in.f.num_dense);
        assert_memory_equal(out.ids, in.ids, in.f.num_ids * 8);
        assert_memory_equal(out.lens, in.lens, 3 * 4);
        assert_memory_equal(out.dense, in.dense, in.f.num_dense * 4);
        assert_true(f.age_us >= 0 && f.age_us < 10 * 1000 * 1000);
    }
    rec again, out;
    make_rec(&again, 42, 7, 3, 16, 5); /* replace */
    assert_int_equal(flame_user_cache_put(c, 42, &again.f), FLAME_OK);
    flame_user_features f = out_features(&out);
    int32_t found = -1, removed = -1;
    assert_int_equal(flame_user_cache_get(c, 42, &f, &found), FLAME_OK);
    assert_int_equal(found, 1);
    assert_memory_equal(out.ids, again.ids, again.f.num_ids * 8);
    assert_int_equal(flame_user_cache_get(c, 43, &f, &found), FLAME_OK);
    assert_int_equal(found, 0);
    assert_int_equal(flame_user_cache_remove(c, 42, &removed), FLAME_OK);
    assert_int_equal(removed, 1);
    assert_int_equal(flame_user_cache_remove(c, 42, &removed), FLAME_OK);
    assert_int_equal(removed, 0);
    assert_int_equal(flame_user_cache_get(c, 42, &f, &found), FLAME_OK);
    assert_int_equal(found, 0);
    flame_user_cache_stats s = stats_of(c);
    assert_int_equal(s.records, 4);
    assert_int_equal(s.puts, 6);
    assert_int_equal(s.hits, 6);
    assert_int_equal(s.misses, 2);
    assert_int_equal(s.capacity, 1000);
    assert_int_equal(s.evictions, 0);
    flame_user_cache_destroy(c);
    flame_user_cache_destroy(NULL);
}

/* The table works: user's record (make_rec's version v, in p's bounds) put, then got back whole. */
static void assert_put_then_get(flame_user_cache *c, int64_t user, uint64_t v, const flame_user_cache_params *p)
{
    rec in, out;
    make_rec(&in, user, v, p->num_slots, p->max_ids, p->max_dense);
    assert_int_equal(flame_user_cache_put(c, user, &in.f), FLAME_OK);
    flame_user_features f = out_features(&out);
    int32_t found = -1;
    assert_int_equal(flame_user_cache_get(c, user, &f, &found), FLAME_OK);
    assert_int_equal(found, 1);
    assert_memory_equal(out.ids, in.ids, in.f.num_ids * 8);
}

/* A creation whose reservation of the object's bytes a signal interrupts reserves them again. */
static void test_create_interrupted_by_signals(void **state)
{
    flame_user_cache_params p = params(1000, 3, 16, 5);
    atomic_store(&fallocate_eintrs, 3);
    atomic_store(&fallocate_calls, 0);
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    assert_int_equal(atomic_load(&fallocate_calls), 4);
    assert_put_then_get(c, 42, 13, &p);
    flame_user_cache_destroy(c);
}

/* An object too large to reserve between two signals is still created: it is reserved in
 * pieces that each finish (an interrupted allocation keeps nothing, so one call for the whole
 * object would be made again for ever). */
static void test_create_reserved_in_pieces(void **state)
{
    flame_user_cache_params p = params(200000, 3, 64, 8);
    atomic_store(&fallocate_longest, (long long)16 << 20);
    atomic_store(&fallocate_calls, 0);
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    atomic_store(&fallocate_longest, 0);
    struct stat sb;
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    assert_int_equal(stat(path, &sb), 0);
    assert_true(sb.st_size > (off_t)32 << 20);
    /* pieces of at most 16 MiB, each reserved at the first try */
    const off_t piece = (off_t)16 << 20;
    assert_int_equal(atomic_load(&fallocate_calls), (int)((sb.st_size + piece - 1) / piece));
    assert_put_then_get(c, 7, 13, &p);
    flame_user_cache_destroy(c);
}

/* ---- a creation that fails: it removes its own object, and only its own */
static int no_space(void)
{
    return ENOSPC;
}

static ino_t made_again; /* the inode of the object another process made under the name */

/* What the name names now (its object's inode and size), as /dev/shm shows it. */
static struct stat stat_of_name(void)
{
    struct stat sb;
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    assert_int_equal(stat(path, &sb), 0);
    return sb;
}

/* Inside a creation, before its reservation fails: an operator unlinks the name and another
 * process creates a table under it. */
static int name_made_again_then_no_space(void)
{
    if (flame_user_cache_unlink(name) != FLAME_OK) return EIO;
    pid_t pid = fork();
    if (pid == 0) {
        flame_user_cache_params p = params(200, 2, 4, 0);
        flame_user_cache *c = NULL;
        _exit(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE, &p, &c) == FLAME_OK ? 0 : 10);
    }
    int status = -1;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return EIO;
    made_again = stat_of_name().st_ino;
    return ENOSPC;
}

/* A creation that fails leaves the name alone once it no longer names its object: the table
 * another process made under the name meanwhile stays (it was unlinked by name). */
static void test_failed_creation_leaves_a_name_made_again(void **state)
{
    flame_user_cache_params p = params(100, 1, 8, 0), theirs = params(200, 2, 4, 0);
    atomic_store(&fallocate_instead, name_made_again_then_no_space);
    flame_user_cache *c = NULL;
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE, &p, &c), FLAME_ERR_NOMEM,
                      "cannot reserve");
    assert_null(c);
    c = open_cache(FLAME_USER_CACHE_ATTACH, &theirs);
    assert_int_equal(stat_of_name().st_ino, made_again);
    assert_put_then_get(c, 3, 4, &theirs);
    flame_user_cache_destroy(c);
}

/* A creation that fails removes its own object, also one whose mode denies its owner reading
 * (the check that the name is still its own opens it). Made by a child that, run as root, drops
 * to an unprivileged user first: root reads whatever the mode says. */
static void test_failed_creation_removes_its_object(void **state)
{
    flame_user_cache_params p = params(100, 1, 8, 0);
    for (int k = 0; k < 2; k++) {
        p.mode = k ? 0200 : 0600;
        pid_t pid = fork();
        if (pid == 0) {
            if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(20);
            atomic_store(&fallocate_instead, no_space);
            flame_user_cache *c = NULL;
            flame_status st = flame_user_cache_open(name, FLAME_USER_CACHE_CREATE, &p, &c);
            _exit(st != FLAME_ERR_NOMEM ? 21 : !strstr(flame_last_error(), "No space left on device") ? 22 : 0);
        }
        int status = -1;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0); /* 20: no unprivileged user; 21, 22: another error */
        flame_user_cache *c = NULL;
        assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &c), FLAME_ERR_IO,
                          "No such file");
    }
}

/* Another process attaches by name, reads what this one wrote and writes for it to read. */
static void test_attach_from_another_process(void **state)
{
    flame_user_cache_params p = params(5000, 2, 8, 2);
    p.mode = 0640;
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    struct stat sb;
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0640);
    rec a;
    make_rec(&a, 1, 5, 2, 8, 2);
    assert_int_equal(flame_user_cache_put(c, 1, &a.f), FLAME_OK);
    pid_t pid = fork();
    if (pid == 0) {
        flame_user_cache *cc = NULL;
        if (flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &cc) != FLAME_OK) _exit(10);
        rec out, b;
        flame_user_features f = out_features(&out);
        int32_t found = 0;
        if (flame_user_cache_get(cc, 1, &f, &found) != FLAME_OK || !found) _exit(11);
        if (!consistent(&f, 1, 2, 8, 2) || f.num_ids != 5) _exit(12);
        make_rec(&b, 2, 6, 2, 8, 2);
        if (flame_user_cache_put(cc, 2, &b.f) != FLAME_OK) _exit(13);
        flame_user_cache_destroy(cc);
        _exit(0);
    }
    int status = -1;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    rec out;
    flame_user_features f = out_features(&out);
    int32_t found = 0;
    assert_int_equal(flame_user_cache_get(c, 2, &f, &found), FLAME_OK);
    assert_int_equal(found, 1);
    assert_true(consistent(&f, 2, 2, 8, 2));
    assert_int_equal(f.num_ids, 6);
    assert_int_equal(stats_of(c).puts, 2);
    flame_user_cache_destroy(c);
    /* the table outlives every handle until unlinked */
    c = open_cache(FLAME_USER_CACHE_CREATE_OR_ATTACH, &p);
    assert_int_equal(stats_of(c).records, 2);
    flame_user_cache_destroy(c);
    assert_int_equal(flame_user_cache_unlink(name), FLAME_OK);
    assert_status_msg(flame_user_cache_unlink(name), FLAME_ERR_IO, "No such file");
}

static void poke_u32(size_t offset, uint32_t value)
{
    int fd = shm_open(name, O_RDWR, 0);
    assert_true(fd >= 0);
    uint32_t *h = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(h != MAP_FAILED);
    h[offset / 4] = value;
    munmap(h, 4096);
    close(fd);
}

static void test_attach_checks_the_header(void **state)
{
    flame_user_cache_params p = params(100, 1, 8, 0);
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p), *d = NULL;
    flame_user_cache_params other = params(100, 1, 16, 0);
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, &other, &d), FLAME_ERR_FORMAT,
                      "has max_ids 8, expected 16");
    assert_null(d);
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE_OR_ATTACH, &other, &d), FLAME_ERR_FORMAT,
                      "max_ids 8");
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE, &p, &d), FLAME_ERR_IO, "File exists");
    /* a table written by another layout version */
    poke_u32(offsetof(fl_uc_header, layout_version), 99);
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &d), FLAME_ERR_FORMAT,
                      "layout version 99; this libflame reads version 2");
    poke_u32(offsetof(fl_uc_header, layout_version), FL_UC_LAYOUT_VERSION);
    /* made by a process of another C library: mutexes of the same size, laid out otherwise */
    const uint32_t mutex = (uint32_t)sizeof(pthread_mutex_t);
    poke_u32(offsetof(fl_uc_header, mutex_abi), (FL_UC_LIBC == 3u ? 1u : 3u) << 16 | mutex);
    char want[200];
    snprintf(want, sizeof want, "was made by a process of %s with %u-byte mutexes; this one is %s with %u-byte",
             FL_UC_LIBC == 3u ? "glibc" : "another C library (not glibc)", mutex,
             FL_UC_LIBC == 1u ? "glibc" : FL_UC_LIBC == 2u ? "bionic" : "another C library (not glibc)", mutex);
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &d), FLAME_ERR_FORMAT, want);
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE_OR_ATTACH, &p, &d), FLAME_ERR_FORMAT, want);
    poke_u32(offsetof(fl_uc_header, mutex_abi), FL_UC_LIBC << 16 | (mutex + 8)); /* the same library, other sizes */
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &d), FLAME_ERR_FORMAT,
                      "-byte mutexes, whose process-shared mutexes cannot lock them");
    poke_u32(offsetof(fl_uc_header, mutex_abi), FL_UC_MUTEX_ABI);
    assert_int_equal(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &d), FLAME_OK);
    flame_user_cache_destroy(d);
    d = NULL;
    poke_u32(offsetof(fl_uc_header, num_slots), 0); /* no creator writes 0 (it means the default) */
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &d), FLAME_ERR_FORMAT,
                      "header is out of range: capacity 100, num_slots 0, max_ids 8");
    poke_u32(offsetof(fl_uc_header, num_slots), 1);
    poke_u32(offsetof(fl_uc_header, record_words), 3);
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &d), FLAME_ERR_FORMAT,
                      "record_words 3");
    flame_user_cache_destroy(c);
    assert_int_equal(flame_user_cache_unlink(name), FLAME_OK);
    /* not a user cache at all: never became ready (waits 1 s) */
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    char junk[8192];
    memset(junk, 0x5a, sizeof junk);
    assert_int_equal(write(fd, junk, sizeof junk), (ssize_t)sizeof junk);
    close(fd);
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &d), FLAME_ERR_FORMAT,
                      "is not a libflame user cache");
    assert_int_equal(flame_user_cache_unlink(name), FLAME_OK);
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &d), FLAME_ERR_IO,
                      "No such file");
}

/* ---- creators: slow, killed inside the creation, or gone before they reserved the object */
static void slow_creation(void)
{
    nanosleep(&(struct timespec){1, 500 * 1000 * 1000}, NULL);
}

static void stop_self(void)
{
    raise(SIGSTOP);
}

/* Forks a process opening `p` with `mode` that runs `hook` inside the creation (or the
 * takeover of an unfinished table), and returns once the name exists. */
static pid_t fork_opener(flame_user_cache_open_mode mode, const flame_user_cache_params *p, void (*hook)(void))
{
    pid_t pid = fork();
    if (pid == 0) {
        fl_uc_set_create_hook(hook);
        flame_user_cache *c = NULL;
        _exit(flame_user_cache_open(name, mode, p, &c) == FLAME_OK ? 0 : 10);
    }
    int fd;
    while ((fd = shm_open(name, O_RDONLY, 0)) < 0) nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    close(fd);
    return pid;
}

static pid_t fork_creator(const flame_user_cache_params *p, void (*hook)(void))
{
    return fork_opener(FLAME_USER_CACHE_CREATE, p, hook);
}

/* A process opening with `mode` killed inside the creation (or takeover: stopped there by the
 * create hook, then SIGKILLed), reaped: its object is left unfinished. */
static void kill_inside_creation(flame_user_cache_open_mode mode, const flame_user_cache_params *p)
{
    pid_t pid = fork_opener(mode, p, stop_self);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, WUNTRACED), pid);
    assert_true(WIFSTOPPED(status));
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
}

static void kill_creator_inside_creation(const flame_user_cache_params *p)
{
    kill_inside_creation(FLAME_USER_CACHE_CREATE, p);
}

static double seconds_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* A large table takes seconds to create; attachers wait for a creator that is alive however
 * long it takes (they gave up after 1 s, calling the table "not a libflame user cache"). */
static void test_attach_waits_for_a_live_creator(void **state)
{
    flame_user_cache_params p = params(100, 1, 8, 0);
    for (int k = 0; k < 2; k++) {
        flame_user_cache_open_mode mode = k ? FLAME_USER_CACHE_CREATE_OR_ATTACH : FLAME_USER_CACHE_ATTACH;
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        pid_t pid = fork_creator(&p, slow_creation);
        flame_user_cache *c = open_cache(mode, &p);
        assert_true(seconds_since(&t0) > 1.2);
        assert_int_equal(stats_of(c).capacity, 104);
        int status = -1;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        flame_user_cache_destroy(c);
        assert_int_equal(flame_user_cache_unlink(name), FLAME_OK);
    }
}

/* An attacher that comes while a large table's creator is still reserving it maps the whole
 * table once it is ready, not the part reserved when it first looked (it then failed with
 * FLAME_ERR_FORMAT, "is 16777216 bytes, its header says ..."). */
static void test_attach_while_the_creator_reserves(void **state)
{
    flame_user_cache_params p = params(200000, 3, 64, 8);
    pid_t pid = fork();
    if (pid == 0) {
        atomic_store(&fallocate_delay_ms, 300); /* for each piece of 16 MiB */
        flame_user_cache *c = NULL;
        _exit(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE, &p, &c) == FLAME_OK ? 0 : 10);
    }
    /* until the first piece is reserved */
    int fd;
    struct stat sb = {0};
    while ((fd = shm_open(name, O_RDONLY, 0)) < 0) nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    while (fstat(fd, &sb) == 0 && sb.st_size == 0) nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    close(fd);
    assert_true(sb.st_size == (off_t)16 << 20);
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_ATTACH, &p);
    int status = -1;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_true(c->bytes > (size_t)32 << 20);
    assert_put_then_get(c, 199999, 20, &p);
    flame_user_cache_destroy(c);
}

/* A creator killed inside the creation leaves a table ATTACH reports as unfinished
 * (FLAME_ERR_IO) after 1 s, not as someone else's object (FLAME_ERR_FORMAT), and CREATE as
 * existing; once it is unlinked the name can be created again. */
static void test_creator_killed_inside_the_creation(void **state)
{
    flame_user_cache_params p = params(100, 1, 8, 0);
    kill_creator_inside_creation(&p);
    flame_user_cache *c = NULL;
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &c), FLAME_ERR_IO,
                      "was never fully initialised (its creator died?); FLAME_USER_CACHE_CREATE_OR_ATTACH "
                      "initialises it again, or remove it with flame_user_cache_unlink");
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE, &p, &c), FLAME_ERR_IO, "File exists");
    assert_null(c);
    assert_int_equal(flame_user_cache_unlink(name), FLAME_OK);
    c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    flame_user_cache_destroy(c);
    assert_int_equal(flame_user_cache_unlink(name), FLAME_OK);
    /* a creator that died before it reserved the object leaves it empty */
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &c), FLAME_ERR_IO,
                      "is empty: its creator died before initialising it? FLAME_USER_CACHE_CREATE_OR_ATTACH "
                      "initialises it, or remove it with flame_user_cache_unlink");
    assert_null(c);
}

/* A table of another layout version is reported as one even when that layout keeps no ready
 * word where this one does (it was reported as a table whose creator died). */
static void test_other_layout_without_ready(void **state)
{
    flame_user_cache_params p = params(100, 1, 8, 0);
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p), *d = NULL;
    flame_user_cache_destroy(c);
    poke_u32(offsetof(fl_uc_header, ready), 0);
    poke_u32(offsetof(fl_uc_header, layout_version), 0);
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &d), FLAME_ERR_FORMAT,
                      "has layout version 0; this libflame reads version 2");
    assert_null(d);
}

/* ---- CREATE_OR_ATTACH takes over a table whose creator died before it was ready */
/* Fills the object from `from` to its end with `byte`: bytes that are not zero, as a creator
 * killed half way through initialising the buckets of its layout leaves. */
static void fill_object(off_t from, int byte)
{
    int fd = shm_open(name, O_RDWR, 0);
    assert_true(fd >= 0);
    struct stat sb;
    assert_int_equal(fstat(fd, &sb), 0);
    unsigned char *m = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(m != MAP_FAILED);
    memset(m + from, byte, (size_t)(sb.st_size - from));
    munmap(m, (size_t)sb.st_size);
    close(fd);
}

/* The table `c` is a fresh one of p: p's layout, sized to it, no records, no counts, and it
 * works (also from a second handle). */
static void assert_fresh_table(flame_user_cache *c, const flame_user_cache_params *p)
{
    flame_user_cache_params got = {.struct_size = sizeof got};
    assert_int_equal(flame_user_cache_get_params(c, &got), FLAME_OK);
    assert_int_equal(got.capacity, p->capacity);
    assert_int_equal(got.num_slots, p->num_slots);
    assert_int_equal(got.max_ids, p->max_ids);
    assert_int_equal(got.max_dense, p->max_dense);
    flame_user_cache_stats s = stats_of(c);
    assert_int_equal(stat_of_name().st_size, (off_t)s.table_bytes);
    assert_int_equal(s.records, 0);
    assert_int_equal(s.puts + s.evictions + s.recoveries, 0);
    for (int64_t u = 0; u < 50; u++) { /* nothing the dead creator left reads as a record */
        rec out;
        flame_user_features f = out_features(&out);
        int32_t found = -1;
        assert_int_equal(flame_user_cache_get(c, u, &f, &found), FLAME_OK);
        assert_int_equal(found, 0);
    }
    assert_int_equal(stats_of(c).corrupt, 0);
    assert_put_then_get(c, 11, 5, p);
    flame_user_cache *a = open_cache(FLAME_USER_CACHE_ATTACH, p);
    assert_int_equal(stats_of(a).records, 1);
    flame_user_cache_destroy(a);
}

/* A service that crashed while creating its table starts again: CREATE_OR_ATTACH initialises
 * the unfinished table in place with its own params, once no creator has held the object's
 * lock for 1 s (it failed "never fully initialised" until the object was unlinked by hand).
 * The dead creator's table may be larger or smaller, and hold bytes of its own layout; an
 * empty object (a creator dead before it reserved it) and a table whose previous taker died
 * inside the takeover are taken over too. */
static void test_create_or_attach_takes_over_an_unfinished_table(void **state)
{
    flame_user_cache_params dead[2] = {params(100, 1, 8, 0), params(5000, 2, 16, 4)};
    flame_user_cache_params mine[2] = {params(5000, 2, 8, 2), params(200, 1, 4, 0)};
    for (int k = 0; k < 2; k++) {
        kill_creator_inside_creation(&dead[k]);
        fill_object(FL_UC_HEADER_BYTES, 0xa5);
        poke_u32(offsetof(fl_uc_header, puts), 77); /* the header page keeps what it held */
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE_OR_ATTACH, &mine[k]);
        assert_true(seconds_since(&t0) > 0.9); /* a creator may take its lock late: it is given 1 s */
        assert_fresh_table(c, &mine[k]);
        flame_user_cache_destroy(c);
        assert_int_equal(flame_user_cache_unlink(name), FLAME_OK);
    }
    /* empty; the taker's mode is applied as a creator's is */
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    close(fd);
    flame_user_cache_params shared = mine[0];
    shared.mode = 0640;
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE_OR_ATTACH, &shared);
    assert_fresh_table(c, &shared);
    struct stat sb;
    assert_int_equal(fstat(c->fd, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0640);
    flame_user_cache_destroy(c);
    assert_int_equal(flame_user_cache_unlink(name), FLAME_OK);
    /* a taker killed inside its takeover leaves the table unfinished, for the next one to take */
    kill_creator_inside_creation(&dead[0]);
    kill_inside_creation(FLAME_USER_CACHE_CREATE_OR_ATTACH, &dead[1]);
    c = NULL;
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &c), FLAME_ERR_IO,
                      "was never fully initialised");
    c = open_cache(FLAME_USER_CACHE_CREATE_OR_ATTACH, &mine[1]);
    assert_fresh_table(c, &mine[1]);
    flame_user_cache_destroy(c);
}

/* What CREATE_OR_ATTACH never takes over, and leaves as it was: an object that is no user
 * cache (whatever its size), a table of another layout version without a ready word, a ready
 * table of other params. */
static void test_create_or_attach_takes_over_nothing_else(void **state)
{
    flame_user_cache_params p = params(100, 1, 8, 0);
    flame_user_cache *c = NULL;
    size_t sizes[2] = {100, 8192};
    for (int k = 0; k < 2; k++) {
        int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        assert_true(fd >= 0);
        char junk[8192], back[8192];
        memset(junk, 0x5a, sizes[k]);
        assert_int_equal(write(fd, junk, sizes[k]), (ssize_t)sizes[k]);
        assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE_OR_ATTACH, &p, &c), FLAME_ERR_FORMAT,
                          "is not a libflame user cache");
        assert_null(c);
        assert_int_equal(stat_of_name().st_size, (off_t)sizes[k]);
        assert_int_equal(pread(fd, back, sizes[k], 0), (ssize_t)sizes[k]);
        assert_memory_equal(back, junk, sizes[k]);
        close(fd);
        assert_int_equal(flame_user_cache_unlink(name), FLAME_OK);
    }
    /* another layout version, not ready: unfinished or not, it is not ours to rewrite */
    c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    assert_put_then_get(c, 3, 6, &p);
    const off_t size = stat_of_name().st_size;
    flame_user_cache_destroy(c);
    poke_u32(offsetof(fl_uc_header, ready), 0);
    poke_u32(offsetof(fl_uc_header, layout_version), 0);
    flame_user_cache_params other = params(200, 2, 4, 0);
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE_OR_ATTACH, &other, &c), FLAME_ERR_FORMAT,
                      "has layout version 0; this libflame reads version 2");
    assert_null(c);
    assert_int_equal(stat_of_name().st_size, size);
    /* put back as it was, it holds its record: nothing was written */
    poke_u32(offsetof(fl_uc_header, layout_version), FL_UC_LAYOUT_VERSION);
    poke_u32(offsetof(fl_uc_header, ready), FL_UC_READY);
    c = open_cache(FLAME_USER_CACHE_ATTACH, &p);
    assert_int_equal(stats_of(c).records, 1);
    assert_int_equal(stats_of(c).puts, 1);
    flame_user_cache_destroy(c);
    /* ready, of other params */
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE_OR_ATTACH, &other, &c), FLAME_ERR_FORMAT,
                      "has capacity 100, expected 200");
    c = open_cache(FLAME_USER_CACHE_ATTACH, &p);
    assert_int_equal(stats_of(c).records, 1);
    flame_user_cache_destroy(c);
}

/* Processes that take over one unfinished table at once: one initialises it, all end attached
 * to it. The children meet before taking the creator's lock (else the first to take it makes
 * the others wait for a live creator, and none of them finds the lock taken); each counts the
 * initialisations it makes (the create hook, slowed so that the others wait on the lock
 * meanwhile), puts one record and says which object it has. */
enum { TAKERS = 8 };
typedef struct takers {
    atomic_int initialisations, ready_to_go, at_the_lock;
    ino_t inode[TAKERS];
} takers;
static takers *shared_takers;

static void count_initialisation(void)
{
    atomic_fetch_add(&shared_takers->initialisations, 1);
    nanosleep(&(struct timespec){0, 300 * 1000 * 1000}, NULL);
}

static void meet_at_the_lock(void)
{
    atomic_fetch_add(&shared_takers->at_the_lock, 1);
    for (int i = 0; i < 10000 && atomic_load(&shared_takers->at_the_lock) < TAKERS; i++) /* up to 10 s */
        nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
}

static void test_many_take_over_one_unfinished_table(void **state)
{
    flame_user_cache_params dead = params(100, 1, 8, 0), p = params(1000, 2, 8, 1);
    kill_creator_inside_creation(&dead);
    shared_takers = mmap(NULL, sizeof(takers), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(shared_takers != MAP_FAILED);
    memset(shared_takers, 0, sizeof(takers));
    pid_t kids[TAKERS];
    for (int k = 0; k < TAKERS; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            fl_uc_set_create_hook(count_initialisation);
            fl_uc_set_before_lock_hook(meet_at_the_lock);
            atomic_fetch_add(&shared_takers->ready_to_go, 1);
            while (atomic_load(&shared_takers->ready_to_go) < TAKERS) {
            }
            flame_user_cache *c = NULL;
            if (flame_user_cache_open(name, FLAME_USER_CACHE_CREATE_OR_ATTACH, &p, &c) != FLAME_OK) _exit(10);
            struct stat sb;
            if (fstat(c->fd, &sb) != 0) _exit(11);
            shared_takers->inode[k] = sb.st_ino;
            rec r;
            make_rec(&r, 100 + k, 1 + k, 2, 8, 1); /* 1 + k ids */
            _exit(flame_user_cache_put(c, 100 + k, &r.f) == FLAME_OK ? 0 : 12);
        }
    }
    for (int k = 0; k < TAKERS; k++) {
        int status = -1;
        assert_int_equal(waitpid(kids[k], &status, 0), kids[k]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0); /* 10: open failed */
    }
    assert_int_equal(atomic_load(&shared_takers->at_the_lock), TAKERS); /* all of them took it over */
    assert_int_equal(atomic_load(&shared_takers->initialisations), 1);
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_ATTACH, &p);
    struct stat sb;
    assert_int_equal(fstat(c->fd, &sb), 0);
    for (int k = 0; k < TAKERS; k++) assert_true(shared_takers->inode[k] == sb.st_ino);
    assert_int_equal(stats_of(c).records, TAKERS);
    assert_int_equal(stats_of(c).puts, TAKERS);
    for (int k = 0; k < TAKERS; k++) {
        rec out;
        flame_user_features f = out_features(&out);
        int32_t found = 0;
        assert_int_equal(flame_user_cache_get(c, 100 + k, &f, &found), FLAME_OK);
        assert_int_equal(found, 1);
        assert_true(consistent(&f, 100 + k, 2, 8, 1));
        assert_int_equal(f.num_ids, 1 + k);
    }
    flame_user_cache_destroy(c);
    munmap(shared_takers, sizeof(takers));
}

/* A creator slow to take its lock after making the object (stopped there) may find it taken
 * over by then, as one whose creator died: its CREATE fails, and the table it finds is left
 * as the taker made it, records and counts (initialised again, it lost them). */
static void test_creator_late_to_its_lock_leaves_a_taken_over_table(void **state)
{
    flame_user_cache_params p = params(100, 1, 8, 0), late = params(300, 1, 4, 0);
    pid_t pid = fork();
    if (pid == 0) {
        fl_uc_set_before_lock_hook(stop_self);
        flame_user_cache *c = NULL;
        flame_status st = flame_user_cache_open(name, FLAME_USER_CACHE_CREATE, &late, &c);
        if (st == FLAME_OK) _exit(10);
        _exit(st != FLAME_ERR_IO ? 11 : !strstr(flame_last_error(), "initialised the object first") ? 12 : 0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, WUNTRACED), pid);
    assert_true(WIFSTOPPED(status)); /* the object made, its lock not taken */
    flame_user_cache *c = NULL;
    if (flame_user_cache_open(name, FLAME_USER_CACHE_CREATE_OR_ATTACH, &p, &c) != FLAME_OK) {
        fprintf(stderr, "# open: %s\n", flame_last_error());
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        fail();
    }
    assert_put_then_get(c, 8, 4, &p);
    assert_int_equal(kill(pid, SIGCONT), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0); /* 10: created; 11, 12: another error */
    flame_user_cache *a = open_cache(FLAME_USER_CACHE_ATTACH, &p);
    flame_user_cache_stats s = stats_of(a);
    assert_int_equal(s.records, 1);
    assert_int_equal(s.puts, 1);
    assert_int_equal(s.capacity, 104);
    flame_user_cache_destroy(a);
    assert_put_then_get(c, 9, 5, &p);
    flame_user_cache_destroy(c);
}

/* CREATE_OR_ATTACH while another process unlinks the name: a name gone between the create
 * that found it and the attach, or an unfinished object unlinked while the attach waited on
 * it, is looked up again and created (both were FLAME_ERR_IO). */
typedef struct opener {
    flame_user_cache_params p;
    atomic_int stop;
    long opens, failures;
    flame_status last;
    char message[256];
} opener;

static void *open_loop(void *arg)
{
    opener *o = arg;
    do {
        flame_user_cache *c = NULL;
        flame_status st = flame_user_cache_open(name, FLAME_USER_CACHE_CREATE_OR_ATTACH, &o->p, &c);
        if (st != FLAME_OK) {
            o->failures++;
            o->last = st;
            snprintf(o->message, sizeof o->message, "%s", flame_last_error());
        } else {
            o->opens++;
        }
        flame_user_cache_destroy(c);
    } while (!atomic_load(&o->stop));
    return NULL;
}

static atomic_int unlinks_before_lock;

static void unlink_before_lock(void)
{
    if (atomic_exchange(&unlinks_before_lock, 0)) flame_user_cache_unlink(name);
}

static void test_create_or_attach_while_unlinked(void **state)
{
    opener o[2] = {{.p = params(64, 1, 4, 0)}, {.p = params(64, 1, 4, 0)}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, open_loop, &o[i]);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long unlinks = 0;
    while (seconds_since(&t0) < 1.0) unlinks += flame_user_cache_unlink(name) == FLAME_OK;
    for (int i = 0; i < 2; i++) atomic_store(&o[i].stop, 1);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    fprintf(stderr, "# %ld + %ld opens, %ld unlinks\n", o[0].opens, o[1].opens, unlinks);
    for (int i = 0; i < 2; i++) {
        if (o[i].failures) fail_msg("%ld failed opens, the last %s: %s", o[i].failures,
                                    flame_status_string(o[i].last), o[i].message);
        assert_true(o[i].opens > 10);
    }
    assert_true(unlinks > 10);

    /* an unfinished object (its creator was killed) unlinked while an attach waits on it */
    flame_user_cache_params p = params(100, 1, 8, 0);
    flame_user_cache_unlink(name); /* (an opener above may have left it) */
    kill_creator_inside_creation(&p);
    opener late = {.p = p};
    atomic_store(&late.stop, 1); /* one open */
    pthread_create(&t[0], NULL, open_loop, &late);
    nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL);
    assert_int_equal(flame_user_cache_unlink(name), FLAME_OK);
    pthread_join(t[0], NULL);
    if (late.failures) fail_msg("%s: %s", flame_status_string(late.last), late.message);
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_ATTACH, &p); /* the table it created */
    flame_user_cache_destroy(c);

    /* unlinked as a CREATE_OR_ATTACH is about to take it over: it creates the name again (the
     * object it found is no table anyone else can open) */
    assert_int_equal(flame_user_cache_unlink(name), FLAME_OK);
    kill_creator_inside_creation(&p);
    atomic_store(&unlinks_before_lock, 1);
    fl_uc_set_before_lock_hook(unlink_before_lock);
    c = open_cache(FLAME_USER_CACHE_CREATE_OR_ATTACH, &p);
    fl_uc_set_before_lock_hook(NULL);
    assert_int_equal(atomic_load(&unlinks_before_lock), 0);
    struct stat mine;
    assert_int_equal(fstat(c->fd, &mine), 0);
    assert_true(mine.st_nlink == 1 && mine.st_ino == stat_of_name().st_ino);
    assert_put_then_get(c, 12, 3, &p);
    flame_user_cache_destroy(c);
}

/* ---- a writer killed inside a write */
/* A table of users 0..19 (one slot, up to 16 ids, no dense values) whose user 7 another
 * process was overwriting when it was killed: seq odd, both of user 7's bucket locks held by a
 * dead process. */
static flame_user_cache *table_with_user_7_half_written(void)
{
    flame_user_cache_params p = params(64, 1, 16, 0);
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    for (int64_t u = 0; u < 20; u++) {
        rec r;
        make_rec(&r, u, 10, 1, 16, 0);
        assert_int_equal(flame_user_cache_put(c, u, &r.f), FLAME_OK);
    }
    pid_t pid = fork();
    if (pid == 0) {
        flame_user_cache *cc = NULL;
        if (flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &cc) != FLAME_OK) _exit(10);
        fl_uc_set_write_hook(stop_self);
        rec r;
        make_rec(&r, 7, 16, 1, 16, 0); /* overwrites user 7's record: stopped half way */
        flame_user_cache_put(cc, 7, &r.f);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, WUNTRACED), pid);
    assert_true(WIFSTOPPED(status)); /* inside the write: seq odd, both bucket locks held */
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    return c;
}

static void test_writer_killed_mid_write(void **state)
{
    flame_user_cache *c = table_with_user_7_half_written();

    rec out;
    flame_user_features f = out_features(&out);
    int32_t found = -1;
    assert_int_equal(flame_user_cache_get(c, 7, &f, &found), FLAME_OK); /* recovers, no hang */
    assert_int_equal(found, 0); /* the half-written record was dropped, not served torn */
    flame_user_cache_stats s = stats_of(c);
    assert_true(s.recoveries >= 1);
    assert_int_equal(s.records, 19);
    for (int64_t u = 0; u < 20; u++) { /* everyone else is intact */
        if (u == 7) continue;
        f = out_features(&out);
        assert_int_equal(flame_user_cache_get(c, u, &f, &found), FLAME_OK);
        assert_int_equal(found, 1);
        assert_true(consistent(&f, u, 1, 16, 0));
    }
    rec r;
    make_rec(&r, 7, 3, 1, 16, 0); /* and the table takes writes again, in both buckets */
    assert_int_equal(flame_user_cache_put(c, 7, &r.f), FLAME_OK);
    f = out_features(&out);
    assert_int_equal(flame_user_cache_get(c, 7, &f, &found), FLAME_OK);
    assert_int_equal(found, 1);
    assert_int_equal(f.num_ids, 3);
    s = stats_of(c);
    assert_int_equal(s.recoveries, 2); /* both of user 7's buckets were locked by the dead writer */
    assert_int_equal(s.records, 20);
    flame_user_cache_destroy(c);
}

/* The recovery's log line reaches the host's hook once the thread holds no bucket lock: the
 * hook has another thread read the same user, which would wait for the bucket (held across a
 * hook called under it) for as long as the hook runs. */
typedef struct hook_probe {
    flame_user_cache *c;
    atomic_int lines, reader_done, reader_finished_in_hook;
} hook_probe;

static void *read_user_7(void *arg)
{
    hook_probe *h = arg;
    rec out;
    flame_user_features f = out_features(&out);
    int32_t found = -1;
    flame_user_cache_get(h->c, 7, &f, &found);
    atomic_store(&h->reader_done, 1);
    return NULL;
}

static void recovery_hook(flame_log_level level, const char *message, void *user)
{
    hook_probe *h = user;
    if (!strstr(message, "recovered")) return;
    atomic_fetch_add(&h->lines, 1);
    pthread_t t;
    if (pthread_create(&t, NULL, read_user_7, h) != 0) return;
    for (int i = 0; i < 200 && !atomic_load(&h->reader_done); i++) /* up to 2 s */
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    atomic_store(&h->reader_finished_in_hook, atomic_load(&h->reader_done));
    pthread_join(t, NULL); /* a reader still waiting gets the bucket once the hook returns */
}

static void test_recovery_logged_outside_the_bucket_lock(void **state)
{
    flame_user_cache *c = table_with_user_7_half_written();

    hook_probe h = {.c = c};
    assert_int_equal(flame_set_log_callback(recovery_hook, &h, FLAME_LOG_WARN), FLAME_OK);
    rec r;
    make_rec(&r, 7, 3, 1, 16, 0); /* locks both buckets: two recoveries, one line */
    flame_status st = flame_user_cache_put(c, 7, &r.f);
    assert_int_equal(flame_set_log_callback(NULL, NULL, FLAME_LOG_ERROR), FLAME_OK);
    assert_int_equal(st, FLAME_OK);
    assert_int_equal(atomic_load(&h.lines), 1);
    assert_int_equal(atomic_load(&h.reader_finished_in_hook), 1);
    assert_int_equal(stats_of(c).recoveries, 2);
    flame_user_cache_destroy(c);
}

/* ---- readers racing writers: threads (what TSan sees) and processes */
enum { KEYS = 48, MAXI = 40, MAXD = 6, SLOTS = 3 };
typedef struct race {
    flame_user_cache *c;
    atomic_int stop;
    uint64_t seed;
    long hits, torn, writes;
} race;

static void *writer(void *arg)
{
    race *r = arg;
    for (uint64_t v = 1; !atomic_load(&r->stop); v++) {
        r->seed = r->seed * 6364136223846793005ull + 1442695040888963407ull;
        int64_t u = (int64_t)((r->seed >> 33) % KEYS);
        rec x;
        make_rec(&x, u, v, SLOTS, MAXI, MAXD);
        if ((r->seed >> 20) % 16 == 0) flame_user_cache_remove(r->c, u, NULL);
        else if (flame_user_cache_put(r->c, u, &x.f) == FLAME_OK) r->writes++;
    }
    return NULL;
}

static void read_loop(race *r, long iterations)
{
    for (long i = 0; i < iterations; i++) {
        rec out;
        flame_user_features f = out_features(&out);
        int32_t found = 0;
        int64_t u = i % KEYS;
        if (flame_user_cache_get(r->c, u, &f, &found) != FLAME_OK) r->torn++;
        else if (found) {
            r->hits++;
            r->torn += !consistent(&f, u, SLOTS, MAXI, MAXD);
        }
    }
}

static void *reader(void *arg)
{
    read_loop(arg, 200000);
    return NULL;
}

static void test_no_torn_reads_threads(void **state)
{
    tu_seed();
    /* capacity 48 over 6 buckets: writes evict and rewrite the same records all the time */
    flame_user_cache_params p = params(KEYS, SLOTS, MAXI, MAXD);
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    race w = {.c = c, .seed = tu_u64()}, rd[2] = {{.c = c}, {.c = c}};
    pthread_t tw, tr[2];
    pthread_create(&tw, NULL, writer, &w);
    for (int i = 0; i < 2; i++) pthread_create(&tr[i], NULL, reader, &rd[i]);
    for (int i = 0; i < 2; i++) pthread_join(tr[i], NULL);
    atomic_store(&w.stop, 1);
    pthread_join(tw, NULL);
    fprintf(stderr, "# threads: %ld writes, %ld + %ld hits, %ld + %ld torn\n", w.writes, rd[0].hits, rd[1].hits,
            rd[0].torn, rd[1].torn);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(rd[i].torn, 0);
        assert_true(rd[i].hits > 1000);
    }
    assert_true(w.writes > 1000);
    flame_user_cache_destroy(c);
}

static void test_no_torn_reads_processes(void **state)
{
    tu_seed();
    flame_user_cache_params p = params(KEYS, SLOTS, MAXI, MAXD);
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    pid_t kids[2];
    for (int k = 0; k < 2; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            race r = {0};
            if (flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &r.c) != FLAME_OK) _exit(10);
            read_loop(&r, 300000);
            _exit(r.torn ? 1 : r.hits < 1000 ? 2 : 0);
        }
    }
    race w = {.c = c, .seed = tu_u64()};
    pthread_t tw;
    pthread_create(&tw, NULL, writer, &w);
    int status[2];
    for (int k = 0; k < 2; k++) assert_int_equal(waitpid(kids[k], &status[k], 0), kids[k]);
    atomic_store(&w.stop, 1);
    pthread_join(tw, NULL);
    fprintf(stderr, "# processes: %ld writes while 2 readers ran\n", w.writes);
    for (int k = 0; k < 2; k++) {
        assert_true(WIFEXITED(status[k]));
        assert_int_equal(WEXITSTATUS(status[k]), 0); /* 1: torn record seen, 2: too few hits */
    }
    assert_true(w.writes > 1000);
    flame_user_cache_destroy(c);
}

/* ---- full table, eviction order and TTL with an injected clock */
static int64_t fake_now;
static int64_t fake_clock(void)
{
    return fake_now;
}

static void test_full_table_evicts_least_recently_written(void **state)
{
    fl_uc_set_clock(fake_clock);
    flame_user_cache_params p = params(16, 1, 4, 0); /* 2 buckets: every user may use all 16 ways */
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    rec r, out;
    make_rec(&r, 0, 2, 1, 4, 0);
    for (int64_t u = 0; u < 16; u++, fake_now += 10) assert_int_equal(flame_user_cache_put(c, u, &r.f), FLAME_OK);
    flame_user_cache_stats s = stats_of(c);
    assert_int_equal(s.records, 16);
    assert_int_equal(s.evictions, 0);
    assert_int_equal(flame_user_cache_put(c, 100, &r.f), FLAME_OK); /* full: user 0 goes */
    fake_now += 10;
    assert_int_equal(flame_user_cache_put(c, 1, &r.f), FLAME_OK); /* rewritten: now the newest */
    fake_now += 10;
    assert_int_equal(flame_user_cache_put(c, 101, &r.f), FLAME_OK); /* user 2 goes, not 1 */
    int32_t found;
    int64_t want_missing[] = {0, 2}, want_present[] = {1, 3, 15, 100, 101};
    for (int i = 0; i < 2; i++) {
        flame_user_features f = out_features(&out);
        assert_int_equal(flame_user_cache_get(c, want_missing[i], &f, &found), FLAME_OK);
        assert_int_equal(found, 0);
    }
    for (int i = 0; i < 5; i++) {
        flame_user_features f = out_features(&out);
        assert_int_equal(flame_user_cache_get(c, want_present[i], &f, &found), FLAME_OK);
        assert_int_equal(found, 1);
    }
    s = stats_of(c);
    assert_int_equal(s.records, 16);
    assert_int_equal(s.evictions, 2);
    flame_user_cache_destroy(c);
}

/* Two-choice buckets (no relocation) take ~80% of the capacity before the first eviction, and
 * then stay exactly full. */
static void test_load_before_first_eviction(void **state)
{
    flame_user_cache_params p = params(8000, 1, 2, 0);
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    rec r;
    make_rec(&r, 0, 1, 1, 2, 0);
    int64_t u = 0;
    while (stats_of(c).evictions == 0) assert_int_equal(flame_user_cache_put(c, u++, &r.f), FLAME_OK);
    fprintf(stderr, "# first eviction at user %lld of capacity 8000 (%.1f%% full)\n", (long long)u, u / 80.0);
    assert_true(u > 8000 * 3 / 4);
    for (int64_t k = u; k < 20000; k++) assert_int_equal(flame_user_cache_put(c, k, &r.f), FLAME_OK);
    flame_user_cache_stats s = stats_of(c);
    assert_int_equal(s.records, 8000); /* full, never more */
    assert_int_equal(s.evictions, 20000 - 8000);
    flame_user_cache_destroy(c);
}

static void test_ttl(void **state)
{
    fl_uc_set_clock(fake_clock);
    fake_now = 1000000;
    flame_user_cache_params p = params(16, 1, 4, 0);
    p.ttl_us = 1000;
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    rec r, out;
    make_rec(&r, 5, 3, 1, 4, 0);
    assert_int_equal(flame_user_cache_put(c, 5, &r.f), FLAME_OK);
    fake_now += 600;
    flame_user_features f = out_features(&out);
    int32_t found;
    assert_int_equal(flame_user_cache_get(c, 5, &f, &found), FLAME_OK);
    assert_int_equal(found, 1);
    assert_int_equal(f.age_us, 600);
    fake_now += 600;
    assert_int_equal(flame_user_cache_get(c, 5, &f, &found), FLAME_OK);
    assert_int_equal(found, 0);
    flame_user_cache_stats s = stats_of(c);
    assert_int_equal(s.expired, 1);
    assert_int_equal(s.misses, 1);
    /* a full table replaces the expired record before any fresher one */
    for (int64_t u = 100; u < 115; u++) assert_int_equal(flame_user_cache_put(c, u, &r.f), FLAME_OK);
    fake_now += 1;
    assert_int_equal(flame_user_cache_put(c, 200, &r.f), FLAME_OK);
    assert_int_equal(stats_of(c).evictions, 1);
    for (int64_t u = 100; u < 115; u++) {
        f = out_features(&out);
        assert_int_equal(flame_user_cache_get(c, u, &f, &found), FLAME_OK);
        assert_int_equal(found, 1);
    }
    flame_user_cache_destroy(c);
}

/* ---- another process of the same user overwriting the table (here: a second mapping of it) */
typedef struct hostile {
    int fd;
    unsigned char *base;
    size_t bytes;
} hostile;

static hostile map_again(size_t bytes)
{
    hostile h = {.fd = shm_open(name, O_RDWR, 0), .bytes = bytes};
    assert_true(h.fd >= 0);
    h.base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, h.fd, 0);
    assert_true(h.base != MAP_FAILED);
    return h;
}

/* The record words of `user` in the other mapping (found through the victim's layout). */
static _Atomic uint64_t *record_of(flame_user_cache *c, const hostile *h, int64_t user)
{
    for (uint64_t i = 0; i < c->lay.num_buckets; i++)
        for (unsigned w = 0; w < FL_UC_WAYS; w++) {
            _Atomic uint64_t *r = fl_uc_record(c, fl_uc_bucket_at(c, i), w);
            if ((atomic_load(&r[FL_UC_META]) & FL_UC_LIVE) && (int64_t)atomic_load(&r[FL_UC_KEY]) == user)
                return (_Atomic uint64_t *)(h->base + ((unsigned char *)r - c->base));
        }
    fail_msg("no record of user %lld", (long long)user);
    return NULL;
}

static int32_t get_found(flame_user_cache *c, int64_t user, rec *out, flame_status want)
{
    flame_user_features f = out_features(out);
    int32_t found = -1;
    flame_status st = flame_user_cache_get(c, user, &f, &found);
    if (st != want) fail_msg("get(%lld): %s (%s)", (long long)user, flame_status_string(st), flame_last_error());
    if (st == FLAME_OK && found) assert_true(consistent(&f, user, 2, 8, 2));
    return found;
}

/* Layout fields overwritten after attach change nothing: the handle uses its own validated
 * copy (before, a bucket count of 2^40 sent every call far outside the mapping). */
static void test_hostile_header_is_ignored_after_attach(void **state)
{
    flame_user_cache_params p = params(100, 2, 8, 2);
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    rec in, out;
    for (int64_t u = 1; u <= 20; u++) {
        make_rec(&in, u, 5 + (uint64_t)u, 2, 8, 2);
        assert_int_equal(flame_user_cache_put(c, u, &in.f), FLAME_OK);
    }
    hostile h = map_again(c->bytes);
    fl_uc_header *hh = (fl_uc_header *)h.base;
    hh->num_buckets = 1ull << 40;
    hh->bucket_bytes = 1ull << 40;
    hh->record_bytes = 1ull << 40;
    hh->total_bytes = 1ull << 50;
    hh->num_slots = 64;
    hh->max_ids = 0xffffffffu;
    hh->max_dense = 0xffffffffu;
    hh->ttl_us = 1;
    for (int64_t u = 1; u <= 20; u++) assert_int_equal(get_found(c, u, &out, FLAME_OK), 1);
    make_rec(&in, 21, 7, 2, 8, 2);
    assert_int_equal(flame_user_cache_put(c, 21, &in.f), FLAME_OK);
    assert_int_equal(get_found(c, 21, &out, FLAME_OK), 1);
    int32_t removed = 0;
    assert_int_equal(flame_user_cache_remove(c, 21, &removed), FLAME_OK);
    assert_int_equal(removed, 1);
    flame_user_cache_params got = {.struct_size = sizeof got};
    assert_int_equal(flame_user_cache_get_params(c, &got), FLAME_OK);
    assert_int_equal(got.max_ids, 8);
    assert_int_equal(got.num_slots, 2);
    assert_int_equal(got.ttl_us, 0);
    flame_user_cache_stats s = stats_of(c);
    assert_int_equal(s.capacity, 104);
    assert_int_equal(s.records, 20);
    flame_user_cache *d = NULL; /* a new attach sees the header as it is now, and refuses it */
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, NULL, &d), FLAME_ERR_FORMAT,
                      "header is out of range");
    munmap(h.base, h.bytes);
    close(h.fd);
    flame_user_cache_destroy(c);
}

/* Records no writer makes read as misses counted in stats.corrupt, never as hits with counts
 * the buffers do not hold (before, slot lengths not summing to the ids came back as a hit). */
static void test_hostile_records_are_misses(void **state)
{
    fl_uc_set_clock(fake_clock);
    fake_now = 1000000000;
    flame_user_cache_params p = params(100, 2, 8, 2);
    p.ttl_us = 60000000;
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    rec in, out;
    for (int64_t u = 1; u <= 6; u++) {
        make_rec(&in, u, 4 + (uint64_t)u, 2, 8, 2); /* 5..8 ids (v mod 9), so slot 0 is never empty */
        assert_int_equal(flame_user_cache_put(c, u, &in.f), FLAME_OK);
    }
    hostile h = map_again(c->bytes);
    /* 1: slot lengths that do not sum to the ids */
    record_of(c, &h, 1)[FL_UC_SLOTS] = 1000ull | 7ull << 32;
    assert_int_equal(get_found(c, 1, &out, FLAME_OK), 0);
    assert_int_equal(stats_of(c).corrupt, 1);
    /* 2: an id count beyond max_ids */
    _Atomic uint64_t *r = record_of(c, &h, 2);
    r[FL_UC_META] = fl_uc_meta(0xffffff, 1);
    assert_int_equal(get_found(c, 2, &out, FLAME_OK), 0);
    /* 3: a seq left odd (as if a writer were inside for ever, its lock free) */
    r = record_of(c, &h, 3);
    r[FL_UC_SEQ] = r[FL_UC_SEQ] + 1;
    assert_int_equal(get_found(c, 3, &out, FLAME_OK), 0);
    flame_user_cache_stats s = stats_of(c);
    assert_int_equal(s.corrupt, 3);
    assert_int_equal(s.misses, 3);
    assert_int_equal(s.hits, 0);
    /* 4, 5: written-at times far in the past (the age saturates: expired) and in the future */
    record_of(c, &h, 4)[FL_UC_TIME] = (uint64_t)INT64_MIN;
    assert_int_equal(get_found(c, 4, &out, FLAME_OK), 0);
    assert_int_equal(stats_of(c).expired, 1);
    record_of(c, &h, 5)[FL_UC_TIME] = (uint64_t)INT64_MAX;
    flame_user_features f = out_features(&out);
    int32_t found = 0;
    assert_int_equal(flame_user_cache_get(c, 5, &f, &found), FLAME_OK);
    assert_int_equal(found, 1);
    assert_int_equal(f.age_us, 0);
    /* a put over the odd-seq record and with expired neighbours still works, and heals the
     * record: its seq is even again (the write turned it even while it was inside, and odd
     * after, so the new record read as a miss and a reader could take a half-written one) */
    make_rec(&in, 3, 6, 2, 8, 2);
    assert_int_equal(flame_user_cache_put(c, 3, &in.f), FLAME_OK);
    assert_int_equal(get_found(c, 6, &out, FLAME_OK), 1);
    assert_int_equal(get_found(c, 3, &out, FLAME_OK), 1);
    assert_int_equal(record_of(c, &h, 3)[FL_UC_SEQ] % 2, 0);
    assert_int_equal(stats_of(c).corrupt, 3);
    /* an older caller's stats struct (without `corrupt`) is still filled */
    flame_user_cache_stats old = {.struct_size = offsetof(flame_user_cache_stats, corrupt), .corrupt = 77};
    assert_int_equal(flame_user_cache_get_stats(c, &old), FLAME_OK);
    assert_int_equal(old.corrupt, 77);
    assert_int_equal(old.misses, 4);
    munmap(h.base, h.bytes);
    close(h.fd);
    flame_user_cache_destroy(c);
}

/* A truncated object is an error for every call, not SIGBUS; so for an engine scoring from it. */
static void test_hostile_truncation_is_an_error(void **state)
{
    flame_user_cache_params p = params(1000, 2, 8, 2);
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    rec in, out;
    make_rec(&in, 9, 7, 2, 8, 2);
    assert_int_equal(flame_user_cache_put(c, 9, &in.f), FLAME_OK);
    hostile h = map_again(4096);
    assert_int_equal(ftruncate(h.fd, 4096), 0);
    char want[160];
    snprintf(want, sizeof want, "shm '%s' is 4096 bytes, its layout needs %llu: another process truncated it", name,
             (unsigned long long)c->lay.total_bytes);
    flame_user_features f = out_features(&out);
    int32_t found = -1, removed = -1;
    assert_status_msg(flame_user_cache_get(c, 9, &f, &found), FLAME_ERR_IO, want);
    assert_status_msg(flame_user_cache_put(c, 9, &in.f), FLAME_ERR_IO, want);
    assert_status_msg(flame_user_cache_remove(c, 9, &removed), FLAME_ERR_IO, want);
    flame_user_cache_stats s = {.struct_size = sizeof s};
    assert_status_msg(flame_user_cache_get_stats(c, &s), FLAME_ERR_IO, want);
    flame_model *m = NULL;
    flame_engine *e = NULL;
    assert_int_equal(flame_model_create_random(flame_default_model_config(), 1, &m), FLAME_OK);
    assert_int_equal(flame_engine_create(m, NULL, &e), FLAME_OK);
    assert_int_equal(flame_engine_set_user_cache(e, c), FLAME_OK);
    flame_model_info info = {.struct_size = sizeof info};
    assert_int_equal(flame_model_get_info(m, &info), FLAME_OK);
    int64_t cand[2] = {1, 2};
    float scores[64];
    flame_request q = {.struct_size = sizeof q, .user_id = 9, .candidates = cand, .num_candidates = 2,
                       .history_from_user_cache = 1};
    assert_status_msg(flame_score(e, &q, scores, 2 * (size_t)info.num_tasks), FLAME_ERR_IO, want);
    flame_engine_destroy(e);
    flame_model_destroy(m);
    munmap(h.base, h.bytes);
    close(h.fd);
    flame_user_cache_destroy(c);
}

static void test_argument_errors(void **state)
{
    flame_user_cache *c = NULL;
    flame_user_cache_params p = params(100, 2, 4, 1);
    assert_status_msg(flame_user_cache_open("noslash", FLAME_USER_CACHE_CREATE, &p, &c), FLAME_ERR_INVALID_ARG,
                      "shm name 'noslash' is invalid");
    assert_status_msg(flame_user_cache_open("/a/b", FLAME_USER_CACHE_CREATE, &p, &c), FLAME_ERR_INVALID_ARG, "/a/b");
    /* the shm directory and its parent are no objects (they were FLAME_ERR_IO) */
    assert_status_msg(flame_user_cache_open("/.", FLAME_USER_CACHE_CREATE_OR_ATTACH, &p, &c), FLAME_ERR_INVALID_ARG,
                      "shm name '/.' is invalid: '.' and '..' are no object names");
    assert_status_msg(flame_user_cache_open("/..", FLAME_USER_CACHE_ATTACH, NULL, &c), FLAME_ERR_INVALID_ARG, "'/..'");
    assert_status_msg(flame_user_cache_unlink("/."), FLAME_ERR_INVALID_ARG, "'/.'");
    char longest[300] = "/", too_long[300] = "/";
    memset(longest + 1, 'x', 250);
    memset(too_long + 1, 'x', 251);
    assert_status_msg(flame_user_cache_open(too_long, FLAME_USER_CACHE_CREATE, &p, &c), FLAME_ERR_INVALID_ARG,
                      "longer than '/' then 250 characters");
    assert_status_msg(flame_user_cache_unlink(longest), FLAME_ERR_IO, "No such file");
    assert_status_msg(flame_user_cache_open(name, 7, &p, &c), FLAME_ERR_INVALID_ARG, "open_mode 7");
    flame_user_cache_params bad = p;
    bad.num_slots = 65;
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE, &bad, &c), FLAME_ERR_INVALID_ARG,
                      "num_slots 65");
    bad = p;
    bad.capacity = (1ull << 32) + 1;
    assert_status_msg(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE, &bad, &c), FLAME_ERR_INVALID_ARG,
                      "capacity 4294967297 is outside 1..2^32");
    assert_null(c);
    c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    rec r, out;
    make_rec(&r, 1, 4, 2, 4, 1);
    r.f.num_ids = 5;
    assert_status_msg(flame_user_cache_put(c, 9, &r.f), FLAME_ERR_INVALID_ARG, "num_ids 5 is above the table's max_ids 4");
    r.f.num_ids = 3;
    assert_status_msg(flame_user_cache_put(c, 9, &r.f), FLAME_ERR_INVALID_ARG, "slot_lens sum to 4, num_ids is 3");
    make_rec(&r, 1, 4, 2, 4, 1);
    assert_int_equal(flame_user_cache_put(c, 9, &r.f), FLAME_OK);
    flame_user_features f = out_features(&out);
    f.ids_capacity = 2;
    int32_t found = 0;
    assert_status_msg(flame_user_cache_get(c, 9, &f, &found), FLAME_ERR_BUFFER_TOO_SMALL, "user 9 has 4 ids");
    assert_int_equal(f.num_ids, 4);
    assert_int_equal(found, 1);
    assert_status_msg(flame_user_cache_get(c, 9, NULL, &found), FLAME_ERR_INVALID_ARG, "features is NULL");
    /* the struct that get refused for small buffers, put back: it holds the counts needed, its
     * arrays only their capacities (put read past them) */
    int64_t *few = malloc(2 * sizeof *few);
    float *one = malloc(sizeof *one);
    f = (flame_user_features){.struct_size = sizeof f, .ids = few, .ids_capacity = 2, .slot_lens = out.lens,
                              .dense = one, .dense_capacity = 1};
    assert_status_msg(flame_user_cache_get(c, 9, &f, &found), FLAME_ERR_BUFFER_TOO_SMALL, "4 ids");
    assert_int_equal(f.num_ids, 4);
    assert_status_msg(flame_user_cache_put(c, 10, &f), FLAME_ERR_INVALID_ARG,
                      "user 10: num_ids 4 is above features->ids_capacity 2");
    f.num_ids = 2;
    out.lens[0] = 1, out.lens[1] = 1;
    assert_int_equal(flame_user_cache_put(c, 10, &f), FLAME_OK);
    flame_user_cache_destroy(c);
    assert_int_equal(flame_user_cache_unlink(name), FLAME_OK);
    p = params(100, 1, 4, 4); /* dense values: a table that holds more than the struct's array */
    c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    f.num_ids = 0;
    out.lens[0] = 0;
    f.num_dense = 3;
    assert_status_msg(flame_user_cache_put(c, 10, &f), FLAME_ERR_INVALID_ARG,
                      "user 10: num_dense 3 is above features->dense_capacity 1");
    f.num_dense = 1;
    assert_int_equal(flame_user_cache_put(c, 10, &f), FLAME_OK);
    free(few);
    free(one);
    flame_user_cache_destroy(c);
}

/* The default table (500k users, 32 ids): size, then single-thread put and get rates. */
/* A zeroed params struct (struct_size set) is the defaults: 500000 records, one slot, 32 ids,
 * mode 0600 (a zero mode used to create a table no other process could open). */
static void test_zeroed_params_are_the_defaults(void **state)
{
    flame_user_cache_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    flame_user_cache *c = NULL;
    assert_int_equal(flame_user_cache_open(name, FLAME_USER_CACHE_CREATE, &p, &c), FLAME_OK);
    flame_user_cache_stats s = {.struct_size = sizeof s};
    assert_int_equal(flame_user_cache_get_stats(c, &s), FLAME_OK);
    assert_true(s.capacity >= 500000 && s.capacity < 500008);
    char path[96];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    int64_t ids[32];
    uint32_t lens[1] = {32};
    for (int i = 0; i < 32; i++) ids[i] = i;
    flame_user_features f = {.struct_size = sizeof f, .ids = ids, .num_ids = 32, .slot_lens = lens};
    assert_int_equal(flame_user_cache_put(c, 5, &f), FLAME_OK); /* 32 ids fit */
    f.num_ids = 33;
    lens[0] = 33;
    assert_status_msg(flame_user_cache_put(c, 5, &f), FLAME_ERR_INVALID_ARG, "above the table's max_ids 32");
    /* attaching with a zeroed struct checks against the same defaults */
    flame_user_cache *a = NULL;
    assert_int_equal(flame_user_cache_open(name, FLAME_USER_CACHE_ATTACH, &p, &a), FLAME_OK);
    flame_user_cache_destroy(a);
    flame_user_cache_destroy(c);
}

/* An attacher without params learns the creator's layout; mode is not kept (0). */
static void test_get_params(void **state)
{
    flame_user_cache_params p = params(100, 3, 12, 5);
    p.ttl_us = 2500000;
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p), *a = open_cache(FLAME_USER_CACHE_ATTACH, NULL);
    flame_user_cache_params got;
    memset(&got, 0x5a, sizeof got);
    got.struct_size = sizeof got;
    assert_int_equal(flame_user_cache_get_params(a, &got), FLAME_OK);
    assert_int_equal(got.struct_size, sizeof got);
    assert_int_equal(got.capacity, 100);
    assert_int_equal(got.num_slots, 3);
    assert_int_equal(got.max_ids, 12);
    assert_int_equal(got.max_dense, 5);
    assert_int_equal(got.mode, 0);
    assert_int_equal(got.ttl_us, 2500000);
    got.struct_size = 4097;
    assert_status_msg(flame_user_cache_get_params(a, &got), FLAME_ERR_INVALID_ARG,
                      "flame_user_cache_params.struct_size = 4097");
    assert_status_msg(flame_user_cache_get_params(NULL, &got), FLAME_ERR_INVALID_ARG, "cache is NULL");
    assert_status_msg(flame_user_cache_get_params(a, NULL), FLAME_ERR_INVALID_ARG, "params is NULL");
    flame_user_cache_destroy(a);
    flame_user_cache_destroy(c);
}

static void test_default_table_throughput(void **state)
{
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, NULL);
    flame_user_cache_stats s = stats_of(c);
    assert_true(s.capacity >= 500000 && s.capacity < 500008);
    fprintf(stderr, "# default table: %llu records of %llu bytes, %.1f MB\n", (unsigned long long)s.capacity,
            (unsigned long long)s.record_bytes, s.table_bytes / 1e6);
    enum { USERS = 300000, GETS = 1000000 };
    rec r, out;
    make_rec(&r, 0, 16, 1, 32, 0); /* 16 ids per user */
    struct timespec t0, t1, t2;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t u = 0; u < USERS; u++) assert_int_equal(flame_user_cache_put(c, u * 7919, &r.f), FLAME_OK);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long hits = 0;
    uint64_t x = 1;
    for (int i = 0; i < GETS; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        flame_user_features f = out_features(&out);
        int32_t found = 0;
        flame_user_cache_get(c, (int64_t)((x >> 33) % USERS) * 7919, &f, &found);
        hits += found && f.num_ids == 16;
    }
    clock_gettime(CLOCK_MONOTONIC, &t2);
    double put_s = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
    double get_s = (t2.tv_sec - t1.tv_sec) + (t2.tv_nsec - t1.tv_nsec) / 1e9;
    fprintf(stderr, "# 1 thread: %.2f M puts/s, %.2f M gets/s (16 ids, random users of %d)\n", USERS / put_s / 1e6,
            GETS / get_s / 1e6, USERS);
    assert_int_equal(hits, GETS); /* 60% full: no eviction yet */
    assert_int_equal(stats_of(c).evictions, 0);
    int64_t u = USERS;
    while (atomic_load(&c->hdr->evictions) == 0) /* stats would count records each time */
        assert_int_equal(flame_user_cache_put(c, 7919 * u++, &r.f), FLAME_OK);
    fprintf(stderr, "# default table: first eviction at user %lld (%.1f%% full)\n", (long long)u, u / 5000.0);
    assert_true(u > 500000 * 65 / 100);
    flame_user_cache_destroy(c);
}
/* The written-at word of a record, as any process mapping the table may write it. */
static void set_written_at(flame_user_cache *c, int64_t user, int64_t t)
{
    for (uint64_t b = 0; b < c->hdr->num_buckets; b++)
        for (unsigned w = 0; w < FL_UC_WAYS; w++) {
            _Atomic uint64_t *r = fl_uc_record(c, fl_uc_bucket_at(c, b), w);
            if ((int64_t)atomic_load(&r[FL_UC_KEY]) == user && (atomic_load(&r[FL_UC_META]) & FL_UC_LIVE)) {
                atomic_store(&r[FL_UC_TIME], (uint64_t)t);
                return;
            }
        }
    fail_msg("user %lld has no record", (long long)user);
}

/* Ages from written-at times anywhere in int64 saturate: never negative, never wrapped into
 * a young age that would keep a record past its TTL. */
static void test_written_at_times_of_any_value(void **state)
{
    fl_uc_set_clock(fake_clock);
    fake_now = 5000000;
    flame_user_cache_params p = params(16, 1, 4, 0);
    flame_user_cache *c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    rec r, out;
    make_rec(&r, 5, 3, 1, 4, 0);
    assert_int_equal(flame_user_cache_put(c, 5, &r.f), FLAME_OK);
    struct {
        int64_t t, age;
    } cases[] = {{INT64_MIN, INT64_MAX}, {INT64_MIN + 5000000, INT64_MAX}, {-1, 5000001}, {INT64_MAX, 0},
                 {5000001, 0}, {4000000, 1000000}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        set_written_at(c, 5, cases[i].t);
        flame_user_features f = out_features(&out);
        int32_t found = -1;
        assert_int_equal(flame_user_cache_get(c, 5, &f, &found), FLAME_OK);
        assert_int_equal(found, 1);
        assert_true(f.age_us == cases[i].age);
    }
    flame_user_cache_destroy(c);
    /* with a TTL the oldest possible record is expired, not young */
    p.ttl_us = 1000;
    flame_user_cache_unlink(name);
    c = open_cache(FLAME_USER_CACHE_CREATE, &p);
    assert_int_equal(flame_user_cache_put(c, 5, &r.f), FLAME_OK);
    set_written_at(c, 5, INT64_MIN);
    flame_user_features f = out_features(&out);
    int32_t found = -1;
    assert_int_equal(flame_user_cache_get(c, 5, &f, &found), FLAME_OK);
    assert_int_equal(found, 0);
    flame_user_cache_destroy(c);
}


int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_put_get_remove),
        T(test_create_interrupted_by_signals),
        T(test_create_reserved_in_pieces),
        T(test_failed_creation_leaves_a_name_made_again),
        T(test_failed_creation_removes_its_object),
        T(test_recovery_logged_outside_the_bucket_lock),
        T(test_attach_from_another_process),
        T(test_attach_checks_the_header),
        T(test_attach_waits_for_a_live_creator),
        T(test_attach_while_the_creator_reserves),
        T(test_creator_killed_inside_the_creation),
        T(test_other_layout_without_ready),
        T(test_create_or_attach_takes_over_an_unfinished_table),
        T(test_create_or_attach_takes_over_nothing_else),
        T(test_many_take_over_one_unfinished_table),
        T(test_creator_late_to_its_lock_leaves_a_taken_over_table),
        T(test_create_or_attach_while_unlinked),
        T(test_writer_killed_mid_write),
        T(test_no_torn_reads_threads),
        T(test_no_torn_reads_processes),
        T(test_full_table_evicts_least_recently_written),
        T(test_load_before_first_eviction),
        T(test_ttl),
        T(test_written_at_times_of_any_value),
        T(test_hostile_header_is_ignored_after_attach),
        T(test_hostile_records_are_misses),
        T(test_hostile_truncation_is_an_error),
        T(test_argument_errors),
        T(test_zeroed_params_are_the_defaults),
        T(test_get_params),
        T(test_default_table_throughput),
    };
    return cmocka_run_group_tests_name("user cache", tests, NULL, NULL);
}
