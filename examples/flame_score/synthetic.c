/* The embedded default: the library's default GR ranking model with random weights and
 * synthetic requests (Zipf item popularity, varied history lengths, side features derived
 * from the item id as a feature store would serve them). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flame/flame.h"
#include "modes.h"
#include "report.h"

static uint64_t next_u64(uint64_t *s) /* splitmix64 */
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *s)
{
    return (double)(next_u64(s) >> 11) / 9007199254740992.0;
}

/* Zipf(alpha) over 0..n-1 by inverting a precomputed CDF (binary search). */
typedef struct zipf {
    double *cdf;
    size_t n;
} zipf;

static int zipf_init(zipf *z, size_t n, double alpha)
{
    z->n = n;
    z->cdf = malloc(n * sizeof *z->cdf);
    if (!z->cdf) return -1;
    double sum = 0;
    for (size_t i = 0; i < n; i++) z->cdf[i] = (sum += pow((double)(i + 1), -alpha));
    for (size_t i = 0; i < n; i++) z->cdf[i] /= sum;
    return 0;
}

static int64_t zipf_draw(const zipf *z, uint64_t *s)
{
    double u = uniform01(s);
    size_t lo = 0, hi = z->n - 1;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (z->cdf[mid] < u) lo = mid + 1;
        else hi = mid;
    }
    /* scatter popularity ranks over the id space so popular items are not all small ids */
    return (int64_t)((lo * 2654435761ull) % z->n);
}

/* Side features of an item, a pure function of its id: artist, album, 1-3 genres. */
enum { SIDE = 3, ARTISTS = 20000, ALBUMS = 50000, GENRES = 500 };

typedef struct token_list {
    int64_t *items;
    int64_t *off[SIDE], *ids[SIDE];
    flame_bags bags[SIDE];
} token_list;

static int tokens_fill(token_list *t, const int64_t *items, size_t n)
{
    for (int s = 0; s < SIDE; s++) {
        t->off[s] = malloc((n + 1) * sizeof(int64_t));
        t->ids[s] = malloc((3 * n + 1) * sizeof(int64_t));
        if (!t->off[s] || !t->ids[s]) return -1;
        t->off[s][0] = 0;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t h = (uint64_t)items[i] * 0x9e3779b97f4a7c15ull;
        int64_t *o0 = t->off[0], *o1 = t->off[1], *o2 = t->off[2];
        t->ids[0][o0[i]] = (int64_t)(h % ARTISTS);
        o0[i + 1] = o0[i] + 1;
        t->ids[1][o1[i]] = (int64_t)((h >> 20) % ALBUMS);
        o1[i + 1] = o1[i] + 1;
        int ng = 1 + (int)((h >> 40) % 3);
        for (int g = 0; g < ng; g++) t->ids[2][o2[i] + g] = (int64_t)(((h >> 8) + 37u * (unsigned)g) % GENRES);
        o2[i + 1] = o2[i] + ng;
    }
    for (int s = 0; s < SIDE; s++) t->bags[s] = (flame_bags){t->off[s], t->ids[s], (size_t)t->off[s][n]};
    return 0;
}

static void tokens_free(token_list *t)
{
    free(t->items);
    for (int s = 0; s < SIDE; s++) {
        free(t->off[s]);
        free(t->ids[s]);
    }
}

typedef struct synth_request {
    token_list hist, cand;
    flame_request req;
} synth_request;

static int make_request(synth_request *r, const zipf *z, size_t max_len, size_t m, uint64_t *rng)
{
    /* history lengths log-uniform in [4, max_len]: most users short, some long */
    size_t n = (size_t)exp(log(4.0) + uniform01(rng) * (log((double)max_len) - log(4.0)));
    r->hist.items = malloc(n * sizeof(int64_t));
    r->cand.items = malloc(m * sizeof(int64_t));
    if (!r->hist.items || !r->cand.items) return -1;
    for (size_t i = 0; i < n; i++) r->hist.items[i] = zipf_draw(z, rng);
    for (size_t i = 0; i < m; i++) r->cand.items[i] = zipf_draw(z, rng);
    if (tokens_fill(&r->hist, r->hist.items, n) || tokens_fill(&r->cand, r->cand.items, m)) return -1;
    r->req = (flame_request){.struct_size = sizeof(flame_request),
                             .history = r->hist.items,
                             .history_len = n,
                             .candidates = r->cand.items,
                             .num_candidates = m,
                             .history_side = r->hist.bags,
                             .candidate_side = r->cand.bags,
                             .num_side_features = SIDE};
    return 0;
}

