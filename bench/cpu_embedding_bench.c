/* cpu-embedding-bench: the CPU table-batched embedding bag (src/cpu/embedding.c) on float32
 * tables, on fp16 and bf16 tables (widened to float32 as they are read, src/cpu/half.c) and on
 * int8 row-wise quantized tables (docs/model-format.md, "int8 tables").
 *
 *   bench/cpu-embedding-bench [--json] [--reps N] [--rows R] [--dtypes fp32,fp16,bf16,int8]
 *
 * Cases: T4 tables x R rows (250000 by default: 1 GB of float32 rows at D256, far beyond the
 * caches), B2048 bags per table of P20 uniform ids, sum pooling, one call for all tables,
 * output [B, T*D] float32 (concatenated, as FBGEMM TBE lays it out); D 64, 128, 256, each
 * with float32, fp16, bf16 and int8 tables (half the rows' bytes of float32 for fp16 and bf16,
 * a quarter for int8). One thread (the kernel is single-threaded; the engine calls it once per
 * request part). Each time is the median over --reps calls, each on another id set, the calls
 * of the dtypes alternating (a shared machine's load hits all alike; --dtypes picks some, in
 * this order, e.g. fp32,int8 for the alternation of the runs before fp16 and bf16 existed). GB/s = bytes of the
 * rows read (int8: the values plus the 8-byte (scale, bias) of each row) / time; lookups/s =
 * ids / time. Before timing, every case is checked against a float64 reference on every bag of
 * one call. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/kernels.h"
#include "cli_args.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct result {
    const char *dtype;
    int D;
    double us, gbps, mlookups, max_rel_err;
    int ok;
} result;

enum { T = 4, B = 2048, P = 20, SETS = 4 };
enum { FP32 = 0, FP16 = 1, BF16 = 2, INT8 = 3, KINDS = 4 };
static const char *const kind_name[KINDS] = {"fp32", "fp16", "bf16", "int8"};

/* One case's tables, id sets and output. */
typedef struct bench_case {
    int kind, D;
    int64_t rows;
    float *ftab[T], *qp[T], *out;
    int8_t *qtab[T];
    uint16_t *htab[T];
    int64_t *off, *ids[SETS][T];
    fl_emb_feature fe[SETS][T];
    double *t;
} bench_case;

/* The float32 value of element i of a half table (widened exactly). */
static double half_at(const bench_case *c, int f, size_t i)
{
    float v = 0.0f;
    fl_cpu_add_row_half(&v, c->htab[f] + i, 1, 1.0f, c->kind == BF16 ? FL_HALF_BF16 : FL_HALF_F16);
    return v;
}

