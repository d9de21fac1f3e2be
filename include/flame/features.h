/*
 * libflame: item features: feature batches, feature sources (callback, Redis, file) and the
 * item cache.
 *
 * Part of the public API; included by flame/flame.h, and usable on its own. The conventions at
 * the top of flame/flame.h (statuses, ownership, units, the struct_size rule) hold here too.
 *
 * A feature record is what the model needs per item beyond its id: for each side-feature
 * slot of the model (flame_model_info.num_side_features, in order) a bag of ids, plus
 * optional dense floats (carried, not used by version-1 models). Records come from a
 * feature source (callback, Redis or file) and are cached by an item cache, which an engine
 * can use to fill the side features of requests that give only item ids.
 * Record encoding, Redis keys, the feature file format: docs/features.md.
 */
#ifndef FLAME_FEATURES_H
#define FLAME_FEATURES_H

#include "flame/flame.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- feature batches */

/* n records addressed by index 0..n-1, each found (bags + dense) or missing (the source does
 * not know the id). Sources write into one; callers read from one. */
typedef struct flame_feature_batch flame_feature_batch;

/* Creates an empty batch for records of num_slots slots (0..64). Not thread-safe per handle,
 * except flame_feature_batch_complete. Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL out,
 * num_slots out of range); FLAME_ERR_NOMEM. On failure *out is NULL. */
FLAME_API flame_status flame_feature_batch_create(int32_t num_slots, flame_feature_batch **out);
FLAME_API void flame_feature_batch_destroy(flame_feature_batch *batch);

/* Number of records the batch holds (set by the fetch that filled it). NULL gives 0. */
FLAME_API size_t flame_feature_batch_size(const flame_feature_batch *batch);

/* Writes record `index` (< size): its bags in CSR form over the slots (slot s's ids are
 * ids[slot_offsets[s] .. slot_offsets[s+1]-1]; slot_offsets has num_slots + 1 entries,
 * slot_offsets[0] == 0, non-decreasing, slot_offsets[num_slots] == num_ids, the length of
 * ids; slot_offsets may be NULL when num_slots is 0, ids when num_ids is 0; a slot holds at
 * most 2^32 - 1 ids) and num_dense floats (dense may be NULL when 0; at most 65536). The data
 * is copied. Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL batch, index out of range,
 * offsets that break a rule above or contradict num_ids: the message names the record, the
 * slot and both numbers; NULL arrays with content; a record above 4 GiB); FLAME_ERR_NOMEM.
 * On failure the record is left as it was. */
FLAME_API flame_status flame_feature_batch_set(flame_feature_batch *batch, size_t index, const int64_t *slot_offsets,
                                               const int64_t *ids, size_t num_ids, const float *dense,
                                               size_t num_dense);
/* Marks record `index` as missing: the source does not know the id. FLAME_ERR_INVALID_ARG
 * for an index out of range. */
FLAME_API flame_status flame_feature_batch_set_missing(flame_feature_batch *batch, size_t index);

/* Reads record `index`: *found = 1 and the bag of `slot` as ids[0..*count-1] (pointer into
 * the batch, valid until the batch is next written or destroyed), or *found = 0 for a
 * missing record (then *ids = NULL, *count = 0). Returns FLAME_OK; FLAME_ERR_INVALID_ARG
 * (NULL argument, index or slot out of range, record never written). */
FLAME_API flame_status flame_feature_batch_get_slot(const flame_feature_batch *batch, size_t index, int32_t slot,
                                                    int32_t *found, const int64_t **ids, size_t *count);
/* Reads the dense floats of record `index` (count 0 when none or missing). As get_slot. */
FLAME_API flame_status flame_feature_batch_get_dense(const flame_feature_batch *batch, size_t index,
                                                     const float **dense, size_t *count);

/* Async completion: a flame_feature_fetch_async_fn calls this exactly once, from any thread,
 * after writing every record (status FLAME_OK) or with the failure status. Thread-safe. */
FLAME_API void flame_feature_batch_complete(flame_feature_batch *batch, flame_status status);

/* ---------------------------------------------------------------- feature sources */

typedef struct flame_feature_source flame_feature_source;

/* Host callback, batched: fetch the records of ids[0..n-1] into `out` (size n, already set):
 * for each index call flame_feature_batch_set or flame_feature_batch_set_missing, then return
 * FLAME_OK (every index must have been written), or a failure status (the whole fetch
 * fails; FLAME_ERR_UNAVAILABLE is the usual one). Called from scoring threads and the cache's
 * refresh thread, possibly concurrently: it must be thread-safe. It must not call into the
 * cache or engine that uses it. */
