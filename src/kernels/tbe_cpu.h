/* The CPU embedding bag of the public API over validated lookups (src/kernels/tbe_cpu.c). */
#ifndef FLAME_KERNELS_TBE_CPU_H
#define FLAME_KERNELS_TBE_CPU_H

#include "kernels/kernels_gpu.h"

/* out[b, 0:width] for bags 0..batch-1 (row stride ld), split over `threads` threads of libflame's pool (core/pool.h). */
void fl_tbe_cpu_forward(const fl_tbe_table *tables, int num_tables, const fl_tbe_lookup *lookups, int64_t batch,
                        float *out, int64_t ld, int32_t width, int threads);

#endif
