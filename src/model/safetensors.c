/* safetensors container checks (docs/model-format.md, "safetensors, as read by libflame").
 * Every range check is done on 64-bit integers before any tensor byte is touched. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/json_keys.h"
#include "model/safetensors.h"

#define BAD(...) fl_error(FLAME_ERR_FORMAT, __VA_ARGS__)
#define FL_ST_WHERE_MAX 320

size_t fl_dtype_size(fl_dtype d)
{
    switch (d) {
    case FL_DTYPE_F32: return 4;
    case FL_DTYPE_F16:
    case FL_DTYPE_BF16: return 2;
    case FL_DTYPE_I8: return 1;
    default: return 0;
    }
}

static fl_dtype dtype_of(const char *s)
{
    if (!strcmp(s, "F32")) return FL_DTYPE_F32;
    if (!strcmp(s, "F16")) return FL_DTYPE_F16;
    if (!strcmp(s, "BF16")) return FL_DTYPE_BF16;
    if (!strcmp(s, "I8")) return FL_DTYPE_I8;
    return FL_DTYPE_UNKNOWN;
}

/* A JSON number that is an exact non-negative integer below 2^53 (exact in a double). */
static bool as_u64(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return false;
    double d = v->valuedouble;
    if (!(d >= 0) || d > 9007199254740992.0 || d != floor(d)) return false;
    *out = (uint64_t)d;
    return true;
}

static flame_status parse_entry(const cJSON *e, fl_st_tensor *t)
{
    if (!cJSON_IsObject(e)) return BAD("tensor '%s': entry is not an object", t->name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt)) return BAD("tensor '%s': dtype is missing or not a string", t->name);
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", dt->valuestring);
    t->dtype = dtype_of(dt->valuestring);
    if (!cJSON_IsArray(sh)) return BAD("tensor '%s': shape is missing or not an array", t->name);
    int nd = cJSON_GetArraySize(sh);
    if (nd > FL_ST_MAX_DIMS) return BAD("tensor '%s': %d dimensions, at most %d", t->name, nd, FL_ST_MAX_DIMS);
    t->ndim = nd;
    for (int i = 0; i < nd; i++) {
        uint64_t v;
        if (!as_u64(cJSON_GetArrayItem(sh, i), &v) || v > (uint64_t)INT64_MAX)
            return BAD("tensor '%s': shape[%d] is not a non-negative integer", t->name, i);
        t->shape[i] = (int64_t)v;
    }
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 || !as_u64(cJSON_GetArrayItem(off, 0), &t->begin) ||
        !as_u64(cJSON_GetArrayItem(off, 1), &t->end))
        return BAD("tensor '%s': data_offsets must be two non-negative integers", t->name);
    if (t->begin > t->end)
        return BAD("tensor '%s': data_offsets [%llu, %llu] are reversed", t->name, (unsigned long long)t->begin,
                   (unsigned long long)t->end);
    return FLAME_OK;
}

static int by_begin(const void *a, const void *b)
{
    const fl_st_tensor *x = *(fl_st_tensor *const *)a, *y = *(fl_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const fl_st_tensor *)a)->name, ((const fl_st_tensor *)b)->name);
}

/* The data buffer must be exactly the concatenation of the tensors' ranges, as the format
 * requires: on the ranges sorted by (begin, end), each begins where the bytes covered so far
 * end (an earlier begin is an overlap, a later one a gap), and the last ends at the buffer's
 * end. Unindexed bytes could carry anything past every reader's checks. An empty tensor sits
 * where the covered bytes end, like any other. Overlaps are reported at once; the first gap
 * goes to *gap (FLAME_OK returned), for after the size checks, whose messages say more. */
