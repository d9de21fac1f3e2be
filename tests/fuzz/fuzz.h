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

/* Scores one request (history and candidate item 0, every side bag empty) on a CPU engine of
 * the model, so the shapes an accepted model implies are run under the sanitizers, not only
 * parsed. The scores are not judged: finite weights of any size are a valid model. */
static inline void fz_score_once(flame_model *m)
{
    flame_model_info info = {.struct_size = sizeof info};
    FZ_ASSERT(flame_model_get_info(m, &info) == FLAME_OK, "%s", flame_last_error());
    if (info.num_tasks > 64 || info.num_side_features > 64) return;
    flame_engine *e = NULL;
    flame_status st = flame_engine_create(m, NULL, &e);
    FZ_CHECK_ERROR(st);
    if (st) return;
    int64_t item[2] = {0, 0}, zero[3] = {0, 0, 0};
    flame_bags bags[64];
    for (int i = 0; i < 64; i++) bags[i] = (flame_bags){.offsets = zero, .ids = item};
    flame_request r = {.struct_size = sizeof r, .history = item, .history_len = 2, .candidates = item,
                       .num_candidates = 1, .history_side = bags, .candidate_side = bags,
                       .num_side_features = (size_t)info.num_side_features};
    float out[64];
    st = flame_score(e, &r, out, 64);
    FZ_CHECK_ERROR(st);
    flame_engine_destroy(e);
}

#endif
