/* Batch profiles of the GPU engine: parsing and routing (batch_profiles.h). */
#include "engine/batch_profiles.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

#define MAX_USERS 65536L
#define MAX_DIM (1L << 24)

/* One decimal field of a profile: 1..max, followed by one of `ends` or the string's end. */
static bool field(const char **s, long max, const char *ends, long *v)
{
    if (**s < '0' || **s > '9') return false;
    char *end = NULL;
    errno = 0;
    const long x = strtol(*s, &end, 10);
    if (errno || x < 1 || x > max || !strchr(ends, *end)) return false;
    *v = x;
    *s = end;
    return true;
}

flame_status fl_batch_profiles_parse(const char *s, fl_batch_profiles *out)
{
    fl_batch_profiles ps = {0};
    const char *p = s;
    while (*p) {
        const char *start = p;
        long u = 0, c = 0, l = 0;
        bool ok = ps.n < FL_MAX_BATCH_PROFILES && field(&p, MAX_USERS, "x", &u) && *p == 'x' &&
                  (p++, field(&p, MAX_DIM, "x,", &c));
        if (ok && *p == 'x') ok = (p++, field(&p, MAX_DIM, ",", &l));
        if (!ok) {
            const size_t len = strcspn(start, ",");
            if (ps.n == FL_MAX_BATCH_PROFILES)
                return fl_error(FLAME_ERR_INVALID_ARG, "FLAME_OPT_BATCH_PROFILES: more than %d profiles",
                                FL_MAX_BATCH_PROFILES);
            return fl_error(FLAME_ERR_INVALID_ARG,
                            "FLAME_OPT_BATCH_PROFILES: profile %d '%.*s' is not USERSxCANDIDATES[xHISTORY] with users "
                            "1..%ld, candidates and history 1..%ld",
                            ps.n, (int)(len > 40 ? 40 : len), start, MAX_USERS, MAX_DIM);
        }
        ps.p[ps.n++] = (fl_batch_profile){(int32_t)u, (int32_t)c, (int32_t)l};
        if (*p == ',') {
            p++;
            if (!*p) return fl_error(FLAME_ERR_INVALID_ARG, "FLAME_OPT_BATCH_PROFILES: '%.40s' ends with a comma", s);
        }
    }
    *out = ps;
    return FLAME_OK;
}

bool fl_batch_profile_route(const fl_batch_profiles *ps, int32_t max_len, const flame_request *reqs, size_t n,
                            fl_batch_profile *shape)
{
    if (!ps || ps->n == 0 || n == 0) return false;
    int64_t most_m = 0, most_n = 0;
    for (size_t r = 0; r < n; r++) {
        const int64_t w = reqs[r].history_len < (size_t)max_len ? (int64_t)reqs[r].history_len : max_len;
        if ((int64_t)reqs[r].num_candidates > most_m) most_m = (int64_t)reqs[r].num_candidates;
        if (w > most_n) most_n = w;
    }
    int64_t bucket = fl_pow2_at_least(most_n, FL_PROFILE_MIN_HISTORY);
    if (bucket > max_len) bucket = max_len;
    int best = -1;
    int64_t best_tokens = 0, best_hist = 0;
    for (int i = 0; i < ps->n; i++) {
        const fl_batch_profile *p = &ps->p[i];
        const int64_t hist = p->history ? p->history : bucket;
        if ((int64_t)p->users < (int64_t)n || p->candidates < most_m || hist < most_n) continue;
        const int64_t tokens = (int64_t)p->users * (hist + p->candidates);
        if (tokens > INT32_MAX) continue; /* a pass indexes its tokens in 32 bits */
        if (best < 0 || tokens < best_tokens) best = i, best_tokens = tokens, best_hist = hist;
    }
    if (best < 0) return false;
    *shape = (fl_batch_profile){ps->p[best].users, ps->p[best].candidates, (int32_t)best_hist};
    return true;
}

static bool add_profile(fl_batch_profiles *ps, int32_t users, int32_t candidates)
{
    for (int i = 0; i < ps->n; i++)
        if (ps->p[i].users == users && ps->p[i].candidates == candidates && ps->p[i].history == 0) return true;
    if (ps->n == FL_MAX_BATCH_PROFILES) return false;
    ps->p[ps->n++] = (fl_batch_profile){users, candidates, 0};
    return true;
}

void fl_batch_profiles_for_scheduler(const flame_batch_profile *p, int n, fl_batch_profiles *out)
{
    fl_batch_profiles ps = {0};
    if (n > FL_MAX_BATCH_PROFILES) n = FL_MAX_BATCH_PROFILES;
    for (int i = 0; i < n; i++) add_profile(&ps, (int32_t)p[i].max_users, (int32_t)p[i].max_candidates);
    /* rung k of every ladder before rung k+1 of any: the smallest batches are the common ones */
    for (int64_t users = 1; users < MAX_USERS && ps.n < FL_MAX_BATCH_PROFILES; users *= 2)
        for (int i = 0; i < n && ps.n < FL_MAX_BATCH_PROFILES; i++)
            if (users < (int64_t)p[i].max_users) add_profile(&ps, (int32_t)users, (int32_t)p[i].max_candidates);
    *out = ps;
}
