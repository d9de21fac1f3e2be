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
 *     untouched on output. struct_size must be a multiple of 8 from 8 to 4096 (each such
 *     struct's sizeof is a multiple of 8; a size ending inside a field would copy half of it);
 *     anything else is FLAME_ERR_INVALID_ARG ("struct_size outside 8..4096" below means this).
 *   - No trailing padding: sizeof of every public struct is where its last field ends, so a
 *     field appended later always grows struct_size (appended into trailing padding it would
 *     not, and an older caller's uninitialised padding would be read as the new field). Where
 *     alignment would pad the end, the header names those bytes reserved0: leave it 0 (a
 *     zeroed or designated-initialised struct does). The library refuses any other value with
 *     FLAME_ERR_INVALID_ARG naming the field, does not read it in a struct shorter than the
 *     header that named it (an older header, where those bytes were padding), and writes 0
 *     there in the structs it fills. Holes inside a struct stay unnamed (appends never land
 *     there; naming them would shift positional initialisers). docs/abi.md.
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

/*
 * flame_version: the version of the library actually loaded.
 *
 * Compare it with FLAME_VERSION_NUMBER (the header built against) to detect a mismatched
 * libflame.so at run time.
 *
 * Parameters: none.
 * Thread-safety: thread-safe.
 * Returns: MAJOR * 10000 + MINOR * 100 + PATCH of the loaded library.
 */
FLAME_API unsigned flame_version(void);

/*
 * flame_version_string: the loaded library's version as text.
 *
 * Parameters: none.
 * Thread-safety: thread-safe.
 * Returns: a static string "MAJOR.MINOR.PATCH" (never NULL; not to be freed).
 */
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

/*
 * flame_status_string: the name of a status.
 *
 * Parameters:
 *   status   any value; values this library does not know are accepted.
 * Thread-safety: thread-safe.
 * Returns: a static, never-NULL string naming the status ("FLAME_ERR_FORMAT"); unknown values
 *   give "FLAME_ERR_UNKNOWN".
 */
FLAME_API const char *flame_status_string(flame_status status);

/*
 * flame_last_error: the detailed message of the calling thread's last failed call.
 *
 * E.g. "tensor 'blocks.0.attn.q.weight' has shape [64, 32], expected [64, 64]". Every call
 * that returns a flame_status clears it on entry, so after a FLAME_OK it is empty.
 *
 * Parameters: none.
 * Thread-safety: thread-safe; the message is per thread, so concurrent calls on other threads
 *   never change it.
 * Returns: a NUL-terminated string owned by the library (empty when the thread's last call
 *   succeeded or it made none); its contents change with the thread's next libflame call.
 */
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

/*
 * flame_set_log_callback: installs the process-wide log hook.
 *
 * Parameters:
 *   fn         the hook; NULL = no logging (the default).
 *   user       passed back to fn unchanged; borrowed until the hook is replaced.
 *   max_level  the most verbose level delivered (FLAME_LOG_ERROR..FLAME_LOG_DEBUG).
 * Thread-safety: thread-safe. Once it returns, no line reaches the previous hook (it waits for
 *   lines being delivered), and every line reaches a hook with that hook's own user pointer.
 *   Not to be called from a hook (it would wait for itself).
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG for max_level outside FLAME_LOG_ERROR..FLAME_LOG_DEBUG
 *   (the message names it; the previous hook stays).
 */
FLAME_API flame_status flame_set_log_callback(flame_log_fn fn, void *user, flame_log_level max_level);

/* ---------------------------------------------------------------- model */

typedef struct flame_model flame_model;

/*
 * flame_model_load: loads a flame model file.
 *
 * The file is one safetensors file with a "flame.config" metadata entry
 * (docs/model-format.md). It is mmap'ed read-only and validated completely before any weight
 * is read; F32 weights are used in place, F16/BF16 ones converted once to float32, and int8
 * row-wise quantized tables (I8 + per-row scale and bias) are kept int8 and used in place:
 * every reader dequantizes them on the fly (docs/model-format.md, "int8 tables"). The file
 * may be removed or renamed after return, but not truncated or rewritten in place while the
 * model lives: the mapping reads it (a lost page faults with SIGBUS; rewritten bytes are
 * read unchecked). Replace a model's file by renaming a new one over it.
 *
 * Parameters:
 *   path     file name, NUL-terminated; borrowed.
 *   out      receives the model; the caller's, freed with flame_model_destroy. Engines made
 *            from the model hold a reference, so it may be destroyed before them.
 * Thread-safety: thread-safe; a loaded model is immutable and may be shared by any number of
 *   threads.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL path or out); FLAME_ERR_IO (cannot open, stat
 *   or map the file); FLAME_ERR_FORMAT (any check of docs/model-format.md fails, among them
 *   bytes of the data buffer outside every tensor, duplicate JSON keys and NaN or Inf weights;
 *   the message names the file, the tensor or config key and the limit or offending value);
 *   FLAME_ERR_NOMEM. On failure *out is NULL.
 * Math: the architecture the config describes, docs/model-format.md.
 */
FLAME_API flame_status flame_model_load(const char *path, flame_model **out);

/*
 * flame_model_create_random: a model with deterministic random weights.
 *
 * For tests, benchmarks and the embedded default. The same seed and config give
 * bitwise-identical weights on every platform.
 *
 * Parameters:
 *   config_json  a flame.config JSON document (docs/model-format.md), NUL-terminated; borrowed.
 *   seed         the generator's seed.
 *   out          receives the model; ownership as flame_model_load.
 * Thread-safety: thread-safe; the model as flame_model_load's.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL config_json or out); FLAME_ERR_FORMAT (config
 *   invalid or out of range: the message names the key); FLAME_ERR_NOMEM. On failure *out is
 *   NULL.
 * Math: splitmix64 (Steele, Lea and Flood, OOPSLA 2014) draws linear weights and tables uniform
 *   in [-1/sqrt(in), 1/sqrt(in)], biases 0.01 x uniform, LayerNorm weights 1 + 0.1 x uniform.
 */
FLAME_API flame_status flame_model_create_random(const char *config_json, uint64_t seed, flame_model **out);

/*
 * flame_default_model_config: the embedded default configuration.
 *
 * The reference GR ranking architecture (pre-LN, SUMI, 3 sigmoid task heads, 4 single-id
 * features per token pooled and projected), scaled to d_model 256 and 4 blocks so that a
 * 2-core CPU scores a request in milliseconds. Give it to flame_model_create_random.
 *
 * Parameters: none.
 * Thread-safety: thread-safe.
 * Returns: a static flame.config JSON document (never NULL; not to be freed).
 */
FLAME_API const char *flame_default_model_config(void);

/*
 * flame_model_destroy: releases the caller's reference to a model.
 *
 * The memory (and the file mapping) goes when the last engine using the model is destroyed
 * too.
 *
 * Parameters:
 *   model    the caller's model; NULL is a no-op.
 * Thread-safety: not concurrently with the caller's other uses of the same handle; engines
 *   using the model hold their own reference and may go on scoring.
 * Returns: nothing.
 */
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

/*
 * flame_model_get_info: a model's dimensions.
 *
 * Parameters:
 *   model    the model.
 *   info     written up to info->struct_size bytes (the struct_size rule); the caller sets
 *            struct_size.
 * Thread-safety: thread-safe.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL model or info, info->struct_size outside
 *   8..4096; *info untouched).
 */
FLAME_API flame_status flame_model_get_info(const flame_model *model, flame_model_info *info);

/* ---------------------------------------------------------------- configuration */

typedef struct flame_config flame_config;

/* The config's messages name an option as it is spelt here ("FLAME_OPT_DTYPE"); a value that
 * is no option is given as its number ("option 99"). */
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
     * pay for a capture. 0 = never capture. Up to 32 graphs per executor, least recently
     * used dropped first. */
    FLAME_OPT_CUDA_GRAPHS = 8,
    /* int: CPU threads one call runs on (the calling thread and libflame's own thread pool,
     * for the whole pass): the GEMMs, the dot head, and the per-request work (embedding bags,
     * attention per request and head, LayerNorm). On a CPU with AVX2 the pass calls no BLAS,
     * so no BLAS threads run beside these; on one without, the GEMMs go to the BLAS between
     * the parallel sections. 0 (default) = as many as the BLAS library uses
     * (OPENBLAS_NUM_THREADS), so one knob sets both; 1..256 otherwise. Results do not depend
     * on it (bitwise). Calls made at once share the pool: one call's sections run on it, the
     * others' on their own calling threads (the same bits). */
    FLAME_OPT_THREADS = 9,

    /* pointer: an item cache (flame/features.h) the engine fills the side features of
     * id-only requests from (flame_score); NULL (default) = none. The engine takes a reference
     * at creation, so the cache may be destroyed by the caller after flame_engine_create; until
     * then the caller keeps it alive (the config stores the pointer as given). Its records
     * must have the model's num_side_features slots. */
    FLAME_OPT_ITEM_CACHE = 10,
    /* pointer: a user cache handle (flame/memory.h) requests with history_from_user_cache = 1
     * read their history from; NULL (default) = none. Held as FLAME_OPT_ITEM_CACHE is. */
    FLAME_OPT_USER_CACHE = 11,
    /* int: the GPU engine's SUMI attention kernel. 0 (default) = chosen per launch by head
     * dim, dtype, GPU and size (on compute capability 9.0 the wgmma kernel for head dims 64
     * and 128 once a launch fills about a third of the GPU; docs/benchmarks.md); 1 = the
     * portable tensor-core kernel (mma.sync) on every GPU, to compare the two or to rule the
     * Hopper kernel out. Results agree within the compute dtype's rounding either way. */
    FLAME_OPT_CUDA_ATTENTION = 12,
    /* string: the CPU engine's kernels for its GEMMs (encoder, sumi head MLP, users sharing
     * candidates) and its dot head. "auto" (default) = libflame's own kernels in the widest
     * instruction set the CPU has (AVX-512F, else AVX2 with FMA), else the BLAS library;
     * "avx512" or "avx2" = libflame's kernels in that set; "blas" = the BLAS library
     * (OpenBLAS) for the GEMMs and the contiguous dot head, libflame's kernels for the rest.
     * Every choice gives scores within 1e-5 of a float64 evaluation; "avx512" and "avx2"
     * give the same bits. A choice the CPU lacks fails flame_engine_create with
     * FLAME_ERR_UNSUPPORTED (the message names the choice and what the CPU has). The chosen
     * kernels are logged at debug level ("CPU kernels: ..."). Ignored by GPU engines. */
    FLAME_OPT_CPU_KERNELS = 13,
    /* int: bytes of the engine's user-history KV cache (docs/kv-cache.md): every layer's K and
     * V of the history tokens of requests with kv_cache = 1, kept per user so that scoring the
     * same user again computes only the candidate tokens (and an extended history only its new
     * items). Host memory on the CPU engine, 2 * num_blocks * d_model * 4 bytes a token; device
     * memory on the GPU engine, in the compute dtype (2 * num_blocks * d_model * 2 bytes a
     * token in fp16/bf16), allocated at flame_engine_create and counted in
     * FLAME_OPT_DEVICE_MEMORY_BUDGET and the stats' device_bytes.
     * 0 (default) = no cache; else 1..2^50, at least one block (FLAME_OPT_KV_CACHE_BLOCK_TOKENS
     * tokens). */
    FLAME_OPT_KV_CACHE_BYTES = 14,
    /* int: tokens a block of the KV cache holds (its unit of allocation), 1..4096, default 16. */
    FLAME_OPT_KV_CACHE_BLOCK_TOKENS = 15,
    /* string: the GPU engine's batch profiles, "UxC[xL],..." (at most 16): users (1..65536) x
     * candidates per user (1..2^24) x history window (1..2^24; left out = the pass's longest
     * window rounded up to a power of two, at least 16, at most the model's max_len). A pass
     * of SUMI-head requests without kv_cache that some profile holds (at most U users, each
     * with at most C candidates and a history window of at most L) is padded to the profile
     * with the fewest tokens U x (L + C): each user gets L + C token slots, the unused ones
     * are padding tokens that attend only to themselves, padding users are whole slots of
     * padding, and no padding score is ever written to the caller. Every pass of a profile
     * then has one shape and replays one CUDA graph (FLAME_OPT_CUDA_GRAPHS), so varying
     * history lengths and candidate counts capture nothing new once each profile has run
     * twice; a real score does not depend on the padding (the same bits whatever else the
     * pass holds). Passes no profile holds, dot-head passes and kv_cache requests run at
     * their own shape. "" (default) = none; a scheduler created on the engine then gives it
     * its own profiles (users x candidates, histories in power-of-two buckets). Ignored by
     * CPU engines. A malformed list is FLAME_ERR_INVALID_ARG naming the profile. */
    FLAME_OPT_BATCH_PROFILES = 16
} flame_option;

/*
 * flame_config_create: a configuration holding the defaults of every option.
 *
 * The configuration of engines, read by flame_engine_create; an engine copies what it needs
 * (and takes its own references to the caches named), so a config may be changed, reused or
 * destroyed right after.
 *
 * Parameters:
 *   out      receives the config; the caller's, freed with flame_config_destroy.
 * Thread-safety: thread-safe; the handle itself is not (no concurrent set and get on one
 *   config).
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL out); FLAME_ERR_NOMEM.
 */
FLAME_API flame_status flame_config_create(flame_config **out);

/*
 * flame_config_destroy: frees a configuration.
 *
 * Parameters:
 *   config   the caller's config; NULL is a no-op.
 * Thread-safety: not concurrently with other calls on the same config.
 * Returns: nothing.
 */
FLAME_API void flame_config_destroy(flame_config *config);

/*
 * flame_config_set_int: sets an integer option.
 *
 * Parameters:
 *   config   the config.
 *   option   an integer option of flame_option.
 *   value    within the option's range (its comment above).
 * Thread-safety: not concurrently with other calls on the same config.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL config, an option that is not an integer
 *   option, a value out of range: the message names the option and its bounds). The stored
 *   value is unchanged on failure.
 */
FLAME_API flame_status flame_config_set_int(flame_config *config, flame_option option, int64_t value);

/*
 * flame_config_get_int: reads an integer option.
 *
 * Parameters:
 *   config   the config.
 *   option   an integer option of flame_option.
 *   value    receives the value.
 * Thread-safety: concurrent gets are safe; not concurrently with a set on the same config.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL config or value, an option that is not an
 *   integer option: the message names it; *value untouched).
 */
FLAME_API flame_status flame_config_get_int(const flame_config *config, flame_option option, int64_t *value);

/*
 * flame_config_set_string: sets a string option (FLAME_OPT_DEVICE, FLAME_OPT_DTYPE,
 * FLAME_OPT_CPU_KERNELS, FLAME_OPT_BATCH_PROFILES).
 *
 * Parameters:
 *   config   the config.
 *   option   a string option of flame_option.
 *   value    one of the option's values (its comment above), NUL-terminated; copied.
 * Thread-safety: not concurrently with other calls on the same config.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL config or value, an option that is not a
 *   string option, a value not among the option's: the message names it and the accepted
 *   values). The stored value is unchanged on failure.
 */
FLAME_API flame_status flame_config_set_string(flame_config *config, flame_option option, const char *value);

/*
 * flame_config_get_string: reads a string option.
 *
 * The size convention of flame_metrics_text: buf = NULL with buf_len = 0 asks for the size
 * alone (FLAME_ERR_BUFFER_TOO_SMALL with *needed set), so a caller can allocate exactly:
 *
 *     size_t need;
 *     flame_config_get_string(cfg, FLAME_OPT_BATCH_PROFILES, NULL, 0, &need);
 *     char *s = malloc(need);   (then the same call with s, need)
 *
 * Parameters:
 *   config   the config.
 *   option   a string option of flame_option.
 *   buf      out: the value with its NUL; [buf_len] bytes, the caller's; written only when it
 *            fits whole. NULL only with buf_len 0.
 *   buf_len  capacity of buf in bytes.
 *   needed   out (may be NULL): bytes the value takes with its NUL, set with FLAME_OK and
 *            FLAME_ERR_BUFFER_TOO_SMALL; 0 with any other status.
 * Thread-safety: concurrent gets are safe; not concurrently with a set on the same config.
 * Returns: FLAME_OK; FLAME_ERR_BUFFER_TOO_SMALL when buf_len < *needed, the size query
 *   included (the message names the option and gives both sizes); FLAME_ERR_INVALID_ARG (NULL
 *   config, NULL buf with buf_len > 0, an option that is not a string option: the message
 *   names it). buf is untouched on failure.
 */
FLAME_API flame_status flame_config_get_string(const flame_config *config, flame_option option, char *buf,
                                               size_t buf_len, size_t *needed);

/*
 * flame_config_set_pointer: sets a pointer option (FLAME_OPT_CUDA_STREAM, FLAME_OPT_ITEM_CACHE,
 * FLAME_OPT_USER_CACHE).
 *
 * Parameters:
 *   config   the config.
 *   option   a pointer option of flame_option.
 *   value    stored as given, never dereferenced by the config; NULL restores the default.
 * Thread-safety: not concurrently with other calls on the same config.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL config, an option that is not a pointer
 *   option: the message names it).
 */
FLAME_API flame_status flame_config_set_pointer(flame_config *config, flame_option option, void *value);

/*
 * flame_config_get_pointer: reads a pointer option.
 *
 * Parameters:
 *   config   the config.
 *   option   a pointer option of flame_option.
 *   value    receives the pointer.
 * Thread-safety: concurrent gets are safe; not concurrently with a set on the same config.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL config or value, an option that is not a
 *   pointer option: the message names it; *value untouched).
 */
FLAME_API flame_status flame_config_get_pointer(const flame_config *config, flame_option option, void **value);

/* ---------------------------------------------------------------- engine */

typedef struct flame_engine flame_engine;

/*
 * flame_engine_create: an engine that scores with a model.
 *
 * On a GPU the weights are uploaded once, here; concurrent calls then run on the engine's
 * executors (FLAME_OPT_CUDA_EXECUTORS, each with its own stream and buffers) and wait for a
 * free one when all are busy; with FLAME_OPT_CUDA_STREAM there is one executor, on that
 * stream.
 *
 * Parameters:
 *   model    the model; the engine holds a reference to it.
 *   config   the options, copied; NULL = the defaults. The caches it names
 *            (FLAME_OPT_ITEM_CACHE, FLAME_OPT_USER_CACHE) are the engine's for its whole
 *            life: it takes a reference to each (flame_engine_set_item_cache and
 *            flame_engine_set_user_cache describe what they do).
 *   out      receives the engine; the caller's, freed with flame_engine_destroy.
 * Thread-safety: thread-safe. On the engine made, flame_score and flame_score_batch may be
 *   called concurrently from any number of threads: each call takes a private scratch
 *   workspace from the engine's pool, so calls never share buffers, and results do not depend
 *   on concurrency (bitwise identical).
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL model or out, an item cache whose records have
 *   a slot count other than the model's num_side_features: the message gives both; a
 *   FLAME_OPT_KV_CACHE_BYTES budget that holds no block of FLAME_OPT_KV_CACHE_BLOCK_TOKENS
 *   tokens: the message gives both options and the block's bytes);
 *   FLAME_ERR_NO_DEVICE
 *   ("cuda"/"cuda:N" asked for but this build or machine has no such GPU, or cuBLASLt cannot
 *   be loaded: the message says why); FLAME_ERR_UNSUPPORTED (a GPU engine for a model the CUDA backend cannot run: head
 *   dimension above 128); FLAME_ERR_NOMEM (host memory, or GPU memory (the KV cache's blocks included) /
 *   FLAME_OPT_DEVICE_MEMORY_BUDGET exceeded: the message gives the bytes needed and the
 *   limit); FLAME_ERR_INTERNAL (a mutex could not be made). On failure *out is NULL.
 */
FLAME_API flame_status flame_engine_create(flame_model *model, const flame_config *config, flame_engine **out);

/*
 * flame_engine_destroy: destroys an engine.
 *
 * Releases its references to the model and to the caches it was given.
 *
 * Parameters:
 *   engine   the caller's engine; NULL is a no-op.
 * Thread-safety: the caller guarantees that no call on the engine is running or will start
 *   (schedulers over it are destroyed first).
 * Returns: nothing.
 */
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
    /* With kv_cache = 1, the version of this user's history window: any non-zero value the
     * caller changes whenever the history (ids or side features) changes. Contract: the
     * engine trusts it, so a reused version with another history of the same length scores
     * against the history cached under it. 0 = the engine hashes the window (ids and side
     * bags, 64 bits) on every call, which detects a changed history by itself. */
    uint64_t history_version;
    /* 1: the engine's KV cache (FLAME_OPT_KV_CACHE_BYTES) keeps this user's history K/V under
     * user_id (docs/kv-cache.md); the scores are those of kv_cache = 0 within the compute
     * dtype's rounding. Needs an engine with a KV cache. 0 (default): not cached. */
    int32_t kv_cache;
    uint32_t reserved0;             /* 0: what would be trailing padding (the no-padding rule at the
                                     * top of this header) */
} flame_request;

