/* The CPU forward pass over a batch of requests (docs/model-format.md).
 *
 * All requests' tokens are packed into one [T, d] matrix so every token-wise layer
 * (projection, q/k/v/o, FFN, LayerNorm) is one GEMM or one loop over the batch; only
 * attention runs per request. The last block computes queries, FFN and LayerNorm only for
 * the rows the head reads (the last history token for the dot head, the candidates for the
 * sumi head): keys and values still come from every token.
 *
 * Threads: libflame's one pool (core/pool.h), FLAME_OPT_THREADS a call. The GEMMs
 * (own kernels, engine/cpu_plan.h) split their rows or columns over it; the per-request work
 * (embedding bags, positions, attention per request and head, LayerNorm rows) is spread over it
 * too. Each output is computed by the same code whatever thread runs it, so the bits depend on
 * neither the thread count nor the schedule. On a CPU without AVX2 the GEMMs go to the BLAS,
 * called from the calling thread between the parallel sections: its threads and ours never
 * run at once. */
#include <cblas.h>
#include <string.h>

#include "core/pool.h"
#include "cpu/kernels.h"
#include "engine/cpu_heads.h"
#include "engine/cpu_plan.h"
#include "engine/engine.h"
#include "engine/plan.h"

typedef struct seq {
    int64_t start; /* first history item used (older ones fall out of the window) */
    int64_t n;     /* history tokens */
    int64_t m;     /* candidate tokens (sumi head), else 0 */
    int64_t off;   /* first row in the packed token matrix */
    int64_t sel0;  /* first selected row (index into sel) */
    int64_t nsel;  /* selected rows of this request */
} seq;

typedef struct batch {
    const struct flame_model *model;
    const fl_cpu_plan *plan; /* NULL: sizing only */
    int threads;             /* FLAME_OPT_THREADS resolved */
    const flame_request *reqs;
    size_t n;
    seq *seqs;
    int64_t T, S;  /* tokens, selected rows */
    int64_t *sel;  /* [S] packed rows the head reads, in request order */
    int32_t *qpos; /* [S] position of each selected row inside its sequence */
    int64_t max_n; /* longest history, for attention scratch */
    /* scratch; att and pack hold one slice per thread */
    float *X, *Y, *E, *Q, *K, *V, *A, *F, *XS, *att, *tmp, *pack;
    size_t att_per, pack_per; /* floats of a thread's slice */
} batch;

/* Parts to split `work` units over: at most the threads, at least `min_per_part` units each. */
static int parts_for(int64_t work, int64_t min_per_part, int threads)
{
    int64_t p = work / min_per_part;
    return p < 1 ? 1 : p > threads ? threads : (int)p;
}


/* y = act(x W^T + bias (+ y when beta is 1)) for one of the model's Linears: the own kernel on
 * its packed weights, else the BLAS (fl_cpu_linear). */
static void linear(const batch *b, const fl_linear *l, const float *packed, int64_t rows, const float *x, int64_t ldx,
                   float beta, fl_act_kind act, float *y, int64_t ldy)
{
    fl_cpu_plan_linear(b->plan, l, packed, rows, x, ldx, beta, act, y, ldy, b->threads);
}

typedef struct ln_job {
    const fl_model_cfg *c;
    int64_t rows, ldx, ldr, ldo, parts;
    int32_t d;
    const float *x, *res;
    const fl_layernorm *ln;
    float *out;
} ln_job;

static void ln_part(void *ctx, int64_t p, int worker)
{
    const ln_job *j = ctx;
    (void)worker;
    const int64_t lo = fl_part_lo(j->rows, j->parts, p), hi = fl_part_lo(j->rows, j->parts, p + 1);
    fl_cpu_layernorm(hi - lo, j->d, j->x + lo * j->ldx, j->ldx, j->res ? j->res + lo * j->ldr : NULL, j->ldr, j->ln->w,
                     j->ln->b, j->c->ln_eps, j->c->eps_inside_sqrt, j->out + lo * j->ldo, j->ldo);
}

