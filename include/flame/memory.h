/*
 * libflame: host memory: NUMA-local allocation, the pinned host buffer pool, and the
 * shared-memory user cache of users' features.
 *
 * Part of the public API; included by flame/flame.h, and usable on its own. The conventions at
 * the top of flame/flame.h (statuses, ownership, units, the struct_size rule) hold here too.
 *
 * docs/memory.md describes the layouts behind these calls.
 */
#ifndef FLAME_MEMORY_H
#define FLAME_MEMORY_H

#include "flame/flame.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- NUMA */

/* Which allocator flame_numa_* use in this process (decided once, on first use). */
typedef enum flame_numa_mode {
    FLAME_NUMA_LIBNUMA = 0,           /* libnuma works and the machine has >= 2 nodes */
    FLAME_NUMA_FALLBACK_NO_NUMA = 1,  /* numa_available() < 0: plain memory, binding a no-op */
    FLAME_NUMA_FALLBACK_ONE_NODE = 2  /* one node: plain memory is local already, binding a no-op */
} flame_numa_mode;

/* "The node of the calling thread" wherever a node is asked for. */
#define FLAME_NUMA_NODE_LOCAL (-1)

typedef struct flame_numa_info {
    size_t struct_size;     /* sizeof(flame_numa_info) */
    flame_numa_mode mode;
    int32_t num_nodes;      /* node numbers are 0..num_nodes-1 (1 in the fallbacks) */
    int32_t current_node;   /* node of the CPU the calling thread runs on now (0 in the fallbacks) */
    uint32_t reserved0;     /* written as 0: what would be trailing padding (flame.h, "No padding") */
} flame_numa_info;

/*
 * flame_numa_get_info: the NUMA mode of this process and the calling thread's node.
 *
 * Parameters:
 *   info     written up to info->struct_size bytes (the struct_size rule); the caller sets
 *            struct_size.
 * Thread-safety: thread-safe.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL info, info->struct_size outside 8..4096;
 *   *info untouched); FLAME_ERR_UNSUPPORTED (a library built without libnuma, make
 *   WITH_NUMA=0: there the pinned pool takes node FLAME_NUMA_NODE_LOCAL or 0, plain memory).
 */
FLAME_API flame_status flame_numa_get_info(flame_numa_info *info);

/*
 * flame_numa_alloc: maps page-aligned, zero-filled memory placed on a NUMA node.
 *
 * Under libnuma FLAME_NUMA_NODE_LOCAL is numa_alloc_local; in the fallbacks the memory is a
 * plain anonymous mapping. Pages are backed on first touch, so an untouched allocation costs
 * address space only.
 *
 * Parameters:
 *   bytes    size in bytes, > 0.
 *   node     0..num_nodes-1, or FLAME_NUMA_NODE_LOCAL (the node of the thread that first
 *            touches the pages); in the fallbacks -1 or 0.
 *   out      receives the memory; the caller's, freed with flame_numa_free(ptr, bytes).
 * Thread-safety: thread-safe.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL out, bytes 0, a node this machine lacks: the
 *   message names it); FLAME_ERR_NOMEM (the kernel refused the mapping); FLAME_ERR_UNSUPPORTED
 *   (a library built without libnuma, make WITH_NUMA=0). *out is NULL on failure.
 */
FLAME_API flame_status flame_numa_alloc(size_t bytes, int32_t node, void **out);
/*
 * flame_numa_free: unmaps memory from flame_numa_alloc.
 *
 * The library keeps the allocations it handed out: a pointer that is none of them (foreign,
 * or freed already) is left alone, and bytes other than the allocation's still unmap the
 * whole allocation; both write a FLAME_LOG_WARN line naming the pointer and the sizes. (A
 * pointer freed and handed out again by flame_numa_alloc is the new allocation.)
 *
 * Parameters:
 *   ptr      what flame_numa_alloc gave; NULL is a no-op.
 *   bytes    the size asked for at allocation.
 * Thread-safety: thread-safe (each allocation freed once).
 * Returns: nothing.
 */
