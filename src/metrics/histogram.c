/* Log-linear latency histogram (histogram.h). Index of v >= 16 with e = floor(log2 v): the top 5
 * bits of v, i.e. 16 + m with m = the 4 bits below the leading one, in group e - 3. */
#include <time.h>

#include "metrics/histogram.h"

uint64_t fl_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

unsigned fl_hist_index(uint64_t us)
{
    if (us < FL_HIST_SUB) return (unsigned)us;
    unsigned e = 63u - (unsigned)__builtin_clzll(us);
    unsigned idx = FL_HIST_SUB * (e - 3) + (unsigned)((us >> (e - 4)) & (FL_HIST_SUB - 1));
    return idx < FL_HIST_BUCKETS ? idx : FL_HIST_BUCKETS - 1;
}

uint64_t fl_hist_upper(unsigned index)
{
    if (index < FL_HIST_SUB) return index;
    unsigned e = index / FL_HIST_SUB + 3, m = index % FL_HIST_SUB;
    return ((uint64_t)(FL_HIST_SUB + m) << (e - 4)) + (1ull << (e - 4)) - 1;
}

const uint64_t FL_PROM_BOUNDS_US[FL_PROM_BOUNDS] = {5,      10,     25,     50,      100,     250,     500,
                                                    1000,   2500,   5000,   10000,   25000,   50000,   100000,
                                                    250000, 500000, 1000000, 2500000, 5000000, 10000000};

static unsigned prom_index(uint64_t us)
{
    unsigned i = 0;
    while (i < FL_PROM_BOUNDS && us > FL_PROM_BOUNDS_US[i]) i++;
    return i;
}

void fl_hist_add(fl_histogram *h, uint64_t us)
{
    atomic_fetch_add_explicit(&h->count[fl_hist_index(us)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->prom[prom_index(us)], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_us, us, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->total, 1, memory_order_relaxed);
    uint64_t m = atomic_load_explicit(&h->max, memory_order_relaxed);
    while (us > m && !atomic_compare_exchange_weak_explicit(&h->max, &m, us, memory_order_relaxed,
                                                            memory_order_relaxed)) {
    }
}

uint64_t fl_hist_max(fl_histogram *h)
{
    return atomic_load_explicit(&h->max, memory_order_relaxed);
}

uint64_t fl_hist_quantile(fl_histogram *h, double q)
{
    uint64_t n = 0, counts[FL_HIST_BUCKETS];
    for (unsigned i = 0; i < FL_HIST_BUCKETS; i++) n += counts[i] = atomic_load_explicit(&h->count[i], memory_order_relaxed);
    if (n == 0) return 0;
    uint64_t rank = (uint64_t)(q * (double)n);
    if ((double)rank < q * (double)n) rank++; /* ceil: nearest rank */
    if (rank < 1) rank = 1;
    uint64_t seen = 0, max = fl_hist_max(h);
    for (unsigned i = 0; i < FL_HIST_BUCKETS; i++) {
        seen += counts[i];
        if (seen >= rank) {
            uint64_t up = fl_hist_upper(i);
            return up < max ? up : max;
        }
    }
    return max;
}

void fl_hist_reset(fl_histogram *h)
{
    for (unsigned i = 0; i < FL_HIST_BUCKETS; i++) atomic_store_explicit(&h->count[i], 0, memory_order_relaxed);
    atomic_store_explicit(&h->max, 0, memory_order_relaxed);
}
