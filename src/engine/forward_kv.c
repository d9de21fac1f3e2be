/* The CPU forward pass of one request against one history, executing engine/plan.h: the rows
 * the KV cache holds are read, the others computed (and written to the cache when this call
 * is the user's writer), and the candidates are scored in chunks against the history, so the
 * cost grows as O(m * n) and the scratch as O((n + chunk) * d) whatever m.
 *
 * Layer by layer: the history K/V of the layer is assembled in one contiguous buffer (the
 * cached rows copied out of their blocks, a block's rows of a layer being one copy), the new
 * history rows run the block (their queries see the history before them, causally), then
 * every chunk of candidates runs it (its queries see the whole history and themselves: the
 * SUMI mask). Each row is computed by the same kernels as in fl_forward_cpu (engine/forward.c),
 * whose outputs depend on that row alone: a cached K/V row is the row a cache-off pass
 * computes. */
#include <cblas.h>
#include <string.h>

#include "core/pool.h"
#include "cpu/kernels.h"
#include "engine/cpu_heads.h"
#include "engine/cpu_plan.h"
#include "engine/engine.h"
#include "engine/plan.h"
#include "kvcache/kvcache.h"

typedef struct kv_pass {
    const struct flame_engine *e;
    const struct flame_model *m;
    const fl_model_cfg *c;
    const flame_request *q;
    fl_kv_plan p;
    int threads;
    int32_t R;                   /* rows of the per-step buffers: max(new history rows, chunk, 1) */
    float *Xh, *Xc, *E, *K, *V, *Y, *Q, *A, *F, *tmp, *att;
    int32_t *qpos;
    uint64_t *prefix;            /* [n + 1] the window's prefix hashes */
    size_t att_per;
    /* the cache: a ticket held for the call, and whether this call writes the new rows */
    const fl_kv_ticket *t;
    bool store;
} kv_pass;

static int64_t widest_of(const fl_model_cfg *c)
{
    int64_t w = c->ffn_dim > c->d_model ? c->ffn_dim : c->d_model;
    for (int t = 0; c->head == FLAME_HEAD_SUMI && t < c->num_tasks; t++)
        for (int l = 0; l <= c->tasks[t].num_layers; l++)
            if (c->tasks[t].width[l] > w) w = c->tasks[t].width[l];
    return w;
}

/* Scratch of one request; `ws` NULL only sums sizes. */
static size_t carve(kv_pass *k, fl_workspace *ws)
{
    const fl_model_cfg *c = k->c;
    const int64_t d = c->d_model, n = k->p.n, nh = n - k->p.cached, m = k->p.m, ch = k->p.chunk;
    int64_t R = nh > ch ? nh : ch;
    if (R < 1) R = 1;
    k->R = (int32_t)R;
    k->att_per = fl_cpu_attention_scratch(n, (int32_t)(d / c->num_heads));
    const int64_t widest = widest_of(c);
    struct {
        void **dst;
        size_t bytes;
    } parts[] = {
        {(void **)&k->Xh, (size_t)((nh > 0 ? nh : 1) * d) * 4},
        {(void **)&k->Xc, (size_t)((m > 0 ? m : 1) * d) * 4},
        {(void **)&k->E, c->projection ? (size_t)(R * c->embed_dim) * 4 : 0},
        {(void **)&k->K, (size_t)((n + ch > 0 ? n + ch : 1) * d) * 4},
        {(void **)&k->V, (size_t)((n + ch > 0 ? n + ch : 1) * d) * 4},
        {(void **)&k->Y, (size_t)(R * d) * 4},
        {(void **)&k->Q, (size_t)(R * d) * 4},
        {(void **)&k->A, (size_t)(R * d) * 4},
        {(void **)&k->F, (size_t)(R * widest) * 4},
        {(void **)&k->tmp, (size_t)(R * widest) * 4},
        {(void **)&k->att, k->att_per * (size_t)k->threads * 4},
        {(void **)&k->qpos, (size_t)R * sizeof(int32_t)},
        {(void **)&k->prefix, (size_t)(n + 1) * sizeof(uint64_t)},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        total += fl_ws_round(parts[i].bytes);
        if (ws) *parts[i].dst = fl_workspace_take(ws, parts[i].bytes);
    }
    return total;
}

/* The request's plan with `cached` rows from the cache, its candidate chunk the engine's
 * (kv_chunk: read once a call by the caller, so the scratch sized and carved agree), else
 * fl_plan_chunk's. */
static void plan(kv_pass *k, int32_t chunk, int32_t cached)
{
    fl_plan_request(k->c, k->q->history_len, k->q->num_candidates, cached, &k->p);
    if (chunk > 0 && k->p.m > 0) k->p.chunk = k->p.m < chunk ? k->p.m : chunk;
}