FLAME_API void flame_numa_free(void *ptr, size_t bytes);

/*
 * flame_numa_bind_thread: runs the calling thread on one node's CPUs and memory.
 *
 * numa_run_on_node + numa_set_preferred: the thread runs on the CPUs of `node` only and
 * prefers that node for the pages it touches first. In the fallbacks node 0 is accepted and
 * nothing changes (flame_numa_get_info's mode tells).
 *
 * Parameters:
 *   node     0..num_nodes-1.
 * Thread-safety: thread-safe; affects the calling thread only.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (FLAME_NUMA_NODE_LOCAL, a node this machine lacks,
 *   or a node the thread may not run on: the message names it); FLAME_ERR_UNSUPPORTED (a
 *   library built without libnuma, make WITH_NUMA=0).
 */
FLAME_API flame_status flame_numa_bind_thread(int32_t node);

/* ---------------------------------------------------------------- pinned host buffer pool */

/* Host buffers for GPU transfers: NUMA-local pages registered with cudaHostRegister when this
 * build has CUDA and a device is usable, pageable otherwise. Sizes are rounded up to a size
 * class: whole pages up to 16 pages, then 8 classes per power of two, so a buffer's footprint
 * is at most 12.5% (plus one page) above the request. Freed buffers are kept per class for
 * reuse up to max_cached_bytes; beyond that they are unregistered and unmapped.
 * A failed registration is not an error: the buffer stays pageable, the failure is counted in
 * the stats and logged (FLAME_LOG_WARN) through the log hook. */
typedef struct flame_pinned_pool flame_pinned_pool;

/* The fields are read as given (0 is node 0, pageable only, no buffer kept); the defaults
 * below apply to params NULL and to the fields an older (shorter) struct lacks. */
typedef struct flame_pinned_pool_params {
    size_t struct_size;         /* sizeof(flame_pinned_pool_params) */
    int32_t numa_node;          /* node of the pages; default FLAME_NUMA_NODE_LOCAL */
    int32_t pin;                /* 1 (default): register with CUDA when usable; 0: pageable only */
    uint64_t max_cached_bytes;  /* bytes of freed buffers kept for reuse; default 1 GiB */
} flame_pinned_pool_params;

/*
 * flame_pinned_pool_create: a pool of host buffers for GPU transfers.
 *
 * Parameters:
 *   params   read by the struct_size rule; NULL = the defaults above.
 *   out      receives the pool; the caller's, freed with flame_pinned_pool_destroy.
 * Thread-safety: thread-safe. On the pool made, every function except destroy may be called
 *   concurrently.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL out, struct_size outside 8..4096, a node this
 *   machine lacks, pin not 0 or 1: the message names it); FLAME_ERR_NOMEM. *out is NULL on
 *   failure.
 */
FLAME_API flame_status flame_pinned_pool_create(const flame_pinned_pool_params *params, flame_pinned_pool **out);
/*
 * flame_pinned_pool_destroy: unregisters and unmaps every buffer of the pool.
 *
 * Those still handed out too (a FLAME_LOG_WARN line counts them).
 *
 * Parameters:
 *   pool     the caller's pool; NULL is a no-op.
 * Thread-safety: the caller guarantees no other call on the pool is running.
 * Returns: nothing.
 */
FLAME_API void flame_pinned_pool_destroy(flame_pinned_pool *pool);

/*
 * flame_pinned_alloc: hands out a buffer of at least `bytes`.
 *
 * Page-aligned, contents unspecified; a cached buffer of the same size class is reused when
 * there is one.
 *
 * Parameters:
 *   pool       the pool.
 *   bytes      1..2^47.
 *   out        receives the buffer; the caller's until flame_pinned_free (or the pool's
 *              destroy).
 *   is_pinned  receives 1 if the buffer is registered with CUDA, else 0 (may be NULL).
 * Thread-safety: thread-safe.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL pool or out, bytes 0 or above 2^47);
 *   FLAME_ERR_NOMEM (the mapping was refused). *out is NULL on failure. A failed registration
 *   is no failure (above).
 */
