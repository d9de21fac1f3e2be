// The forward pass on the GPU for one pass of validated requests (docs/model-format.md).
// The host packs every index the kernels need (token ids, rebased side-feature CSR,
// position rows, selected rows, attention tiles, gather lists) into one pinned buffer that
// goes to the device in one copy; then one stream runs embedding -> blocks -> head, and the
// scores come back in one copy. Token-wise layers run over all requests' tokens at once, and
// the last block computes queries and everything after attention only for the rows the head
// reads, as on the CPU (src/engine/forward.c).
//
// A request with kv_cache = 1 (engine with a KV cache) runs in a pass of its own, executing
// src/engine/plan.h as the CPU does: only history rows cached..n-1 and the candidates are
// tokens of the pass; each block assembles the sequence's K/V in a contiguous workspace (the
// cached rows gathered from the device blocks, the computed ones copied from the QKV GEMM's
// output), stores the computed history rows in the entry's blocks when this call writes
// them, and runs attention with the queries starting at row `cached`. Such a pass takes the
// 16-query attention tiles; its CUDA graph's signature holds the cached prefix and the rows
// read and stored (docs/kv-cache.md).
//
// A pass that one of the engine's batch profiles holds (FLAME_OPT_BATCH_PROFILES; SUMI head,
// no kv_cache) is padded to it: user r owns token rows [r (L + C), (r + 1)(L + C)), its history
// window ends at row r (L + C) + L and its candidates follow, so every length of the pass is
// data of the upload and not a launch parameter; the unused rows are padding tokens (item 0,
// no position) that attend only to themselves, and each slot's attention tiles are split to a
// count fixed by the profile. One graph then serves every pass of the profile, and a copy
// kernel packs the real users' scores before they go back.
#include <string.h>
#include <time.h>

#include <algorithm>
#include <exception>
#include <new>

#include "engine.cuh"
#include "topk.cuh"
#include "engine/topk_select.h"
#include "engine/plan.h"

