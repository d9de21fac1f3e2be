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

/*
 * flame_feature_batch_create: an empty batch for records of num_slots slots.
 *
 * Parameters:
 *   num_slots  slots per record, 0..64.
 *   out        receives the batch; the caller's, freed with flame_feature_batch_destroy.
 * Thread-safety: thread-safe; the batch made is not (one thread writes or reads it at a time),
 *   except flame_feature_batch_complete.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL out, num_slots out of range: the message
 *   names it); FLAME_ERR_NOMEM. On failure *out is NULL.
 */
FLAME_API flame_status flame_feature_batch_create(int32_t num_slots, flame_feature_batch **out);

/*
 * flame_feature_batch_destroy: frees a batch and the records it holds.
 *
 * Parameters:
 *   batch    the caller's batch; NULL is a no-op. Pointers from get_slot/get_dense die with it.
 * Thread-safety: not concurrently with other calls on the same batch.
 * Returns: nothing.
 */
FLAME_API void flame_feature_batch_destroy(flame_feature_batch *batch);

/*
 * flame_feature_batch_size: the number of records the batch holds.
 *
 * Parameters:
 *   batch    the batch (its size is set by the fetch or get that filled it); NULL gives 0.
 * Thread-safety: not concurrently with a write of the same batch.
 * Returns: the record count, indices 0..count-1.
 */
FLAME_API size_t flame_feature_batch_size(const flame_feature_batch *batch);

/*
 * flame_feature_batch_set: writes record `index` (found).
 *
 * Parameters:
 *   batch         the batch.
 *   index         the record, < flame_feature_batch_size.
 *   slot_offsets  [num_slots + 1] int64 CSR offsets over the slots: slot s's ids are
 *                 ids[slot_offsets[s] .. slot_offsets[s+1]-1]; slot_offsets[0] == 0,
 *                 non-decreasing, slot_offsets[num_slots] == num_ids; a slot holds at most
 *                 2^32 - 1 ids. May be NULL when num_slots is 0. Copied.
 *   ids           [num_ids] int64 ids, each >= 0 (ids are table rows, as the engine and the
 *                 feature file take them); may be NULL when num_ids is 0. Copied. May be a bag
 *                 of this batch read back with flame_feature_batch_get_slot (a callback copying
 *                 a repeated id's record): the copy is made from where that bag is after the
 *                 batch has grown.
 *   num_ids       length of ids.
 *   dense         [num_dense] float32 values, each finite (not NaN, not infinite); may be NULL
 *                 when num_dense is 0. Copied. May be values of this batch read back with
 *                 flame_feature_batch_get_dense, as ids.
 *   num_dense     0..65536.
 * Thread-safety: not concurrently with other calls on the same batch.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL batch, index out of range, offsets that break
 *   a rule above or contradict num_ids: the message names the record, the slot and both
 *   numbers; NULL arrays with content; num_dense above 65536; a record above 4 GiB; a
 *   negative id or a dense value that is NaN or infinite: the message names the record, the
 *   slot or index and the value); FLAME_ERR_NOMEM. On failure the record is left as it was
 *   (and a fetch that then fails quotes the first such refusal: flame_feature_fetch_fn).
 */
FLAME_API flame_status flame_feature_batch_set(flame_feature_batch *batch, size_t index, const int64_t *slot_offsets,
                                               const int64_t *ids, size_t num_ids, const float *dense,
                                               size_t num_dense);
/*
 * flame_feature_batch_set_missing: marks record `index` as missing (the source does not know
 * the id).
 *
 * Parameters:
 *   batch    the batch.
 *   index    the record, < flame_feature_batch_size.
 * Thread-safety: not concurrently with other calls on the same batch.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL batch, index out of range: the message gives
 *   the range).
 */
FLAME_API flame_status flame_feature_batch_set_missing(flame_feature_batch *batch, size_t index);

