/* The public kernels (flame/kernels.h) on a GPU, against float64 references on fresh random
 * inputs, through the public calls only: the embedding bag (copied and borrowed device tables,
 * F32/F16/BF16 float tables mixed with INT8 ones, per-id weights, concat and sum combine,
 * F32/F16/BF16 outputs with a NaN-poisoned, strided output whose gap must stay poisoned, row
 * updates ordered by the stream) and SUMI attention (F16/BF16/F32, every mask, fused and
 * separate Q/K/V, aligned strides that take the tensor-core kernels and odd ones that take the
 * CUDA-core kernel, shapes large enough for the Hopper kernel); the calls return while a busy
 * stream still runs (no hidden synchronization); rejections write nothing. Skipped with a
 * message where no GPU is usable; FLAME_REQUIRE_GPU turns the skip into a failure. */
#include <vector>

extern "C" {
#include "testutil.h"
#include "tu_gpu.h"
#include "tu_kernels.h"
}
#include "tu_cuda.cuh"

// A stream held busy until the test lets it go, by construction rather than by timing: a kernel
// spins until a flag in host-mapped memory is set (or about 10 s pass, so that a call that did
// wait for the stream ends the test with a failed check instead of a hang).
__global__ void wait_for_flag(const volatile int *flag, long long max_cycles)
{
    const long long t0 = clock64();
    while (*flag == 0 && clock64() - t0 < max_cycles) {
    }
}

static volatile int *gate_host;
static int *gate_dev;

