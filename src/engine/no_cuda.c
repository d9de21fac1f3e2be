/* Stand-in for cuda/ when the library is built without CUDA (make CUDA=0). */
#include "core/device.h"
#include "engine/cuda_backend.h"

int fl_cuda_device_count(char *why, size_t why_len)
{
    snprintf(why, why_len, "this libflame was built without CUDA (make CUDA=0 or no nvcc)");
    return 0;
}

/* Unreachable: the engine asks for a GPU only when fl_cuda_device_count found one. */
flame_status fl_cuda_engine_create(const fl_model_cfg *mc, const fl_weights *w, int64_t num_items,
                                   const struct flame_config *cfg, int device, fl_cuda_engine **out)
{
    *out = NULL;
    return fl_error(FLAME_ERR_NO_DEVICE, "this libflame was built without CUDA");
}

void fl_cuda_engine_destroy(fl_cuda_engine *g)
{
    (void)g;
}

flame_status fl_cuda_score(fl_cuda_engine *g, const flame_request *reqs, size_t n, float *scores, fl_cuda_times *times)
{
    return fl_error(FLAME_ERR_INTERNAL, "no CUDA backend in this build");
}

flame_status fl_cuda_score_topk(fl_cuda_engine *g, const flame_request *reqs, size_t n, uint32_t k, uint32_t task,
                                int64_t *ids, float *scores, fl_cuda_times *times)
{
    return fl_error(FLAME_ERR_INTERNAL, "no CUDA backend in this build");
}

flame_status fl_cuda_kv_attach(fl_cuda_engine *g, struct fl_kv_cache *kv, const fl_kv_layout *lay)
{
    (void)g, (void)kv, (void)lay;
    return fl_error(FLAME_ERR_INTERNAL, "no CUDA backend in this build");
}

uint64_t fl_cuda_device_bytes(const fl_cuda_engine *g)
{
    return 0;
}

uint64_t fl_cuda_weight_bytes(const fl_cuda_engine *g)
{
    return 0;
}

void fl_cuda_graph_counts(const fl_cuda_engine *g, uint64_t *captures, uint64_t *replays)
{
    *captures = *replays = 0;
}

void fl_cuda_adopt_profiles(fl_cuda_engine *g, const fl_batch_profiles *ps)
{
    (void)g, (void)ps;
}

flame_status fl_cuda_warm_profiles(fl_cuda_engine *g)
{
    (void)g;
    return FLAME_OK;
}

void fl_cuda_profile_counts(const fl_cuda_engine *g, uint64_t *passes, uint64_t *padding_tokens)
{
    *passes = *padding_tokens = 0;
}

int fl_cuda_host_register(void *p, size_t bytes, char *why, size_t why_len)
{
    snprintf(why, why_len, "this libflame was built without CUDA: cannot pin %zu bytes at %p", bytes, p);
    return -1;
}

void fl_cuda_host_unregister(void *p)
{
    (void)p;
}

/* The public kernels' GPU side (src/kernels/kernels_gpu.h): every GPU call is refused. */
#include "kernels/kernels_gpu.h"

flame_status fl_gpu_kernels_device(int device)
{
    return fl_error(FLAME_ERR_UNSUPPORTED, "device %d: this libflame was built without CUDA", device);
}

flame_status fl_gpu_kernels_check_pointer(int device, const void *p, const char *what)
{
    return fl_gpu_kernels_device(device);
}

flame_status fl_gpu_kernels_upload(int device, const void *host, size_t bytes, void **dev)
{
    *dev = NULL;
    return fl_gpu_kernels_device(device);
}

void fl_gpu_kernels_free(int device, void *dev)
{
    (void)dev;
}

flame_status fl_gpu_kernels_copy_in(int device, void *dev, const void *host, size_t bytes, void *stream)
{
    return fl_gpu_kernels_device(device);
}

flame_status fl_gpu_tbe_forward(int device, const fl_tbe_table *tables, int num_tables, bool sum_combine,
                                int32_t width, const fl_tbe_lookup *lookups, int64_t batch, void *out, int64_t ld_out,
                                flame_dtype out_dtype, void *stream, int threads)
{
    return fl_gpu_kernels_device(device);
}

flame_status fl_gpu_attention(int device, flame_dtype dtype, const fl_attn_seq *seqs, int64_t num_seqs,
                              int64_t rows, bool none_mask, int32_t heads, int32_t dh, const void *q, int64_t ldq,
                              const void *k, const void *v, int64_t ldkv, void *out, int64_t ldo, bool fused,
                              void *stream)
{
    return fl_gpu_kernels_device(device);
}
