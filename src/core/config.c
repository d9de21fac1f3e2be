/* flame_config: typed option setters with bounds (zstd's setParameter idiom). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/options.h"
#include "engine/batch_profiles.h"

/* Every option's name, so that messages say which option (the caller wrote the name, not its
 * number). Indexed by value; a gap (3, a retired option) is NULL. */
static const char *const option_names[] = {
    [FLAME_OPT_DEVICE] = "FLAME_OPT_DEVICE",
    [FLAME_OPT_MAX_BATCH] = "FLAME_OPT_MAX_BATCH",
    [FLAME_OPT_DTYPE] = "FLAME_OPT_DTYPE",
    [FLAME_OPT_DEVICE_MEMORY_BUDGET] = "FLAME_OPT_DEVICE_MEMORY_BUDGET",
    [FLAME_OPT_CUDA_STREAM] = "FLAME_OPT_CUDA_STREAM",
    [FLAME_OPT_CUDA_EXECUTORS] = "FLAME_OPT_CUDA_EXECUTORS",
    [FLAME_OPT_CUDA_GRAPHS] = "FLAME_OPT_CUDA_GRAPHS",
    [FLAME_OPT_THREADS] = "FLAME_OPT_THREADS",
    [FLAME_OPT_ITEM_CACHE] = "FLAME_OPT_ITEM_CACHE",
    [FLAME_OPT_USER_CACHE] = "FLAME_OPT_USER_CACHE",
    [FLAME_OPT_CUDA_ATTENTION] = "FLAME_OPT_CUDA_ATTENTION",
    [FLAME_OPT_CPU_KERNELS] = "FLAME_OPT_CPU_KERNELS",
    [FLAME_OPT_KV_CACHE_BYTES] = "FLAME_OPT_KV_CACHE_BYTES",
    [FLAME_OPT_KV_CACHE_BLOCK_TOKENS] = "FLAME_OPT_KV_CACHE_BLOCK_TOKENS",
    [FLAME_OPT_BATCH_PROFILES] = "FLAME_OPT_BATCH_PROFILES",
};

/* The option's name, or "option N" for a value that is no option (written into `tmp`). The
 * value is read as unsigned so that a negative one cannot index the table. */
typedef struct option_label {
    char text[32];
} option_label;

static const char *option_name(flame_option o, option_label *tmp)
{
    const unsigned v = (unsigned)o;
    if (v < sizeof option_names / sizeof option_names[0] && option_names[v]) return option_names[v];
    snprintf(tmp->text, sizeof tmp->text, "option %d", (int)o);
    return tmp->text;
}

typedef struct int_option {
    flame_option option;
    int64_t min, max;
    size_t offset;
} int_option;

static const int_option int_options[] = {
    {FLAME_OPT_MAX_BATCH, 1, 65536, offsetof(struct flame_config, max_batch)},
    {FLAME_OPT_DEVICE_MEMORY_BUDGET, 0, (int64_t)1 << 50, offsetof(struct flame_config, device_memory_budget)},
    {FLAME_OPT_CUDA_EXECUTORS, 1, 16, offsetof(struct flame_config, cuda_executors)},
    {FLAME_OPT_CUDA_GRAPHS, 0, 1, offsetof(struct flame_config, cuda_graphs)},
    {FLAME_OPT_CUDA_ATTENTION, 0, 1, offsetof(struct flame_config, cuda_attention)},
    {FLAME_OPT_THREADS, 0, 256, offsetof(struct flame_config, threads)},
    {FLAME_OPT_KV_CACHE_BYTES, 0, (int64_t)1 << 50, offsetof(struct flame_config, kv_cache_bytes)},
    {FLAME_OPT_KV_CACHE_BLOCK_TOKENS, 1, 4096, offsetof(struct flame_config, kv_cache_block_tokens)},
};

void fl_config_defaults(struct flame_config *c)
{
    memset(c, 0, sizeof *c);
    strcpy(c->device, "cpu");
    strcpy(c->dtype, "fp32");
    strcpy(c->cpu_kernels, "auto");
    c->max_batch = 256;
    c->cuda_executors = 2;
    c->cuda_graphs = 1;
    c->kv_cache_block_tokens = 16;
}