/*
 * flame_score: scores one request's candidates.
 *
 * History from the user cache (history_from_user_cache = 1): the engine reads user_id's record
 * in its user cache (flame_engine_set_user_cache; record convention there) and scores as if
 * the record's history had been passed in `history`. A miss (no record, or an expired one)
 * scores with an empty history, as a request with history_len 0 would. With a model that has
 * side features such a request is an id-only one (it gives no history_side): the bags come
 * from the engine's item cache (flame_engine_set_item_cache), which then fills the
 * candidates' bags too (candidate_side must be NULL under the sumi head); without an item
 * cache a non-empty history from the user cache is refused as any id-only request is
 * ("history_side is NULL"). Id-only and user-cache requests still set num_side_features to
 * the model's count (with the bag pointers NULL). An empty candidate list returns FLAME_OK
 * and writes nothing.
 *
 * Parameters:
 *   engine      the engine.
 *   request     read by the struct_size rule (the fields an older header's request lacks read
 *               as 0); borrowed, with every array it points to, for the call; not modified.
 *   scores      output, float32, row-major [num_candidates, num_tasks]:
 *               scores[c * num_tasks + t]; the caller's. Nothing beyond num_candidates *
 *               num_tasks is written, and on any error nothing at all. Its num_candidates *
 *               num_tasks floats share no byte with the request or an array it points to
 *               (scores are written while they are still read).
 *   scores_len  capacity of scores in floats.
 * Thread-safety: thread-safe, concurrently with any other scoring call on the same engine
 *   (flame_engine_create).
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL engine or request, struct_size outside
 *   8..4096, a non-zero reserved0 (the message names it), NULL scores or ids with a non-zero
 *   length, more than 2^24 candidates, an item or
 *   side-feature id < 0 or >= its table's rows (the message names token, feature and id), bad
 *   CSR offsets (flame_bags: offsets[0] != 0, decreasing, or a final offset other than
 *   num_ids), bags given for the history but not the candidates (or the reverse) under the
 *   sumi head, num_side_features other than the model's, history_from_user_cache not 0 or 1,
 *   1 with a history given, 1 on an engine with no user cache, kv_cache not 0 or 1, kv_cache
 *   1 on an engine without a KV cache (FLAME_OPT_KV_CACHE_BYTES 0), an item id of the user's cached
 *   history out of range (the message names the request, the user, the position in the
 *   record and the id), more than 2^31 - 1 tokens in one pass (lower FLAME_OPT_MAX_BATCH),
 *   scores overlapping the request or one of its arrays (the message names the array));
 *   FLAME_ERR_BUFFER_TOO_SMALL (scores_len < num_candidates * num_tasks: the message gives
 *   both); FLAME_ERR_NOMEM (scratch could not grow); with an item cache, its failures when a
 *   miss cannot be fetched (FLAME_ERR_UNAVAILABLE, FLAME_ERR_FORMAT); with a user cache,
 *   FLAME_ERR_IO (its shared object was truncated by another process); on a GPU,
 *   FLAME_ERR_UNSUPPORTED (cuBLASLt has no algorithm for a GEMM shape) and FLAME_ERR_INTERNAL
 *   (a CUDA call failed: the message names it; the scores of the passes before it, of
 *   FLAME_OPT_MAX_BATCH requests each, may then be written). A GPU engine scores each
 *   kv_cache = 1 request in a pass of its own, so there FLAME_ERR_NOMEM (the device buffers
 *   could not grow for a later pass) may also leave the earlier passes' scores written.
 * Math: docs/model-format.md: embedding bags -> position -> transformer blocks with the
 *   causal or SUMI mask (FLAME, arXiv:2509.22681; HSTU, arXiv:2402.17152) -> dot or sumi
 *   head. On the CPU float32 throughout, GEMMs through CBLAS; on the GPU in the engine's
 *   compute dtype (FLAME_OPT_DTYPE) with float32 accumulation.
 */
