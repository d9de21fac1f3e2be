/* Which rows a request computes against one history (plan.h). */
#include "engine/plan.h"

#include "cpu/kernels.h"

int64_t fl_plan_pos_none(const fl_model_cfg *c, int64_t i, int64_t n)
{
    (void)c, (void)i, (void)n;
    return -1;
}
int64_t fl_plan_pos_left_padded_slot(const fl_model_cfg *c, int64_t i, int64_t n)
{
    return c->max_len - n + i;
}
int64_t fl_plan_pos_from_recent(const fl_model_cfg *c, int64_t i, int64_t n)
{
    (void)c;
    return n - 1 - i;
}
int64_t fl_plan_pos_from_oldest(const fl_model_cfg *c, int64_t i, int64_t n)
{
    (void)c, (void)n;
    return i;
}

int64_t fl_plan_history_position(const fl_model_cfg *c, int64_t i, int64_t n)
{
    switch (c->position_rule) {
    case FL_POS_LEFT_PADDED_SLOT: return fl_plan_pos_left_padded_slot(c, i, n);
    case FL_POS_FROM_RECENT: return fl_plan_pos_from_recent(c, i, n);
    case FL_POS_FROM_OLDEST: return fl_plan_pos_from_oldest(c, i, n);
    default: return fl_plan_pos_none(c, i, n);
    }
}

int32_t fl_plan_reuse_none(int32_t cached, int32_t n)
{
    return cached <= n ? cached : 0;
}
int32_t fl_plan_reuse_from_oldest(int32_t cached, int32_t n)
{
    return cached <= n ? cached : 0;
}
int32_t fl_plan_reuse_left_padded_slot(int32_t cached, int32_t n)
{
    return cached == n ? cached : 0;
}
int32_t fl_plan_reuse_from_recent(int32_t cached, int32_t n)
{
    return cached == n ? cached : 0;
}

int32_t fl_plan_reuse(const fl_model_cfg *c, int32_t cached, int32_t n)
{
    switch (c->position_rule) {
    case FL_POS_LEFT_PADDED_SLOT: return fl_plan_reuse_left_padded_slot(cached, n);
    case FL_POS_FROM_RECENT: return fl_plan_reuse_from_recent(cached, n);
    case FL_POS_FROM_OLDEST: return fl_plan_reuse_from_oldest(cached, n);
    default: return fl_plan_reuse_none(cached, n);
    }
}

bool fl_plan_extendable(const fl_model_cfg *c)
{
    return fl_plan_reuse(c, 1, 2) == 1;
}

void fl_plan_window(const fl_model_cfg *c, size_t history_len, int64_t *start, int32_t *n)
{
    *n = history_len < (size_t)c->max_len ? (int32_t)history_len : c->max_len;
    *start = (int64_t)history_len - *n;
}

int32_t fl_plan_chunk(const fl_model_cfg *c, int32_t n, int32_t m)
{
    /* 256 rows keep the packed GEMMs at their full rate (their panels are 16 columns by k, the
     * rows stream); K and V of (n + chunk) rows and chunk rows of FFN stay in the caches of a
     * core for the models of the reference size */
    (void)c, (void)n;
    const int32_t chunk = 256;
    return m < chunk ? m : chunk;
}

void fl_plan_request(const fl_model_cfg *c, size_t history_len, size_t num_candidates, int32_t cached,
                     fl_kv_plan *p)
{
    fl_plan_window(c, history_len, &p->start, &p->n);
    const bool sumi = c->head == FLAME_HEAD_SUMI;
    p->cached = fl_plan_reuse(c, cached, p->n);
    if (!sumi && p->cached > p->n - 1) p->cached = p->n > 0 ? p->n - 1 : 0;
    p->q0 = sumi ? p->n : (p->n > 0 ? p->n - 1 : 0);
    p->m = sumi ? (int32_t)num_candidates : 0;
    p->chunk = p->m > 0 ? fl_plan_chunk(c, p->n, p->m) : 0;
}

int64_t fl_plan_dot_contiguous_start(const flame_request *q, const flame_request *prev, int64_t prev_start)
{
    if (q->num_candidates == 0) return -1;
    if (prev && prev->candidates == q->candidates && prev->num_candidates == q->num_candidates) return prev_start;
    return fl_cpu_ids_contiguous(q->candidates, q->num_candidates) ? q->candidates[0] : -1;
}

int64_t fl_plan_selected_count(const fl_model_cfg *c, int64_t n, size_t num_candidates)
{
    if (c->head == FLAME_HEAD_SUMI) return (int64_t)num_candidates;
    return n > 0 && num_candidates > 0;
}

int64_t fl_plan_selected_position(const fl_model_cfg *c, int64_t n, int64_t i)
{
    return c->head == FLAME_HEAD_SUMI ? n + i : n - 1;
}

bool fl_plan_dot_joins_group(int64_t group_start, size_t group_num, int64_t start, size_t num_candidates)
{
    return start >= 0 && start == group_start && num_candidates == group_num;
}
