/*
 * libflame: embeddable scoring of generative-recommendation (GR) transformer models.
 *
 * This header is the reference for the whole public API. Conventions that hold for every
 * function unless its comment says otherwise:
 *   - Handles are opaque; each has a create/destroy pair and destroy(NULL) is a no-op.
 *   - Functions return a flame_status. On failure, nothing the caller passed in is modified
 *     except output buffers that the comment names, and flame_last_error() on the calling
 *     thread holds a message naming the offending value (file, tensor, index, limit).
 *   - Pointers the caller passes are borrowed for the duration of the call only.
 *   - Ids are int64; scores are float32; sizes are bytes; times are microseconds (us).
 *   - Structs and the ABI: every public struct that starts with `size_t struct_size` is read
 *     and written by one rule. The caller sets struct_size to sizeof(the struct) of the
 *     flame.h it was built against; fields are only ever appended. A smaller struct_size (an
 *     older header): on input the fields it lacks take their defaults (each struct says what
 *     they are; 0 for most), on output only the bytes it holds are written. A larger one (a
 *     newer header): fields this library does not know are not read on input and left
 *     untouched on output. struct_size must be at least sizeof(size_t) and at most 4096;
 *     anything else is FLAME_ERR_INVALID_ARG ("struct_size outside 8..4096" below).
 *
 * Model format: docs/model-format.md. Architecture: SASRec (Kang & McAuley, ICDM 2018) /
 * BERT-style transformer encoders, and GR rankers in the style of HSTU (Zhai et al., ICML 2024,
 * arXiv:2402.17152) and FLAME (arXiv:2509.22681) with the SUMI mask (single user, multiple
 * items: candidates attend to the whole history and themselves).
 */
#ifndef FLAME_FLAME_H
#define FLAME_FLAME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(FLAME_BUILDING) && defined(__GNUC__)
#define FLAME_API __attribute__((visibility("default")))
#else
#define FLAME_API
#endif

/* ---------------------------------------------------------------- version */

#define FLAME_VERSION_MAJOR 0
#define FLAME_VERSION_MINOR 2
#define FLAME_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH */
#define FLAME_VERSION_NUMBER (FLAME_VERSION_MAJOR * 10000 + FLAME_VERSION_MINOR * 100 + FLAME_VERSION_PATCH)
#define FLAME_VERSION_STRING "0.2.0"

/* The version of the library actually loaded, as FLAME_VERSION_NUMBER. Thread-safe. */
FLAME_API unsigned flame_version(void);
/* The same as a static string "MAJOR.MINOR.PATCH". Thread-safe. */
FLAME_API const char *flame_version_string(void);

/* ---------------------------------------------------------------- status */

/* Explicit values, append-only: a retired code stays as a gap. */
typedef enum flame_status {
    FLAME_OK = 0,
    FLAME_ERR_INVALID_ARG = 1,      /* an argument or request value is out of range */
    FLAME_ERR_NOMEM = 2,            /* an allocation failed or a memory budget was exceeded */
    FLAME_ERR_IO = 3,               /* a file could not be opened, read or mapped */
    FLAME_ERR_FORMAT = 4,           /* a model file or config is malformed */
    FLAME_ERR_UNSUPPORTED = 5,      /* valid, but not supported by this build or version */
    FLAME_ERR_NO_DEVICE = 6,        /* a GPU was asked for and none is usable */
    FLAME_ERR_BUFFER_TOO_SMALL = 7, /* an output buffer is smaller than the result */
    FLAME_ERR_INTERNAL = 8,         /* a bug in libflame; please report it */
    /* feature sources and item cache: */
    FLAME_ERR_UNAVAILABLE = 9,      /* a feature source could not be reached, timed out or failed */
    /* the scheduler's admission (flame/scheduler.h): */
    FLAME_ERR_TIMEOUT = 10,         /* a request's deadline passed before its batch started */
    FLAME_ERR_CANCELLED = 11        /* a queued request was cancelled (flame_scheduler_cancel) */
} flame_status;

