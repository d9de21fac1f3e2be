/* The two jobs of flame-score: leave-last-out evaluation and the embedded default. */
#ifndef FLAME_SCORE_MODES_H
#define FLAME_SCORE_MODES_H

#include <stddef.h>

#define MAX_KS 16

typedef struct eval_options {
    const char *model, *sequences;
    int ks[MAX_KS];
    int num_ks;
    int exclude_history;
    int json;
    size_t batch; /* users per flame_score_batch call */
    const char *device, *dtype; /* engine options (NULL: defaults) */
} eval_options;

typedef struct default_options {
    size_t requests;   /* synthetic requests to score */
    size_t candidates; /* candidates per request */
    unsigned long long seed;
    int json;
    const char *device, *dtype;
} default_options;

/* An engine for `model` with the device and dtype options (NULL: defaults); prints the error. */
struct flame_model;
struct flame_engine;
int make_engine(struct flame_model *model, const char *device, const char *dtype, struct flame_engine **out);

int run_eval(const eval_options *o);
int run_default(const default_options *o);

#endif
