/* Batch profiles: checking them, the smallest one holding a batch, and how a request too long
 * for every profile is cut. */
#include "sched/sched.h"

/* The explicit-batch profiles of the FLAME paper (arXiv:2509.22681): users x candidates per user. */
static const flame_batch_profile defaults[] = {{1, 128}, {2, 128}, {4, 64}, {8, 32}};

#define MAX_USERS 65536u
#define MAX_CANDIDATES (1u << 24)

flame_status fl_profiles_init(fl_profiles *ps, const flame_batch_profile *p, size_t n, bool count_candidates)
{
    if (n == 0) {
        if (p) return fl_error(FLAME_ERR_INVALID_ARG, "profiles is set but num_profiles is 0");
        p = defaults;
        n = sizeof defaults / sizeof defaults[0];
    }
    if (!p) return fl_error(FLAME_ERR_INVALID_ARG, "profiles is NULL with num_profiles %zu", n);
    if (n > FLAME_SCHED_MAX_PROFILES)
        return fl_error(FLAME_ERR_INVALID_ARG, "num_profiles %zu exceeds %d", n, FLAME_SCHED_MAX_PROFILES);
    *ps = (fl_profiles){.n = (int)n, .count_candidates = count_candidates};
    for (size_t i = 0; i < n; i++) {
        if (p[i].max_users < 1 || p[i].max_users > MAX_USERS)
            return fl_error(FLAME_ERR_INVALID_ARG, "profile %zu: max_users %u is outside 1..%u", i, p[i].max_users,
                            MAX_USERS);
        if (p[i].max_candidates < 1 || p[i].max_candidates > MAX_CANDIDATES)
            return fl_error(FLAME_ERR_INVALID_ARG, "profile %zu: max_candidates %u is outside 1..%u", i,
                            p[i].max_candidates, MAX_CANDIDATES);
        ps->p[i] = p[i];
        if (p[i].max_candidates > ps->max_candidates) ps->max_candidates = p[i].max_candidates;
        if (p[i].max_users > ps->max_users) ps->max_users = p[i].max_users;
    }
    return FLAME_OK;
}

int fl_profiles_fit(const fl_profiles *ps, uint64_t users, uint64_t candidates)
{
    int best = -1;
    uint64_t best_size = UINT64_MAX;
    for (int i = 0; i < ps->n; i++) {
        const flame_batch_profile *p = &ps->p[i];
        if (users > p->max_users || (ps->count_candidates && candidates > p->max_candidates)) continue;
        uint64_t size = (uint64_t)p->max_users * (ps->count_candidates ? p->max_candidates : 1);
        if (size < best_size) best = i, best_size = size;
    }
    return best;
}

size_t fl_profiles_parts(const fl_profiles *ps, size_t n)
{
    if (!ps->count_candidates || n <= ps->max_candidates) return 1;
    return (n + ps->max_candidates - 1) / ps->max_candidates;
}
