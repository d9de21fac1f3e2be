/* The user-history KV cache's bookkeeping (never installed): which users' history K/V an
 * engine holds, in which fixed-size blocks of tokens, who reads them and who writes them.
 *
 * The blocks themselves live elsewhere (host memory for the CPU engine, device memory for the
 * GPU engine): this module hands out block indices 0..num_blocks-1 and never touches their
 * bytes; kvlayout.h says where a token's row of a layer lies inside a block.
 *
 * One entry per user: the K and V of the first `tokens` tokens of a history window, keyed by
 * the user id and a version (the caller's, or 0 with the window's hash). All state changes
 * happen under one mutex; the K/V bytes are written outside it by the one writer of an entry
 * and read outside it by the calls that pinned it:
 *   - single-flight per user: a lookup that finds its user's entry being written waits until
 *     the writer publishes or aborts, then decides again (a writer never waits while it
 *     writes: each call holds at most one ticket at a time, so no cycle of waits exists);
 *   - an entry being written is invisible: its tokens, hash and version change at publish
 *     (its version also at a hit by hash under a caller's new version: metadata, under mu);
 *   - eviction (least recently used users first) takes only entries nobody pinned and nobody
 *     writes; an entry replaced while pinned is unlinked and freed at its last release.
 * An extension writes rows past the entry's published tokens, in blocks (or rows of its last
 * block) that no reader reads: readers read rows below the tokens they pinned. */
#ifndef FLAME_KVCACHE_KVCACHE_H
#define FLAME_KVCACHE_KVCACHE_H

#include <pthread.h>

#include "core/common.h"

typedef struct fl_kv_params {
    uint64_t budget_bytes; /* most bytes of blocks (num_blocks = budget / block_bytes) */
    int32_t block_tokens;  /* tokens a block holds */
    uint64_t token_bytes;  /* bytes one token takes over all layers, K and V */
    int32_t max_tokens;    /* longest history an entry holds (the model's window) */
} fl_kv_params;

typedef struct fl_kv_stats {
    uint64_t hits, misses, extensions, evictions;
    uint64_t waits;          /* lookups that waited for another call writing the same user */
    uint64_t store_skipped;  /* writers that found no room (scored without storing) */
    uint64_t hashed;         /* lookups given the window's prefix hashes (the caller hashed it) */
    uint64_t blocks_in_use, peak_blocks_in_use, entries;
    uint64_t tokens_computed; /* history tokens computed by calls that used the cache */
    uint64_t tokens_saved;    /* history tokens read from the cache instead */
} fl_kv_stats;

typedef struct fl_kv_entry fl_kv_entry;
typedef struct fl_kv_cache fl_kv_cache;

typedef enum fl_kv_kind {
    FL_KV_HIT = 0,     /* every token of the window is cached: read-only */
    FL_KV_EXTEND = 1,  /* a cached prefix; the call computes the rest and writes it */
    FL_KV_MISS = 2,    /* nothing usable; the call computes the window and writes it */
    FL_KV_NEED_HASH = 3 /* not a hit by version alone: call again with the prefix hashes */
} fl_kv_kind;

/* What a lookup asks for. */
typedef struct fl_kv_key {
    int64_t user;
    uint64_t version;        /* the caller's (non-zero), or 0: the window's hash decides */
    int32_t tokens;          /* tokens of the window (>= 1) */
    const uint64_t *prefix;  /* [tokens + 1] hash of the first k tokens, or NULL (then a lookup
                                that is no hit by version answers FL_KV_NEED_HASH) */
    /* tokens of a cached window of `c` tokens that stay valid in a window of `tokens` tokens
     * starting with the same c tokens (engine/plan.h's rule of the model's positions): c when
     * positions count from the oldest item, else c only if c == tokens, else 0 */
    bool extendable;
} fl_kv_key;

/* A call's hold on one entry, from lookup to release. */
typedef struct fl_kv_ticket {
    fl_kv_entry *entry;     /* NULL: nothing pinned (FL_KV_NEED_HASH) */
    fl_kv_kind kind;
    int32_t cached;         /* rows 0..cached-1 are readable */
    int32_t tokens;         /* the window's tokens */
    bool writer;            /* this call writes rows cached..tokens-1, then publishes or aborts */
    bool reserved;          /* fl_kv_reserve succeeded: blocks for every row < tokens exist */
    const int32_t *blocks;  /* the entry's block table: block of row r is blocks[r / block_tokens] */
} fl_kv_ticket;

/* FLAME_ERR_INVALID_ARG (a zero or inconsistent parameter: the message names it), FLAME_ERR_NOMEM. */
flame_status fl_kv_cache_create(const fl_kv_params *p, fl_kv_cache **out);
void fl_kv_cache_destroy(fl_kv_cache *c);

int32_t fl_kv_block_tokens(const fl_kv_cache *c);
int32_t fl_kv_num_blocks(const fl_kv_cache *c);
uint64_t fl_kv_block_bytes(const fl_kv_cache *c);

/* Decides hit, extension or miss for key (waiting while another call writes the user) and
 * pins what the call reads; a writer's ticket makes the user's entry invisible to others until
 * publish or abort. A hit by hash with a caller's version (non-zero) records that version on
 * the entry (it then keeps the last one given). Never fails: FL_KV_NEED_HASH pins nothing. */
fl_kv_kind fl_kv_lookup(fl_kv_cache *c, const fl_kv_key *key, fl_kv_ticket *t);
/* A writer's blocks for rows up to t->tokens, evicting least recently used users that nobody
 * reads or writes. false: no room (the budget, or an entry longer than it); the call then
 * scores without storing and aborts. */
bool fl_kv_reserve(fl_kv_cache *c, fl_kv_ticket *t);
/* Makes rows 0..t->tokens-1 visible under (version, hash = prefix hash of the window). */
void fl_kv_publish(fl_kv_cache *c, fl_kv_ticket *t, uint64_t version, uint64_t hash);
/* Gives up writing: an extended entry keeps its old rows, a new one is dropped. */
void fl_kv_abort(fl_kv_cache *c, fl_kv_ticket *t);
/* Unpins (after publish or abort for a writer); the ticket is then empty. */
void fl_kv_release(fl_kv_cache *c, fl_kv_ticket *t);
/* Counts history tokens computed and saved by a call. */
void fl_kv_count_tokens(fl_kv_cache *c, uint64_t computed, uint64_t saved);
void fl_kv_get_stats(fl_kv_cache *c, fl_kv_stats *s);

/* The window's prefix hashes: prefix[0] = a seed drawn once per process from the system's random
 * source (secret: windows that collide cannot be built without it), prefix[k + 1] =
 * mix(prefix[k], token k's item id and the ids of each of its side bags, with the bag lengths).
 * splitmix64's finalizer (Steele, Lea and Flood, OOPSLA 2014) as the mixer: 64 bits, not
 * cryptographic; equal windows hash equally within one process only. */
typedef struct fl_kv_bags_view {
    const int64_t *offsets, *ids; /* a slot's CSR over the request's whole history */
} fl_kv_bags_view;
void fl_kv_prefix_hashes(const int64_t *items, const fl_kv_bags_view *side, int num_side, int64_t first,
                         int32_t tokens, uint64_t *prefix);

#endif
