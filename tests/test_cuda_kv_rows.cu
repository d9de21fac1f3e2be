/* The KV cache's row copies on the device (cuda/kv_rows.cu) against a host copy of the same
 * bytes on fresh random inputs: cached rows from their blocks into the K/V workspace, computed
 * rows from the workspace into their blocks (for a random layer, the layout of
 * src/kvcache/kvlayout.h), and token rows to their workspace rows; 2- and 4-byte elements, row
 * widths that allow 16-, 4- and only 2-byte accesses, padded workspace rows, 1..16-token
 * blocks. Destinations are poisoned first; bytes no row covers must stay poisoned. Skipped
 * with a message where no GPU is usable; FLAME_REQUIRE_GPU turns the skip into a failure. */
#include <algorithm>
#include <vector>

extern "C" {
#include "testutil.h"
#include "tu_gpu.h"
#include "kvcache/kvlayout.h"
}
#include "kernels.cuh"
#include "tu_cuda.cuh"

#define POISON 0xA5

static std::vector<uint8_t> random_bytes(size_t n)
{
    std::vector<uint8_t> v(n);
    for (uint8_t &b : v) b = (uint8_t)tu_below(256);
    return v;
}

/* `count` distinct values below n, in random order */
static std::vector<int64_t> distinct(int64_t n, int64_t count)
{
    std::vector<int64_t> all((size_t)n);
    for (int64_t i = 0; i < n; i++) all[(size_t)i] = i;
    for (int64_t i = n - 1; i > 0; i--) std::swap(all[(size_t)i], all[(size_t)tu_below(i + 1)]);
    all.resize((size_t)count);
    return all;
}

template <typename V> static V *upload(const std::vector<V> &h)
{
    V *d = nullptr;
    CK(cudaMalloc(&d, h.size() * sizeof(V) + 16));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(V), cudaMemcpyHostToDevice));
    return d;
}

template <typename V> static std::vector<V> download(const V *d, size_t n)
{
    std::vector<V> h(n);
    CK(cudaMemcpy(h.data(), d, n * sizeof(V), cudaMemcpyDeviceToHost));
    return h;
}

/* one case: blocks of B tokens, `layers` layers, rows of d elements of `elem` bytes; a
 * workspace of W rows, ld_pad bytes past its K and V */