/* Static, never-NULL name of a status ("FLAME_ERR_FORMAT"); unknown values give
 * "FLAME_ERR_UNKNOWN". Thread-safe. */
FLAME_API const char *flame_status_string(flame_status status);

/* The detailed message of the last failing call made by the calling thread (per-thread
 * storage), e.g. "tensor 'blocks.0.attn.q.weight' has shape [64, 32], expected [64, 64]".
 * Empty string if no call on this thread has failed. The pointer stays valid until the next
 * libflame call on the same thread. */
FLAME_API const char *flame_last_error(void);

/* ---------------------------------------------------------------- logging */

typedef enum flame_log_level {
    FLAME_LOG_ERROR = 0,
    FLAME_LOG_WARN = 1,
    FLAME_LOG_INFO = 2,
    FLAME_LOG_DEBUG = 3
} flame_log_level;

/* Receives log lines (no trailing newline). May be called from any thread that calls into
 * libflame, concurrently; it must not call back into libflame. */
typedef void (*flame_log_fn)(flame_log_level level, const char *message, void *user);

/* Installs the process-wide log hook (NULL = no logging, the default) and the most verbose
 * level delivered. Thread-safe: once it returns, no line reaches the previous hook (it waits
 * for lines being delivered), and every line reaches a hook with that hook's own user pointer.
 * Returns FLAME_OK, or FLAME_ERR_INVALID_ARG for a level outside FLAME_LOG_ERROR..FLAME_LOG_DEBUG. */
FLAME_API flame_status flame_set_log_callback(flame_log_fn fn, void *user, flame_log_level max_level);

/* ---------------------------------------------------------------- model */

typedef struct flame_model flame_model;

/* Loads a flame model file (one safetensors file with a "flame.config" metadata entry;
 * docs/model-format.md). The file is mmap'ed read-only and validated completely before any
 * weight is read; F32 weights are used in place, F16/BF16 ones converted once to float32, and
 * int8 row-wise quantized tables (I8 + per-row scale and bias) are kept int8 and used in place:
 * every reader dequantizes them on the fly (docs/model-format.md, "int8 tables").
 * The file may be changed or removed after return only if it is not replaced in place
 * (the mapping keeps the old inode alive).
 * Ownership: *out is the caller's; free with flame_model_destroy. Engines created from the
 * model hold a reference, so the caller may destroy the model before its engines.
 * Thread-safety: a loaded model is immutable and may be shared by any number of threads.
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL path or out); FLAME_ERR_IO (cannot open,
 * stat or map); FLAME_ERR_FORMAT (any check of docs/model-format.md fails, among them bytes of
 * the data buffer outside every tensor, duplicate JSON keys and NaN or Inf weights; the message
 * names the tensor or config key and the limit or offending value); FLAME_ERR_NOMEM. On failure
 * *out is set to NULL. */
FLAME_API flame_status flame_model_load(const char *path, flame_model **out);

/* Creates a model from a flame.config JSON document (docs/model-format.md) with random
 * weights drawn deterministically from `seed` (splitmix64; the same seed and config give
 * bitwise-identical weights on every platform): linear weights and tables uniform in
 * [-1/sqrt(in), 1/sqrt(in)], biases 0.01 x uniform, LayerNorm weight 1 + 0.1 x uniform.
 * For tests, benchmarks and the embedded default. Ownership and thread-safety as
 * flame_model_load. Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL argument);
 * FLAME_ERR_FORMAT (config invalid or out of range); FLAME_ERR_NOMEM. */
FLAME_API flame_status flame_model_create_random(const char *config_json, uint64_t seed, flame_model **out);

/* The embedded default configuration: the reference GR ranking architecture (pre-LN, SUMI,
 * 3 sigmoid task heads, 4 single-id features per token pooled and projected), scaled to
 * d_model 256 and 4 blocks so that a 2-core CPU scores a request in milliseconds.
 * A static string; thread-safe. */
