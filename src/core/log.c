/* The process-wide logging hook. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

#include "core/common.h"

/* The hook, its user pointer and level change together under the write lock; a log line is
 * delivered under the read lock, so it always pairs a hook with its own user pointer. The
 * atomic flag keeps the no-hook case (every error message passes here) lock-free. */
static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
static flame_log_fn hook_fn;
static void *hook_user;
static flame_log_level hook_level;
static atomic_bool installed;

FLAME_API flame_status flame_set_log_callback(flame_log_fn fn, void *user, flame_log_level max_level)
{
    fl_clear_error();
    if ((int)max_level < FLAME_LOG_ERROR || (int)max_level > FLAME_LOG_DEBUG)
        return fl_error(FLAME_ERR_INVALID_ARG, "log level %d is out of range [0, 3]", (int)max_level);
    pthread_rwlock_wrlock(&lock);
    hook_fn = fn;
    hook_user = user;
    hook_level = max_level;
    atomic_store(&installed, fn != NULL);
    pthread_rwlock_unlock(&lock);
    return FLAME_OK;
}

void fl_log(flame_log_level level, const char *fmt, ...)
{
    if (!atomic_load_explicit(&installed, memory_order_relaxed)) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_rwlock_rdlock(&lock);
    if (hook_fn && level <= hook_level) hook_fn(level, line, hook_user);
    pthread_rwlock_unlock(&lock);
}