/* LayerNorm of rows, split over the threads (each row alone: the same bits any split). */
static void layernorm(const batch *b, int64_t rows, int32_t d, const float *x, int64_t ldx, const float *res,
                      int64_t ldr, const fl_layernorm *ln, float *out, int64_t ldo)
{
    const int parts = parts_for(rows * d, 8192, b->threads);
    ln_job j = {.c = &b->model->cfg, .rows = rows, .ldx = ldx, .ldr = ldr, .ldo = ldo, .parts = 2 * parts,
                .d = d, .x = x, .res = res, .ln = ln, .out = out};
    if (j.parts > rows) j.parts = rows > 0 ? rows : 1;
    fl_parallel(parts, j.parts, ln_part, &j);
}

static fl_act_kind act_of(fl_activation a)
{
    return (fl_act_kind)a; /* the enums share their order */
}

static void plan_layout(batch *b)
{
    const fl_model_cfg *c = &b->model->cfg;
    bool sumi = c->head == FLAME_HEAD_SUMI;
    int64_t T = 0, S = 0, max_n = 0;
    seq scratch_seq;
    for (size_t r = 0; r < b->n; r++) {
        const flame_request *q = &b->reqs[r];
        seq *s = b->seqs ? &b->seqs[r] : &scratch_seq; /* no table: totals only */
        int32_t window = 0;
        fl_plan_window(c, q->history_len, &s->start, &window);
        s->n = window;
        s->m = sumi ? (int64_t)q->num_candidates : 0;
        s->off = T;
        s->sel0 = S;
        s->nsel = fl_plan_selected_count(c, s->n, q->num_candidates);
        T += s->n + s->m;
        S += s->nsel;
        if (s->n > max_n) max_n = s->n;
    }
    b->T = T;
    b->S = S;
    b->max_n = max_n;
}

static void fill_selection(batch *b)
{
    for (size_t r = 0; r < b->n; r++) {
        const seq *s = &b->seqs[r];
        for (int64_t i = 0; i < s->nsel; i++) {
            const int64_t pos = fl_plan_selected_position(&b->model->cfg, s->n, i);
            b->sel[s->sel0 + i] = s->off + pos;
            b->qpos[s->sel0 + i] = (int32_t)pos;
        }
    }
}

/* Scratch layout for the whole pass; `take` NULL only sums sizes. */
static size_t carve(batch *b, fl_workspace *ws)
{
    const fl_model_cfg *c = &b->model->cfg;
    int64_t T = b->T > 0 ? b->T : 1, S = b->S > 0 ? b->S : 1, d = c->d_model;
    b->att_per = fl_cpu_attention_scratch(b->max_n, (int32_t)(d / c->num_heads));
    b->pack_per = c->head == FLAME_HEAD_DOT ? fl_cpu_gemm_nt_scratch((int32_t)d) : 0;
    int64_t widest = c->ffn_dim > d ? c->ffn_dim : d;
    for (int t = 0; c->head == FLAME_HEAD_SUMI && t < c->num_tasks; t++)
        for (int l = 0; l <= c->tasks[t].num_layers; l++)
            if (c->tasks[t].width[l] > widest) widest = c->tasks[t].width[l];
    struct {
        void **dst;
        size_t bytes;
    } parts[] = {
        {(void **)&b->seqs, b->n * sizeof(seq)},
        {(void **)&b->sel, (size_t)S * sizeof(int64_t)},
        {(void **)&b->qpos, (size_t)S * sizeof(int32_t)},
        {(void **)&b->X, (size_t)(T * d) * 4},
        {(void **)&b->Y, (size_t)(T * d) * 4},
        {(void **)&b->E, c->projection ? (size_t)(T * c->embed_dim) * 4 : 0},
        {(void **)&b->Q, (size_t)(T * d) * 4},
        {(void **)&b->K, (size_t)(T * d) * 4},
        {(void **)&b->V, (size_t)(T * d) * 4},
        {(void **)&b->A, (size_t)(T * d) * 4},
        {(void **)&b->F, (size_t)(T * widest) * 4},
        {(void **)&b->XS, (size_t)(S * d) * 4},
        {(void **)&b->tmp, (size_t)(S * widest) * 4},
        {(void **)&b->att, b->att_per * (size_t)b->threads * 4},
        {(void **)&b->pack, b->pack_per * (size_t)b->threads * 4},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        total += fl_ws_round(parts[i].bytes);
        if (ws) *parts[i].dst = fl_workspace_take(ws, parts[i].bytes);
    }
    return total;
}

