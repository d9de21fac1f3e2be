/* kv-cache-bench: the user-history KV cache against libflame without it, in the same run,
 * through the public C API.
 *
 *   bench/kv-cache-bench [--config FILE] [--device cpu|cuda] [--dtype fp16] [--reps R]
 *                        [--skip-4096] [--trace-visits V] [--json]
 *
 * The model is FILE's flame.config (default bench/ref_gr_config.json) with random weights; its
 * max_len (and position rows) are set to each history length measured.
 *   rescore   one user with L history items (one side id per slot per token): the full forward
 *             of M = 128 candidates (cache off) against re-scoring 128 new candidates of the
 *             cached user (cache on, after one miss): kv_cache_rescore_l1024_m128_us, and L = 4096.
 *   m8192     8,192 candidates for one user with L = 1024: the single pass (cache off), the
 *             micro-batched pass that computes the history once (a miss) and the one that reads
 *             it (a hit): kv_cache_m8192_l1024_candidates_per_s.
 *   trace     a seeded replay: Zipf(1.0) users out of 400, histories of 32..160 items growing by
 *             1-3 items a visit, 64 new candidates a visit, on a smaller model of the same shape
 *             (d_model 128, 2 blocks, ffn 512, max_len 512, position rule from_oldest so grown
 *             histories extend) with a budget of a quarter of the users' entries: hit ratio,
 *             extensions, tokens saved, P50/P99 per visit against the cache off (each visit scored
 *             by both engines, alternately), bytes per cached token per layer, peak bytes vs budget.
 * Times are the median of --reps calls (wall clock around flame_score). On the GPU
 * (--device cuda --dtype fp16) the same entries run on the GPU engine, its cache blocks in
 * device memory, against the GPU engine without the cache. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flame/flame.h"
#include "stage_p50.h"
#include "cli_args.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static uint64_t rng = 20261202;
static uint64_t next_u64(void) /* splitmix64 */
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int64_t below(int64_t n)
{
    return (int64_t)(next_u64() % (uint64_t)n);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "kv-cache-bench: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static void check(flame_status st, const char *what)
{
    if (st == FLAME_OK) return;
    fprintf(stderr, "kv-cache-bench: %s: %s: %s\n", what, flame_status_string(st), flame_last_error());
    exit(1);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double pct(double *v, size_t n, double p) /* nearest rank */
{
    qsort(v, n, sizeof *v, cmp_double);
    size_t r = (size_t)ceil(p / 100.0 * (double)n);
    if (r < 1) r = 1;
    return v[(r > n ? n : r) - 1];
}

/* ---- the model */

typedef struct bench_model {
    flame_model *m;
    int64_t items;
    int num_side;
    int64_t side_rows[8];
    int layers, d;
} bench_model;

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "kv-cache-bench: cannot open %s\n", path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = xmalloc((size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) exit(1);
    s[n] = 0;
    fclose(f);
    return s;
}

/* FILE's config with max_len L (position rows L + 1, candidates at row L), the given rule (NULL:
 * FILE's), and, when d > 0, a smaller encoder. */
static bench_model make_model(const char *json, int L, const char *rule, int d, int blocks, int ffn)
{
    cJSON *root = cJSON_Parse(json);
    if (!root) exit(1);
    cJSON_ReplaceItemInObject(root, "max_len", cJSON_CreateNumber(L));
    cJSON *pos = cJSON_GetObjectItem(root, "position");
    cJSON_ReplaceItemInObject(pos, "rows", cJSON_CreateNumber(L + 1));
    cJSON_ReplaceItemInObject(pos, "candidate_position", cJSON_CreateNumber(L));
    if (rule) cJSON_ReplaceItemInObject(pos, "rule", cJSON_CreateString(rule));
    cJSON *b = cJSON_GetObjectItem(root, "blocks");
    if (d > 0) {
        cJSON_ReplaceItemInObject(root, "d_model", cJSON_CreateNumber(d));
        cJSON_ReplaceItemInObject(b, "count", cJSON_CreateNumber(blocks));
        cJSON_ReplaceItemInObject(b, "ffn_dim", cJSON_CreateNumber(ffn));
    }
    bench_model bm = {0};
    bm.layers = cJSON_GetObjectItem(b, "count")->valueint;
    bm.d = cJSON_GetObjectItem(root, "d_model")->valueint;
    cJSON *tables = cJSON_GetObjectItem(root, "tables"), *feats = cJSON_GetObjectItem(root, "features");
    cJSON *f;
    cJSON_ArrayForEach(f, feats)
    {
        const char *tn = cJSON_GetObjectItem(f, "table")->valuestring;
        int64_t rows = 0;
        cJSON *t;
        cJSON_ArrayForEach(t, tables) if (!strcmp(cJSON_GetObjectItem(t, "name")->valuestring, tn)) rows =
            (int64_t)cJSON_GetObjectItem(t, "rows")->valuedouble;
        if (!strcmp(cJSON_GetObjectItem(f, "input")->valuestring, "side")) bm.side_rows[bm.num_side++] = rows;
        else bm.items = rows;
    }
    char *text = cJSON_PrintUnformatted(root);
    check(flame_model_create_random(text, 7, &bm.m), "flame_model_create_random");
    free(text);
    cJSON_Delete(root);
    return bm;
}

static flame_engine *make_engine(const bench_model *bm, const char *device, const char *dtype, int64_t kv_bytes)
{
    flame_config *c = NULL;
    check(flame_config_create(&c), "flame_config_create");
    check(flame_config_set_string(c, FLAME_OPT_DEVICE, device), "FLAME_OPT_DEVICE");
    check(flame_config_set_string(c, FLAME_OPT_DTYPE, dtype), "FLAME_OPT_DTYPE");
    check(flame_config_set_int(c, FLAME_OPT_KV_CACHE_BYTES, kv_bytes), "FLAME_OPT_KV_CACHE_BYTES");
    flame_engine *e = NULL;
    check(flame_engine_create(bm->m, c, &e), "flame_engine_create");
    flame_config_destroy(c);
    return e;
}

/* a token list with one side id per slot per token */
typedef struct tokens {
    int64_t *items;
    int64_t *off, *ids[8];
    flame_bags bags[8];
    size_t n, cap;
} tokens;

static void tokens_init(tokens *t, const bench_model *bm, size_t cap)
{
    memset(t, 0, sizeof *t);
    t->cap = cap;
    t->items = xmalloc(cap * sizeof(int64_t));
    t->off = xmalloc((cap + 1) * sizeof(int64_t));
    for (size_t i = 0; i <= cap; i++) t->off[i] = (int64_t)i;
    for (int s = 0; s < bm->num_side; s++) t->ids[s] = xmalloc(cap * sizeof(int64_t));
}
static void tokens_push(tokens *t, const bench_model *bm)
{
    t->items[t->n] = below(bm->items);
    for (int s = 0; s < bm->num_side; s++) t->ids[s][t->n] = below(bm->side_rows[s]);
    t->n++;
}
static void tokens_bags(tokens *t, const bench_model *bm)
{
    for (int s = 0; s < bm->num_side; s++) t->bags[s] = (flame_bags){t->off, t->ids[s], t->n};
}
static void tokens_free(tokens *t)
{
    free(t->items);
    free(t->off);
    for (int s = 0; s < 8; s++) free(t->ids[s]);
}

static flame_request request(const bench_model *bm, int64_t user, tokens *h, tokens *c, int kv)
{
    tokens_bags(h, bm);
    tokens_bags(c, bm);
    return (flame_request){.struct_size = sizeof(flame_request), .user_id = user, .history = h->items,
                           .history_len = h->n, .candidates = c->items, .num_candidates = c->n,
                           .history_side = bm->num_side ? h->bags : NULL, .candidate_side = bm->num_side ? c->bags : NULL,
                           .num_side_features = (size_t)bm->num_side, .kv_cache = kv};
}

static double timed_score(flame_engine *e, const flame_request *r, float *s, size_t len)
{
    const double t0 = now_us();
    check(flame_score(e, r, s, len), "flame_score");
    return now_us() - t0;
}

static void new_candidates(tokens *c, const bench_model *bm, size_t m)
{
    c->n = 0;
    for (size_t i = 0; i < m; i++) tokens_push(c, bm);
}

/* ---- rescore: the full forward against re-scoring new candidates of a cached user */

static void rescore(const char *json, const char *device, const char *dtype, int L, int reps, bool js)
{
    bench_model bm = make_model(json, L, NULL, 0, 0, 0);
    flame_engine *off = make_engine(&bm, device, dtype, 0), *on = make_engine(&bm, device, dtype, (int64_t)1 << 30);
    tokens h, c;
    tokens_init(&h, &bm, (size_t)L);
    tokens_init(&c, &bm, 128);
    for (int i = 0; i < L; i++) tokens_push(&h, &bm);
    float *s = xmalloc(128 * 16 * sizeof(float));
    double *toff = xmalloc((size_t)reps * sizeof(double)), *ton = xmalloc((size_t)reps * sizeof(double));
    new_candidates(&c, &bm, 128);
    flame_request r = request(&bm, 1, &h, &c, 1);
    const double miss = timed_score(on, &r, s, 128 * 16); /* the miss stores the history */
    for (int i = 0; i < reps; i++) {
        new_candidates(&c, &bm, 128);
        r = request(&bm, 1, &h, &c, 0);
        toff[i] = timed_score(off, &r, s, 128 * 16);
        r.kv_cache = 1;
        ton[i] = timed_score(on, &r, s, 128 * 16);
    }
    const double a = pct(toff, (size_t)reps, 50), b = pct(ton, (size_t)reps, 50);
    flame_engine_stats st = {.struct_size = sizeof st};
    check(flame_engine_get_stats(on, &st), "flame_engine_get_stats");
    char so[256], sn[256]; /* the cache-on engine's P50s are its hits' (one miss, reps hits) */
    check(bench_stage_p50s(off, so, sizeof so), "flame_engine_get_latency");
    check(bench_stage_p50s(on, sn, sizeof sn), "flame_engine_get_latency");
    if (js)
        printf("{\"bench\":\"rescore\",\"L\":%d,\"M\":128,\"cache_off_us\":%.0f,\"kv_cache_rescore_l%d_m128_us\":%.0f,"
               "\"ratio\":%.4f,\"miss_us\":%.0f,\"kv_bytes\":%llu,\"reps\":%d,\"device\":\"%s\",\"dtype\":\"%s\","
               "\"stage_p50_us_off\":%s,\"stage_p50_us_on\":%s}\n",
               L, a, L, b, b / a, miss, (unsigned long long)st.kv_cache_bytes, reps, device, dtype, so, sn);
    else
        printf("rescore L=%d M=128: cache off %.0f us, kv_cache_rescore_l%d_m128_us %.0f (%.3fx of off); the miss "
               "%.0f us; %llu bytes cached\n",
               L, a, L, b, b / a, miss, (unsigned long long)st.kv_cache_bytes);
    free(s), free(toff), free(ton);
    tokens_free(&h), tokens_free(&c);
    flame_engine_destroy(off), flame_engine_destroy(on);
    flame_model_destroy(bm.m);
}

/* ---- 8,192 candidates of one user */

static void many_candidates(const char *json, const char *device, const char *dtype, int reps, bool js)
{
    enum { L = 1024, M = 8192 };
    bench_model bm = make_model(json, L, NULL, 0, 0, 0);
    flame_engine *off = make_engine(&bm, device, dtype, 0), *on = make_engine(&bm, device, dtype, (int64_t)1 << 30);
    tokens h, c;
    tokens_init(&h, &bm, L);
    tokens_init(&c, &bm, M);
    for (int i = 0; i < L; i++) tokens_push(&h, &bm);
    new_candidates(&c, &bm, M);
    float *s = xmalloc((size_t)M * 16 * sizeof(float));
    double *t0 = xmalloc((size_t)reps * sizeof(double)), *t1 = xmalloc((size_t)reps * sizeof(double)),
           *t2 = xmalloc((size_t)reps * sizeof(double));
    for (int i = 0; i < reps; i++) {
        flame_request r = request(&bm, 100 + i, &h, &c, 0);
        t0[i] = timed_score(off, &r, s, (size_t)M * 16);
        r.kv_cache = 1;
        t1[i] = timed_score(on, &r, s, (size_t)M * 16); /* a new user: a miss */
        t2[i] = timed_score(on, &r, s, (size_t)M * 16); /* again: a hit */
    }
    const double a = pct(t0, (size_t)reps, 50), b = pct(t1, (size_t)reps, 50), h2 = pct(t2, (size_t)reps, 50);
    if (js)
        printf("{\"bench\":\"m8192\",\"L\":%d,\"M\":%d,\"single_pass_candidates_per_s\":%.0f,"
               "\"kv_cache_m8192_l1024_candidates_per_s\":%.0f,\"hit_candidates_per_s\":%.0f,\"reps\":%d,"
               "\"device\":\"%s\",\"dtype\":\"%s\"}\n",
               L, M, M / a * 1e6, M / b * 1e6, M / h2 * 1e6, reps, device, dtype);
    else
        printf("m8192 L=1024: single pass %.0f candidates/s; micro-batched, history computed once "
               "(kv_cache_m8192_l1024_candidates_per_s) %.0f (%.2fx); history cached %.0f (%.2fx)\n",
               M / a * 1e6, M / b * 1e6, a / b, M / h2 * 1e6, a / h2);
    free(s), free(t0), free(t1), free(t2);
    tokens_free(&h), tokens_free(&c);
    flame_engine_destroy(off), flame_engine_destroy(on);
    flame_model_destroy(bm.m);
}

/* ---- the trace replay */

static void trace(const char *json, const char *device, const char *dtype, int visits, bool js)
{
    enum { USERS = 400, L = 512, M = 64 };
    bench_model bm = make_model(json, L, "from_oldest", 128, 2, 512);
    /* blocks in the compute dtype: float32 on the CPU, the dtype on the GPU */
    const uint64_t elem = strcmp(device, "cpu") != 0 && strcmp(dtype, "fp32") != 0 ? 2 : 4;
    const uint64_t token_bytes = 2ull * (uint64_t)bm.layers * (uint64_t)bm.d * elem;
    double cdf[USERS], z = 0;
    for (int u = 0; u < USERS; u++) z += 1.0 / (u + 1.0), cdf[u] = z;
    tokens *hist = xmalloc(USERS * sizeof(tokens));
    uint64_t entry_bytes = 0;
    for (int u = 0; u < USERS; u++) {
        tokens_init(&hist[u], &bm, L);
        const int n0 = 32 + (int)below(129);
        for (int i = 0; i < n0; i++) tokens_push(&hist[u], &bm);
        entry_bytes += (uint64_t)n0 * token_bytes;
    }
    const int64_t budget = (int64_t)(entry_bytes / 4);
    flame_engine *off = make_engine(&bm, device, dtype, 0), *on = make_engine(&bm, device, dtype, budget);
    tokens c;
    tokens_init(&c, &bm, M);
    float *s = xmalloc(M * 16 * sizeof(float));
    double *toff = xmalloc((size_t)visits * sizeof(double)), *ton = xmalloc((size_t)visits * sizeof(double));
    for (int v = 0; v < visits; v++) {
        const double x = (double)(next_u64() >> 11) / 9007199254740992.0 * z;
        int u = 0;
        while (u < USERS - 1 && cdf[u] < x) u++;
        tokens *h = &hist[u];
        const int grow = 1 + (int)below(3);
        for (int i = 0; i < grow && h->n < (size_t)L; i++) tokens_push(h, &bm);
        new_candidates(&c, &bm, M);
        flame_request r = request(&bm, u, h, &c, 0);
        if (v % 2) { /* alternate which engine goes first */
            toff[v] = timed_score(off, &r, s, M * 16);
            r.kv_cache = 1;
            ton[v] = timed_score(on, &r, s, M * 16);
        } else {
            r.kv_cache = 1;
            ton[v] = timed_score(on, &r, s, M * 16);
            r.kv_cache = 0;
            toff[v] = timed_score(off, &r, s, M * 16);
        }
    }
    flame_engine_stats st = {.struct_size = sizeof st};
    check(flame_engine_get_stats(on, &st), "flame_engine_get_stats");
    const double p50off = pct(toff, (size_t)visits, 50), p99off = pct(toff, (size_t)visits, 99);
    const double p50on = pct(ton, (size_t)visits, 50), p99on = pct(ton, (size_t)visits, 99);
    const double reuse = (double)(st.kv_cache_hits + st.kv_cache_extensions) / visits;
    const double per_token_layer = (double)token_bytes / bm.layers;
    if (js)
        printf("{\"bench\":\"trace\",\"visits\":%d,\"users\":%d,\"hits\":%llu,\"extensions\":%llu,\"misses\":%llu,"
               "\"evictions\":%llu,\"reuse_ratio\":%.4f,\"tokens_computed\":%llu,\"tokens_saved\":%llu,"
               "\"p50_off_us\":%.0f,\"p99_off_us\":%.0f,\"p50_on_us\":%.0f,\"p99_on_us\":%.0f,"
               "\"bytes_per_token_per_layer\":%.0f,\"peak_bytes\":%llu,\"budget_bytes\":%llu,\"device\":\"%s\","
               "\"dtype\":\"%s\",\"device_bytes\":%llu}\n",
               visits, USERS, (unsigned long long)st.kv_cache_hits, (unsigned long long)st.kv_cache_extensions,
               (unsigned long long)st.kv_cache_misses, (unsigned long long)st.kv_cache_evictions, reuse,
               (unsigned long long)st.kv_cache_tokens_computed, (unsigned long long)st.kv_cache_tokens_saved, p50off,
               p99off, p50on, p99on, per_token_layer, (unsigned long long)st.kv_cache_peak_bytes,
               (unsigned long long)st.kv_cache_budget_bytes, device, dtype, (unsigned long long)st.device_bytes);
    else
        printf("trace: %d visits of %d Zipf users: %llu hits, %llu extensions, %llu misses (reuse %.3f), %llu "
               "evictions; history tokens computed %llu, saved %llu; per visit P50/P99 %.0f/%.0f us with the cache, "
               "%.0f/%.0f us without; %.0f bytes a cached token a layer; peak %llu of %llu budget bytes; %llu device "
               "bytes held (0 on the CPU)\n",
               visits, USERS, (unsigned long long)st.kv_cache_hits, (unsigned long long)st.kv_cache_extensions,
               (unsigned long long)st.kv_cache_misses, reuse, (unsigned long long)st.kv_cache_evictions,
               (unsigned long long)st.kv_cache_tokens_computed, (unsigned long long)st.kv_cache_tokens_saved, p50on,
               p99on, p50off, p99off, per_token_layer, (unsigned long long)st.kv_cache_peak_bytes,
               (unsigned long long)st.kv_cache_budget_bytes, (unsigned long long)st.device_bytes);
    for (int u = 0; u < USERS; u++) tokens_free(&hist[u]);
    free(hist), free(s), free(toff), free(ton);
    tokens_free(&c);
    flame_engine_destroy(off), flame_engine_destroy(on);
    flame_model_destroy(bm.m);
}

int main(int argc, char **argv)
{
    const char *config = "bench/ref_gr_config.json", *device = "cpu", *dtype = "fp32";
    int reps = 3, visits = 2000;
    bool js = false, skip4096 = false, only_trace = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) config = argv[++i];
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dtype = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            long long v_;
            if (!cli_int("kv-cache-bench", "--reps", argv[++i], 1, 1000000, &v_)) return 2;
            reps = (int)v_;
        } else if (!strcmp(argv[i], "--trace-visits") && i + 1 < argc) {
            long long v_;
            if (!cli_int("kv-cache-bench", "--trace-visits", argv[++i], 1, 100000000, &v_)) return 2;
            visits = (int)v_;
        }
        else if (!strcmp(argv[i], "--skip-4096")) skip4096 = true;
        else if (!strcmp(argv[i], "--only-trace")) only_trace = true;
        else if (!strcmp(argv[i], "--json")) js = true;
        else {
            fprintf(stderr, "usage: %s [--config FILE] [--device D] [--dtype T] [--reps R] [--trace-visits V] "
                            "[--skip-4096] [--only-trace] [--json]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || visits < 1) return 2;
    char *json = read_file(config);
    if (!only_trace) {
        rescore(json, device, dtype, 1024, reps, js);
        if (!skip4096) rescore(json, device, dtype, 4096, reps, js);
        many_candidates(json, device, dtype, reps, js);
    }
    trace(json, device, dtype, visits, js);
    free(json);
    return 0;
}