static void setup_case(bench_case *c, int kind, int D, int64_t rows, int reps)
{
    memset(c, 0, sizeof *c);
    c->kind = kind, c->D = D, c->rows = rows;
    const size_t n = (size_t)rows * D;
    for (int f = 0; f < T; f++) {
        if (kind == FP16 || kind == BF16) { /* uniform float32 values rounded to the format */
            float *v = malloc(n * sizeof(float));
            for (size_t i = 0; i < n; i++) v[i] = (float)((next_u64() >> 40) * (2.0 / 16777216.0) - 1.0);
            c->htab[f] = malloc(n * sizeof(uint16_t));
            fl_cpu_round_half(c->htab[f], v, (int64_t)n, kind == BF16 ? FL_HALF_BF16 : FL_HALF_F16);
            free(v);
        } else if (kind == INT8) {
            c->qtab[f] = malloc(n);
            c->qp[f] = malloc((size_t)rows * 2 * sizeof(float));
            for (size_t i = 0; i < n; i++) c->qtab[f][i] = (int8_t)(next_u64() & 255);
            for (int64_t k = 0; k < rows; k++) {
                c->qp[f][2 * k] = (float)((next_u64() >> 40) * (0.01 / 16777216.0));
                c->qp[f][2 * k + 1] = (float)((next_u64() >> 40) * (2.0 / 16777216.0) - 1.0);
            }
        } else {
            c->ftab[f] = malloc(n * sizeof(float));
            for (size_t i = 0; i < n; i++) c->ftab[f][i] = (float)((next_u64() >> 40) * (2.0 / 16777216.0) - 1.0);
        }
    }
    c->off = malloc((B + 1) * sizeof(int64_t));
    for (int b = 0; b <= B; b++) c->off[b] = (int64_t)b * P;
    for (int s = 0; s < SETS; s++)
        for (int f = 0; f < T; f++) {
            c->ids[s][f] = malloc((size_t)B * P * sizeof(int64_t));
            for (int i = 0; i < B * P; i++) c->ids[s][f][i] = (int64_t)(next_u64() % (uint64_t)rows);
            c->fe[s][f] = (fl_emb_feature){.table = c->ftab[f], .rows = rows, .dim = D, .pooling = FL_KPOOL_SUM,
                                           .offsets = c->off, .ids = c->ids[s][f], .out_col = f * D,
                                           .table_q8 = c->qtab[f], .qparams = c->qp[f], .table_h16 = c->htab[f],
                                           .h16_kind = kind == BF16 ? FL_HALF_BF16 : FL_HALF_F16};
        }
    c->out = malloc((size_t)B * T * D * sizeof(float));
    c->t = malloc((size_t)reps * sizeof(double));
}

/* Checks one call against float64 (every bag); returns the normwise relative error. */
static double check_case(bench_case *c)
{
    const int W = T * c->D, D = c->D;
    for (size_t i = 0; i < (size_t)B * W; i++) c->out[i] = NAN;
    fl_cpu_embedding_bag(c->fe[0], T, B, c->out, W, W);
    double num = 0, den = 0;
    for (int b = 0; b < B; b++)
        for (int f = 0; f < T; f++)
            for (int j = 0; j < D; j++) {
                double want = 0;
                for (int p = 0; p < P; p++) {
                    const int64_t id = c->ids[0][f][b * P + p];
                    want += c->kind == INT8   ? (double)c->qp[f][2 * id] * c->qtab[f][id * D + j] + c->qp[f][2 * id + 1]
                            : c->kind == FP32 ? (double)c->ftab[f][id * D + j]
                                              : half_at(c, f, (size_t)(id * D + j));
                }
                const double got = c->out[(size_t)b * W + f * D + j];
                if (isnan(got)) num = INFINITY;
                num = fmax(num, fabs(got - want));
                den = fmax(den, fabs(want));
            }
    return num / den;
}

static void time_call(bench_case *c, int i)
{
    const int W = T * c->D;
    const double t0 = now();
    fl_cpu_embedding_bag(c->fe[(i + 1) % SETS], T, B, c->out, W, W);
    c->t[i] = now() - t0;
}

static result finish_case(bench_case *c, int reps, double err)
{
    result r = {kind_name[c->kind], c->D, 0, 0, 0, err, err < 1e-5};
    qsort(c->t, (size_t)reps, sizeof *c->t, cmp_double);
    const double sec = reps % 2 ? c->t[reps / 2] : 0.5 * (c->t[reps / 2 - 1] + c->t[reps / 2]);
    const double lookups = (double)T * B * P;
    r.us = sec * 1e6;
    r.gbps = lookups * (c->kind == INT8 ? c->D + 8.0 : c->kind == FP32 ? 4.0 * c->D : 2.0 * c->D) / sec / 1e9;
    r.mlookups = lookups / sec / 1e6;
    free(c->t);
    free(c->out);
    free(c->off);
    for (int s = 0; s < SETS; s++)
        for (int f = 0; f < T; f++) free(c->ids[s][f]);
    for (int f = 0; f < T; f++) {
        free(c->ftab[f]);
        free(c->qtab[f]);
        free(c->qp[f]);
        free(c->htab[f]);
    }
    return r;
}