static void hold(cudaStream_t s)
{
    if (!gate_host) {
        void *h = nullptr;
        CK(cudaHostAlloc(&h, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
        gate_host = static_cast<volatile int *>(h);
        CK(cudaHostGetDevicePointer((void **)&gate_dev, h, 0));
    }
    *gate_host = 0;
    __sync_synchronize();
    int khz = 0;
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    wait_for_flag<<<1, 1, 0, s>>>(gate_dev, (long long)khz * 10000);
    CK(cudaGetLastError());
}

static void let_go(void)
{
    *gate_host = 1;
    __sync_synchronize();
}

// The stream is still held (the calls since hold() did not wait for it); then lets it go.
static void assert_held_then_let_go(cudaStream_t s)
{
    const cudaError_t q = cudaStreamQuery(s);
    (void)cudaGetLastError();
    let_go();
    if (q != cudaErrorNotReady)
        fail_msg("the held stream is %s: a call since hold() waited for it (so the gate kernel ran into its "
                 "10 s timeout) instead of returning once its work was enqueued",
                 q == cudaSuccess ? "idle" : cudaGetErrorString(q));
}

template <typename X> static X *dev_copy(const X *h, size_t n)
{
    X *d = nullptr;
    CK(cudaMalloc(&d, n * sizeof(X) + 16));
    if (n) CK(cudaMemcpy(d, h, n * sizeof(X), cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize()); // a pageable copy may return before its DMA ends; the calls run on other streams
    return d;
}

// dst (device) = bytes of src (host), finished before anything enqueued after it on any stream
/* Writes device memory between forwards: the work already enqueued on the tests' non-blocking
 * streams finishes first (cudaMemcpy's legacy stream does not wait for them), so a forward sees
 * the values poked before it and never those poked after it. */
static void poke(void *dst, const void *src, size_t bytes)
{
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
}

static size_t esize(flame_dtype d)
{
    return d == FLAME_DTYPE_F32 ? 4 : d == FLAME_DTYPE_INT8 ? 1 : 2;
}

// element i of a host copy of a device output of dtype d, as float
static float out_at(const std::vector<uint8_t> &h, size_t i, flame_dtype d)
{
    if (d == FLAME_DTYPE_F32) return reinterpret_cast<const float *>(h.data())[i];
    if (d == FLAME_DTYPE_F16) return from_t(reinterpret_cast<const __half *>(h.data())[i]);
    return from_t(reinterpret_cast<const __nv_bfloat16 *>(h.data())[i]);
}

/* ---- embedding bag */

static void run_tbe_case(bool borrow, flame_dtype out_dtype, cudaStream_t s)
{
    const int nt = 1 + (int)tu_below(5);
    const bool sum = tu_below(3) == 0;
    const int32_t sum_dim = tu_below(3) == 0 ? 16 * (1 + (int32_t)tu_below(8)) : 1 + (int32_t)tu_below(70);
    const int64_t batch = tu_below(300);
    const flame_dtype fdt = (flame_dtype)tu_below(3); // the handle's float dtype
    std::vector<tuk_table> t(nt);
    std::vector<tuk_lookup> l(nt);
    std::vector<flame_embedding_table> d(nt);
    std::vector<void *> borrowed;
    int32_t width = 0;
    for (int f = 0; f < nt; f++) {
        const flame_dtype dt = tu_below(3) == 0 ? FLAME_DTYPE_INT8 : fdt;
        const int32_t dim = sum ? sum_dim : (tu_below(2) ? 16 * (1 + (int32_t)tu_below(8)) : 1 + (int32_t)tu_below(70));
        tuk_table_fill(&t[f], dt, 1 + tu_below(1000), dim, (flame_pooling)tu_below(2));
        tuk_lookup_fill(&l[f], &t[f], batch, tu_below(4) == 0, tu_below(3) == 0, 12);
        d[f] = tuk_desc(&t[f]);
        if (borrow) {
            d[f].data = dev_copy((const uint8_t *)t[f].data, (size_t)t[f].rows * dim * esize(dt));
            borrowed.push_back((void *)d[f].data);
            if (t[f].qp) {
                d[f].qparams = dev_copy(t[f].qp, (size_t)t[f].rows * 2);
                borrowed.push_back((void *)d[f].qparams);
            }
        }
        width = sum ? dim : width + dim;
    }
    flame_embedding_bag_params p = {sizeof p, 0, sum ? FLAME_COMBINE_SUM : FLAME_COMBINE_CONCAT, d.data(),
                                    (size_t)nt, borrow ? 1 : 0};
    flame_embedding_bag *bag = nullptr;
    if (flame_embedding_bag_create(&p, &bag)) fail_msg("create: %s", flame_last_error());
    const int64_t ld = width + tu_below(3);
    const size_t es = esize(out_dtype), bytes = (size_t)(batch * ld) * es;
    void *out;
    CK(cudaMalloc(&out, bytes + 16));
    CK(cudaMemset(out, 0xff, bytes + 16)); // NaN in every float dtype
    std::vector<flame_embedding_bag_input> in(nt);
    for (int f = 0; f < nt; f++) in[f] = tuk_input(&l[f]);
    flame_embedding_bag_batch q = {sizeof q, batch, in.data(), (size_t)nt, out, ld, out_dtype, s, 0, 0};
    hold(s);
    if (flame_embedding_bag_forward(bag, &q)) {
        let_go();
        fail_msg("forward: %s", flame_last_error());
    }
    assert_held_then_let_go(s); // the call did not wait
    CK(cudaStreamSynchronize(s));
    std::vector<uint8_t> h(bytes + 16);
    CK(cudaMemcpy(h.data(), out, bytes, cudaMemcpyDeviceToHost));
    std::vector<double> want((size_t)(batch * width) + 1);
    tuk_tbe_reference(t.data(), l.data(), nt, sum, batch, width, want.data());
    std::vector<float> got((size_t)(batch * width) + 1);
    for (int64_t b = 0; b < batch; b++) {
        for (int32_t j = 0; j < width; j++) got[b * width + j] = out_at(h, (size_t)(b * ld + j), out_dtype);
        for (int64_t j = width; j < ld; j++) assert_true(isnan(out_at(h, (size_t)(b * ld + j), out_dtype)));
    }
    const double bound = out_dtype == FLAME_DTYPE_F32 ? 1e-5 : out_dtype == FLAME_DTYPE_F16 ? 2e-3 : 1e-2;
    if (batch) assert_rel_err_below(got.data(), want.data(), (size_t)(batch * width), bound);
    flame_embedding_bag_destroy(bag);
    CK(cudaFree(out));
    for (void *b : borrowed) CK(cudaFree(b));
    for (int f = 0; f < nt; f++) {
        tuk_table_free(&t[f]);
        tuk_lookup_free(&l[f]);
    }
}

static void test_gpu_tbe_against_reference(void **state)
{
    TU_NEED_GPU();
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int rep = 0; rep < 60; rep++)
        run_tbe_case(rep % 2 == 1, (flame_dtype)(rep % 3), s);
    CK(cudaStreamDestroy(s));
}

/* Rows replaced on a stream are seen by the forwards enqueued after them on that stream;
 * a rejected lookup writes nothing. */
static void test_gpu_tbe_update_and_rejections(void **state)
{
    TU_NEED_GPU();
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    tuk_table t, nw;
    tuk_table_fill(&t, FLAME_DTYPE_INT8, 50, 32, FLAME_POOLING_SUM);
    tuk_table_fill(&nw, FLAME_DTYPE_INT8, 1, 32, FLAME_POOLING_SUM);
    flame_embedding_table d = tuk_desc(&t);
    flame_embedding_bag_params p = {sizeof p, 0, FLAME_COMBINE_CONCAT, &d, 1, 0};
    flame_embedding_bag *bag;
    assert_int_equal(flame_embedding_bag_create(&p, &bag), FLAME_OK);
    int64_t ids[2] = {7, 8};
    flame_embedding_bag_input in = {sizeof in, ids, NULL, 2, NULL};
    float *out;
    CK(cudaMalloc(&out, 64 * sizeof(float)));
    CK(cudaMemset(out, 0xff, 64 * sizeof(float)));
    flame_embedding_bag_batch q = {sizeof q, 2, &in, 1, out, 0, FLAME_DTYPE_F32, s, 0, 0};
    hold(s);
    const flame_status up = flame_embedding_bag_update_rows(bag, 0, 7, 1, nw.data, FLAME_DTYPE_INT8, nw.qp, s);
    const flame_status fw = flame_embedding_bag_forward(bag, &q);
    assert_held_then_let_go(s);
    assert_int_equal(up, FLAME_OK);
    assert_int_equal(fw, FLAME_OK);
    CK(cudaStreamSynchronize(s));
    float h[64];
    CK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost));
    double want[64];
    for (int j = 0; j < 32; j++) {
        want[j] = nw.value[j];
        want[32 + j] = t.value[8 * 32 + j];
    }
    assert_rel_err_below(h, want, 64, 1e-6);
    CK(cudaMemset(out, 0xff, 64 * sizeof(float)));
    ids[1] = 50;
    assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG, "table 0 bag 1: ids[1] = 50 is outside 0..49");
    ids[1] = 8;
    q.out_dtype = FLAME_DTYPE_INT8;
    assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG, "out_dtype INT8 is not written by the GPU");
    q.out_dtype = FLAME_DTYPE_F32;
    static float host_out[64];
    q.out = host_out; /* pageable host memory would fault in the kernel */
    assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG, "is pageable host memory");
    q.out = out;
    cudaStream_t cap; /* a stream capturing a graph: refused, nothing captured */
    CK(cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking));
    CK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal));
    q.cuda_stream = cap;
    assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_UNSUPPORTED, "captured into a CUDA graph");
    cudaGraph_t graph;
    CK(cudaStreamEndCapture(cap, &graph));
    size_t nodes = 99;
    CK(cudaGraphGetNodes(graph, nullptr, &nodes));
    assert_int_equal(nodes, 0);
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(cap));
    q.cuda_stream = s;
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; i++) assert_true(isnan(h[i]));
    /* a borrowed table in host memory */
    flame_embedding_table hd = tuk_desc(&t);
    flame_embedding_bag_params hp = {sizeof hp, 0, FLAME_COMBINE_CONCAT, &hd, 1, 1};
    flame_embedding_bag *hb;
    assert_status_msg(flame_embedding_bag_create(&hp, &hb), FLAME_ERR_INVALID_ARG, "table 0 data");
    assert_null(hb);
    flame_embedding_bag_destroy(bag);
    /* float tables of two dtypes in one GPU handle */
    tuk_table a, b;
    tuk_table_fill(&a, FLAME_DTYPE_F16, 5, 8, FLAME_POOLING_SUM);
    tuk_table_fill(&b, FLAME_DTYPE_BF16, 5, 8, FLAME_POOLING_SUM);
    flame_embedding_table two[2] = {tuk_desc(&a), tuk_desc(&b)};
    p.tables = two;
    p.num_tables = 2;
    assert_status_msg(flame_embedding_bag_create(&p, &bag), FLAME_ERR_UNSUPPORTED, "share one dtype");
    p.device = 4096;
    p.num_tables = 1;
    assert_status_msg(flame_embedding_bag_create(&p, &bag), FLAME_ERR_NO_DEVICE, "device 4096");
    tuk_table_free(&a);
    tuk_table_free(&b);
    tuk_table_free(&t);
    tuk_table_free(&nw);
    CK(cudaFree(out));
    CK(cudaStreamDestroy(s));
}

