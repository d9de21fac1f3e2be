/* Scans over id arrays (contract in kernels.h): written without early exits so the compiler
 * vectorises them (AVX-512, AVX2 and baseline clones, picked at load time); a full catalogue
 * of candidates is scanned twice per request (range check, contiguity), 12,103 ids in about
 * a microsecond each. */
#include "cpu/clones.h"
#include "cpu/kernels.h"


#define CHUNK 2048 /* ids scanned between exits: a bad id is found without reading the rest */

FL_CLONES int64_t fl_cpu_first_out_of_range(const int64_t *ids, size_t n, int64_t limit)
{
    for (size_t i0 = 0; i0 < n; i0 += CHUNK) {
        const size_t i1 = n - i0 < CHUNK ? n : i0 + CHUNK;
        uint64_t bad = 0;
        for (size_t i = i0; i < i1; i++) bad |= (uint64_t)ids[i] >= (uint64_t)limit; /* negatives wrap high */
        if (bad)
            for (size_t i = i0; i < i1; i++)
                if (ids[i] < 0 || ids[i] >= limit) return (int64_t)i;
    }
    return -1;
}

FL_CLONES bool fl_cpu_ids_contiguous(const int64_t *ids, size_t n)
{
    if (n == 0) return true;
    const uint64_t first = (uint64_t)ids[0];
    for (size_t i0 = 0; i0 < n; i0 += CHUNK) {
        const size_t i1 = n - i0 < CHUNK ? n : i0 + CHUNK;
        uint64_t diff = 0;
        for (size_t i = i0; i < i1; i++) diff |= (uint64_t)ids[i] ^ (first + (uint64_t)i);
        if (diff) return false;
    }
    return true;
}