FLAME_API const char *flame_default_model_config(void);

/* Releases the caller's reference. The memory goes when the last engine using the model is
 * destroyed too. NULL is a no-op. Not to be called concurrently with other uses of the same
 * handle by the caller. */
FLAME_API void flame_model_destroy(flame_model *model);

typedef enum flame_head_type {
    FLAME_HEAD_DOT = 0,  /* one task: <h_last, item_table[c]> */
    FLAME_HEAD_SUMI = 1  /* candidates as tokens, sigmoid(MLP_t(h_c)) per task t */
} flame_head_type;

typedef struct flame_model_info {
    size_t struct_size;          /* sizeof(flame_model_info) */
    int32_t d_model;
    int32_t num_blocks;
    int32_t num_heads;
    int32_t ffn_dim;
    int32_t max_len;             /* history window (most recent items kept) */
    int32_t num_tasks;           /* score columns per candidate */
    int32_t num_side_features;   /* side-feature slots each token takes (flame_request) */
    flame_head_type head;
    int64_t num_items;           /* rows of the table item ids index: valid ids 0..num_items-1 */
    uint64_t weight_bytes;       /* weights held in memory (mapped or converted): float32, and int8
                                    tables at 1 byte a value plus 8 bytes a row (scale, bias) */
} flame_model_info;

/* Fills *info (up to info->struct_size bytes). Thread-safe.
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL, struct_size outside 8..4096). */
FLAME_API flame_status flame_model_get_info(const flame_model *model, flame_model_info *info);

/* ---------------------------------------------------------------- configuration */

typedef struct flame_config flame_config;