/* ---- device-resident ids, offsets and weights */

// A device copy of a lookup's arrays, and the input that points at them.
struct dev_lookup {
    int64_t *ids = nullptr, *offsets = nullptr;
    float *weights = nullptr;
    flame_embedding_bag_input in{};
};

static void dev_lookup_make(dev_lookup *d, const tuk_lookup *l, int64_t batch)
{
    d->ids = dev_copy(l->ids, (size_t)l->num_ids);
    d->offsets = l->offsets ? dev_copy(l->offsets, (size_t)batch + 1) : nullptr;
    d->weights = l->weights ? dev_copy(l->weights, (size_t)l->num_ids) : nullptr;
    d->in = tuk_input(l);
    d->in.ids = d->ids;
    d->in.offsets = d->offsets;
    d->in.weights = d->weights;
}

static void dev_lookup_free(dev_lookup *d)
{
    CK(cudaFree(d->ids));
    if (d->offsets) CK(cudaFree(d->offsets));
    if (d->weights) CK(cudaFree(d->weights));
}

/* Device indices give the host-index result on fresh random batches (ragged, empty bags,
 * weights, INT8 tables), the forward does not wait for the stream, and the index status is
 * FLAME_OK after them. */
static void test_gpu_tbe_device_indices(void **state)
{
    TU_NEED_GPU();
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int rep = 0; rep < 30; rep++) {
        const int nt = 1 + (int)tu_below(4);
        const int64_t batch = tu_below(200);
        const flame_dtype fdt = (flame_dtype)tu_below(3);
        std::vector<tuk_table> t(nt);
        std::vector<tuk_lookup> l(nt);
        std::vector<dev_lookup> dl(nt);
        std::vector<flame_embedding_table> d(nt);
        std::vector<flame_embedding_bag_input> in(nt);
        int32_t width = 0;
        for (int f = 0; f < nt; f++) {
            const flame_dtype dt = tu_below(3) == 0 ? FLAME_DTYPE_INT8 : fdt;
            const int32_t dim = tu_below(2) ? 16 * (1 + (int32_t)tu_below(4)) : 1 + (int32_t)tu_below(40);
            tuk_table_fill(&t[f], dt, 1 + tu_below(500), dim, (flame_pooling)tu_below(2));
            tuk_lookup_fill(&l[f], &t[f], batch, tu_below(4) == 0, tu_below(2) == 0, 9);
            dev_lookup_make(&dl[f], &l[f], batch);
            in[f] = dl[f].in;
            d[f] = tuk_desc(&t[f]);
            width += dim;
        }
        flame_embedding_bag_params p = {sizeof p, 0, FLAME_COMBINE_CONCAT, d.data(), (size_t)nt, 0};
        flame_embedding_bag *bag = nullptr;
        if (flame_embedding_bag_create(&p, &bag)) fail_msg("create: %s", flame_last_error());
        float *out;
        const size_t bytes = (size_t)(batch * width) * sizeof(float);
        CK(cudaMalloc(&out, bytes + 16));
        CK(cudaMemset(out, 0xff, bytes + 16));
        flame_embedding_bag_batch q = {sizeof q, batch, in.data(), (size_t)nt, out, 0, FLAME_DTYPE_F32, s, 0, 1};
        hold(s);
        const flame_status st = flame_embedding_bag_forward(bag, &q);
        assert_held_then_let_go(s);
        if (st) fail_msg("forward: %s", flame_last_error());
        if (flame_embedding_bag_index_status(bag, s)) fail_msg("index status: %s", flame_last_error());
        std::vector<float> got((size_t)(batch * width) + 1);
        CK(cudaMemcpy(got.data(), out, bytes, cudaMemcpyDeviceToHost));
        std::vector<double> want((size_t)(batch * width) + 1);
        tuk_tbe_reference(t.data(), l.data(), nt, false, batch, width, want.data());
        if (batch) assert_rel_err_below(got.data(), want.data(), (size_t)(batch * width), 1e-5);
        flame_embedding_bag_destroy(bag);
        CK(cudaFree(out));
        for (int f = 0; f < nt; f++) {
            dev_lookup_free(&dl[f]);
            tuk_table_free(&t[f]);
            tuk_lookup_free(&l[f]);
        }
    }
    CK(cudaStreamDestroy(s));
}

