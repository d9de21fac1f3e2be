// GPU engine lifetime: weights are converted to the compute dtype on the host and uploaded
// once (int8 tables stay int8); q/k/v are fused into one [3d, d] matrix so a block needs one
// GEMM for them.
#include <stdlib.h>
#include <string.h>

#include <new>
#include <type_traits>

#include "engine.cuh"

flame_status fl_dev_reserve(fl_cuda_engine *g, uint64_t bytes, const char *what)
{
    const uint64_t held = g->weight_bytes + g->buffer_bytes + g->workspace_bytes + g->kv_bytes;
    if (g->budget && held + bytes > g->budget)
        return fl_error(FLAME_ERR_NOMEM, "%s needs %llu bytes of GPU memory; %llu are held and the budget "
                                         "(FLAME_OPT_DEVICE_MEMORY_BUDGET) is %llu",
                        what, (unsigned long long)bytes, (unsigned long long)held, (unsigned long long)g->budget);
    return FLAME_OK;
}

// A tracked weight allocation of `bytes` (within the budget).
static flame_status dev_alloc(fl_cuda_engine *g, size_t bytes, void **dst)
{
    FL_TRY(fl_dev_reserve(g, bytes, "the model's weights"));
    void **grown = static_cast<void **>(realloc(g->allocs, (g->num_allocs + 1) * sizeof *grown));
    if (!grown) return fl_error(FLAME_ERR_NOMEM, "out of host memory");
    g->allocs = grown;
    FL_CUDA_TRY(cudaMalloc(dst, bytes ? bytes : 16));
    g->allocs[g->num_allocs++] = *dst;
    g->weight_bytes += bytes;
    return FLAME_OK;
}

// A float as element type T (float, __half, __nv_bfloat16), rounded to nearest even.
template <typename T> static T from_float(float v)
{
    if constexpr (std::is_same<T, __half>::value)
        return __float2half_rn(v);
    else if constexpr (std::is_same<T, __nv_bfloat16>::value)
        return __float2bfloat16_rn(v);
    else
        return v;
}

// Uploads `count` floats as dtype `t` (float, half or bfloat16); the allocation is tracked.
static flame_status upload(fl_cuda_engine *g, const float *src, uint64_t count, cudaDataType_t t, void **dst)
{
    return FL_DTYPE_SWITCH(t, T, [&]() -> flame_status {
        const size_t bytes = count * sizeof(T);
        FL_TRY(dev_alloc(g, bytes, dst));
        if constexpr (std::is_same<T, float>::value) {
            FL_CUDA_TRY(cudaMemcpy(*dst, src, bytes, cudaMemcpyHostToDevice));
            return FLAME_OK;
        }
        T *tmp = static_cast<T *>(malloc(bytes ? bytes : sizeof(T)));
        if (!tmp) return fl_error(FLAME_ERR_NOMEM, "out of host memory converting weights");
        for (uint64_t i = 0; i < count; i++) tmp[i] = from_float<T>(src[i]);
        cudaError_t e = cudaMemcpy(*dst, tmp, bytes, cudaMemcpyHostToDevice);
        free(tmp);
        FL_CUDA_TRY(e);
        return FLAME_OK;
    });
}

static flame_status upload_f32(fl_cuda_engine *g, const float *src, uint64_t count, float **dst)
{
    return upload(g, src, count, CUDA_R_32F, reinterpret_cast<void **>(dst));
}