typedef enum flame_option {
    /* string: "cpu" (default), "auto" (GPU 0 if the library was built with CUDA and a GPU is
     * usable, else the CPU, saying why through the log hook), "cuda" (= "cuda:0") or "cuda:N"
     * (FLAME_ERR_NO_DEVICE at engine creation when not usable). */
    FLAME_OPT_DEVICE = 1,
    /* int: most requests one flame_score_batch call processes in one pass; larger batches are
     * split. 1..65536, default 256. Bounds scratch memory. */
    FLAME_OPT_MAX_BATCH = 2,
    /* string: compute dtype on the GPU, "fp32" (default), "fp16" or "bf16". Weights are
     * converted once at engine creation; accumulation, LayerNorm, softmax and the residual
     * stream stay float32. In fp16/bf16, attention runs on tensor cores (FlashAttention-2
     * style) and its probabilities enter the P.V product as fp16 (bf16: as a sum of two bf16
     * terms, ~16 bits); fp32 attention is exact float on CUDA cores. The CPU always computes
     * in float32 (it logs that it ignores this). int8 tables stay int8 on the GPU, except the
     * dot head's table, which gets a copy in this dtype for the head's GEMM
     * (docs/model-format.md, "int8 tables"). */
    FLAME_OPT_DTYPE = 4,
    /* int: most bytes of GPU memory the engine may hold (weights + buffers + workspace);
     * 0 (default) = no limit. 0..2^50. Exceeding it is FLAME_ERR_NOMEM with the numbers. */
    FLAME_OPT_DEVICE_MEMORY_BUDGET = 5,
    /* pointer: the caller's cudaStream_t the engine runs on (cuBLAS idiom); NULL (default) =
     * a stream the engine creates. The caller keeps the stream alive as long as the engine. */
    FLAME_OPT_CUDA_STREAM = 6,
    /* int: GPU executors of an engine, 1..16, default 2. Each has its own stream, buffers,
     * GEMM workspace and captured graphs; concurrent calls take different executors, so one
     * call's copies overlap another's kernels. With FLAME_OPT_CUDA_STREAM set there is one. */
    FLAME_OPT_CUDA_EXECUTORS = 7,
    /* int: 1 (default) = capture a pass as a CUDA graph the second time its shape is seen
     * (every request with the same history window, candidate count and candidate layout) and
     * replay it after; the first pass of a shape runs uncaptured, so one-off shapes never
     * pay for a capture. 0 = never capture. Up to 16 graphs per executor, least recently
     * used dropped first. */
    FLAME_OPT_CUDA_GRAPHS = 8,
    /* int: CPU threads one call may use in libflame's own dot-head kernel (gathered candidate
     * ids, and single users when the BLAS library runs without vector kernels on this CPU).
     * 0 (default) = as many as the BLAS library uses (OPENBLAS_NUM_THREADS), so one knob sets
     * both; 1..256 otherwise. Results do not depend on it (bitwise). */
    FLAME_OPT_THREADS = 9,

    /* ---- item cache options, read by flame_item_cache_create; numbered from 100.
     * Times are microseconds. */
    /* int: most entries held (negative entries included). 1..2^32, default 1000000. */
    FLAME_OPT_ITEM_CACHE_MAX_ENTRIES = 100,
    /* int: most bytes of records held (the record encoding of docs/features.md plus 64 bytes
     * of bookkeeping per entry). 4096..2^48, default 1 GiB. */
    FLAME_OPT_ITEM_CACHE_MAX_BYTES = 101,
    /* int: shards (independent locks); rounded up to a power of two. 1..4096, default 64. */
    FLAME_OPT_ITEM_CACHE_SHARDS = 102,
    /* int: TTL of the hottest entries under the default TTL function. default 30 min. */
    FLAME_OPT_ITEM_CACHE_HOT_TTL_US = 103,
    /* int: TTL of cold entries (never hit) under the default TTL function. default 1 min. */
    FLAME_OPT_ITEM_CACHE_COLD_TTL_US = 104,
    /* int: hits during an entry's previous lifetime that make it fully hot (the default TTL
     * grows linearly from cold to hot up to this many hits). 1..2^32, default 32. */
    FLAME_OPT_ITEM_CACHE_HOT_HITS = 105,
    /* int: TTL of negative entries (ids the source does not know). default 10 s. */
    FLAME_OPT_ITEM_CACHE_NEGATIVE_TTL_US = 106,
    /* int: refresh-ahead point, percent of the TTL after which a hit schedules a background
     * refresh (0 = refresh-ahead off). 0..99, default 80. */
    FLAME_OPT_ITEM_CACHE_REFRESH_PERCENT = 107,
    /* int: hits an entry needs in its current lifetime before a hit may schedule a refresh
     * ("popular"). 1..2^32, default 2. */
    FLAME_OPT_ITEM_CACHE_REFRESH_MIN_HITS = 108,
    /* int: 1 = a background thread runs refreshes (default); 0 = none, the caller runs them
     * with flame_item_cache_run_refresh. */
    FLAME_OPT_ITEM_CACHE_REFRESH_THREAD = 109,
    /* int: first retry delay after a failed refresh; doubles per failure up to the max.
     * defaults 100 ms and 30 s. */
    FLAME_OPT_ITEM_CACHE_RETRY_MIN_US = 110,
    FLAME_OPT_ITEM_CACHE_RETRY_MAX_US = 111
} flame_option;

/* Creates a configuration holding the defaults. Not thread-safe per handle; engines copy
 * what they need, so a config may be destroyed or reused right after flame_engine_create.
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL out); FLAME_ERR_NOMEM. */
FLAME_API flame_status flame_config_create(flame_config **out);
FLAME_API void flame_config_destroy(flame_config *config);

/* Typed setters/getters. Return FLAME_OK; FLAME_ERR_INVALID_ARG for a NULL handle, an
 * unknown option, an option of the other type, or a value out of the option's range (the
 * message names the bounds); the stored value is unchanged on failure. */