namespace {

// Bump allocator over a buffer; `base` NULL only measures.
struct carver {
    uint8_t *base;
    size_t used = 0;
    template <typename P> P *take(size_t count)
    {
        used = (used + 255) & ~(size_t)255; // 256-byte alignment: vector loads and cuBLASLt
        P *p = base ? reinterpret_cast<P *>(base + used) : nullptr;
        used += count * sizeof(P);
        return p;
    }
};

// The index data, in the pinned staging buffer and its device copy (same offsets).
struct indices {
    int64_t *item;                   // [T] item id per token
    int64_t *side_off[FL_MAX_FEATURES], *side_ids[FL_MAX_FEATURES];
    int32_t *prow;                   // [T] position row, -1 none
    int64_t *sel;                    // [S] rows the head reads
    int32_t *qpos;                   // [S] their positions in their sequence
    fl_attn_tile *tiles_full, *tiles_last;
    int64_t *g_hrow, *g_ids, *g_out; // dot head, gathered candidates
    int64_t *kv_map;                 // [T] KV cache pass: each token's row in the K/V workspace
    fl_kv_dev_row *kv_read, *kv_write; // cached rows gathered, computed rows stored
    int64_t *segs;                   // [3 U] a padded pass: each user's scores (from, to, count)
};

struct pass {
    fl_cuda_engine *g;
    fl_cuda_executor *x;
    const flame_request *reqs;
    size_t n;
    int64_t T = 0, S = 0, tiles_full = 0, tiles_last = 0, gathered = 0, total_scores = 0;
    int64_t max_hist = 0; // the longest history of the pass: the attention launches' max_keys
    int32_t tq_full = FL_ATTN_QT, tq_last = FL_ATTN_QT; // queries per attention tile (fl_cuda_attention_tile_queries)
    int64_t side_total[FL_MAX_FEATURES] = {};
    // every bag of the slot holds one id: no offsets travel, the kernel reads ids[t] (common
    // for single-valued side features such as an item's author)
    bool single[FL_MAX_FEATURES];
    // the first selected row when the rows the head reads are one contiguous run (one request):
    // the last block then works on those rows of X and Y in place, without gathering them
    int64_t sel_run = -1;
    indices host{}, dev{};
    // set outside graph capture: recorded after the index upload, for the H2D stage time
    cudaEvent_t after_upload = nullptr;
    // the KV cache: kv true when this pass (one request) reads or writes it; KT rows of the
    // K/V workspace; rows gathered from and stored to the blocks
    bool kv = false, store = false;
    int32_t cached = 0;
    int64_t KT = 0, kv_read = 0, kv_write = 0;
    fl_kv_ticket ticket{};
    // a pass padded to a batch profile (see the top of this file): the shape, and the tokens
    // and scores of its real requests
    bool prof = false, warm = false; // warm: a warm-up pass (not counted in the stats)
    fl_batch_profile shape{};
    int64_t real_tokens = 0, real_scores = 0;
};

// Attention tiles per user slot of a padded pass, fixed by the profile: the natural tiling of
// `segments` runs of `queries` in all (the padding before the history, the sequence, the
// padding after the candidates) needs at most one partial tile a run beyond the whole ones, and
// a tile holds at least one query.
static int64_t slot_tiles(int64_t queries, int64_t tq, int segments)
{
    const int64_t t = ceil_div(queries, tq) + segments - 1;
    return t < queries ? t : queries;
}

void plan(pass &p)
{
    fl_cuda_engine *g = p.g;
    fl_cuda_executor *x = p.x;
    const fl_model_cfg &c = g->cfg;
    const bool sumi = c.head == FLAME_HEAD_SUMI;
    x->seqs.resize(p.n);
    for (int slot = 0; slot < c.num_side; slot++) p.single[slot] = true;
    for (size_t r = 0; r < p.n; r++) {
        const flame_request &q = p.reqs[r];
        fl_seq_plan &s = x->seqs[r];
        int32_t window = 0;
        fl_plan_window(&c, q.history_len, &s.start, &window); // the most recent max_len items
        s.n = window;
        s.m = sumi ? (int64_t)q.num_candidates : 0;
        s.p0 = p.kv ? p.cached : 0;
        s.kv = p.KT;
        s.off = p.T;
        s.sel0 = p.S;
        s.nsel = fl_plan_selected_count(&c, s.n, q.num_candidates);
        s.out = p.total_scores;
        if (p.prof) { // user r's slot; the history window ends where the candidates begin
            const int64_t slot = (int64_t)p.shape.history + p.shape.candidates;
            s.off = (int64_t)r * slot + p.shape.history - s.n;
            s.sel0 = (int64_t)r * p.shape.candidates;
            s.out = s.sel0 * c.num_tasks;
        }
        p.T += s.n - s.p0 + s.m;
        if (p.kv) p.KT += s.n + s.m; // (the signature holds it: 0 outside a KV cache pass)
        p.kv_read += s.p0;
        p.kv_write += p.store ? s.n - s.p0 : 0;
        p.S += s.nsel;
        p.total_scores += (int64_t)q.num_candidates * c.num_tasks;
        for (int slot = 0; slot < c.num_side; slot++) {
            const int64_t *ho = s.n > s.p0 ? q.history_side[slot].offsets + s.start : nullptr;
            const int64_t *co = s.m ? q.candidate_side[slot].offsets : nullptr;
            if (ho) p.side_total[slot] += ho[s.n] - ho[s.p0];
            if (co) p.side_total[slot] += co[s.m];
            for (int64_t i = s.p0; p.single[slot] && ho && i < s.n; i++) p.single[slot] = ho[i + 1] - ho[i] == 1;
            for (int64_t i = 0; p.single[slot] && co && i < s.m; i++) p.single[slot] = co[i + 1] - co[i] == 1;
        }
        // dot head: a run of consecutive ids is one GEMM, anything else is gathered (the shared
        // plan's test, which answers a user scoring the previous user's array without a scan)
        s.contig = false;
        if (!sumi && s.nsel && q.num_candidates) {
            const bool prev_tested = r && x->seqs[r - 1].nsel && p.reqs[r - 1].num_candidates;
            const int64_t prev_start = prev_tested && x->seqs[r - 1].contig ? p.reqs[r - 1].candidates[0] : -1;
            s.contig = fl_plan_dot_contiguous_start(&q, prev_tested ? &p.reqs[r - 1] : nullptr, prev_start) >= 0;
            if (!s.contig) p.gathered += (int64_t)q.num_candidates;
        }
    }
    if (p.prof) { // the profile's shape; multi-id side slots at the executor's capacity
        const int64_t U = p.shape.users, C = p.shape.candidates;
        p.real_tokens = p.T;
        p.real_scores = p.total_scores;
        p.T = U * ((int64_t)p.shape.history + C);
        p.S = U * C;
        p.total_scores = p.S * c.num_tasks;
        for (int slot = 0; slot < c.num_side; slot++) {
            if (p.single[slot]) {
                p.side_total[slot] = p.T;
                continue;
            }
            const int64_t cap = fl_pow2_at_least(p.side_total[slot], 1);
            if (cap > x->side_cap[slot]) x->side_cap[slot] = cap;
            p.side_total[slot] = x->side_cap[slot];
        }
    }
    const int32_t esize = g->dtype == FL_COMPUTE_FP32 ? 4 : 2, dh = c.d_model / c.num_heads;
    // FLAME_OPT_CUDA_ATTENTION = 1: 16-query tiles, i.e. the portable kernel, everywhere; so
    // also in a KV cache pass (its K/V workspace is laid out for them)
    const bool portable = p.g->attention_portable || p.kv;
    p.tq_full = portable ? FL_ATTN_QT : fl_cuda_attention_tile_queries(esize, dh, p.T, c.num_heads);
    p.tq_last = portable ? FL_ATTN_QT : fl_cuda_attention_tile_queries(esize, dh, p.S, c.num_heads);
    if (p.prof) {
        const int64_t U = p.shape.users, C = p.shape.candidates;
        p.tiles_full = U * slot_tiles((int64_t)p.shape.history + C, p.tq_full, 3);
        p.tiles_last = U * slot_tiles(C, p.tq_last, 2);
        p.max_hist = p.shape.history;
        return;
    }
    for (size_t r = 0; r < p.n; r++) {
        p.max_hist = std::max(p.max_hist, x->seqs[r].n);
        p.tiles_full += ceil_div(x->seqs[r].n - x->seqs[r].p0 + x->seqs[r].m, p.tq_full);
        p.tiles_last += ceil_div(x->seqs[r].nsel, p.tq_last);
    }
}

// Keys the last query of a tile sees: its cost. The 128-query kernel runs tiles in list order,
// so the longest go first and the last wave is short.
static int64_t tile_keys(const fl_attn_tile &t)
{
    const int64_t last = t.qpos_idx < 0 ? t.pos0 + t.nq - 1 : t.n_hist; // selected queries see the whole history
    return last < t.n_hist ? last + 1 : t.n_hist;
}
static void longest_first(fl_attn_tile *t, int64_t n)
{
    std::stable_sort(t, t + n, [](const fl_attn_tile &a, const fl_attn_tile &b) { return tile_keys(a) > tile_keys(b); });
}

size_t carve_indices(pass &p, uint8_t *base, indices &ix)
{
    const fl_model_cfg &c = p.g->cfg;
    carver cv{base};
    ix.item = cv.take<int64_t>(p.T);
    for (int s = 0; s < c.num_side; s++) {
        ix.side_off[s] = cv.take<int64_t>(p.single[s] ? 0 : p.T + 1);
        ix.side_ids[s] = cv.take<int64_t>(p.side_total[s]);
    }
    ix.prow = cv.take<int32_t>(p.T);
    ix.sel = cv.take<int64_t>(p.S);
    ix.qpos = cv.take<int32_t>(p.S);
    ix.tiles_full = cv.take<fl_attn_tile>(p.tiles_full);
    ix.tiles_last = cv.take<fl_attn_tile>(p.tiles_last);
    ix.g_hrow = cv.take<int64_t>(p.gathered);
    ix.g_ids = cv.take<int64_t>(p.gathered);
    ix.g_out = cv.take<int64_t>(p.gathered);
    ix.kv_map = cv.take<int64_t>(p.kv ? p.T : 0);
    ix.kv_read = cv.take<fl_kv_dev_row>(p.kv_read);
    ix.kv_write = cv.take<fl_kv_dev_row>(p.kv_write);
    ix.segs = cv.take<int64_t>(p.prof ? 3 * (int64_t)p.shape.users : 0);
    return cv.used;
}

// A KV cache pass's rows: each token's row in the K/V workspace, the cached rows the blocks
// give (0..p0-1) and, when this call writes them, the computed history rows they take (p0..n-1).
static void fill_kv(pass &p, const fl_seq_plan &s, int64_t &kr, int64_t &kw)
{
    const fl_cuda_engine *g = p.g;
    indices &h = p.host;
    const int32_t B = g->kv_lay.block_tokens;
    const int32_t *blocks = p.ticket.blocks;
    for (int64_t i = 0; i < s.n - s.p0 + s.m; i++) h.kv_map[s.off + i] = s.kv + s.p0 + i;
    for (int64_t r = 0; r < s.p0; r++)
        h.kv_read[kr++] = {fl_kv_row_offset(&g->kv_lay, blocks[r / B], 0, 0, (int32_t)(r % B)), s.kv + r};
    for (int64_t r = s.p0; p.store && r < s.n; r++)
        h.kv_write[kw++] = {fl_kv_row_offset(&g->kv_lay, blocks[r / B], 0, 0, (int32_t)(r % B)), s.kv + r};
}

// Request r's tokens in the staging buffer: item ids, side bags (offsets rebased onto the
// pass's CSR, whose fill per slot is side_fill) and position rows. The history window (from
// p0: rows before it come from the KV cache), then the candidates: item ids and each slot's
// bags are one contiguous run each in the request, so each part is one copy.
static void fill_tokens(pass &p, size_t r, int64_t *side_fill)
{
    const fl_model_cfg &c = p.g->cfg;
    indices &h = p.host;
    const flame_request &q = p.reqs[r];
    const fl_seq_plan &s = p.x->seqs[r];
    const int64_t nh = s.n - s.p0;
    memcpy(h.item + s.off, q.history + s.start + s.p0, (size_t)nh * sizeof(int64_t));
    if (s.m) memcpy(h.item + s.off + nh, q.candidates, (size_t)s.m * sizeof(int64_t));
    for (int slot = 0; slot < c.num_side; slot++)
        for (int part = 0; part < 2; part++) {
            const int64_t count = part ? s.m : nh, src = part ? 0 : s.start + s.p0, t0 = s.off + (part ? nh : 0);
            if (count == 0) continue;
            const flame_bags &b = part ? q.candidate_side[slot] : q.history_side[slot];
            const int64_t base = b.offsets[src], len = b.offsets[src + count] - base;
            memcpy(h.side_ids[slot] + side_fill[slot], b.ids + base, (size_t)len * sizeof(int64_t));
            if (!p.single[slot])
                for (int64_t i = 0; i < count; i++) h.side_off[slot][t0 + i + 1] = side_fill[slot] + b.offsets[src + i + 1] - base;
            side_fill[slot] += len;
        }
    for (int64_t i = s.p0; i < s.n + s.m; i++) {
        const bool cand = i >= s.n;
        const int64_t t = s.off + i - s.p0;
        const int64_t row = cand ? c.candidate_position : fl_plan_history_position(&c, i, s.n);
        h.prow[t] = c.position_rule == FL_POS_NONE ? -1 : (int32_t)row;
    }
}

// Padding tokens [t0, t0 + count) of a padded pass: item 0 and no position; one id 0 in a
// single-id side slot (whose ids are indexed by token), an empty bag in the others.
static void fill_padding(pass &p, int64_t t0, int64_t count, int64_t *side_fill)
{
    const fl_model_cfg &c = p.g->cfg;
    indices &h = p.host;
    for (int64_t t = t0; t < t0 + count; t++) {
        h.item[t] = 0;
        h.prow[t] = -1;
    }
    for (int slot = 0; slot < c.num_side; slot++)
        for (int64_t t = t0; t < t0 + count; t++) {
            if (p.single[slot])
                h.side_ids[slot][side_fill[slot]++] = 0;
            else
                h.side_off[slot][t + 1] = side_fill[slot];
        }
}

// Tiles over queries [0, nq) of one sequence whose keys start at row seq_row (n_hist of them
// history): queries at rows q_row.., at consecutive positions from 0, or (qpos_idx >= 0) at
// the positions qpos gives from that index; at most tq a tile.
static void add_tiles(fl_attn_tile *t, int64_t &k, int64_t seq_row, int64_t n_hist, int64_t nq, int64_t q_row,
                      int64_t qpos_idx, int64_t tq)
{
    for (int64_t q = 0; q < nq; q += tq)
        t[k++] = {seq_row, (int32_t)n_hist, (int32_t)(nq - q < tq ? nq - q : tq), q_row + q,
                  qpos_idx < 0 ? (int32_t)q : 0, qpos_idx < 0 ? -1 : (int32_t)(qpos_idx + q)};
}

// Splits the largest of tiles [from, k) in two until there are `want` (a padded pass's count
// per slot; tiles are independent, so their order and sizes change nothing but the cost).
static void split_tiles(fl_attn_tile *t, int64_t from, int64_t &k, int64_t want)
{
    while (k - from < want) {
        int64_t big = from;
        for (int64_t i = from + 1; i < k; i++)
            if (t[i].nq > t[big].nq) big = i;
        fl_attn_tile second = t[big];
        const int32_t first = t[big].nq - t[big].nq / 2; // nq >= 2: want is at most the slot's queries
        t[big].nq = first;
        second.nq -= first;
        second.q_row += first;
        if (second.qpos_idx < 0) second.pos0 += first;
        else second.qpos_idx += first;
        t[k++] = second;
    }
}

// The staging buffer of a padded pass: every user slot of the profile, real or not.
static void fill_padded(pass &p)
{
    const fl_model_cfg &c = p.g->cfg;
    indices &h = p.host;
    const int64_t U = p.shape.users, C = p.shape.candidates, L = p.shape.history, slot = L + C;
    const int64_t per_full = p.tiles_full / U, per_last = p.tiles_last / U, tasks = c.num_tasks;
    int64_t side_fill[FL_MAX_FEATURES] = {};
    for (int sl = 0; sl < c.num_side; sl++)
        if (!p.single[sl]) h.side_off[sl][0] = 0;
    int64_t tf = 0, tl = 0, packed = 0;
    for (int64_t r = 0; r < U; r++) {
        const bool real = r < (int64_t)p.n;
        const int64_t n = real ? p.x->seqs[r].n : 0, m = real ? p.x->seqs[r].m : 0;
        const int64_t base = r * slot, seq = base + L - n, tail = base + L + m;
        fill_padding(p, base, L - n, side_fill);
        if (real) fill_tokens(p, (size_t)r, side_fill);
        fill_padding(p, tail, C - m, side_fill);
        const int64_t f0 = tf, l0 = tl;
        add_tiles(h.tiles_full, tf, base, 0, L - n, base, -1, p.tq_full); // padding: itself only
        add_tiles(h.tiles_full, tf, seq, n, n + m, seq, -1, p.tq_full);
        add_tiles(h.tiles_full, tf, tail, 0, C - m, tail, -1, p.tq_full);
        split_tiles(h.tiles_full, f0, tf, per_full);
        // the rows the head reads: the slot's candidate rows, real then padding
        for (int64_t i = 0; i < C; i++) {
            h.sel[r * C + i] = base + L + i;
            h.qpos[r * C + i] = (int32_t)(i < m ? n + i : i - m);
        }
        add_tiles(h.tiles_last, tl, seq, n, m, r * C, r * C, p.tq_last);
        add_tiles(h.tiles_last, tl, tail, 0, C - m, r * C + m, r * C + m, p.tq_last);
        split_tiles(h.tiles_last, l0, tl, per_last);
        h.segs[3 * r] = r * C * tasks;
        h.segs[3 * r + 1] = packed;
        h.segs[3 * r + 2] = m * tasks;
        packed += m * tasks;
    }
}

// Fills the staging buffer (host side of `indices`); dot-head GEMM groups go to x->groups.
void fill(pass &p)
{
    fl_cuda_engine *g = p.g;
    fl_cuda_executor *x = p.x;
    const fl_model_cfg &c = g->cfg;
    indices &h = p.host;
    int64_t side_fill[FL_MAX_FEATURES] = {};
    for (int s = 0; s < c.num_side; s++)
        if (!p.single[s]) h.side_off[s][0] = 0;
    int64_t tf = 0, tl = 0, ng = 0, kr = 0, kw = 0;
    x->groups.clear();
    for (size_t r = 0; r < p.n && !p.prof; r++) {
        const flame_request &q = p.reqs[r];
        const fl_seq_plan &s = x->seqs[r];
        fill_tokens(p, r, side_fill);
        // K/V rows: the QKV buffer's token rows, or the sequence's rows of the K/V workspace
        const int64_t kv_row = p.kv ? s.kv : s.off;
        for (int64_t q0 = s.p0; q0 < s.n + s.m; q0 += p.tq_full)
            h.tiles_full[tf++] = {kv_row, (int32_t)s.n, (int32_t)(s.n + s.m - q0 < p.tq_full ? s.n + s.m - q0 : p.tq_full),
                                  s.off + q0 - s.p0, (int32_t)q0, -1};
        for (int64_t i = 0; i < s.nsel; i++) {
            const int64_t pos = fl_plan_selected_position(&c, s.n, i);
            h.sel[s.sel0 + i] = s.off + pos - s.p0;
            h.qpos[s.sel0 + i] = (int32_t)pos;
        }
        add_tiles(h.tiles_last, tl, kv_row, s.n, s.nsel, s.sel0, s.sel0, p.tq_last);
        if (p.kv) fill_kv(p, s, kr, kw);
        if (c.head != FLAME_HEAD_DOT || s.nsel == 0 || q.num_candidates == 0) continue;
        const int64_t m = (int64_t)q.num_candidates;
        if (s.contig) {
            fl_dot_group *last = x->groups.empty() ? nullptr : &x->groups.back();
            if (last && fl_plan_dot_joins_group(last->first_id, (size_t)last->num, q.candidates[0], q.num_candidates) &&
                last->sel0 + last->count == s.sel0 && last->out + last->count * m == s.out)
                last->count++; // the next user of the same range: one more row of the same GEMM
            else
                x->groups.push_back({s.sel0, 1, q.candidates[0], m, s.out});
            continue;
        }
        for (int64_t j = 0; j < m; j++) {
            h.g_hrow[ng] = s.sel0;
            h.g_ids[ng] = q.candidates[j];
            h.g_out[ng++] = s.out + j;
        }
    }
    if (p.prof) {
        fill_padded(p);
        tf = p.tiles_full;
        tl = p.tiles_last;
    }
    if (p.tq_full == FL_ATTN_QT_WG) longest_first(h.tiles_full, tf);
    if (p.tq_last == FL_ATTN_QT_WG) longest_first(h.tiles_last, tl);
    p.gathered = ng;
    p.sel_run = p.S > 0 ? h.sel[0] : -1;
    for (int64_t i = 1; i < p.S && p.sel_run >= 0; i++)
        if (h.sel[i] != h.sel[0] + i) p.sel_run = -1;
}

// Activation buffers on the device, after the index copy.
struct buffers {
    float *X, *XS, *scores;
    void *Y, *QKV, *A, *F, *E, *YS, *Q, *H1, *H2, *HS;
    void *KV; // KV cache pass: [KT, 2d] K then V of every sequence's rows, contiguous per sequence
    float *packed; // padded pass: the real users' scores, packed in the caller's order
};

size_t carve_buffers(const pass &p, size_t esize, uint8_t *base, size_t offset, buffers &b)
{
    const fl_model_cfg &c = p.g->cfg;
    const int64_t T = p.T, S = p.S, d = c.d_model;
    int64_t widest = c.ffn_dim > d ? c.ffn_dim : d;
    for (int t = 0; c.head == FLAME_HEAD_SUMI && t < c.num_tasks; t++)
        for (int l = 0; l <= c.tasks[t].num_layers; l++) widest = c.tasks[t].width[l] > widest ? c.tasks[t].width[l] : widest;
    carver cv{base, offset};
    b.X = cv.take<float>(T * d);
    b.XS = cv.take<float>(S * d);
    b.scores = cv.take<float>(p.total_scores);
    b.Y = cv.take<uint8_t>(T * d * esize);
    b.QKV = cv.take<uint8_t>(T * 3 * d * esize);
    b.A = cv.take<uint8_t>(T * d * esize);
    b.F = cv.take<uint8_t>(T * widest * esize);
    b.E = cv.take<uint8_t>(c.projection ? T * c.embed_dim * esize : 0);
    b.YS = cv.take<uint8_t>(S * d * esize);
    b.Q = cv.take<uint8_t>(S * d * esize);
    b.H1 = cv.take<uint8_t>(S * widest * esize);
    b.H2 = cv.take<uint8_t>(S * widest * esize);
    b.HS = cv.take<uint8_t>(S * p.g->head_stack_width * esize);
    b.KV = cv.take<uint8_t>(p.kv ? p.KT * 2 * d * esize : 0);
    b.packed = cv.take<float>(p.prof ? p.total_scores : 0);
    return cv.used;
}

// Grows the executor's pinned staging and device arena (with headroom, so slowly growing
// batches do not reallocate each call). Captured graphs point into both: moving either
// drops them.
flame_status grow(fl_cuda_engine *g, fl_cuda_executor *x, size_t staging, size_t arena)
{
    if (staging > x->staging_bytes) { // from the engine's pinned pool (pageable if pinning fails)
        fl_graph_clear(&x->graphs);
        if (x->staging) flame_pinned_free(g->pinned, x->staging);
        x->staging = nullptr;
        x->staging_bytes = 0;
        void *p = nullptr;
        FL_TRY(flame_pinned_alloc(g->pinned, staging + staging / 4, &p, nullptr));
        x->staging = static_cast<uint8_t *>(p);
        x->staging_bytes = staging + staging / 4;
    }
    if (arena > x->arena_bytes) {
        fl_graph_clear(&x->graphs);
        const size_t want = arena + arena / 4;
        if (x->arena) cudaFree(x->arena);
        pthread_mutex_lock(&g->pool_lock);
        g->buffer_bytes -= x->arena_bytes;
        x->arena = nullptr;
        x->arena_bytes = 0;
        flame_status st = fl_dev_reserve(g, want, "this batch's activation buffers");
        if (!st) g->buffer_bytes += want; // reserved before the allocation, so two executors cannot both pass
        pthread_mutex_unlock(&g->pool_lock);
        FL_TRY(st);
        cudaError_t e = cudaMalloc(&x->arena, want);
        if (e != cudaSuccess) {
            pthread_mutex_lock(&g->pool_lock);
            g->buffer_bytes -= want;
            pthread_mutex_unlock(&g->pool_lock);
            (void)cudaGetLastError();
            return fl_error(FLAME_ERR_NOMEM, "cudaMalloc of %zu bytes of activation buffers: %s", want,
                            cudaGetErrorString(e));
        }
        x->arena_bytes = want;
    }
    return FLAME_OK;
}

// A linear layer with its activation: cuBLASLt fuses bias, ReLU and tanh-GELU; erf-GELU
// takes the bias epilogue and one elementwise pass.
template <typename T>
flame_status linear_act(fl_cuda_engine *g, fl_cuda_executor *x, int64_t rows, const fl_dev_linear &l, const void *in, int64_t ldx, T *y,
                        int64_t ldy, fl_activation act)
{
    fl_epilogue epi = act == FL_ACT_RELU ? FL_EPI_BIAS_RELU : act == FL_ACT_GELU_TANH ? FL_EPI_BIAS_GELU_TANH : FL_EPI_BIAS;
    FL_TRY(fl_gemm(&x->gemm, x->stream,
                   {.rows = rows, .in = l.in, .out = l.out, .x = in, .ldx = ldx, .w = l.w, .ldw = l.in, .ab = g->ab,
                    .bias = l.b, .y = y, .ldy = ldy, .yt = g->ab, .epi = epi}));
    if (act == FL_ACT_GELU_ERF) FL_TRY(fl_cuda_activation<T>(y, rows, l.out, ldy, 1, x->stream));
    return FLAME_OK;
}

// A KV cache pass's K/V workspace for one layer: the cached rows from the blocks, the
// computed tokens' K and V (columns d..3d of the QKV buffer) at their rows, then the computed
// history rows into the entry's blocks when this call writes them.
template <typename T> flame_status kv_assemble(fl_cuda_engine *g, pass &p, buffers &b, int layer)
{
    cudaStream_t s = p.x->stream;
    const int64_t d = g->cfg.d_model, row = d * (int64_t)sizeof(T), B = g->kv_lay.block_tokens;
    const uint64_t layer_off = (uint64_t)layer * 2 * (uint64_t)B * (uint64_t)row, kv_stride = (uint64_t)B * (uint64_t)row;
    FL_TRY(fl_cuda_kv_blocks(g->kv_blocks, p.dev.kv_read, p.kv_read, layer_off, kv_stride, b.KV, 2 * row, row, false, s));
    FL_TRY(fl_cuda_scatter_rows(static_cast<T *>(b.QKV) + d, 3 * row, p.dev.kv_map, p.T, 2 * row, b.KV, 2 * row, s));
    return fl_cuda_kv_blocks(g->kv_blocks, p.dev.kv_write, p.kv_write, layer_off, kv_stride, b.KV, 2 * row, row, true, s);
}

// The model's LayerNorm with weight w and bias b (its epsilon rule).
static fl_dev_layernorm layernorm(const fl_model_cfg &c, const float *w, const float *b)
{
    return {.w = w, .b = b, .eps = c.ln_eps, .eps_inside = c.eps_inside_sqrt};
}

template <typename T>
flame_status block(fl_cuda_engine *g, pass &p, buffers &b, const fl_dev_block &blk, int layer, bool last)
{
    fl_cuda_executor *x = p.x;
    const fl_model_cfg &c = g->cfg;
    const int32_t d = c.d_model, H = c.num_heads, dh = d / H;
    const int64_t NT = p.T, R = last ? p.S : NT;
    cudaStream_t s = x->stream;
    T *Y = static_cast<T *>(b.Y), *QKV = static_cast<T *>(b.QKV), *A = static_cast<T *>(b.A);
    // keys and values: the QKV buffer's token rows, or a KV cache pass's workspace
    const T *K = p.kv ? static_cast<const T *>(b.KV) : QKV + d, *V = p.kv ? static_cast<const T *>(b.KV) + d : QKV + 2 * d;
    const int64_t ldkv = p.kv ? 2 * d : 3 * d;
    // the attention input: LN1(X) before a pre-LN block, X itself (in T) before a post-LN one
    FL_TRY(fl_cuda_rows<T>({.rows = NT, .d = d, .X = b.X, .ln = layernorm(c, blk.ln1_w, blk.ln1_b),
                            .mode = c.pre_ln ? FL_ROW_LN_Y : FL_ROW_COPY, .Y = Y, .ldy = d},
                           s));
    if (!last) {
        FL_TRY(fl_gemm(&x->gemm, s,
                       {.rows = NT, .in = d, .out = 3 * d, .x = Y, .ldx = d, .w = blk.qkv.w, .ldw = d, .ab = g->ab,
                        .bias = blk.qkv.b, .y = QKV, .ldy = 3 * d, .yt = g->ab, .epi = FL_EPI_BIAS}));
        if (p.kv) FL_TRY(kv_assemble<T>(g, p, b, layer));
        FL_TRY(fl_cuda_attention<T>({.tiles = p.dev.tiles_full, .num_tiles = p.tiles_full, .heads = H, .dh = dh,
                                     .q = QKV, .ldq = 3 * d, .k = K, .v = V, .ldkv = ldkv, .out = A, .ldo = d,
                                     .tile_q = p.tq_full, .max_keys = p.max_hist, .work = x->attn_work},
                                    s));
    } else {
        // keys and values for every token (rows d..3d of the fused weight), queries for the selected rows only
        const size_t esz = sizeof(T);
        FL_TRY(fl_gemm(&x->gemm, s,
                       {.rows = NT, .in = d, .out = 2 * d, .x = Y, .ldx = d,
                        .w = static_cast<uint8_t *>(blk.qkv.w) + (size_t)d * d * esz, .ldw = d, .ab = g->ab,
                        .bias = static_cast<uint8_t *>(blk.qkv.b) + (size_t)d * esz, .y = QKV + d, .ldy = 3 * d,
                        .yt = g->ab, .epi = FL_EPI_BIAS}));
        if (p.kv) FL_TRY(kv_assemble<T>(g, p, b, layer));
        T *YS = static_cast<T *>(b.YS), *Q = static_cast<T *>(b.Q);
        if (p.sel_run < 0) FL_TRY(fl_cuda_gather<T>(Y, d, p.dev.sel, p.S, d, YS, d, s));
        FL_TRY(fl_gemm(&x->gemm, s,
                       {.rows = p.S, .in = d, .out = d, .x = YS, .ldx = d, .w = blk.qkv.w, .ldw = d, .ab = g->ab,
                        .bias = blk.qkv.b, .y = Q, .ldy = d, .yt = g->ab, .epi = FL_EPI_BIAS}));
        FL_TRY(fl_cuda_attention<T>({.tiles = p.dev.tiles_last, .num_tiles = p.tiles_last, .qpos = p.dev.qpos,
                                     .heads = H, .dh = dh, .q = Q, .ldq = d, .k = K, .v = V, .ldkv = ldkv, .out = A,
                                     .ldo = d, .tile_q = p.tq_last, .max_keys = p.max_hist, .work = x->attn_work},
                                    s));
        if (p.sel_run < 0) FL_TRY(fl_cuda_gather<float>(b.X, d, p.dev.sel, p.S, d, b.XS, d, s));
    }
    float *X = last ? b.XS : b.X;
    T *Yr = last ? static_cast<T *>(b.YS) : Y;
    // X += A Wo^T + bo (the residual add is the GEMM's beta = 1)
    FL_TRY(fl_gemm(&x->gemm, s,
                   {.rows = R, .in = d, .out = d, .x = A, .ldx = d, .w = blk.o.w, .ldw = d, .ab = g->ab,
                    .bias = blk.o.b, .y = X, .ldy = d, .yt = CUDA_R_32F, .beta = 1.0f, .epi = FL_EPI_BIAS}));
    // the FFN input: LN2(X) (pre-LN), or X = LN1(X + attention) itself (post-LN)
    if (c.pre_ln)
        FL_TRY(fl_cuda_rows<T>(
            {.rows = R, .d = d, .X = X, .ln = layernorm(c, blk.ln2_w, blk.ln2_b), .mode = FL_ROW_LN_Y, .Y = Yr, .ldy = d},
            s));
    else
        FL_TRY(fl_cuda_rows<T>(
            {.rows = R, .d = d, .X = X, .ln = layernorm(c, blk.ln1_w, blk.ln1_b), .mode = FL_ROW_LN_X, .Y = Yr, .ldy = d},
            s));
    T *F = static_cast<T *>(b.F);
    FL_TRY(linear_act<T>(g, x, R, blk.fc1, Yr, d, F, c.ffn_dim, c.activation));
    FL_TRY(fl_gemm(&x->gemm, s,
                   {.rows = R, .in = c.ffn_dim, .out = d, .x = F, .ldx = c.ffn_dim, .w = blk.fc2.w, .ldw = c.ffn_dim,
                    .ab = g->ab, .bias = blk.fc2.b, .y = X, .ldy = d, .yt = CUDA_R_32F, .beta = 1.0f,
                    .epi = FL_EPI_BIAS}));
    if (!c.pre_ln)
        FL_TRY(fl_cuda_rows<T>({.rows = R, .d = d, .X = X, .ln = layernorm(c, blk.ln2_w, blk.ln2_b), .mode = FL_ROW_LN_X},
                               s));
    return FLAME_OK;
}

template <typename T> flame_status embed(fl_cuda_engine *g, pass &p, buffers &b)
{
    fl_cuda_executor *x = p.x;
    const fl_model_cfg &c = g->cfg;
    fl_dev_features fs{};
    fs.count = c.num_features;
    fs.width = c.embed_dim;
    fs.concat = c.combine_concat;
    int32_t col = 0;
    for (int f = 0; f < c.num_features; f++) {
        const fl_feature_cfg &fc = c.features[f];
        fl_dev_feature &df = fs.f[f];
        df.table = g->tables_q8[fc.table] ? static_cast<const void *>(g->tables_q8[fc.table]) : g->tables[fc.table];
        df.qparams = g->qparams[fc.table]; // int8 rows, dequantized in the kernel
        df.dim = c.tables[fc.table].dim;
        df.pooling = fc.pooling;
        df.out_col = c.combine_concat ? col : 0;
        col += df.dim;
        df.offsets = fc.side_slot < 0 || p.single[fc.side_slot] ? nullptr : p.dev.side_off[fc.side_slot];
        df.ids = fc.side_slot < 0 ? p.dev.item : p.dev.side_ids[fc.side_slot];
    }
    const int32_t d = c.d_model;
    if (c.projection) {
        FL_TRY(fl_cuda_embedding_bag<T, T>(fs, p.T, static_cast<T *>(b.E), c.embed_dim, x->stream));
        FL_TRY(fl_gemm(&x->gemm, x->stream,
                       {.rows = p.T, .in = c.embed_dim, .out = d, .x = b.E, .ldx = c.embed_dim, .w = g->proj.w,
                        .ldw = c.embed_dim, .ab = g->ab, .bias = g->proj.b, .y = b.X, .ldy = d, .yt = CUDA_R_32F,
                        .epi = FL_EPI_BIAS}));
    } else {
        FL_TRY(fl_cuda_embedding_bag<T, float>(fs, p.T, b.X, d, x->stream));
    }
    if (c.position_rule != FL_POS_NONE || c.input_layernorm)
        FL_TRY(fl_cuda_rows<T>({.rows = p.T, .d = d, .X = b.X, .position = g->position, .prow = p.dev.prow,
                                .ln = layernorm(c, g->input_ln_w, g->input_ln_b),
                                .mode = c.input_layernorm ? FL_ROW_LN_X : FL_ROW_COPY},
                               x->stream));
    return FLAME_OK;
}

template <typename T> flame_status head(fl_cuda_engine *g, pass &p, buffers &b)
{
    fl_cuda_executor *x = p.x;
    const fl_model_cfg &c = g->cfg;
    const int32_t d = c.d_model;
    cudaStream_t s = x->stream;
    T *YS = static_cast<T *>(b.YS);
    // the head input: final LN (or a copy) of the selected rows, in T
    FL_TRY(fl_cuda_rows<T>({.rows = p.S, .d = d, .X = b.XS, .ln = layernorm(c, g->final_ln_w, g->final_ln_b),
                            .mode = c.final_layernorm ? FL_ROW_LN_Y : FL_ROW_COPY, .Y = YS, .ldy = d},
                           s));
    if (c.head == FLAME_HEAD_DOT) {
        // requests with an empty history score 0: clear everything, groups and gathers overwrite the rest
        FL_CUDA_TRY(cudaMemsetAsync(b.scores, 0, (size_t)p.total_scores * sizeof(float), s));
        const T *table = static_cast<const T *>(g->tables[c.dot_table]);
        for (const fl_dot_group &gr : x->groups)
            FL_TRY(fl_gemm(&x->gemm, s,
                           {.rows = gr.count, .in = d, .out = (int32_t)gr.num, .x = YS + gr.sel0 * d, .ldx = d,
                            .w = table + gr.first_id * d, .ldw = d, .ab = g->ab, .y = b.scores + gr.out,
                            .ldy = (int64_t)gr.num, .yt = CUDA_R_32F, .epi = FL_EPI_NONE}));
        return fl_cuda_dot_gather<T>(YS, d, p.dev.g_hrow, table, d, p.dev.g_ids, p.dev.g_out, p.gathered, b.scores, s);
    }
    // the stacked first layers (one GEMM), then the tasks outside the stack layer by layer, then
    // every fused task's last layer and sigmoid in one launch
    T *HS = static_cast<T *>(b.HS);
    const int32_t ws = g->head_stack_width;
    if (ws) FL_TRY(linear_act<T>(g, x, p.S, g->head_stack, YS, d, HS, ws, g->head_stack_act));
    for (int t = 0; t < c.num_tasks; t++) {
        const fl_task_cfg &tc = c.tasks[t];
        if (g->task_fused[t]) continue;
        const void *in = YS;
        int64_t ld_in = d;
        void *bufs[2] = {b.H1, b.H2};
        for (int l = 0; l < tc.num_layers; l++) {
            const fl_dev_linear &lin = g->tasks[t][l];
            if (l == tc.num_layers - 1) { // width 1, float, straight into column t of [S x tasks]
                FL_TRY(fl_gemm(&x->gemm, s,
                               {.rows = p.S, .in = lin.in, .out = 1, .x = in, .ldx = ld_in, .w = lin.w, .ldw = lin.in,
                                .ab = g->ab, .bias = lin.b, .y = b.scores + t, .ldy = c.num_tasks, .yt = CUDA_R_32F,
                                .epi = FL_EPI_BIAS}));
                break;
            }
            T *out = static_cast<T *>(bufs[l & 1]);
            FL_TRY(linear_act<T>(g, x, p.S, lin, in, ld_in, out, lin.out, tc.activation));
            in = out;
            ld_in = lin.out;
        }
        FL_TRY(fl_cuda_sigmoid(b.scores + t, p.S, c.num_tasks, s));
    }
    return fl_cuda_task_tails<T>(g->head_tails, g->num_tails, YS, d, HS, ws, p.S, c.num_tasks, b.scores, s);
}

// Everything a pass puts on the stream after the host has filled the staging buffer.
template <typename T> flame_status enqueue(fl_cuda_engine *g, pass &p, buffers &b, size_t idx_bytes)
{
    fl_cuda_executor *x = p.x;
    FL_CUDA_TRY(cudaMemcpyAsync(x->arena, x->staging, idx_bytes, cudaMemcpyHostToDevice, x->stream));
    if (p.after_upload) FL_CUDA_TRY(cudaEventRecord(p.after_upload, x->stream));
    if (p.S == 0) { // dot head, empty histories only: every score is 0
        FL_CUDA_TRY(cudaMemsetAsync(b.scores, 0, (size_t)p.total_scores * sizeof(float), x->stream));
        return FLAME_OK;
    }
    const int32_t d = g->cfg.d_model;
    FL_TRY(embed<T>(g, p, b));
    for (int i = 0; i < g->cfg.num_blocks; i++) FL_TRY(block<T>(g, p, b, g->blocks[i], i, i == g->cfg.num_blocks - 1));
    if (g->cfg.num_blocks == 0 && p.sel_run < 0)
        FL_TRY(fl_cuda_gather<float>(b.X, d, p.dev.sel, p.S, d, b.XS, d, x->stream));
    return head<T>(g, p, b);
}

// What fixes every pointer and launch parameter of a pass: equal signatures replay one graph.
void signature(const pass &p, size_t idx_bytes, std::vector<int64_t> &sig)
{
    const fl_cuda_executor *x = p.x;
    sig.clear();
    // a padded pass: the profile's shape, whatever its requests hold
    sig.insert(sig.end(), {p.T, p.S, p.tiles_full, p.tiles_last, p.gathered, p.total_scores, (int64_t)idx_bytes,
                           p.prof ? -(int64_t)p.shape.users : (int64_t)p.n, p.shape.candidates, p.shape.history});
    sig.insert(sig.end(), p.side_total, p.side_total + p.g->cfg.num_side);
    sig.insert(sig.end(), p.single, p.single + p.g->cfg.num_side);
    sig.insert(sig.end(), {p.sel_run, p.tq_full, p.tq_last});
    // a KV cache pass: the cached prefix and the rows read and stored fix its launches and the
    // offsets of its index arrays; the block table itself is data of the upload, which the
    // graph's copy reads afresh from the staging buffer on every replay
    sig.insert(sig.end(), {(int64_t)p.kv, (int64_t)p.cached, p.KT, p.kv_read, p.kv_write});
    for (size_t r = 0; r < p.n && !p.prof; r++) sig.insert(sig.end(), {x->seqs[r].n, x->seqs[r].m, x->seqs[r].nsel});
    for (const fl_dot_group &gr : x->groups) sig.insert(sig.end(), {gr.sel0, gr.count, gr.first_id, gr.num, gr.out});
}

// Replays the graph of this pass's signature (graphs.cuh: captured on its second sight). *done
// false: the pass is to run uncaptured.
template <typename T> flame_status run_graph(fl_cuda_engine *g, pass &p, buffers &b, size_t idx_bytes, bool *done)
{
    fl_cuda_executor *x = p.x;
    signature(p, idx_bytes, x->signature);
    return fl_graph_run(&x->graphs, x->stream, x->signature, [&] { return enqueue<T>(g, p, b, idx_bytes); }, done);
}

uint64_t host_us()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t elapsed_us(cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0;
    return cudaEventElapsedTime(&ms, a, b) == cudaSuccess && ms > 0 ? (uint64_t)(ms * 1000.0f + 0.5f) : 0;
}

// flame_score_batch_topk's outputs of a pass (NULL in run: all scores come back).
struct topk_out {
    uint32_t k, task;
    int64_t *ids;
    float *scores;
};

// The device top-k's buffers, after the pass's own in the staging buffer and in the arena
// (same layout in both): segments (host to device), then positions, values and meta, which
// come back in one copy of back_bytes from `pos`.
struct topk_bufs {
    fl_topk_seg *segs;
    int32_t *pos;
    float *val;
    int32_t *meta;
    size_t back_bytes;
};
size_t carve_topk(uint8_t *base, size_t from, size_t n, uint32_t k, topk_bufs &t)
{
    carver cv{base, from};
    t.segs = cv.take<fl_topk_seg>(n);
    t.pos = cv.take<int32_t>(n * k);
    const size_t back = cv.used - n * k * sizeof(int32_t);
    t.val = cv.take<float>(n * k);
    t.meta = cv.take<int32_t>(2 * n);
    t.back_bytes = cv.used - back;
    return cv.used;
}

// Ranks the device's selection of request r (positions best first by score, then position)
// by the library's rule (ties by lower id), or selects on the host from the request's scores
// when candidates at the k-th score were left out (the id rule may want them).
flame_status topk_finish(pass &p, const buffers &b, const topk_bufs &h, const topk_out &tk, size_t r)
{
    const flame_request &q = p.reqs[r];
    const int32_t tasks = p.g->cfg.num_tasks, kept = h.meta[2 * r];
    fl_ranked *v = static_cast<fl_ranked *>(malloc((size_t)tk.k * sizeof(fl_ranked)));
    if (!v) return fl_error(FLAME_ERR_NOMEM, "out of host memory");
    size_t n = 0;
    if (h.meta[2 * r + 1]) {
        const size_t count = q.num_candidates * (size_t)tasks;
        float *sc = static_cast<float *>(malloc(count * sizeof(float)));
        cudaError_t e = sc ? cudaMemcpy(sc, b.scores + p.x->seqs[r].out, count * sizeof(float), cudaMemcpyDeviceToHost)
                           : cudaErrorMemoryAllocation;
        if (e == cudaSuccess) n = fl_topk_select(sc, q.num_candidates, tasks, tk.task, q.candidates, tk.k, v);
        free(sc);
        if (e != cudaSuccess) {
            free(v);
            return fl_error(FLAME_ERR_INTERNAL, "copying request %zu's scores: %s", r, cudaGetErrorString(e));
        }
    } else {
        for (int32_t j = 0; j < kept; j++) {
            const int32_t i = h.pos[r * tk.k + j];
            v[n++] = {h.val[r * tk.k + j], q.candidates[i], (size_t)i};
        }
        fl_ranked_sort(v, n);
    }
    fl_topk_write(v, n, tk.k, tk.ids + r * tk.k, tk.scores + r * tk.k);
    free(v);
    return FLAME_OK;
}

template <typename T> flame_status run(fl_cuda_engine *g, pass &p, float *scores, fl_cuda_times *times,
                                       const topk_out *tk = nullptr)
{
    fl_cuda_executor *x = p.x;
    const uint64_t t0 = host_us();
    plan(p);
    if ((p.prof ? p.real_scores : p.total_scores) == 0) {
        for (size_t r = 0; tk && r < p.n; r++) fl_topk_write(nullptr, 0, tk->k, tk->ids + r * tk->k, tk->scores + r * tk->k);
        return FLAME_OK;
    }
    const size_t idx_bytes = carve_indices(p, nullptr, p.host);
    buffers b{};
    const size_t arena = carve_buffers(p, sizeof(T), nullptr, idx_bytes, b);
    topk_bufs th{}, td{};
    // Score rows up to STAGED_SCORES bytes come back through the executor's pinned staging and
    // one memcpy: a device-to-host copy into the caller's pageable memory is staged by the driver
    // and costs about 10 us at any size, a few times the call's other copies at batch 1. Larger
    // rows (full sorts) go straight to the caller's memory, where that cost is amortised.
    constexpr size_t STAGED_SCORES = 256 * 1024;
    const size_t score_bytes = tk ? 0 : (size_t)(p.prof ? p.real_scores : p.total_scores) * sizeof(float);
    const bool staged_scores = !tk && score_bytes <= STAGED_SCORES;
    const size_t scores_at = (idx_bytes + 255) & ~(size_t)255;
    const size_t staging_end = tk ? carve_topk(nullptr, idx_bytes, p.n, tk->k, th)
                                  : staged_scores ? scores_at + score_bytes : idx_bytes;
    const size_t arena_end = tk ? carve_topk(nullptr, arena, p.n, tk->k, td) : arena;
    FL_TRY(grow(g, x, staging_end, arena_end));
    carve_indices(p, x->staging, p.host);
    carve_indices(p, x->arena, p.dev);
    carve_buffers(p, sizeof(T), x->arena, idx_bytes, b);
    fill(p);
    if (p.sel_run >= 0) { // the selected rows in place (see pass::sel_run)
        b.XS = b.X + p.sel_run * g->cfg.d_model;
        b.YS = static_cast<uint8_t *>(b.Y) + p.sel_run * g->cfg.d_model * sizeof(T);
    }
    if (times) times->tokens_us = host_us() - t0; // the host's planning and staging
    bool done = false;
    FL_CUDA_TRY(cudaEventRecord(x->ev[0], x->stream));
    if (g->use_graphs) FL_TRY(run_graph<T>(g, p, b, idx_bytes, &done));
    if (!done) { // uncaptured: the upload has its own event
        p.after_upload = x->ev[1];
        flame_status st = enqueue<T>(g, p, b, idx_bytes);
        p.after_upload = nullptr;
        FL_TRY(st);
    }
    if (tk) { // select on the device; only k positions and scores a request come back
        carve_topk(x->staging, idx_bytes, p.n, tk->k, th);
        carve_topk(x->arena, arena, p.n, tk->k, td);
        for (size_t r = 0; r < p.n; r++) th.segs[r] = {x->seqs[r].out, (int32_t)p.reqs[r].num_candidates, 0};
        FL_CUDA_TRY(cudaMemcpyAsync(td.segs, th.segs, p.n * sizeof(fl_topk_seg), cudaMemcpyHostToDevice, x->stream));
        FL_TRY(fl_cuda_topk(b.scores, td.segs, (int32_t)p.n, g->cfg.num_tasks, (int32_t)tk->task, (int32_t)tk->k,
                            td.pos, td.val, td.meta, x->stream));
    }
    if (p.prof && !tk) // the real users' scores, in the caller's order
        FL_TRY(fl_cuda_copy_segments(b.scores, p.dev.segs, p.shape.users, b.packed, x->stream));
    FL_CUDA_TRY(cudaEventRecord(x->ev[2], x->stream));
    float *back = staged_scores ? reinterpret_cast<float *>(x->staging + scores_at) : scores;
    if (tk)
        FL_CUDA_TRY(cudaMemcpyAsync(th.pos, td.pos, th.back_bytes, cudaMemcpyDeviceToHost, x->stream));
    else
        FL_CUDA_TRY(cudaMemcpyAsync(back, p.prof ? b.packed : b.scores, score_bytes, cudaMemcpyDeviceToHost, x->stream));
    FL_CUDA_TRY(cudaEventRecord(x->ev[3], x->stream));
    FL_CUDA_TRY(cudaStreamSynchronize(x->stream));
    if (staged_scores) memcpy(scores, back, score_bytes);
    for (size_t r = 0; tk && r < p.n; r++) FL_TRY(topk_finish(p, b, th, *tk, r));
    if (p.prof && !p.warm) {
        p.g->profile_passes.fetch_add(1, std::memory_order_relaxed);
        p.g->profile_padding.fetch_add((uint64_t)(p.T - p.real_tokens), std::memory_order_relaxed);
    }
    if (times) { // a graph replay holds the upload: it then counts in compute
        times->h2d_timed = !done;
        times->h2d_us = done ? 0 : elapsed_us(x->ev[0], x->ev[1]);
        times->compute_us = elapsed_us(done ? x->ev[0] : x->ev[1], x->ev[2]);
        times->d2h_us = elapsed_us(x->ev[2], x->ev[3]);
    }
    return FLAME_OK;
}

} // namespace

