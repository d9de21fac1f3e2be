/* cache-bench: the item cache's hit ratio against plain LRU on Zipf traces (and, with
 * `--trace FILE`, on a real cache trace: bench/fetch-trace), its hit-path throughput and
 * latency, and flame_score with features from Redis through the cache versus straight from
 * Redis. `--json` prints one JSON object; runs on a CPU in under a minute. `--threads N` also
 * measures the hit path with N threads (hits_per_s_nthreads), for machines with more cores.
 * The end-to-end part needs a Redis server: FLAME_TEST_REDIS_PORT (else it is reported as
 * skipped, with the reason). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "flame/flame.h"
#include "cli_args.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 42;
static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Zipf(alpha) over n keys by inverse CDF; ranks are scattered over ids so popularity is not
 * ordered by id. */
static int64_t *zipf_trace(double alpha, int64_t n, size_t len)
{
    double *cdf = malloc((size_t)n * sizeof *cdf), sum = 0;
    for (int64_t i = 0; i < n; i++) cdf[i] = (sum += pow((double)(i + 1), -alpha));
    int64_t *t = malloc(len * sizeof *t);
    for (size_t k = 0; k < len; k++) {
        double u = (double)(rnd() >> 11) / 9007199254740992.0 * sum;
        int64_t lo = 0, hi = n - 1;
        while (lo < hi) {
            int64_t mid = (lo + hi) / 2;
            if (cdf[mid] < u) lo = mid + 1; else hi = mid;
        }
        t[k] = (lo * 2654435761ll) % n;
    }
    free(cdf);
    return t;
}

/* A real trace in libCacheSim's csv form ("time, object, size, next_access_vtime", '#' header):
 * the object ids, in order. */
static int64_t *read_trace(const char *path, size_t *len)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "trace %s: cannot open (bench/fetch-trace downloads it)\n", path);
        exit(1);
    }
    size_t n = 0, cap = 1 << 20;
    int64_t *t = malloc(cap * sizeof *t);
    char line[256];
    while (fgets(line, sizeof line, f)) {
        char *comma = strchr(line, ',');
        if (line[0] == '#' || !comma) continue;
        if (n == cap) t = realloc(t, (cap *= 2) * sizeof *t);
        t[n++] = (int64_t)strtoull(comma + 1, NULL, 10); /* ids are u64 hashes: any bit pattern is a key */
    }
    fclose(f);
    *len = n;
    return t;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static size_t distinct(const int64_t *t, size_t len)
{
    int64_t *s = malloc(len * sizeof *s);
    memcpy(s, t, len * sizeof *s);
    qsort(s, len, sizeof *s, cmp_i64);
    size_t d = len > 0;
    for (size_t i = 1; i < len; i++) d += s[i] != s[i - 1];
    free(s);
    return d;
}

/* ---- plain LRU: hash map + doubly linked list, the baseline */
typedef struct lru {
    int64_t cap, size, mask;
    int64_t *key, *prev, *next, *hslot; /* node arrays; hslot: open addressing -> node */
    int64_t head, tail, free_top;
} lru;

static uint64_t mix(int64_t k)
{
    uint64_t h = (uint64_t)k * 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
}