FLAME_API flame_status flame_config_set_int(flame_config *config, flame_option option, int64_t value);
FLAME_API flame_status flame_config_get_int(const flame_config *config, flame_option option, int64_t *value);
FLAME_API flame_status flame_config_set_string(flame_config *config, flame_option option, const char *value);
/* Copies the string with its NUL into buf (capacity buf_len bytes); FLAME_ERR_BUFFER_TOO_SMALL
 * if it does not fit (buf untouched). */
FLAME_API flame_status flame_config_get_string(const flame_config *config, flame_option option, char *buf, size_t buf_len);
/* Pointer options (FLAME_OPT_CUDA_STREAM): stored as given, never dereferenced by the config. */
FLAME_API flame_status flame_config_set_pointer(flame_config *config, flame_option option, void *value);
FLAME_API flame_status flame_config_get_pointer(const flame_config *config, flame_option option, void **value);

/* ---------------------------------------------------------------- engine */

typedef struct flame_engine flame_engine;

/* Creates an engine that scores with `model` (config NULL = defaults). The engine holds a
 * reference to the model. Thread-safety: flame_score and flame_score_batch may be called
 * concurrently from any number of threads on one engine; each call takes a private scratch
 * workspace from the engine's pool, so calls never share buffers. Results do not depend on
 * concurrency (bitwise identical).
 * On a GPU the weights are uploaded once, here; concurrent calls run on the engine's
 * executors (FLAME_OPT_CUDA_EXECUTORS, each with its own stream and buffers), and wait for a
 * free one when all are busy; with FLAME_OPT_CUDA_STREAM there is one executor, on that stream.
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL model/out);
 * FLAME_ERR_NO_DEVICE ("cuda"/"cuda:N" asked for but this build or machine has no such GPU);
 * FLAME_ERR_NOMEM (host memory, or GPU memory / FLAME_OPT_DEVICE_MEMORY_BUDGET exceeded: the
 * message gives the bytes needed and the limit). On failure *out is NULL. */
FLAME_API flame_status flame_engine_create(flame_model *model, const flame_config *config, flame_engine **out);

/* Destroys the engine. The caller guarantees no call on it is still running. NULL is a no-op. */
FLAME_API void flame_engine_destroy(flame_engine *engine);

/* Side-feature bags of one slot for a list of tokens, in CSR form: token t's ids are
 * ids[offsets[t] .. offsets[t+1]-1]. offsets has num_tokens + 1 entries, offsets[0] == 0,
 * non-decreasing, and offsets[num_tokens] == num_ids, the length of ids: every id belongs to
 * a bag and no bag reads past the array. A contradiction (or num_ids != 0 for a token list
 * of length 0) is FLAME_ERR_INVALID_ARG naming the request, the token list, the feature, the
 * token and both numbers. offsets and ids may be NULL when there are no tokens, ids also
 * when num_ids is 0. An empty bag pools to a zero vector (sum and mean alike). */
typedef struct flame_bags {
    const int64_t *offsets;         /* [num_tokens + 1] */
    const int64_t *ids;             /* [num_ids] */
    size_t num_ids;
} flame_bags;

/* One scoring request: one user, their history and the candidates to score. */
typedef struct flame_request {
    size_t struct_size;             /* sizeof(flame_request) */
    int64_t user_id;                /* the key of the user's record in the user cache when
                                     * history_from_user_cache is 1; otherwise only carried */
    const int64_t *history;         /* [history_len] item ids, oldest first; NULL if 0 */
    size_t history_len;             /* any length: only the most recent max_len items are used
                                     * (all are validated) */
    const int64_t *candidates;      /* [num_candidates] item ids to score; NULL if 0 */
    size_t num_candidates;
    /* [num_side_features] bags over the history tokens (the full history_len, of which the
     * same most recent max_len are used) and over the candidate tokens; NULL when the model
     * has no side features. candidate_side may be NULL under the dot head, which reads only
     * candidate ids. */
    const flame_bags *history_side;
    const flame_bags *candidate_side;
    size_t num_side_features;       /* must equal flame_model_info.num_side_features */
    /* 1: the history is user_id's record in the engine's user cache
     * (flame_engine_set_user_cache): the request gives none (history NULL, history_len 0,
     * history_side NULL). 0: the history is the one given. Other values are invalid. */
    int32_t history_from_user_cache;
} flame_request;