/*
 * flame_feature_batch_get_slot: reads one bag of record `index`.
 *
 * Parameters:
 *   batch    the batch.
 *   index    the record, < flame_feature_batch_size.
 *   slot     0..num_slots-1.
 *   found    receives 1 for a found record, 0 for a missing one.
 *   ids      receives the bag, int64 [*count], a pointer into the batch (valid until the batch
 *            is next written or destroyed); NULL for a missing record.
 *   count    receives the bag's length (0 for a missing record).
 * Thread-safety: concurrent reads are safe; not concurrently with a write of the same batch.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL batch or output, index or slot out of range,
 *   record never written: the message names it; the outputs untouched).
 */
FLAME_API flame_status flame_feature_batch_get_slot(const flame_feature_batch *batch, size_t index, int32_t slot,
                                                    int32_t *found, const int64_t **ids, size_t *count);
/*
 * flame_feature_batch_get_dense: reads the dense values of record `index`.
 *
 * Parameters:
 *   batch    the batch.
 *   index    the record, < flame_feature_batch_size.
 *   dense    receives float32 [*count], a pointer into the batch (valid until the batch is
 *            next written or destroyed); NULL when the record is missing.
 *   count    receives the number of values (0 when none or missing).
 * Thread-safety: as flame_feature_batch_get_slot.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL batch or output, index out of range, record
 *   never written; the outputs untouched).
 */
FLAME_API flame_status flame_feature_batch_get_dense(const flame_feature_batch *batch, size_t index,
                                                     const float **dense, size_t *count);

/*
 * flame_feature_batch_complete: ends an asynchronous fetch into the batch.
 *
 * A flame_feature_fetch_async_fn calls this exactly once, from any thread, after writing every
 * record (status FLAME_OK) or with the failure status; the libflame thread waiting for the
 * fetch then goes on, so the batch must not be touched after: it may be freed or given to the
 * next fetch at once, so a second call, or a record written after this one, writes memory that
 * is no longer the fetch's. There is no timeout: until this is called, the thread waiting for
 * the fetch (and the item cache calls waiting for the same ids) wait.
 *
 * Parameters:
 *   batch    the batch the fetch was given; NULL is a no-op.
 *   status   FLAME_OK, or the status the whole fetch fails with (FLAME_ERR_UNAVAILABLE ...).
 * Thread-safety: thread-safe.
 * Returns: nothing.
 */
FLAME_API void flame_feature_batch_complete(flame_feature_batch *batch, flame_status status);

/* ---------------------------------------------------------------- feature sources */

typedef struct flame_feature_source flame_feature_source;

/* Host callback, batched: fetch the records of ids[0..n-1] into `out` (size n, already set):
 * for each index call flame_feature_batch_set or flame_feature_batch_set_missing, then return
 * FLAME_OK (every index must have been written), or a failure status (the whole fetch
 * fails; FLAME_ERR_UNAVAILABLE is the usual one; a value that is not a flame_status fails it
 * with FLAME_ERR_UNAVAILABLE, the message naming the value). A record that
 * flame_feature_batch_set refuses (a negative id, a dense value that is NaN or infinite:
 * what the feature file refuses) is not written: the fetch fails with the status returned
 * (FLAME_ERR_INVALID_ARG when the callback passes the refusal on; the same when it returns
 * FLAME_OK, for the record left unwritten), the message quoting the refusal. Answering a
 * negative id in ids with a record (not flame_feature_batch_set_missing) fails the fetch with
 * FLAME_ERR_FORMAT. Called from scoring threads and the cache's refresh thread, possibly
 * concurrently: it must be thread-safe. It must not call into the cache or engine that uses
 * it. */
typedef flame_status (*flame_feature_fetch_fn)(void *user, const int64_t *ids, size_t n, flame_feature_batch *out);

/* Host callback, asynchronous form: starts the fetch and returns at once; the records are
 * written later, from any thread, and then flame_feature_batch_complete(out, status) is
 * called exactly once. ids stay valid until then. The calling libflame thread waits for the
 * completion (its own work is batched, so one wait covers all the misses of a call). */