static lru *lru_new(int64_t cap)
{
    lru *l = calloc(1, sizeof *l);
    l->cap = cap;
    int64_t sz = 4;
    while (sz < 2 * cap) sz *= 2;
    l->mask = sz - 1;
    l->key = malloc((size_t)cap * 8), l->prev = malloc((size_t)cap * 8), l->next = malloc((size_t)cap * 8);
    l->hslot = malloc((size_t)sz * 8);
    memset(l->hslot, 0xff, (size_t)sz * 8);
    l->head = l->tail = -1;
    return l;
}
static int64_t lru_find_slot(lru *l, int64_t k)
{
    int64_t j = (int64_t)(mix(k) & (uint64_t)l->mask);
    while (l->hslot[j] >= 0 && l->key[l->hslot[j]] != k) j = (j + 1) & l->mask;
    return j;
}
static void lru_unlink(lru *l, int64_t n)
{
    if (l->prev[n] >= 0) l->next[l->prev[n]] = l->next[n]; else l->head = l->next[n];
    if (l->next[n] >= 0) l->prev[l->next[n]] = l->prev[n]; else l->tail = l->prev[n];
}
static void lru_push_front(lru *l, int64_t n)
{
    l->prev[n] = -1, l->next[n] = l->head;
    if (l->head >= 0) l->prev[l->head] = n; else l->tail = n;
    l->head = n;
}
static void lru_del_slot(lru *l, int64_t j)
{
    l->hslot[j] = -1;
    for (int64_t k = (j + 1) & l->mask; l->hslot[k] >= 0; k = (k + 1) & l->mask) {
        int64_t home = (int64_t)(mix(l->key[l->hslot[k]]) & (uint64_t)l->mask);
        if (((k - home) & l->mask) >= ((k - j) & l->mask)) {
            l->hslot[j] = l->hslot[k];
            l->hslot[k] = -1;
            j = k;
        }
    }
}
static int lru_access(lru *l, int64_t k) /* 1 = hit */
{
    int64_t j = lru_find_slot(l, k);
    if (l->hslot[j] >= 0) {
        int64_t n = l->hslot[j];
        lru_unlink(l, n);
        lru_push_front(l, n);
        return 1;
    }
    int64_t n;
    if (l->size < l->cap) {
        n = l->size++;
    } else {
        n = l->tail;
        lru_unlink(l, n);
        lru_del_slot(l, lru_find_slot(l, l->key[n]));
        j = lru_find_slot(l, k);
    }
    l->key[n] = k;
    l->hslot[j] = n;
    lru_push_front(l, n);
    return 0;
}
static void lru_free(lru *l)
{
    free(l->key), free(l->prev), free(l->next), free(l->hslot), free(l);
}

/* ---- a trivial in-memory source: one id per slot */
static flame_status tiny_fetch(void *user, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    (void)user;
    for (size_t i = 0; i < n; i++) {
        int64_t offs[2] = {0, 1}, v = ids[i];
        flame_status st = flame_feature_batch_set(out, i, offs, &v, 1, NULL, 0);
        if (st) return st;
    }
    return FLAME_OK;
}

static flame_item_cache *new_cache(flame_feature_source *s, int64_t entries, int64_t shards)
{
    flame_item_cache_params p = {.struct_size = sizeof p};
    p.max_entries = entries;
    p.shards = shards;
    p.manual_refresh = 1;
    p.refresh_percent = 100; /* no refresh-ahead */
    flame_item_cache *c;
    if (flame_item_cache_create(s, &p, &c)) {
        fprintf(stderr, "cache: %s\n", flame_last_error());
        exit(1);
    }
    return c;
}

static double cache_hit_ratio(flame_feature_source *s, const int64_t *trace, size_t len, int64_t entries)
{
    flame_item_cache *c = new_cache(s, entries, 1); /* one shard: the policy alone, as the LRU */
    flame_feature_batch *b;
    flame_feature_batch_create(1, &b);
    for (size_t i = 0; i < len; i++) flame_item_cache_get(c, &trace[i], 1, b);
    flame_item_cache_stats st = {.struct_size = sizeof st};
    flame_item_cache_get_stats(c, &st);
    flame_feature_batch_destroy(b);
    flame_item_cache_destroy(c);
    return (double)st.hits / (double)(st.hits + st.misses);
}

static double lru_hit_ratio(const int64_t *trace, size_t len, int64_t entries)
{
    lru *l = lru_new(entries);
    size_t hits = 0;
    for (size_t i = 0; i < len; i++) hits += (size_t)lru_access(l, trace[i]);
    lru_free(l);
    return (double)hits / (double)len;
}

/* ---- hit path */
typedef struct hit_arg {
    flame_item_cache *cache;
    const int64_t *keys;
    size_t nkeys, batch;
    double seconds, t0, t1;
    uint64_t lookups;
    pthread_barrier_t *bar;
} hit_arg;

