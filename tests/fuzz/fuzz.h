/* Shared by the libFuzzer harnesses: inputs handed to path-taking parsers through an
 * anonymous in-memory file, and failing loudly on a broken invariant. */
#ifndef FLAME_FUZZ_H
#define FLAME_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "flame/flame.h"

/* The path of an in-memory file holding data[0..n) (valid until fz_file_close). */
typedef struct fz_file {
    int fd;
    char path[64];
} fz_file;

static inline int fz_file_open(fz_file *f, const uint8_t *data, size_t n)
{
    f->fd = memfd_create("flame-fuzz", 0);
    if (f->fd < 0) return -1;
    for (size_t done = 0; done < n;) {
        ssize_t w = write(f->fd, data + done, n - done);
        if (w <= 0) {
            close(f->fd);
            return -1;
        }
        done += (size_t)w;
    }
    snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
    return 0;
}

static inline void fz_file_close(fz_file *f)
{
    close(f->fd);
}

/* Reads n bytes (so ASan checks them) without the compiler dropping the reads. */
static volatile uint8_t fz_sink;
static inline void fz_touch(const void *p, size_t n)
{
    uint8_t x = 0;
    for (size_t i = 0; i < n; i++) x ^= ((const uint8_t *)p)[i];
    fz_sink = x;
}

/* A broken invariant is a finding: abort so that libFuzzer keeps the input. */
#define FZ_ASSERT(cond, ...)                                                 \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "invariant broken: %s: ", #cond);                 \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
            abort();                                                          \
        }                                                                     \
    } while (0)

/* A failure must say why. */
#define FZ_CHECK_ERROR(st) FZ_ASSERT((st) == FLAME_OK || flame_last_error()[0], "status %d without a message", (int)(st))

#endif