FLAME_API flame_status flame_score(flame_engine *engine, const flame_request *request, float *scores, size_t scores_len);

/*
 * flame_score_batch: scores several requests (users) in one call.
 *
 * Each request has its own history and candidates. Every request is validated before any is
 * computed, so on error nothing is written; the message names the request index. Token-wise
 * layers run over all requests' tokens as one GEMM, and requests sharing one contiguous
 * candidate range share one scoring GEMM.
 *
 * Parameters:
 *   engine        the engine.
 *   requests      [num_requests] of the caller's flame_request, stepped through by
 *                 requests[0].struct_size (the sizeof of the caller's flame.h; each request
 *                 is then read by the struct_size rule), so every request of one call comes
 *                 from the same header; borrowed for the call.
 *   num_requests  0 is valid (nothing is written).
 *   scores        output, float32: the per-request blocks of flame_score concatenated in
 *                 request order (request r's block starts at the sum of num_candidates *
 *                 num_tasks of the requests before it); the caller's; sharing no byte with
 *                 any request or its arrays (a pass writes its scores before the next reads its
 *                 requests).
 *   scores_len    capacity of scores in floats.
 * Thread-safety: thread-safe (flame_engine_create).
 * Returns: the statuses of flame_score; FLAME_ERR_INVALID_ARG also for NULL requests with
 *   num_requests > 0, requests[0].struct_size outside 8..4096 or not a multiple of 8 (no
 *   sizeof(flame_request) is), and a request whose struct_size differs from request 0's (the
 *   message names it and both sizes).
 * Math: as flame_score.
 */
