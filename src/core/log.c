/* The process-wide logging hook. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

#include "core/common.h"

/* Hook, its user pointer and level are published together under one pointer swap so a
 * reader never pairs one hook with another's user pointer. */
typedef struct log_sink {
    flame_log_fn fn;
    void *user;
    flame_log_level max_level;
} log_sink;

static log_sink sinks[2];
static _Atomic(log_sink *) current = NULL;
static atomic_int next_slot = 0;

FLAME_API flame_status flame_set_log_callback(flame_log_fn fn, void *user, flame_log_level max_level)
{
    fl_clear_error();
    if ((int)max_level < FLAME_LOG_ERROR || (int)max_level > FLAME_LOG_DEBUG)
        return fl_error(FLAME_ERR_INVALID_ARG, "log level %d is out of range [0, 3]", (int)max_level);
    if (!fn) {
        atomic_store(&current, NULL);
        return FLAME_OK;
    }
    /* Alternate between two slots: the one being written is never the one published. */
    int slot = atomic_fetch_add(&next_slot, 1) & 1;
    sinks[slot] = (log_sink){fn, user, max_level};
    atomic_store(&current, &sinks[slot]);
    return FLAME_OK;
}

void fl_log(flame_log_level level, const char *fmt, ...)
{
    log_sink *s = atomic_load(&current);
    if (!s || level > s->max_level) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    s->fn(level, line, s->user);
}
