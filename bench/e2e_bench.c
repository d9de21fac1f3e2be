/* e2e-bench: end-to-end flame_score_batch through the public C API, on any device.
 *
 *   bench/e2e-bench --model FILE [--device cuda] [--dtype fp16] --users B --history L
 *                   --candidates M [--calls N] [--warmup W] [--json]
 *
 * Builds synthetic requests that match the model (item ids below num_items; for every side
 * slot a bag of --bag ids below the rows of that slot's table, read from the model's
 * flame.config), then times N calls of flame_score_batch with B requests each (cycling over
 * --sets distinct request sets), one call at a time. Reports per-call latency P50/P99 (us,
 * wall clock around the call: host packing, copies and the forward included), requests/s,
 * candidates/s, the engine's device memory (flame_engine_get_stats) and the process's peak
 * RSS. --json prints one JSON object.
 *
 * Other sources of the model: --config FILE (a flame.config JSON; random weights, --seed) or
 * neither (the embedded default configuration).
 * --history-min L0 draws each synthetic history length uniformly from [L0, L] (variable-length
 * traffic: token counts differ from call to call).
 * --sequences FILE (lines "user i1 i2 ... in", e.g. Beauty.txt) takes the histories from the
 * file (i1..i(n-1) of each user, in file order, B users per call) instead of synthetic ones;
 * --all-items scores every item id 0..num_items-1 for each user (full-sort evaluation); then
 * one call = the next B users of the file, and the calls wrap around the file.
 * --clients N (bench/e2e_clients.c): N threads each send --calls one-user requests (the
 * requests of the sets, round robin), waiting for each: --via direct calls flame_score from
 * the N threads, --via scheduler goes through a flame_scheduler (one profile of
 * --sched-users x --sched-candidates, --max-wait-us, --workers); reports requests/s and the
 * per-request latency the clients see.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "e2e_bench.h"
#include "stage_p50.h"


double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static uint64_t next_u64(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "e2e-bench: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: e2e-bench [--model FILE | --config FILE] [--device cpu|cuda|cuda:N|auto] [--dtype fp32|fp16|bf16]\n"
            "                 [--users B] [--history L] [--history-min L0] [--candidates M] [--calls N] [--warmup W] [--bag K]\n"
            "                 [--sets S] [--seed S] [--sequences FILE] [--all-items] [--json] [--graphs 0|1]\n"
            "                 [--portable-attention 0|1] [--topk K]\n"
            "                 [--clients N [--via direct|scheduler] [--sched-users U] [--sched-candidates C]\n"
            "                  [--max-wait-us W] [--workers K]]\n");
}

static int parse_args(int argc, char **argv, options *o)
{
    *o = (options){.device = "cpu", .dtype = "fp32", .users = 1, .history = 256, .candidates = 128, .calls = 1000,
                   .warmup = 100, .bag = 1, .sets = 8, .graphs = 1, .seed = 1, .via = "direct", .sched_users = 8,
                   .sched_candidates = 128};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        size_t *num = NULL;
        const char **str = NULL;
        if (!strcmp(a, "--json")) { o->json = 1; continue; }
        if (!strcmp(a, "--all-items")) { o->all_items = 1; continue; }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(); exit(0); }
        if (!strcmp(a, "--model")) str = &o->model;
        else if (!strcmp(a, "--config")) str = &o->config;
        else if (!strcmp(a, "--sequences")) str = &o->sequences;
        else if (!strcmp(a, "--device")) str = &o->device;
        else if (!strcmp(a, "--dtype")) str = &o->dtype;
        else if (!strcmp(a, "--users")) num = &o->users;
        else if (!strcmp(a, "--history")) num = &o->history;
        else if (!strcmp(a, "--history-min")) num = &o->history_min;
        else if (!strcmp(a, "--candidates")) num = &o->candidates;
        else if (!strcmp(a, "--calls")) num = &o->calls;
        else if (!strcmp(a, "--warmup")) num = &o->warmup;
        else if (!strcmp(a, "--bag")) num = &o->bag;
        else if (!strcmp(a, "--sets")) num = &o->sets;
        else if (!strcmp(a, "--graphs")) num = &o->graphs; /* FLAME_OPT_CUDA_GRAPHS: 1 (default) or 0 */
        else if (!strcmp(a, "--portable-attention")) num = &o->portable_attention; /* FLAME_OPT_CUDA_ATTENTION */
        else if (!strcmp(a, "--topk")) num = &o->topk; /* flame_score_batch_topk with this k (task 0) */
        else if (!strcmp(a, "--clients")) num = &o->clients;
        else if (!strcmp(a, "--via")) str = &o->via;
        else if (!strcmp(a, "--sched-users")) num = &o->sched_users;
        else if (!strcmp(a, "--sched-candidates")) num = &o->sched_candidates;
        else if (!strcmp(a, "--max-wait-us")) num = &o->max_wait_us;
        else if (!strcmp(a, "--workers")) num = &o->workers;
        else if (strcmp(a, "--seed") != 0) {
            fprintf(stderr, "e2e-bench: unknown argument '%s'\n", a);
            usage();
            return -1;
        }
        if (!v) {
            fprintf(stderr, "e2e-bench: %s needs a value\n", a);
            return -1;
        }
        i++;
        if (str) {
            *str = v;
            continue;
        }
        char *end;
        unsigned long long x = strtoull(v, &end, 10);
        if (*end || v[0] == '-') {
            fprintf(stderr, "e2e-bench: %s wants a non-negative integer, got '%s'\n", a, v);
            return -1;
        }
        if (num) *num = (size_t)x;
        else o->seed = x;
    }
    if (o->model && o->config) {
        fprintf(stderr, "e2e-bench: give --model or --config, not both\n");
        return -1;
    }
    if (o->history_min > o->history) {
        fprintf(stderr, "e2e-bench: --history-min %zu exceeds --history %zu\n", o->history_min, o->history);
        return -1;
    }
    if (strcmp(o->via, "direct") && strcmp(o->via, "scheduler")) {
        fprintf(stderr, "e2e-bench: --via takes direct or scheduler, got '%s'\n", o->via);
        return -1;
    }
    if (o->users == 0 || o->calls == 0 || o->sets == 0) {
        fprintf(stderr, "e2e-bench: --users, --calls and --sets must be positive\n");
        return -1;
    }
    return 0;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = xmalloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = 0;
    if (len) *len = got;
    return buf;
}