namespace {

bool kv_request(const fl_cuda_engine *g, const flame_request &q)
{
    return g->kv && q.kv_cache == 1;
}

// The KV cache's lookup for a pass of one kv_cache request, as the CPU engine's (hashes of the
// window when the caller gives no version, or when its version is no hit), then the plan's
// cached rows and whether this call stores its computed rows. A request without history or
// candidates has nothing to cache: it runs as a plain pass. FLAME_ERR_NOMEM when the prefix
// hashes find no host memory (before the lookup: nothing is pinned); no exception leaves it.
flame_status kv_begin(fl_cuda_engine *g, pass &p)
{
    const fl_model_cfg &c = g->cfg;
    const flame_request &q = p.reqs[0];
    fl_kv_plan pl;
    fl_plan_request(&c, q.history_len, q.num_candidates, 0, &pl);
    if (pl.n == 0 || q.num_candidates == 0) return FLAME_OK;
    std::vector<uint64_t> &prefix = p.x->kv_prefix;
    try {
        prefix.resize((size_t)pl.n + 1);
    } catch (const std::bad_alloc &) {
        return fl_error(FLAME_ERR_NOMEM, "out of host memory for the KV cache's %d prefix hashes", pl.n + 1);
    }
    fl_kv_key key = {q.user_id, q.history_version, pl.n, nullptr, fl_plan_extendable(&c)};
    fl_kv_bags_view views[FL_MAX_FEATURES];
    const int num_side = q.history_side ? c.num_side : 0;
    for (int slot = 0; slot < num_side; slot++) views[slot] = {q.history_side[slot].offsets, q.history_side[slot].ids};
    if (key.version == 0) {
        fl_kv_prefix_hashes(q.history, views, num_side, pl.start, pl.n, prefix.data());
        key.prefix = prefix.data();
    }
    if (fl_kv_lookup(g->kv, &key, &p.ticket) == FL_KV_NEED_HASH) { // a caller's version that is no hit
        fl_kv_prefix_hashes(q.history, views, num_side, pl.start, pl.n, prefix.data());
        key.prefix = prefix.data();
        fl_kv_lookup(g->kv, &key, &p.ticket);
    }
    fl_plan_request(&c, q.history_len, q.num_candidates, p.ticket.cached, &pl);
    p.kv = true;
    p.cached = pl.cached;
    p.store = p.ticket.writer && fl_kv_reserve(g->kv, &p.ticket);
    return FLAME_OK;
}

// After the pass's stream has drained (its final synchronization, or score_pass's on an
// error): publishes the stored rows, or gives up writing; unpins; counts the tokens.
void kv_end(fl_cuda_engine *g, pass &p, flame_status st)
{
    if (!p.kv) return;
    const flame_request &q = p.reqs[0];
    const int32_t n = p.ticket.tokens; // the window's tokens (set by every lookup)
    if (!st && p.store)
        fl_kv_publish(g->kv, &p.ticket, q.history_version, p.x->kv_prefix[(size_t)n]);
    else if (p.ticket.writer)
        fl_kv_abort(g->kv, &p.ticket);
    fl_kv_release(g->kv, &p.ticket);
    if (!st) fl_kv_count_tokens(g->kv, (uint64_t)(n - p.cached), (uint64_t)p.cached);
}

} // namespace