FLAME_API flame_status flame_pinned_alloc(flame_pinned_pool *pool, size_t bytes, void **out, int32_t *is_pinned);
/*
 * flame_pinned_free: gives a buffer back to the pool (cached or unmapped, see above).
 *
 * Parameters:
 *   pool     the pool that handed it out.
 *   ptr      the buffer; NULL is a no-op.
 * Thread-safety: thread-safe.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL pool, or ptr not handed out by this pool or
 *   already freed: the message names the address).
 */
FLAME_API flame_status flame_pinned_free(flame_pinned_pool *pool, void *ptr);

typedef struct flame_pinned_pool_stats {
    size_t struct_size;        /* sizeof(flame_pinned_pool_stats) */
    uint64_t bytes_reserved;   /* mapped by the pool now: handed out + cached (size-class bytes) */
    uint64_t bytes_in_use;     /* size-class bytes of the buffers handed out now */
    uint64_t bytes_requested;  /* bytes callers asked for, of the buffers handed out now */
    uint64_t bytes_pinned;     /* of bytes_reserved, registered with CUDA */
    uint64_t bytes_pageable;   /* of bytes_reserved, not registered */
    uint64_t hits;             /* allocations served from a cached buffer */
    uint64_t misses;           /* allocations that mapped a new buffer */
    uint64_t pin_failures;     /* registrations that failed (those buffers are pageable) */
    uint64_t releases;         /* buffers unmapped because the cache was full */
    int32_t pinning;           /* 1 if this pool registers buffers, 0 if pageable only */
    uint32_t reserved0;        /* written as 0: what would be trailing padding (flame.h, "No padding") */
} flame_pinned_pool_stats;

/*
 * flame_pinned_pool_get_stats: the pool's counters, as one consistent snapshot.
 *
 * Parameters:
 *   pool     the pool.
 *   stats    written up to stats->struct_size bytes (the struct_size rule); the caller sets
 *            struct_size.
 * Thread-safety: thread-safe.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL pool or stats, stats->struct_size outside
 *   8..4096; *stats untouched).
 */
FLAME_API flame_status flame_pinned_pool_get_stats(flame_pinned_pool *pool, flame_pinned_pool_stats *stats);

/* ---------------------------------------------------------------- shared-memory user cache */

/* A table of user feature records in POSIX shared memory (shm_open + mmap) that the processes
 * of one host create or attach by name. Capacity and the record bound are fixed at creation.
 * Readers take no lock (a seqlock per record: they never see a torn record); writers lock the
 * two candidate buckets of a user (process-shared robust mutexes), so a process killed in the
 * middle of a write leaves the table usable: the next process to lock that bucket drops the
 * half-written record (it reads as a miss). When both buckets of a user are full, a put evicts
 * an expired record, else the least recently written one of the two buckets. */
typedef struct flame_user_cache flame_user_cache;

/* A field left 0 takes its default, so a zeroed struct (with struct_size set) is valid. */
typedef struct flame_user_cache_params {
    size_t struct_size;        /* sizeof(flame_user_cache_params) */
    uint64_t capacity;         /* records; 0 = 500000 (rounded up to whole buckets of 8).
                                * Evictions may begin at ~70% of it (docs/memory.md) */
    uint32_t num_slots;        /* id slots per record (bags, e.g. "genres"); 0 = 1 */
    uint32_t max_ids;          /* ids per record, all slots together; 0 = 32. For histories read
                                * by flame_score (slot 0), at least the model's max_len */
    uint32_t max_dense;        /* float32 values per record; 0 (default) = none */
    uint32_t mode;             /* permission bits of the shm object; 0 = 0600 */
    int64_t ttl_us;            /* records older than this read as misses; 0 (default) = never */
} flame_user_cache_params;