static void print_example(const synth_request *r, const float *s, int tasks)
{
    size_t m = r->req.num_candidates, order[5];
    size_t top = m < 5 ? m : 5;
    for (size_t k = 0; k < top; k++) { /* top candidates by the first task's score */
        size_t best = m;
        for (size_t c = 0; c < m; c++) {
            int taken = 0;
            for (size_t j = 0; j < k; j++) taken |= order[j] == c;
            if (!taken && (best == m || s[c * tasks] > s[best * tasks])) best = c;
        }
        order[k] = best;
    }
    printf("example: request 0 (history %zu items), top %zu of %zu candidates by task 0:\n", r->req.history_len, top, m);
    for (size_t k = 0; k < top; k++) {
        printf("  #%zu item %-6lld", k + 1, (long long)r->req.candidates[order[k]]);
        for (int t = 0; t < tasks; t++) printf("  task%d %.4f", t, s[order[k] * tasks + t]);
        printf("\n");
    }
}

int run_default(const default_options *o)
{
    flame_model *model = NULL;
    flame_engine *engine = NULL;
    flame_status st = flame_model_create_random(flame_default_model_config(), o->seed, &model);
    if (st) {
        fprintf(stderr, "flame-score: %s: %s\n", flame_status_string(st), flame_last_error());
        return 1;
    }
    if (make_engine(model, o->device, o->dtype, &engine)) {
        flame_model_destroy(model);
        return 1;
    }
    flame_model_info info = {.struct_size = sizeof info};
    flame_model_get_info(model, &info);
    uint64_t rng = o->seed;
    zipf z = {0};
    synth_request *reqs = calloc(o->requests, sizeof *reqs);
    float *scores = malloc(o->candidates * (size_t)info.num_tasks * sizeof(float));
    float *first = malloc(o->candidates * (size_t)info.num_tasks * sizeof(float));
    int rc = reqs && scores && first && zipf_init(&z, (size_t)info.num_items, 1.0) == 0 ? 0 : 1;
    for (size_t i = 0; rc == 0 && i < o->requests; i++)
        rc = make_request(&reqs[i], &z, (size_t)info.max_len, o->candidates, &rng) ? 1 : 0;
    latencies lat = {0};
    size_t tokens = 0;
    progress prog;
    progress_start(&prog, o->requests);
    double t_start = now_us();
    for (size_t i = 0; rc == 0 && i < o->requests; i++) {
        double t0 = now_us();
        st = flame_score(engine, &reqs[i].req, scores, o->candidates * (size_t)info.num_tasks);
        latencies_add(&lat, now_us() - t0);
        if (st) {
            fprintf(stderr, "flame-score: request %zu: %s: %s\n", i, flame_status_string(st), flame_last_error());
            rc = 1;
            break;
        }
        if (i == 0) memcpy(first, scores, o->candidates * (size_t)info.num_tasks * sizeof(float));
        tokens += reqs[i].req.history_len + reqs[i].req.num_candidates;
        progress_update(&prog, i + 1);
    }
    double secs = (now_us() - t_start) / 1e6;
    progress_finish(&prog);
    if (rc == 0) {
        double p50 = latencies_percentile(&lat, 50), p90 = latencies_percentile(&lat, 90),
               p99 = latencies_percentile(&lat, 99);
        double rps = (double)o->requests / secs, cps = rps * (double)o->candidates;
        if (o->json) {
            printf("{\"requests\": %zu, \"candidates\": %zu, \"requests_per_s\": %.2f, \"candidates_per_s\": %.1f, "
                   "\"latency_us\": {\"p50\": %.1f, \"p90\": %.1f, \"p99\": %.1f}}\n",
                   o->requests, o->candidates, rps, cps, p50, p90, p99);
        } else {
            printf("libflame %s, embedded default model: d_model %d, %d blocks, %d heads, FFN %d, SUMI head, %d tasks, "
                   "%.1f MB of weights\n",
                   flame_version_string(), info.d_model, info.num_blocks, info.num_heads, info.ffn_dim, info.num_tasks,
                   (double)info.weight_bytes / 1e6);
            printf("%zu requests (history 4..%d items, Zipf 1.0 popularity), %zu candidates each, %zu tokens\n",
                   o->requests, info.max_len, o->candidates, tokens);
            printf("latency P50 %.0f us  P90 %.0f us  P99 %.0f us   throughput %.1f requests/s, %.0f candidates/s\n",
                   p50, p90, p99, rps, cps);
            print_example(&reqs[0], first, info.num_tasks);
        }
    }
    for (size_t i = 0; reqs && i < o->requests; i++) {
        tokens_free(&reqs[i].hist);
        tokens_free(&reqs[i].cand);
    }
    free(reqs);
    free(scores);
    free(first);
    free(z.cdf);
    latencies_free(&lat);
    flame_engine_destroy(engine);
    flame_model_destroy(model);
    return rc;
}