fl_emb_feature fl_feature_view(const fl_model_cfg *c, const struct flame_model *m, int f, const int64_t *items,
                                const flame_bags *side, int64_t first)
{
    const fl_feature_cfg *fc = &c->features[f];
    const fl_table_cfg *t = &c->tables[fc->table];
    fl_emb_feature v = {.table = m->w.tables[fc->table], .rows = t->rows, .dim = t->dim,
                        .pooling = (fl_pooling_kind)fc->pooling, .table_q8 = m->w.tables_q8[fc->table],
                        .qparams = m->w.qparams[fc->table]};
    if (fc->side_slot < 0) {
        v.ids = items + first;
    } else {
        v.offsets = side[fc->side_slot].offsets + first; /* offsets index ids absolutely */
        v.ids = side[fc->side_slot].ids;
    }
    return v;
}

/* Requests handed out a few at a time (REQS_PER_TASK) to the pool. */
#define REQS_PER_TASK 4

static void embed_task(void *ctx, int64_t t, int worker)
{
    const batch *b = ctx;
    const struct flame_model *m = b->model;
    const fl_model_cfg *c = &m->cfg;
    (void)worker;
    float *dst = c->projection ? b->E : b->X;
    const int64_t ld = c->projection ? c->embed_dim : c->d_model;
    const size_t r1 = (size_t)(t + 1) * REQS_PER_TASK < b->n ? (size_t)(t + 1) * REQS_PER_TASK : b->n;
    for (size_t r = (size_t)t * REQS_PER_TASK; r < r1; r++) {
        fl_emb_feature fv[FL_MAX_FEATURES];
        const flame_request *q = &b->reqs[r];
        const seq *s = &b->seqs[r];
        /* a token list of length 0 is never viewed: its arrays may legitimately be NULL */
        for (int part = 0; part < 2; part++) {
            int64_t count = part ? s->m : s->n;
            if (count == 0) continue;
            int32_t col = 0;
            for (int f = 0; f < c->num_features; f++) {
                fv[f] = part ? fl_feature_view(c, m, f, q->candidates, q->candidate_side, 0)
                             : fl_feature_view(c, m, f, q->history, q->history_side, s->start);
                fv[f].out_col = c->combine_concat ? col : 0;
                col += fv[f].dim;
            }
            fl_cpu_embedding_bag(fv, c->num_features, count, dst + (s->off + (part ? s->n : 0)) * ld, ld,
                                 c->embed_dim);
        }
    }
}

static void position_task(void *ctx, int64_t t, int worker)
{
    const batch *b = ctx;
    const struct flame_model *m = b->model;
    const fl_model_cfg *c = &m->cfg;
    const int64_t d = c->d_model;
    (void)worker;
    const size_t r1 = (size_t)(t + 1) * REQS_PER_TASK < b->n ? (size_t)(t + 1) * REQS_PER_TASK : b->n;
    for (size_t r = (size_t)t * REQS_PER_TASK; r < r1; r++) {
        const seq *s = &b->seqs[r];
        for (int64_t i = 0; i < s->n + s->m; i++) {
            int64_t row;
            if (i >= s->n)
                row = c->candidate_position;
            else
                row = fl_plan_history_position(c, i, s->n);
            if (row < 0) continue;
            const float *p = m->w.position + row * d;
            float *x = b->X + (s->off + i) * d;
            for (int64_t j = 0; j < d; j++) x[j] += p[j];
        }
    }
}

