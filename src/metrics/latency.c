/* flame_engine_get_latency / flame_scheduler_get_latency: a stage's histogram as percentiles. */
#include "core/abi.h"
#include "engine/engine.h"
#include "metrics/metrics.h"
#include "sched/sched.h"

void fl_latency_of(fl_histogram *h, flame_latency *out)
{
    *out = (flame_latency){.struct_size = sizeof *out};
    out->count = atomic_load_explicit(&h->total, memory_order_relaxed);
    out->sum_us = atomic_load_explicit(&h->sum_us, memory_order_relaxed);
    out->p50_us = fl_hist_quantile(h, 0.50);
    out->p90_us = fl_hist_quantile(h, 0.90);
    out->p99_us = fl_hist_quantile(h, 0.99);
    out->p999_us = fl_hist_quantile(h, 0.999);
    out->max_us = fl_hist_max(h);
}

const char *fl_stage_name(flame_stage stage)
{
    switch (stage) {
    case FLAME_STAGE_QUEUE_WAIT: return "queue_wait";
    case FLAME_STAGE_FEATURES: return "features";
    case FLAME_STAGE_TOKENS: return "tokens";
    case FLAME_STAGE_H2D: return "h2d";
    case FLAME_STAGE_COMPUTE: return "compute";
    case FLAME_STAGE_D2H: return "d2h";
    case FLAME_STAGE_TOTAL: return "total";
    case FLAME_STAGE_USER_CACHE: return "user_cache";
    case FLAME_STAGE_ITEM_CACHE: return "item_cache";
    case FLAME_STAGE_SOURCE_FETCH: return "source_fetch";
    }
    return "unknown";
}

fl_histogram *fl_scheduler_stage(flame_scheduler *s, flame_stage stage)
{
    return stage == FLAME_STAGE_QUEUE_WAIT ? &s->queue_wait : stage == FLAME_STAGE_TOTAL ? &s->latency : NULL;
}

static flame_status out_latency(fl_histogram *h, flame_latency *latency)
{
    flame_latency v;
    fl_latency_of(h, &v);
    return fl_struct_out("flame_latency", latency, &v, sizeof v);
}

FLAME_API flame_status flame_engine_get_latency(flame_engine *engine, flame_stage stage, flame_latency *latency)
{
    fl_clear_error();
    if (!engine || !latency) return fl_error(FLAME_ERR_INVALID_ARG, "%s is NULL", engine ? "latency" : "engine");
    flame_status st = fl_struct_size_check("flame_latency", latency->struct_size, sizeof *latency);
    if (st) return st;
    if ((int)stage < FLAME_STAGE_FEATURES || (int)stage >= FL_ENGINE_STAGES)
        return fl_error(FLAME_ERR_INVALID_ARG,
                        "stage %d (%s) is not timed by an engine (FLAME_STAGE_FEATURES..SOURCE_FETCH)", (int)stage,
                        fl_stage_name(stage));
    return out_latency(&engine->stage[stage], latency);
}

FLAME_API flame_status flame_scheduler_get_latency(flame_scheduler *s, flame_stage stage, flame_latency *latency)
{
    fl_clear_error();
    if (!s || !latency) return fl_error(FLAME_ERR_INVALID_ARG, "%s is NULL", s ? "latency" : "scheduler");
    flame_status st = fl_struct_size_check("flame_latency", latency->struct_size, sizeof *latency);
    if (st) return st;
    fl_histogram *h = fl_scheduler_stage(s, stage);
    if (!h)
        return fl_error(FLAME_ERR_INVALID_ARG, "stage %d (%s) is not timed by a scheduler (FLAME_STAGE_QUEUE_WAIT or "
                        "FLAME_STAGE_TOTAL)", (int)stage, fl_stage_name(stage));
    return out_latency(h, latency);
}