/* Scores the request's candidates. The request is read by the struct_size rule (top of this
 * header): the fields an older header's request lacks read as 0.
 * History from the user cache (history_from_user_cache = 1): the engine reads user_id's record
 * in its user cache (flame_engine_set_user_cache; record convention there) and scores as if
 * the record's history had been passed in `history`. A miss (no record, or an expired one)
 * scores with an empty history, as a request with history_len 0 would. With a model that has
 * side features the request is an id-only one (it gives no history_side): the bags come from
 * the engine's item cache (flame_engine_set_item_cache), which then fills the candidates' bags
 * too (candidate_side must be NULL under the sumi head); without an item cache a non-empty
 * history from the user cache is refused as any id-only request is ("history_side is NULL").
 * Id-only and user-cache requests still set num_side_features to the model's count (with the
 * bag pointers NULL). The request itself is not modified.
 * Output: scores[c * num_tasks + t] (float32, row-major [num_candidates x num_tasks]);
 * scores_len is the capacity in floats. Nothing beyond num_candidates * num_tasks is written,
 * and on any error nothing is written at all.
 * Math: docs/model-format.md (embedding bags -> position -> transformer blocks with the
 * causal/SUMI mask -> dot or sumi head). On the CPU float32 throughout, GEMMs through
 * CBLAS; on the GPU in the engine's compute dtype (FLAME_OPT_DTYPE).
 * An empty candidate list returns FLAME_OK and writes nothing.
 * Thread-safe (see flame_engine_create).
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL engine/request with work to do, struct_size
 * outside 8..4096, NULL ids with a non-zero length, an item or side-feature id < 0 or >= its
 * table's rows (the message names token, feature and id), bad CSR offsets (flame_bags:
 * offsets[0] != 0, decreasing, or a final offset other than num_ids), wrong
 * num_side_features; history_from_user_cache not 0 or 1, 1 with a history given, 1 on an
 * engine with no user cache, or an item id of the user's cached history out of range: the
 * message names the request, the user, the position in the record and the id);
 * FLAME_ERR_BUFFER_TOO_SMALL (scores_len < num_candidates * num_tasks);
 * FLAME_ERR_NOMEM (scratch could not grow). */
FLAME_API flame_status flame_score(flame_engine *engine, const flame_request *request, float *scores, size_t scores_len);

/* Scores several requests (users) in one call; each has its own history and candidates.
 * Output: the per-request blocks of flame_score, concatenated in request order (request r's
 * block starts at the sum of num_candidates * num_tasks of the requests before it).
 * Every request is validated before any is computed, so on error nothing is written; the
 * message names the request index. Token-wise layers run over all requests' tokens as one
 * GEMM, and requests sharing one contiguous candidate range share one scoring GEMM.
 * `requests` is an array of the caller's flame_request, stepped through by its element size,
 * requests[0].struct_size (the sizeof of the caller's flame.h; each request is then read by
 * the struct_size rule), so every request of one call comes from the same header.
 * Thread-safe. Returns the statuses of flame_score; FLAME_ERR_INVALID_ARG for NULL requests
 * with num_requests > 0, for requests[0].struct_size outside 8..4096 or not a multiple of 8
 * (no sizeof(flame_request) is), and for a request whose struct_size differs from request 0's
 * (the message names it and both sizes). */
FLAME_API flame_status flame_score_batch(flame_engine *engine, const flame_request *requests, size_t num_requests,
                                         float *scores, size_t scores_len);

