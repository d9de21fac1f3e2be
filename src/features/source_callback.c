/* A feature source backed by the host's batched callback, sync or async. */
#include <stdio.h>
#include <stdlib.h>

#include "features/source.h"

typedef struct cb_source {
    struct flame_feature_source base;
    flame_feature_fetch_fn fetch;
    flame_feature_fetch_async_fn fetch_async;
    void *user;
} cb_source;

/* Whether a callback's status is one of the FLAME_ERR_* members of flame_status (a switch, not a
 * range, so a retired code left as a gap is not one). */
static bool is_error_status(flame_status st)
{
    switch (st) {
    case FLAME_ERR_INVALID_ARG:
    case FLAME_ERR_NOMEM:
    case FLAME_ERR_IO:
    case FLAME_ERR_FORMAT:
    case FLAME_ERR_UNSUPPORTED:
    case FLAME_ERR_NO_DEVICE:
    case FLAME_ERR_BUFFER_TOO_SMALL:
    case FLAME_ERR_INTERNAL:
    case FLAME_ERR_UNAVAILABLE:
    case FLAME_ERR_TIMEOUT:
    case FLAME_ERR_CANCELLED: return true;
    default: return false;
    }
}

static flame_status cb_fetch(struct flame_feature_source *s, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    cb_source *c = (cb_source *)s;
    flame_status st;
    if (c->fetch) {
        st = c->fetch(c->user, ids, n, out);
    } else {
        fl_batch_arm(out);
        c->fetch_async(c->user, ids, n, out);
        st = fl_batch_wait(out);
    }
    if (st == FLAME_OK) return FLAME_OK;
    /* the ids the failed fetch was for: the id itself when alone (an item cache fetches the ids
     * of a failed batch again one by one), else the batch's size and its first id (fl_source_fetch
     * calls no source for 0 ids) */
    char which[96];
    if (n == 1)
        snprintf(which, sizeof which, "id %lld", (long long)ids[0]);
    else
        snprintf(which, sizeof which, "a batch of %zu ids beginning with id %lld", n, (long long)ids[0]);
    if (!is_error_status(st)) /* not a flame_status: never passed on to the caller as one */
        return fl_error(FLAME_ERR_UNAVAILABLE,
                        "feature callback returned %d, which is not a flame_status (FLAME_OK or a FLAME_ERR_* value), "
                        "for %s: treated as a failure", (int)st, which);
    char refused[96] = "";
    if (out->refused[0] && out->refused_index < n)
        snprintf(refused, sizeof refused, "; flame_feature_batch_set refused the record of id %lld: ",
                 (long long)ids[out->refused_index]);
    else if (out->refused[0])
        snprintf(refused, sizeof refused, "; flame_feature_batch_set refused ");
    return fl_error(st, "feature callback failed with %s for %s%s%s", flame_status_string(st), which, refused,
                    out->refused);
}

static void cb_destroy(struct flame_feature_source *s)
{
    free(s);
}

static const fl_source_ops cb_ops = {cb_fetch, cb_destroy};

FLAME_API flame_status flame_feature_source_create_callback(int32_t num_slots, flame_feature_fetch_fn fetch,
                                                            flame_feature_fetch_async_fn fetch_async, void *user,
                                                            flame_feature_source **out)
{
    fl_clear_error();
    if (out) *out = NULL;
    if (!out) return fl_error(FLAME_ERR_INVALID_ARG, "flame_feature_source_create_callback: out is NULL");
    if (!fetch == !fetch_async)
        return fl_error(FLAME_ERR_INVALID_ARG, "exactly one of fetch and fetch_async must be non-NULL");
    if (num_slots < 0 || num_slots > FL_MAX_SLOTS)
        return fl_error(FLAME_ERR_INVALID_ARG, "num_slots = %d is out of range [0, %d]", num_slots, FL_MAX_SLOTS);
    cb_source *c = calloc(1, sizeof *c);
    if (!c) return fl_error(FLAME_ERR_NOMEM, "out of memory allocating a feature source");
    fl_source_init(&c->base, &cb_ops, num_slots);
    c->base.async = fetch_async != NULL;
    c->fetch = fetch;
    c->fetch_async = fetch_async;
    c->user = user;
    *out = &c->base;
    return FLAME_OK;
}