// out (n floats on the device) is still all NaN
static void assert_untouched(const float *out, int n)
{
    std::vector<float> h((size_t)n);
    CK(cudaMemcpy(h.data(), out, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
    for (float v : h) assert_true(isnan(v));
}

/* Every bad device value is reported by the index status with the host mode's message (the
 * first one in table, offsets-before-ids, index order), the lookup writes nothing, the record
 * keeps the first error over later forwards, and a read clears it. */
static void test_gpu_tbe_device_index_rejections(void **state)
{
    TU_NEED_GPU();
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    tuk_table t[2];
    tuk_table_fill(&t[0], FLAME_DTYPE_F32, 10, 4, FLAME_POOLING_SUM);
    tuk_table_fill(&t[1], FLAME_DTYPE_INT8, 20, 16, FLAME_POOLING_MEAN);
    flame_embedding_table d[2] = {tuk_desc(&t[0]), tuk_desc(&t[1])};
    flame_embedding_bag_params p = {sizeof p, 0, FLAME_COMBINE_CONCAT, d, 2, 0};
    flame_embedding_bag *bag;
    assert_int_equal(flame_embedding_bag_create(&p, &bag), FLAME_OK);
    const int64_t batch = 3;
    // host images of the device arrays: table 0 bags {0,1} {} {2}; table 1 bags {3} {4,5} {6}
    int64_t h_ids0[3] = {1, 2, 3}, h_off0[4] = {0, 2, 2, 3}, h_ids1[4] = {4, 5, 6, 7}, h_off1[4] = {0, 1, 3, 4};
    float h_w1[4] = {1, 2, 3, 4};
    int64_t *ids0 = dev_copy(h_ids0, 3), *off0 = dev_copy(h_off0, 4), *ids1 = dev_copy(h_ids1, 4),
            *off1 = dev_copy(h_off1, 4);
    float *w1 = dev_copy(h_w1, 4);
    flame_embedding_bag_input in[2] = {{sizeof in[0], ids0, off0, 3, NULL}, {sizeof in[1], ids1, off1, 4, w1}};
    const int n = (int)batch * 20;
    float *out;
    CK(cudaMalloc(&out, (size_t)n * sizeof(float)));
    CK(cudaMemset(out, 0xff, (size_t)n * sizeof(float)));
    flame_embedding_bag_batch q = {sizeof q, batch, in, 2, out, 0, FLAME_DTYPE_F32, s, 0, 1};

    // each case: poke one device value, forward (FLAME_OK: the values are checked on the stream),
    // the status names it, nothing written; then restore
    struct bad_value {
        void *at;
        int64_t bad;
        bool is_weight;
        const char *msg;
    } cases[] = {
        {off0, 1, false, "table 0 bag 0: offsets[0] = 1, not 0"},
        {off0 + 2, 1, false, "table 0 bag 1: offsets[2] = 1 is outside offsets[1] = 2 .. num_ids = 3"},
        {off0 + 3, 2, false, "table 0: offsets[batch = 3] = 2 but num_ids = 3"},
        {ids0 + 2, 10, false, "table 0 bag 2: ids[2] = 10 is outside 0..9"},
        {ids0, -1, false, "table 0 bag 0: ids[0] = -1 is outside 0..9"},
        {ids1 + 2, 20, false, "table 1 bag 1: ids[2] = 20 is outside 0..19"},
        {w1 + 3, 0, true, "table 1 bag 2: weights[3] = nan is not finite"},
    };
    for (const bad_value &c : cases) {
        int64_t keep = 0;
        float keepw = 0;
        if (c.is_weight) {
            CK(cudaMemcpy(&keepw, c.at, sizeof keepw, cudaMemcpyDeviceToHost));
            const float nan = NAN;
            poke(c.at, &nan, sizeof nan);
        } else {
            CK(cudaMemcpy(&keep, c.at, sizeof keep, cudaMemcpyDeviceToHost));
            poke(c.at, &c.bad, sizeof c.bad);
        }
        assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
        assert_status_msg(flame_embedding_bag_index_status(bag, s), FLAME_ERR_INVALID_ARG, c.msg);
        assert_untouched(out, n);
        if (c.is_weight)
            poke(c.at, &keepw, sizeof keepw);
        else
            poke(c.at, &keep, sizeof keep);
        assert_int_equal(flame_embedding_bag_index_status(bag, s), FLAME_OK); // the read cleared it
    }

    // two bad values in one forward: the first in order is reported (table 0's id before table 1's)
    int64_t bad = 99;
    poke(ids1 + 1, &bad, sizeof bad);
    poke(ids0 + 1, &bad, sizeof bad);
    assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
    // sticky: a later forward with a different bad value neither overrides it nor writes
    poke(ids0 + 1, &h_ids0[1], sizeof bad);
    poke(ids0, &bad, sizeof bad);
    assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
    // and a valid forward while the record is set writes nothing either
    poke(ids0, &h_ids0[0], sizeof bad);
    poke(ids1 + 1, &h_ids1[1], sizeof bad);
    assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
    assert_status_msg(flame_embedding_bag_index_status(bag, s), FLAME_ERR_INVALID_ARG,
                      "table 0 bag 0: ids[1] = 99 is outside 0..9");
    assert_untouched(out, n);
    // cleared: the same valid forward now writes the pooled rows
    assert_int_equal(flame_embedding_bag_forward(bag, &q), FLAME_OK);
    assert_int_equal(flame_embedding_bag_index_status(bag, s), FLAME_OK);
    std::vector<float> got((size_t)n);
    CK(cudaMemcpy(got.data(), out, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
    tuk_lookup l[2] = {{h_ids0, h_off0, NULL, 3}, {h_ids1, h_off1, h_w1, 4}};
    std::vector<double> want((size_t)n);
    tuk_tbe_reference(t, l, 2, false, batch, 20, want.data());
    assert_rel_err_below(got.data(), want.data(), (size_t)n, 1e-5);

    // lengths are still checked by the call, and the arrays must be device memory
    in[0].num_ids = -1;
    assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG, "table 0: num_ids -1 is outside");
    in[0].num_ids = 3;
    in[0].ids = h_ids0;
    assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG, "table 0 ids");
    in[0].ids = ids0;
    in[1].offsets = NULL;
    assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG,
                      "table 1: num_ids 4 without offsets (one id per bag) must equal batch 3");
    in[1].offsets = off1;
    q.device_indices = 2;
    assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG, "device_indices 2 (0 or 1)");
    assert_status_msg(flame_embedding_bag_index_status(NULL, s), FLAME_ERR_INVALID_ARG, "NULL bag");
    flame_embedding_bag_destroy(bag);
    for (void *x : {(void *)ids0, (void *)off0, (void *)ids1, (void *)off1, (void *)w1, (void *)out}) CK(cudaFree(x));
    tuk_table_free(&t[0]);
    tuk_table_free(&t[1]);
    CK(cudaStreamDestroy(s));
}

