/* Size classes of the pinned pool, in pages: exact up to 16 pages, then 8 classes per power of
 * two (2^k * 9/8, 10/8, ..., 16/8), so a class exceeds the pages asked for by < 12.5%. A plain
 * power-of-two rounding would nearly double large requests (8.7 GB -> 16 GiB). */
#ifndef FLAME_MEM_SIZE_CLASS_H
#define FLAME_MEM_SIZE_CLASS_H

#include <stdint.h>

#define FL_EXACT_CLASSES 16u
#define FL_SUBCLASS_BITS 3u /* 8 classes per power of two */
/* pages up to 2^36 (2^48 bytes of 4 KiB pages): 16 exact + 8 per power from 2^4 to 2^36 */
#define FL_MAX_CLASS_PAGES (1ull << 36)
#define FL_NUM_CLASSES (FL_EXACT_CLASSES + (36u - 4u) * 8u)

/* Class index of a request of `pages` (1..FL_MAX_CLASS_PAGES). */
static inline uint32_t fl_size_class(uint64_t pages)
{
    if (pages <= FL_EXACT_CLASSES) return (uint32_t)pages - 1;
    uint32_t k = 63u - (uint32_t)__builtin_clzll(pages - 1); /* 2^k < pages <= 2^(k+1), k >= 4 */
    uint32_t shift = k - FL_SUBCLASS_BITS;
    uint64_t q = (pages + (1ull << shift) - 1) >> shift; /* 9..16 */
    return FL_EXACT_CLASSES + (k - 4u) * 8u + (uint32_t)(q - 9);
}

/* Pages of class `c` (the inverse: fl_class_pages(fl_size_class(n)) >= n). */
static inline uint64_t fl_class_pages(uint32_t c)
{
    if (c < FL_EXACT_CLASSES) return (uint64_t)c + 1;
    uint32_t k = (c - FL_EXACT_CLASSES) / 8u + 4u, q = (c - FL_EXACT_CLASSES) % 8u + 9u;
    return (uint64_t)q << (k - FL_SUBCLASS_BITS);
}

#endif