// An int8 table (docs/model-format.md, "int8 tables"). Its int8 rows and (scale, bias) pairs
// go up as they are when a feature reads it (the embedding kernel dequantizes on the fly).
// The dot head's GEMM reads its table in the compute dtype, so when the dot head scores from
// an int8 table, a copy dequantized on the host (float32 value = scale * q + bias, then
// rounded to the compute dtype) goes up as well, a slice of rows at a time.
static flame_status upload_q8_table(fl_cuda_engine *g, const fl_weights &w, int t)
{
    const fl_model_cfg &c = g->cfg;
    const uint64_t rows = (uint64_t)c.tables[t].rows, dim = (uint64_t)c.tables[t].dim;
    bool read = false;
    for (int f = 0; f < c.num_features; f++) read = read || c.features[f].table == t;
    if (read) {
        FL_TRY(dev_alloc(g, rows * dim, reinterpret_cast<void **>(&g->tables_q8[t])));
        FL_CUDA_TRY(cudaMemcpy(g->tables_q8[t], w.tables_q8[t], rows * dim, cudaMemcpyHostToDevice));
        FL_TRY(upload_f32(g, w.qparams[t], rows * 2, &g->qparams[t]));
    }
    if (c.head != FLAME_HEAD_DOT || c.dot_table != t) return FLAME_OK;
    const size_t esize = g->ab == CUDA_R_32F ? 4 : 2;
    FL_TRY(dev_alloc(g, rows * dim * esize, &g->tables[t]));
    const uint64_t slice = dim >= (1u << 20) ? 1 : (1u << 20) / dim; // rows per copy: about 1M values
    uint8_t *tmp = static_cast<uint8_t *>(malloc((rows < slice ? rows : slice) * dim * esize));
    if (!tmp) return fl_error(FLAME_ERR_NOMEM, "out of host memory dequantizing table '%s'", c.tables[t].name);
    cudaError_t e = cudaSuccess;
    for (uint64_t r0 = 0; r0 < rows && e == cudaSuccess; r0 += slice) {
        const uint64_t n = rows - r0 < slice ? rows - r0 : slice;
        FL_DTYPE_SWITCH(g->ab, T, [&] {
            T *out = reinterpret_cast<T *>(tmp);
            for (uint64_t r = r0; r < r0 + n; r++) {
                const float scale = w.qparams[t][2 * r], bias = w.qparams[t][2 * r + 1];
                for (uint64_t j = 0; j < dim; j++)
                    out[(r - r0) * dim + j] = from_float<T>(scale * (float)w.tables_q8[t][r * dim + j] + bias);
            }
        });
        e = cudaMemcpy(static_cast<uint8_t *>(g->tables[t]) + r0 * dim * esize, tmp, n * dim * esize,
                       cudaMemcpyHostToDevice);
    }
    free(tmp);
    FL_CUDA_TRY(e);
    return FLAME_OK;
}

static flame_status upload_linear(fl_cuda_engine *g, const fl_linear &l, cudaDataType_t bias_type, fl_dev_linear *d)
{
    d->out = l.out;
    d->in = l.in;
    FL_TRY(upload(g, l.w, (uint64_t)l.out * l.in, g->ab, &d->w));
    return upload(g, l.b, (uint64_t)l.out, bias_type, &d->b);
}

static flame_status upload_block(fl_cuda_engine *g, const fl_block &b, fl_dev_block *d)
{
    const int32_t dm = g->cfg.d_model;
    const size_t sq = (size_t)dm * dm;
    float *w = static_cast<float *>(malloc(3 * sq * sizeof(float)));
    float *bias = static_cast<float *>(malloc(3 * (size_t)dm * sizeof(float)));
    flame_status st = FLAME_OK;
    if (!w || !bias) st = fl_error(FLAME_ERR_NOMEM, "out of host memory fusing q/k/v");
    if (!st) {
        const fl_linear *parts[3] = {&b.q, &b.k, &b.v};
        for (int i = 0; i < 3; i++) {
            memcpy(w + i * sq, parts[i]->w, sq * sizeof(float));
            memcpy(bias + (size_t)i * dm, parts[i]->b, (size_t)dm * sizeof(float));
        }
        fl_linear fused = {w, bias, 3 * dm, dm};
        st = upload_linear(g, fused, g->ab, &d->qkv);
    }
    free(w);
    free(bias);
    FL_TRY(st);
    FL_TRY(upload_linear(g, b.o, CUDA_R_32F, &d->o));
    FL_TRY(upload_linear(g, b.fc1, g->ab, &d->fc1));
    FL_TRY(upload_linear(g, b.fc2, CUDA_R_32F, &d->fc2));
    FL_TRY(upload_f32(g, b.ln1.w, dm, &d->ln1_w));
    FL_TRY(upload_f32(g, b.ln1.b, dm, &d->ln1_b));
    FL_TRY(upload_f32(g, b.ln2.w, dm, &d->ln2_w));
    return upload_f32(g, b.ln2.b, dm, &d->ln2_b);
}

