/* Shared by the two parts of e2e-bench: the options, the request sets, small helpers. */
#ifndef FLAME_BENCH_E2E_H
#define FLAME_BENCH_E2E_H

#include <stddef.h>
#include <stdint.h>

#include "flame/flame.h"

#define MAX_SLOTS 64

typedef struct options {
    const char *model, *config, *sequences, *device, *dtype, *via;
    size_t users, history, history_min, candidates, calls, warmup, bag, sets, graphs, portable_attention, topk;
    size_t clients, sched_users, sched_candidates, max_wait_us, workers;
    uint64_t seed;
    int all_items, json;
} options;

typedef struct tokens {
    int64_t *off[MAX_SLOTS], *ids[MAX_SLOTS];
    flame_bags bags[MAX_SLOTS];
} tokens;

typedef struct request_set {
    flame_request *reqs;
    size_t n, candidates; /* requests, candidates in all */
    tokens *hist, *cand;
} request_set;

double now_us(void);
void *xmalloc(size_t n);
int cmp_double(const void *a, const void *b);
double percentile(const double *sorted, size_t n, double p);

/* --clients mode (e2e_clients.c): prints one JSON object (or a line of text); 0 on success. */
int run_clients(const options *o, flame_engine *engine, const flame_model_info *info, const request_set *sets,
                size_t num_sets);

#endif
