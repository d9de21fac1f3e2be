/* The feature file (docs/features.md): a text table read into an id -> record hash table. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "features/source.h"

#define MAX_LINE_IDS 65536

static flame_status grow_blobs(fl_feature_table *t, size_t len)
{
    size_t need = t->used + ((len + 7) & ~(size_t)7);
    if (need <= t->cap) return FLAME_OK;
    size_t cap = need * 2 > 65536 ? need * 2 : 65536;
    uint8_t *p = realloc(t->blobs, cap);
    if (!p) return fl_error(FLAME_ERR_NOMEM, "out of memory reading a feature file");
    t->blobs = p;
    t->cap = cap;
    return FLAME_OK;
}

static flame_status rehash(fl_feature_table *t)
{
    size_t size = (t->mask + 1) * 2;
    if (size < 1024) size = 1024;
    int64_t *keys = calloc(size, sizeof *keys);
    uint64_t *offs = calloc(size, sizeof *offs);
    uint32_t *lens = calloc(size, sizeof *lens);
    if (!keys || !offs || !lens) {
        free(keys), free(offs), free(lens);
        return fl_error(FLAME_ERR_NOMEM, "out of memory reading a feature file");
    }
    for (size_t i = 0; t->offs && i <= t->mask; i++) {
        if (!t->offs[i]) continue;
        size_t j = fl_hash64(t->keys[i]) & (size - 1);
        while (offs[j]) j = (j + 1) & (size - 1);
        keys[j] = t->keys[i], offs[j] = t->offs[i], lens[j] = t->lens[i];
    }
    free(t->keys), free(t->offs), free(t->lens);
    t->keys = keys, t->offs = offs, t->lens = lens, t->mask = size - 1;
    return FLAME_OK;
}

const uint8_t *fl_feature_table_find(const fl_feature_table *t, int64_t id, uint32_t *len)
{
    if (!t->offs) return NULL;
    for (size_t j = fl_hash64(id) & t->mask; t->offs[j]; j = (j + 1) & t->mask)
        if (t->keys[j] == id) {
            *len = t->lens[j];
            return t->blobs + t->offs[j] - 1;
        }
    return NULL;
}

void fl_feature_table_free(fl_feature_table *t)
{
    free(t->keys), free(t->offs), free(t->lens), free(t->blobs);
    memset(t, 0, sizeof *t);
}

/* Parses "a,b,c" (or "") into v[]; returns the count, -1 for a malformed list or -2 when it
 * holds more than `room` ids. */
static long parse_ids(char *s, int64_t *v, long room)
{
    long n = 0;
    while (*s) {
        char *end;
        errno = 0;
        long long x = strtoll(s, &end, 10);
        if (end == s || errno || (*end && *end != ',')) return -1;
        if (n >= room) return -2;
        v[n++] = x;
        s = *end ? end + 1 : end;
        if (*end && !*s) return -1; /* a trailing comma: a value left out */
    }
    return n;
}

/* Parses "x,y,z" into v[]; returns the count, or -1 with *bad at the offending entry and *why
 * saying what is wrong with it. */
static long parse_floats(char *s, float *v, long room, char **bad, const char **why)
{
    long n = 0;
    while (*s) {
        char *end;
        errno = 0;
        float x = strtof(s, &end);
        *bad = s;
        if (end == s || (*end && *end != ',')) return *why = "is not a float", -1;
        /* ERANGE on underflow (1e-40, a subnormal, or 1e-50, rounded to 0) is a valid value;
         * overflow (1e999, rounded to inf), inf and nan are not feature values */
        if (errno == ERANGE && !(isfinite(x) && fabsf(x) <= FLT_MIN)) return *why = "is out of float's range", -1;
        if (!isfinite(x)) return *why = "is not a finite float", -1;
        if (n >= room) return *why = "is one value too many", -1;
        v[n++] = x;
        s = *end ? end + 1 : end;
        if (*end && !*s) return *bad = s, *why = "is an empty entry (a trailing comma)", -1;
    }
    *bad = s;
    *why = "is the end of the list";
    return n;
}