static void *hit_worker(void *p)
{
    hit_arg *a = p;
    flame_feature_batch *b;
    flame_feature_batch_create(1, &b);
    pthread_barrier_wait(a->bar);
    double t0 = a->t0 = now_s();
    size_t pos = 0;
    uint64_t n = 0;
    while (now_s() - t0 < a->seconds) {
        for (int rep = 0; rep < 256; rep++) {
            if (flame_item_cache_get(a->cache, a->keys + pos, a->batch, b)) {
                fprintf(stderr, "hit path: %s\n", flame_last_error());
                exit(1);
            }
            pos = (pos + a->batch) % (a->nkeys - a->batch);
            n += a->batch;
        }
    }
    a->lookups = n;
    a->t1 = now_s();
    flame_feature_batch_destroy(b);
    return NULL;
}

#define MAX_THREADS 64

/* Lookups per second of `threads` threads together: all their lookups over the wall time from
 * the first start to the last end (not a sum of per-thread rates, which would count a thread
 * that ran while another was descheduled at full speed). Exits if any lookup missed: the
 * figure is for hits only. */
static double hits_per_s(flame_item_cache *c, const int64_t *keys, size_t nkeys, int threads, size_t batch)
{
    pthread_t th[MAX_THREADS];
    hit_arg a[MAX_THREADS];
    pthread_barrier_t bar;
    flame_item_cache_stats s0 = {.struct_size = sizeof s0}, s1 = s0;
    flame_item_cache_get_stats(c, &s0);
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) {
        a[i] = (hit_arg){c, keys + (size_t)i * 4096, nkeys - (size_t)i * 4096, batch, 1.5, 0, 0, 0, &bar};
        pthread_create(&th[i], NULL, hit_worker, &a[i]);
    }
    double first = 0, last = 0;
    uint64_t total = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        total += a[i].lookups;
        if (!i || a[i].t0 < first) first = a[i].t0;
        if (a[i].t1 > last) last = a[i].t1;
    }
    pthread_barrier_destroy(&bar);
    flame_item_cache_get_stats(c, &s1);
    if (s1.misses != s0.misses || s1.hits - s0.hits != total) {
        fprintf(stderr, "hit path: %llu misses, %llu hits for %llu lookups\n", (unsigned long long)(s1.misses - s0.misses),
                (unsigned long long)(s1.hits - s0.hits), (unsigned long long)total);
        exit(1);
    }
    return (double)total / (last - first);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}
static uint64_t ns_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- end to end (Redis) */
#define E2E_ITEMS 100000
#define E2E_HIST 50
#define E2E_CANDS 100

typedef struct e2e_result {
    double rps, p50_ms, p99_ms, hit_ratio;
} e2e_result;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Bags for the tokens from a fetched batch (the "straight from Redis" caller). */
typedef struct bags3 {
    int64_t *off[3], *ids[3];
    flame_bags b[3];
} bags3;

static void bags_from(bags3 *g, const flame_feature_batch *fb, size_t first, size_t n)
{
    for (int s = 0; s < 3; s++) {
        g->off[s][0] = 0;
        int64_t k = 0;
        for (size_t t = 0; t < n; t++) {
            int found;
            const int64_t *ids;
            size_t cnt;
            flame_feature_batch_get_slot(fb, first + t, s, &found, &ids, &cnt);
            for (size_t i = 0; i < cnt; i++) g->ids[s][k++] = ids[i];
            g->off[s][t + 1] = k;
        }
        g->b[s] = (flame_bags){g->off[s], g->ids[s], (size_t)k};
    }
}