int main(int argc, char **argv)
{
    int json = 0, reps = 15;
    int64_t rows = 250000;
    bool use[KINDS] = {true, true, true, true};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            { long long v_; if (!cli_int("cpu-embedding-bench", "--reps", argv[++i], 1, 1000000, &v_)) return 2; reps = (int)v_; }
        else if (!strcmp(argv[i], "--rows") && i + 1 < argc)
            { long long v_; if (!cli_int("cpu-embedding-bench", "--rows", argv[++i], 1, 1LL << 31, &v_)) return 2; rows = (int64_t)v_; }
        else if (!strcmp(argv[i], "--dtypes") && i + 1 < argc) {
            char list[64];
            snprintf(list, sizeof list, "%s", argv[++i]);
            memset(use, 0, sizeof use);
            for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
                int k = 0;
                while (k < KINDS && strcmp(tok, kind_name[k])) k++;
                if (k == KINDS) {
                    fprintf(stderr, "cpu-embedding-bench: --dtypes: %s is none of fp32, fp16, bf16, int8\n", tok);
                    return 2;
                }
                use[k] = true;
            }
        } else {
            fprintf(stderr, "usage: cpu-embedding-bench [--json] [--reps N] [--rows R] [--dtypes fp32,fp16,bf16,int8]\n");
            return 2;
        }
    }
    if (reps < 1 || rows < 1) {
        fprintf(stderr, "cpu-embedding-bench: --reps and --rows must be positive\n");
        return 2;
    }
    static const int dims[] = {64, 128, 256};
    result res[3 * KINDS];
    int k = 0, all_ok = 1;
    for (int d = 0; d < 3; d++) { /* the dtypes' calls alternate, so all see the same machine */
        bench_case c[KINDS];
        double err[KINDS];
        for (int kind = 0; kind < KINDS; kind++) {
            if (!use[kind]) continue;
            setup_case(&c[kind], kind, dims[d], rows, reps);
            err[kind] = check_case(&c[kind]);
        }
        for (int i = 0; i < reps; i++)
            for (int kind = 0; kind < KINDS; kind++)
                if (use[kind]) time_call(&c[kind], i);
        for (int kind = 0; kind < KINDS; kind++) {
            if (!use[kind]) continue;
            res[k] = finish_case(&c[kind], reps, err[kind]);
            all_ok = all_ok && res[k].ok;
            k++;
        }
    }
    if (json) {
        printf("{\"rows_per_table\":%lld,\"T\":%d,\"B\":%d,\"P\":%d,\"reps\":%d,\"correct\":%s,\"cases\":[", (long long)rows,
               T, B, P, reps, all_ok ? "true" : "false");
        for (int i = 0; i < k; i++)
            printf("%s{\"dtype\":\"%s\",\"D\":%d,\"us\":%.1f,\"gbps\":%.2f,\"mlookups_per_s\":%.2f,\"max_rel_err\":%.3g,"
                   "\"correct\":%s}",
                   i ? "," : "", res[i].dtype, res[i].D, res[i].us, res[i].gbps, res[i].mlookups, res[i].max_rel_err,
                   res[i].ok ? "true" : "false");
        printf("]}\n");
    } else {
        printf("T%d x %lld rows, B%d P%d, sum pooling, 1 thread, median of %d calls\n", T, (long long)rows, B, P, reps);
        printf("%-6s %5s %10s %8s %12s %s\n", "dtype", "D", "us", "GB/s", "Mlookups/s", "check");
        for (int i = 0; i < k; i++)
            printf("%-6s %5d %10.1f %8.2f %12.2f %s (max rel err %.2g)\n", res[i].dtype, res[i].D, res[i].us,
                   res[i].gbps, res[i].mlookups, res[i].ok ? "ok" : "WRONG", res[i].max_rel_err);
    }
    return all_ok ? 0 : 1;
}
