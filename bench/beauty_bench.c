/* beauty-bench: times libflame through the public C API on a flame model file and a
 * sequences file (Beauty.txt: `user item item ...` per line), the way a server would use it.
 *
 *   batch 1   flame_score, one user per call: history = every item of the line but the last
 *             (leave-last-out), candidates = every item id 0..num_items-1. `--users N` users
 *             spread evenly over the file (line floor(i * lines / N)), after `--warmup W`
 *             untimed calls. Reports P50/P90/P99/mean latency in microseconds.
 *   batch B   flame_score_batch with B users per call (consecutive lines, wrapping around),
 *             the same candidates for every user; `--batch-users U` users in all after one
 *             untimed warm-up batch. Reports users/s and the per-call P50.
 *
 * Prints one JSON object on stdout, with the kernels the engine chose ("cpu_kernels", its
 * debug log line; `--cpu-kernels` sets FLAME_OPT_CPU_KERNELS). Threads: FLAME_OPT_THREADS
 * defaults to OPENBLAS_NUM_THREADS
 * (bench/run_cpu_bench.py sets 2). bench/onnx_beauty.py selects the same users. */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "flame/flame.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of a sorted array (the same rule as bench/onnx_beauty.py). */
static double percentile(const double *sorted, size_t n, double p)
{
    if (n == 0) return 0.0;
    size_t rank = (size_t)(p / 100.0 * (double)n + 0.999999);
    if (rank < 1) rank = 1;
    if (rank > n) rank = n;
    return sorted[rank - 1];
}

/* ---------------------------------------------------------------- sequences */

typedef struct sequences {
    int64_t *items;   /* every line's items (user id dropped), concatenated */
    size_t *offsets;  /* [lines + 1] */
    size_t lines;
} sequences;

static int read_sequences(const char *path, sequences *s)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "beauty-bench: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t icap = 1 << 16, ocap = 1 << 12, ni = 0;
    s->items = malloc(icap * sizeof *s->items);
    s->offsets = malloc(ocap * sizeof *s->offsets);
    s->lines = 0;
    char *line = NULL;
    size_t len = 0;
    int rc = s->items && s->offsets ? 0 : -1;
    while (rc == 0 && getline(&line, &len, f) > 0) {
        char *p = line, *end;
        strtoll(p, &end, 10); /* user id */
        if (end == p) continue; /* blank line */
        p = end;
        size_t first = ni;
        for (;;) {
            long long v = strtoll(p, &end, 10);
            if (end == p) break;
            p = end;
            if (ni == icap) {
                icap *= 2;
                int64_t *q = realloc(s->items, icap * sizeof *q);
                if (!q) { rc = -1; break; }
                s->items = q;
            }
            s->items[ni++] = v;
        }
        if (ni - first < 2) { /* needs a history and a target */
            ni = first;
            continue;
        }
        if (s->lines + 2 > ocap) {
            ocap *= 2;
            size_t *q = realloc(s->offsets, ocap * sizeof *q);
            if (!q) { rc = -1; break; }
            s->offsets = q;
        }
        s->offsets[s->lines++] = first;
    }
    if (rc == 0) s->offsets[s->lines] = ni;
    free(line);
    fclose(f);
    if (rc == 0 && s->lines == 0) {
        fprintf(stderr, "beauty-bench: %s has no line with at least 2 items\n", path);
        rc = -1;
    }
    return rc;
}

/* Leave-last-out request of line u: all items but the last, every item id as candidate. */
static flame_request request_of(const sequences *s, size_t u, const int64_t *cands, size_t num_items)
{
    size_t a = s->offsets[u], b = s->offsets[u + 1];
    return (flame_request){.struct_size = sizeof(flame_request),
                           .user_id = (int64_t)u,
                           .history = s->items + a,
                           .history_len = b - a - 1,
                           .candidates = cands,
                           .num_candidates = num_items};
}

/* ---------------------------------------------------------------- main */

static int parse_count(const char *flag, const char *v, size_t lo, size_t hi, size_t *out)
{
    char *end;
    unsigned long long x = v ? strtoull(v, &end, 10) : 0;
    if (!v || !*v || *end || x < lo || x > hi) {
        fprintf(stderr, "beauty-bench: %s needs an integer in [%zu, %zu]\n", flag, lo, hi);
        return -1;
    }
    *out = (size_t)x;
    return 0;
}