static e2e_result run_e2e(flame_engine *e, flame_feature_source *direct, flame_item_cache *cache, const int64_t *trace,
                          size_t nreq)
{
    e2e_result r = {0};
    double *lat = malloc(nreq * sizeof *lat);
    float *scores = malloc(E2E_CANDS * 3 * sizeof(float));
    flame_feature_batch *fb;
    flame_feature_batch_create(3, &fb);
    bags3 hb, cb;
    for (int s = 0; s < 3; s++) {
        hb.off[s] = malloc((E2E_HIST + 1) * 8), hb.ids[s] = malloc(E2E_HIST * 8 * 4);
        cb.off[s] = malloc((E2E_CANDS + 1) * 8), cb.ids[s] = malloc(E2E_CANDS * 8 * 4);
    }
    flame_item_cache_stats s0 = {.struct_size = sizeof s0}, s1 = s0;
    if (cache) flame_item_cache_get_stats(cache, &s0);
    double t0 = now_s();
    for (size_t q = 0; q < nreq; q++) {
        const int64_t *tok = trace + q * (E2E_HIST + E2E_CANDS);
        double a = now_s();
        flame_request req = {.struct_size = sizeof req, .history = tok, .history_len = E2E_HIST,
                             .candidates = tok + E2E_HIST, .num_candidates = E2E_CANDS, .num_side_features = 3};
        if (!cache) { /* one pipelined Redis fetch per request, bags built by the caller */
            if (flame_feature_source_fetch(direct, tok, E2E_HIST + E2E_CANDS, fb)) {
                fprintf(stderr, "redis: %s\n", flame_last_error());
                exit(1);
            }
            bags_from(&hb, fb, 0, E2E_HIST);
            bags_from(&cb, fb, E2E_HIST, E2E_CANDS);
            req.history_side = hb.b, req.candidate_side = cb.b;
        }
        if (flame_score(e, &req, scores, E2E_CANDS * 3)) {
            fprintf(stderr, "score: %s\n", flame_last_error());
            exit(1);
        }
        lat[q] = (now_s() - a) * 1e3;
    }
    r.rps = (double)nreq / (now_s() - t0);
    qsort(lat, nreq, sizeof *lat, cmp_d);
    r.p50_ms = lat[nreq / 2];
    r.p99_ms = lat[(size_t)((double)nreq * 0.99)];
    if (cache) {
        flame_item_cache_get_stats(cache, &s1);
        r.hit_ratio = (double)(s1.hits - s0.hits) / (double)(s1.hits + s1.misses - s0.hits - s0.misses);
    }
    for (int s = 0; s < 3; s++) free(hb.off[s]), free(hb.ids[s]), free(cb.off[s]), free(cb.ids[s]);
    flame_feature_batch_destroy(fb);
    free(lat), free(scores);
    return r;
}

