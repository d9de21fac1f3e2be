/* The struct_size rule (core/abi.h): one place decides what a caller's struct_size means, and
 * which bytes of a public struct are reserved (the no-trailing-padding rule at the top of
 * flame.h). */
#include "core/abi.h"

/* A reserved field: the bytes alignment would have left as trailing padding, named in the
 * header so that no field is ever appended into them. `since` is sizeof(type) in the header that named
 * the field: a caller's struct shorter than that comes from an older header, where those
 * bytes were padding (uninitialised), so they are not read there. */
typedef struct reserved_field {
    const char *type, *field;
    size_t type_size; /* sizeof(type) in this library: a cheap first test before the name */
    size_t offset, size, since;
} reserved_field;

/* (the array bound fails to compile unless the field lies within `since` and `since` within the struct) */
#define FIELD_END(T, f) (offsetof(T, f) + sizeof(((T *)0)->f))
#define RESERVED(T, f, since_size)                                                                              \
    {#T, #f, sizeof(T), offsetof(T, f), sizeof(((T *)0)->f),                                                    \
     since_size + 0 * sizeof(char[FIELD_END(T, f) <= since_size && since_size <= sizeof(T) ? 1 : -1])}
static const reserved_field reserved[] = {
    RESERVED(flame_request, reserved0, 96),
    RESERVED(flame_numa_info, reserved0, 24),
    RESERVED(flame_pinned_pool_stats, reserved0, 88),
    RESERVED(flame_embedding_bag_params, reserved0, 40),
    RESERVED(flame_attention_params, reserved0, 160),
};
#define NUM_RESERVED (sizeof reserved / sizeof reserved[0])

static bool is(const reserved_field *r, const char *what, size_t ours)
{
    return r->type_size == ours && strcmp(r->type, what) == 0;
}

flame_status fl_struct_size_check(const char *what, size_t size, size_t ours)
{
    /* a multiple of 8: every public struct starts with its size_t and holds 8-byte fields, so
     * its sizeof is one; any other size ends inside a field, and copying that many bytes would
     * take half of a pointer or length */
    if (size < sizeof(size_t) || size > FL_STRUCT_SIZE_MAX || size % 8)
        return fl_error(FLAME_ERR_INVALID_ARG,
                        "%s.struct_size = %zu: set it to sizeof(%s) (%zu in this library; multiples of 8 in %zu..%d "
                        "accepted)", what, size, what, ours, sizeof(size_t), FL_STRUCT_SIZE_MAX);
    return FLAME_OK;
}

flame_status fl_struct_reserved(const char *what, size_t ours, const void *src, size_t theirs)
{
    for (size_t i = 0; i < NUM_RESERVED; i++) {
        const reserved_field *r = &reserved[i];
        if (!is(r, what, ours) || theirs < r->since) continue;
        uint64_t v = 0; /* (every reserved field is 4 or 8 bytes) */
        if (r->size == 4) {
            uint32_t v32;
            memcpy(&v32, (const unsigned char *)src + r->offset, sizeof v32);
            v = v32;
        } else {
            memcpy(&v, (const unsigned char *)src + r->offset, sizeof v);
        }
        if (v)
            return fl_error(FLAME_ERR_INVALID_ARG, "%s.%s = %llu: a reserved field, must be 0", what,
                            r->field, (unsigned long long)v);
    }
    return FLAME_OK;
}

flame_status fl_struct_in(const char *what, void *dst, size_t ours, const void *src)
{
    size_t theirs = fl_struct_size_of(src);
    flame_status st = fl_struct_size_check(what, theirs, ours);
    if (!st) st = fl_struct_reserved(what, ours, src, theirs);
    if (st) return st;
    size_t n = theirs < ours ? theirs : ours;
    memcpy(dst, src, n);
    memcpy(dst, &ours, sizeof ours);
    for (size_t i = 0; i < NUM_RESERVED; i++) /* an older header's padding: not a value */
        if (is(&reserved[i], what, ours) && theirs < reserved[i].since)
            memset((unsigned char *)dst + reserved[i].offset, 0, reserved[i].size);
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
    for (size_t i = 0; i < NUM_RESERVED; i++) /* written as 0, whatever the library's copy held */
        if (is(&reserved[i], what, ours) && reserved[i].offset + reserved[i].size <= n)
            memset((unsigned char *)dst + reserved[i].offset, 0, reserved[i].size);
    return FLAME_OK;
}