/* One user's features. For put, the fields are read: ids[0..num_ids), slot_lens[0..num_slots)
 * (summing to num_ids), dense[0..num_dense); a non-zero ids_capacity or dense_capacity bounds
 * num_ids or num_dense (a struct filled by a get may be put back). For get, the pointed-to
 * arrays are written: at most ids_capacity ids and dense_capacity floats, all num_slots slot
 * lengths, and num_ids, num_dense and age_us are set. */
typedef struct flame_user_features {
    size_t struct_size;        /* sizeof(flame_user_features) */
    int64_t *ids;              /* the slots' ids, slot after slot */
    size_t num_ids;
    uint32_t *slot_lens;       /* [num_slots] */
    float *dense;
    size_t num_dense;
    size_t ids_capacity;       /* get; put: when non-zero, bounds num_ids */
    size_t dense_capacity;     /* get; put: when non-zero, bounds num_dense */
    int64_t age_us;            /* get only: microseconds since the record was written */
} flame_user_features;

typedef enum flame_user_cache_open_mode {
    FLAME_USER_CACHE_CREATE = 0,           /* create; FLAME_ERR_IO if the name exists */
    FLAME_USER_CACHE_ATTACH = 1,           /* attach to an existing table; params may be NULL */
    FLAME_USER_CACHE_CREATE_OR_ATTACH = 2  /* attach if it exists, else create (also when another
                                            * process unlinks the name meanwhile); a table whose
                                            * creator died before finishing it is initialised
                                            * again, with params (flame_user_cache_open) */
} flame_user_cache_open_mode;

/*
 * flame_user_cache_open: creates or attaches the shared-memory table `name`.
 *
 * Attaching checks the header: magic, layout version, this build's record layout, and, when
 * params are given, that capacity, slots, ids, dense and ttl match; a mismatch is
 * FLAME_ERR_FORMAT naming the field and both values, never a crash. Attaching waits for a
 * creator still initialising the table for as long as that process lives (a large table takes
 * seconds). Creation reserves the whole table (posix_fallocate), so a full /dev/shm fails here
 * with FLAME_ERR_NOMEM instead of SIGBUS later; a creation that fails unlinks its object, and
 * only its own (not a table another process made under the name after it was unlinked).
 *
 * A table whose creator died before finishing it, or an empty object (its creator died
 * before reserving it), is told from one still being created once no process has held the
 * creator's lock on it for 1 s. Then FLAME_USER_CACHE_ATTACH reports it (FLAME_ERR_IO),
 * FLAME_USER_CACHE_CREATE reports the name as existing, and FLAME_USER_CACHE_CREATE_OR_ATTACH
 * takes it over: it initialises the object in place as a new table of params, as a creator
 * would (of many processes doing so at once, one initialises it and the others attach to it),
 * so that a service that died while creating its table starts again without
 * flame_user_cache_unlink. Only such a table is taken over: a ready table, a table of another
 * layout version, or an object that is no user cache is never written (FLAME_ERR_FORMAT as
 * above).
 *
 * Parameters:
 *   name       a POSIX shm name: "/" then 1..250 characters without "/", not "/." or "/..";
 *              copied.
 *   open_mode  a flame_user_cache_open_mode.
 *   params     read by the struct_size rule (a field left 0 takes its default); NULL = the
 *              defaults (FLAME_USER_CACHE_CREATE_OR_ATTACH then attaches only a table of
 *              the default layout, and takes over as one), and FLAME_USER_CACHE_ATTACH then
 *              checks no layout.
 *   out        receives the handle; the caller's reference, released with
 *              flame_user_cache_destroy (the table itself lives on until
 *              flame_user_cache_unlink and the last process unmaps it).
 * Thread-safety: thread-safe. On the handle made, get, put, remove, get_stats and get_params
 *   may be called concurrently from any threads and processes.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL name or out, a bad name, unknown open_mode,
 *   struct_size outside 8..4096, params out of range: capacity up to 2^32, num_slots up to
 *   64, max_ids and max_dense up to 65536, ttl_us >= 0, mode within 0777); FLAME_ERR_IO
 *   (shm_open, flock, fstat, fchmod, ftruncate, posix_fallocate or mmap failed: the message carries
 *   strerror; the name exists on CREATE, including an object this call made that a
 *   CREATE_OR_ATTACH took over before this call held it, "another process initialised the
 *   object first"; the name is absent on ATTACH; on ATTACH, a table left unfinished by its
 *   creator, "never fully initialised" or "is empty"); FLAME_ERR_FORMAT (header mismatch,
 *   another layout version, or an object that is no user cache); FLAME_ERR_NOMEM (no memory
 *   for the handle, or no room in /dev/shm to reserve the table, when creating or taking
 *   over). *out is NULL on failure.
 */