int main(int argc, char **argv)
{
    int json = 0;
    const char *trace_path = NULL;
    int more_threads = 0; /* --threads N: the hit path with N threads as well */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--trace") && i + 1 < argc) {
            trace_path = argv[++i];
        } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            long long v_;
            if (!cli_int("cache-bench", "--threads", argv[++i], 1, MAX_THREADS, &v_)) return 2;
            more_threads = (int)v_;
            if (more_threads < 1 || more_threads > MAX_THREADS) {
                fprintf(stderr, "cache-bench: --threads takes 1..%d\n", MAX_THREADS);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: cache-bench [--json] [--trace FILE] [--threads N]\n");
            return 2;
        }
    }
    const int64_t N = 100000;
    const size_t LEN = 2000000;
    const double alphas[3] = {0.8, 0.99, 1.2};
    const double sizes[3] = {0.001, 0.01, 0.1};
    double hr[3][3], hl[3][3];
    flame_feature_source *tiny;
    flame_feature_source_create_callback(1, tiny_fetch, NULL, NULL, &tiny);
    int64_t *trace099 = NULL;
    for (int a = 0; a < 3; a++) {
        int64_t *t = zipf_trace(alphas[a], N, LEN);
        for (int s = 0; s < 3; s++) {
            int64_t entries = (int64_t)(sizes[s] * (double)N);
            hr[a][s] = cache_hit_ratio(tiny, t, LEN, entries);
            hl[a][s] = lru_hit_ratio(t, LEN, entries);
        }
        if (a == 1) trace099 = t; else free(t);
    }

    /* a real trace: sizes as a share of its distinct keys */
    char real[1024] = "null";
    if (trace_path) {
        size_t tlen, nd;
        int64_t *t = read_trace(trace_path, &tlen);
        nd = distinct(t, tlen);
        const char *base = strrchr(trace_path, '/') ? strrchr(trace_path, '/') + 1 : trace_path;
        int off = snprintf(real, sizeof real, "{\"trace\":\"%s\",\"requests\":%zu,\"keys\":%zu", base, tlen, nd);
        for (int s = 0; s < 3; s++) {
            int64_t entries = (int64_t)(sizes[s] * (double)nd);
            double rs = cache_hit_ratio(tiny, t, tlen, entries), rl = lru_hit_ratio(t, tlen, entries);
            off += snprintf(real + off, sizeof real - (size_t)off, ",\"entries_%s\":%lld,\"s3fifo_%s\":%.4f,\"lru_%s\":%.4f",
                            s == 0 ? "0.1pct" : s == 1 ? "1pct" : "10pct", (long long)entries,
                            s == 0 ? "0.1pct" : s == 1 ? "1pct" : "10pct", rs, s == 0 ? "0.1pct" : s == 1 ? "1pct" : "10pct", rl);
        }
        snprintf(real + off, sizeof real - (size_t)off, "}");
        free(t);
    }

    /* hit path: a cache holding all 100k keys (64 shards, the default), all lookups hit */
    flame_item_cache *hc = new_cache(tiny, 200000, 64);
    flame_feature_batch *b;
    flame_feature_batch_create(1, &b);
    for (int64_t k = 0; k < N; k += 1000) {
        int64_t ids[1000];
        for (int i = 0; i < 1000; i++) ids[i] = k + i;
        flame_item_cache_get(hc, ids, 1000, b);
    }
    /* batches of 64 ids, as a request's tokens (the engine makes one call per batch of
     * requests); and one id per call, the worst case for the per-call costs */
    double h1 = hits_per_s(hc, trace099, LEN, 1, 64), h2 = hits_per_s(hc, trace099, LEN, 2, 64);
    double h1s = hits_per_s(hc, trace099, LEN, 1, 1);
    double hn = more_threads ? hits_per_s(hc, trace099, LEN, more_threads, 64) : 0; /* --threads N: scaling */
    enum { LAT = 200000 };
    uint64_t *lat = malloc(LAT * sizeof *lat), t_over = 0;
    for (int i = 0; i < 1000; i++) { uint64_t a = ns_now(); t_over += ns_now() - a; }
    for (int i = 0; i < LAT; i++) {
        uint64_t a = ns_now();
        flame_item_cache_get(hc, &trace099[i], 1, b);
        lat[i] = ns_now() - a;
    }
    qsort(lat, LAT, sizeof *lat, cmp_u64);
    uint64_t p50 = lat[LAT / 2], p99 = lat[LAT * 99 / 100];
    flame_item_cache_destroy(hc);

    /* end to end */
    char e2e[1024] = "null";
    const char *port = getenv("FLAME_TEST_REDIS_PORT");
    if (port && *port) {
        char path[] = "/tmp/flame-bench-features-XXXXXX";
        int fd = mkstemp(path);
        FILE *f = fdopen(fd, "w");
        fprintf(f, "flame-features 1 slots=3 dense=0\n"); /* artist, album, genres (1-3) of the default model */
        for (int64_t i = 0; i < E2E_ITEMS; i++) {
            fprintf(f, "%lld\t%lld\t%lld\t%lld", (long long)i, (long long)(i % 20000), (long long)(i % 50000),
                    (long long)(i % 500));
            for (int64_t g = 1; g <= i % 3; g++) fprintf(f, ",%lld", (long long)((i * 7 + g) % 500));
            fprintf(f, "\n");
        }
        fclose(f);
        long long port_n;
        if (!cli_int("cache-bench", "FLAME_TEST_REDIS_PORT", port, 1, 65535, &port_n)) return 2;
        flame_redis_options o = {.struct_size = sizeof o, .port = (int32_t)port_n, .key_prefix = "flamebench:item:",
                                 .num_slots = 3};
        uint64_t written;
        flame_feature_source *redis;
        flame_model *m;
        flame_engine *direct_e, *cached_e;
        if (flame_redis_load_features(&o, path, &written) || flame_feature_source_create_redis(&o, &redis) ||
            flame_model_create_random(flame_default_model_config(), 1, &m) ||
            flame_engine_create(m, NULL, &direct_e) || flame_engine_create(m, NULL, &cached_e)) {
            fprintf(stderr, "e2e setup: %s\n", flame_last_error());
            return 1;
        }
        unlink(path);
        /* 10% of the items fit: Zipf 0.99 traffic then hits about 3 times in 4 */
        flame_item_cache *ec = new_cache(redis, E2E_ITEMS / 10, 64);
        flame_engine_set_item_cache(cached_e, ec);
        const size_t NREQ = 300, WARM = 300;
        int64_t *tr = zipf_trace(0.99, E2E_ITEMS, (NREQ + WARM) * (E2E_HIST + E2E_CANDS));
        run_e2e(cached_e, redis, ec, tr, WARM); /* warm the cache */
        const int64_t *measured = tr + WARM * (E2E_HIST + E2E_CANDS);
        e2e_result rd = run_e2e(direct_e, redis, NULL, measured, NREQ);
        e2e_result rc = run_e2e(cached_e, redis, ec, measured, NREQ);
        snprintf(e2e, sizeof e2e,
                 "{\"model\":\"embedded default (d256, 4 blocks, 3 side features)\",\"history\":%d,\"candidates\":%d,"
                 "\"requests\":%zu,\"cache_entries\":%d,\"hit_ratio\":%.4f,"
                 "\"redis_direct\":{\"requests_per_s\":%.1f,\"p50_ms\":%.3f,\"p99_ms\":%.3f},"
                 "\"redis_through_cache\":{\"requests_per_s\":%.1f,\"p50_ms\":%.3f,\"p99_ms\":%.3f}}",
                 E2E_HIST, E2E_CANDS, NREQ, E2E_ITEMS / 10, rc.hit_ratio, rd.rps, rd.p50_ms, rd.p99_ms, rc.rps,
                 rc.p50_ms, rc.p99_ms);
        flame_engine_destroy(direct_e), flame_engine_destroy(cached_e);
        flame_item_cache_destroy(ec);
        flame_feature_source_destroy(redis);
        flame_model_destroy(m);
        free(tr);
    } else if (!json) {
        fprintf(stderr, "end to end skipped: FLAME_TEST_REDIS_PORT is not set\n");
    }

    if (json) {
        printf("{\"policy\":\"s3fifo\",\"keys\":%lld,\"requests\":%zu,", (long long)N, LEN);
        const char *an[3] = {"08", "099", "12"}, *sn[3] = {"0.1pct", "1pct", "10pct"};
        for (int a = 0; a < 3; a++)
            for (int s = 0; s < 3; s++)
                printf("\"hit_ratio_zipf%s_%s\":%.4f,\"hit_ratio_lru_zipf%s_%s\":%.4f,", an[a], sn[s], hr[a][s], an[a],
                       sn[s], hl[a][s]);
        if (more_threads) printf("\"threads\":%d,\"hits_per_s_nthreads\":%.0f,", more_threads, hn);
        printf("\"hits_per_s_1thread\":%.0f,\"hits_per_s_2threads\":%.0f,\"hits_per_s_1thread_batch1\":%.0f,"
               "\"p50_hit_ns\":%llu,\"p99_hit_ns\":%llu,\"timer_overhead_ns\":%llu,\"real_trace\":%s,\"e2e\":%s}\n",
               h1, h2, h1s, (unsigned long long)p50, (unsigned long long)p99, (unsigned long long)(t_over / 1000), real,
               e2e);
    } else {
        printf("hit ratio, S3-FIFO vs LRU (%lld keys, %zu requests)\n", (long long)N, LEN);
        for (int a = 0; a < 3; a++)
            for (int s = 0; s < 3; s++)
                printf("  zipf %.2f  cache %5.1f%%: s3fifo %.4f  lru %.4f  (%+.2f points)\n", alphas[a],
                       sizes[s] * 100, hr[a][s], hl[a][s], (hr[a][s] - hl[a][s]) * 100);
        printf("real trace: %s\n", real);
        printf("hit path: %.1f M lookups/s (1 thread), %.1f M lookups/s (2 threads), batches of 64; %.1f M lookups/s "
               "(1 thread, one id per call); single lookup p50 %llu ns, p99 %llu ns (timer included)\n",
               h1 / 1e6, h2 / 1e6, h1s / 1e6, (unsigned long long)p50, (unsigned long long)p99);
        printf("end to end: %s\n", e2e);
    }
    free(lat);
    free(trace099);
    flame_feature_batch_destroy(b);
    flame_feature_source_destroy(tiny);
    return 0;
}
