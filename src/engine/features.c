/* Side features from the item cache: for requests that give only item ids, one cache lookup
 * per call for the distinct ids of all their tokens, then per-slot CSR bags built in the
 * call's workspace. Missing records give empty bags (zero vectors, docs/model-format.md). */
#include <stdlib.h>

#include "icache/icache.h"
#include "features/record.h"
#include "engine/engine.h"

static bool wants_cache(const struct flame_engine *e, const flame_request *q)
{
    const fl_model_cfg *c = &e->model->cfg;
    bool sumi = c->head == FLAME_HEAD_SUMI;
    /* malformed requests are left for validation to name */
    return c->num_side > 0 && q->num_side_features == (size_t)c->num_side &&
           !q->history_side && (!sumi || !q->candidate_side) && (!q->history_len || q->history) &&
           (!sumi || !q->num_candidates || q->candidates);
}

static void *grow(fl_workspace *ws, int k, size_t bytes)
{
    if (bytes <= ws->feat_cap[k]) return ws->feat[k];
    void *p = realloc(ws->feat[k], bytes + bytes / 4);
    if (!p) return NULL;
    ws->feat[k] = p;
    ws->feat_cap[k] = bytes + bytes / 4;
    return p;
}

void fl_workspace_free_features(fl_workspace *ws)
{
    free(ws->feat[0]);
    free(ws->feat[1]);
    flame_feature_batch_destroy(ws->records);
    free(ws->prep[0]);
    free(ws->prep[1]);
}

/* The tokens of request q whose features are read: window history, then sumi candidates. */
static size_t window_start(const fl_model_cfg *c, const flame_request *q)
{
    return q->history_len > (size_t)c->max_len ? q->history_len - (size_t)c->max_len : 0;
}

static size_t ids_of_token(const flame_feature_batch *b, uint32_t u, int32_t slot, const int64_t **ids)
{
    uint32_t len, state;
    const uint8_t *blob = fl_batch_blob(b, u, &len, &state);
    size_t count = 0;
    *ids = blob ? fl_rec_slot(blob, slot, &count) : NULL;
    return count;
}