typedef void (*flame_feature_fetch_async_fn)(void *user, const int64_t *ids, size_t n, flame_feature_batch *out);

/*
 * flame_feature_source_create_callback: a source backed by the host's callback.
 *
 * Parameters:
 *   num_slots    slots of the source's records, 0..64.
 *   fetch        the batched callback, or NULL when fetch_async is given.
 *   fetch_async  the asynchronous callback, or NULL when fetch is given (exactly one).
 *   user         passed back to the callback unchanged; borrowed for the source's life.
 *   out          receives the source; the caller's reference, released with
 *                flame_feature_source_destroy.
 * Thread-safety: thread-safe; flame_feature_source_fetch may then be called concurrently on
 *   the source (the callback must be thread-safe).
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL out, both or neither callback, num_slots out
 *   of range); FLAME_ERR_NOMEM. On failure *out is NULL.
 */
FLAME_API flame_status flame_feature_source_create_callback(int32_t num_slots, flame_feature_fetch_fn fetch,
                                                            flame_feature_fetch_async_fn fetch_async, void *user,
                                                            flame_feature_source **out);

/*
 * flame_feature_source_create_file: a source holding a feature file in memory.
 *
 * The text format of docs/features.md; ids not in the file are missing. The file is read
 * whole here and not again. For tests and the embedded default.
 *
 * Parameters:
 *   path     the file name, NUL-terminated; borrowed.
 *   out      receives the source; the caller's reference, released with
 *            flame_feature_source_destroy.
 * Thread-safety: thread-safe; fetches from the source may run concurrently.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL path or out); FLAME_ERR_IO (cannot open or
 *   read, a directory included: the message carries strerror); FLAME_ERR_FORMAT (no header
 *   line, a malformed line (an empty list entry, a dense value that is not a finite float, a
 *   NUL byte), a negative or repeated id: the message names the file and line number);
 *   FLAME_ERR_NOMEM.
 *   On failure *out is NULL.
 */
FLAME_API flame_status flame_feature_source_create_file(const char *path, flame_feature_source **out);

/* A field left 0 (or NULL) takes its default, so a zeroed struct (with struct_size set) is
 * valid. */
typedef struct flame_redis_options {
    size_t struct_size;          /* sizeof(flame_redis_options) */
    const char *host;            /* NULL = "127.0.0.1"; at most 255 bytes (copied) */
    int32_t port;                /* 0 = 6379; 0..65535 */
    const char *key_prefix;      /* NULL = "flame:item:"; key = prefix + decimal id; at most 127
                                    bytes (copied) */
    int32_t num_slots;           /* slots per record, 0..64 */
    int32_t connect_timeout_ms;  /* 0 = 200; 0..600000 */
    int32_t read_timeout_ms;     /* per fetch: all its replies are in within this of its sending (however
                                    slowly a server trickles bytes), and it waits no longer for the
                                    connection; per step of flame_redis_load_features: each write
                                    moves bytes and each reply is in within this of the one before;
                                    0 = 200; 0..600000 */
    int32_t keys_per_command;    /* keys per MGET; the MGETs of one fetch are pipelined. 0 = 256;
                                    0..65536 */
    int32_t backoff_min_ms;      /* first delay before reconnecting after a failure; 0 = 10; 0..600000 */
    int32_t backoff_max_ms;      /* the delay doubles per failure up to this; 0 = 2000; 0..600000
                                    (raised to backoff_min_ms when below it) */
} flame_redis_options;