FLAME_API flame_status flame_score_batch(flame_engine *engine, const flame_request *requests, size_t num_requests,
                                         float *scores, size_t scores_len);

/* Most candidates flame_score_batch_topk keeps per request. */
#define FLAME_TOPK_MAX 1024

/*
 * flame_score_batch_topk: the k best candidates of each request by one task's score.
 *
 * Full-sort retrieval: a request whose candidates are the whole item table (one contiguous
 * range 0..num_items-1, scored by one GEMM under the dot head) returns the k best items of the
 * catalogue. The requests are scored as flame_score_batch scores them, into memory of the
 * library's, and ranked per request: score descending (NaN last), ties by lower item id, then
 * by the earlier candidate. A GPU engine keeps the scores on the device and selects there, so
 * only k ids and scores a request come back (requests of 2^31 candidates or more excepted);
 * the CPU engine selects on the host. With FLAME_OPT_MAX_BATCH splitting a call into passes,
 * a failing pass leaves the earlier passes' rows written, as flame_score_batch does.
 *
 * Parameters:
 *   engine        the engine.
 *   requests      [num_requests] as flame_score_batch; borrowed for the call.
 *   num_requests  0 is valid (nothing is written).
 *   k             candidates kept per request, 1..FLAME_TOPK_MAX.
 *   task          the score column ranked by, 0..num_tasks - 1 (0 under the dot head).
 *   ids           output [num_requests, k] int64, the caller's: request r's best item ids at
 *                 r * k, best first; a request with fewer than k candidates has as many, then
 *                 -1.
 *   scores        output [num_requests, k] float32, the caller's: their scores of `task`;
 *                 -INFINITY where ids is -1.
 *   out_len       capacity of ids and of scores, in elements each.
 * Thread-safety: thread-safe (flame_engine_create).
 * Returns: FLAME_OK; the statuses of flame_score_batch (nothing is written then);
 *   FLAME_ERR_INVALID_ARG for a NULL engine, k outside 1..FLAME_TOPK_MAX, task outside the
 *   model's tasks, NULL requests with num_requests > 0, NULL ids or scores (the message names
 *   the value), ids or scores overlapping a request or one of its arrays (the selection reads
 *   the candidates while it writes them; the message names the request and the array);
 *   FLAME_ERR_BUFFER_TOO_SMALL when out_len < num_requests * k (names both);
 *   FLAME_ERR_NOMEM when the scores do not fit in host memory (4 bytes a candidate and task).
 */