static int fail(const char *what, flame_status st)
{
    fprintf(stderr, "beauty-bench: %s: %s: %s\n", what, flame_status_string(st), flame_last_error());
    return 1;
}

/* The engine's "CPU kernels: ..." line (logged at debug level when it is made). */
static char kernels_line[640];
static void on_log(flame_log_level level, const char *msg, void *user)
{
    (void)level;
    (void)user;
    if (!strncmp(msg, "CPU kernels: ", 13)) snprintf(kernels_line, sizeof kernels_line, "%s", msg + 13);
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *seq_path = NULL, *kernels = NULL;
    size_t users = 2000, warmup = 200, batch = 256, batch_users = 256 * 40;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(a, "--model")) model_path = v;
        else if (!strcmp(a, "--sequences")) seq_path = v;
        else if (!strcmp(a, "--cpu-kernels")) kernels = v;
        else if (!strcmp(a, "--users")) bad = parse_count(a, v, 1, 100000000, &users);
        else if (!strcmp(a, "--warmup")) bad = parse_count(a, v, 0, 100000000, &warmup);
        else if (!strcmp(a, "--batch")) bad = parse_count(a, v, 1, 65536, &batch);
        else if (!strcmp(a, "--batch-users")) bad = parse_count(a, v, 1, 100000000, &batch_users);
        else {
            fprintf(stderr,
                    "usage: beauty-bench --model FLAME_FILE --sequences Beauty.txt [--users 2000] [--warmup 200]\n"
                    "                    [--batch 256] [--batch-users 10240] [--cpu-kernels auto|avx512|avx2|blas]\n");
            return 2;
        }
        if (bad) return 2;
        i++;
    }
    if (!model_path || !seq_path) {
        fprintf(stderr, "beauty-bench: --model and --sequences are required\n");
        return 2;
    }

    sequences seqs = {0};
    if (read_sequences(seq_path, &seqs)) return 1;

    double t0 = now_us();
    flame_model *model = NULL;
    flame_engine *engine = NULL;
    flame_status st = flame_model_load(model_path, &model);
    if (st) return fail("flame_model_load", st);
    double load_us = now_us() - t0;
    flame_config *cfg = NULL;
    st = flame_config_create(&cfg);
    if (!st) st = flame_config_set_int(cfg, FLAME_OPT_MAX_BATCH, (int64_t)batch);
    if (!st && kernels) st = flame_config_set_string(cfg, FLAME_OPT_CPU_KERNELS, kernels);
    if (!st) st = flame_set_log_callback(on_log, NULL, FLAME_LOG_DEBUG);
    if (!st) st = flame_engine_create(model, cfg, &engine);
    flame_set_log_callback(NULL, NULL, FLAME_LOG_ERROR);
    flame_config_destroy(cfg);
    if (st) return fail("flame_engine_create", st);
    flame_model_info info = {.struct_size = sizeof info};
    flame_model_get_info(model, &info);
    if (info.num_tasks != 1) {
        fprintf(stderr, "beauty-bench: expected a one-task (dot head) model, got %d tasks\n", info.num_tasks);
        return 1;
    }
    const size_t M = (size_t)info.num_items;
    int64_t *cands = malloc(M * sizeof *cands);
    float *scores = malloc(M * batch * sizeof *scores);
    double *lat = malloc((users > 1 ? users : 1) * sizeof *lat);
    size_t nbatches = (batch_users + batch - 1) / batch;
    double *blat = malloc(nbatches * sizeof *blat);
    flame_request *reqs = malloc(batch * sizeof *reqs);
    if (!cands || !scores || !lat || !blat || !reqs) {
        fprintf(stderr, "beauty-bench: out of memory\n");
        return 1;
    }
    for (size_t c = 0; c < M; c++) cands[c] = (int64_t)c;

    /* ---- batch 1 */
    const size_t L = seqs.lines;
    double checksum = 0.0;
    for (size_t i = 0; i < warmup; i++) {
        size_t u = (size_t)((double)(i % users) * (double)L / (double)users);
        flame_request r = request_of(&seqs, u, cands, M);
        if ((st = flame_score(engine, &r, scores, M))) return fail("flame_score (warm-up)", st);
    }
    double hist_tokens = 0.0;
    for (size_t i = 0; i < users; i++) {
        size_t u = (size_t)((double)i * (double)L / (double)users);
        flame_request r = request_of(&seqs, u, cands, M);
        double a = now_us();
        st = flame_score(engine, &r, scores, M);
        lat[i] = now_us() - a;
        if (st) return fail("flame_score", st);
        checksum += scores[M - 1];
        hist_tokens += (double)(r.history_len < (size_t)info.max_len ? r.history_len : (size_t)info.max_len);
    }
    double mean = 0.0;
    for (size_t i = 0; i < users; i++) mean += lat[i];
    mean /= (double)users;
    qsort(lat, users, sizeof *lat, cmp_double);

    /* ---- batch B */
    size_t next = 0;
    for (size_t w = 0; w < 1 + nbatches; w++) { /* w == 0: warm-up */
        for (size_t r = 0; r < batch; r++) {
            reqs[r] = request_of(&seqs, next, cands, M);
            next = (next + 1) % L;
        }
        double a = now_us();
        st = flame_score_batch(engine, reqs, batch, scores, M * batch);
        double dt = now_us() - a;
        if (st) return fail("flame_score_batch", st);
        if (w) blat[w - 1] = dt;
        checksum += scores[M * batch - 1];
    }
    double btotal = 0.0;
    for (size_t w = 0; w < nbatches; w++) btotal += blat[w];
    qsort(blat, nbatches, sizeof *blat, cmp_double);

    flame_engine_stats stats = {.struct_size = sizeof stats};
    flame_engine_get_stats(engine, &stats);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);

    /* OpenBLAS is linked by libflame: ask it (through the already loaded symbols) what it is */
    char *(*ob_config)(void) = (char *(*)(void))dlsym(RTLD_DEFAULT, "openblas_get_config");
    char *(*ob_core)(void) = (char *(*)(void))dlsym(RTLD_DEFAULT, "openblas_get_corename");
    int (*ob_threads)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "openblas_get_num_threads");
    const char *envt = getenv("OPENBLAS_NUM_THREADS");

    printf("{\"system\": \"libflame\", \"version\": \"%s\", \"model\": \"%s\", \"num_items\": %lld, "
           "\"weight_bytes\": %llu, \"load_us\": %.1f,\n",
           flame_version_string(), model_path, (long long)info.num_items, (unsigned long long)info.weight_bytes,
           load_us);
    printf(" \"openblas\": \"%s\", \"openblas_core\": \"%s\", \"openblas_threads\": %d, "
           "\"OPENBLAS_NUM_THREADS\": \"%s\",\n",
           ob_config ? ob_config() : "unknown", ob_core ? ob_core() : "unknown", ob_threads ? ob_threads() : -1,
           envt ? envt : "");
    printf(" \"cpu_kernels\": \"%s\",\n", kernels_line); /* no quotes or backslashes in it */
    printf(" \"b1\": {\"users\": %zu, \"warmup\": %zu, \"mean_history_tokens\": %.2f, \"p50_us\": %.2f, "
           "\"p90_us\": %.2f, \"p99_us\": %.2f, \"mean_us\": %.2f, \"min_us\": %.2f},\n",
           users, warmup, hist_tokens / (double)users, percentile(lat, users, 50), percentile(lat, users, 90),
           percentile(lat, users, 99), mean, lat[0]);
    printf(" \"batch\": {\"batch\": %zu, \"calls\": %zu, \"users\": %zu, \"users_per_s\": %.1f, "
           "\"call_p50_us\": %.1f, \"call_min_us\": %.1f},\n",
           batch, nbatches, nbatches * batch, (double)(nbatches * batch) / (btotal / 1e6),
           percentile(blat, nbatches, 50), blat[0]);
    printf(" \"peak_rss_bytes\": %lld, \"scratch_bytes\": %llu, \"max_workspace_bytes\": %llu, "
           "\"workspaces\": %llu, \"checksum\": %.6g}\n",
           (long long)ru.ru_maxrss * 1024, (unsigned long long)stats.scratch_bytes,
           (unsigned long long)stats.max_workspace_bytes, (unsigned long long)stats.workspaces, checksum);

    free(reqs);
    free(blat);
    free(lat);
    free(scores);
    free(cands);
    free(seqs.items);
    free(seqs.offsets);
    flame_engine_destroy(engine);
    flame_model_destroy(model);
    return 0;
}