/* The flame.config JSON text of a model file: the safetensors header's __metadata__ entry. */
static char *config_of_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char n8[8];
    char *out = NULL;
    if (fread(n8, 1, 8, f) == 8) {
        uint64_t n = 0;
        for (int i = 7; i >= 0; i--) n = n << 8 | n8[i];
        char *hdr = n < (100u << 20) ? malloc(n + 1) : NULL;
        if (hdr && fread(hdr, 1, n, f) == n) {
            hdr[n] = 0;
            cJSON *root = cJSON_Parse(hdr);
            cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
            cJSON *cfg = cJSON_GetObjectItemCaseSensitive(meta, "flame.config");
            if (cJSON_IsString(cfg)) out = strdup(cfg->valuestring);
            cJSON_Delete(root);
        }
        free(hdr);
    }
    fclose(f);
    return out;
}

/* Rows of the table behind each side slot, in slot order; returns the slot count or -1. */
static int side_rows(const char *config_json, int64_t rows[MAX_SLOTS])
{
    cJSON *root = cJSON_Parse(config_json);
    cJSON *tables = cJSON_GetObjectItemCaseSensitive(root, "tables");
    cJSON *feats = cJSON_GetObjectItemCaseSensitive(root, "features");
    int slots = 0;
    if (!cJSON_IsArray(tables) || !cJSON_IsArray(feats)) slots = -1;
    const cJSON *f;
    cJSON_ArrayForEach(f, feats)
    {
        if (slots < 0) break;
        const cJSON *input = cJSON_GetObjectItemCaseSensitive(f, "input");
        const cJSON *tname = cJSON_GetObjectItemCaseSensitive(f, "table");
        if (!cJSON_IsString(input) || strcmp(input->valuestring, "side") != 0) continue;
        if (slots == MAX_SLOTS || !cJSON_IsString(tname)) {
            slots = -1;
            break;
        }
        int64_t r = -1;
        const cJSON *t;
        cJSON_ArrayForEach(t, tables)
        {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
            if (cJSON_IsString(name) && !strcmp(name->valuestring, tname->valuestring))
                r = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(t, "rows"));
        }
        if (r <= 0) {
            slots = -1;
            break;
        }
        rows[slots++] = r;
    }
    cJSON_Delete(root);
    return slots;
}

/* ---------------------------------------------------------------- requests */