static void embed(batch *b)
{
    const struct flame_model *m = b->model;
    const fl_model_cfg *c = &m->cfg;
    const int64_t d = c->d_model;
    const int64_t tasks = ((int64_t)b->n + REQS_PER_TASK - 1) / REQS_PER_TASK;
    const int parts = parts_for(b->T * c->embed_dim, 16384, b->threads);
    fl_parallel(parts, tasks, embed_task, b);
    if (c->projection) linear(b, &m->w.proj, b->plan->proj, b->T, b->E, c->embed_dim, 0.0f, FL_KACT_NONE, b->X, d);
    if (c->position_rule != FL_POS_NONE) fl_parallel(parts, tasks, position_task, b);
    if (c->input_layernorm) layernorm(b, b->T, (int32_t)d, b->X, d, NULL, 0, &m->w.input_ln, b->X, d);
}

static void gather_rows(const float *src, const int64_t *rows, int64_t n, int64_t d, float *dst)
{
    for (int64_t i = 0; i < n; i++) memcpy(dst + i * d, src + rows[i] * d, (size_t)d * sizeof(float));
}

typedef struct att_job {
    batch *b;
    bool last;
} att_job;

static void attention_task(void *ctx, int64_t i, int worker)
{
    const att_job *j = ctx;
    const batch *b = j->b;
    const fl_model_cfg *c = &b->model->cfg;
    const int32_t d = c->d_model, H = c->num_heads, dh = d / H;
    const seq *s = &b->seqs[i / H];
    const int64_t col = (i % H) * dh;
    const int64_t q0 = j->last ? s->sel0 : s->off, nq = j->last ? s->nsel : s->n + s->m;
    if (nq == 0) return;
    fl_cpu_attention_sumi(s->n, s->m, 1, dh, b->Q + q0 * d + col, d, j->last ? b->qpos + s->sel0 : NULL, nq,
                          b->K + s->off * d + col, b->V + s->off * d + col, d, NULL, b->A + q0 * d + col, d,
                          b->att + (size_t)worker * b->att_per);
}

/* Attention of every request, each (request, head) pair a task for the threads. */
static void attention(batch *b, bool last)
{
    const fl_model_cfg *c = &b->model->cfg;
    int64_t work = 0; /* multiply-adds, roughly: queries x visible keys x width */
    for (size_t r = 0; r < b->n; r++) {
        const seq *s = &b->seqs[r];
        work += (last ? s->nsel : s->n + s->m) * (s->n + 1) * c->d_model;
    }
    att_job j = {.b = b, .last = last};
    fl_parallel(parts_for(work, 32768, b->threads), (int64_t)b->n * c->num_heads, attention_task, &j);
}

/* One transformer block. `last`: queries and everything after attention run only for the
 * selected rows, and the block's output lands in XS [S, d]; otherwise in X in place. */