flame_status fl_resolve_features(struct flame_engine *e, fl_workspace *ws, const flame_request *reqs, size_t n,
                                 const flame_request **out, fl_fetch_time *ft)
{
    *out = reqs;
    *ft = (fl_fetch_time){0};
    if (!e->item_cache) return FLAME_OK;
    const fl_model_cfg *c = &e->model->cfg;
    const bool sumi = c->head == FLAME_HEAD_SUMI;
    const int32_t S = c->num_side;
    size_t T = 0, needy = 0;
    for (size_t r = 0; r < n; r++)
        if (wants_cache(e, &reqs[r])) {
            needy++;
            T += reqs[r].history_len - window_start(c, &reqs[r]) + (sumi ? reqs[r].num_candidates : 0);
        }
    if (!needy) return FLAME_OK;

    /* distinct ids: open addressing over [tsize] slots, each token mapped to its unique index */
    size_t tsize = 16;
    while (tsize < 2 * T) tsize *= 2;
    size_t a_bytes = T * 8 + T * 4 + tsize * 8 + tsize * 4;
    uint8_t *a = grow(ws, 0, a_bytes);
    if (!a) return fl_error(FLAME_ERR_NOMEM, "out of memory resolving %zu item features", T);
    int64_t *uniq = (int64_t *)a, *tkeys = (int64_t *)(a + T * 8);
    uint32_t *tok_u = (uint32_t *)(a + T * 8 + tsize * 8), *tidx = tok_u + T;
    memset(tidx, 0xff, tsize * 4);
    size_t U = 0, t = 0;
    for (size_t r = 0; r < n; r++) {
        const flame_request *q = &reqs[r];
        if (!wants_cache(e, q)) continue;
        size_t h0 = window_start(c, q), m = sumi ? q->num_candidates : 0;
        for (size_t i = h0; i < q->history_len + m; i++, t++) {
            int64_t id = i < q->history_len ? q->history[i] : q->candidates[i - q->history_len];
            size_t j = fl_hash64(id) & (tsize - 1);
            while (tidx[j] != UINT32_MAX && tkeys[j] != id) j = (j + 1) & (tsize - 1);
            if (tidx[j] == UINT32_MAX) {
                tkeys[j] = id;
                tidx[j] = (uint32_t)U;
                uniq[U++] = id;
            }
            tok_u[t] = tidx[j];
        }
    }
    if (!ws->records && flame_feature_batch_create(S, &ws->records))
        return fl_error(FLAME_ERR_NOMEM, "out of memory for a feature batch");
    flame_status st = fl_icache_get(e->item_cache, uniq, U, ws->records, ft);
    if (st) return st;

    /* bags: per needy request and slot, offsets over all its tokens (older history tokens
     * outside the window get empty bags) and the ids of the tokens in the window */
    size_t b_bytes = n * sizeof(flame_request);
    t = 0;
    for (size_t r = 0; r < n; r++) {
        const flame_request *q = &reqs[r];
        if (!wants_cache(e, q)) continue;
        size_t h0 = window_start(c, q), m = sumi ? q->num_candidates : 0;
        b_bytes += 2 * (size_t)S * sizeof(flame_bags) + (size_t)S * (q->history_len + 1 + m + 1) * 8;
        for (size_t i = h0; i < q->history_len + m; i++, t++)
            for (int32_t s = 0; s < S; s++) {
                const int64_t *ids;
                b_bytes += ids_of_token(ws->records, tok_u[t], s, &ids) * 8;
            }
    }
    uint8_t *b = grow(ws, 1, b_bytes);
    if (!b) return fl_error(FLAME_ERR_NOMEM, "out of memory for %zu bytes of item features", b_bytes);
    flame_request *copies = (flame_request *)b;
    uint8_t *p = b + n * sizeof(flame_request);
    t = 0;
    for (size_t r = 0; r < n; r++) {
        copies[r] = reqs[r];
        const flame_request *q = &reqs[r];
        if (!wants_cache(e, q)) continue;
        copies[r].struct_size = sizeof(flame_request);
        size_t h0 = window_start(c, q), m = sumi ? q->num_candidates : 0;
        flame_bags *hs = (flame_bags *)p, *cs = hs + S;
        p += 2 * (size_t)S * sizeof(flame_bags);
        for (int32_t s = 0; s < S; s++) {
            int64_t *hoff = (int64_t *)p, *coff = hoff + q->history_len + 1;
            p += (q->history_len + 1 + m + 1) * 8;
            hs[s].offsets = hoff, cs[s].offsets = coff;
            for (size_t i = 0; i <= h0; i++) hoff[i] = 0;
            coff[0] = 0;
            const size_t hl = q->history_len;
            for (int part = 0; part < 2; part++) { /* history ids, then candidate ids */
                int64_t *ids = (int64_t *)p, k = 0;
                size_t lo = part ? hl : h0, hi = part ? hl + m : hl;
                for (size_t i = lo; i < hi; i++) {
                    const int64_t *src;
                    size_t cnt = ids_of_token(ws->records, tok_u[t + (i - h0)], s, &src);
                    if (cnt) memcpy(ids + k, src, cnt * 8);
                    k += (int64_t)cnt;
                    if (part)
                        coff[i - hl + 1] = k;
                    else
                        hoff[i + 1] = k;
                }
                if (part)
                    cs[s].ids = ids, cs[s].num_ids = (size_t)k;
                else
                    hs[s].ids = ids, hs[s].num_ids = (size_t)k;
                p = (uint8_t *)(ids + k);
            }
        }
        t += q->history_len - h0 + m;
        copies[r].history_side = hs;
        copies[r].candidate_side = sumi ? cs : NULL;
    }
    *out = copies;
    return FLAME_OK;
}