size_t fl_forward_kv_bytes(const struct flame_engine *e, const flame_request *q)
{
    kv_pass k = {.e = e, .m = e->model, .c = &e->model->cfg, .q = q, .threads = e->threads};
    plan(&k, atomic_load(&e->kv_chunk), 0); /* a miss: the most rows */
    return carve(&k, NULL);
}

static void linear(const kv_pass *k, const fl_linear *l, const float *packed, int64_t rows, const float *x,
                   int64_t ldx, float beta, fl_act_kind act, float *y, int64_t ldy)
{
    fl_cpu_plan_linear(k->e->cpu, l, packed, rows, x, ldx, beta, act, y, ldy, k->threads);
}

static void layernorm(const kv_pass *k, int64_t rows, const float *x, const float *res, const fl_layernorm *ln,
                      float *out)
{
    const int32_t d = k->c->d_model;
    fl_cpu_layernorm(rows, d, x, d, res, d, ln->w, ln->b, k->c->ln_eps, k->c->eps_inside_sqrt, out, d);
}

/* ---- tokens: embedding bags, projection, positions, input LayerNorm, R rows at a time */

static void embed_rows(const kv_pass *k, bool cand, int64_t first, int64_t count, float *X)
{
    const fl_model_cfg *c = k->c;
    const struct flame_model *m = k->m;
    const int64_t d = c->d_model;
    for (int64_t r0 = 0; r0 < count; r0 += k->R) {
        const int64_t rows = count - r0 < k->R ? count - r0 : k->R;
        fl_emb_feature fv[FL_MAX_FEATURES];
        int32_t col = 0;
        for (int f = 0; f < c->num_features; f++) {
            fv[f] = cand ? fl_feature_view(c, m, f, k->q->candidates, k->q->candidate_side, first + r0)
                         : fl_feature_view(c, m, f, k->q->history, k->q->history_side, k->p.start + first + r0);
            fv[f].out_col = c->combine_concat ? col : 0;
            col += fv[f].dim;
        }
        float *x = X + r0 * d;
        if (c->projection) {
            fl_cpu_embedding_bag(fv, c->num_features, rows, k->E, c->embed_dim, c->embed_dim);
            linear(k, &m->w.proj, k->e->cpu->proj, rows, k->E, c->embed_dim, 0.0f, FL_KACT_NONE, x, d);
        } else {
            fl_cpu_embedding_bag(fv, c->num_features, rows, x, d, c->embed_dim);
        }
        for (int64_t i = 0; c->position_rule != FL_POS_NONE && i < rows; i++) {
            const int64_t row = cand ? c->candidate_position : fl_plan_history_position(c, first + r0 + i, k->p.n);
            if (row < 0) continue;
            const float *pr = m->w.position + row * d;
            for (int64_t j = 0; j < d; j++) x[i * d + j] += pr[j];
        }
        if (c->input_layernorm) layernorm(k, rows, x, NULL, &m->w.input_ln, x);
    }
}

/* ---- attention of nq query rows (positions qpos) against K/V rows [0, n_hist + n_cand) */

typedef struct att_job {
    const kv_pass *k;
    int64_t n_hist, n_cand, nq;
} att_job;

static void att_head(void *ctx, int64_t h, int worker)
{
    const att_job *j = ctx;
    const kv_pass *k = j->k;
    const int32_t d = k->c->d_model, dh = d / k->c->num_heads;
    const int64_t col = h * dh;
    fl_cpu_attention_sumi(j->n_hist, j->n_cand, 1, dh, k->Q + col, d, k->qpos, j->nq, k->K + col, k->V + col, d, NULL,
                          k->A + col, d, k->att + (size_t)worker * k->att_per);
}

static void attention(const kv_pass *k, int64_t n_hist, int64_t n_cand, int64_t nq)
{
    att_job j = {.k = k, .n_hist = n_hist, .n_cand = n_cand, .nq = nq};
    const int64_t work = nq * (n_hist + 1) * k->c->d_model;
    const int parts = work >= 32768 ? k->threads : 1;
    fl_parallel(parts, k->c->num_heads, att_head, &j);
}

/* The block after attention for `rows` rows of X (the attention output in A): output
 * projection, residual, feed-forward, residual (pre- or post-LN, as engine/forward.c). */
