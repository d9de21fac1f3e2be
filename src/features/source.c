/* Source lifetime and the fetch wrapper every caller goes through. */
#include <stdlib.h>

#include "features/source.h"

void fl_source_init(struct flame_feature_source *s, const fl_source_ops *ops, int32_t num_slots)
{
    s->ops = ops;
    s->num_slots = num_slots;
    atomic_init(&s->refs, 1);
}

void fl_source_retain(struct flame_feature_source *s)
{
    atomic_fetch_add(&s->refs, 1);
}

void fl_source_release(struct flame_feature_source *s)
{
    if (s && atomic_fetch_sub(&s->refs, 1) == 1) s->ops->destroy(s);
}

flame_status fl_source_fetch(struct flame_feature_source *s, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    flame_status st = fl_batch_reset(out, n);
    if (st || n == 0) return st;
    st = s->ops->fetch(s, ids, n, out);
    if (st) return st;
    for (size_t i = 0; i < n; i++)
        if (out->rec[i].state == FL_REC_UNSET)
            return fl_error(FLAME_ERR_INVALID_ARG, "feature source left record %zu (id %lld) unwritten", i,
                            (long long)ids[i]);
    return FLAME_OK;
}

FLAME_API int32_t flame_feature_source_num_slots(const flame_feature_source *s)
{
    return s ? s->num_slots : -1;
}

FLAME_API flame_status flame_feature_source_fetch(flame_feature_source *s, const int64_t *ids, size_t n,
                                                  flame_feature_batch *out)
{
    fl_clear_error();
    if (!s || !out) return fl_error(FLAME_ERR_INVALID_ARG, "flame_feature_source_fetch: NULL source or out");
    if (n && !ids) return fl_error(FLAME_ERR_INVALID_ARG, "ids is NULL with n %zu", n);
    if (out->num_slots != s->num_slots)
        return fl_error(FLAME_ERR_INVALID_ARG, "batch has %d slots, the source %d", out->num_slots, s->num_slots);
    return fl_source_fetch(s, ids, n, out);
}

FLAME_API void flame_feature_source_destroy(flame_feature_source *s)
{
    fl_source_release(s);
}
