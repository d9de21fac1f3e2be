/* The engine options behind the opaque flame_config (shared by api and engine). */
#ifndef FLAME_CORE_OPTIONS_H
#define FLAME_CORE_OPTIONS_H

#include "core/common.h"

struct flame_config {
    char device[32];      /* "cpu", "auto", "cuda", "cuda:N" */
    int64_t max_batch;    /* requests per pass */
    int64_t score_chunk;  /* rows gathered at once by the dot head */
};

void fl_config_defaults(struct flame_config *c);

#endif