/* Side bags of `n` tokens: `bag` ids per slot, a pure function of the token's item id (as a
 * feature store would serve them), below each slot's table rows. */
static void tokens_fill(tokens *t, const int64_t *items, size_t n, int slots, const int64_t *rows, size_t bag)
{
    for (int s = 0; s < slots; s++) {
        t->off[s] = xmalloc((n + 1) * sizeof(int64_t));
        t->ids[s] = xmalloc((n * bag + 1) * sizeof(int64_t));
        for (size_t i = 0; i <= n; i++) t->off[s][i] = (int64_t)(i * bag);
        for (size_t i = 0; i < n; i++) {
            uint64_t h = (uint64_t)items[i] * 0x9e3779b97f4a7c15ull + (uint64_t)s * 0xd1b54a32d192ed03ull;
            for (size_t k = 0; k < bag; k++) t->ids[s][i * bag + k] = (int64_t)(next_u64(&h) % (uint64_t)rows[s]);
        }
        t->bags[s] = (flame_bags){t->off[s], t->ids[s], n * bag};
    }
}

static void tokens_free(tokens *t, int slots)
{
    for (int s = 0; s < slots; s++) {
        free(t->off[s]);
        free(t->ids[s]);
    }
}


/* Histories of a sequences file: all but the last item of each line (the held-out target). */
static int64_t **read_sequences(const char *path, size_t **lens, size_t *count)
{
    size_t len;
    char *text = read_file(path, &len);
    if (!text) return NULL;
    size_t cap = 1024, n = 0;
    int64_t **seqs = xmalloc(cap * sizeof *seqs);
    *lens = xmalloc(cap * sizeof **lens);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        size_t k = 0, kcap = 16;
        int64_t *items = xmalloc(kcap * sizeof *items);
        char *p = line, *end;
        strtoll(p, &end, 10); /* the user id */
        if (end == p) {
            free(items);
            continue;
        }
        for (p = end;; p = end) {
            long long v = strtoll(p, &end, 10);
            if (end == p) break;
            if (k == kcap) items = realloc(items, (kcap *= 2) * sizeof *items);
            items[k++] = v;
        }
        if (n == cap) {
            seqs = realloc(seqs, (cap *= 2) * sizeof *seqs);
            *lens = realloc(*lens, cap * sizeof **lens);
        }
        seqs[n] = items;
        (*lens)[n++] = k ? k - 1 : 0;
    }
    free(text);
    *count = n;
    return seqs;
}

/* ---------------------------------------------------------------- main */

int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double percentile(const double *sorted, size_t n, double p)
{
    size_t k = (size_t)ceil(p * (double)n);
    return sorted[k ? k - 1 : 0];
}

