/* Internals of the metrics: stage names, latency snapshots, and the text buffer the
 * Prometheus exposition is written into. */
#ifndef FLAME_METRICS_METRICS_H
#define FLAME_METRICS_METRICS_H

#include "core/common.h"
#include "metrics/histogram.h"

/* The stage's label value ("queue_wait", "features", ...). */
const char *fl_stage_name(flame_stage stage);
/* A histogram as the public struct (count and sum since creation, percentiles of the window). */
void fl_latency_of(fl_histogram *h, flame_latency *out);
/* A scheduler's histogram of a stage; NULL for a stage it does not time. */
fl_histogram *fl_scheduler_stage(flame_scheduler *s, flame_stage stage);

/* A growing text buffer; `failed` once an allocation failed (the text is then dropped). */
typedef struct fl_text {
    char *p;
    size_t len, cap;
    bool failed;
} fl_text;

void fl_text_printf(fl_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
