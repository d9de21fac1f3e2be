/* The CPU forward pass over a batch of requests (docs/model-format.md).
 *
 * All requests' tokens are packed into one [T, d] matrix so every token-wise layer
 * (projection, q/k/v/o, FFN, LayerNorm) is one GEMM or one loop over the batch; only
 * attention runs per request. The last block computes queries, FFN and LayerNorm only for
 * the rows the head reads (the last history token for the dot head, the candidates for the
 * sumi head): keys and values still come from every token. */
#include <cblas.h>
#include <string.h>

#include "cpu/kernels.h"
#include "engine/engine.h"

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
    int threads;    /* FLAME_OPT_THREADS resolved: threads of libflame's own dot-head kernel */
    bool weak_blas; /* the BLAS runs pre-AVX kernels here (src/cpu/blas_check.c) */
    const flame_request *reqs;
    size_t n;
    seq *seqs;
    int64_t T, S;  /* tokens, selected rows */
    int64_t *sel;  /* [S] packed rows the head reads, in request order */
    int32_t *qpos; /* [S] position of each selected row inside its sequence */
    int64_t max_n; /* longest history, for attention scratch */
    /* scratch */
    float *X, *Y, *E, *Q, *K, *V, *A, *F, *XS, *att, *tmp;
} batch;

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
        s->n = q->history_len < (size_t)c->max_len ? (int64_t)q->history_len : c->max_len;
        s->start = (int64_t)q->history_len - s->n;
        s->m = sumi ? (int64_t)q->num_candidates : 0;
        s->off = T;
        s->sel0 = S;
        s->nsel = sumi ? s->m : (s->n > 0 && q->num_candidates > 0);
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
            int64_t pos = b->model->cfg.head == FLAME_HEAD_SUMI ? s->n + i : s->n - 1;
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
        {(void **)&b->att, fl_cpu_attention_scratch(b->max_n) * 4},
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        total += fl_ws_round(parts[i].bytes);
        if (ws) *parts[i].dst = fl_workspace_take(ws, parts[i].bytes);
    }
    return total;
}

