/* A `user item item ...` file (one user per line, items oldest first). */
#ifndef FLAME_SCORE_SEQUENCES_H
#define FLAME_SCORE_SEQUENCES_H

#include <stddef.h>
#include <stdint.h>

typedef struct sequences {
    int64_t *items;   /* all lines' items back to back */
    size_t *offsets;  /* [num_users + 1] */
    size_t num_users;
} sequences;

/* 0 on success; -1 with a message on stderr naming the line. */
int sequences_read(const char *path, sequences *s);
void sequences_free(sequences *s);

#endif
