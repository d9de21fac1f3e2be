/* The GPU engine's batch profiles (FLAME_OPT_BATCH_PROFILES): the shapes a pass is padded to
 * so that each shape replays one captured CUDA graph. Parsing and the routing of a pass to
 * the smallest profile holding it are host-side plan work, independent of the backend. */
#ifndef FLAME_ENGINE_BATCH_PROFILES_H
#define FLAME_ENGINE_BATCH_PROFILES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flame/flame.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FL_MAX_BATCH_PROFILES 16
#define FL_PROFILE_MIN_HISTORY 16 /* the smallest history bucket of a profile without a history length */

/* users x candidates (per user) x history window; history 0 = the pass's longest window
 * rounded up to a power of two (at least FL_PROFILE_MIN_HISTORY, at most the model's max_len). */
typedef struct fl_batch_profile {
    int32_t users, candidates, history;
} fl_batch_profile;

typedef struct fl_batch_profiles {
    int n;
    fl_batch_profile p[FL_MAX_BATCH_PROFILES];
} fl_batch_profiles;

/* Parses "UxC[xL],..." (users 1..65536, candidates 1..2^24, history 1..2^24, at most
 * FL_MAX_BATCH_PROFILES profiles; "" = none). FLAME_ERR_INVALID_ARG naming the profile and
 * value that is wrong; *out untouched then. */
flame_status fl_batch_profiles_parse(const char *s, fl_batch_profiles *out);

/* The shape a pass of n requests is padded to: the profile with the fewest tokens
 * (users x (history + candidates)) that holds n users, each request's candidates and its
 * history window (min(history_len, max_len)), then the first given; its history resolved to a
 * length. false when no profile holds the pass (it then runs at its own shape). */
bool fl_batch_profile_route(const fl_batch_profiles *ps, int32_t max_len, const flame_request *reqs, size_t n,
                            fl_batch_profile *shape);

/* The engine's profiles for a scheduler's (users x candidates bounds, n of them): each
 * scheduler profile, then for each a ladder of power-of-two user counts below its users
 * (1, 2, 4, ...) with its candidates, added smallest first and round-robin across the
 * profiles until FL_MAX_BATCH_PROFILES are held; duplicates are dropped. Why: the scheduler
 * sends a batch as soon as its wait ends, so at low traffic most batches hold one or two
 * users; padding those to the profile's full user count multiplies their tokens (a lone
 * request of a 16-user profile runs 16x its work). At most one padding factor of 2 in users
 * remains. Profiles beyond FL_MAX_BATCH_PROFILES are ignored. */
void fl_batch_profiles_for_scheduler(const flame_batch_profile *p, int n, fl_batch_profiles *out);

#ifdef __cplusplus
}
#endif
#endif
