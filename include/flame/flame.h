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
 * BERT-style transformer encoders, and HSTU/FLAME-style GR rankers with the SUMI mask
 * (single user, multiple items: candidates attend to the whole history and themselves).
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
#define FLAME_VERSION_MINOR 1
#define FLAME_VERSION_PATCH 0
/* MAJOR * 10000 + MINOR * 100 + PATCH */
#define FLAME_VERSION_NUMBER (FLAME_VERSION_MAJOR * 10000 + FLAME_VERSION_MINOR * 100 + FLAME_VERSION_PATCH)
#define FLAME_VERSION_STRING "0.1.0"

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
    /* issue 4, feature sources and item cache: */
    FLAME_ERR_UNAVAILABLE = 9       /* a feature source could not be reached, timed out or failed */
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

    /* ---- item cache options (issue 4), read by flame_item_cache_create; numbered from 100.
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
 * On a GPU the weights are uploaded once, here; calls on one GPU engine are serialized on its
 * stream (create one engine per concurrent stream wanted).
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

/* ================================================================ batch-profile scheduler
 * Dynamic batching in front of an engine (the stream orchestrator of the FLAME design):
 * serving threads submit one user's request at a time; the scheduler groups queued requests
 * into batches that fit one of its batch profiles (at most max_users requests of at most
 * max_candidates candidates each), splits a request with more candidates than any profile
 * holds into parts, optionally waits up to max_wait_us for a batch to fill when traffic is
 * low, and runs each batch as one flame_score_batch call on one of its worker threads (on a
 * GPU engine, one worker per executor, so consecutive batches overlap). docs/scheduler.md. */

typedef struct flame_scheduler flame_scheduler;

#define FLAME_SCHED_MAX_PROFILES 16

/* A batch shape: up to max_users requests (users) of up to max_candidates candidates each.
 * Under the dot head candidates are not tokens (they are scored by one product against the
 * item table after the encoder), so there requests are never split and only max_users
 * bounds a batch. */
typedef struct flame_batch_profile {
    uint32_t max_users;        /* 1..65536 */
    uint32_t max_candidates;   /* 1..2^24 */
} flame_batch_profile;

/* A field left 0 takes its default, so a zeroed struct (with struct_size set) is valid. */
typedef struct flame_scheduler_params {
    size_t struct_size;                  /* sizeof(flame_scheduler_params) */
    const flame_batch_profile *profiles; /* [num_profiles], copied at creation; NULL with 0 */
    size_t num_profiles;                 /* 1..FLAME_SCHED_MAX_PROFILES; 0 (profiles NULL) = the FLAME
                                          * paper's four: {1,128}, {2,128}, {4,64}, {8,32} */
    int64_t max_wait_us;                 /* longest the oldest queued request waits for its batch to
                                          * fill; 0 (default) = never wait: a free worker takes what is
                                          * queued (concurrent arrivals still batch while workers are
                                          * busy). 0..10000000 */
    uint32_t workers;                    /* threads calling the engine = batches in flight; 0 = the GPU
                                          * engine's executors (FLAME_OPT_CUDA_EXECUTORS), 1 on the CPU
                                          * (its BLAS uses the cores). 1..64 */
    uint32_t max_queue;                  /* parts (requests, or the parts of split ones) waiting at most;
                                          * a submit beyond is refused (load shedding). 0 = 65536 */
} flame_scheduler_params;

/* Called once per submitted request, on a worker thread, when its scores are written (status
 * FLAME_OK) or it failed (a status of flame_score_batch; `message` then says why, valid only
 * during the call; NULL on success). It should return quickly (the worker scores nothing
 * meanwhile). It may submit; flame_scheduler_score of the same scheduler is refused there
 * (it would wait for the worker it runs on); flame_scheduler_destroy of the same scheduler
 * is allowed (see there). */
typedef void (*flame_score_done_fn)(void *user, flame_status status, const char *message);