typedef struct flame_engine_stats {
    size_t struct_size;            /* sizeof(flame_engine_stats) */
    uint64_t calls;                /* flame_score + flame_score_batch calls that succeeded */
    uint64_t requests;             /* requests scored */
    uint64_t workspaces;           /* scratch workspaces created (= peak concurrent calls) */
    uint64_t scratch_bytes;        /* bytes held by all workspaces now */
    uint64_t max_workspace_bytes;  /* largest single workspace */
    uint64_t device_bytes;         /* GPU memory held: weights + activation buffers + GEMM workspace; 0 on the CPU */
    uint64_t device_weight_bytes;  /* of which weights (in the compute dtype; int8 tables as int8
                                      plus 8 bytes a row) */
    uint64_t graph_captures;       /* GPU passes captured as CUDA graphs (FLAME_OPT_CUDA_GRAPHS) */
    uint64_t graph_replays;        /* GPU passes run by replaying a captured graph */
    /* requests with history_from_user_cache = 1 of the calls that succeeded, whose user had
     * a record in the user cache (hits) or not, or an expired one (misses) */
    uint64_t user_cache_hits;
    uint64_t user_cache_misses;
} flame_engine_stats;

/* Fills *stats up to stats->struct_size bytes. Thread-safe (counters are read atomically,
 * not as one snapshot). Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL, struct_size outside
 * 8..4096). */
FLAME_API flame_status flame_engine_get_stats(flame_engine *engine, flame_engine_stats *stats);

/* The caches an engine can read features from (flame/features.h, flame/memory.h). */
struct flame_item_cache;
struct flame_user_cache;

/* Attaches an item cache to an engine (NULL detaches). Then a request that gives no side
 * features (history_side NULL and, under the sumi head, candidate_side NULL) to a model with
 * side features gets them from the cache: one flame_item_cache_get per call for all the
 * distinct item ids of the call's requests (history tokens inside the window, and the
 * candidates under the sumi head); a missing record gives empty bags (zero vectors).
 * Requests that give their side features are scored from them as before. Everything the
 * cache does not give (item ids, lengths, the bags given, the scores buffer) is checked before
 * the cache is asked, so a call refused for it fetches nothing and caches nothing; the bags
 * from the cache are checked after (their side ids must fit their tables). The engine holds a
 * reference to the cache. Not to be called concurrently with scoring on the engine.
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL engine, or the cache's records have a slot
 * count different from the model's num_side_features). flame_score then also returns the
 * cache's failure statuses (FLAME_ERR_UNAVAILABLE, FLAME_ERR_FORMAT) when a miss cannot be
 * fetched, and writes no score. */
FLAME_API flame_status flame_engine_set_item_cache(flame_engine *engine, struct flame_item_cache *cache);

/* Attaches a user cache to an engine (NULL detaches), so that requests can give a user id and
 * candidates only (flame_request.history_from_user_cache = 1, flame_score).
 * Record convention: slot 0 of a user's record holds the user's history, item ids oldest
 * first (the newest last, as flame_request.history); the engine uses its most recent max_len
 * ids (flame_model_info.max_len). Every id of slot 0 must be a valid item id of the engine's
 * model (0..num_items-1), else scoring that user fails with FLAME_ERR_INVALID_ARG naming the
 * user, the position in slot 0 and the id. Other slots and the dense values are not read.
 * Each such request costs one flame_user_cache_get into the call's own workspace (no lock, no
 * allocation once the workspace has grown); hits and misses are counted in
 * flame_engine_stats and, as any get, in the handle's flame_user_cache_stats.
 * The engine holds a reference to the handle. Not to be called concurrently with scoring on
 * the engine; scoring calls may use the cache concurrently (from threads, and other
 * processes may write the table meanwhile: a record is read whole, before or after a write).
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL engine). */
FLAME_API flame_status flame_engine_set_user_cache(flame_engine *engine, struct flame_user_cache *cache);

#ifdef __cplusplus
}
#endif

/* The rest of the API, one header per concern (each can also be included on its own). */
#include "flame/features.h"
#include "flame/memory.h"
#include "flame/scheduler.h"
#include "flame/metrics.h"

#endif /* FLAME_FLAME_H */