/*
 * flame_feature_source_create_redis: a source reading records from a Redis server.
 *
 * Through hiredis; encoding and keys: docs/features.md. The connection is made at creation (a
 * failure is reported then) and remade on demand: a fetch whose connection broke since the
 * last one is retried once on a fresh connection, within the same read deadline; after a
 * failed connect, fetches fail at once with FLAME_ERR_UNAVAILABLE until the backoff delay has
 * passed. A fetch holds the source's connection for its duration (concurrent fetches are
 * serialized): it waits at most read_timeout_ms for it, then connects if needed
 * (connect_timeout_ms) and reads its replies within read_timeout_ms, so it returns within
 * about connect_timeout_ms + 2 x read_timeout_ms whatever the server does
 * (FLAME_ERR_UNAVAILABLE on a timeout, naming it; an MGET reply of the wrong length or type
 * too, naming both lengths or the type, an array reply announcing more than 65536 elements,
 * and bytes beyond the replies a fetch asked for, which leave no way to tell which reply
 * answers which keys). A connection found closed, or holding bytes no command asked for,
 * when a fetch starts is replaced before the fetch sends anything. A server closing the
 * connection while a fetch (or the loader) is still sending fails it with
 * FLAME_ERR_UNAVAILABLE; the write raises no SIGPIPE in the process (the signal is held off
 * in the writing thread, whatever the host's disposition of it). A value that does not
 * decode (or is above 4 GiB), or holds what the feature file refuses (a negative id, a dense
 * value that is NaN or infinite), makes the fetch fail with FLAME_ERR_FORMAT naming the key
 * (and the slot or index and the value), as does a record under a negative id (the key
 * prefix + "-5"). A key that is absent, or holds another Redis type (a list, a hash: MGET
 * answers nil for it), is a missing record.
 *
 * Parameters:
 *   options  read by the struct_size rule; the strings are copied.
 *   out      receives the source; the caller's reference, released with
 *            flame_feature_source_destroy.
 * Thread-safety: thread-safe; fetches from the source may run concurrently (serialized on its
 *   connection, as above).
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL options or out, struct_size outside 8..4096, a
 *   value out of its range above: the message names it); FLAME_ERR_UNAVAILABLE (cannot
 *   connect: the message names host, port and the reason); FLAME_ERR_NOMEM;
 *   FLAME_ERR_UNSUPPORTED (a library built without Redis, make WITH_REDIS=0). On failure *out
 *   is NULL.
 */
FLAME_API flame_status flame_feature_source_create_redis(const flame_redis_options *options,
                                                         flame_feature_source **out);

/*
 * flame_redis_load_features: writes every record of a feature file into Redis.
 *
 * Under the options' prefix, pipelined (SET, 1000 a round trip); existing keys are
 * overwritten. A failure part-way leaves the records written before it in Redis. No step
 * waits longer than read_timeout_ms, however slowly the server reads or answers (each write
 * must move bytes, and each reply be complete, within it).
 *
 * Parameters:
 *   options  as flame_feature_source_create_redis; num_slots must equal the file's.
 *   path     the feature file (docs/features.md), NUL-terminated; borrowed.
 *   written  receives the number of records written, also on failure (may be NULL).
 * Thread-safety: thread-safe (its own connection).
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL path, options' num_slots other than the
 *   file's: the message gives both); the statuses of flame_feature_source_create_file and
 *   flame_feature_source_create_redis; FLAME_ERR_UNAVAILABLE (a write failed or timed out: the
 *   message names the server; a SET refused: the message names the key and what the server
 *   answered); FLAME_ERR_UNSUPPORTED (a library built without Redis, make WITH_REDIS=0).
 */
FLAME_API flame_status flame_redis_load_features(const flame_redis_options *options, const char *path,
                                                 uint64_t *written);

/*
 * flame_feature_source_num_slots: the slot count of the source's records.
 *
 * Parameters:
 *   source   the source; NULL gives -1.
 * Thread-safety: thread-safe.
 * Returns: the slot count (0..64), or -1 for NULL.
 */
FLAME_API int32_t flame_feature_source_num_slots(const flame_feature_source *source);