// The stacked first layer of the two-layer tasks (those sharing the first one's activation).
static flame_status upload_head_stack(fl_cuda_engine *g, const fl_weights &w, bool *stacked)
{
    const fl_model_cfg &c = g->cfg;
    const int32_t d = c.d_model;
    int32_t width = 0;
    for (int t = 0; t < c.num_tasks; t++) {
        const fl_task_cfg &tc = c.tasks[t];
        stacked[t] = tc.num_layers == 2 && (width == 0 || tc.activation == g->head_stack_act);
        if (!stacked[t]) continue;
        if (width == 0) g->head_stack_act = tc.activation;
        g->task_col[t] = width;
        width += tc.width[1];
    }
    if (width == 0) return FLAME_OK;
    float *sw = static_cast<float *>(malloc((size_t)width * d * sizeof(float)));
    float *sb = static_cast<float *>(malloc((size_t)width * sizeof(float)));
    flame_status st = sw && sb ? FLAME_OK : fl_error(FLAME_ERR_NOMEM, "out of host memory stacking the task layers");
    for (int t = 0; !st && t < c.num_tasks; t++) {
        if (!stacked[t]) continue;
        const fl_linear &l = w.tasks[t].layers[0];
        memcpy(sw + (size_t)g->task_col[t] * d, l.w, (size_t)l.out * d * sizeof(float));
        memcpy(sb + g->task_col[t], l.b, (size_t)l.out * sizeof(float));
    }
    if (!st) st = upload_linear(g, fl_linear{sw, sb, width, d}, g->ab, &g->head_stack);
    free(sw);
    free(sb);
    g->head_stack_width = st ? 0 : width;
    return st;
}

static flame_status upload_sumi_head(fl_cuda_engine *g, const fl_weights &w)
{
    const fl_model_cfg &c = g->cfg;
    const size_t esz = g->ab == CUDA_R_32F ? 4 : 2;
    bool stacked[FL_MAX_TASKS] = {};
    FL_TRY(upload_head_stack(g, w, stacked));
    std::vector<fl_task_tail> tails;
    for (int t = 0; t < c.num_tasks; t++) {
        const fl_task_cfg &tc = c.tasks[t];
        for (int l = 0; l < tc.num_layers; l++) {
            const bool last = l == tc.num_layers - 1; // writes float scores
            if (l == 0 && stacked[t]) { // a view of the stacked layer
                const size_t col = (size_t)g->task_col[t];
                g->tasks[t][0] = {static_cast<uint8_t *>(g->head_stack.w) + col * c.d_model * esz,
                                  static_cast<uint8_t *>(g->head_stack.b) + col * esz, tc.width[1], c.d_model};
                continue;
            }
            FL_TRY(upload_linear(g, w.tasks[t].layers[l], last ? CUDA_R_32F : g->ab, &g->tasks[t][l]));
        }
        g->task_fused[t] = stacked[t] || tc.num_layers == 1;
        if (!g->task_fused[t]) continue;
        const fl_dev_linear &out = g->tasks[t][tc.num_layers - 1];
        tails.push_back({t, stacked[t] ? g->task_col[t] : 0, out.in, stacked[t] ? 1 : 0, out.w,
                         static_cast<const float *>(out.b)});
    }
    if (tails.empty()) return FLAME_OK;
    const size_t bytes = tails.size() * sizeof(fl_task_tail);
    FL_TRY(fl_dev_reserve(g, bytes, "the model's weights"));
    void **grown = static_cast<void **>(realloc(g->allocs, (g->num_allocs + 1) * sizeof *grown));
    if (!grown) return fl_error(FLAME_ERR_NOMEM, "out of host memory");
    g->allocs = grown;
    FL_CUDA_TRY(cudaMalloc(&g->head_tails, bytes));
    g->allocs[g->num_allocs++] = g->head_tails;
    g->weight_bytes += bytes;
    FL_CUDA_TRY(cudaMemcpy(g->head_tails, tails.data(), bytes, cudaMemcpyHostToDevice));
    g->num_tails = (int32_t)tails.size();
    return FLAME_OK;
}

static flame_status upload_model(fl_cuda_engine *g, const fl_weights &w)
{
    const fl_model_cfg &c = g->cfg;
    for (int t = 0; t < c.num_tables; t++)
        if (w.tables_q8[t])
            FL_TRY(upload_q8_table(g, w, t));
        else
            FL_TRY(upload(g, w.tables[t], (uint64_t)c.tables[t].rows * c.tables[t].dim, g->ab, &g->tables[t]));
    if (c.projection) FL_TRY(upload_linear(g, w.proj, CUDA_R_32F, &g->proj));
    if (c.position_rule != FL_POS_NONE)
        FL_TRY(upload_f32(g, w.position, (uint64_t)c.position_rows * c.d_model, &g->position));
    if (c.input_layernorm) {
        FL_TRY(upload_f32(g, w.input_ln.w, c.d_model, &g->input_ln_w));
        FL_TRY(upload_f32(g, w.input_ln.b, c.d_model, &g->input_ln_b));
    }
    if (c.final_layernorm) {
        FL_TRY(upload_f32(g, w.final_ln.w, c.d_model, &g->final_ln_w));
        FL_TRY(upload_f32(g, w.final_ln.b, c.d_model, &g->final_ln_b));
    }
    g->blocks = static_cast<fl_dev_block *>(calloc(c.num_blocks ? c.num_blocks : 1, sizeof(fl_dev_block)));
    if (!g->blocks) return fl_error(FLAME_ERR_NOMEM, "out of host memory");
    for (int i = 0; i < c.num_blocks; i++) FL_TRY(upload_block(g, w.blocks[i], &g->blocks[i]));
    return c.head == FLAME_HEAD_SUMI ? upload_sumi_head(g, w) : FLAME_OK;
}