static fl_emb_feature feature_view(const fl_model_cfg *c, const struct flame_model *m, int f, const int64_t *items,
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

static void embed(batch *b)
{
    const struct flame_model *m = b->model;
    const fl_model_cfg *c = &m->cfg;
    const int64_t d = c->d_model;
    float *dst = c->projection ? b->E : b->X;
    const int64_t ld = c->projection ? c->embed_dim : d;
    fl_emb_feature fv[FL_MAX_FEATURES];
    for (size_t r = 0; r < b->n; r++) {
        const flame_request *q = &b->reqs[r];
        const seq *s = &b->seqs[r];
        /* a token list of length 0 is never viewed: its arrays may legitimately be NULL */
        for (int part = 0; part < 2; part++) {
            int64_t count = part ? s->m : s->n;
            if (count == 0) continue;
            int32_t col = 0;
            for (int f = 0; f < c->num_features; f++) {
                fv[f] = part ? feature_view(c, m, f, q->candidates, q->candidate_side, 0)
                             : feature_view(c, m, f, q->history, q->history_side, s->start);
                fv[f].out_col = c->combine_concat ? col : 0;
                col += fv[f].dim;
            }
            fl_cpu_embedding_bag(fv, c->num_features, count, dst + (s->off + (part ? s->n : 0)) * ld, ld,
                                 c->embed_dim);
        }
    }
    if (c->projection)
        fl_cpu_linear(b->T, c->embed_dim, (int32_t)d, b->E, c->embed_dim, m->w.proj.w, m->w.proj.b, 0.0f, FL_KACT_NONE,
                      b->X, d);
    if (c->position_rule != FL_POS_NONE)
        for (size_t r = 0; r < b->n; r++) {
            const seq *s = &b->seqs[r];
            for (int64_t i = 0; i < s->n + s->m; i++) {
                int64_t row;
                if (i >= s->n)
                    row = c->candidate_position;
                else
                    row = c->position_rule == FL_POS_LEFT_PADDED_SLOT ? c->max_len - s->n + i : s->n - 1 - i;
                if (row < 0) continue;
                const float *p = m->w.position + row * d;
                float *x = b->X + (s->off + i) * d;
                for (int64_t j = 0; j < d; j++) x[j] += p[j];
            }
        }
    if (c->input_layernorm)
        fl_cpu_layernorm(b->T, (int32_t)d, b->X, d, NULL, 0, m->w.input_ln.w, m->w.input_ln.b, c->ln_eps,
                         c->eps_inside_sqrt, b->X, d);
}

static void gather_rows(const float *src, const int64_t *rows, int64_t n, int64_t d, float *dst)
{
    for (int64_t i = 0; i < n; i++) memcpy(dst + i * d, src + rows[i] * d, (size_t)d * sizeof(float));
}

/* One transformer block. `last`: queries and everything after attention run only for the
 * selected rows, and the block's output lands in XS [S, d]; otherwise in X in place. */
static void block(batch *b, const fl_block *blk, bool last)
{
    const fl_model_cfg *c = &b->model->cfg;
    const int32_t d = c->d_model, H = c->num_heads, dh = d / H;
    const float eps = c->ln_eps;
    const bool inside = c->eps_inside_sqrt;
    const int64_t T = b->T, R = last ? b->S : T;
    const float *Yin = b->X;
    if (c->pre_ln) {
        fl_cpu_layernorm(T, d, b->X, d, NULL, 0, blk->ln1.w, blk->ln1.b, eps, inside, b->Y, d);
        Yin = b->Y;
    }
    fl_cpu_linear(T, d, d, Yin, d, blk->k.w, blk->k.b, 0.0f, FL_KACT_NONE, b->K, d);
    fl_cpu_linear(T, d, d, Yin, d, blk->v.w, blk->v.b, 0.0f, FL_KACT_NONE, b->V, d);
    if (last) {
        gather_rows(Yin, b->sel, R, d, b->A); /* A is free until attention writes it */
        fl_cpu_linear(R, d, d, b->A, d, blk->q.w, blk->q.b, 0.0f, FL_KACT_NONE, b->Q, d);
    } else {
        fl_cpu_linear(T, d, d, Yin, d, blk->q.w, blk->q.b, 0.0f, FL_KACT_NONE, b->Q, d);
    }
    for (size_t r = 0; r < b->n; r++) {
        const seq *s = &b->seqs[r];
        int64_t q0 = last ? s->sel0 : s->off, nq = last ? s->nsel : s->n + s->m;
        if (nq == 0) continue;
        fl_cpu_attention_sumi(s->n, s->m, H, dh, b->Q + q0 * d, d, last ? b->qpos + s->sel0 : NULL, nq,
                              b->K + s->off * d, b->V + s->off * d, d, NULL, b->A + q0 * d, d, b->att);
    }
    float *X = b->X;
    if (last) {
        gather_rows(b->X, b->sel, R, d, b->XS);
        X = b->XS;
    }
    /* attention output projection and residual */
    if (c->pre_ln) {
        fl_cpu_linear(R, d, d, b->A, d, blk->o.w, blk->o.b, 1.0f, FL_KACT_NONE, X, d);
    } else {
        fl_cpu_linear(R, d, d, b->A, d, blk->o.w, blk->o.b, 0.0f, FL_KACT_NONE, b->Q, d);
        fl_cpu_layernorm(R, d, X, d, b->Q, d, blk->ln1.w, blk->ln1.b, eps, inside, X, d);
    }
    /* feed-forward and residual */
    const int32_t ff = c->ffn_dim;
    const fl_act_kind act = act_of(c->activation);
    if (c->pre_ln) {
        fl_cpu_layernorm(R, d, X, d, NULL, 0, blk->ln2.w, blk->ln2.b, eps, inside, b->Q, d);
        fl_cpu_linear(R, d, ff, b->Q, d, blk->fc1.w, blk->fc1.b, 0.0f, act, b->F, ff);
        fl_cpu_linear(R, ff, d, b->F, ff, blk->fc2.w, blk->fc2.b, 1.0f, FL_KACT_NONE, X, d);
    } else {
        fl_cpu_linear(R, d, ff, X, d, blk->fc1.w, blk->fc1.b, 0.0f, act, b->F, ff);
        fl_cpu_linear(R, ff, d, b->F, ff, blk->fc2.w, blk->fc2.b, 0.0f, FL_KACT_NONE, b->Q, d);
        fl_cpu_layernorm(R, d, X, d, b->Q, d, blk->ln2.w, blk->ln2.b, eps, inside, X, d);
    }
}

/* First candidate id if ids are c0, c0+1, ..., else -1. */
static int64_t contiguous_start(const int64_t *ids, size_t n)
{
    for (size_t i = 1; i < n; i++)
        if (ids[i] != ids[0] + (int64_t)i) return -1;
    return ids[0];
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
        if (table_q8) {
            fl_cpu_dot_rows_q8_mt(h, d, table_q8, m->w.qparams[m->cfg.dot_table], q->candidates, 0, mcand, out, 1,
                                  b->threads);
            out += mcand;
            r++;
            continue;
        }
        int64_t c0 = contiguous_start(q->candidates, (size_t)mcand);
        if (c0 < 0) {
            fl_cpu_dot_rows_mt(h, d, table, q->candidates, 0, mcand, out, 1, b->threads);
            out += mcand;
            r++;
            continue;
        }
        size_t g = 1;
        while (r + g < b->n && b->reqs[r + g].num_candidates == (size_t)mcand && b->seqs[r + g].nsel == 1 &&
               b->reqs[r + g].candidates[0] == c0 &&
               (b->reqs[r + g].candidates == q->candidates || /* the same array: scanned already */
                contiguous_start(b->reqs[r + g].candidates, (size_t)mcand) == c0))
            g++;
        if (g == 1 && b->weak_blas) /* one user, a BLAS without vector kernels: ours, on our threads */
            fl_cpu_dot_rows_mt(h, d, table, NULL, c0, mcand, out, 1, b->threads);
        else if (g == 1)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)mcand, d, 1.0f, table + c0 * d, d, h, 1, 0.0f, out, 1);
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
    const struct flame_model *m = b->model;
    const fl_model_cfg *c = &m->cfg;
    const int64_t S = b->S, T = c->num_tasks;
    for (int t = 0; t < c->num_tasks; t++) {
        const fl_task_cfg *tc = &c->tasks[t];
        const float *in = b->XS;
        int64_t ld_in = c->d_model;
        float *bufs[2] = {b->F, b->tmp};
        for (int l = 0; l < tc->num_layers; l++) {
            const fl_linear *lin = &m->w.tasks[t].layers[l];
            bool final = l == tc->num_layers - 1;
            float *dst = final ? scores + t : bufs[l & 1];
            int64_t ld_out = final ? T : lin->out;
            fl_cpu_linear(S, lin->in, lin->out, in, ld_in, lin->w, lin->b, 0.0f,
                          final ? FL_KACT_NONE : act_of(tc->activation), dst, ld_out);
            in = dst;
            ld_in = ld_out;
        }
        fl_cpu_sigmoid(scores + t, S, T);
    }
}

