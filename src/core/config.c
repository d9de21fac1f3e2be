/* flame_config: typed option setters with bounds (zstd's setParameter idiom). */
#include <stdlib.h>
#include <string.h>

#include "core/options.h"

typedef struct int_option {
    flame_option option;
    const char *name;
    int64_t min, max;
    size_t offset;
} int_option;

static const int_option int_options[] = {
    {FLAME_OPT_MAX_BATCH, "FLAME_OPT_MAX_BATCH", 1, 65536, offsetof(struct flame_config, max_batch)},
    {FLAME_OPT_SCORE_CHUNK, "FLAME_OPT_SCORE_CHUNK", 16, 1048576, offsetof(struct flame_config, score_chunk)},
    /* item cache (issue 4); times in us, up to a year */
#define IC(opt, field, lo, hi) {opt, #opt, lo, hi, offsetof(struct flame_config, field)}
    IC(FLAME_OPT_ITEM_CACHE_MAX_ENTRIES, ic_max_entries, 1, 1ll << 32),
    IC(FLAME_OPT_ITEM_CACHE_MAX_BYTES, ic_max_bytes, 4096, 1ll << 48),
    IC(FLAME_OPT_ITEM_CACHE_SHARDS, ic_shards, 1, 4096),
    IC(FLAME_OPT_ITEM_CACHE_HOT_TTL_US, ic_hot_ttl, 1, 31536000000000ll),
    IC(FLAME_OPT_ITEM_CACHE_COLD_TTL_US, ic_cold_ttl, 1, 31536000000000ll),
    IC(FLAME_OPT_ITEM_CACHE_HOT_HITS, ic_hot_hits, 1, 1ll << 32),
    IC(FLAME_OPT_ITEM_CACHE_NEGATIVE_TTL_US, ic_negative_ttl, 1, 31536000000000ll),
    IC(FLAME_OPT_ITEM_CACHE_REFRESH_PERCENT, ic_refresh_pct, 0, 99),
    IC(FLAME_OPT_ITEM_CACHE_REFRESH_MIN_HITS, ic_refresh_min_hits, 1, 1ll << 32),
    IC(FLAME_OPT_ITEM_CACHE_REFRESH_THREAD, ic_refresh_thread, 0, 1),
    IC(FLAME_OPT_ITEM_CACHE_RETRY_MIN_US, ic_retry_min, 1, 31536000000000ll),
    IC(FLAME_OPT_ITEM_CACHE_RETRY_MAX_US, ic_retry_max, 1, 31536000000000ll),
#undef IC
};

void fl_config_defaults(struct flame_config *c)
{
    memset(c, 0, sizeof *c);
    strcpy(c->device, "cpu");
    c->max_batch = 256;
    c->score_chunk = 512;
    /* item cache (issue 4) */
    c->ic_max_entries = 1000000;
    c->ic_max_bytes = 1ll << 30;
    c->ic_shards = 64;
    c->ic_hot_ttl = 30ll * 60 * 1000000;
    c->ic_cold_ttl = 60ll * 1000000;
    c->ic_hot_hits = 32;
    c->ic_negative_ttl = 10ll * 1000000;
    c->ic_refresh_pct = 80;
    c->ic_refresh_min_hits = 2;
    c->ic_refresh_thread = 1;
    c->ic_retry_min = 100000;
    c->ic_retry_max = 30ll * 1000000;
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

FLAME_API flame_status flame_config_set_string(flame_config *config, flame_option option, const char *value)
{
    fl_clear_error();
    if (!config || !value) return fl_error(FLAME_ERR_INVALID_ARG, "flame_config_set_string: NULL argument");
    if (option != FLAME_OPT_DEVICE)
        return fl_error(FLAME_ERR_INVALID_ARG, "option %d is not a string option", (int)option);
    if (strlen(value) >= sizeof config->device || !valid_device(value))
        return fl_error(FLAME_ERR_INVALID_ARG,
                        "FLAME_OPT_DEVICE = '%.40s' is not one of cpu, auto, cuda, cuda:N", value);
    strcpy(config->device, value);
    return FLAME_OK;
}

FLAME_API flame_status flame_config_get_string(const flame_config *config, flame_option option, char *buf,
                                               size_t buf_len)
{
    fl_clear_error();
    if (!config || !buf) return fl_error(FLAME_ERR_INVALID_ARG, "flame_config_get_string: NULL argument");
    if (option != FLAME_OPT_DEVICE)
        return fl_error(FLAME_ERR_INVALID_ARG, "option %d is not a string option", (int)option);
    size_t n = strlen(config->device) + 1;
    if (n > buf_len)
        return fl_error(FLAME_ERR_BUFFER_TOO_SMALL, "FLAME_OPT_DEVICE needs %zu bytes, buffer has %zu", n, buf_len);
    memcpy(buf, config->device, n);
    return FLAME_OK;
}