FLAME_API flame_status flame_score_batch_topk(flame_engine *engine, const flame_request *requests, size_t num_requests,
                                              uint32_t k, uint32_t task, int64_t *ids, float *scores, size_t out_len);

typedef struct flame_engine_stats {
    size_t struct_size;            /* sizeof(flame_engine_stats) */
    uint64_t calls;                /* flame_score, flame_score_batch and flame_score_batch_topk calls that succeeded */
    uint64_t requests;             /* requests scored */
    uint64_t workspaces;           /* scratch workspaces created (= peak concurrent calls) */
    uint64_t scratch_bytes;        /* bytes held by all workspaces now */
    uint64_t max_workspace_bytes;  /* largest single workspace */
    uint64_t device_bytes;         /* GPU memory held: weights + activation buffers + GEMM workspace + KV cache blocks; 0 on the CPU */
    uint64_t device_weight_bytes;  /* of which weights (in the compute dtype; int8 tables as int8
                                      plus 8 bytes a row) */
    uint64_t graph_captures;       /* GPU passes captured as CUDA graphs (FLAME_OPT_CUDA_GRAPHS) */
    uint64_t graph_replays;        /* GPU passes run by replaying a captured graph */
    /* requests with history_from_user_cache = 1 of the calls that succeeded, whose user had
     * a record in the user cache (hits) or not, or an expired one (misses) */
    uint64_t user_cache_hits;
    uint64_t user_cache_misses;
    /* the KV cache (FLAME_OPT_KV_CACHE_BYTES; all 0 without one), over requests with
     * kv_cache = 1: every cached token of the window reused (hits), a cached prefix reused and
     * the new items computed (extensions), nothing reused (misses); users evicted for room;
     * bytes of blocks in use now and at most so far, and the budget (whole blocks); history
     * tokens computed and read from the cache instead (saved) */
    uint64_t kv_cache_hits;
    uint64_t kv_cache_misses;
    uint64_t kv_cache_extensions;
    uint64_t kv_cache_evictions;
    uint64_t kv_cache_bytes;
    uint64_t kv_cache_peak_bytes;
    uint64_t kv_cache_budget_bytes;
    uint64_t kv_cache_tokens_computed;
    uint64_t kv_cache_tokens_saved;
    /* GPU passes padded to a batch profile (FLAME_OPT_BATCH_PROFILES), and the padding
     * tokens they computed (token slots no request filled) */
    uint64_t profile_passes;
    uint64_t profile_padding_tokens;
} flame_engine_stats;

