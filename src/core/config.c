/* flame_config: typed option setters with bounds (zstd's setParameter idiom). */
#include <stdlib.h>
#include <string.h>

#include "core/options.h"
#include "engine/batch_profiles.h"

typedef struct int_option {
    flame_option option;
    const char *name;
    int64_t min, max;
    size_t offset;
} int_option;

static const int_option int_options[] = {
    {FLAME_OPT_MAX_BATCH, "FLAME_OPT_MAX_BATCH", 1, 65536, offsetof(struct flame_config, max_batch)},
    {FLAME_OPT_DEVICE_MEMORY_BUDGET, "FLAME_OPT_DEVICE_MEMORY_BUDGET", 0, (int64_t)1 << 50,
     offsetof(struct flame_config, device_memory_budget)},
    {FLAME_OPT_CUDA_EXECUTORS, "FLAME_OPT_CUDA_EXECUTORS", 1, 16, offsetof(struct flame_config, cuda_executors)},
    {FLAME_OPT_CUDA_GRAPHS, "FLAME_OPT_CUDA_GRAPHS", 0, 1, offsetof(struct flame_config, cuda_graphs)},
    {FLAME_OPT_CUDA_ATTENTION, "FLAME_OPT_CUDA_ATTENTION", 0, 1, offsetof(struct flame_config, cuda_attention)},
    {FLAME_OPT_THREADS, "FLAME_OPT_THREADS", 0, 256, offsetof(struct flame_config, threads)},
    {FLAME_OPT_KV_CACHE_BYTES, "FLAME_OPT_KV_CACHE_BYTES", 0, (int64_t)1 << 50, offsetof(struct flame_config, kv_cache_bytes)},
    {FLAME_OPT_KV_CACHE_BLOCK_TOKENS, "FLAME_OPT_KV_CACHE_BLOCK_TOKENS", 1, 4096,
     offsetof(struct flame_config, kv_cache_block_tokens)},
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
    const int_option *o = find_int(option);
    if (!o) return fl_error(FLAME_ERR_INVALID_ARG, "option %d is not an integer option", (int)option);
    if (value < o->min || value > o->max)
        return fl_error(FLAME_ERR_INVALID_ARG, "%s = %lld is out of range [%lld, %lld]", o->name, (long long)value,
                        (long long)o->min, (long long)o->max);
    *(int64_t *)((char *)config + o->offset) = value;
    return FLAME_OK;
}

FLAME_API flame_status flame_config_get_int(const flame_config *config, flame_option option, int64_t *value)
{
    fl_clear_error();
    if (!config || !value) return fl_error(FLAME_ERR_INVALID_ARG, "flame_config_get_int: NULL argument");
    const int_option *o = find_int(option);
    if (!o) return fl_error(FLAME_ERR_INVALID_ARG, "option %d is not an integer option", (int)option);
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

static const char *string_option_name(flame_option o)
{
    return o == FLAME_OPT_DEVICE          ? "FLAME_OPT_DEVICE"
           : o == FLAME_OPT_DTYPE         ? "FLAME_OPT_DTYPE"
           : o == FLAME_OPT_BATCH_PROFILES ? "FLAME_OPT_BATCH_PROFILES"
                                          : "FLAME_OPT_CPU_KERNELS";
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
    size_t cap = 0;
    char *slot = string_slot(config, option, &cap);
    if (!slot) return fl_error(FLAME_ERR_INVALID_ARG, "option %d is not a string option", (int)option);
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
        return fl_error(FLAME_ERR_INVALID_ARG, "%s = '%.40s' is not one of %s", string_option_name(option), value,
                        string_option_values(option));
    strcpy(slot, value);
    return FLAME_OK;
}

FLAME_API flame_status flame_config_get_string(const flame_config *config, flame_option option, char *buf,
                                               size_t buf_len)
{
    fl_clear_error();
    if (!config || !buf) return fl_error(FLAME_ERR_INVALID_ARG, "flame_config_get_string: NULL argument");
    size_t cap = 0;
    const char *slot = string_slot((struct flame_config *)config, option, &cap);
    if (!slot) return fl_error(FLAME_ERR_INVALID_ARG, "option %d is not a string option", (int)option);
    size_t n = strlen(slot) + 1;
    if (n > buf_len)
        return fl_error(FLAME_ERR_BUFFER_TOO_SMALL, "option %d needs %zu bytes, buffer has %zu", (int)option, n,
                        buf_len);
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
    void **slot = pointer_slot(config, option);
    if (!slot) return fl_error(FLAME_ERR_INVALID_ARG, "option %d is not a pointer option", (int)option);
    *slot = value;
    return FLAME_OK;
}

FLAME_API flame_status flame_config_get_pointer(const flame_config *config, flame_option option, void **value)
{
    fl_clear_error();
    if (!config || !value) return fl_error(FLAME_ERR_INVALID_ARG, "flame_config_get_pointer: NULL argument");
    void **slot = pointer_slot((struct flame_config *)config, option);
    if (!slot) return fl_error(FLAME_ERR_INVALID_ARG, "option %d is not a pointer option", (int)option);
    *value = *slot;
    return FLAME_OK;
}