static void block(batch *b, int bi, bool last)
{
    const fl_model_cfg *c = &b->model->cfg;
    const fl_block *blk = &b->model->w.blocks[bi];
    const fl_cpu_block_plan none = {0}, *pk = b->plan->blocks ? &b->plan->blocks[bi] : &none;
    const int32_t d = c->d_model;
    const int64_t T = b->T, R = last ? b->S : T;
    const float *Yin = b->X;
    if (c->pre_ln) {
        layernorm(b, T, d, b->X, d, NULL, 0, &blk->ln1, b->Y, d);
        Yin = b->Y;
    }
    linear(b, &blk->k, pk->k, T, Yin, d, 0.0f, FL_KACT_NONE, b->K, d);
    linear(b, &blk->v, pk->v, T, Yin, d, 0.0f, FL_KACT_NONE, b->V, d);
    if (last) {
        gather_rows(Yin, b->sel, R, d, b->A); /* A is free until attention writes it */
        linear(b, &blk->q, pk->q, R, b->A, d, 0.0f, FL_KACT_NONE, b->Q, d);
    } else {
        linear(b, &blk->q, pk->q, T, Yin, d, 0.0f, FL_KACT_NONE, b->Q, d);
    }
    attention(b, last);
    float *X = b->X;
    if (last) {
        gather_rows(b->X, b->sel, R, d, b->XS);
        X = b->XS;
    }
    /* attention output projection and residual */
    if (c->pre_ln) {
        linear(b, &blk->o, pk->o, R, b->A, d, 1.0f, FL_KACT_NONE, X, d);
    } else {
        linear(b, &blk->o, pk->o, R, b->A, d, 0.0f, FL_KACT_NONE, b->Q, d);
        layernorm(b, R, d, X, d, b->Q, d, &blk->ln1, X, d);
    }
    /* feed-forward and residual */
    const int32_t ff = c->ffn_dim;
    const fl_act_kind act = act_of(c->activation);
    if (c->pre_ln) {
        layernorm(b, R, d, X, d, NULL, 0, &blk->ln2, b->Q, d);
        linear(b, &blk->fc1, pk->fc1, R, b->Q, d, 0.0f, act, b->F, ff);
        linear(b, &blk->fc2, pk->fc2, R, b->F, ff, 1.0f, FL_KACT_NONE, X, d);
    } else {
        linear(b, &blk->fc1, pk->fc1, R, X, d, 0.0f, act, b->F, ff);
        linear(b, &blk->fc2, pk->fc2, R, b->F, ff, 0.0f, FL_KACT_NONE, b->Q, d);
        layernorm(b, R, d, X, d, b->Q, d, &blk->ln2, X, d);
    }
}

/* Dot head. Consecutive requests that score the same contiguous id range (a full catalogue,
 * a shard) share one GEMM against the table slice; other requests gather rows. An int8 table
 * is scored straight from its int8 rows, one user at a time (no float copy of it exists). */
static void head_dot(batch *b, float *scores)
{
    const struct flame_model *m = b->model;
    const int32_t d = m->cfg.d_model;
    const float *table = m->w.tables[m->cfg.dot_table];
    const int8_t *table_q8 = m->w.tables_q8[m->cfg.dot_table];
    float *out = scores;
    size_t r = 0;
    while (r < b->n) {
        const flame_request *q = &b->reqs[r];
        const seq *s = &b->seqs[r];
        int64_t mcand = (int64_t)q->num_candidates;
        if (mcand == 0) {
            r++;
            continue;
        }
        if (s->nsel == 0) { /* empty history: no user state, every candidate scores 0 */
            memset(out, 0, (size_t)mcand * sizeof(float));
            out += mcand;
            r++;
            continue;
        }
        const float *h = b->XS + s->sel0 * d;
        /* int8 tables gather every row; a contiguous range may be shared with the next users */
        const int64_t c0 = table_q8 ? -1 : fl_plan_dot_contiguous_start(q, NULL, -1);
        size_t g = 1;
        /* the group's rule on the first id (cheap; nsel 1: it has candidates), then the
         * contiguity test that reads every id */
        while (c0 >= 0 && r + g < b->n && b->seqs[r + g].nsel == 1 &&
               fl_plan_dot_joins_group(c0, (size_t)mcand, b->reqs[r + g].candidates[0], b->reqs[r + g].num_candidates) &&
               fl_plan_dot_contiguous_start(&b->reqs[r + g], &b->reqs[r + g - 1], c0) == c0)
            g++;
        if (g == 1)
            fl_cpu_dot_user(m, b->plan, h, q->candidates, mcand, c0, out, b->threads);
        else if (b->plan->isa != FL_ISA_BASE) /* the users' states against the table slice, packed as it streams */
            fl_cpu_gemm_nt_mt(b->plan->isa, (int64_t)g, mcand, d, h, d, table + c0 * d, d, out, mcand, b->pack,
                              b->threads);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)g, (blasint)mcand, d, 1.0f, h, d,
                        table + c0 * d, d, 0.0f, out, (blasint)mcand);
        out += (int64_t)g * mcand;
        r += g;
    }
}

/* Sumi head: every task's MLP over all candidate rows at once; the last layer writes its
 * single column straight into the strided score matrix [candidates x tasks]. */
