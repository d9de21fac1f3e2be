// The KV cache's row copies on the device: cached K/V rows of one layer from their blocks into
// the contiguous K/V workspace the attention kernel reads (gather), computed rows from the
// workspace into their blocks (scatter), and the computed tokens' K/V from the fused QKV
// output to their rows in the workspace. One CTA per row, 16-byte accesses where the row
// allows them (every row start is a multiple of d elements, so d * esize % 16 == 0 decides).
#include <initializer_list>

#include "kernels.cuh"

// Copies `bytes` bytes (a multiple of `unit`: 16, 4 or 2, the access every address allows).
template <typename U> __device__ __forceinline__ void copy_units(uint8_t *dst, const uint8_t *src, int64_t bytes)
{
    const U *s = reinterpret_cast<const U *>(src);
    U *d = reinterpret_cast<U *>(dst);
    for (int64_t j = threadIdx.x; j < bytes / (int64_t)sizeof(U); j += blockDim.x) d[j] = s[j];
}
__device__ __forceinline__ void copy_row(uint8_t *dst, const uint8_t *src, int64_t bytes, int unit)
{
    if (unit == 16)
        copy_units<int4>(dst, src, bytes);
    else if (unit == 4)
        copy_units<uint32_t>(dst, src, bytes);
    else
        copy_units<uint16_t>(dst, src, bytes);
}

// The widest access unit (16, 4 or 2 bytes) dividing every value.
static int unit_of(std::initializer_list<uint64_t> v)
{
    uint64_t all = 0;
    for (uint64_t x : v) all |= x;
    return all % 16 == 0 ? 16 : all % 4 == 0 ? 4 : 2;
}

// Row i: K and V of workspace row rows[i].ws <-> block bytes at rows[i].off + layer_off
// (K) and + layer_off + kv_stride (V).
__global__ void kv_blocks_kernel(uint8_t *blocks, const fl_kv_dev_row *rows, int64_t count, uint64_t layer_off,
                                 uint64_t kv_stride, uint8_t *ws, int64_t ld_bytes, int64_t row_bytes, bool to_blocks,
                                 int unit)
{
    const int64_t i = blockIdx.y * (int64_t)gridDim.x + blockIdx.x;
    if (i >= count) return;
    const fl_kv_dev_row r = rows[i];
    for (int kv = 0; kv < 2; kv++) {
        uint8_t *blk = blocks + r.off + layer_off + (uint64_t)kv * kv_stride;
        uint8_t *w = ws + r.ws * ld_bytes + (int64_t)kv * row_bytes;
        if (to_blocks)
            copy_row(blk, w, row_bytes, unit);
        else
            copy_row(w, blk, row_bytes, unit);
    }
}

flame_status fl_cuda_kv_blocks(uint8_t *blocks, const fl_kv_dev_row *rows, int64_t count, uint64_t layer_off,
                               uint64_t kv_stride, void *ws, int64_t ld_bytes, int64_t row_bytes, bool to_blocks,
                               cudaStream_t s)
{
    if (count == 0) return FLAME_OK;
    const int unit = unit_of({(uint64_t)row_bytes, (uint64_t)ld_bytes, layer_off, kv_stride, (uintptr_t)blocks,
                              (uintptr_t)ws});
    if ((row_bytes | ld_bytes) % 2 || layer_off % 2 || kv_stride % 2 || (uintptr_t)blocks % 2 || (uintptr_t)ws % 2)
        return fl_error(FLAME_ERR_INTERNAL, "KV cache rows of %lld bytes: not 2-byte aligned", (long long)row_bytes);
    const unsigned gx = count < 65535 ? (unsigned)count : 65535u;
    kv_blocks_kernel<<<dim3(gx, ceil_div(count, gx)), 64, 0, s>>>(blocks, rows, count, layer_off, kv_stride,
                                                                  static_cast<uint8_t *>(ws), ld_bytes, row_bytes,
                                                                  to_blocks, unit);
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}

// Row i of src (ld_src bytes apart, `bytes` bytes) to row map[i] of dst (ld_dst bytes apart).
__global__ void scatter_kernel(const uint8_t *src, int64_t ld_src, const int64_t *map, int64_t count, int64_t bytes,
                               uint8_t *dst, int64_t ld_dst, int unit)
{
    const int64_t i = blockIdx.y * (int64_t)gridDim.x + blockIdx.x;
    if (i >= count) return;
    copy_row(dst + map[i] * ld_dst, src + i * ld_src, bytes, unit);
}

flame_status fl_cuda_scatter_rows(const void *src, int64_t ld_src, const int64_t *map, int64_t count, int64_t bytes,
                                  void *dst, int64_t ld_dst, cudaStream_t s)
{
    if (count == 0) return FLAME_OK;
    const int unit = unit_of({(uint64_t)bytes, (uint64_t)ld_src, (uint64_t)ld_dst, (uintptr_t)src, (uintptr_t)dst});
    if ((bytes | ld_src | ld_dst) % 2 || (uintptr_t)src % 2 || (uintptr_t)dst % 2)
        return fl_error(FLAME_ERR_INTERNAL, "row scatter of %lld bytes: not 2-byte aligned", (long long)bytes);
    const unsigned gx = count < 65535 ? (unsigned)count : 65535u;
    scatter_kernel<<<dim3(gx, ceil_div(count, gx)), 64, 0, s>>>(static_cast<const uint8_t *>(src), ld_src, map, count,
                                                                bytes, static_cast<uint8_t *>(dst), ld_dst, unit);
    FL_LAUNCH_CHECK();
    return FLAME_OK;
}