typedef flame_status (*flame_feature_fetch_fn)(void *user, const int64_t *ids, size_t n, flame_feature_batch *out);

/* Host callback, asynchronous form: starts the fetch and returns at once; the records are
 * written later, from any thread, and then flame_feature_batch_complete(out, status) is
 * called exactly once. ids stay valid until then. The calling libflame thread waits for the
 * completion (its own work is batched, so one wait covers all the misses of a call). */
typedef void (*flame_feature_fetch_async_fn)(void *user, const int64_t *ids, size_t n, flame_feature_batch *out);

/* Creates a source backed by a callback (exactly one of fetch / fetch_async non-NULL) whose
 * records have num_slots slots (0..64). `user` is passed back unchanged. Thread-safety of a
 * source: flame_feature_source_fetch may be called concurrently.
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG; FLAME_ERR_NOMEM. On failure *out is NULL. */
FLAME_API flame_status flame_feature_source_create_callback(int32_t num_slots, flame_feature_fetch_fn fetch,
                                                            flame_feature_fetch_async_fn fetch_async, void *user,
                                                            flame_feature_source **out);

/* Creates a source holding a feature file in memory (text format of docs/features.md; ids
 * not in the file are missing). For tests and the embedded default.
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL); FLAME_ERR_IO (cannot read);
 * FLAME_ERR_FORMAT (a malformed line: the message names the line number); FLAME_ERR_NOMEM. */
FLAME_API flame_status flame_feature_source_create_file(const char *path, flame_feature_source **out);

typedef struct flame_redis_options {
    size_t struct_size;          /* sizeof(flame_redis_options) */
    const char *host;            /* NULL = "127.0.0.1" (copied) */
    int32_t port;                /* 0 = 6379 */
    const char *key_prefix;      /* NULL = "flame:item:"; key = prefix + decimal id (copied) */
    int32_t num_slots;           /* slots per record, 0..64 */
    int32_t connect_timeout_ms;  /* 0 = 200 */
    int32_t read_timeout_ms;     /* per fetch: all its replies are in within this of its sending (however
                                    slowly a server trickles bytes), and it waits no longer for the
                                    connection; 0 = 200 */
    int32_t keys_per_command;    /* keys per MGET; the MGETs of one fetch are pipelined. 0 = 256 */
    int32_t backoff_min_ms;      /* first delay before reconnecting after a failure; 0 = 10 */
    int32_t backoff_max_ms;      /* the delay doubles per failure up to this; 0 = 2000 */
} flame_redis_options;

/* Creates a source reading records from a Redis server through hiredis (encoding:
 * docs/features.md). The connection is made at creation (a failure is reported then) and
 * remade on demand: a fetch whose connection broke since the last one is retried once on a
 * fresh connection, within the same read deadline; after a failed connect, fetches fail at
 * once with FLAME_ERR_UNAVAILABLE until the backoff delay has passed. A fetch holds the
 * source's connection for its duration (concurrent fetches are serialized): a fetch waits at
 * most read_timeout_ms for it, then connects if needed (connect_timeout_ms) and reads its
 * replies within read_timeout_ms, so it returns within about connect_timeout_ms + 2 x
 * read_timeout_ms whatever the server does (FLAME_ERR_UNAVAILABLE on a timeout, naming it;
 * an MGET reply of the wrong length or type too, naming both lengths or the type). A value
 * that does not decode makes the
 * fetch fail with FLAME_ERR_FORMAT naming the key.
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL, struct_size outside 8..4096, values out of
 * range); FLAME_ERR_UNAVAILABLE (cannot connect: the message names host, port and the
 * reason); FLAME_ERR_NOMEM. On failure *out is NULL. */
FLAME_API flame_status flame_feature_source_create_redis(const flame_redis_options *options,
                                                         flame_feature_source **out);

/* Writes every record of a feature file (docs/features.md) into Redis under the options'
 * prefix, pipelined; *written (may be NULL) gets the number of records. Existing keys are
 * overwritten. Returns FLAME_OK; the statuses of flame_feature_source_create_file and
 * flame_feature_source_create_redis; FLAME_ERR_UNAVAILABLE for a failed write. */
FLAME_API flame_status flame_redis_load_features(const flame_redis_options *options, const char *path,
                                                 uint64_t *written);

