/* Timing, percentiles and the progress bar shared by the flame-score modes. */
#ifndef FLAME_SCORE_REPORT_H
#define FLAME_SCORE_REPORT_H

#include <stddef.h>
#include <stdint.h>

double now_us(void);

/* Latency samples in us; percentile by nearest rank on a sorted copy. */
typedef struct latencies {
    double *us;
    size_t n, cap;
} latencies;
int latencies_add(latencies *l, double us);
double latencies_percentile(const latencies *l, double p);
void latencies_free(latencies *l);

/* A progress bar on stderr, drawn only when stderr is a terminal and the run has lasted
 * more than a second. */
typedef struct progress {
    double start_us, last_draw_us;
    size_t total;
    int enabled, drawn;
} progress;
void progress_start(progress *p, size_t total);
void progress_update(progress *p, size_t done);
void progress_finish(progress *p);

#endif