FLAME_API flame_status flame_user_cache_open(const char *name, flame_user_cache_open_mode open_mode,
                                             const flame_user_cache_params *params, flame_user_cache **out);
/*
 * flame_user_cache_destroy: releases the caller's reference to a handle.
 *
 * Engines using the handle (flame_engine_set_user_cache) hold their own; the table is unmapped
 * from this process when the last reference goes. The table and its records stay.
 *
 * Parameters:
 *   cache    the caller's handle; NULL is a no-op.
 * Thread-safety: the caller guarantees none of its other calls on the handle is running (an
 *   engine's calls use their own reference).
 * Returns: nothing.
 */
FLAME_API void flame_user_cache_destroy(flame_user_cache *cache);
/*
 * flame_user_cache_unlink: removes a table's name (shm_unlink).
 *
 * Processes that have the table mapped keep it until they destroy their handles.
 *
 * Parameters:
 *   name     as flame_user_cache_open's.
 * Thread-safety: thread-safe.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL or bad name); FLAME_ERR_IO (no such table, or
 *   not permitted: the message carries strerror).
 */
FLAME_API flame_status flame_user_cache_unlink(const char *name);

/*
 * flame_user_cache_put: writes (inserts or replaces) the record of `user_id`.
 *
 * Parameters:
 *   cache     the handle.
 *   user_id   any int64.
 *   features  read by the struct_size rule: ids [num_ids] int64, slot_lens [num_slots] uint32
 *             (summing to num_ids), dense [num_dense] float32; copied into the table.
 * Thread-safety: thread- and process-safe.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL cache or features, struct_size outside
 *   8..4096, NULL slot_lens, NULL arrays with non-zero counts, num_ids > max_ids, num_dense >
 *   max_dense, num_ids or num_dense above a non-zero ids_capacity or dense_capacity,
 *   slot_lens not summing to num_ids: the message names the value and the limit);
 *   FLAME_ERR_IO (another process truncated the shared object or overwrote a bucket lock:
 *   docs/memory.md, "Another process of the same user"). On failure the record is unchanged.
 */
FLAME_API flame_status flame_user_cache_put(flame_user_cache *cache, int64_t user_id, const flame_user_features *features);
/*
 * flame_user_cache_get: reads the record of `user_id`.
 *
 * Lock-free unless a writer holds the record for long (then the reader waits for, or
 * recovers, the bucket's lock).
 *
 * Parameters:
 *   cache     the handle.
 *   user_id   any int64.
 *   features  read by the struct_size rule for its capacities and arrays: ids [ids_capacity]
 *             int64, slot_lens [num_slots] uint32, dense [dense_capacity] float32, the
 *             caller's, are written; num_ids, num_dense and age_us (us) are set on a hit.
 *   found     receives 1 on a hit, 0 on a miss: absent, expired, malformed (counted in
 *             stats.corrupt) or dropped by crash recovery; num_ids, num_dense and age_us are
 *             untouched then, the arrays unspecified.
 * Thread-safety: thread- and process-safe.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL argument, struct_size outside 8..4096, NULL
 *   arrays with non-zero capacity, NULL slot_lens); FLAME_ERR_BUFFER_TOO_SMALL (ids_capacity or
 *   dense_capacity below the record's counts: num_ids and num_dense are set to the counts
 *   needed, the arrays are unspecified, *found is 1); FLAME_ERR_IO (the shared object was
 *   truncated by another process).
 */
