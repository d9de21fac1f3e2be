/* The host-side plan of a request scored against one history: its window, the rows it reads
 * from the KV cache and the rows it computes, the positions of those rows, and the candidate
 * chunks. One module that every backend executes (the CPU engine's forward_kv.c; the GPU
 * engine takes its positions from here too), with one function per position rule. Never
 * installed. */
#ifndef FLAME_ENGINE_PLAN_H
#define FLAME_ENGINE_PLAN_H

#include "model/model_cfg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The position-embedding row of history item i (0 = oldest) of a window of n items, or -1 for
 * none; one function per rule (docs/model-format.md, docs/kv-cache.md). */
int64_t fl_plan_pos_none(const fl_model_cfg *c, int64_t i, int64_t n);
int64_t fl_plan_pos_left_padded_slot(const fl_model_cfg *c, int64_t i, int64_t n);
int64_t fl_plan_pos_from_recent(const fl_model_cfg *c, int64_t i, int64_t n);
int64_t fl_plan_pos_from_oldest(const fl_model_cfg *c, int64_t i, int64_t n);
/* The model's rule. */
int64_t fl_plan_history_position(const fl_model_cfg *c, int64_t i, int64_t n);

/* Tokens of a cached window of `cached` tokens that stay valid in a window of n tokens whose
 * first `cached` tokens are the same items: a token's K and V depend on the tokens before it
 * and on its own position row, so they stay valid exactly when its row does. One function per
 * rule. */
int32_t fl_plan_reuse_none(int32_t cached, int32_t n);          /* no rows: all of them */
int32_t fl_plan_reuse_from_oldest(int32_t cached, int32_t n);   /* rows count from the oldest: all */
int32_t fl_plan_reuse_left_padded_slot(int32_t cached, int32_t n); /* rows move with n: only when n is the same */
int32_t fl_plan_reuse_from_recent(int32_t cached, int32_t n);   /* likewise */
int32_t fl_plan_reuse(const fl_model_cfg *c, int32_t cached, int32_t n);
/* True when a longer window can reuse a shorter cached one (the rule keeps older rows). */
bool fl_plan_extendable(const fl_model_cfg *c);

typedef struct fl_kv_plan {
    int64_t start;   /* first history item of the window (older ones fall out of it) */
    int32_t n;       /* history tokens of the window */
    int32_t cached;  /* rows 0..cached-1 read from the KV cache */
    int32_t q0;      /* first computed row the last block runs queries, attention and FFN for:
                        n under the sumi head (the last block's history rows give only K and V),
                        n - 1 under the dot head (its head reads the last row) */
    int32_t m;       /* candidate tokens: num_candidates (sumi head), else 0 */
    int32_t chunk;   /* candidate tokens per chunk (> 0 when m > 0) */
} fl_kv_plan;

/* The window of a request of history_len items (the most recent max_len). */
void fl_plan_window(const fl_model_cfg *c, size_t history_len, int64_t *start, int32_t *n);
/* Candidate tokens one chunk scores against the history: bounds the scratch to
 * (n + chunk) rows of K and V and chunk rows of every other buffer, and keeps each GEMM wide
 * enough to run at full speed; cost O(m * n) whatever m. */
int32_t fl_plan_chunk(const fl_model_cfg *c, int32_t n, int32_t m);
/* The whole plan, given the rows the cache holds for this window (0 on a miss or without a
 * cache): under the dot head the last row is always computed (its output is the user state). */
void fl_plan_request(const fl_model_cfg *c, size_t history_len, size_t num_candidates, int32_t cached,
                     fl_kv_plan *p);

/* The rows of a request's token sequence (n history tokens, then its candidate tokens under
 * the sumi head) that the head reads: under the sumi head every candidate (count
 * num_candidates, position n + i), under the dot head the last history row (count 1, position
 * n - 1), and none without a history or without candidates (the dot head then scores 0). */
int64_t fl_plan_selected_count(const fl_model_cfg *c, int64_t n, size_t num_candidates);
int64_t fl_plan_selected_position(const fl_model_cfg *c, int64_t n, int64_t i);

/* Dot head: the first id of q's candidates when they are one run of consecutive ids, scored
 * as one GEMM against that slice of the item table (and shared by consecutive users of the same
 * range), else -1: its rows are gathered. A request that scores the same array as the one
 * before it (`prev`, whose answer was `prev_start`; NULL for none) takes that answer without
 * reading every id again: a full sort hands every user the whole catalogue. -1 without
 * candidates. */
int64_t fl_plan_dot_contiguous_start(const flame_request *q, const flame_request *prev, int64_t prev_start);
/* Dot head: whether a request whose candidates start at `start` (fl_plan_dot_contiguous_start)
 * joins the group of users before it, one GEMM against the table slice [group_start,
 * group_start + group_num): the same contiguous range, and both backends batch consecutive
 * requests only. */
bool fl_plan_dot_joins_group(int64_t group_start, size_t group_num, int64_t start, size_t num_candidates);

#ifdef __cplusplus
}
#endif

#endif