static flame_status check_layout(fl_st_file *f, char *gap, size_t gap_len)
{
    fl_st_tensor **order = malloc((f->num_tensors ? f->num_tensors : 1) * sizeof *order);
    if (!order) return fl_error(FLAME_ERR_NOMEM, "out of memory checking tensor ranges");
    for (size_t i = 0; i < f->num_tensors; i++) order[i] = &f->tensors[i];
    qsort(order, f->num_tensors, sizeof *order, by_begin);
    flame_status st = FLAME_OK;
    const fl_st_tensor *prev = NULL; /* the previous range: it ends at pos */
    uint64_t pos = 0;                /* bytes [0, pos) are covered */
    gap[0] = '\0';
    for (size_t i = 0; i < f->num_tensors && st == FLAME_OK; i++) {
        const fl_st_tensor *t = order[i];
        if (t->begin < pos && t->begin != t->end)
            st = BAD("tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap", prev->name,
                     (unsigned long long)prev->begin, (unsigned long long)prev->end, t->name,
                     (unsigned long long)t->begin, (unsigned long long)t->end);
        else if (t->begin < pos)
            st = BAD("empty tensor '%s' at byte %llu lies inside '%s' [%llu, %llu)", t->name,
                     (unsigned long long)t->begin, prev->name, (unsigned long long)prev->begin,
                     (unsigned long long)prev->end);
        else if (t->begin > pos && !gap[0] && prev)
            snprintf(gap, gap_len, "bytes [%llu, %llu) of the data buffer belong to no tensor (a gap between '%s' and "
                     "'%s')", (unsigned long long)pos, (unsigned long long)t->begin, prev->name, t->name);
        else if (t->begin > pos && !gap[0])
            snprintf(gap, gap_len, "bytes [0, %llu) of the data buffer belong to no tensor (a gap before '%s')",
                     (unsigned long long)t->begin, t->name);
        if (!prev || t->end >= pos) prev = t, pos = t->end;
    }
    if (st == FLAME_OK && !gap[0] && pos != f->data_len) {
        if (prev)
            snprintf(gap, gap_len, "bytes [%llu, %llu) of the data buffer belong to no tensor (after the last, '%s')",
                     (unsigned long long)pos, (unsigned long long)f->data_len, prev->name);
        else
            snprintf(gap, gap_len, "the data buffer has %llu bytes but the header lists no tensor",
                     (unsigned long long)f->data_len);
    }
    free(order);
    return st;
}

static flame_status check_sizes(const fl_st_file *f)
{
    for (size_t i = 0; i < f->num_tensors; i++) {
        const fl_st_tensor *t = &f->tensors[i];
        if (t->dtype == FL_DTYPE_UNKNOWN)
            return BAD("tensor '%s' has unsupported dtype '%s' (F32, F16, BF16 and, for tables, I8 are supported)",
                       t->name, t->dtype_name);
        uint64_t need = fl_dtype_size(t->dtype);
        for (int d = 0; d < t->ndim; d++)
            if (!fl_mul_u64(need, (uint64_t)t->shape[d], &need))
                return BAD("tensor '%s': shape x dtype size overflows 64 bits", t->name);
        if (t->end - t->begin != need) {
            char dims[128] = "";
            for (int d = 0; d < t->ndim; d++)
                snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%lld", d ? ", " : "",
                         (long long)t->shape[d]);
            return BAD("tensor '%s': byte range is %llu bytes but shape [%s] x %s needs %llu", t->name,
                       (unsigned long long)(t->end - t->begin), dims, t->dtype_name, (unsigned long long)need);
        }
    }
    return FLAME_OK;
}

/* Duplicate keys are refused (model/json_keys.h says why); sorting keeps this O(n log n) in
 * the header size. */
static flame_status check_unique_keys(const cJSON *obj, const char *where)
{
    bool nomem = false;
    const char *dup = fl_json_duplicate_key(obj, true, &nomem);
    if (nomem) return fl_error(FLAME_ERR_NOMEM, "out of memory checking the keys of %s", where);
    if (dup) return BAD("key '%.60s' appears twice in %s", dup, where);
    return FLAME_OK;
}

static flame_status parse_metadata(const cJSON *meta, fl_st_file *f)
{
    if (!cJSON_IsObject(meta)) return BAD("__metadata__ is not an object");
    flame_status st = check_unique_keys(meta, "__metadata__");
    if (st) return st;
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(meta, "flame.config");
    if (!cfg) return FLAME_OK;
    if (!cJSON_IsString(cfg)) return BAD("__metadata__.flame.config is not a string");
    f->config_json = strdup(cfg->valuestring);
    return f->config_json ? FLAME_OK : fl_error(FLAME_ERR_NOMEM, "out of memory reading flame.config");
}

