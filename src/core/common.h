/* Internal helpers shared by every part of the library (never installed). */
#ifndef FLAME_CORE_COMMON_H
#define FLAME_CORE_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flame/flame.h"

#if defined(__GNUC__)
#define FL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#define FL_LIKELY(x) __builtin_expect(!!(x), 1)
#define FL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define FL_PRINTF(a, b)
#define FL_LIKELY(x) (x)
#define FL_UNLIKELY(x) (x)
#endif

/* Records the per-thread detail message and returns `status`, so call sites read
 * `return fl_error(FLAME_ERR_FORMAT, "tensor '%s' ...", name);`. */
flame_status fl_error(flame_status status, const char *fmt, ...) FL_PRINTF(2, 3);
/* Clears the per-thread message (start of every public call that can fail). */
void fl_clear_error(void);

/* Log through the process-wide hook, if installed and the level is enabled. */
void fl_log(flame_log_level level, const char *fmt, ...) FL_PRINTF(2, 3);

/* Overflow-checked size arithmetic: false on overflow, *out unchanged then. */
static inline bool fl_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool fl_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}
static inline uint64_t fl_sat_add_u64(uint64_t a, uint64_t b)
{
    uint64_t s;
    return __builtin_add_overflow(a, b, &s) ? UINT64_MAX : s;
}

/* Whether a x b exceeds limit, for a, b, limit >= 0, without forming the product (which can
 * pass 2^64 for the lengths callers give: batch 2^24 x ld 2^40). */
static inline bool fl_product_exceeds(int64_t a, int64_t b, int64_t limit)
{
    return a > 0 && b > 0 && a > limit / b;
}

/* Whether p is not a multiple of align (a power of two): a caller's array whose elements the
 * kernels load as their type (misaligned, undefined behaviour on a CPU, a fault on a GPU). */
static inline bool fl_misaligned(const void *p, size_t align)
{
    return ((uintptr_t)p & (align - 1)) != 0;
}

/* Whether the byte ranges [a, a + na) and [b, b + nb) share a byte (an empty range shares none). */
static inline bool fl_ranges_overlap(const void *a, size_t na, const void *b, size_t nb)
{
    const uintptr_t alo = (uintptr_t)a, blo = (uintptr_t)b;
    return na > 0 && nb > 0 && alo < blo + nb && blo < alo + na;
}

/* The smallest power of two >= v and >= lo (lo a power of two >= 1). */
static inline int64_t fl_pow2_at_least(int64_t v, int64_t lo)
{
    int64_t p = lo;
    while (p < v) p *= 2;
    return p;
}

/* 64-byte aligned allocation for kernel buffers (one cache line, AVX-512 width). */
void *fl_aligned_alloc(size_t bytes);
void fl_aligned_free(void *p);

#endif