// Runs the requests in passes: each kv_cache request alone (it holds one entry of the KV cache
// at a time, as on the CPU, so no two calls wait on each other), the others together.
static flame_status score_pass(fl_cuda_engine *g, const flame_request *reqs, size_t n, float *scores,
                               fl_cuda_times *times, const topk_out *tk)
{
    fl_cuda_executor *x = &g->ex[fl_slot_acquire(&g->ex_pool)]; // waits its turn while all are busy
    flame_status st = FLAME_OK;
    cudaError_t e = cudaSetDevice(g->device);
    if (e != cudaSuccess) st = fl_error(FLAME_ERR_INTERNAL, "cudaSetDevice(%d): %s", g->device, cudaGetErrorString(e));
    if (times) *times = fl_cuda_times{0, 0, 0, 0, true};
    float *out = scores;
    for (size_t r0 = 0, r1; r0 < n && !st; r0 = r1) {
        r1 = r0 + 1;
        if (!kv_request(g, reqs[r0]))
            while (r1 < n && !kv_request(g, reqs[r1])) r1++;
        pass p{g, x, reqs + r0, r1 - r0};
        topk_out sub{};
        if (tk) sub = {tk->k, tk->task, tk->ids + r0 * tk->k, tk->scores + r0 * tk->k};
        fl_cuda_times ti{};
        fl_cuda_times *tp = times ? &ti : nullptr;
        const topk_out *tkp = tk ? &sub : nullptr;
        // the pass grows std::vectors (plans, signatures, graphs): an exception never crosses
        // into C, and a lookup's pin is always released by kv_end below
        try {
            if (kv_request(g, reqs[r0]))
                st = kv_begin(g, p);
            else if (g->cfg.head == FLAME_HEAD_SUMI) // the smallest batch profile holding the pass, if any
                p.prof = fl_batch_profile_route(g->profiles.load(std::memory_order_acquire), g->cfg.max_len, p.reqs,
                                                p.n, &p.shape);
            if (!st) st = FL_DTYPE_SWITCH(g->dtype, T, [&] { return run<T>(g, p, out, tp, tkp); });
        } catch (const std::bad_alloc &) {
            st = fl_error(FLAME_ERR_NOMEM, "out of host memory planning a pass of %zu requests", r1 - r0);
        } catch (const std::exception &ex) {
            st = fl_error(FLAME_ERR_INTERNAL, "planning a pass of %zu requests: %s", r1 - r0, ex.what());
        }
        if (st) cudaStreamSynchronize(x->stream); // nothing of this call may still run after we return
        kv_end(g, p, st);
        if (times) {
            times->tokens_us += ti.tokens_us, times->h2d_us += ti.h2d_us, times->compute_us += ti.compute_us;
            times->d2h_us += ti.d2h_us;
            times->h2d_timed = times->h2d_timed && (ti.h2d_timed || p.total_scores == 0);
        }
        for (size_t r = r0; out && r < r1; r++) out += reqs[r].num_candidates * (size_t)g->cfg.num_tasks;
    }
    fl_slot_release(&g->ex_pool, (int)(x - g->ex));
    return st;
}

