/* The CPU engine's heads and Linears on its kernel plan, shared by the batched forward
 * (engine/forward.c) and the KV-cache forward (engine/forward_kv.c): one copy of each rule.
 * Never installed. */
#ifndef FLAME_ENGINE_CPU_HEADS_H
#define FLAME_ENGINE_CPU_HEADS_H

#include "engine/cpu_plan.h"

struct flame_model;

/* y[rows, l->out] (ld ldy) = act(x[rows, l->in] (ld ldx) W^T + b) (+ y when beta != 0): on the
 * plan's packed weights (`packed`, its fl_cpu_plan entry) when there are some, else the BLAS. */
void fl_cpu_plan_linear(const fl_cpu_plan *plan, const fl_linear *l, const float *packed, int64_t rows,
                        const float *x, int64_t ldx, float beta, fl_act_kind act, float *y, int64_t ldy, int threads);

/* The sumi head over rows candidate rows X [rows, d_model] (ld d_model): every task's MLP, its
 * last layer straight into the strided scores [rows, num_tasks], then the sigmoid. F and tmp:
 * scratch of rows * (widest hidden layer) floats each. */
void fl_cpu_sumi_heads(const struct flame_model *m, const fl_cpu_plan *plan, int64_t rows, const float *X,
                       float *scores, float *F, float *tmp, int threads);

/* The dot head for one user state h [d_model] against n candidates: scores[i] = <h,
 * table[cands[i]]>. c0: the first id when cands is the contiguous range c0 .. c0 + n - 1
 * (scored as one GEMV over the table slice), else -1 (gathered rows); int8 tables always
 * gather. */
void fl_cpu_dot_user(const struct flame_model *m, const fl_cpu_plan *plan, const float *h, const int64_t *cands,
                     int64_t n, int64_t c0, float *scores, int threads);

#endif