/* Creates a scheduler over `engine` (params NULL = the defaults) and starts its workers.
 * The engine must outlive the scheduler. Thread-safety: submit, score, get_stats and
 * reset_latency may be called concurrently from any threads; destroy must not run
 * concurrently with them.
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL engine/out, struct_size outside 8..4096, a value
 * out of its range above: the message names it); FLAME_ERR_NOMEM; FLAME_ERR_INTERNAL (a
 * thread could not be started). On failure *out is NULL. */
FLAME_API flame_status flame_scheduler_create(flame_engine *engine, const flame_scheduler_params *params,
                                              flame_scheduler **out);

/* Stops taking requests, scores every request already queued (each done callback runs),
 * joins the workers and frees the scheduler. Called from a done callback of this scheduler
 * (e.g. by a host language's garbage collector), it returns once every queued request is
 * scored and no batch will use the engine any more; the remaining callbacks of the calling
 * worker's batch still run, and that worker frees the scheduler when it is through. NULL is a
 * no-op. */
FLAME_API void flame_scheduler_destroy(flame_scheduler *scheduler);

/* Queues one request; `done(user, ...)` runs when it is scored. The request struct is copied
 * (as flame_score reads it: struct_size of an older or newer flame.h accepted); the arrays it
 * points to and `scores` must stay valid and unchanged until done runs. Output as flame_score:
 * scores[c * num_tasks + t], nothing written on failure (the parts of a split request are
 * gathered privately and copied out when all succeeded).
 * Batching: a request joins the batch being formed in arrival order (no overtaking) while
 * some profile holds the batch with it; the batch goes to a worker when no further request
 * could join it, when the next queued one does not fit, or when its oldest request has waited
 * max_wait_us. A request with more candidates than the largest max_candidates is split into
 * ceil(n / largest) parts of equal size (within one), scored as separate requests of the same
 * user (candidates never see each other under SUMI, so the scores are those of the whole
 * request, up to the float rounding of another batch shape).
 * A batch whose flame_score_batch fails with FLAME_ERR_INVALID_ARG is scored request by
 * request, so one bad request fails alone and the others succeed; any other failure
 * (FLAME_ERR_UNAVAILABLE of a feature store, FLAME_ERR_NOMEM) fails every request of the batch.
 * Thread-safe. Returns FLAME_OK (done will run exactly once); FLAME_ERR_INVALID_ARG (NULL
 * scheduler/request/done, NULL scores with candidates, struct_size outside 8..4096,
 * more candidates than 2^24, broken candidate bags of a request to be split, more parts than
 * max_queue);
 * FLAME_ERR_BUFFER_TOO_SMALL (scores_len < num_candidates * num_tasks); FLAME_ERR_UNAVAILABLE
 * (max_queue parts are waiting, or the scheduler is being destroyed: shed load); FLAME_ERR_NOMEM.
 * On any failure done is not called and nothing is queued. A request without candidates is
 * only validated, on the calling thread: done runs before submit returns, with the status
 * flame_score would give it. */
FLAME_API flame_status flame_scheduler_submit(flame_scheduler *scheduler, const flame_request *request, float *scores,
                                              size_t scores_len, flame_score_done_fn done, void *user);

/* Submits and waits: flame_score through the scheduler, for callers that block anyway.
 * Returns the request's status (flame_last_error() carries its message on this thread), or
 * the statuses of flame_scheduler_submit; FLAME_ERR_INVALID_ARG when called from a done
 * callback of the same scheduler. */
FLAME_API flame_status flame_scheduler_score(flame_scheduler *scheduler, const flame_request *request, float *scores,
                                             size_t scores_len);

