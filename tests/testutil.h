/* Helpers shared by the C tests (cmocka). Header-only so each test is one file. */
#ifndef FLAME_TESTUTIL_H
#define FLAME_TESTUTIL_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "flame/flame.h"

/* The optional modules the library under test was built with (the Makefile says; a test built
 * by hand assumes the full library). */
#ifndef FLAME_WITH_REDIS
#define FLAME_WITH_REDIS 1
#endif
#ifndef FLAME_WITH_NUMA
#define FLAME_WITH_NUMA 1
#endif

/* Fresh inputs each run unless FLAME_TEST_SEED pins them; the seed is printed on failure
 * paths through the test name so a run can be replayed. */
static uint64_t tu_rng_state;
static inline void tu_seed(void)
{
    const char *s = getenv("FLAME_TEST_SEED");
    tu_rng_state = s ? strtoull(s, NULL, 10) : ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL);
    fprintf(stderr, "# random seed %llu (set FLAME_TEST_SEED to replay)\n", (unsigned long long)tu_rng_state);
}
static inline uint64_t tu_u64(void)
{
    uint64_t z = (tu_rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* uniform in [-1, 1) */
static inline float tu_uniform(void)
{
    return (float)((double)(tu_u64() >> 11) / 4503599627370496.0 - 1.0);
}
static inline int64_t tu_below(int64_t n)
{
    return (int64_t)(tu_u64() % (uint64_t)n);
}
static inline void tu_fill(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = tu_uniform();
}
/* Outputs are poisoned before a run so an unwritten element can never pass. */
static inline void tu_poison(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

/* max |got - want| / max |want| over n values (normwise relative error); NaN anywhere gives
 * INFINITY so it can never pass a bound. */
static inline double tu_rel_err(const float *got, const double *want, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(want[i])) return INFINITY;
        double d = fabs((double)got[i] - want[i]);
        if (d > num) num = d;
        if (fabs(want[i]) > den) den = fabs(want[i]);
    }
    return den > 0 ? num / den : num;
}

#define assert_rel_err_below(got, want, n, bound)                                                                  \
    do {                                                                                                         \
        double e_ = tu_rel_err((got), (want), (n));                                                              \
        if (!(e_ < (bound))) fail_msg("relative error %.3g >= %.3g", e_, (double)(bound));                       \
    } while (0)

/* Asserts a status and that flame_last_error() contains `needle`. */
#define assert_status_msg(call, status, needle)                                                                  \
    do {                                                                                                         \
        flame_status s_ = (call);                                                                                \
        if (s_ != (status))                                                                                      \
            fail_msg("%s returned %s (%s), expected %s", #call, flame_status_string(s_), flame_last_error(),    \
                     flame_status_string(status));                                                               \
        if (!strstr(flame_last_error(), (needle)))                                                               \
            fail_msg("message '%s' does not contain '%s'", flame_last_error(), (needle));                        \
    } while (0)

/* A per-process scratch directory for generated files. */
static inline const char *tu_tmpdir(void)
{
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/flame-test-XXXXXX");
        if (!mkdtemp(dir)) abort();
    }
    return dir;
}

/* Writes `text` to tu_tmpdir()/name; returns the path (a static buffer: the next call reuses it). */
static inline const char *tu_write_text(const char *name, const char *text)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), name);
    FILE *f = fopen(path, "w");
    if (!f) abort();
    fputs(text, f);
    fclose(f);
    return path;
}

/* Writes a safetensors file: an 8-byte length (header_len_override if non-zero, else the
 * real length), the header text, then `data`. Returns the path (static buffer per call site
 * is not needed: the caller passes `name`). */
static inline const char *tu_write_st(const char *name, const char *header, uint64_t header_len_override,
                                      const void *data, size_t data_len)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), name);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    /* pad the header with spaces to a multiple of 8, as safetensors writers do, so the data
     * buffer is aligned (F32 tensors are then used in place) */
    size_t pad = header_len_override ? 0 : (8 - strlen(header) % 8) % 8;
    uint64_t n = header_len_override ? header_len_override : strlen(header) + pad;
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    fwrite("        ", 1, pad, f);
    if (data_len) fwrite(data, 1, data_len, f);
    fclose(f);
    return path;
}

#endif