/*
 * flame_feature_source_fetch: fetches the records of ids from the source, uncached.
 *
 * Parameters:
 *   source   the source.
 *   ids      [n] int64 item ids; may be NULL when n is 0; borrowed. They may lie in out's own
 *            records (a bag read back from out): they are then copied before out is reset.
 *   n        the number of ids, at most (SIZE_MAX / 16 - 8) / 2.
 *   out      reset to size n and written (record i for ids[i]); its num_slots must equal the
 *            source's. On failure it is left empty (size 0), never with part of the records;
 *            on a refusal before the fetch (INVALID_ARG for n) it is left as it was.
 * Thread-safety: thread-safe (concurrent fetches on one source), each with its own out.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL source or out, NULL ids with n > 0, slot
 *   counts that differ, n above the limit, ids lying in out's records that run past them, a
 *   callback that returned FLAME_OK with a record unwritten: the message names the record and
 *   id, and quotes flame_feature_batch_set's refusal if one left it unwritten); the source's
 *   failure (FLAME_ERR_UNAVAILABLE, FLAME_ERR_FORMAT, or the status a callback returned);
 *   FLAME_ERR_FORMAT for a record, from any source, of a negative id (ids are table rows;
 *   asking for one is no error: a source may answer missing); FLAME_ERR_NOMEM.
 */
FLAME_API flame_status flame_feature_source_fetch(flame_feature_source *source, const int64_t *ids, size_t n,
                                                  flame_feature_batch *out);

/*
 * flame_feature_source_destroy: releases the caller's reference to a source.
 *
 * Caches using the source hold their own; the source goes with the last reference.
 *
 * Parameters:
 *   source   the caller's source; NULL is a no-op.
 * Thread-safety: not concurrently with the caller's other calls on the same handle.
 * Returns: nothing.
 */
FLAME_API void flame_feature_source_destroy(flame_feature_source *source);

/* ---------------------------------------------------------------- item cache */

/* An in-process cache of item feature records in front of a feature source.
 * - Sharded hash table. A hit is O(1) and takes no lock at all: readers walk the hash chains
 *   while writers (misses, puts, invalidations, evictions, refreshes), one lock per shard,
 *   replace entries and free the old ones only once no reader can hold them (epoch-based
 *   reclamation, docs/memory.md). The ids of one call are looked up with their cache misses
 *   overlapped, so large calls are much cheaper per id than one-id calls.
 * - Bounded by entries and bytes (flame_item_cache_params); eviction by S3-FIFO (a small
 *   probationary FIFO, a main FIFO with reinsertion of entries hit since their last pass,
 *   and a ghost FIFO of recently evicted keys), which keeps one-hit wonders out of the main
 *   queue (docs/benchmarks.md compares it with LRU).
 * - TTL per entry from its popularity: ttl_fn(id, hits during the previous lifetime); the
 *   default grows linearly from cold_ttl_us (0 hits) to hot_ttl_us (hot_hits hits or more).
 * - Refresh-ahead: a hit past refresh_percent of its TTL on an entry hit refresh_min_hits
 *   times schedules a background refresh; the old value is served meanwhile. A failed
 *   refresh keeps the value (served stale after expiry, counted) and is retried with
 *   exponential backoff until it succeeds or the entry is evicted or overwritten.
 * - Single-flight: concurrent misses of one id cause one fetch; all the misses of one call
 *   go to the source in one batched fetch.
 * - Negative caching: an id the source reports missing is cached as missing for
 *   negative_ttl_us; readers get "missing" (the engine then uses empty bags, which pool to zero
 *   vectors: docs/model-format.md).
 * - No lost updates: a fetch or refresh that started before a flame_item_cache_put or
 *   flame_item_cache_invalidate of the same id never installs its (older) result.
 * Thread-safety: every function may be called concurrently, except create/destroy and the
 *   set_* hooks, which must be called before the cache is shared.
 * fork(): a cache belongs to the process that created it; a child of fork() must neither use
 *   nor destroy one it inherited (its refresh thread exists only in the parent: destroying it
 *   would wait for that thread forever). Pre-fork servers create their caches in the workers. */