fl_dtype_opt fl_config_dtype(const struct flame_config *c)
{
    return !strcmp(c->dtype, "fp16") ? FL_COMPUTE_FP16 : !strcmp(c->dtype, "bf16") ? FL_COMPUTE_BF16 : FL_COMPUTE_FP32;
}

static const int_option *find_int(flame_option o)
{
    for (size_t i = 0; i < sizeof int_options / sizeof int_options[0]; i++)
        if (int_options[i].option == o) return &int_options[i];
    return NULL;
}

FLAME_API flame_status flame_config_create(flame_config **out)
{
    fl_clear_error();
    if (!out) return fl_error(FLAME_ERR_INVALID_ARG, "flame_config_create: out is NULL");
    *out = malloc(sizeof **out);
    if (!*out) return fl_error(FLAME_ERR_NOMEM, "flame_config_create: out of memory");
    fl_config_defaults(*out);
    return FLAME_OK;
}

FLAME_API void flame_config_destroy(flame_config *config)
{
    free(config);
}

FLAME_API flame_status flame_config_set_int(flame_config *config, flame_option option, int64_t value)
{
    fl_clear_error();
    if (!config) return fl_error(FLAME_ERR_INVALID_ARG, "flame_config_set_int: config is NULL");
    option_label l;
    const int_option *o = find_int(option);
    if (!o) return fl_error(FLAME_ERR_INVALID_ARG, "%s is not an integer option", option_name(option, &l));
    if (value < o->min || value > o->max)
        return fl_error(FLAME_ERR_INVALID_ARG, "%s = %lld is out of range [%lld, %lld]", option_name(option, &l),
                        (long long)value, (long long)o->min, (long long)o->max);
    *(int64_t *)((char *)config + o->offset) = value;
    return FLAME_OK;
}

FLAME_API flame_status flame_config_get_int(const flame_config *config, flame_option option, int64_t *value)
{
    fl_clear_error();
    if (!config || !value) return fl_error(FLAME_ERR_INVALID_ARG, "flame_config_get_int: NULL argument");
    option_label l;
    const int_option *o = find_int(option);
    if (!o) return fl_error(FLAME_ERR_INVALID_ARG, "%s is not an integer option", option_name(option, &l));
    *value = *(const int64_t *)((const char *)config + o->offset);
    return FLAME_OK;
}

/* "cpu", "auto", "cuda" or "cuda:N" with N a decimal ordinal < 1024. */
static bool valid_device(const char *s)
{
    if (!strcmp(s, "cpu") || !strcmp(s, "auto") || !strcmp(s, "cuda")) return true;
    if (strncmp(s, "cuda:", 5) != 0 || !s[5]) return false;
    size_t n = strspn(s + 5, "0123456789");
    return s[5 + n] == '\0' && n <= 4 && atoi(s + 5) < 1024;
}

/* The string options: where each lives and what it accepts. */
static char *string_slot(struct flame_config *c, flame_option o, size_t *cap)
{
    switch (o) {
    case FLAME_OPT_DEVICE: *cap = sizeof c->device; return c->device;
    case FLAME_OPT_DTYPE: *cap = sizeof c->dtype; return c->dtype;
    case FLAME_OPT_CPU_KERNELS: *cap = sizeof c->cpu_kernels; return c->cpu_kernels;
    case FLAME_OPT_BATCH_PROFILES: *cap = sizeof c->batch_profiles; return c->batch_profiles;
    default: return NULL;
    }
}

static bool valid_string(flame_option o, const char *v)
{
    if (o == FLAME_OPT_DEVICE) return valid_device(v);
    if (o == FLAME_OPT_CPU_KERNELS)
        return !strcmp(v, "auto") || !strcmp(v, "avx512") || !strcmp(v, "avx2") || !strcmp(v, "blas");
    return !strcmp(v, "fp32") || !strcmp(v, "fp16") || !strcmp(v, "bf16");
}

static const char *string_option_values(flame_option o)
{
    return o == FLAME_OPT_DEVICE ? "cpu, auto, cuda, cuda:N"
           : o == FLAME_OPT_DTYPE ? "fp32, fp16, bf16"
                                  : "auto, avx512, avx2, blas";
}