FLAME_API flame_status flame_user_cache_get(flame_user_cache *cache, int64_t user_id, flame_user_features *features,
                                            int32_t *found);
/*
 * flame_user_cache_remove: removes the record of `user_id`.
 *
 * Parameters:
 *   cache     the handle.
 *   user_id   any int64.
 *   removed   receives 1 if there was a record, else 0 (may be NULL).
 * Thread-safety: thread- and process-safe.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL cache); FLAME_ERR_IO (as put).
 */
FLAME_API flame_status flame_user_cache_remove(flame_user_cache *cache, int64_t user_id, int32_t *removed);

typedef struct flame_user_cache_stats {
    size_t struct_size;        /* sizeof(flame_user_cache_stats) */
    uint64_t capacity;         /* records the table holds (buckets x 8) */
    uint64_t records;          /* live records now, expired ones not yet overwritten included */
    uint64_t table_bytes;      /* size of the shared memory object */
    uint64_t record_bytes;     /* bytes one record takes in it */
    uint64_t hits;             /* this handle's gets that found a record */
    uint64_t misses;           /* this handle's gets that did not (expired ones included) */
    uint64_t expired;          /* of the misses, records found but older than ttl_us */
    uint64_t puts;             /* all processes, since creation */
    uint64_t evictions;        /* puts that overwrote another user's live record (all processes) */
    uint64_t recoveries;       /* bucket locks recovered from a dead owner (all processes) */
    /* this handle's gets that found the user's record malformed (bounds, slot lengths not
     * summing to the ids: only another process overwriting the table makes one) and read it
     * as a miss; counted in misses too. Written only when struct_size covers it. */
    uint64_t corrupt;
} flame_user_cache_stats;

/*
 * flame_user_cache_get_stats: the table's and this handle's counters.
 *
 * `records` is counted over the buckets' counters (no lock, O(buckets)); the rest are atomic
 * counters, so the whole is not one snapshot.
 *
 * Parameters:
 *   cache    the handle.
 *   stats    written up to stats->struct_size bytes (the struct_size rule); the caller sets
 *            struct_size.
 * Thread-safety: thread- and process-safe.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL cache or stats, stats->struct_size outside
 *   8..4096); FLAME_ERR_IO (the shared object was truncated by another process). *stats is
 *   untouched on failure.
 */
FLAME_API flame_status flame_user_cache_get_stats(flame_user_cache *cache, flame_user_cache_stats *stats);

/*
 * flame_user_cache_get_params: the table's layout as fixed by its creator.
 *
 * A process that attached without params learns here what its flame_user_cache_get buffers
 * need (ids_capacity max_ids, slot_lens of num_slots, dense of max_dense). The fields never
 * change after creation.
 *
 * Parameters:
 *   cache    the handle.
 *   params   written up to params->struct_size bytes (the struct_size rule): capacity (as
 *            asked at creation), num_slots, max_ids, max_dense and ttl_us; mode reads 0 (the
 *            table does not keep its permission bits).
 * Thread-safety: thread- and process-safe.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL cache or params, params->struct_size outside
 *   8..4096; *params untouched).
 */
FLAME_API flame_status flame_user_cache_get_params(const flame_user_cache *cache, flame_user_cache_params *params);

#ifdef __cplusplus
}
#endif
#endif /* FLAME_MEMORY_H */