static void head_sumi(batch *b, float *scores)
{
    fl_cpu_sumi_heads(b->model, b->plan, b->S, b->XS, scores, b->F, b->tmp, b->threads);
}

static flame_status forward_batch(struct flame_engine *e, fl_workspace *ws, const flame_request *reqs, size_t n,
                                  float *scores)
{
    const struct flame_model *m = e->model;
    const fl_model_cfg *c = &m->cfg;
    batch b = {.model = m, .plan = e->cpu, .reqs = reqs, .n = n, .threads = e->threads};
    plan_layout(&b);
    flame_status st = fl_workspace_reserve(e, ws, carve(&b, NULL)); /* a no-op after fl_forward_bytes */
    if (st) return st;
    carve(&b, ws);
    plan_layout(&b);
    if (b.S == 0) { /* nothing to score, or dot-head requests with empty histories only */
        if (c->head == FLAME_HEAD_DOT) head_dot(&b, scores);
        return FLAME_OK;
    }
    fill_selection(&b);
    const uint64_t t0 = fl_now_us(); /* token assembly, a stage of the engine's metrics */
    embed(&b);
    ws->tokens_us += fl_now_us() - t0;
    for (int i = 0; i < c->num_blocks; i++) block(&b, i, i == c->num_blocks - 1);
    if (c->num_blocks == 0) gather_rows(b.X, b.sel, b.S, c->d_model, b.XS);
    if (c->final_layernorm) layernorm(&b, b.S, c->d_model, b.XS, c->d_model, NULL, 0, &m->w.final_ln, b.XS, c->d_model);
    if (c->head == FLAME_HEAD_DOT)
        head_dot(&b, scores);
    else
        head_sumi(&b, scores);
    return FLAME_OK;
}

/* Requests with kv_cache = 1 on an engine with a KV cache run alone against their history
 * (engine/forward_kv.c); the runs of other requests between them run as batches. */
static bool kv_path(const struct flame_engine *e, const flame_request *q)
{
    return e->kv && q->kv_cache == 1;
}

static size_t batch_bytes(const struct flame_engine *e, const flame_request *reqs, size_t n, int64_t *tokens)
{
    batch b = {.model = e->model, .reqs = reqs, .n = n, .threads = e->threads};
    plan_layout(&b);
    *tokens = b.T;
    return carve(&b, NULL);
}

flame_status fl_forward_cpu(struct flame_engine *e, fl_workspace *ws, const flame_request *reqs, size_t n,
                            float *scores)
{
    const size_t T = (size_t)e->model->cfg.num_tasks;
    size_t r = 0;
    flame_status st = FLAME_OK;
    while (r < n && !st) {
        size_t r1 = r;
        while (r1 < n && !kv_path(e, &reqs[r1])) r1++;
        if (r1 > r) { /* a run of requests without the cache: one batch */
            st = forward_batch(e, ws, reqs + r, r1 - r, scores);
            for (; r < r1; r++) scores += reqs[r].num_candidates * T;
            continue;
        }
        st = fl_forward_cpu_kv(e, ws, &reqs[r], scores);
        scores += reqs[r].num_candidates * T;
        r++;
    }
    return st;
}

size_t fl_forward_bytes(const struct flame_engine *e, const flame_request *reqs, size_t n, int64_t *tokens)
{
    size_t need = 0;
    *tokens = 0;
    for (size_t r = 0; r < n;) {
        size_t r1 = r, b;
        int64_t t = 0;
        while (r1 < n && !kv_path(e, &reqs[r1])) r1++;
        if (r1 > r) {
            b = batch_bytes(e, reqs + r, r1 - r, &t);
            r = r1;
        } else {
            b = fl_forward_kv_bytes(e, &reqs[r]);
            int64_t start;
            int32_t nh;
            fl_plan_window(&e->model->cfg, reqs[r].history_len, &start, &nh);
            t = nh + (e->model->cfg.head == FLAME_HEAD_SUMI ? (int64_t)reqs[r].num_candidates : 0);
            r++;
        }
        if (b > need) need = b;
        *tokens += t;
    }
    return need;
}