static void block_tail(const kv_pass *k, const fl_block *blk, const fl_cpu_block_plan *pk, int64_t rows, float *X)
{
    const fl_model_cfg *c = k->c;
    const int32_t d = c->d_model, ff = c->ffn_dim;
    const fl_act_kind act = (fl_act_kind)c->activation;
    if (c->pre_ln) {
        linear(k, &blk->o, pk->o, rows, k->A, d, 1.0f, FL_KACT_NONE, X, d);
        layernorm(k, rows, X, NULL, &blk->ln2, k->Q);
        linear(k, &blk->fc1, pk->fc1, rows, k->Q, d, 0.0f, act, k->F, ff);
        linear(k, &blk->fc2, pk->fc2, rows, k->F, ff, 1.0f, FL_KACT_NONE, X, d);
    } else {
        linear(k, &blk->o, pk->o, rows, k->A, d, 0.0f, FL_KACT_NONE, k->Q, d);
        layernorm(k, rows, X, k->Q, &blk->ln1, X);
        linear(k, &blk->fc1, pk->fc1, rows, X, d, 0.0f, act, k->F, ff);
        linear(k, &blk->fc2, pk->fc2, rows, k->F, ff, 0.0f, FL_KACT_NONE, k->Q, d);
        layernorm(k, rows, X, k->Q, &blk->ln2, X);
    }
}

/* K/V rows of layer `layer` between the contiguous buffers and the blocks (to_cache: store). */
static void copy_rows(const kv_pass *k, int32_t layer, int32_t r0, int32_t r1, bool to_cache)
{
    const struct flame_engine *e = k->e;
    const int32_t B = e->kv_lay.block_tokens, d = k->c->d_model;
    for (int32_t r = r0; r < r1;) {
        const int32_t blk = k->t->blocks[r / B], in = r % B, rows = (B - in < r1 - r) ? B - in : r1 - r;
        for (int kv = 0; kv < 2; kv++) {
            float *cache = (float *)(e->kv_blocks + fl_kv_row_offset(&e->kv_lay, blk, layer, kv, in));
            float *buf = (kv ? k->V : k->K) + (int64_t)r * d;
            if (to_cache)
                memcpy(cache, buf, (size_t)rows * (size_t)d * sizeof(float));
            else
                memcpy(buf, cache, (size_t)rows * (size_t)d * sizeof(float));
        }
        r += rows;
    }
}

static void run_block(kv_pass *k, int bi)
{
    const fl_model_cfg *c = k->c;
    const fl_block *blk = &k->m->w.blocks[bi];
    const fl_cpu_block_plan none = {0}, *pk = k->e->cpu->blocks ? &k->e->cpu->blocks[bi] : &none;
    const int32_t d = c->d_model, n = k->p.n, p0 = k->p.cached, nh = n - p0;
    const bool last = bi == c->num_blocks - 1;
    if (p0 > 0) copy_rows(k, bi, 0, p0, false);
    if (nh > 0) { /* the new history rows: K/V of all, the rest for those a later step reads */
        const float *Yin = k->Xh;
        if (c->pre_ln) {
            layernorm(k, nh, k->Xh, NULL, &blk->ln1, k->Y);
            Yin = k->Y;
        }
        linear(k, &blk->k, pk->k, nh, Yin, d, 0.0f, FL_KACT_NONE, k->K + (int64_t)p0 * d, d);
        linear(k, &blk->v, pk->v, nh, Yin, d, 0.0f, FL_KACT_NONE, k->V + (int64_t)p0 * d, d);
        if (k->store) copy_rows(k, bi, p0, n, true);
        const int32_t qa = last ? k->p.q0 - p0 : 0; /* first local row that runs the rest */
        if (qa < nh) {
            const int32_t nq = nh - qa;
            linear(k, &blk->q, pk->q, nq, Yin + (int64_t)qa * d, d, 0.0f, FL_KACT_NONE, k->Q, d);
            for (int32_t i = 0; i < nq; i++) k->qpos[i] = p0 + qa + i;
            attention(k, n, 0, nq);
            block_tail(k, blk, pk, nq, k->Xh + (int64_t)qa * d);
        }
    }
    for (int32_t c0 = 0; c0 < k->p.m; c0 += k->p.chunk) { /* candidates against the whole history */
        const int32_t cn = k->p.m - c0 < k->p.chunk ? k->p.m - c0 : k->p.chunk;
        float *X = k->Xc + (int64_t)c0 * d;
        const float *Yin = X;
        if (c->pre_ln) {
            layernorm(k, cn, X, NULL, &blk->ln1, k->Y);
            Yin = k->Y;
        }
        linear(k, &blk->k, pk->k, cn, Yin, d, 0.0f, FL_KACT_NONE, k->K + (int64_t)n * d, d);
        linear(k, &blk->v, pk->v, cn, Yin, d, 0.0f, FL_KACT_NONE, k->V + (int64_t)n * d, d);
        linear(k, &blk->q, pk->q, cn, Yin, d, 0.0f, FL_KACT_NONE, k->Q, d);
        for (int32_t i = 0; i < cn; i++) k->qpos[i] = n + i;
        attention(k, n, cn, cn);
        block_tail(k, blk, pk, cn, X);
    }
}

/* ---- heads */