typedef struct flame_item_cache flame_item_cache;

/* A clock in microseconds on any monotonic base. */
typedef uint64_t (*flame_clock_fn)(void *user);

/* TTL policy: returns the TTL in us (0 is raised to 1) of a fresh value of `id` given the
 * hits the id's entry had during its previous lifetime (0 for a first insert). Any value up
 * to UINT64_MAX is valid: the expiry (now + TTL) and the refresh-ahead point (now +
 * refresh_percent of the TTL) saturate at UINT64_MAX, so UINT64_MAX, or any TTL reaching past
 * the clock's range, means "never expires" (refresh-ahead still applies). Hits are counted
 * one by one up to 1024, then sampled (an unbiased estimate, within a few percent) so that
 * hot entries are not written on every hit; two threads hitting one entry at the same instant
 * may count once. Called with a shard lock held: it must be fast and must not call into the
 * cache. */
typedef uint64_t (*flame_ttl_fn)(int64_t id, uint64_t previous_hits, void *user);

/* A field left 0 (or NULL) takes its default, so a zeroed struct (with struct_size set) is
 * valid; the fields an older (shorter) struct lacks take their defaults too. Times are
 * microseconds, at most a year (31536000000000). */
typedef struct flame_item_cache_params {
    size_t struct_size;          /* sizeof(flame_item_cache_params) */
    uint64_t max_entries;        /* most entries held (negative entries included); 0 = 1000000;
                                    up to 2^32 */
    uint64_t max_bytes;          /* most bytes of records held (the record encoding of
                                    docs/features.md plus 64 bytes of bookkeeping per entry);
                                    0 = 1 GiB; 4096..2^48 */
    uint64_t hot_ttl_us;         /* TTL of the hottest entries under the default TTL function;
                                    0 = 30 min; at least cold_ttl_us */
    uint64_t cold_ttl_us;        /* TTL of cold entries (never hit) under it; 0 = 1 min */
    uint64_t hot_hits;           /* hits during an entry's previous lifetime that make it fully hot
                                    (the default TTL grows linearly from cold to hot up to this
                                    many hits); 0 = 32; up to 2^32 */
    uint64_t negative_ttl_us;    /* TTL of negative entries (ids the source does not know);
                                    0 = 10 s */
    uint64_t refresh_min_hits;   /* hits an entry needs in its current lifetime before a hit may
                                    schedule a refresh ("popular"); 0 = 2; up to 2^32 */
    uint64_t retry_min_us;       /* first retry delay after a failed refresh, doubling per failure
                                    up to retry_max_us; 0 = 100 ms */
    uint64_t retry_max_us;       /* 0 = 30 s; at least retry_min_us */
    uint32_t shards;             /* independent locks, rounded up to a power of two; 0 = 64;
                                    up to 4096; fewer when max_entries or max_bytes / 64 KiB is
                                    smaller (each shard bounds its share of both, and may keep
                                    one record past its share of the bytes: the one it just
                                    took, when that record alone is larger) */
    uint32_t refresh_percent;    /* refresh-ahead point: percent of the TTL after which a hit
                                    schedules a background refresh; 0 = 80; 1..99; 100 =
                                    refresh-ahead off */
    int32_t manual_refresh;      /* 0 (default): a background thread runs refreshes; 1: none, the
                                    caller runs them with flame_item_cache_run_refresh */
    flame_ttl_fn ttl_fn;         /* TTL policy; NULL = the default above */
    void *ttl_user;              /* passed to ttl_fn; borrowed for the cache's life */
    flame_clock_fn clock_fn;     /* clock of TTLs and retries (for tests); NULL = CLOCK_MONOTONIC */
    void *clock_user;            /* passed to clock_fn; borrowed for the cache's life */
} flame_item_cache_params;