static void run_case(int elem, int d, int B, int layers, int64_t ld_pad)
{
    const fl_kv_layout lay = {layers, d, B, elem};
    const int nblocks = 7;
    const int64_t row = (int64_t)d * elem, ld = 2 * row + ld_pad, W = 40;
    const size_t block_bytes = (size_t)B * fl_kv_token_bytes(&lay);
    const int64_t slots = (int64_t)nblocks * B, count = std::min<int64_t>(slots, W) - 1;
    const int layer = (int)tu_below(layers);
    const std::vector<int64_t> where = distinct(slots, count), ws_rows = distinct(W, count);
    std::vector<fl_kv_dev_row> rows((size_t)count);
    for (int64_t i = 0; i < count; i++) {
        const int32_t blk = (int32_t)(where[(size_t)i] / B), r = (int32_t)(where[(size_t)i] % B);
        rows[(size_t)i] = {fl_kv_row_offset(&lay, blk, 0, 0, r), ws_rows[(size_t)i]};
    }
    const uint64_t layer_off = fl_kv_row_offset(&lay, 0, layer, 0, 0), kv_stride = fl_kv_row_offset(&lay, 0, 0, 1, 0);
    fl_kv_dev_row *drows = upload(rows);

    /* gather: blocks -> workspace */
    std::vector<uint8_t> blocks = random_bytes(nblocks * block_bytes), ws((size_t)(W * ld), POISON);
    uint8_t *dblocks = upload(blocks), *dws = upload(ws);
    assert_int_equal(fl_cuda_kv_blocks(dblocks, drows, count, layer_off, kv_stride, dws, ld, row, false, nullptr),
                     FLAME_OK);
    CK(cudaDeviceSynchronize());
    for (int64_t i = 0; i < count; i++)
        for (int kv = 0; kv < 2; kv++)
            memcpy(&ws[(size_t)(rows[(size_t)i].ws * ld + kv * row)],
                   &blocks[(size_t)(rows[(size_t)i].off + layer_off + (uint64_t)kv * kv_stride)], (size_t)row);
    if (download(dws, ws.size()) != ws)
        fail_msg("gather: elem %d d %d B %d ld_pad %lld: the workspace differs", elem, d, B, (long long)ld_pad);

    /* store: workspace -> blocks (the workspace now random, the blocks poisoned) */
    ws = random_bytes((size_t)(W * ld));
    blocks.assign(nblocks * block_bytes, POISON);
    CK(cudaMemcpy(dws, ws.data(), ws.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dblocks, blocks.data(), blocks.size(), cudaMemcpyHostToDevice));
    assert_int_equal(fl_cuda_kv_blocks(dblocks, drows, count, layer_off, kv_stride, dws, ld, row, true, nullptr),
                     FLAME_OK);
    CK(cudaDeviceSynchronize());
    for (int64_t i = 0; i < count; i++)
        for (int kv = 0; kv < 2; kv++)
            memcpy(&blocks[(size_t)(rows[(size_t)i].off + layer_off + (uint64_t)kv * kv_stride)],
                   &ws[(size_t)(rows[(size_t)i].ws * ld + kv * row)], (size_t)row);
    if (download(dblocks, blocks.size()) != blocks)
        fail_msg("store: elem %d d %d B %d ld_pad %lld: the blocks differ", elem, d, B, (long long)ld_pad);

    /* token rows (K and V of a fused QKV row: src stride 3 rows, from its second row) -> workspace */
    const int64_t lds = 3 * row;
    std::vector<uint8_t> src = random_bytes((size_t)(count * lds));
    ws.assign((size_t)(W * ld), POISON);
    uint8_t *dsrc = upload(src);
    int64_t *dmap = upload(ws_rows);
    CK(cudaMemcpy(dws, ws.data(), ws.size(), cudaMemcpyHostToDevice));
    assert_int_equal(fl_cuda_scatter_rows(dsrc + row, lds, dmap, count, 2 * row, dws, ld, nullptr), FLAME_OK);
    CK(cudaDeviceSynchronize());
    for (int64_t i = 0; i < count; i++)
        memcpy(&ws[(size_t)(ws_rows[(size_t)i] * ld)], &src[(size_t)(i * lds + row)], (size_t)(2 * row));
    if (download(dws, ws.size()) != ws)
        fail_msg("scatter: elem %d d %d ld_pad %lld: the workspace differs", elem, d, (long long)ld_pad);

    /* nothing to copy: no launch, no change */
    assert_int_equal(fl_cuda_kv_blocks(dblocks, drows, 0, layer_off, kv_stride, dws, ld, row, true, nullptr), FLAME_OK);
    assert_int_equal(fl_cuda_scatter_rows(dsrc, lds, dmap, 0, 2 * row, dws, ld, nullptr), FLAME_OK);
    CK(cudaDeviceSynchronize());
    CK(cudaFree(drows));
    CK(cudaFree(dblocks));
    CK(cudaFree(dws));
    CK(cudaFree(dsrc));
    CK(cudaFree(dmap));
}

static void test_rows(void **state)
{
    (void)state;
    TU_NEED_GPU();
    const int dims[] = {32, 16, 33, 8, 1};  /* 16-byte, 4-byte (fp16 d 16 with padding), 2-byte rows */
    const int tokens[] = {1, 5, 16};
    const int64_t pads[] = {0, 2, 16};
    for (int elem = 2; elem <= 4; elem += 2)
        for (int d : dims)
            for (int B : tokens)
                for (int64_t pad : pads) run_case(elem, d, B, 3, pad);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows),
    };
    return cmocka_run_group_tests(tests, tu_gpu_setup, NULL);
}
