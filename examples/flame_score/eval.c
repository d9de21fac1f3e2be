/* Leave-last-out, full-sort evaluation (the protocol of SASRec/S3-Rec/ICLRec): for each
 * user the last item is the target, the items before it are the history; every item id is
 * scored, items of the history are set to score 0, and the target's rank gives HR@K and
 * NDCG@K = 1/log2(rank + 2). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flame/flame.h"
#include "modes.h"
#include "report.h"
#include "sequences.h"

/* 0-based rank of the target: items scoring higher, then equal-scoring items with a smaller
 * id (a stable descending sort), so ties never flatter the model. */
static size_t target_rank(const float *s, size_t n, int64_t target)
{
    float t = s[target];
    size_t rank = 0;
    for (size_t i = 0; i < n; i++) rank += s[i] > t || (s[i] == t && (int64_t)i < target);
    return rank;
}

static void print_results(const eval_options *o, const double *hr, const double *ndcg, size_t users, double users_per_s,
                          const latencies *lat)
{
    double p50 = latencies_percentile(lat, 50), p90 = latencies_percentile(lat, 90), p99 = latencies_percentile(lat, 99);
    if (!o->json) {
        for (int k = 0; k < o->num_ks; k++) printf("HR@%-3d %.4f   NDCG@%-3d %.4f\n", o->ks[k], hr[k], o->ks[k], ndcg[k]);
        printf("users %zu   %.0f users/s   latency per call (batch %zu) P50 %.0f us  P90 %.0f us  P99 %.0f us\n", users,
               users_per_s, o->batch, p50, p90, p99);
        return;
    }
    cJSON *root = cJSON_CreateObject(), *lj = cJSON_CreateObject();
    char key[32];
    for (int k = 0; k < o->num_ks; k++) {
        snprintf(key, sizeof key, "HR@%d", o->ks[k]);
        cJSON_AddNumberToObject(root, key, hr[k]);
        snprintf(key, sizeof key, "NDCG@%d", o->ks[k]);
        cJSON_AddNumberToObject(root, key, ndcg[k]);
    }
    cJSON_AddNumberToObject(root, "users", (double)users);
    cJSON_AddNumberToObject(root, "users_per_s", users_per_s);
    cJSON_AddNumberToObject(lj, "p50", p50);
    cJSON_AddNumberToObject(lj, "p90", p90);
    cJSON_AddNumberToObject(lj, "p99", p99);
    cJSON_AddItemToObject(root, "latency_us", lj);
    cJSON_AddNumberToObject(root, "batch", (double)o->batch);
    char *text = cJSON_PrintUnformatted(root);
    if (text) puts(text);
    free(text);
    cJSON_Delete(root);
}

static int fail(flame_status st, const char *what)
{
    fprintf(stderr, "flame-score: %s: %s: %s\n", what, flame_status_string(st), flame_last_error());
    return 1;
}

int run_eval(const eval_options *o)
{
    flame_model *model = NULL;
    flame_engine *engine = NULL;
    flame_status st = flame_model_load(o->model, &model);
    if (st) return fail(st, "loading the model");
    flame_model_info info = {.struct_size = sizeof info};
    flame_model_get_info(model, &info);
    if (info.head != FLAME_HEAD_DOT || info.num_side_features) {
        fprintf(stderr, "flame-score: --eval loo needs a dot-head model without side features\n");
        flame_model_destroy(model);
        return 1;
    }
    int bad = make_engine(model, o->device, o->dtype, &engine);
    flame_model_destroy(model); /* the engine holds its own reference */
    if (bad) return 1;
    sequences seq;
    if (sequences_read(o->sequences, &seq)) {
        flame_engine_destroy(engine);
        return 1;
    }
    const size_t N = (size_t)info.num_items, B = o->batch;
    int64_t *cands = malloc(N * sizeof *cands);
    float *scores = malloc(B * N * sizeof *scores);
    flame_request *reqs = calloc(B, sizeof *reqs);
    double hr[MAX_KS] = {0}, ndcg[MAX_KS] = {0};
    latencies lat = {0};
    int rc = cands && scores && reqs ? 0 : 1;
    for (size_t i = 0; rc == 0 && i < N; i++) cands[i] = (int64_t)i;
    size_t users = 0;
    progress prog;
    progress_start(&prog, seq.num_users);
    double t_start = now_us();
    for (size_t u0 = 0; rc == 0 && u0 < seq.num_users; u0 += B) {
        size_t nb = 0;
        for (size_t u = u0; u < seq.num_users && u < u0 + B; u++) {
            size_t len = seq.offsets[u + 1] - seq.offsets[u];
            if (len == 0) continue; /* a line with a user and no items has no target */
            reqs[nb++] = (flame_request){.struct_size = sizeof(flame_request),
                                         .user_id = (int64_t)u,
                                         .history = seq.items + seq.offsets[u],
                                         .history_len = len - 1,
                                         .candidates = cands,
                                         .num_candidates = N};
        }
        double t0 = now_us();
        st = flame_score_batch(engine, reqs, nb, scores, nb * N);
        double dt = now_us() - t0;
        if (st) {
            rc = fail(st, "scoring");
            break;
        }
        for (size_t i = 0; i < nb; i++) {
            latencies_add(&lat, dt);
            float *s = scores + i * N;
            const int64_t *hist = reqs[i].history;
            int64_t target = hist[reqs[i].history_len];
            if (target >= (int64_t)N) {
                fprintf(stderr, "flame-score: user %lld: target item %lld >= %zu items in the model\n",
                        (long long)reqs[i].user_id, (long long)target, N);
                rc = 1;
                break;
            }
            if (o->exclude_history)
                for (size_t h = 0; h < reqs[i].history_len; h++) /* ids < N: the library validated them */
                    if (hist[h] < (int64_t)N) s[hist[h]] = 0.0f;
            size_t rank = target_rank(s, N, target);
            for (int k = 0; k < o->num_ks; k++)
                if (rank < (size_t)o->ks[k]) {
                    hr[k] += 1.0;
                    ndcg[k] += 1.0 / log2((double)rank + 2.0);
                }
            users++;
        }
        progress_update(&prog, u0 + B < seq.num_users ? u0 + B : seq.num_users); /* lines read, skipped ones too */
    }
    double elapsed = now_us() - t_start;
    progress_finish(&prog);
    if (rc == 0 && !users) {
        fprintf(stderr, "flame-score: no line of '%s' has an item to hold out (each is 'user item item ...')\n",
                o->sequences);
        rc = 1;
    }
    if (rc == 0) {
        for (int k = 0; k < o->num_ks; k++) {
            hr[k] /= (double)users;
            ndcg[k] /= (double)users;
        }
        print_results(o, hr, ndcg, users, (double)users / (elapsed / 1e6), &lat);
    }
    latencies_free(&lat);
    free(reqs);
    free(scores);
    free(cands);
    sequences_free(&seq);
    flame_engine_destroy(engine);
    return rc;
}
