/* flame-score: the main job of libflame.
 *   flame-score                      the embedded default model on synthetic requests
 *   flame-score --model M --sequences FILE --eval loo --k 5,10,20 --exclude-history [--json]
 *                                    leave-last-out full-sort evaluation of a dot-head model */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flame/flame.h"
#include "modes.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: flame-score [--requests N] [--candidates M] [--seed S] [--json]\n"
            "       flame-score --model FILE --sequences FILE --eval loo [--k 5,10,20] [--exclude-history]\n"
            "                   [--batch B] [--json]\n"
            "both:  [--device cpu|auto|cuda|cuda:N] [--dtype fp32|fp16|bf16]\n"
            "With no --model, scores synthetic requests with the embedded default model (random weights).\n");
}

/* Parses "5,10,20" into ks; -1 with a message on a bad list. */
static int parse_ks(const char *arg, eval_options *o)
{
    o->num_ks = 0;
    for (const char *s = arg; *s;) {
        char *end;
        long k = strtol(s, &end, 10);
        if (end == s || k < 1 || k > 100000 || o->num_ks == MAX_KS || (*end && *end != ',')) {
            fprintf(stderr, "flame-score: --k '%s': expected up to %d comma-separated integers in [1, 100000]\n", arg,
                    MAX_KS);
            return -1;
        }
        for (int j = 0; j < o->num_ks; j++)
            if (o->ks[j] == (int)k) { /* a metric twice would repeat its JSON key */
                fprintf(stderr, "flame-score: --k '%s': %ld appears twice\n", arg, k);
                return -1;
            }
        o->ks[o->num_ks++] = (int)k;
        if (*end == ',' && !end[1]) { /* "5,": a list cut short */
            fprintf(stderr, "flame-score: --k '%s': a trailing comma\n", arg);
            return -1;
        }
        s = *end ? end + 1 : end;
    }
    return o->num_ks ? 0 : -1;
}

static int parse_size(const char *flag, const char *v, size_t lo, size_t hi, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    /* strtoull accepts "-1" as 2^64-1 and saturates on overflow: refuse both */
    if (!*v || *v == '-' || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "flame-score: %s '%s': expected an integer in [%zu, %zu]\n", flag, v, lo, hi);
        return -1;
    }
    *out = (size_t)x;
    return 0;
}

static void log_to_stderr(flame_log_level level, const char *message, void *user);

int make_engine(flame_model *model, const char *device, const char *dtype, flame_engine **out)
{
    flame_config *cfg = NULL;
    flame_status st = flame_config_create(&cfg);
    if (st == FLAME_OK && device) st = flame_config_set_string(cfg, FLAME_OPT_DEVICE, device);
    if (st == FLAME_OK && dtype) st = flame_config_set_string(cfg, FLAME_OPT_DTYPE, dtype);
    /* "auto" says which device it chose (and why not the GPU) at INFO: show that line */
    const int chooses = device && !strcmp(device, "auto");
    if (chooses) flame_set_log_callback(log_to_stderr, NULL, FLAME_LOG_INFO);
    if (st == FLAME_OK) st = flame_engine_create(model, cfg, out);
    if (chooses) flame_set_log_callback(log_to_stderr, NULL, FLAME_LOG_WARN);
    flame_config_destroy(cfg);
    if (st) fprintf(stderr, "flame-score: creating the engine: %s: %s\n", flame_status_string(st), flame_last_error());
    return st == FLAME_OK ? 0 : 1;
}

/* Warnings and errors of the library go to stderr (e.g. a BLAS running slow kernels). */
static void log_to_stderr(flame_log_level level, const char *message, void *user)
{
    (void)user;
    static const char *const names[] = {"error", "warning", "info", "debug"};
    fprintf(stderr, "libflame %s: %s\n", level >= 0 && level <= FLAME_LOG_DEBUG ? names[level] : "log", message);
}

int main(int argc, char **argv)
{
    flame_set_log_callback(log_to_stderr, NULL, FLAME_LOG_WARN);
    eval_options ev = {.ks = {5, 10, 20}, .num_ks = 3, .batch = 1};
    default_options def = {.requests = 200, .candidates = 128, .seed = 42};
    const char *eval = NULL;
    int ev_ks_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = !strcmp(a, "--model") || !strcmp(a, "--sequences") || !strcmp(a, "--eval") || !strcmp(a, "--k") ||
                    !strcmp(a, "--batch") || !strcmp(a, "--requests") || !strcmp(a, "--candidates") ||
                    !strcmp(a, "--seed") || !strcmp(a, "--device") || !strcmp(a, "--dtype");
        if (takes && !v) {
            fprintf(stderr, "flame-score: %s needs a value\n", a);
            return 2;
        }
        size_t n = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            ev.json = def.json = 1;
        } else if (!strcmp(a, "--exclude-history")) {
            ev.exclude_history = 1;
        } else if (!strcmp(a, "--device")) {
            ev.device = def.device = v;
        } else if (!strcmp(a, "--dtype")) {
            ev.dtype = def.dtype = v;
        } else if (!strcmp(a, "--model")) {
            ev.model = v;
        } else if (!strcmp(a, "--sequences")) {
            ev.sequences = v;
        } else if (!strcmp(a, "--eval")) {
            eval = v;
        } else if (!strcmp(a, "--k")) {
            if (parse_ks(v, &ev)) return 2;
            ev_ks_given = 1;
        } else if (!strcmp(a, "--batch")) {
            if (parse_size(a, v, 1, 65536, &ev.batch)) return 2;
        } else if (!strcmp(a, "--requests")) {
            if (parse_size(a, v, 1, 10000000, &def.requests)) return 2;
        } else if (!strcmp(a, "--candidates")) {
            if (parse_size(a, v, 1, 100000, &def.candidates)) return 2;
        } else if (!strcmp(a, "--seed")) {
            if (parse_size(a, v, 0, (size_t)-1, &n)) return 2;
            def.seed = n;
        } else {
            fprintf(stderr, "flame-score: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
        i += takes;
    }
    if (!ev.model && !ev.sequences && !eval) {
        if (ev.exclude_history || ev.batch != 1 || ev_ks_given) {
            fprintf(stderr, "flame-score: --k, --batch and --exclude-history need --eval loo\n");
            return 2;
        }
        return run_default(&def);
    }
    if (!ev.model || !ev.sequences || !eval || strcmp(eval, "loo")) {
        fprintf(stderr, "flame-score: evaluation needs --model, --sequences and --eval loo\n");
        usage(stderr);
        return 2;
    }
    return run_eval(&ev);
}