static flame_status parse_line(fl_feature_table *t, char *line, size_t lineno, const char *path, int64_t *ids,
                               float *dense)
{
    char *fields[FL_MAX_SLOTS + 3];
    int nf = 0;
    for (char *p = line;; p++) {
        if (nf < FL_MAX_SLOTS + 3) fields[nf] = p;
        nf++;
        p = strchr(p, '\t');
        if (!p) break;
        *p = '\0';
    }
    int want = 1 + t->num_slots + (t->num_dense > 0);
    if (nf != want)
        return fl_error(FLAME_ERR_FORMAT, "%s:%zu: %d tab-separated fields, expected %d (id, %d slots%s)", path, lineno,
                        nf, want, t->num_slots, t->num_dense ? ", dense" : "");
    int64_t id;
    if (parse_ids(fields[0], &id, 1) != 1) return fl_error(FLAME_ERR_FORMAT, "%s:%zu: bad id '%.40s'", path, lineno, fields[0]);
    if (id < 0) /* ids index tables: a negative one is a mistake in the file, not a record */
        return fl_error(FLAME_ERR_FORMAT, "%s:%zu: item id %lld is negative", path, lineno, (long long)id);
    int64_t offsets[FL_MAX_SLOTS + 1] = {0};
    for (int s = 0; s < t->num_slots; s++) {
        long n = parse_ids(fields[1 + s], ids + offsets[s], MAX_LINE_IDS - offsets[s]);
        if (n == -2)
            return fl_error(FLAME_ERR_FORMAT, "%s:%zu: slot %d: more than %d ids on one line (the limit per line, all slots together)",
                            path, lineno, s, MAX_LINE_IDS);
        if (n < 0) return fl_error(FLAME_ERR_FORMAT, "%s:%zu: slot %d: bad id list '%.40s'", path, lineno, s, fields[1 + s]);
        for (long i = 0; i < n; i++)
            if (ids[offsets[s] + i] < 0)
                return fl_error(FLAME_ERR_FORMAT, "%s:%zu: slot %d: id %lld is negative", path, lineno, s,
                                (long long)ids[offsets[s] + i]);
        offsets[s + 1] = offsets[s] + n;
    }
    if (t->num_dense) {
        char *bad;
        const char *why;
        long n = parse_floats(fields[want - 1], dense, t->num_dense, &bad, &why);
        if (n < 0)
            return fl_error(FLAME_ERR_FORMAT, "%s:%zu: dense: expected %d comma-separated finite floats; '%.*s' %s", path,
                            lineno, t->num_dense, (int)(strcspn(bad, ",") < 40 ? strcspn(bad, ",") : 40), bad, why);
        if (n != t->num_dense)
            return fl_error(FLAME_ERR_FORMAT, "%s:%zu: dense: expected %d comma-separated finite floats, got %ld in '%.40s'",
                            path, lineno, t->num_dense, n, fields[want - 1]);
    }
    uint32_t oldlen;
    if (fl_feature_table_find(t, id, &oldlen))
        return fl_error(FLAME_ERR_FORMAT, "%s:%zu: id %lld appears twice", path, lineno, (long long)id);
    size_t len = fl_rec_bytes(t->num_slots, (uint64_t)offsets[t->num_slots], (size_t)t->num_dense);
    flame_status st = grow_blobs(t, len);
    if (!st && (t->count + 1) * 2 > t->mask + 1) st = rehash(t);
    if (st) return st;
    fl_rec_encode(t->blobs + t->used, t->num_slots, offsets, ids, dense, (size_t)t->num_dense);
    size_t j = fl_hash64(id) & t->mask;
    while (t->offs[j]) j = (j + 1) & t->mask;
    t->keys[j] = id, t->offs[j] = t->used + 1, t->lens[j] = (uint32_t)len;
    t->used += (len + 7) & ~(size_t)7;
    t->count++;
    return FLAME_OK;
}

#define HEADER_FORM "'flame-features 1 slots=S dense=D'"

/* One integer of the header at *p: "<key>" then a decimal in [lo, hi] (strtoll, so no
 * wrap-around: 4294967298 is out of range, not 2); *p moves past it. */
static flame_status header_int(char **p, const char *key, long lo, long hi, const char *path, size_t lineno, int *out)
{
    size_t klen = strlen(key);
    if (strncmp(*p, key, klen))
        return fl_error(FLAME_ERR_FORMAT, "%s:%zu: expected the header " HEADER_FORM " (S 0..%d, D 0..%d)", path, lineno,
                        FL_MAX_SLOTS, FL_MAX_DENSE);
    char *s = *p + klen, *end;
    errno = 0;
    long long x = (*s >= '0' && *s <= '9') || *s == '+' || *s == '-' ? strtoll(s, &end, 10) : (end = s, 0);
    if (end == s || (*end && *end != ' ' && *end != '\t'))
        return fl_error(FLAME_ERR_FORMAT, "%s:%zu: expected the header " HEADER_FORM " (S 0..%d, D 0..%d); '%s%.*s' is not an integer",
                        path, lineno, FL_MAX_SLOTS, FL_MAX_DENSE, key, (int)(strcspn(s, " \t") < 40 ? strcspn(s, " \t") : 40), s);
    if (errno == ERANGE || x < lo || x > hi)
        return fl_error(FLAME_ERR_FORMAT, "%s:%zu: header %s%.*s is out of range %ld..%ld (expected the header " HEADER_FORM ")",
                        path, lineno, *key ? key : "version ", (int)(end - s < 40 ? end - s : 40), s, lo, hi);
    *out = (int)x;
    *p = end;
    return FLAME_OK;
}

