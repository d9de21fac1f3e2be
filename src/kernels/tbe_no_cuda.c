/* The device-index record of the GPU embedding bag (src/kernels/kernels_gpu.h) in a build
 * without CUDA: never reached, since such a build makes no GPU handle. */
#ifndef FLAME_WITH_CUDA
#include "kernels/kernels_gpu.h"

flame_status fl_gpu_tbe_record_create(int device, fl_tbe_index_record **record, fl_tbe_index_record **mirror)
{
    *record = *mirror = NULL;
    return fl_gpu_kernels_device(device);
}

void fl_gpu_tbe_record_free(int device, fl_tbe_index_record *record, fl_tbe_index_record *mirror)
{
    (void)device, (void)record, (void)mirror;
}

flame_status fl_gpu_tbe_forward_device(int device, const fl_tbe_table *tables, int num_tables, bool sum_combine,
                                       int32_t width, const fl_tbe_lookup *lookups, int64_t batch, void *out,
                                       int64_t ld_out, flame_dtype out_dtype, void *stream,
                                       fl_tbe_index_record *record)
{
    (void)tables, (void)num_tables, (void)sum_combine, (void)width, (void)lookups, (void)batch, (void)out;
    (void)ld_out, (void)out_dtype, (void)stream, (void)record;
    return fl_gpu_kernels_device(device);
}

flame_status fl_gpu_tbe_record_read(int device, fl_tbe_index_record *record, fl_tbe_index_record *mirror,
                                    void *stream)
{
    (void)record, (void)mirror, (void)stream;
    return fl_gpu_kernels_device(device);
}
#else
typedef int fl_tbe_no_cuda_unused; /* ISO C wants a translation unit to declare something */
#endif
