#include "report.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

int latencies_add(latencies *l, double us)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 1024;
        double *p = realloc(l->us, cap * sizeof *p);
        if (!p) return -1;
        l->us = p;
        l->cap = cap;
    }
    l->us[l->n++] = us;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double latencies_percentile(const latencies *l, double p)
{
    if (l->n == 0) return 0.0;
    double *s = malloc(l->n * sizeof *s);
    if (!s) return 0.0;
    memcpy(s, l->us, l->n * sizeof *s);
    qsort(s, l->n, sizeof *s, cmp_double);
    size_t rank = (size_t)(p / 100.0 * (double)l->n + 0.999999); /* nearest rank, 1-based */
    if (rank < 1) rank = 1;
    if (rank > l->n) rank = l->n;
    double v = s[rank - 1];
    free(s);
    return v;
}

void latencies_free(latencies *l)
{
    free(l->us);
    memset(l, 0, sizeof *l);
}

void progress_start(progress *p, size_t total)
{
    memset(p, 0, sizeof *p);
    p->start_us = now_us();
    p->total = total;
    p->enabled = isatty(STDERR_FILENO);
}

void progress_update(progress *p, size_t done)
{
    if (!p->enabled) return;
    double t = now_us();
    if (t - p->start_us < 1e6 || t - p->last_draw_us < 1e5) return;
    p->last_draw_us = t;
    p->drawn = 1;
    int width = 40, fill = p->total ? (int)((double)done / (double)p->total * width) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    fprintf(stderr, "\r[%s] %zu/%zu  %.1f s", bar, done, p->total, (t - p->start_us) / 1e6);
    fflush(stderr);
}

void progress_finish(progress *p)
{
    if (p->drawn) fprintf(stderr, "\r\033[K");
}
