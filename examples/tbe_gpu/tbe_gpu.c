/* Pools a batch of multi-hot features on the GPU into a caller-owned device buffer with the
 * public embedding bag (flame/kernels.h): three fp16 tables, each bag 0..20 ids, one output
 * row of 3 x 64 columns per example, enqueued on the program's own stream; then the same batch
 * from ids already in device memory (device_indices: checked on the stream, the status read
 * once at the end), which must give the same rows.
 *
 *   examples/tbe-gpu [device] [batch]        (built with CUDA: make CUDA=1)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <flame/flame.h>

#include "cli_args.h"

#define TABLES 3
#define ROWS 100000
#define DIM 64

static uint16_t f16_bits(float v) /* v = k / 64, |k| <= 64: exact in fp16 */
{
    uint32_t u;
    memcpy(&u, &v, 4);
    if (!(u & 0x7fffffffu)) return (uint16_t)(u >> 16);
    return (uint16_t)(((u >> 16) & 0x8000u) | ((((u >> 23) & 0xffu) - 112u) << 10) | ((u >> 13) & 0x3ffu));
}

int main(int argc, char **argv)
{
    long long device = 0, batch = 4096; /* tbe-gpu [DEVICE [BATCH]] */
    if ((argc > 1 && !cli_int("tbe-gpu", "DEVICE", argv[1], 0, 1023, &device)) ||
        (argc > 2 && !cli_int("tbe-gpu", "BATCH", argv[2], 1, 1 << 24, &batch)))
        return 2;
    static uint16_t tab[TABLES][ROWS * DIM];
    flame_embedding_table t[TABLES];
    for (int f = 0; f < TABLES; f++) {
        for (size_t i = 0; i < (size_t)ROWS * DIM; i++) tab[f][i] = f16_bits((float)(rand() % 129 - 64) / 64.0f);
        t[f] = (flame_embedding_table){.struct_size = sizeof t[f], .dtype = FLAME_DTYPE_F16,
                                       .pooling = FLAME_POOLING_SUM, .rows = ROWS, .dim = DIM, .data = tab[f]};
    }
    flame_embedding_bag_params p = {.struct_size = sizeof p, .device = (int32_t)device, .combine = FLAME_COMBINE_CONCAT,
                                    .tables = t, .num_tables = TABLES}; /* copy mode: uploaded once */
    flame_embedding_bag *bag;
    if (flame_embedding_bag_create(&p, &bag) != FLAME_OK) {
        fprintf(stderr, "tbe-gpu: %s\n", flame_last_error());
        return 2;
    }
    /* the multi-hot features: host ids and offsets, validated by the call, copied in on the stream */
    int64_t *off[TABLES], *ids[TABLES];
    flame_embedding_bag_input in[TABLES];
    for (int f = 0; f < TABLES; f++) {
        off[f] = malloc((size_t)(batch + 1) * sizeof(int64_t));
        off[f][0] = 0;
        for (int64_t b = 0; b < batch; b++) off[f][b + 1] = off[f][b] + rand() % 21;
        ids[f] = malloc((size_t)(off[f][batch] + 1) * sizeof(int64_t));
        for (int64_t i = 0; i < off[f][batch]; i++) ids[f][i] = rand() % ROWS;
        in[f] = (flame_embedding_bag_input){.struct_size = sizeof in[f], .ids = ids[f], .offsets = off[f],
                                            .num_ids = off[f][batch]};
    }
    const int64_t width = flame_embedding_bag_width(bag);
    void *out = NULL; /* the caller's device buffer */
    cudaStream_t s;
    if (cudaMalloc(&out, (size_t)(batch * width) * sizeof(float)) != cudaSuccess ||
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "tbe-gpu: no device memory or stream\n");
        return 2;
    }
    flame_embedding_bag_batch q = {.struct_size = sizeof q, .batch = batch, .inputs = in, .num_inputs = TABLES,
                                   .out = out, .out_dtype = FLAME_DTYPE_F32, .cuda_stream = s};
    if (flame_embedding_bag_forward(bag, &q) != FLAME_OK) { /* returns once enqueued */
        fprintf(stderr, "tbe-gpu: %s\n", flame_last_error());
        return 2;
    }
    /* the same lookups from device memory, as a pipeline whose ids are on the GPU has them */
    int64_t *dev_idx[2 * TABLES];
    flame_embedding_bag_input din[TABLES];
    void *out2 = NULL;
    const size_t out_bytes = (size_t)(batch * width) * sizeof(float);
    if (cudaMalloc(&out2, out_bytes) != cudaSuccess) return 2;
    for (int f = 0; f < TABLES; f++) {
        const size_t nb = (size_t)(off[f][batch] + 1) * sizeof(int64_t), ob = (size_t)(batch + 1) * sizeof(int64_t);
        if (cudaMalloc((void **)&dev_idx[2 * f], nb) != cudaSuccess ||
            cudaMalloc((void **)&dev_idx[2 * f + 1], ob) != cudaSuccess ||
            cudaMemcpy(dev_idx[2 * f], ids[f], nb, cudaMemcpyHostToDevice) != cudaSuccess ||
            cudaMemcpy(dev_idx[2 * f + 1], off[f], ob, cudaMemcpyHostToDevice) != cudaSuccess)
            return 2;
        din[f] = in[f];
        din[f].ids = dev_idx[2 * f];
        din[f].offsets = dev_idx[2 * f + 1];
    }
    /* a copy from pageable memory may return before its DMA ends, and s does not wait for the
     * legacy default stream (it is non-blocking): the copies must be done before the lookup runs */
    if (cudaDeviceSynchronize() != cudaSuccess) return 2;
    flame_embedding_bag_batch dq = q;
    dq.inputs = din;
    dq.out = out2;
    dq.device_indices = 1;
    if (flame_embedding_bag_forward(bag, &dq) != FLAME_OK ||      /* checks lengths; returns once enqueued */
        flame_embedding_bag_index_status(bag, s) != FLAME_OK) { /* the values' check: waits for s */
        fprintf(stderr, "tbe-gpu: device ids: %s\n", flame_last_error());
        return 2;
    }
    float *h1 = malloc(out_bytes + 4), *h2 = malloc(out_bytes + 4);
    cudaMemcpy(h1, out, out_bytes, cudaMemcpyDeviceToHost);
    cudaMemcpy(h2, out2, out_bytes, cudaMemcpyDeviceToHost);
    const int same = memcmp(h1, h2, out_bytes) == 0;
    printf("pooled %lld examples x %d tables into [%lld, %lld] on device %lld; row 0 starts %.4f %.4f %.4f; "
           "from device ids: %s\n", (long long)batch, TABLES, (long long)batch, (long long)width, device,
           batch ? h1[0] : 0.0f, batch ? h1[1] : 0.0f, batch ? h1[2] : 0.0f, same ? "the same rows" : "DIFFERENT rows");
    free(h1);
    free(h2);
    for (int i = 0; i < 2 * TABLES; i++) cudaFree(dev_idx[i]);
    cudaFree(out2);
    cudaFree(out);
    cudaStreamDestroy(s);
    flame_embedding_bag_destroy(bag);
    for (int f = 0; f < TABLES; f++) {
        free(off[f]);
        free(ids[f]);
    }
    return same ? 0 : 1;
}
