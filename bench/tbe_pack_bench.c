/* tbe-pack-bench: the host side of a GPU embedding bag forward on host ids, which validates
 * every offset, id and weight and packs them into the page-locked staging block
 * (fl_tbe_check_pack, src/kernels/tbe_pack.c), against two peers in the same run:
 *   memcpy       a plain copy of the same arrays into the same buffer (the floor: what staging
 *                costs with no check at all);
 *   two-pass     the bag-by-bag check the host path made before, then the same memcpy.
 *
 *   bench/tbe-pack-bench [--json] [--reps N] [--threads N]
 *
 * Case T26 B4096 P20: 26 tables of 2^20 rows, 4096 bags of 20 uniform ids each (2.1M ids,
 * 17 MB), no weights; fl_tbe_check_pack on 1 thread and on --threads (default 2). The buffer is
 * ordinary host memory (page-locked memory is written at the same speed by the CPU). Times are
 * medians over --reps (default 21) runs, the cases interleaved so that a shared machine's load
 * hits all alike; the packed bytes are compared with the inputs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/tbe_pack.h"
#include "cli_args.h"

#define T 26
#define B 4096
#define P 20

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static void copy_all(const fl_tbe_lookup *lk, unsigned char *dst, const size_t *at)
{
    for (int t = 0; t < T; t++) {
        memcpy(dst + at[3 * t], lk[t].ids, (size_t)lk[t].num_ids * sizeof(int64_t));
        memcpy(dst + at[3 * t + 1], lk[t].offsets, (B + 1) * sizeof(int64_t));
    }
}

/* the former host path: offsets, then each bag's ids in order, then the copy */
static int two_pass(const fl_tbe_table *tab, const fl_tbe_lookup *lk, unsigned char *dst, const size_t *at)
{
    for (int t = 0; t < T; t++) {
        const fl_tbe_lookup *l = &lk[t];
        if (l->offsets[0] != 0) return 1;
        for (int64_t b = 0; b < B; b++)
            if (l->offsets[b + 1] < l->offsets[b] || l->offsets[b + 1] > l->num_ids) return 1;
        if (l->offsets[B] != l->num_ids) return 1;
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = l->offsets[b]; i < l->offsets[b + 1]; i++)
                if (l->ids[i] < 0 || l->ids[i] >= tab[t].rows) return 1;
    }
    copy_all(lk, dst, at);
    return 0;
}

int main(int argc, char **argv)
{
    int reps = 21, threads = 2, json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            { long long v_; if (!cli_int("tbe-pack-bench", "--reps", argv[++i], 1, 1000000, &v_)) return 2; reps = (int)v_; }
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            { long long v_; if (!cli_int("tbe-pack-bench", "--threads", argv[++i], 1, 256, &v_)) return 2; threads = (int)v_; }
        else {
            fprintf(stderr, "usage: tbe-pack-bench [--json] [--reps N] [--threads N]\n");
            return 2;
        }
    }
    if (reps < 1 || reps > 1000 || threads < 1 || threads > 256) {
        fprintf(stderr, "tbe-pack-bench: --reps 1..1000, --threads 1..256\n");
        return 2;
    }
    fl_tbe_table tab[T];
    fl_tbe_lookup lk[T];
    size_t at[3 * T], total = 0;
    memset(tab, 0, sizeof tab);
    int64_t *ids = malloc((size_t)T * B * P * sizeof(int64_t)), *off = malloc((size_t)T * (B + 1) * sizeof(int64_t));
    if (!ids || !off) return 1;
    uint64_t z = 12345;
    for (size_t i = 0; i < (size_t)T * B * P; i++) {
        z = z * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int64_t)((z >> 20) % (1u << 20));
    }
    for (int t = 0; t < T; t++) {
        for (int b = 0; b <= B; b++) off[(size_t)t * (B + 1) + b] = (int64_t)b * P;
        tab[t].rows = 1 << 20;
        lk[t] = (fl_tbe_lookup){ids + (size_t)t * B * P, off + (size_t)t * (B + 1), (int64_t)B * P, NULL};
        at[3 * t] = total;
        total += (size_t)B * P * sizeof(int64_t);
        at[3 * t + 1] = total;
        total += ((B + 1) * sizeof(int64_t) + 15) & ~(size_t)15;
        at[3 * t + 2] = total;
    }
    unsigned char *dst = malloc(total);
    double *tm = malloc(sizeof(double) * 4 * (size_t)reps);
    if (!dst || !tm) return 1;
    memset(dst, 0, total);
    for (int r = 0; r < reps; r++) {
        double t0 = now_us();
        copy_all(lk, dst, at);
        tm[0 * reps + r] = now_us() - t0;
        t0 = now_us();
        if (two_pass(tab, lk, dst, at)) return 1;
        tm[1 * reps + r] = now_us() - t0;
        t0 = now_us();
        if (fl_tbe_check_pack(tab, lk, T, B, dst, at, 1)) return 1;
        tm[2 * reps + r] = now_us() - t0;
        memset(dst, 0, total);
        t0 = now_us();
        if (fl_tbe_check_pack(tab, lk, T, B, dst, at, threads)) return 1;
        tm[3 * reps + r] = now_us() - t0;
    }
    int ok = 1;
    for (int t = 0; t < T; t++)
        ok = ok && !memcmp(dst + at[3 * t], lk[t].ids, (size_t)B * P * 8) &&
             !memcmp(dst + at[3 * t + 1], lk[t].offsets, (B + 1) * 8);
    const double cp = median(tm, reps), two = median(tm + reps, reps), one = median(tm + 2 * reps, reps),
                 many = median(tm + 3 * reps, reps);
    if (json)
        printf("{\"case\":\"T26_B4096_P20\",\"ids\":%d,\"reps\":%d,\"threads\":%d,\"memcpy_us\":%.1f,"
               "\"two_pass_us\":%.1f,\"check_pack_1_thread_us\":%.1f,\"check_pack_threads_us\":%.1f,"
               "\"check_pack_1_thread_of_memcpy\":%.3f,\"check_pack_1_thread_of_two_pass\":%.3f,\"packed_ok\":%s}\n",
               T * B * P, reps, threads, cp, two, one, many, one / cp, one / two, ok ? "true" : "false");
    else {
        printf("T26 B4096 P20 host ids (%d ids, %.1f MB staged), median of %d\n", T * B * P, total / 1e6, reps);
        printf("memcpy only (peer)            %9.1f us\n", cp);
        printf("two-pass check + memcpy       %9.1f us\n", two);
        printf("check_pack, 1 thread          %9.1f us  (%.2f of memcpy, %.2f of two-pass)\n", one, one / cp, one / two);
        printf("check_pack, %d threads         %9.1f us  (%.2f of memcpy)\n", threads, many, many / cp);
        printf("packed bytes equal the inputs: %s\n", ok ? "yes" : "NO");
    }
    free(tm);
    free(dst);
    free(ids);
    free(off);
    return ok ? 0 : 1;
}