/* "flame-features 1 slots=S dense=D": words separated by spaces or tabs, nothing before or after. */
static flame_status parse_header(char *line, const char *path, size_t lineno, int *v, int *ns, int *nd)
{
    static const char magic[] = "flame-features";
    char *p = line + sizeof magic - 1;
    if (strncmp(line, magic, sizeof magic - 1) || (*p != ' ' && *p != '\t'))
        return fl_error(FLAME_ERR_FORMAT, "%s:%zu: expected the header " HEADER_FORM " (S 0..%d, D 0..%d)", path, lineno,
                        FL_MAX_SLOTS, FL_MAX_DENSE);
    while (*p == ' ' || *p == '\t') p++;
    flame_status st = header_int(&p, "", 1, 1, path, lineno, v);
    while (*p == ' ' || *p == '\t') p++;
    if (!st) st = header_int(&p, "slots=", 0, FL_MAX_SLOTS, path, lineno, ns);
    while (*p == ' ' || *p == '\t') p++;
    if (!st) st = header_int(&p, "dense=", 0, FL_MAX_DENSE, path, lineno, nd);
    if (!st && *p)
        st = fl_error(FLAME_ERR_FORMAT, "%s:%zu: expected the header " HEADER_FORM " (S 0..%d, D 0..%d); '%.40s' after it",
                      path, lineno, FL_MAX_SLOTS, FL_MAX_DENSE, p);
    return st;
}

flame_status fl_feature_table_read(const char *path, fl_feature_table *t)
{
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "r");
    if (!f) return fl_error(FLAME_ERR_IO, "cannot open feature file '%s': %s", path, strerror(errno));
    int64_t *ids = malloc(MAX_LINE_IDS * sizeof *ids);
    float *dense = malloc(FL_MAX_DENSE * sizeof *dense);
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t got;
    flame_status st = ids && dense ? FLAME_OK : fl_error(FLAME_ERR_NOMEM, "out of memory reading '%s'", path);
    bool header = false;
    while (!st && (got = getline(&line, &cap, f)) >= 0) {
        lineno++;
        /* the fields are C strings: a NUL inside the line would end one early and drop the rest */
        const char *nul = memchr(line, '\0', (size_t)got);
        if (nul) {
            st = fl_error(FLAME_ERR_FORMAT, "%s:%zu: a NUL byte at column %zu", path, lineno, (size_t)(nul - line) + 1);
            break;
        }
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = '\0';
        if (got == 0 || line[0] == '#') continue;
        if (!header) {
            int v = 0, ns = 0, nd = 0;
            st = parse_header(line, path, lineno, &v, &ns, &nd);
            t->num_slots = ns, t->num_dense = nd;
            header = true;
            continue;
        }
        st = parse_line(t, line, lineno, path, ids, dense);
    }
    /* a read error first: a file that cannot be read (a directory) has no header either */
    const int read_errno = errno;
    if (!st && ferror(f)) st = fl_error(FLAME_ERR_IO, "error reading feature file '%s': %s", path, strerror(read_errno));
    if (!st && !header) st = fl_error(FLAME_ERR_FORMAT, "%s: no 'flame-features' header line", path);
    free(line), free(ids), free(dense);
    fclose(f);
    if (st) fl_feature_table_free(t);
    return st;
}

/* ---- the file source */

typedef struct file_source {
    struct flame_feature_source base;
    fl_feature_table table;
} file_source;

static flame_status file_fetch(struct flame_feature_source *s, const int64_t *ids, size_t n, flame_feature_batch *out)
{
    const fl_feature_table *t = &((file_source *)s)->table;
    for (size_t i = 0; i < n; i++) {
        uint32_t len;
        const uint8_t *blob = fl_feature_table_find(t, ids[i], &len);
        if (!blob) {
            out->rec[i] = (fl_rec_ref){.state = FL_REC_MISSING};
            continue;
        }
        flame_status st = fl_batch_put_blob(out, i, blob, len);
        if (st) return st;
    }
    return FLAME_OK;
}

static void file_destroy(struct flame_feature_source *s)
{
    fl_feature_table_free(&((file_source *)s)->table);
    free(s);
}

static const fl_source_ops file_ops = {file_fetch, file_destroy};

FLAME_API flame_status flame_feature_source_create_file(const char *path, flame_feature_source **out)
{
    fl_clear_error();
    if (out) *out = NULL;
    if (!path || !out) return fl_error(FLAME_ERR_INVALID_ARG, "flame_feature_source_create_file: NULL argument");
    file_source *f = calloc(1, sizeof *f);
    if (!f) return fl_error(FLAME_ERR_NOMEM, "out of memory allocating a feature source");
    flame_status st = fl_feature_table_read(path, &f->table);
    if (st) {
        free(f);
        return st;
    }
    fl_source_init(&f->base, &file_ops, f->table.num_slots);
    *out = &f->base;
    return FLAME_OK;
}