// One synthetic pass of a profile's full shape on executor x: every user a window of the
// profile's history (capped at max_len) and its candidates, item 0 everywhere, one id 0 in
// every side bag.
template <typename T> static flame_status warm_pass(fl_cuda_engine *g, fl_cuda_executor *x, const fl_batch_profile &pr)
{
    const fl_model_cfg &c = g->cfg;
    const size_t U = (size_t)pr.users, C = (size_t)pr.candidates;
    const size_t L = pr.history && pr.history < c.max_len ? (size_t)pr.history : (size_t)c.max_len;
    std::vector<int64_t> zeros(L + C + 1, 0), offs(L + C + 1);
    for (size_t i = 0; i < offs.size(); i++) offs[i] = (int64_t)i;
    std::vector<flame_bags> hb(c.num_side > 0 ? c.num_side : 1), cb(hb.size());
    for (int slot = 0; slot < c.num_side; slot++) {
        hb[slot] = {offs.data(), zeros.data(), L};
        cb[slot] = {offs.data(), zeros.data(), C};
    }
    flame_request q{};
    q.struct_size = sizeof q;
    q.history = zeros.data();
    q.history_len = L;
    q.candidates = zeros.data();
    q.num_candidates = C;
    q.num_side_features = (size_t)c.num_side;
    q.history_side = c.num_side ? hb.data() : nullptr;
    q.candidate_side = c.num_side ? cb.data() : nullptr;
    std::vector<flame_request> reqs(U, q);
    std::vector<float> scores(U * C * (size_t)c.num_tasks);
    pass p{g, x, reqs.data(), U};
    p.prof = fl_batch_profile_route(g->profiles.load(std::memory_order_acquire), c.max_len, p.reqs, p.n, &p.shape);
    p.warm = true;
    return run<T>(g, p, scores.data(), nullptr);
}

