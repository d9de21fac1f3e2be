/* The engine's answers to the scheduler (sched_iface.h). */
#include "engine/sched_iface.h"

#include "engine/batch_profiles.h"
#include "engine/engine.h"

uint32_t fl_engine_workers(const flame_engine *e, uint32_t cap)
{
    return e->ops->workers(e, cap);
}

int32_t fl_engine_num_tasks(const flame_engine *e)
{
    return e->model->cfg.num_tasks;
}

int32_t fl_engine_num_side(const flame_engine *e)
{
    return e->model->cfg.num_side;
}

bool fl_engine_candidates_are_tokens(const flame_engine *e)
{
    return e->model->cfg.head == FLAME_HEAD_SUMI;
}

size_t fl_engine_max_candidates(void)
{
    return FL_MAX_CANDIDATES;
}

bool fl_engine_kv_request(const flame_engine *e, const flame_request *q)
{
    return e->kv && q->kv_cache == 1;
}

flame_status fl_engine_check_candidate_bags(const flame_engine *e, const flame_bags *side, size_t n)
{
    return fl_check_side_bags(e->model, 0, "candidate", side, n);
}

void fl_engine_adopt_profiles(flame_engine *e, const flame_batch_profile *p, int n)
{
    uint32_t largest = 0;
    for (int i = 0; i < n; i++)
        if (p[i].max_candidates > largest) largest = p[i].max_candidates;
    if (largest > 0 && largest <= INT32_MAX) atomic_store(&e->kv_chunk, (int)largest);
    if (!e->ops->adopt_profiles || e->model->cfg.head != FLAME_HEAD_SUMI) return;
    fl_batch_profiles ps;
    fl_batch_profiles_for_scheduler(p, n, &ps);
    e->ops->adopt_profiles(e, &ps);
}
