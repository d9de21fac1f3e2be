/* The layout of the shared-memory user cache, shared by every process that maps it
 * (docs/memory.md). Any change to it must bump FL_UC_LAYOUT_VERSION: attach refuses others. */
#ifndef FLAME_CACHE_USER_LAYOUT_H
#define FLAME_CACHE_USER_LAYOUT_H

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>

#include "core/common.h"

#define FL_UC_MAGIC "FLAMEUC\0"
#define FL_UC_LAYOUT_VERSION 2u
#define FL_UC_READY 0x59444552u     /* "REDY": the creator finished initialising */
#define FL_UC_BYTE_ORDER 0x01020304u
/* The C library whose process-shared robust mutexes the table holds: glibc's and musl's are
 * both 40 bytes on x86-64 and arm64 but laid out and locked differently, so a size check alone
 * would let a process of one lock the other's mutexes. musl defines no macro of its own. */
#if defined(__GLIBC__)
#define FL_UC_LIBC 1u /* glibc */
#elif defined(__BIONIC__)
#define FL_UC_LIBC 2u /* bionic */
#else
#define FL_UC_LIBC 3u /* another: musl, ... */
#endif
#define FL_UC_MUTEX_ABI (FL_UC_LIBC << 16 | (uint32_t)sizeof(pthread_mutex_t))
#define FL_UC_WAYS 8u               /* records per bucket; a user may live in 2 buckets */
#define FL_UC_HEADER_BYTES 4096u    /* the header owns the first page */
#define FL_UC_NO_KEY INT64_MIN      /* hint of an empty way (only a hint: records decide) */

/* At offset 0. Fixed fields are written once by the creator before `ready`; the counters are
 * atomics every process updates. */
typedef struct fl_uc_header {
    char magic[8];
    uint32_t layout_version;
    uint32_t header_bytes;
    _Atomic uint32_t ready;
    uint32_t byte_order;
    uint32_t mutex_abi;             /* the creator's C library (FL_UC_LIBC) << 16 | sizeof(pthread_mutex_t) */
    uint32_t ways;
    uint64_t capacity;              /* as asked at creation (compared on attach) */
    uint64_t num_buckets;
    uint64_t bucket_bytes;
    uint64_t record_bytes;
    uint64_t total_bytes;
    uint32_t num_slots, max_ids, max_dense, record_words;
    int64_t ttl_us;
    _Atomic uint64_t puts, evictions, recoveries, removes;
} fl_uc_header;

/* Then num_buckets buckets of bucket_bytes: this head, then FL_UC_WAYS records. */
typedef struct fl_uc_bucket {
    pthread_mutex_t mu;             /* robust, process-shared: guards writes to the bucket */
    _Atomic uint32_t live;          /* live records (written under mu) */
    alignas(64) _Atomic int64_t hint[FL_UC_WAYS]; /* user id per way, read by lock-free gets */
} fl_uc_bucket;

/* A record is record_words 64-bit atomic words (record_bytes, a multiple of 64):
 *   [0] seq: even = stable, odd = a writer is inside        [1] user id
 *   [2] meta: bit 63 live, bits 0..23 num_ids, 24..47 num_dense   [3] written at (us)
 *   [4..) slot lengths (two u32 per word), ids (one per word), dense (two floats per word) */
enum { FL_UC_SEQ = 0, FL_UC_KEY = 1, FL_UC_META = 2, FL_UC_TIME = 3, FL_UC_SLOTS = 4 };
#define FL_UC_LIVE (1ull << 63)

static inline uint64_t fl_uc_meta(uint64_t num_ids, uint64_t num_dense)
{
    return FL_UC_LIVE | num_ids | num_dense << 24;
}
static inline uint32_t fl_uc_meta_ids(uint64_t meta)
{
    return (uint32_t)(meta & 0xffffff);
}
static inline uint32_t fl_uc_meta_dense(uint64_t meta)
{
    return (uint32_t)(meta >> 24 & 0xffffff);
}

#endif
