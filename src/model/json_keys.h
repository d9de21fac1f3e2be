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

/* The byte offset of the first NUL inside a string of the JSON text `text` (`len` bytes, that
 * cJSON parsed), escaped (\u0000) or raw (cJSON copies any raw byte below 0x20, which JSON
 * forbids in strings), or -1 if none; *raw says which. Either ends the C string cJSON gives:
 * a name or the config would be read short, whatever followed hidden from every check, so the
 * model's JSON texts refuse both (and every other raw control byte, as JSON does). */
long fl_json_string_nul(const char *text, size_t len, bool *raw);

#endif
