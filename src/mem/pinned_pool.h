/* Internals of the pinned host buffer pool that tests reach (the API is in flame.h). */
#ifndef FLAME_MEM_PINNED_POOL_H
#define FLAME_MEM_PINNED_POOL_H

#include <stddef.h>

typedef int (*fl_pin_fn)(void *p, size_t bytes, char *why, size_t why_len);
typedef void (*fl_unpin_fn)(void *p);

/* Tests only: pools created after this call pin through `pin`/`unpin` as if a CUDA device were
 * usable (NULL, NULL: back to the CUDA runtime, device.h). Lets a machine without a GPU
 * exercise the pinned and the failed-pin paths. */
void fl_pinned_set_pin_hooks(fl_pin_fn pin, fl_unpin_fn unpin);

#endif