/*
 * flame_engine_get_stats: the engine's counters.
 *
 * Parameters:
 *   engine   the engine.
 *   stats    written up to stats->struct_size bytes (the struct_size rule); the caller sets
 *            struct_size.
 * Thread-safety: thread-safe, also while scoring runs (each counter is read atomically; the
 *   whole is not one snapshot).
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL engine or stats, stats->struct_size outside
 *   8..4096; *stats untouched).
 */
FLAME_API flame_status flame_engine_get_stats(flame_engine *engine, flame_engine_stats *stats);

/* The caches an engine can read features from (flame/features.h, flame/memory.h). */
struct flame_item_cache;
struct flame_user_cache;

/*
 * flame_engine_set_item_cache: attaches an item cache to an engine after its creation.
 *
 * Kept for 0.2.x programs written against it; an engine is best given its item cache at
 * creation (FLAME_OPT_ITEM_CACHE), so that it does not change while it may be scoring. With
 * a cache, a request that gives no side features (history_side NULL and, under the sumi head,
 * candidate_side NULL) to a model with side features gets them from the cache: one
 * flame_item_cache_get per call for all the distinct item ids of the call's requests
 * (history tokens inside the window, and the candidates under the sumi head); a missing
 * record gives empty bags (zero vectors). Requests that give their side features are scored
 * from them as before. Everything the cache does not give (item ids, lengths, the bags
 * given, the scores buffer) is checked before the cache is asked, so a call refused for it
 * fetches nothing and caches nothing; the bags from the cache are checked after (their side
 * ids must fit their tables). flame_score then also returns the cache's failure statuses
 * (FLAME_ERR_UNAVAILABLE, FLAME_ERR_FORMAT) when a miss cannot be fetched, and writes no
 * score.
 *
 * Parameters:
 *   engine   the engine.
 *   cache    the item cache (flame/features.h); the engine takes a reference and releases the
 *            one it held before. NULL detaches.
 * Thread-safety: not concurrently with any call on the engine (scoring reads the pointer
 *   without a lock).
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL engine, or the cache's records have a slot
 *   count other than the model's num_side_features: the message gives both; the engine keeps
 *   the cache it had).
 */
