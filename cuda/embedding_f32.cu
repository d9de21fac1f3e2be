// The table-batched embedding bag over float32 tables, into each output dtype (cuda/embedding.cuh).
#include "embedding.cuh"

#define INSTANTIATE(T, O)                                                                                      \
    template flame_status fl_cuda_embedding_bag<T, O>(const fl_dev_features &, int64_t, O *, int64_t, cudaStream_t);
INSTANTIATE(float, float)
INSTANTIATE(float, __half)
INSTANTIATE(float, __nv_bfloat16)
