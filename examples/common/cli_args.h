/* Numbers from the command line of the example programs and benchmarks: a whole value in
 * range, or a message naming the flag and the text and a refusal. strtol and atoi stop at the
 * first bad character ("5junk" is 5, "abc" is 0), keep the low bits of what overflows, and
 * strtod takes nan and inf, which pass every comparison's negation. */
#ifndef FLAME_EXAMPLES_CLI_ARGS_H
#define FLAME_EXAMPLES_CLI_ARGS_H

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

/* A whole decimal number in [lo, hi] into *out; false, with "PROG: FLAG TEXT is not a whole
 * number in LO..HI" on stderr, otherwise. */
static inline bool cli_int(const char *prog, const char *flag, const char *text, long long lo, long long hi,
                           long long *out)
{
    char *end = NULL;
    errno = 0;
    const long long x = strtoll(text, &end, 10);
    if (errno || end == text || *end || x < lo || x > hi) {
        fprintf(stderr, "%s: %s %s is not a whole number in %lld..%lld\n", prog, flag, text, lo, hi);
        return false;
    }
    *out = x;
    return true;
}

/* A finite number in [lo, hi] (or (lo, hi] with lo_open) into *out; false with a message
 * naming it otherwise. */
static inline bool cli_real(const char *prog, const char *flag, const char *text, double lo, bool lo_open, double hi,
                            double *out)
{
    char *end = NULL;
    const double x = strtod(text, &end);
    if (end == text || *end || !isfinite(x) || x < lo || (lo_open && x == lo) || x > hi) {
        fprintf(stderr, "%s: %s %s is not a number in %s%g, %g]\n", prog, flag, text, lo_open ? "(" : "[", lo, hi);
        return false;
    }
    *out = x;
    return true;
}

#endif
