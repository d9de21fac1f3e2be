/* Duplicate JSON object keys, found in O(n log n): readers disagree on which copy wins (cJSON
 * keeps the first, Python's json the last), so a file with one could show different values
 * to different tools. */
#ifndef FLAME_MODEL_JSON_KEYS_H
#define FLAME_MODEL_JSON_KEYS_H

#include <cjson/cJSON.h>
#include <stdbool.h>

/* A key that appears twice among the members of `obj` or, with `recurse`, of any object
 * nested in it (inside arrays too); NULL if none, or if memory ran out (*nomem set). */
const char *fl_json_duplicate_key(const cJSON *obj, bool recurse, bool *nomem);

/* The byte offset of the first \u0000 escape inside a string of the JSON text `text` (`len`
 * bytes, valid JSON), or -1 if none. cJSON decodes it into a NUL that ends the C string, so
 * a name or the config would be read short, whatever followed hidden from every check: the
 * model's JSON texts refuse it. */
long fl_json_nul_escape(const char *text, size_t len);

#endif
