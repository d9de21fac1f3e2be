/* Checks the safetensors header and the flame.config document share: duplicate keys, which
 * compare as cJSON holds them, and NULs (escaped or raw) and raw control bytes inside strings,
 * refused before any key or string is read. */
#include <stdlib.h>
#include <string.h>

#include "model/json_keys.h"

static int by_key(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static const char *in_object(const cJSON *obj, bool *nomem)
{
    size_t n = 0;
    for (const cJSON *m = obj->child; m; m = m->next) n++;
    if (n < 2) return NULL;
    const char **keys = malloc(n * sizeof *keys);
    if (!keys) {
        *nomem = true;
        return NULL;
    }
    size_t k = 0;
    for (const cJSON *m = obj->child; m; m = m->next) keys[k++] = m->string ? m->string : "";
    qsort(keys, n, sizeof *keys, by_key);
    const char *dup = NULL;
    for (size_t i = 1; i < n && !dup; i++)
        if (!strcmp(keys[i - 1], keys[i])) dup = keys[i];
    free(keys);
    return dup;
}

const char *fl_json_duplicate_key(const cJSON *node, bool recurse, bool *nomem)
{
    *nomem = false;
    if (!cJSON_IsObject(node) && !cJSON_IsArray(node)) return NULL;
    const char *dup = cJSON_IsObject(node) ? in_object(node, nomem) : NULL;
    if (!recurse) return dup;
    /* cJSON's nesting limit (CJSON_NESTING_LIMIT) bounds the recursion */
    for (const cJSON *m = node->child; m && !dup && !*nomem; m = m->next) dup = fl_json_duplicate_key(m, true, nomem);
    return dup;
}

long fl_json_string_nul(const char *text, size_t len, bool *raw)
{
    bool in_string = false;
    *raw = false;
    for (size_t i = 0; i < len; i++) {
        if (!in_string) {
            in_string = text[i] == '"';
        } else if (text[i] == '"') {
            in_string = false;
        } else if ((unsigned char)text[i] < 0x20) {
            *raw = true;
            return (long)i;
        } else if (text[i] == '\\' && i + 1 < len) {
            if (text[i + 1] == 'u' && len - i >= 6 && !memcmp(text + i + 2, "0000", 4)) return (long)i;
            i++; /* the escaped character: an escaped quote or backslash ends nothing */
        }
    }
    return -1;
}
