/* The engine's stage P50s (flame_engine_get_latency, us, since the engine's creation) as one
 * JSON object, {"features":..,"tokens":..,"h2d":..,"compute":..,"d2h":..,"total":..}: where
 * a call's time goes, for the benchmarks that report it. */
#ifndef FLAME_BENCH_STAGE_P50_H
#define FLAME_BENCH_STAGE_P50_H

#include <stdio.h>

#include "flame/flame.h"

/* Writes the object into buf (truncated to cap bytes); the first failing query's status. */
static inline flame_status bench_stage_p50s(flame_engine *e, char *buf, size_t cap)
{
    static const char *const names[] = {"features", "tokens", "h2d", "compute", "d2h", "total"};
    size_t n = (size_t)snprintf(buf, cap, "{");
    for (int k = FLAME_STAGE_FEATURES; k <= FLAME_STAGE_TOTAL && n < cap; k++) {
        flame_latency lt = {.struct_size = sizeof lt};
        const flame_status st = flame_engine_get_latency(e, (flame_stage)k, &lt);
        if (st) return st;
        n += (size_t)snprintf(buf + n, cap - n, "%s\"%s\":%llu", k > FLAME_STAGE_FEATURES ? "," : "",
                              names[k - FLAME_STAGE_FEATURES], (unsigned long long)lt.p50_us);
    }
    if (n < cap) snprintf(buf + n, cap - n, "}");
    return FLAME_OK;
}

#endif