FLAME_API flame_status flame_engine_set_item_cache(flame_engine *engine, struct flame_item_cache *cache);

/*
 * flame_engine_set_user_cache: attaches a user cache to an engine after its creation.
 *
 * Kept for 0.2.x programs written against it; an engine is best given its user cache at
 * creation (FLAME_OPT_USER_CACHE), so that it does not change while it may be scoring. With
 * a cache, requests can give a user id and candidates only (flame_request.history_from_user_cache
 * = 1, flame_score). Record convention: slot 0 of a user's record holds the user's history,
 * item ids oldest first (the newest last, as flame_request.history); the engine uses its most
 * recent max_len ids (flame_model_info.max_len). Every id of slot 0 must be a valid item id
 * of the engine's model (0..num_items-1), else scoring that user fails with
 * FLAME_ERR_INVALID_ARG naming the user, the position in slot 0 and the id. Other slots and
 * the dense values are not read. Each such request costs one flame_user_cache_get into the
 * call's own workspace (no lock, no allocation once the workspace has grown); hits and misses
 * are counted in flame_engine_stats and, as any get, in the handle's flame_user_cache_stats.
 * A table whose max_ids is below the model's max_len is accepted (histories from it are then
 * at most max_ids long) and logged at FLAME_LOG_WARN.
 *
 * Parameters:
 *   engine   the engine.
 *   cache    the user cache handle (flame/memory.h); the engine takes a reference and releases
 *            the one it held before. NULL detaches.
 * Thread-safety: not concurrently with any call on the engine (scoring reads the pointer
 *   without a lock). Scoring calls then use the cache concurrently, from threads, while other
 *   processes may write the table: a record is read whole, before or after a write.
 * Returns: FLAME_OK; FLAME_ERR_INVALID_ARG (NULL engine).
 */
FLAME_API flame_status flame_engine_set_user_cache(flame_engine *engine, struct flame_user_cache *cache);

#ifdef __cplusplus
}
#endif

/* The rest of the API, one header per concern (each can also be included on its own). */
#include "flame/features.h"
#include "flame/memory.h"
#include "flame/scheduler.h"
#include "flame/kernels.h"
#include "flame/metrics.h"

#endif /* FLAME_FLAME_H */
