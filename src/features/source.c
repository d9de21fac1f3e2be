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
    int64_t *copy = NULL; /* ids read back from out are read from a copy: out is rewritten below */
    const int64_t *own = ids;
    flame_status st = fl_batch_own_ids(out, &own, n, &copy);
    if (st) return st;
    st = fl_batch_reset(out, n);
    if (st || n == 0) {
        free(copy);
        return st;
    }
    st = s->ops->fetch(s, own, n, out);
    for (size_t i = 0; !st && i < n; i++) {
        if (out->rec[i].state == FL_REC_UNSET)
            st = fl_error(FLAME_ERR_INVALID_ARG, "feature source left record %zu (id %lld) unwritten%s%s", i,
                          (long long)own[i], out->refused[0] ? "; flame_feature_batch_set refused " : "",
                          out->refused);
        /* ids are table rows: no record is held for a negative one, as the feature file holds
         * no line for one and flame_item_cache_put refuses one; asking for one is no error
         * (the source may answer missing) */
        else if (out->rec[i].state == FL_REC_FOUND && own[i] < 0)
            st = fl_error(FLAME_ERR_FORMAT, "feature source gave a record for item id %lld (record %zu), which is "
                          "negative", (long long)own[i], i);
    }
    if (st) fl_batch_reset(out, 0); /* a failed fetch leaves an empty batch, never part of one */
    free(copy);
    return st;
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