// Runs each batch profile's full shape twice on every executor, largest first, so that the
// buffers are sized, the kernels loaded, the GEMM plans chosen and the graphs captured before a
// request arrives. Waits for every executor (the engine's callers wait meanwhile).
extern "C" flame_status fl_cuda_warm_profiles(fl_cuda_engine *g)
{
    const fl_batch_profiles *ps = g->profiles.load(std::memory_order_acquire);
    if (!ps || g->cfg.head != FLAME_HEAD_SUMI) return FLAME_OK;
    FL_CUDA_TRY(cudaSetDevice(g->device));
    std::vector<fl_batch_profile> order(ps->p, ps->p + ps->n);
    const int64_t max_len = g->cfg.max_len;
    auto tokens = [&](const fl_batch_profile &p) {
        return (int64_t)p.users * ((p.history && p.history < max_len ? p.history : max_len) + p.candidates);
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](const fl_batch_profile &a, const fl_batch_profile &b) { return tokens(a) > tokens(b); });
    std::vector<int> held;
    for (int i = 0; i < g->num_ex; i++) held.push_back(fl_slot_acquire(&g->ex_pool));
    flame_status st = FLAME_OK;
    try {
        for (int slot : held)
            for (const fl_batch_profile &pr : order)
                for (int k = 0; k < 2 && !st; k++) {
                    fl_cuda_executor *x = &g->ex[slot];
                    st = FL_DTYPE_SWITCH(g->dtype, T, [&] { return warm_pass<T>(g, x, pr); });
                    if (st) cudaStreamSynchronize(x->stream);
                }
    } catch (const std::bad_alloc &) {
        st = fl_error(FLAME_ERR_NOMEM, "out of host memory warming the batch profiles");
    }
    for (int slot : held) fl_slot_release(&g->ex_pool, slot);
    return st;
}

extern "C" flame_status fl_cuda_score(fl_cuda_engine *g, const flame_request *reqs, size_t n, float *scores,
                                      fl_cuda_times *times)
{
    return score_pass(g, reqs, n, scores, times, nullptr);
}

extern "C" flame_status fl_cuda_score_topk(fl_cuda_engine *g, const flame_request *reqs, size_t n, uint32_t k,
                                           uint32_t task, int64_t *ids, float *scores, fl_cuda_times *times)
{
    const topk_out tk{k, task, ids, scores};
    return score_pass(g, reqs, n, nullptr, times, &tk);
}