// Batches large enough for many validation blocks a table (device ids) and many 16384-id
// staging chunks over several threads (host ids): both modes against the float64 reference, a
// run of valid device-id forwards that must each leave the record clear (the last block of
// each validation launch describes and resets its count), and a bad value in a late block or
// chunk, with an earlier one in another block or chunk winning.
static void test_gpu_tbe_large_batches(void **state)
{
    TU_NEED_GPU();
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const int nt = 3;
    const int64_t batch = 20000;
    tuk_table t[nt];
    tuk_lookup l[nt];
    flame_embedding_table d[nt];
    for (int f = 0; f < nt; f++) {
        tuk_table_fill(&t[f], FLAME_DTYPE_F32, 1000 + 700 * f, 4 + 4 * f, FLAME_POOLING_SUM);
        tuk_lookup_fill(&l[f], &t[f], batch, false, f == 1, 16); // ~160,000 ids: ~10 chunks, ~600 blocks
        d[f] = tuk_desc(&t[f]);
    }
    flame_embedding_bag_params p = {sizeof p, 0, FLAME_COMBINE_CONCAT, d, (size_t)nt, 0};
    flame_embedding_bag *bag;
    assert_int_equal(flame_embedding_bag_create(&p, &bag), FLAME_OK);
    const int32_t width = 4 + 8 + 12;
    const int n = (int)(batch * width);
    std::vector<double> want((size_t)n);
    tuk_tbe_reference(t, l, nt, false, batch, width, want.data());
    float *out;
    CK(cudaMalloc(&out, (size_t)n * sizeof(float)));
    std::vector<float> got((size_t)n);
    // host ids, validated and staged by 1 and 4 threads
    flame_embedding_bag_input hin[nt];
    for (int f = 0; f < nt; f++) hin[f] = tuk_input(&l[f]);
    for (int threads : {1, 4}) {
        CK(cudaMemsetAsync(out, 0xff, (size_t)n * sizeof(float), s));
        flame_embedding_bag_batch q = {sizeof q, batch, hin, (size_t)nt, out, 0, FLAME_DTYPE_F32, s, threads, 0};
        if (flame_embedding_bag_forward(bag, &q)) fail_msg("host ids, %d threads: %s", threads, flame_last_error());
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(got.data(), out, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
        assert_rel_err_below(got.data(), want.data(), (size_t)n, 1e-5);
    }
    // device ids: five valid forwards in a row, each checked
    int64_t *dids[nt], *doff[nt];
    float *dw = dev_copy(l[1].weights, (size_t)l[1].num_ids);
    flame_embedding_bag_input din[nt];
    for (int f = 0; f < nt; f++) {
        dids[f] = dev_copy(l[f].ids, (size_t)l[f].num_ids);
        doff[f] = dev_copy(l[f].offsets, (size_t)batch + 1);
        din[f] = {sizeof din[f], dids[f], doff[f], l[f].num_ids, f == 1 ? dw : nullptr};
    }
    flame_embedding_bag_batch qd = {sizeof qd, batch, din, (size_t)nt, out, 0, FLAME_DTYPE_F32, s, 0, 1};
    for (int r = 0; r < 5; r++) {
        CK(cudaMemsetAsync(out, 0xff, (size_t)n * sizeof(float), s));
        assert_int_equal(flame_embedding_bag_forward(bag, &qd), FLAME_OK);
        if (flame_embedding_bag_index_status(bag, s)) fail_msg("device ids, forward %d: %s", r, flame_last_error());
        CK(cudaMemcpy(got.data(), out, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost));
        assert_rel_err_below(got.data(), want.data(), (size_t)n, 1e-5);
    }
    // a bad id near the end of table 2 (a late block, the last chunk), then an earlier one in
    // table 2's first block / chunk, then a bad weight of table 1 (an earlier table) wins
    const int64_t late = l[2].num_ids - 3, early = 100, wpos = l[1].num_ids / 2;
    struct step {
        int table;
        int64_t at, value;
        bool weight;
    } steps[] = {{2, late, -5, false}, {2, early, 4000, false}, {1, wpos, 0, true}};
    char msg[3][128];
    for (int k = 0; k < 3; k++) {
        const step &c = steps[k];
        const tuk_lookup &lk = l[c.table];
        int64_t bag_i = 0;
        while (lk.offsets[bag_i + 1] <= c.at) bag_i++;
        if (c.weight) {
            lk.weights[c.at] = INFINITY;
            poke(dw + c.at, &lk.weights[c.at], sizeof(float));
            snprintf(msg[k], sizeof msg[k], "table %d bag %lld: weights[%lld] = inf is not finite", c.table,
                     (long long)bag_i, (long long)c.at);
        } else {
            lk.ids[c.at] = c.value;
            poke(dids[c.table] + c.at, &c.value, sizeof c.value);
            snprintf(msg[k], sizeof msg[k], "table %d bag %lld: ids[%lld] = %lld is outside 0..%lld", c.table,
                     (long long)bag_i, (long long)c.at, (long long)c.value, (long long)(t[c.table].rows - 1));
        }
        CK(cudaMemsetAsync(out, 0xff, (size_t)n * sizeof(float), s));
        assert_int_equal(flame_embedding_bag_forward(bag, &qd), FLAME_OK);
        assert_status_msg(flame_embedding_bag_index_status(bag, s), FLAME_ERR_INVALID_ARG, msg[k]);
        assert_untouched(out, n);
        for (int threads : {1, 4}) {
            flame_embedding_bag_batch q = {sizeof q, batch, hin, (size_t)nt, out, 0, FLAME_DTYPE_F32, s, threads, 0};
            assert_status_msg(flame_embedding_bag_forward(bag, &q), FLAME_ERR_INVALID_ARG, msg[k]);
        }
        CK(cudaStreamSynchronize(s));
        assert_untouched(out, n);
    }
    flame_embedding_bag_destroy(bag);
    for (int f = 0; f < nt; f++) {
        CK(cudaFree(dids[f]));
        CK(cudaFree(doff[f]));
        tuk_table_free(&t[f]);
        tuk_lookup_free(&l[f]);
    }
    CK(cudaFree(dw));
    CK(cudaFree(out));
    CK(cudaStreamDestroy(s));
}

/* ---- attention */

template <typename T>
static void run_attention_case(flame_attention_mask mask, int32_t heads, int32_t dh, bool fused, bool odd_strides,
                               int64_t num_seqs, int max_hist, int max_cand, cudaStream_t s)
{
    tuk_batch b;
    tuk_batch_fill(&b, num_seqs, max_hist, max_cand);
    const int64_t w = (int64_t)heads * dh, R = b.rows;
    const int64_t pad = odd_strides ? 1 : 8;
    const int64_t ldq = fused ? 3 * w + pad : w + pad, ldkv = fused ? ldq : w + 2 * pad, ldo = w + pad;
    const int ninputs = fused ? 1 : 3;
    std::vector<std::vector<T>> hin(ninputs);
    std::vector<std::vector<double>> din(ninputs);
    std::vector<T *> dev(ninputs);
    for (int i = 0; i < ninputs; i++) {
        const int64_t ld = i == 0 ? ldq : ldkv;
        hin[i].resize((size_t)(R * ld) + 1);
        din[i].resize((size_t)(R * ld) + 1);
        for (size_t e = 0; e < hin[i].size(); e++) {
            hin[i][e] = to_t<T>(2.0f * tu_uniform());
            din[i][e] = from_t(hin[i][e]);
        }
        dev[i] = dev_copy(hin[i].data(), hin[i].size());
    }
    T *out;
    const size_t obytes = (size_t)(R * ldo) * sizeof(T);
    CK(cudaMalloc(&out, obytes + 16));
    CK(cudaMemset(out, 0xff, obytes + 16));
    flame_attention_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.device = 0;
    p.dtype = sizeof(T) == 4 ? FLAME_DTYPE_F32 : std::is_same<T, __half>::value ? FLAME_DTYPE_F16 : FLAME_DTYPE_BF16;
    p.mask = mask;
    p.heads = heads;
    p.head_dim = dh;
    p.num_seqs = num_seqs;
    p.cu_history = b.cu_h;
    p.cu_candidates = b.cu_c;
    p.rows = R;
    if (fused) {
        p.qkv = dev[0];
        p.ld_qkv = ldq;
    } else {
        p.q = dev[0];
        p.k = dev[1];
        p.v = dev[2];
        p.ld_q = ldq;
        p.ld_k = p.ld_v = ldkv;
    }
    p.out = out;
    p.ld_out = ldo;
    p.cuda_stream = s;
    hold(s);
    if (flame_sumi_attention(&p)) {
        let_go();
        fail_msg("attention: %s", flame_last_error());
    }
    assert_held_then_let_go(s);
    CK(cudaStreamSynchronize(s));
    std::vector<T> h((size_t)(R * ldo) + 1);
    CK(cudaMemcpy(h.data(), out, obytes, cudaMemcpyDeviceToHost));
    const double *dq = din[0].data(), *dk = fused ? dq + w : din[1].data(), *dv = fused ? dq + 2 * w : din[2].data();
    std::vector<double> want((size_t)(R * w) + 1);
    tuk_attention_reference(&b, mask, heads, dh, dq, ldq, dk, ldkv, dv, ldkv, want.data());
    std::vector<float> got((size_t)(R * w) + 1);
    for (int64_t r = 0; r < R; r++) {
        for (int64_t j = 0; j < w; j++) got[r * w + j] = from_t(h[r * ldo + j]);
        for (int64_t j = w; j < ldo; j++) assert_true(isnan(from_t(h[r * ldo + j])));
    }
    const double bound = sizeof(T) == 4 ? 1e-4 : std::is_same<T, __half>::value ? 4e-3 : 2e-2;
    if (R) {
        const double e = tu_rel_err(got.data(), want.data(), (size_t)(R * w));
        if (!(e < bound))
            fail_msg("mask %d heads %d dh %d fused %d odd %d rows %lld: relative error %.3g >= %.3g", (int)mask, heads,
                     dh, fused, odd_strides, (long long)R, e, bound);
    }
    for (T *d : dev) CK(cudaFree(d));
    CK(cudaFree(out));
    tuk_batch_free(&b);
}

template <typename T> static void attention_cases(cudaStream_t s)
{
    static const int32_t dhs[] = {16, 32, 64, 128, 40, 24, 8};
    for (int rep = 0; rep < 24; rep++) {
        const int32_t dh = sizeof(T) == 4 ? 1 + (int32_t)tu_below(128) : dhs[tu_below(7)];
        run_attention_case<T>((flame_attention_mask)(rep % 3), 1 + (int32_t)tu_below(4), dh, tu_below(2), tu_below(4) == 0,
                              1 + tu_below(6), 200, 40, s);
    }
    if (sizeof(T) == 2) // enough queries for the Hopper kernel (head dims 64 and 128, aligned rows)
        for (int m = 0; m < 3; m++)
            for (int32_t dh = 64; dh <= 128; dh += 64)
                run_attention_case<T>((flame_attention_mask)m, 8, dh, m == 1, false, 6, 500, 150, s);
}

static void test_gpu_attention_against_reference(void **state)
{
    TU_NEED_GPU();
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    attention_cases<__half>(s);
    attention_cases<__nv_bfloat16>(s);
    attention_cases<float>(s);
    CK(cudaStreamDestroy(s));
}

static void test_gpu_attention_rejections(void **state)
{
    TU_NEED_GPU();
    int64_t cu[2] = {0, 4};
    __half *x, *o;
    CK(cudaMalloc(&x, 4 * 3 * 256 * sizeof(__half)));
    CK(cudaMalloc(&o, 4 * 256 * sizeof(__half)));
    CK(cudaMemset(o, 0xff, 4 * 256 * sizeof(__half)));
    flame_attention_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.dtype = FLAME_DTYPE_F16;
    p.heads = 1;
    p.head_dim = 129;
    p.num_seqs = 1;
    p.cu_history = cu;
    p.rows = 4;
    p.qkv = x;
    p.ld_qkv = 3 * 256;
    p.out = o;
    p.ld_out = 256;
    assert_status_msg(flame_sumi_attention(&p), FLAME_ERR_UNSUPPORTED, "GPU head dims are 1..128, not 129");
    p.head_dim = 64;
    cu[1] = 5;
    assert_status_msg(flame_sumi_attention(&p), FLAME_ERR_INVALID_ARG, "rows 4, the sequences hold 5 history");
    cu[1] = 4;
    static __half host_q[4 * 3 * 256];
    p.qkv = host_q;
    assert_status_msg(flame_sumi_attention(&p), FLAME_ERR_INVALID_ARG, "qkv 0x");
    assert_status_msg(flame_sumi_attention(&p), FLAME_ERR_INVALID_ARG, "is pageable host memory");
    // separate Q, K, V: each is checked, and the message names the one at fault
    p.qkv = nullptr;
    p.q = x, p.k = host_q, p.v = x + 512;
    p.ld_q = p.ld_k = p.ld_v = 3 * 256;
    assert_status_msg(flame_sumi_attention(&p), FLAME_ERR_INVALID_ARG, "k 0x");
    p.k = x + 256, p.v = host_q;
    assert_status_msg(flame_sumi_attention(&p), FLAME_ERR_INVALID_ARG, "v 0x");
    p.q = p.k = p.v = nullptr;
    p.ld_q = p.ld_k = p.ld_v = 0;
    p.qkv = x;
    p.device = 4096;
    assert_status_msg(flame_sumi_attention(&p), FLAME_ERR_NO_DEVICE, "device 4096");
    CK(cudaDeviceSynchronize());
    std::vector<__half> h(4 * 256);
    CK(cudaMemcpy(h.data(), o, h.size() * sizeof(__half), cudaMemcpyDeviceToHost));
    for (const __half &v : h) assert_true(isnan(from_t(v)));
    CK(cudaFree(x));
    CK(cudaFree(o));
}

int main(void)
{
    /* Modules load when the process starts, not at a kernel's first launch: with CUDA's lazy
     * loading a first launch may synchronize the context, which would wait for the held stream
     * (until the gate's timeout) and fail the no-wait checks for a reason not the library's. */
    setenv("CUDA_MODULE_LOADING", "EAGER", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_tbe_against_reference),
        cmocka_unit_test(test_gpu_tbe_update_and_rejections),
        cmocka_unit_test(test_gpu_tbe_device_indices),
        cmocka_unit_test(test_gpu_tbe_device_index_rejections),
        cmocka_unit_test(test_gpu_tbe_large_batches),
        cmocka_unit_test(test_gpu_attention_against_reference),
        cmocka_unit_test(test_gpu_attention_rejections),
    };
    return cmocka_run_group_tests(tests, tu_gpu_setup, NULL);
}