/* Records the source's slot count. NULL gives -1. */
FLAME_API int32_t flame_feature_source_num_slots(const flame_feature_source *source);

/* Fetches the records of ids[0..n-1] into `out` (reset to size n; out's num_slots must
 * equal the source's). Thread-safe. Returns FLAME_OK; FLAME_ERR_INVALID_ARG; the source's
 * failure (FLAME_ERR_UNAVAILABLE, FLAME_ERR_FORMAT); FLAME_ERR_NOMEM. */
FLAME_API flame_status flame_feature_source_fetch(flame_feature_source *source, const int64_t *ids, size_t n,
                                                  flame_feature_batch *out);

/* Releases the caller's reference; caches using the source hold their own. NULL is a no-op. */
FLAME_API void flame_feature_source_destroy(flame_feature_source *source);

/* ---------------------------------------------------------------- item cache */

/* An in-process cache of item feature records in front of a feature source.
 * - Sharded hash table. A hit is O(1) and takes no lock at all: readers walk the hash chains
 *   while writers (misses, puts, invalidations, evictions, refreshes), one lock per shard,
 *   replace entries and free the old ones only once no reader can hold them (epoch-based
 *   reclamation, docs/memory.md). The ids of one call are looked up with their cache misses
 *   overlapped, so large calls are much cheaper per id than one-id calls.
 * - Bounded by entries and bytes (FLAME_OPT_ITEM_CACHE_MAX_*); eviction by S3-FIFO (a small
 *   probationary FIFO, a main FIFO with reinsertion of entries hit since their last pass,
 *   and a ghost FIFO of recently evicted keys), which keeps one-hit wonders out of the main
 *   queue (docs/benchmarks.md compares it with LRU).
 * - TTL per entry from its popularity: ttl_fn(id, hits during the previous lifetime); the
 *   default grows linearly from COLD_TTL (0 hits) to HOT_TTL (HOT_HITS hits or more).
 * - Refresh-ahead: a hit past REFRESH_PERCENT of its TTL on an entry hit REFRESH_MIN_HITS
 *   times schedules a background refresh; the old value is served meanwhile. A failed
 *   refresh keeps the value (served stale after expiry, counted) and is retried with
 *   exponential backoff until it succeeds or the entry is evicted or overwritten.
 * - Single-flight: concurrent misses of one id cause one fetch; all the misses of one call
 *   go to the source in one batched fetch.
 * - Negative caching: an id the source reports missing is cached as missing for
 *   NEGATIVE_TTL; readers get "missing" (the engine then uses empty bags, which pool to zero
 *   vectors: docs/model-format.md).
 * - No lost updates: a fetch or refresh that started before a flame_item_cache_put or
 *   flame_item_cache_invalidate of the same id never installs its (older) result.
 * Thread-safety: every function may be called concurrently, except create/destroy and the
 *   set_* hooks, which must be called before the cache is shared.
 * fork(): a cache belongs to the process that created it; a child of fork() must neither use
 *   nor destroy one it inherited (its refresh thread exists only in the parent: destroying it
 *   would wait for that thread forever). Pre-fork servers create their caches in the workers. */
typedef struct flame_item_cache flame_item_cache;

/* Creates a cache in front of `source` (the cache holds a reference) with the item cache
 * options of `config` (NULL = defaults). Starts the refresh thread unless
 * FLAME_OPT_ITEM_CACHE_REFRESH_THREAD is 0.
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL source/out, HOT_TTL < COLD_TTL,
 * RETRY_MAX < RETRY_MIN); FLAME_ERR_NOMEM; FLAME_ERR_INTERNAL (thread creation failed).
 * On failure *out is NULL. */
FLAME_API flame_status flame_item_cache_create(flame_feature_source *source, const flame_config *config,
                                               flame_item_cache **out);

/* Releases the caller's reference; engines using the cache hold their own. The refresh
 * thread stops (after finishing the fetch it is in) when the last reference goes. No call
 * on this handle may run concurrently by the caller. The last reference may go on the refresh
 * thread itself, from the source's callback (a host language's garbage collector may drop it
 * there): that thread then frees the cache when its refresh is done. NULL is a no-op. */
FLAME_API void flame_item_cache_destroy(flame_item_cache *cache);

/* Clock used for TTLs and retry times, in microseconds on any monotonic base. For tests;
 * default CLOCK_MONOTONIC. fn NULL restores the default. Call before the cache is shared
 * (not thread-safe). Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL cache). */