typedef struct flame_scheduler_stats {
    size_t struct_size;             /* sizeof(flame_scheduler_stats) */
    uint64_t submitted;             /* requests queued (submit returned FLAME_OK) */
    uint64_t completed;             /* requests done with FLAME_OK */
    uint64_t failed;                /* requests done with an error */
    uint64_t rejected;              /* submits refused with FLAME_ERR_UNAVAILABLE (queue full, stopping) */
    uint64_t split;                 /* requests split into parts */
    uint64_t parts;                 /* parts scored (a request not split is one part) */
    uint64_t batches;               /* flame_score_batch calls (isolating retries not counted) */
    uint64_t isolated;              /* batches rescored request by request after FLAME_ERR_INVALID_ARG */
    uint64_t queued;                /* parts waiting now */
    uint64_t profile_batches[FLAME_SCHED_MAX_PROFILES]; /* batches by the smallest profile holding them
                                                         * (profiles in the order given) */
    /* Latency, in us, of the requests completed since creation or the last
     * flame_scheduler_reset_latency: from submit to the start of done (latency_*) and, per
     * part, from submit to the start of its batch (queue_wait_*). Log-linear buckets: a
     * percentile is within 1/16 (6.25%) of the true value, rounded up. 0 when none. */
    uint64_t latency_p50_us, latency_p99_us, latency_max_us;
    uint64_t queue_wait_p50_us, queue_wait_p99_us;
} flame_scheduler_stats;

/* Fills *stats (counters read one by one, not as one snapshot). Thread-safe.
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL, struct_size outside 8..4096). */
FLAME_API flame_status flame_scheduler_get_stats(flame_scheduler *scheduler, flame_scheduler_stats *stats);

/* Empties the latency histograms (the percentiles then cover what completes from now on: a
 * monitoring loop calls this after each read). Counters are not reset. Thread-safe (requests
 * completing meanwhile land in either window). Returns FLAME_OK; FLAME_ERR_INVALID_ARG. */
FLAME_API flame_status flame_scheduler_reset_latency(flame_scheduler *scheduler);

/* ================================================================ end of the scheduler */

/* ================================================================ memory (issue 4: NUMA, pinned
 * pool, shared-memory user cache). docs/memory.md describes the layouts behind these calls. */

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
} flame_numa_info;

/* Fills *info. Thread-safe. Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL, struct_size too
 * small). */
FLAME_API flame_status flame_numa_get_info(flame_numa_info *info);

/* Maps `bytes` of page-aligned, zero-filled memory whose pages are placed on `node`
 * (FLAME_NUMA_NODE_LOCAL: the node of the thread that first touches them under the default
 * policy, numa_alloc_local under libnuma). In the fallbacks node must be -1 or 0 and the memory
 * is a plain anonymous mapping. Pages are backed on first touch, so an untouched allocation
 * costs address space only. Ownership: free with flame_numa_free(ptr, bytes). Thread-safe.
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL out, bytes 0, a node this machine lacks: the
 * message names it); FLAME_ERR_NOMEM (the kernel refused the mapping). *out is NULL on failure. */
FLAME_API flame_status flame_numa_alloc(size_t bytes, int32_t node, void **out);
/* Unmaps memory from flame_numa_alloc; `bytes` must be the size asked for. NULL is a no-op. */
FLAME_API void flame_numa_free(void *ptr, size_t bytes);

/* Runs the calling thread on the CPUs of `node` only, and prefers that node for the pages it
 * touches first (numa_run_on_node + numa_set_preferred). In the fallbacks node 0 is accepted and
 * nothing changes (check flame_numa_get_info().mode to know). Thread-safe; affects the calling
 * thread only. Returns FLAME_OK; FLAME_ERR_INVALID_ARG (FLAME_NUMA_NODE_LOCAL, a node this
 * machine lacks, or a node the thread may not run on: the message names it). */
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

typedef struct flame_pinned_pool_params {
    size_t struct_size;         /* sizeof(flame_pinned_pool_params) */
    int32_t numa_node;          /* node of the pages; FLAME_NUMA_NODE_LOCAL (default) */
    int32_t pin;                /* 1 (default): register with CUDA when usable; 0: pageable only */
    uint64_t max_cached_bytes;  /* bytes of freed buffers kept for reuse; default 1 GiB */
} flame_pinned_pool_params;

/* Creates a pool (params NULL = the defaults above). Ownership: *out is the caller's; free with
 * flame_pinned_pool_destroy. Thread-safety: every pool function except destroy may be called
 * concurrently. Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL out, struct_size outside 8..4096, a node
 * this machine lacks, pin not 0/1); FLAME_ERR_NOMEM. *out is NULL on failure. */