static void head_sumi(const kv_pass *k, float *scores)
{
    const fl_model_cfg *c = k->c;
    const struct flame_model *m = k->m;
    const int64_t T = c->num_tasks, d = c->d_model;
    for (int32_t c0 = 0; c0 < k->p.m; c0 += k->p.chunk) {
        const int32_t cn = k->p.m - c0 < k->p.chunk ? k->p.m - c0 : k->p.chunk;
        float *X = k->Xc + (int64_t)c0 * d;
        if (c->final_layernorm) layernorm(k, cn, X, NULL, &m->w.final_ln, X);
        fl_cpu_sumi_heads(m, k->e->cpu, cn, X, scores + (int64_t)c0 * T, k->F, k->tmp, k->threads);
    }
}

/* The dot head for one user, as engine/forward.c's head_dot scores a request alone. */
static void head_dot(const kv_pass *k, float *scores)
{
    const struct flame_model *m = k->m;
    const int32_t d = k->c->d_model;
    const int64_t mc = (int64_t)k->q->num_candidates;
    float *h = k->Xh + (int64_t)(k->p.n - 1 - k->p.cached) * d;
    if (k->c->final_layernorm) layernorm(k, 1, h, NULL, &m->w.final_ln, h);
    if (mc == 0) return;
    const int64_t c0 = fl_plan_dot_contiguous_start(k->q, NULL, -1);
    fl_cpu_dot_user(m, k->e->cpu, h, k->q->candidates, mc, c0, scores, k->threads);
}

/* ---- the cache: lookup before the pass, publish or abort after */

static void side_views(const kv_pass *k, fl_kv_bags_view *v, int *num)
{
    *num = k->q->history_side ? k->c->num_side : 0;
    for (int s = 0; s < *num; s++) v[s] = (fl_kv_bags_view){k->q->history_side[s].offsets, k->q->history_side[s].ids};
}

static void lookup(kv_pass *k, fl_kv_ticket *t)
{
    fl_kv_cache *kc = k->e->kv;
    fl_kv_key key = {.user = k->q->user_id, .version = k->q->history_version, .tokens = k->p.n,
                     .extendable = fl_plan_extendable(k->c)};
    fl_kv_bags_view views[FL_MAX_FEATURES];
    int num_side = 0;
    side_views(k, views, &num_side);
    if (key.version == 0) { /* the hashes decide: computed before the lookup */
        fl_kv_prefix_hashes(k->q->history, views, num_side, k->p.start, k->p.n, k->prefix);
        key.prefix = k->prefix;
    }
    if (fl_kv_lookup(kc, &key, t) == FL_KV_NEED_HASH) { /* a caller's version that is no hit */
        fl_kv_prefix_hashes(k->q->history, views, num_side, k->p.start, k->p.n, k->prefix);
        key.prefix = k->prefix;
        fl_kv_lookup(kc, &key, t);
    }
}

flame_status fl_forward_cpu_kv(struct flame_engine *e, fl_workspace *ws, const flame_request *q, float *scores)
{
    const fl_model_cfg *c = &e->model->cfg;
    kv_pass k = {.e = e, .m = e->model, .c = c, .q = q, .threads = e->threads};
    const int32_t chunk = atomic_load(&e->kv_chunk);
    plan(&k, chunk, 0);
    flame_status st = fl_workspace_reserve(e, ws, carve(&k, NULL)); /* a no-op after fl_forward_bytes */
    if (st) return st;
    if (c->head == FLAME_HEAD_DOT && (k.p.n == 0 || q->num_candidates == 0)) { /* no user state: zeros */
        memset(scores, 0, q->num_candidates * sizeof(float));
        return FLAME_OK;
    }
    if (c->head == FLAME_HEAD_SUMI && q->num_candidates == 0) return FLAME_OK;
    carve(&k, ws);
    fl_kv_ticket t = {0};
    const bool cached = e->kv && q->kv_cache == 1 && k.p.n > 0;
    if (cached) {
        lookup(&k, &t);
        plan(&k, chunk, t.cached);
        k.store = t.writer && fl_kv_reserve(e->kv, &t);
    }
    k.t = &t;
    embed_rows(&k, false, k.p.cached, k.p.n - k.p.cached, k.Xh);
    embed_rows(&k, true, 0, k.p.m, k.Xc);
    for (int bi = 0; bi < c->num_blocks; bi++) run_block(&k, bi);
    if (c->head == FLAME_HEAD_SUMI)
        head_sumi(&k, scores);
    else
        head_dot(&k, scores);
    if (cached) {
        if (k.store)
            fl_kv_publish(e->kv, &t, q->history_version, k.prefix[k.p.n]);
        else if (t.writer)
            fl_kv_abort(e->kv, &t);
        fl_kv_release(e->kv, &t);
        fl_kv_count_tokens(e->kv, (uint64_t)(k.p.n - k.p.cached), (uint64_t)k.p.cached);
    }
    return FLAME_OK;
}