static flame_status parse_header(const cJSON *root, fl_st_file *f)
{
    if (!cJSON_IsObject(root)) return BAD("safetensors header is not a JSON object");
    size_t n = 0, metas = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        bool meta = !strcmp(e->string, "__metadata__");
        n += !meta;
        metas += meta;
    }
    if (metas > 1) return BAD("__metadata__ appears %zu times in the header", metas);
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors) return fl_error(FLAME_ERR_NOMEM, "out of memory reading %zu tensor entries", n);
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            flame_status st = parse_metadata(e, f);
            if (st) return st;
            continue;
        }
        for (const char *c = e->string; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                return BAD("tensor #%zu has a control character in its name", f->num_tensors);
        fl_st_tensor *t = &f->tensors[f->num_tensors++];
        t->name = strdup(e->string);
        if (!t->name) return fl_error(FLAME_ERR_NOMEM, "out of memory reading tensor names");
        flame_status st = parse_entry(e, t);
        if (!st) {
            char where[FL_ST_WHERE_MAX];
            snprintf(where, sizeof where, "the entry of tensor '%s'", t->name);
            st = check_unique_keys(e, where);
        }
        if (st) return st;
        if (t->end > f->data_len)
            return BAD("tensor '%s' ends at byte %llu, past the data buffer (%llu bytes)", t->name,
                       (unsigned long long)t->end, (unsigned long long)f->data_len);
    }
    qsort(f->tensors, f->num_tensors, sizeof *f->tensors, by_name);
    for (size_t i = 1; i < f->num_tensors; i++)
        if (!strcmp(f->tensors[i - 1].name, f->tensors[i].name))
            return BAD("tensor '%s' appears twice in the header", f->tensors[i].name);
    char gap[2 * FL_ST_WHERE_MAX];
    flame_status st = check_layout(f, gap, sizeof gap);
    if (!st) st = check_sizes(f);
    return st ? st : gap[0] ? BAD("%s", gap) : FLAME_OK;
}

flame_status fl_st_parse(const uint8_t *bytes, uint64_t len, fl_st_file *f)
{
    memset(f, 0, sizeof *f);
    if (len < 8) return BAD("file is %llu bytes, too short for a safetensors header", (unsigned long long)len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | bytes[i];
    if (n > len - 8)
        return BAD("header length %llu exceeds the file size (%llu bytes): not a safetensors file, or a truncated "
                   "one", (unsigned long long)n, (unsigned long long)len);
    if (n > FLAME_MAX_HEADER_BYTES)
        return BAD("header length %llu exceeds the cap of %llu bytes", (unsigned long long)n,
                   (unsigned long long)FLAME_MAX_HEADER_BYTES);
    f->data = bytes + 8 + n;
    f->data_len = len - 8 - n;
    const char *text = (const char *)bytes + 8, *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)n, &end, 0);
    if (!root) return BAD("safetensors header (%llu bytes) is not valid JSON", (unsigned long long)n);
    for (const char *c = end; c < text + n; c++)
        if (*c != ' ') {
            cJSON_Delete(root);
            return BAD("safetensors header has bytes after its JSON (at offset %td)", c - text);
        }
    bool raw;
    long nul = fl_json_string_nul(text, (size_t)(end - text), &raw);
    if (nul >= 0) {
        cJSON_Delete(root);
        return raw ? BAD("safetensors header has a raw control byte 0x%02x inside a string at offset %ld (JSON "
                         "forbids them)", (unsigned char)text[nul], nul)
                   : BAD("safetensors header has a \\u0000 escape at offset %ld (names and the config may not hold "
                         "NUL)", nul);
    }
    flame_status st = parse_header(root, f);
    cJSON_Delete(root);
    if (st) fl_st_free(f);
    return st;
}

void fl_st_free(fl_st_file *f)
{
    for (size_t i = 0; i < f->num_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->config_json);
    memset(f, 0, sizeof *f);
}

fl_st_tensor *fl_st_find(fl_st_file *f, const char *name)
{
    fl_st_tensor key = {.name = (char *)name};
    return bsearch(&key, f->tensors, f->num_tensors, sizeof key, by_name);
}