#define CHECK(call)                                                                                            \
    do {                                                                                                       \
        flame_status st_ = (call);                                                                             \
        if (st_ != FLAME_OK) {                                                                                 \
            fprintf(stderr, "e2e-bench: %s: %s: %s\n", #call, flame_status_string(st_), flame_last_error());     \
            return 1;                                                                                          \
        }                                                                                                      \
    } while (0)

static void log_to_stderr(flame_log_level level, const char *message, void *user)
{
    (void)level;
    (void)user;
    fprintf(stderr, "libflame: %s\n", message);
}

int main(int argc, char **argv)
{
    flame_set_log_callback(log_to_stderr, NULL, FLAME_LOG_WARN);
    options o;
    if (parse_args(argc, argv, &o)) return 2;

    /* the model and its config */
    char *config_json = NULL;
    flame_model *model = NULL;
    double t0 = now_us();
    if (o.model) {
        config_json = config_of_file(o.model);
        CHECK(flame_model_load(o.model, &model));
    } else {
        config_json = o.config ? read_file(o.config, NULL) : strdup(flame_default_model_config());
        if (!config_json) {
            fprintf(stderr, "e2e-bench: cannot read %s\n", o.config);
            return 1;
        }
        CHECK(flame_model_create_random(config_json, o.seed, &model));
    }
    const double load_us = now_us() - t0;
    flame_model_info info = {.struct_size = sizeof info};
    CHECK(flame_model_get_info(model, &info));
    int64_t rows[MAX_SLOTS];
    const int slots = config_json ? side_rows(config_json, rows) : -1;
    if (slots != info.num_side_features) {
        fprintf(stderr, "e2e-bench: could not read the side slots' tables from the model's flame.config\n");
        return 1;
    }

    flame_config *cfg;
    CHECK(flame_config_create(&cfg));
    CHECK(flame_config_set_string(cfg, FLAME_OPT_DEVICE, o.device));
    CHECK(flame_config_set_string(cfg, FLAME_OPT_DTYPE, o.dtype));
    CHECK(flame_config_set_int(cfg, FLAME_OPT_CUDA_GRAPHS, (int64_t)o.graphs));
    CHECK(flame_config_set_int(cfg, FLAME_OPT_CUDA_ATTENTION, (int64_t)o.portable_attention));
    if (o.users > 256) CHECK(flame_config_set_int(cfg, FLAME_OPT_MAX_BATCH, (int64_t)(o.users < 65536 ? o.users : 65536)));
    flame_engine *engine;
    t0 = now_us();
    CHECK(flame_engine_create(model, cfg, &engine));
    const double create_us = now_us() - t0;
    flame_config_destroy(cfg);

    /* request sets */
    uint64_t rng = o.seed * 0x9e3779b97f4a7c15ull + 12345;
    const size_t M = o.all_items ? (size_t)info.num_items : o.candidates;
    int64_t *all_items = NULL;
    tokens all_items_side = {0};
    if (o.all_items) {
        all_items = xmalloc(M * sizeof *all_items);
        for (size_t i = 0; i < M; i++) all_items[i] = (int64_t)i;
        tokens_fill(&all_items_side, all_items, M, slots, rows, o.bag);
    }
    int64_t **seqs = NULL;
    size_t *seq_lens = NULL, num_seqs = 0;
    if (o.sequences) {
        seqs = read_sequences(o.sequences, &seq_lens, &num_seqs);
        if (!seqs || num_seqs == 0) {
            fprintf(stderr, "e2e-bench: no sequences read from %s\n", o.sequences);
            return 1;
        }
        for (size_t u = 0; u < num_seqs; u++)
            for (size_t i = 0; i < seq_lens[u]; i++)
                if (seqs[u][i] < 0 || seqs[u][i] >= info.num_items) {
                    fprintf(stderr, "e2e-bench: %s line %zu: item %lld is outside [0, %lld)\n", o.sequences, u + 1,
                            (long long)seqs[u][i], (long long)info.num_items);
                    return 1;
                }
        o.sets = (num_seqs + o.users - 1) / o.users;
    }
    request_set *sets = xmalloc(o.sets * sizeof *sets);
    size_t max_scores = 0;
    for (size_t k = 0; k < o.sets; k++) {
        request_set *rs = &sets[k];
        rs->n = o.sequences ? (k + 1 == o.sets ? num_seqs - k * o.users : o.users) : o.users;
        rs->reqs = xmalloc(rs->n * sizeof *rs->reqs);
        rs->hist = calloc(rs->n, sizeof(tokens));
        rs->cand = calloc(rs->n, sizeof(tokens));
        rs->candidates = 0;
        for (size_t r = 0; r < rs->n; r++) {
            const int64_t *hist;
            size_t L;
            if (o.sequences) {
                hist = seqs[k * o.users + r];
                L = seq_lens[k * o.users + r];
            } else {
                /* --history-min: lengths uniform in [history_min, history] (variable-length traffic) */
                L = o.history;
                if (o.history_min && o.history_min < o.history)
                    L = o.history_min + (size_t)(next_u64(&rng) % (uint64_t)(o.history - o.history_min + 1));
                int64_t *h = xmalloc(L * sizeof *h);
                for (size_t i = 0; i < L; i++) h[i] = (int64_t)(next_u64(&rng) % (uint64_t)info.num_items);
                hist = h;
            }
            const int64_t *cands = all_items;
            if (!o.all_items) {
                int64_t *c = xmalloc(M * sizeof *c);
                for (size_t i = 0; i < M; i++) c[i] = (int64_t)(next_u64(&rng) % (uint64_t)info.num_items);
                cands = c;
            }
            tokens_fill(&rs->hist[r], hist, L, slots, rows, o.bag);
            if (!o.all_items) tokens_fill(&rs->cand[r], cands, M, slots, rows, o.bag);
            rs->reqs[r] = (flame_request){.struct_size = sizeof(flame_request),
                                          .user_id = (int64_t)(k * o.users + r),
                                          .history = hist,
                                          .history_len = L,
                                          .candidates = cands,
                                          .num_candidates = M,
                                          .history_side = slots ? rs->hist[r].bags : NULL,
                                          .candidate_side = slots ? (o.all_items ? all_items_side.bags : rs->cand[r].bags) : NULL,
                                          .num_side_features = (size_t)slots};
            rs->candidates += M;
        }
        if (rs->candidates * (size_t)info.num_tasks > max_scores) max_scores = rs->candidates * (size_t)info.num_tasks;
    }
    float *scores = xmalloc(max_scores * sizeof *scores);
    /* --topk: each request's k best (flame_score_batch_topk) instead of every score */
    size_t max_n = 0;
    for (size_t i = 0; i < o.sets; i++) max_n = sets[i].n > max_n ? sets[i].n : max_n;
    int64_t *top_ids = o.topk ? xmalloc(max_n * o.topk * sizeof *top_ids) : NULL;
    float *top_scores = o.topk ? xmalloc(max_n * o.topk * sizeof *top_scores) : NULL;
#define SCORE_CALL(rs)                                                                                           \
    (o.topk ? flame_score_batch_topk(engine, (rs)->reqs, (rs)->n, (uint32_t)o.topk, 0, top_ids, top_scores,      \
                                     (rs)->n * o.topk)                                                          \
            : flame_score_batch(engine, (rs)->reqs, (rs)->n, scores, max_scores))

    /* warm-up (first calls size the device buffers and cuBLASLt plans), then the timed calls */
    for (size_t i = 0; i < o.warmup; i++) {
        const request_set *rs = &sets[i % o.sets];
        CHECK(SCORE_CALL(rs));
    }
    if (o.clients) { /* N threads of one-user requests, direct or through a scheduler */
        int rc = run_clients(&o, engine, &info, sets, o.sets);
        flame_engine_destroy(engine);
        flame_model_destroy(model);
        return rc;
    }
    double *lat = xmalloc(o.calls * sizeof *lat);
    size_t total_req = 0, total_cand = 0, bad = 0;
    double checksum = 0;
    const double start = now_us();
    for (size_t i = 0; i < o.calls; i++) {
        const request_set *rs = &sets[i % o.sets];
        const double a = now_us();
        flame_status st = SCORE_CALL(rs);
        lat[i] = now_us() - a;
        if (st) {
            fprintf(stderr, "e2e-bench: flame_score_batch: %s: %s\n", flame_status_string(st), flame_last_error());
            return 1;
        }
        total_req += rs->n;
        total_cand += rs->candidates;
        if (i + 1 == o.calls && o.topk)
            for (size_t j = 0; j < rs->n * o.topk; j++) {
                if (!isfinite(top_scores[j])) bad++;
                checksum += top_scores[j];
            }
        else if (i + 1 == o.calls)
            for (size_t j = 0; j < rs->candidates * (size_t)info.num_tasks; j++) {
                if (!isfinite(scores[j])) bad++;
                checksum += scores[j];
            }
    }
    const double elapsed = now_us() - start;
    qsort(lat, o.calls, sizeof *lat, cmp_double);
    double mean = 0;
    for (size_t i = 0; i < o.calls; i++) mean += lat[i];
    mean /= (double)o.calls;

    flame_engine_stats es = {.struct_size = sizeof es};
    CHECK(flame_engine_get_stats(engine, &es));
    /* where a call's time goes: the engine's own stage timers (P50 since creation, warm-up
     * included; host copies and device compute come from CUDA events on the GPU) */
    char stages[512];
    CHECK(bench_stage_p50s(engine, stages, sizeof stages));
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const double p50 = percentile(lat, o.calls, 0.50), p99 = percentile(lat, o.calls, 0.99);
    const double rps = (double)total_req / (elapsed * 1e-6), cps = (double)total_cand / (elapsed * 1e-6);
    const char *head = info.head == FLAME_HEAD_SUMI ? "sumi" : "dot";
    if (o.json) {
        printf("{\"model\":\"%s\",\"device\":\"%s\",\"dtype\":\"%s\",\"users\":%zu,\"history\":%zu,\"history_min\":%zu,\"candidates\":%zu,"
               "\"sequences\":%s%s%s,\"all_items\":%s,\"topk\":%zu,\"calls\":%zu,\"warmup\":%zu,\"sets\":%zu,\"bag\":%zu,"
               "\"p50_us\":%.2f,\"p99_us\":%.2f,\"mean_us\":%.2f,\"min_us\":%.2f,\"max_us\":%.2f,"
               "\"calls_per_s\":%.2f,\"requests_per_s\":%.2f,\"candidates_per_s\":%.1f,"
               "\"device_bytes\":%llu,\"device_weight_bytes\":%llu,\"host_peak_rss_bytes\":%llu,"
               "\"load_us\":%.0f,\"engine_create_us\":%.0f,"
               "\"d_model\":%d,\"num_blocks\":%d,\"num_heads\":%d,\"ffn_dim\":%d,\"max_len\":%d,\"num_tasks\":%d,"
               "\"num_side_features\":%d,\"num_items\":%lld,\"head\":\"%s\",\"score_checksum\":%.6g,"
               "\"nonfinite_scores\":%zu,\"graph_captures\":%llu,\"graph_replays\":%llu,\"stage_p50_us\":%s,"
               "\"libflame\":\"%s\"}\n",
               o.model ? o.model : o.config ? o.config : "(embedded default)", o.device, o.dtype, o.users,
               o.sequences ? (size_t)0 : o.history, o.sequences ? (size_t)0 : o.history_min ? o.history_min : o.history, M,
               o.sequences ? "\"" : "", o.sequences ? o.sequences : "null",
               o.sequences ? "\"" : "", o.all_items ? "true" : "false", o.topk, o.calls, o.warmup, o.sets, o.bag, p50, p99, mean,
               lat[0], lat[o.calls - 1], (double)o.calls / (elapsed * 1e-6), rps, cps,
               (unsigned long long)es.device_bytes, (unsigned long long)es.device_weight_bytes,
               (unsigned long long)ru.ru_maxrss * 1024ull, load_us, create_us, info.d_model, info.num_blocks,
               info.num_heads, info.ffn_dim, info.max_len, info.num_tasks, info.num_side_features,
               (long long)info.num_items, head, checksum, bad, (unsigned long long)es.graph_captures,
               (unsigned long long)es.graph_replays, stages, flame_version_string());
    } else {
        printf("model %s: d_model %d, %d blocks, %d heads, ffn %d, %s head, %d tasks, %d side slots, %lld items\n",
               o.model ? o.model : o.config ? o.config : "(embedded default)", info.d_model, info.num_blocks,
               info.num_heads, info.ffn_dim, head, info.num_tasks, info.num_side_features, (long long)info.num_items);
        char hist[64];
        if (o.sequences)
            snprintf(hist, sizeof hist, "from the file");
        else if (o.history_min && o.history_min < o.history)
            snprintf(hist, sizeof hist, "%zu..%zu", o.history_min, o.history);
        else
            snprintf(hist, sizeof hist, "%zu", o.history);
        printf("device %s, dtype %s: B=%zu users/call, L=%s, M=%zu candidates, %zu calls after %zu warm-up\n",
               o.device, o.dtype, o.users, hist, M, o.calls, o.warmup);
        printf("latency per call: p50 %.1f us, p99 %.1f us, mean %.1f us, min %.1f us\n", p50, p99, mean, lat[0]);
        printf("stage P50s (us): %s\n", stages);
        printf("throughput: %.1f requests/s, %.0f candidates/s\n", rps, cps);
        printf("memory: device %llu bytes (weights %llu), host peak RSS %llu bytes\n",
               (unsigned long long)es.device_bytes, (unsigned long long)es.device_weight_bytes,
               (unsigned long long)ru.ru_maxrss * 1024ull);
    }
    if (bad) fprintf(stderr, "e2e-bench: %zu non-finite scores in the last call\n", bad);

    for (size_t k = 0; k < o.sets; k++) {
        for (size_t r = 0; r < sets[k].n; r++) {
            tokens_free(&sets[k].hist[r], slots);
            if (!o.all_items) {
                tokens_free(&sets[k].cand[r], slots);
                free((void *)sets[k].reqs[r].candidates);
            }
            if (!o.sequences) free((void *)sets[k].reqs[r].history);
        }
        free(sets[k].hist);
        free(sets[k].cand);
        free(sets[k].reqs);
    }
    for (size_t u = 0; u < num_seqs; u++) free(seqs[u]);
    free(seqs);
    free(seq_lens);
    if (o.all_items) tokens_free(&all_items_side, slots);
    free(all_items);
    free(sets);
    free(scores);
    free(lat);
    free(config_json);
    flame_engine_destroy(engine);
    flame_model_destroy(model);
    return bad ? 1 : 0;
}