typedef uint64_t (*flame_clock_fn)(void *user);
FLAME_API flame_status flame_item_cache_set_clock(flame_item_cache *cache, flame_clock_fn fn, void *user);

/* TTL policy: returns the TTL in us (0 is raised to 1) of a fresh value of `id` given the
 * hits the id's entry had during its previous lifetime (0 for a first insert). Any value up
 * to UINT64_MAX is valid: the expiry (now + TTL) and the refresh-ahead point (now +
 * REFRESH_PERCENT of the TTL) saturate at UINT64_MAX, so UINT64_MAX, or any TTL reaching past
 * the clock's range, means "never expires" (refresh-ahead still applies). Hits are
 * counted one by one up to 1024, then sampled (an unbiased estimate, within a few percent) so
 * that hot entries are not written on every hit; two threads hitting one entry at the same
 * instant may count once. Called with a shard lock held: it must be fast and must not call
 * into the cache. fn NULL restores the default. Call before the cache is shared (not
 * thread-safe). Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL cache). */
typedef uint64_t (*flame_ttl_fn)(int64_t id, uint64_t previous_hits, void *user);
FLAME_API flame_status flame_item_cache_set_ttl_fn(flame_item_cache *cache, flame_ttl_fn fn, void *user);

/* Gets the records of ids[0..n-1] into `out` (reset to size n; its num_slots must equal the
 * source's): hits are copied, the misses of the call fetched in one batch (joining fetches
 * of other threads already in flight), cached and copied. Missing ids come back missing.
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG; the source's failure status when the fetch of a
 * miss failed (nothing is cached for those ids; other records are still written);
 * FLAME_ERR_NOMEM. */
FLAME_API flame_status flame_item_cache_get(flame_item_cache *cache, const int64_t *ids, size_t n,
                                            flame_feature_batch *out);

/* Writes a record for `id`, replacing any value and cancelling the installation of fetches
 * already in flight for it: its bags as flame_feature_batch_set takes them (slot_offsets
 * [num_slots + 1] with slot_offsets[num_slots] == num_ids, ids [num_ids]; NULL slot_offsets
 * with num_slots 0) and dense [num_dense]. Its TTL comes from the TTL function.
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL cache, and the checks of
 * flame_feature_batch_set: the message names the slot and both numbers); FLAME_ERR_NOMEM.
 * On failure the cache is unchanged. */
FLAME_API flame_status flame_item_cache_put(flame_item_cache *cache, int64_t id, const int64_t *slot_offsets,
                                            const int64_t *ids, size_t num_ids, const float *dense,
                                            size_t num_dense);

/* Drops `id` (the next get fetches it); fetches in flight for it are not installed.
 * Thread-safe. Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL cache). */
FLAME_API flame_status flame_item_cache_invalidate(flame_item_cache *cache, int64_t id);

/* Runs the refreshes that are due now in the calling thread (for caches made with
 * REFRESH_THREAD 0, and tests); *refreshed (may be NULL) gets the number of ids fetched.
 * Returns FLAME_OK even when refreshes failed (they are counted and rescheduled). */
FLAME_API flame_status flame_item_cache_run_refresh(flame_item_cache *cache, uint64_t *refreshed);

typedef struct flame_item_cache_stats {
    size_t struct_size;         /* sizeof(flame_item_cache_stats) */
    uint64_t hits;              /* fresh values (and fresh negative entries) served */
    uint64_t misses;            /* ids not served from the cache (fetched or joined a fetch) */
    uint64_t stale_serves;      /* expired values served while their refresh is pending */
    uint64_t refreshes;         /* refreshes that succeeded */
    uint64_t refresh_failures;  /* refreshes that failed (each retried later) */
    uint64_t evictions;         /* entries evicted for room (not expiries) */
    uint64_t fetches;           /* batched fetches sent to the source (misses + refreshes) */
    uint64_t entries;           /* entries held now */
    uint64_t bytes;             /* bytes held now (records + bookkeeping) */
} flame_item_cache_stats;

/* Fills *stats. Thread-safe (counters read one by one, not as one snapshot).
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL, struct_size outside 8..4096). */
FLAME_API flame_status flame_item_cache_get_stats(flame_item_cache *cache, flame_item_cache_stats *stats);

#ifdef __cplusplus
}
#endif
#endif /* FLAME_FEATURES_H */