static flame_status make_executor(fl_cuda_engine *g, const struct flame_config *cfg, fl_cuda_executor *x)
{
    if (cfg->cuda_stream) {
        x->stream = static_cast<cudaStream_t>(cfg->cuda_stream);
    } else {
        FL_CUDA_TRY(cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking));
        x->own_stream = true;
    }
    for (cudaEvent_t &ev : x->ev) FL_CUDA_TRY(cudaEventCreate(&ev)); // timing events: the stage metrics
    const size_t ws = 32u << 20; // cuBLASLt workspace: 32 MiB, what its docs suggest for Hopper
    FL_TRY(fl_dev_reserve(g, ws, "a GEMM workspace"));
    FL_TRY(fl_gemm_init(&x->gemm, ws));
    g->workspace_bytes += ws;
    FL_CUDA_TRY(cudaMalloc(&x->attn_work, 2 * sizeof(uint32_t)));
    // zeroed on the executor's stream, ahead of its first launch; each launch leaves them at zero
    FL_CUDA_TRY(cudaMemsetAsync(x->attn_work, 0, 2 * sizeof(uint32_t), x->stream));
    return FLAME_OK;
}

static void free_executor(fl_cuda_executor *x)
{
    if (x->stream) cudaStreamSynchronize(x->stream);
    fl_graph_clear(&x->graphs);
    if (x->arena) cudaFree(x->arena);
    if (x->attn_work) cudaFree(x->attn_work);
    fl_gemm_destroy(&x->gemm);
    for (cudaEvent_t ev : x->ev)
        if (ev) cudaEventDestroy(ev);
    if (x->own_stream) cudaStreamDestroy(x->stream);
}

extern "C" flame_status fl_cuda_engine_create(const fl_model_cfg *mc, const fl_weights *w, int64_t num_items,
                                              const struct flame_config *cfg, int device, fl_cuda_engine **out)
{
    *out = nullptr;
    const int32_t dh = mc->num_heads ? mc->d_model / mc->num_heads : 0;
    if (mc->num_blocks > 0 && dh > 128)
        return fl_error(FLAME_ERR_UNSUPPORTED, "the CUDA backend supports head dims up to 128; this model has %d", dh);
    fl_cuda_engine *g = new (std::nothrow) fl_cuda_engine();
    if (!g) return fl_error(FLAME_ERR_NOMEM, "out of host memory");
    pthread_mutex_init(&g->pool_lock, nullptr);
    g->device = device;
    g->cfg = *mc;
    g->num_items = num_items;
    g->dtype = fl_config_dtype(cfg);
    g->ab = FL_DTYPE_SWITCH(g->dtype, T, [] { return dtype_of<T>::value; });
    g->budget = (uint64_t)cfg->device_memory_budget;
    g->use_graphs = cfg->cuda_graphs != 0;
    g->attention_portable = cfg->cuda_attention != 0;
    // checked when the option was set
    if (cfg->batch_profiles[0] && fl_batch_profiles_parse(cfg->batch_profiles, &g->own_profiles) == FLAME_OK &&
        g->own_profiles.n > 0)
        g->profiles.store(&g->own_profiles, std::memory_order_release);
    flame_status st = FLAME_OK;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) st = fl_error(FLAME_ERR_NO_DEVICE, "cuda:%d: %s", device, cudaGetErrorString(e));
    const int n = cfg->cuda_stream ? 1 : (int)cfg->cuda_executors; // the caller's one stream: one executor
    g->ex = st ? nullptr : new (std::nothrow) fl_cuda_executor[n];
    if (!st && !g->ex) st = fl_error(FLAME_ERR_NOMEM, "out of host memory");
    for (int i = 0; !st && i < n; i++) {
        st = make_executor(g, cfg, &g->ex[i]);
        g->num_ex = i + 1; // destroy frees what was made
    }
    if (!st) st = fl_slot_pool_init(&g->ex_pool, n);
    if (!st) st = flame_pinned_pool_create(nullptr, &g->pinned);
    if (!st) st = upload_model(g, *w);
    if (st) {
        fl_cuda_engine_destroy(g);
        return st;
    }
    *out = g;
    return FLAME_OK;
}

