/* Requests as the engine reads them: copies in this header's layout for callers built against
 * another flame.h (core/abi.h), and histories read from the shared-memory user cache for requests that
 * give a user id only (history_from_user_cache). Record convention (flame.h,
 * flame_engine_set_user_cache): slot 0 = the user's item ids, oldest first. Everything goes
 * into the call's workspace, so concurrent calls share nothing but the (lock-free) table. */
#include <string.h>

#include "ucache/user_cache.h"
#include "engine/engine.h"

#define BAD(...) fl_error(FLAME_ERR_INVALID_ARG, __VA_ARGS__)

static const flame_request *at(const void *reqs, size_t stride, size_t r)
{
    return (const flame_request *)((const unsigned char *)reqs + r * stride);
}

bool fl_requests_need_prepare(const void *reqs, size_t n, size_t stride)
{
    if (stride != sizeof(flame_request)) return n > 0; /* another header's layout: copied into this one */
    for (size_t r = 0; r < n; r++) {
        const flame_request *q = at(reqs, stride, r);
        if (q->struct_size != stride || q->history_from_user_cache) return true;
    }
    return false;
}

flame_status fl_request_stride_check(const void *reqs, size_t stride, size_t r)
{
    const size_t size = at(reqs, stride, r)->struct_size;
    if (size == stride) return FLAME_OK;
    return BAD("request %zu: struct_size = %zu, but the array's elements are %zu bytes apart (request 0's "
               "struct_size): every request of one call comes from one flame.h",
               r, size, stride);
}

flame_status fl_prepare_requests(struct flame_engine *e, fl_workspace *ws, const void *reqs, size_t n, size_t stride,
                                 const flame_request **out, uint64_t *hits, uint64_t *misses)
{
    *out = NULL;
    *hits = *misses = 0;
    flame_request *copies = fl_workspace_grow(&ws->prep[0], &ws->prep_cap[0], n * sizeof(flame_request));
    if (!copies) return fl_error(FLAME_ERR_NOMEM, "out of memory copying %zu request(s)", n);
    size_t users = 0;
    for (size_t r = 0; r < n; r++) {
        const flame_status mixed = fl_request_stride_check(reqs, stride, r);
        if (mixed) return mixed;
        fl_request_current(at(reqs, stride, r), stride, &copies[r]);
        const flame_request *q = &copies[r];
        int32_t flag = q->history_from_user_cache;
        if (flag != 0 && flag != 1)
            return BAD("request %zu: history_from_user_cache = %d, expected 0 or 1", r, (int)flag);
        if (!flag) continue;
        if (q->history || q->history_len || q->history_side)
            return BAD("request %zu (user %lld): history_from_user_cache is 1 but the request gives a history "
                       "(history %s, history_len %zu, history_side %s)",
                       r, (long long)q->user_id, q->history ? "set" : "NULL", q->history_len,
                       q->history_side ? "set" : "NULL");
        if (!e->user_cache)
            return BAD("request %zu (user %lld): history_from_user_cache is 1 but the engine has no user cache "
                       "(FLAME_OPT_USER_CACHE)",
                       r, (long long)q->user_id);
        users++;
    }

    /* copies, then per user the window of its history; one record's ids, dense values and
     * slot lengths as the scratch every lookup reads into (the table's bounds, so a get never
     * finds the buffers too small; the dense values are not used) */
    const size_t max_len = (size_t)e->model->cfg.max_len;
    const fl_uc_layout *lay = users ? &e->user_cache->lay : NULL;
    size_t max_ids = lay ? lay->max_ids : 0, max_dense = lay ? lay->max_dense : 0, slots = lay ? lay->num_slots : 0;
    size_t window = max_len < max_ids ? max_len : max_ids;
    int64_t *hist = users ? fl_workspace_grow(&ws->prep[1], &ws->prep_cap[1],
                                              (users * window + max_ids) * sizeof(int64_t) +
                                                  max_dense * sizeof(float) + slots * sizeof(uint32_t))
                          : NULL;
    if (users && !hist)
        return fl_error(FLAME_ERR_NOMEM, "out of memory reading %zu user(s)' histories from the user cache", users);
    int64_t *rec_ids = hist + users * window;
    float *rec_dense = (float *)(rec_ids + max_ids);
    uint32_t *rec_lens = (uint32_t *)(rec_dense + max_dense);

    const int64_t num_items = e->model->num_items;
    for (size_t r = 0; r < n; r++) {
        flame_request *c = &copies[r];
        const flame_request *q = c;
        if (!c->history_from_user_cache) continue; /* (the flag was checked to be 0 or 1 above) */
        flame_user_features f = {.struct_size = sizeof f, .ids = rec_ids, .slot_lens = rec_lens,
                                 .ids_capacity = max_ids, .dense = max_dense ? rec_dense : NULL,
                                 .dense_capacity = max_dense};
        int32_t found = 0;
        flame_status st = flame_user_cache_get(e->user_cache, q->user_id, &f, &found);
        if (st) return st; /* cannot be BUFFER_TOO_SMALL: the capacities are the table's bounds */
        if (!found) {
            ++*misses;
            continue;
        }
        ++*hits;
        size_t len = rec_lens[0] <= f.num_ids ? rec_lens[0] : f.num_ids;
        for (size_t i = 0; i < len; i++) /* the whole history, as for a history given in the request */
            if (rec_ids[i] < 0 || rec_ids[i] >= num_items)
                return BAD("request %zu: user %lld's history in the user cache, position %zu of %zu: item id %lld "
                           "out of range [0, %lld)",
                           r, (long long)q->user_id, i, len, (long long)rec_ids[i], (long long)num_items);
        size_t w = len < window ? len : window;
        memcpy(hist, rec_ids + (len - w), w * sizeof(int64_t));
        c->history = w ? hist : NULL;
        c->history_len = w;
        hist += window;
    }
    *out = copies;
    return FLAME_OK;
}
