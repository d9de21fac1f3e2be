/* The struct_size rule (core/abi.h): one place decides what a caller's struct_size means. */
#include "core/abi.h"

flame_status fl_struct_size_check(const char *what, size_t size, size_t ours)
{
    if (size < sizeof(size_t) || size > FL_STRUCT_SIZE_MAX)
        return fl_error(FLAME_ERR_INVALID_ARG,
                        "%s.struct_size = %zu: set it to sizeof(%s) (%zu in this library; %zu..%d accepted)", what,
                        size, what, ours, sizeof(size_t), FL_STRUCT_SIZE_MAX);
    return FLAME_OK;
}

flame_status fl_struct_in(const char *what, void *dst, size_t ours, const void *src)
{
    size_t theirs = fl_struct_size_of(src);
    flame_status st = fl_struct_size_check(what, theirs, ours);
    if (st) return st;
    size_t n = theirs < ours ? theirs : ours;
    memcpy(dst, src, n);
    memcpy(dst, &ours, sizeof ours);
    return FLAME_OK;
}

flame_status fl_struct_out(const char *what, void *dst, const void *src, size_t ours)
{
    size_t theirs = fl_struct_size_of(dst);
    flame_status st = fl_struct_size_check(what, theirs, ours);
    if (st) return st;
    size_t n = theirs < ours ? theirs : ours;
    /* the struct_size field stays the caller's */
    memcpy((unsigned char *)dst + sizeof(size_t), (const unsigned char *)src + sizeof(size_t), n - sizeof(size_t));
    return FLAME_OK;
}
