/* The cost of a Prometheus scrape (flame_metrics_text of an engine with its scheduler) on an
 * idle process and while client threads keep the scheduler busy: median and P99 of the call,
 * the text's size, and the share of one core that scraping every second takes.
 *   bench/metrics-bench [scrapes] [clients]      (defaults 2000, 2) */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flame/flame.h"
#include "cli_args.h"

/* a small SUMI model without side features: requests of ids only */
static const char *config =
    "{\"format\":\"flame\",\"version\":1,\"d_model\":64,\"max_len\":50,"
    "\"tables\":[{\"name\":\"item\",\"rows\":1000,\"dim\":64}],"
    "\"features\":[{\"name\":\"item\",\"table\":\"item\",\"input\":\"item\"}],"
    "\"position\":{\"rule\":\"from_recent\",\"rows\":51,\"candidate_position\":50},"
    "\"blocks\":{\"count\":2,\"num_heads\":4,\"ffn_dim\":128,\"norm\":\"pre\",\"activation\":\"gelu_erf\"},"
    "\"head\":{\"type\":\"sumi\",\"tasks\":[{\"name\":\"a\",\"hidden\":[]}]}}";

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct client {
    flame_scheduler *s;
    atomic_bool *stop;
    uint64_t done;
    unsigned seed;
} client;

static void *run_client(void *p)
{
    client *c = p;
    int64_t hist[50], cand[64];
    float scores[64 * 8];
    while (!atomic_load(c->stop)) {
        for (int i = 0; i < 50; i++) hist[i] = rand_r(&c->seed) % 1000;
        for (int i = 0; i < 64; i++) cand[i] = rand_r(&c->seed) % 1000;
        flame_request r = {.struct_size = sizeof r, .history = hist, .history_len = 50, .candidates = cand,
                           .num_candidates = 1 + (size_t)(rand_r(&c->seed) % 64)};
        flame_status st = flame_scheduler_score(c->s, &r, scores, sizeof scores / sizeof scores[0]);
        if (st) {
            fprintf(stderr, "score: %s\n", flame_last_error());
            exit(1);
        }
        c->done++;
    }
    return NULL;
}

static void scrape(const flame_metrics_sources *src, int n, const char *label)
{
    size_t need = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    double *t = malloc((size_t)n * sizeof *t);
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        flame_status st = flame_metrics_text(src, buf, cap, &need);
        t[i] = now_us() - t0;
        if (st) {
            fprintf(stderr, "metrics: %s\n", flame_last_error());
            exit(1);
        }
    }
    qsort(t, (size_t)n, sizeof *t, cmp);
    printf("%-22s scrapes %d  median %.1f us  p99 %.1f us  text %zu bytes  every 1 s: %.4f%% of a core\n", label, n,
           t[n / 2], t[n * 99 / 100], need - 1, t[n / 2] / 1e6 * 100);
    free(t);
    free(buf);
}

int main(int argc, char **argv)
{
    long long n = 2000, clients = 2; /* metrics-bench [SCRAPES [CLIENTS]] */
    if ((argc > 1 && !cli_int("metrics-bench", "SCRAPES", argv[1], 1, 10000000, &n)) ||
        (argc > 2 && !cli_int("metrics-bench", "CLIENTS", argv[2], 0, 64, &clients)))
        return 2;
    flame_model *m = NULL;
    flame_engine *e = NULL;
    flame_scheduler *s = NULL;
    if (flame_model_create_random(config, 1, &m) || flame_engine_create(m, NULL, &e) ||
        flame_scheduler_create(e, NULL, &s)) {
        fprintf(stderr, "setup: %s\n", flame_last_error());
        return 1;
    }
    flame_metrics_sources src = {.struct_size = sizeof src, .engine = e, .scheduler = s};
    atomic_bool stop = false;
    client c[16] = {{0}};
    pthread_t th[16];
    for (int i = 0; i < clients && i < 16; i++) { /* warm the histograms, then measure idle */
        c[i] = (client){.s = s, .stop = &stop, .seed = 7u + (unsigned)i};
        pthread_create(&th[i], NULL, run_client, &c[i]);
    }
    double t0 = now_us();
    scrape(&src, n, "busy (clients scoring)");
    double busy_s = (now_us() - t0) / 1e6;
    atomic_store(&stop, true);
    uint64_t done = 0;
    for (int i = 0; i < clients && i < 16; i++) pthread_join(th[i], NULL), done += c[i].done;
    printf("%-22s %llu requests scored meanwhile (%.0f/s)\n", "", (unsigned long long)done, done / busy_s);
    scrape(&src, n, "idle");
    flame_scheduler_destroy(s);
    flame_engine_destroy(e);
    flame_model_destroy(m);
    return 0;
}
