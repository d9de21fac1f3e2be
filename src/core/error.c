/* Status names and the per-thread detail message behind flame_last_error(). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/common.h"

/* One message per thread: concurrent engines never clobber each other's detail. */
static _Thread_local char tls_message[1024];

flame_status fl_error(flame_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tls_message, sizeof tls_message, fmt, ap);
    va_end(ap);
    fl_log(FLAME_LOG_DEBUG, "%s: %s", flame_status_string(status), tls_message);
    return status;
}

void fl_clear_error(void)
{
    tls_message[0] = '\0';
}

FLAME_API const char *flame_last_error(void)
{
    return tls_message;
}

FLAME_API const char *flame_status_string(flame_status status)
{
    switch (status) {
    case FLAME_OK: return "FLAME_OK";
    case FLAME_ERR_INVALID_ARG: return "FLAME_ERR_INVALID_ARG";
    case FLAME_ERR_NOMEM: return "FLAME_ERR_NOMEM";
    case FLAME_ERR_IO: return "FLAME_ERR_IO";
    case FLAME_ERR_FORMAT: return "FLAME_ERR_FORMAT";
    case FLAME_ERR_UNSUPPORTED: return "FLAME_ERR_UNSUPPORTED";
    case FLAME_ERR_NO_DEVICE: return "FLAME_ERR_NO_DEVICE";
    case FLAME_ERR_BUFFER_TOO_SMALL: return "FLAME_ERR_BUFFER_TOO_SMALL";
    case FLAME_ERR_INTERNAL: return "FLAME_ERR_INTERNAL";
    case FLAME_ERR_UNAVAILABLE: return "FLAME_ERR_UNAVAILABLE";
    case FLAME_ERR_TIMEOUT: return "FLAME_ERR_TIMEOUT";
    case FLAME_ERR_CANCELLED: return "FLAME_ERR_CANCELLED";
    }
    return "FLAME_ERR_UNKNOWN";
}

void *fl_aligned_alloc(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0) bytes = 64;
    if (posix_memalign(&p, 64, bytes) != 0) return NULL;
    return p;
}

void fl_aligned_free(void *p)
{
    free(p);
}