/*
 * flame_item_cache_create: a cache in front of a feature source.
 *
 * Starts the refresh thread unless params->manual_refresh is 1.
 *
 * Parameters:
 *   source   the source misses and refreshes are fetched from; the cache holds a reference.
 *   params   read by the struct_size rule and copied; NULL = the defaults.
 *   out      receives the cache; the caller's reference, released with
 *            flame_item_cache_destroy.
 * Thread-safety: thread-safe.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL source or out, struct_size outside 8..4096, a
 *   field out of its range above, hot_ttl_us below cold_ttl_us, retry_max_us below
 *   retry_min_us: the message names the field and its bounds or both values);
 *   FLAME_ERR_NOMEM; FLAME_ERR_INTERNAL (the refresh thread could not be started). On failure
 *   *out is NULL.
 * Math: eviction by S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction",
 *   SOSP 2023).
 */
FLAME_API flame_status flame_item_cache_create(flame_feature_source *source, const flame_item_cache_params *params,
                                               flame_item_cache **out);

/*
 * flame_item_cache_destroy: releases the caller's reference to a cache.
 *
 * Engines using the cache hold their own. When the last reference goes, the refresh thread
 * stops (after finishing the fetch it is in) and the cache is freed. The last reference may go
 * on the refresh thread itself, from the source's callback (a host language's garbage
 * collector may drop it there): that thread then frees the cache when its refresh is done.
 * Likewise when it goes while the refresh thread waits for an asynchronous fetch (on the
 * host's thread that is to complete it, say): destroy does not wait for that completion; the
 * refresh thread frees the cache once the fetch completes, and starts no fetch after destroy.
 * Once destroy has returned, the cache calls none of the caller's hooks (clock_fn, ttl_fn, the
 * log callback): a fetch completed after it is dropped, not installed.
 *
 * Parameters:
 *   cache    the caller's cache; NULL is a no-op.
 * Thread-safety: not concurrently with the caller's other calls on the same handle (engines'
 *   calls use their own reference).
 * Returns: nothing.
 */
FLAME_API void flame_item_cache_destroy(flame_item_cache *cache);

/*
 * flame_item_cache_set_clock: the clock of TTLs and retry times, after creation.
 *
 * Kept for 0.2.x programs written against it; flame_item_cache_params.clock_fn gives the
 * clock at creation. For tests; the default is CLOCK_MONOTONIC.
 *
 * Parameters:
 *   cache    the cache.
 *   fn       the clock; NULL restores the default. Called from scoring and refresh threads.
 *   user     passed to fn unchanged; borrowed while fn is installed.
 * Thread-safety: before the cache is shared (entries stamped by another clock keep their
 *   times).
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL cache).
 */
FLAME_API flame_status flame_item_cache_set_clock(flame_item_cache *cache, flame_clock_fn fn, void *user);

/*
 * flame_item_cache_set_ttl_fn: the TTL policy of the cache's fresh values, after creation.
 *
 * Kept for 0.2.x programs written against it; flame_item_cache_params.ttl_fn gives the policy
 * at creation.
 *
 * Parameters:
 *   cache    the cache.
 *   fn       the policy (flame_ttl_fn); NULL restores the default (linear from cold_ttl_us at 0
 *            hits to hot_ttl_us at hot_hits hits).
 *   user     passed to fn unchanged; borrowed while fn is installed.
 * Thread-safety: before the cache is shared (entries in it keep their TTLs).
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL cache).
 */
FLAME_API flame_status flame_item_cache_set_ttl_fn(flame_item_cache *cache, flame_ttl_fn fn, void *user);

