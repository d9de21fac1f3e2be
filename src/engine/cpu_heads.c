/* The CPU engine's heads and Linears on its kernel plan (engine/cpu_heads.h). */
#include <cblas.h>

#include "engine/cpu_heads.h"
#include "model/model.h"

void fl_cpu_plan_linear(const fl_cpu_plan *plan, const fl_linear *l, const float *packed, int64_t rows,
                        const float *x, int64_t ldx, float beta, fl_act_kind act, float *y, int64_t ldy, int threads)
{
    if (rows <= 0) return;
    if (packed)
        fl_cpu_gemm_packed_mt(plan->isa, rows, l->out, l->in, x, ldx, packed, l->b, beta != 0.0f, act, y, ldy,
                              threads);
    else
        fl_cpu_linear(rows, l->in, l->out, x, ldx, l->w, l->b, beta, act, y, ldy);
}

void fl_cpu_sumi_heads(const struct flame_model *m, const fl_cpu_plan *plan, int64_t rows, const float *X,
                       float *scores, float *F, float *tmp, int threads)
{
    const fl_model_cfg *c = &m->cfg;
    const int64_t T = c->num_tasks;
    for (int t = 0; t < c->num_tasks; t++) {
        const fl_task_cfg *tc = &c->tasks[t];
        const float *in = X;
        int64_t ld_in = c->d_model;
        float *bufs[2] = {F, tmp};
        for (int l = 0; l < tc->num_layers; l++) {
            const fl_linear *lin = &m->w.tasks[t].layers[l];
            const bool final = l == tc->num_layers - 1;
            float *dst = final ? scores + t : bufs[l & 1];
            const int64_t ld_out = final ? T : lin->out;
            fl_cpu_plan_linear(plan, lin, plan->tasks[t][l], rows, in, ld_in, 0.0f,
                               final ? FL_KACT_NONE : (fl_act_kind)tc->activation /* the enums share their order */,
                               dst, ld_out, threads);
            in = dst;
            ld_in = ld_out;
        }
        fl_cpu_sigmoid(scores + t, rows, T);
    }
}

void fl_cpu_dot_user(const struct flame_model *m, const fl_cpu_plan *plan, const float *h, const int64_t *cands,
                     int64_t n, int64_t c0, float *scores, int threads)
{
    const int32_t d = m->cfg.d_model;
    const float *table = m->w.tables[m->cfg.dot_table];
    const int8_t *table_q8 = m->w.tables_q8[m->cfg.dot_table];
    if (table_q8)
        fl_cpu_dot_rows_q8_mt(h, d, table_q8, m->w.qparams[m->cfg.dot_table], cands, 0, n, scores, 1, threads);
    else if (c0 < 0)
        fl_cpu_dot_rows_mt(plan->dot_isa, h, d, table, cands, 0, n, scores, 1, threads);
    else if (plan->own_gemv)
        fl_cpu_dot_rows_mt(plan->dot_isa, h, d, table, NULL, c0, n, scores, 1, threads);
    else
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)n, d, 1.0f, table + c0 * d, d, h, 1, 0.0f, scores, 1);
}