flame_status fl_forward_cpu(struct flame_engine *e, fl_workspace *ws, const flame_request *reqs, size_t n,
                            float *scores)
{
    const struct flame_model *m = e->model;
    const fl_model_cfg *c = &m->cfg;
    batch b = {.model = m, .reqs = reqs, .n = n, .threads = e->threads, .weak_blas = fl_blas_is_weak()};
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
    for (int i = 0; i < c->num_blocks; i++) block(&b, &m->w.blocks[i], i == c->num_blocks - 1);
    if (c->num_blocks == 0) gather_rows(b.X, b.sel, b.S, c->d_model, b.XS);
    if (c->final_layernorm)
        fl_cpu_layernorm(b.S, c->d_model, b.XS, c->d_model, NULL, 0, m->w.final_ln.w, m->w.final_ln.b, c->ln_eps,
                         c->eps_inside_sqrt, b.XS, c->d_model);
    if (c->head == FLAME_HEAD_DOT)
        head_dot(&b, scores);
    else
        head_sumi(&b, scores);
    return FLAME_OK;
}

size_t fl_forward_bytes(const struct flame_model *m, const flame_request *reqs, size_t n, int64_t *tokens)
{
    batch b = {.model = m, .reqs = reqs, .n = n};
    plan_layout(&b);
    *tokens = b.T;
    return carve(&b, NULL);
}