FLAME_API flame_status flame_config_set_string(flame_config *config, flame_option option, const char *value)
{
    fl_clear_error();
    if (!config || !value) return fl_error(FLAME_ERR_INVALID_ARG, "flame_config_set_string: NULL argument");
    option_label l;
    size_t cap = 0;
    char *slot = string_slot(config, option, &cap);
    if (!slot) return fl_error(FLAME_ERR_INVALID_ARG, "%s is not a string option", option_name(option, &l));
    if (option == FLAME_OPT_BATCH_PROFILES) { /* checked by its parser, whose message names the bad profile */
        fl_batch_profiles ps;
        if (strlen(value) >= cap)
            return fl_error(FLAME_ERR_INVALID_ARG, "FLAME_OPT_BATCH_PROFILES: '%.40s...' is longer than %zu characters",
                            value, cap - 1);
        const flame_status st = fl_batch_profiles_parse(value, &ps);
        if (st) return st;
        strcpy(slot, value);
        return FLAME_OK;
    }
    if (strlen(value) >= cap || !valid_string(option, value))
        return fl_error(FLAME_ERR_INVALID_ARG, "%s = '%.40s' is not one of %s", option_name(option, &l), value,
                        string_option_values(option));
    strcpy(slot, value);
    return FLAME_OK;
}

/* flame_metrics_text's convention: `needed` gets the size with the NUL whether or not it fit,
 * so buf = NULL with buf_len = 0 asks for the size alone; buf is written only whole. */
FLAME_API flame_status flame_config_get_string(const flame_config *config, flame_option option, char *buf,
                                               size_t buf_len, size_t *needed)
{
    fl_clear_error();
    if (needed) *needed = 0;
    if (!config) return fl_error(FLAME_ERR_INVALID_ARG, "flame_config_get_string: config is NULL");
    if (!buf && buf_len)
        return fl_error(FLAME_ERR_INVALID_ARG, "flame_config_get_string: buf is NULL with buf_len %zu", buf_len);
    option_label l;
    size_t cap = 0;
    const char *slot = string_slot((struct flame_config *)config, option, &cap);
    if (!slot) return fl_error(FLAME_ERR_INVALID_ARG, "%s is not a string option", option_name(option, &l));
    const size_t n = strlen(slot) + 1;
    if (needed) *needed = n;
    if (n > buf_len)
        return fl_error(FLAME_ERR_BUFFER_TOO_SMALL, "%s needs %zu bytes with its NUL, buf has %zu",
                        option_name(option, &l), n, buf_len);
    memcpy(buf, slot, n);
    return FLAME_OK;
}

/* The pointer options: where each lives. */
static void **pointer_slot(struct flame_config *c, flame_option o)
{
    switch (o) {
    case FLAME_OPT_CUDA_STREAM: return &c->cuda_stream;
    case FLAME_OPT_ITEM_CACHE: return (void **)&c->item_cache;
    case FLAME_OPT_USER_CACHE: return (void **)&c->user_cache;
    default: return NULL;
    }
}

FLAME_API flame_status flame_config_set_pointer(flame_config *config, flame_option option, void *value)
{
    fl_clear_error();
    if (!config) return fl_error(FLAME_ERR_INVALID_ARG, "flame_config_set_pointer: config is NULL");
    option_label l;
    void **slot = pointer_slot(config, option);
    if (!slot) return fl_error(FLAME_ERR_INVALID_ARG, "%s is not a pointer option", option_name(option, &l));
    *slot = value;
    return FLAME_OK;
}

FLAME_API flame_status flame_config_get_pointer(const flame_config *config, flame_option option, void **value)
{
    fl_clear_error();
    if (!config || !value) return fl_error(FLAME_ERR_INVALID_ARG, "flame_config_get_pointer: NULL argument");
    option_label l;
    void **slot = pointer_slot((struct flame_config *)config, option);
    if (!slot) return fl_error(FLAME_ERR_INVALID_ARG, "%s is not a pointer option", option_name(option, &l));
    *value = *slot;
    return FLAME_OK;
}