/*
 * flame_item_cache_get: the records of ids, from the cache or fetched.
 *
 * Hits are copied; the misses of the call are fetched in one batch (joining fetches of other
 * threads already in flight), cached and copied. Missing ids come back missing.
 *
 * Parameters:
 *   cache    the cache.
 *   ids      [n] int64 item ids (repeats allowed); may be NULL when n is 0; borrowed. They may
 *            lie in out's own records (a bag read back from out): they are then copied first.
 *   n        the number of ids, at most (SIZE_MAX / 16 - 8) / 2.
 *   out      reset to size n and written (record i for ids[i]); its num_slots must equal the
 *            source's; left as it was on a refusal of n or ids.
 * Thread-safety: thread-safe (hits take no lock), each call with its own out.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL cache or out, NULL ids with n > 0, slot counts
 *   that differ, n above the limit, ids lying in out's records that run past them); the
 *   source's failure status (a fetch of several misses refused for a record, FLAME_ERR_FORMAT
 *   or FLAME_ERR_INVALID_ARG, is made again id by id, so only the ids that fail alone fail,
 *   here and in the calls waiting on them; other failures fail the batch) when the fetch of a miss failed (nothing is
 *   cached for those ids, whose records in out read as never written; the others are
 *   written); FLAME_ERR_NOMEM.
 */
FLAME_API flame_status flame_item_cache_get(flame_item_cache *cache, const int64_t *ids, size_t n,
                                            flame_feature_batch *out);

/*
 * flame_item_cache_put: writes the record of `id` into the cache.
 *
 * Replaces any value and cancels the installation of fetches already in flight for the id.
 * Its TTL comes from the TTL function.
 *
 * Parameters:
 *   cache         the cache.
 *   id            the item id, >= 0 (a table row).
 *   slot_offsets  [num_slots + 1] int64, as flame_feature_batch_set takes them
 *                 (slot_offsets[num_slots] == num_ids); NULL with num_slots 0. Copied.
 *   ids           [num_ids] int64, each >= 0; copied.
 *   num_ids       length of ids.
 *   dense         [num_dense] float32, each finite (not NaN, not infinite); copied.
 *   num_dense     0..65536.
 * Thread-safety: thread-safe.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL cache, a negative id, and the checks of
 *   flame_feature_batch_set: the message names the slot and both numbers, or the slot or
 *   index and the value of a negative id in a bag or a dense value that is NaN or infinite);
 *   FLAME_ERR_NOMEM. On failure the cache is unchanged.
 */
FLAME_API flame_status flame_item_cache_put(flame_item_cache *cache, int64_t id, const int64_t *slot_offsets,
                                            const int64_t *ids, size_t num_ids, const float *dense,
                                            size_t num_dense);

/*
 * flame_item_cache_invalidate: drops the entry of `id`.
 *
 * The next get fetches it; fetches in flight for it are not installed.
 *
 * Parameters:
 *   cache    the cache.
 *   id       the item id (an id not cached is no error).
 * Thread-safety: thread-safe.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL cache).
 */
FLAME_API flame_status flame_item_cache_invalidate(flame_item_cache *cache, int64_t id);

/*
 * flame_item_cache_run_refresh: runs the refreshes due now, in the calling thread.
 *
 * For caches made with manual_refresh 1, and tests.
 *
 * Parameters:
 *   cache      the cache.
 *   refreshed  receives the number of ids fetched (may be NULL).
 * Thread-safety: thread-safe.
 * Returns: FLAME_OK, also when refreshes failed (they are counted in
 *   flame_item_cache_stats.refresh_failures and rescheduled); FLAME_ERR_INVALID_ARG (NULL
 *   cache).
 */
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

/*
 * flame_item_cache_get_stats: the cache's counters.
 *
 * Parameters:
 *   cache    the cache.
 *   stats    written up to stats->struct_size bytes (the struct_size rule); the caller sets
 *            struct_size.
 * Thread-safety: thread-safe (counters read one by one, not as one snapshot).
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL cache or stats, stats->struct_size outside
 *   8..4096; *stats untouched).
 */
FLAME_API flame_status flame_item_cache_get_stats(flame_item_cache *cache, flame_item_cache_stats *stats);

#ifdef __cplusplus
}
#endif
#endif /* FLAME_FEATURES_H */
