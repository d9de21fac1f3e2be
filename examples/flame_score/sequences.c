#include "sequences.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int push(void **buf, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap) return 0;
    size_t c = *cap ? 2 * *cap : 4096;
    void *p = realloc(*buf, c * elem);
    if (!p) return -1;
    *buf = p;
    *cap = c;
    return 0;
}

int sequences_read(const char *path, sequences *s)
{
    memset(s, 0, sizeof *s);
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "flame-score: cannot open '%s': %s\n", path, strerror(errno));
        return -1;
    }
    size_t icap = 0, ocap = 0, n = 0, line_no = 0;
    char *line = NULL;
    size_t len = 0;
    int rc = 0;
    if (push((void **)&s->offsets, &ocap, 0, sizeof(size_t))) rc = -1;
    else s->offsets[0] = 0;
    ssize_t got;
    while (rc == 0 && (got = getline(&line, &len, f)) != -1) {
        line_no++;
        const char *nul = memchr(line, '\0', (size_t)got);
        if (nul) { /* the string functions below would stop there */
            fprintf(stderr, "flame-score: %s:%zu: a NUL byte at column %zu\n", path, line_no, (size_t)(nul - line) + 1);
            rc = -1;
            break;
        }
        char *p = line + strspn(line, " \t\r\n"), *end;
        if (!*p) continue; /* blank line */
        int first = 1; /* the user id: checked, not needed for scoring */
        for (;;) {
            p += strspn(p, " \t\r\n");
            if (!*p) break;
            errno = 0;
            long long v = strtoll(p, &end, 10);
            size_t tok = strcspn(p, " \t\r\n");
            /* every token must be a whole non-negative integer: "1e3" or "abc" is an error, not 1 or the end */
            if (end != p + tok || errno || v < 0) {
                fprintf(stderr, "flame-score: %s:%zu: %s '%.*s' is not a non-negative integer\n", path, line_no,
                        first ? "user id" : "item id", (int)(tok < 40 ? tok : 40), p);
                rc = -1;
                break;
            }
            p = end;
            if (first) {
                first = 0;
                continue;
            }
            if (push((void **)&s->items, &icap, n, sizeof(int64_t))) {
                rc = -1;
                break;
            }
            s->items[n++] = v;
            p = end;
        }
        if (rc == 0 && (push((void **)&s->offsets, &ocap, s->num_users + 1, sizeof(size_t)) == 0))
            s->offsets[++s->num_users] = n;
        else
            rc = -1;
    }
    if (rc == 0 && ferror(f)) {
        fprintf(stderr, "flame-score: cannot read '%s': %s\n", path, strerror(errno));
        rc = -1;
    }
    if (rc == 0 && s->num_users == 0) {
        fprintf(stderr, "flame-score: '%s' holds no 'user item item ...' lines\n", path);
        rc = -1;
    }
    free(line);
    fclose(f);
    if (rc) sequences_free(s);
    return rc;
}

void sequences_free(sequences *s)
{
    free(s->items);
    free(s->offsets);
    memset(s, 0, sizeof *s);
}
