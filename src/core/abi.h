/* The one ABI rule for every public struct that starts with `size_t struct_size` (flame.h,
 * "Structs and the ABI"). The caller's struct_size says which header it was built against:
 *   - smaller than this library's sizeof (an older flame.h): the fields it lacks take their
 *     defaults on input (0, "none", for most structs; each struct documents its own); on
 *     output only the bytes it holds are written;
 *   - larger (a newer flame.h): the fields this library does not know are not read on input
 *     and left untouched on output.
 * struct_size must cover at least the struct_size field itself and be at most
 * FL_STRUCT_SIZE_MAX (which catches an uninitialised field before it is used as a length).
 * Reserved fields (the bytes alignment would leave as trailing padding, named in the header;
 * abi.c lists them) must be 0 on input, unless the caller's struct is shorter than the header
 * that named them (an older header's padding: not read, 0 in the library's copy), and are
 * written as 0 on output. */
#ifndef FLAME_CORE_ABI_H
#define FLAME_CORE_ABI_H

#include <stdbool.h>
#include <string.h>

#include "core/common.h"

#define FL_STRUCT_SIZE_MAX 4096

/* FLAME_OK when `size` can be a caller's struct_size; else FLAME_ERR_INVALID_ARG naming
 * `what` (e.g. "flame_scheduler_params"), the size and the accepted range. */
flame_status fl_struct_size_check(const char *what, size_t size, size_t ours);

/* FLAME_OK when every reserved field of struct `what` (ours bytes in this library) that the
 * caller's struct at src (theirs bytes, its struct_size) holds is 0; else
 * FLAME_ERR_INVALID_ARG naming the field and its value. For structs read in place (the
 * requests of flame_score_batch); fl_struct_in checks them itself. */
flame_status fl_struct_reserved(const char *what, size_t ours, const void *src, size_t theirs);

/* *dst (ours bytes, this header's layout, holding the defaults on entry) takes the caller's
 * struct at src: the smaller of the two sizes is copied over the defaults, the rest keeps
 * them; dst->struct_size = ours. */
flame_status fl_struct_in(const char *what, void *dst, size_t ours, const void *src);

/* Writes this library's struct `src` (ours bytes) into the caller's `dst` up to the caller's
 * struct_size; the caller's struct_size itself is kept. */
flame_status fl_struct_out(const char *what, void *dst, const void *src, size_t ours);

/* The caller's struct_size of a struct at p (the first member of every public struct). */
static inline size_t fl_struct_size_of(const void *p)
{
    size_t s;
    memcpy(&s, p, sizeof s);
    return s;
}

#endif
