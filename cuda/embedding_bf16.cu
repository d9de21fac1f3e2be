// The table-batched embedding bag over bfloat16 tables, into each output dtype (cuda/embedding.cuh).
#include "embedding.cuh"

#define INSTANTIATE(T, O)                                                                                      \
    template flame_status fl_cuda_embedding_bag<T, O>(const fl_dev_features &, int64_t, O *, int64_t, cudaStream_t);
INSTANTIATE(__nv_bfloat16, float)
INSTANTIATE(__nv_bfloat16, __half)
INSTANTIATE(__nv_bfloat16, __nv_bfloat16)