FLAME_API flame_status flame_pinned_pool_create(const flame_pinned_pool_params *params, flame_pinned_pool **out);
/* Unregisters and unmaps every buffer of the pool, those still handed out included (a
 * FLAME_LOG_WARN line counts them). The caller guarantees no other call on the pool is running.
 * NULL is a no-op. */
FLAME_API void flame_pinned_pool_destroy(flame_pinned_pool *pool);

/* Hands out a buffer of at least `bytes` (page-aligned, contents unspecified), reusing a cached
 * one of the same size class when there is one. *is_pinned (may be NULL) says whether it is
 * registered with CUDA. Thread-safe. Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL pool/out,
 * bytes 0 or above 2^47); FLAME_ERR_NOMEM (the mapping was refused). *out is NULL on failure. */
FLAME_API flame_status flame_pinned_alloc(flame_pinned_pool *pool, size_t bytes, void **out, int32_t *is_pinned);
/* Gives a buffer back to the pool (cached or unmapped, see above). NULL ptr is a no-op.
 * Thread-safe. Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL pool, or ptr not handed out by
 * this pool or already freed: the message names the address). */
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
} flame_pinned_pool_stats;

/* Fills *stats as one consistent snapshot. Thread-safe. Returns FLAME_OK;
 * FLAME_ERR_INVALID_ARG (NULL, struct_size outside 8..4096). */
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
 * (summing to num_ids), dense[0..num_dense). For get, the pointed-to arrays are written:
 * at most ids_capacity ids and dense_capacity floats, all num_slots slot lengths, and num_ids,
 * num_dense and age_us are set. */
typedef struct flame_user_features {
    size_t struct_size;        /* sizeof(flame_user_features) */
    int64_t *ids;              /* the slots' ids, slot after slot */
    size_t num_ids;
    uint32_t *slot_lens;       /* [num_slots] */
    float *dense;
    size_t num_dense;
    size_t ids_capacity;       /* get only */
    size_t dense_capacity;     /* get only */
    int64_t age_us;            /* get only: microseconds since the record was written */
} flame_user_features;

typedef enum flame_user_cache_open_mode {
    FLAME_USER_CACHE_CREATE = 0,           /* create; FLAME_ERR_IO if the name exists */
    FLAME_USER_CACHE_ATTACH = 1,           /* attach to an existing table; params may be NULL */
    FLAME_USER_CACHE_CREATE_OR_ATTACH = 2  /* attach if it exists, else create */
} flame_user_cache_open_mode;

/* Opens the table `name` (a POSIX shm name: "/" then 1..250 characters without "/").
 * Attaching checks the header: magic, layout version, this build's record layout, and, when
 * params are given, that capacity, slots, ids, dense and ttl match; a mismatch is
 * FLAME_ERR_FORMAT naming the field and both values, never a crash. A table whose creator died
 * before finishing its initialisation is reported (FLAME_ERR_IO) after waiting 1 s.
 * Creation reserves the whole table (posix_fallocate), so a full /dev/shm fails here with
 * FLAME_ERR_NOMEM instead of SIGBUS later. Ownership: *out is the caller's; close with
 * flame_user_cache_destroy (the table itself lives on until flame_user_cache_unlink and the last
 * process unmaps it). Thread-safety: get/put/remove/stats may be called concurrently from any
 * threads and processes. Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL name/out, a bad name,
 * unknown open_mode, params out of range: capacity up to 2^32, num_slots up to 64, max_ids
 * and max_dense up to 65536, ttl_us >= 0, mode within 0777);
 * FLAME_ERR_IO (shm_open/mmap failed, the name exists on CREATE or is absent on ATTACH, the
 * message carries strerror); FLAME_ERR_FORMAT (header mismatch); FLAME_ERR_NOMEM. */
FLAME_API flame_status flame_user_cache_open(const char *name, flame_user_cache_open_mode open_mode,
                                             const flame_user_cache_params *params, flame_user_cache **out);
/* Releases the caller's reference; engines using the handle (flame_engine_set_user_cache) hold
 * their own, and the table is unmapped from this process when the last reference goes. The
 * table and its records stay. NULL is a no-op; the caller guarantees no other call on the
 * handle is running (an engine's calls use their own reference). */