extern "C" void fl_cuda_engine_destroy(fl_cuda_engine *g)
{
    if (!g) return;
    cudaSetDevice(g->device);
    for (int i = 0; i < g->num_ex; i++) {
        free_executor(&g->ex[i]); // synchronizes its stream first
        if (g->ex[i].staging) flame_pinned_free(g->pinned, g->ex[i].staging);
    }
    flame_pinned_pool_destroy(g->pinned);
    delete[] g->ex;
    for (size_t i = 0; i < g->num_allocs; i++) cudaFree(g->allocs[i]);
    if (g->kv_blocks) cudaFree(g->kv_blocks);
    free(g->allocs);
    free(g->blocks);
    fl_slot_pool_destroy(&g->ex_pool);
    pthread_mutex_destroy(&g->pool_lock);
    delete g;
}

extern "C" flame_status fl_cuda_kv_attach(fl_cuda_engine *g, struct fl_kv_cache *kv, const fl_kv_layout *lay)
{
    const uint64_t bytes = (uint64_t)fl_kv_num_blocks(kv) * fl_kv_block_bytes(kv);
    FL_CUDA_TRY(cudaSetDevice(g->device));
    pthread_mutex_lock(&g->pool_lock);
    flame_status st = fl_dev_reserve(g, bytes, "the KV cache's blocks (FLAME_OPT_KV_CACHE_BYTES)");
    if (!st) g->kv_bytes = bytes;
    pthread_mutex_unlock(&g->pool_lock);
    FL_TRY(st);
    void *p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        pthread_mutex_lock(&g->pool_lock);
        g->kv_bytes = 0;
        pthread_mutex_unlock(&g->pool_lock);
        return fl_error(FLAME_ERR_NOMEM, "cudaMalloc of the KV cache's %llu bytes of blocks: %s",
                        (unsigned long long)bytes, cudaGetErrorString(e));
    }
    g->kv_blocks = static_cast<uint8_t *>(p);
    g->kv_lay = *lay;
    g->kv = kv;
    return FLAME_OK;
}

extern "C" uint64_t fl_cuda_device_bytes(const fl_cuda_engine *g)
{
    fl_cuda_engine *m = const_cast<fl_cuda_engine *>(g); // buffers grow under pool_lock
    pthread_mutex_lock(&m->pool_lock);
    const uint64_t bytes = g->weight_bytes + g->buffer_bytes + g->workspace_bytes + g->kv_bytes;
    pthread_mutex_unlock(&m->pool_lock);
    return bytes;
}

extern "C" void fl_cuda_graph_counts(const fl_cuda_engine *g, uint64_t *captures, uint64_t *replays)
{
    *captures = *replays = 0;
    for (int i = 0; i < g->num_ex; i++) {
        *captures += g->ex[i].graphs.captures.load(std::memory_order_relaxed);
        *replays += g->ex[i].graphs.replays.load(std::memory_order_relaxed);
    }
}

extern "C" void fl_cuda_adopt_profiles(fl_cuda_engine *g, const fl_batch_profiles *ps)
{
    pthread_mutex_lock(&g->pool_lock); // two schedulers created at once: one set is written
    bool adopted = false;
    if (!g->profiles.load(std::memory_order_acquire) && ps->n > 0) {
        g->adopted_profiles = *ps;
        g->profiles.store(&g->adopted_profiles, std::memory_order_release);
        adopted = true;
    }
    pthread_mutex_unlock(&g->pool_lock);
    if (adopted && fl_cuda_warm_profiles(g) != FLAME_OK)
        fl_log(FLAME_LOG_WARN, "warming the batch profiles: %s (they warm on first use)", flame_last_error());
}

extern "C" void fl_cuda_profile_counts(const fl_cuda_engine *g, uint64_t *passes, uint64_t *padding_tokens)
{
    *passes = g->profile_passes.load(std::memory_order_relaxed);
    *padding_tokens = g->profile_padding.load(std::memory_order_relaxed);
}

extern "C" uint64_t fl_cuda_weight_bytes(const fl_cuda_engine *g)
{
    return g->weight_bytes;
}
