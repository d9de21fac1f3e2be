/* What the scheduler (src/sched) asks of an engine, through functions rather than the
 * engine's structure, so the two change independently: how many batches the engine runs at
 * once, the shape of its scores, how requests are counted against batch profiles, and the
 * checks a request must pass before the scheduler cuts it into parts. All are cheap and
 * thread-safe (they read what engine creation fixed). */
#ifndef FLAME_ENGINE_SCHED_IFACE_H
#define FLAME_ENGINE_SCHED_IFACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flame/flame.h"
#include "flame/scheduler.h"

/* Batches the engine can run at once, capped at `cap`: one a GPU executor (one with an
 * external CUDA stream), 1 on the CPU, where one call already uses the engine's threads. */
uint32_t fl_engine_workers(const flame_engine *e, uint32_t cap);
/* Scores a candidate has (the model's tasks). */
int32_t fl_engine_num_tasks(const flame_engine *e);
/* Side-feature slots a request must give (num_side_features). */
int32_t fl_engine_num_side(const flame_engine *e);
/* Whether candidates are tokens of the pass (the SUMI head: they count against a profile's
 * max_candidates and long requests may be split) or not (the dot head: only users count). */
bool fl_engine_candidates_are_tokens(const flame_engine *e);
/* The most candidates one request may have. */
size_t fl_engine_max_candidates(void);
/* Whether the engine scores q against its KV cache (kv_cache = 1 on an engine with a cache):
 * such a request is scored alone against its history, its candidates in chunks the engine
 * sizes, so the scheduler sends it whole: cut into parts, each part would look up and gather the
 * cached history again (and a miss would compute it once a part). */
bool fl_engine_kv_request(const flame_engine *e, const flame_request *q);
/* The CSR structure of a request's candidate side bags (n candidates), as validation checks
 * it; for a caller that cuts the bags before validation runs. FLAME_ERR_INVALID_ARG naming
 * the slot and value. */
flame_status fl_engine_check_candidate_bags(const flame_engine *e, const flame_bags *side, size_t n);

/* Gives a GPU engine without batch profiles of its own (FLAME_OPT_BATCH_PROFILES) the
 * scheduler's, users x candidates with histories in power-of-two buckets, so that its batches
 * replay one CUDA graph a shape (nothing on the CPU or under the dot head); and on every
 * engine makes the largest max_candidates the chunk of a kv_cache request's candidates (the
 * scheduler keeps such a request whole: fl_engine_kv_request). */
void fl_engine_adopt_profiles(flame_engine *e, const flame_batch_profile *p, int n);

#endif