FLAME_API void flame_user_cache_destroy(flame_user_cache *cache);
/* Removes the name (shm_unlink): processes that have the table mapped keep it until they
 * destroy their handles. Returns FLAME_OK; FLAME_ERR_INVALID_ARG (bad name); FLAME_ERR_IO
 * (no such table, or not permitted). */
FLAME_API flame_status flame_user_cache_unlink(const char *name);

/* Writes (inserts or replaces) the record of `user_id`. Any int64 is a valid user id.
 * Thread- and process-safe. Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL cache/features,
 * struct_size outside 8..4096, NULL arrays with non-zero counts, num_ids > max_ids, num_dense >
 * max_dense, slot_lens not summing to num_ids: the message names the value and the limit);
 * FLAME_ERR_IO (another process truncated the shared object or overwrote a bucket lock:
 * docs/memory.md, "Another process of the same user"). */
FLAME_API flame_status flame_user_cache_put(flame_user_cache *cache, int64_t user_id, const flame_user_features *features);
/* Reads the record of `user_id` into *features; *found is 1 on a hit, 0 on a miss (absent,
 * expired, malformed (counted in stats.corrupt) or dropped by crash recovery; num_ids,
 * num_dense and age_us untouched then, the arrays unspecified). Lock-free unless a writer
 * holds the record for long (then the reader waits for, or recovers, the bucket's lock).
 * Thread- and process-safe. Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL argument, struct_size
 * too small, NULL arrays with non-zero capacity, NULL slot_lens); FLAME_ERR_BUFFER_TOO_SMALL
 * (ids_capacity or dense_capacity below the record's counts: num_ids and num_dense are set to
 * the counts needed, the arrays are unspecified, *found is 1); FLAME_ERR_IO (the shared object
 * was truncated by another process). */
FLAME_API flame_status flame_user_cache_get(flame_user_cache *cache, int64_t user_id, flame_user_features *features,
                                            int32_t *found);
/* Removes the record of `user_id`; *removed (may be NULL) is 1 if there was one. Thread- and
 * process-safe. Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL cache); FLAME_ERR_IO (as put). */
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

/* Fills *stats; `records` is counted over the buckets' counters (no lock, O(buckets)), the rest
 * are atomic counters, so the whole is not one snapshot. Thread- and process-safe.
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL, struct_size outside 8..4096);
 * FLAME_ERR_IO (the shared object was truncated by another process). */
FLAME_API flame_status flame_user_cache_get_stats(flame_user_cache *cache, flame_user_cache_stats *stats);

/* Fills *params with the table's layout as fixed by its creator: capacity (as asked at
 * creation), num_slots, max_ids, max_dense and ttl_us; mode reads 0 (the table does not keep
 * its permission bits). A process that attached without params learns here what its
 * flame_user_cache_get buffers need (ids_capacity max_ids, slot_lens of num_slots, dense of
 * max_dense). The fields never change after creation. Thread- and process-safe.
 * Returns FLAME_OK; FLAME_ERR_INVALID_ARG (NULL, struct_size outside 8..4096). */
FLAME_API flame_status flame_user_cache_get_params(const flame_user_cache *cache, flame_user_cache_params *params);

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
FLAME_API flame_status flame_engine_set_user_cache(flame_engine *engine, flame_user_cache *cache);

/* ================================================================ end of memory (issue 4) */

/* ================================================================ item features (issue 4)
 * A feature record is what the model needs per item beyond its id: for each side-feature
 * slot of the model (flame_model_info.num_side_features, in order) a bag of ids, plus
 * optional dense floats (carried, not used by version-1 models). Records come from a
 * feature source (callback, Redis or file) and are cached by an item cache, which an engine
 * can use to fill the side features of requests that give only item ids.
 * Record encoding, Redis keys, the feature file format: docs/features.md. */

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
                                                    int *found, const int64_t **ids, size_t *count);
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
FLAME_API flame_status flame_engine_set_item_cache(flame_engine *engine, flame_item_cache *cache);
/* ================================================================ end of item features */

#ifdef __cplusplus
}
#endif
#endif /* FLAME_FLAME_H */
