/* Latency histograms of the engine's stages and the scheduler: log-linear buckets of
 * microseconds, 16 per power of two (values below 16 exact), so the bucket a value falls in
 * ends within 1/16 of it; they give the percentiles, over a window a reset starts anew.
 * Beside them, never reset, the count, the sum and the counts at the Prometheus bucket
 * bounds (FL_PROM_BOUNDS_US, exact: each add bumps the first bound at or above it), which a
 * scrape exports as cumulative `_bucket` series. Adds are lock-free (relaxed atomics); reads
 * take the buckets one by one. No C histogram library is packaged by Debian (HdrHistogram
 * exists for Java and Go only). */
#ifndef FLAME_METRICS_HISTOGRAM_H
#define FLAME_METRICS_HISTOGRAM_H

#include <stdatomic.h>
#include <stdint.h>

#define FL_HIST_SUB 16
#define FL_HIST_BUCKETS (FL_HIST_SUB * 41) /* up to 2^44 us (half a year), larger values clamp */

/* The Prometheus bucket bounds, us (le="5e-06" .. "10"), then +Inf. */
#define FL_PROM_BOUNDS 20
extern const uint64_t FL_PROM_BOUNDS_US[FL_PROM_BOUNDS];

typedef struct fl_histogram {
    _Atomic uint64_t count[FL_HIST_BUCKETS]; /* the window */
    _Atomic uint64_t max;                    /* the window's largest value */
    _Atomic uint64_t total, sum_us;          /* since creation */
    _Atomic uint64_t prom[FL_PROM_BOUNDS + 1]; /* since creation; [FL_PROM_BOUNDS]: above the last bound */
} fl_histogram;

void fl_hist_add(fl_histogram *h, uint64_t us);
/* The nearest-rank q-quantile (0 < q <= 1) of the window as its bucket's upper end, capped at
 * the largest value seen; 0 for an empty window. */
uint64_t fl_hist_quantile(fl_histogram *h, double q);
uint64_t fl_hist_max(fl_histogram *h);
/* Empties the window (the percentiles); the totals and Prometheus counts stay. */
void fl_hist_reset(fl_histogram *h);

/* Microseconds on CLOCK_MONOTONIC: the clock of the stage timers. */
uint64_t fl_now_us(void);

/* Bucket arithmetic, exposed for the tests. */
unsigned fl_hist_index(uint64_t us);
uint64_t fl_hist_upper(unsigned index);

#endif
