/* Latency histograms for the scheduler's P50/P99: log-linear buckets of microseconds, 16 per
 * power of two (values below 16 exact), so the bucket a value falls in ends within 1/16 of it.
 * Adds are lock-free (relaxed atomics); a percentile reads the buckets one by one. No C
 * histogram library is packaged by Debian (HdrHistogram exists for Java and Go only). */
#ifndef FLAME_SCHED_LATENCY_H
#define FLAME_SCHED_LATENCY_H

#include <stdatomic.h>
#include <stdint.h>

#define FL_HIST_SUB 16
#define FL_HIST_BUCKETS (FL_HIST_SUB * 41) /* up to 2^44 us (half a year), larger values clamp */

typedef struct fl_histogram {
    _Atomic uint64_t count[FL_HIST_BUCKETS];
    _Atomic uint64_t max;
} fl_histogram;

void fl_hist_add(fl_histogram *h, uint64_t us);
/* The nearest-rank q-quantile (0 < q <= 1) as its bucket's upper end, capped at the largest
 * value seen; 0 for an empty histogram. */
uint64_t fl_hist_quantile(fl_histogram *h, double q);
uint64_t fl_hist_max(fl_histogram *h);
void fl_hist_reset(fl_histogram *h);

/* Bucket arithmetic, exposed for the tests. */
unsigned fl_hist_index(uint64_t us);
uint64_t fl_hist_upper(unsigned index);

#endif
