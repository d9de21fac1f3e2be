/* The CPU engine's kernel choice and packed weights (cpu_plan.h).
 *
 * Why own kernels: the encoder's GEMMs are small (a user's few tokens times 64..1024 columns),
 * and a BLAS packs the fixed weights again on every call (half of the encoder's instructions
 * with OpenBLAS), or runs pre-AVX kernels on a CPU newer than itself (OpenBLAS 0.3.21 on
 * Emerald Rapids). Packed once here, the weights are streamed straight into the micro-kernels.
 * The choice is a function of the CPU's feature bits alone, so one machine always computes
 * the same bits. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu_plan.h"

static size_t pack_bytes(const fl_linear *l)
{
    return l->w ? (fl_cpu_pack_floats(l->in, l->out) * sizeof(float) + 63) & ~(size_t)63 : 0;
}

static const float *pack_into(const fl_linear *l, uint8_t **cursor)
{
    if (!l->w) return NULL;
    float *dst = (float *)*cursor;
    fl_cpu_pack(l->w, l->in, l->in, l->out, dst);
    *cursor += pack_bytes(l);
    return dst;
}

/* Every packed weight of a model, one arena (model->cpu_packed). */
typedef struct packed_set {
    float *arena;
    size_t bytes;
    const float *proj;
    fl_cpu_block_plan *blocks;
    const float *tasks[FL_MAX_TASKS][FL_MAX_TASK_LAYERS];
} packed_set;

static void packed_free(void *v)
{
    packed_set *ps = v;
    if (!ps) return;
    fl_aligned_free(ps->arena);
    free(ps->blocks);
    free(ps);
}

static packed_set *pack_model(const struct flame_model *m)
{
    const fl_model_cfg *c = &m->cfg;
    size_t bytes = pack_bytes(&m->w.proj);
    for (int i = 0; i < c->num_blocks; i++) {
        const fl_block *b = &m->w.blocks[i];
        bytes += pack_bytes(&b->q) + pack_bytes(&b->k) + pack_bytes(&b->v) + pack_bytes(&b->o) + pack_bytes(&b->fc1) +
                 pack_bytes(&b->fc2);
    }
    for (int t = 0; c->head == FLAME_HEAD_SUMI && t < c->num_tasks; t++)
        for (int l = 0; l < c->tasks[t].num_layers; l++) bytes += pack_bytes(&m->w.tasks[t].layers[l]);
    packed_set *ps = calloc(1, sizeof *ps);
    if (!ps) return NULL;
    ps->blocks = calloc((size_t)(c->num_blocks > 0 ? c->num_blocks : 1), sizeof *ps->blocks);
    ps->arena = bytes ? fl_aligned_alloc(bytes) : NULL;
    if (!ps->blocks || (bytes && !ps->arena)) {
        packed_free(ps);
        return NULL;
    }
    ps->bytes = bytes;
    uint8_t *cur = (uint8_t *)ps->arena;
    if (c->projection) ps->proj = pack_into(&m->w.proj, &cur);
    for (int i = 0; i < c->num_blocks; i++) {
        const fl_block *b = &m->w.blocks[i];
        fl_cpu_block_plan *bp = &ps->blocks[i];
        bp->q = pack_into(&b->q, &cur);
        bp->k = pack_into(&b->k, &cur);
        bp->v = pack_into(&b->v, &cur);
        bp->o = pack_into(&b->o, &cur);
        bp->fc1 = pack_into(&b->fc1, &cur);
        bp->fc2 = pack_into(&b->fc2, &cur);
    }
    for (int t = 0; c->head == FLAME_HEAD_SUMI && t < c->num_tasks; t++)
        for (int l = 0; l < c->tasks[t].num_layers; l++) ps->tasks[t][l] = pack_into(&m->w.tasks[t].layers[l], &cur);
    return ps;
}

/* Engine creation is rare: one lock for every model's first packing. */
static pthread_mutex_t pack_lock = PTHREAD_MUTEX_INITIALIZER;

/* Any choice but "auto", "blas" and "avx512" is "avx2": the config accepts only the four. */
flame_status fl_cpu_choose_isa(const char *choice, fl_cpu_isa cpu, fl_cpu_isa *isa)
{
    if (!choice || !strcmp(choice, "auto")) {
        *isa = cpu;
        return FLAME_OK;
    }
    if (!strcmp(choice, "blas")) {
        *isa = FL_ISA_BASE;
        return FLAME_OK;
    }
    const fl_cpu_isa want = !strcmp(choice, "avx512") ? FL_ISA_AVX512 : FL_ISA_AVX2;
    if (cpu < want)
        return fl_error(FLAME_ERR_UNSUPPORTED, "FLAME_OPT_CPU_KERNELS = '%s': this CPU lacks %s (its widest: %s)",
                        choice, want == FL_ISA_AVX512 ? "AVX-512F" : "AVX2 with FMA",
                        cpu == FL_ISA_BASE ? "neither AVX2 nor AVX-512F" : fl_cpu_isa_name(cpu));
    *isa = want;
    return FLAME_OK;
}

flame_status fl_cpu_plan_create(struct flame_model *m, int threads, const char *choice, fl_cpu_plan **out)
{
    *out = NULL;
    fl_cpu_isa isa;
    flame_status st = fl_cpu_choose_isa(choice, fl_cpu_isa_detect(), &isa);
    if (st) return st;
    fl_cpu_plan *p = calloc(1, sizeof *p);
    if (!p) return fl_error(FLAME_ERR_NOMEM, "out of memory allocating the CPU kernel plan");
    p->isa = isa;
    /* gathered candidates have no BLAS kernel: the own one in the CPU's set (with "blas" too) */
    p->dot_isa = isa != FL_ISA_BASE ? isa : fl_cpu_isa_detect();
    /* the own dot-head kernel beats a BLAS's sgemv with its vector kernels as well (3 MB
     * table, 2 threads: 17 vs 24 us), and it is the only fast one where the BLAS fell back
     * (unless the BLAS was asked for) */
    const bool blas = choice && !strcmp(choice, "blas");
    p->own_gemv = isa != FL_ISA_BASE || (!blas && fl_blas_is_weak());
    if (p->isa != FL_ISA_BASE) {
        /* the packed layout is the same for every isa, so engines of any choice share it;
         * the model is read-only otherwise, and this field is only read and set here */
        struct flame_model *mm = m;
        pthread_mutex_lock(&pack_lock);
        if (!mm->cpu_packed) {
            mm->cpu_packed = pack_model(m);
            if (mm->cpu_packed) mm->cpu_packed_free = packed_free;
        }
        const packed_set *ps = mm->cpu_packed;
        pthread_mutex_unlock(&pack_lock);
        if (!ps) {
            free(p);
            return fl_error(FLAME_ERR_NOMEM, "out of memory packing the weights for the CPU kernels");
        }
        p->packed_bytes = ps->bytes;
        p->proj = ps->proj;
        p->blocks = ps->blocks;
        memcpy(p->tasks, ps->tasks, sizeof p->tasks);
    }
    const char *name = fl_cpu_isa_name(p->isa);
    if (p->isa != FL_ISA_BASE)
        snprintf(p->summary, sizeof p->summary,
                 "isa %s, %d thread(s); encoder and head-MLP GEMMs: libflame %s, weights packed at creation "
                 "(%zu bytes, shared by the model's engines); dot head, one user: libflame %s; dot head, users sharing candidates: libflame %s "
                 "(table packed as it streams); attention, LayerNorm, GELU: libflame, across requests and heads",
                 name, threads, name, p->packed_bytes, name, name);
    else
        snprintf(p->summary, sizeof p->summary,
                 "isa %s, %d thread(s); encoder and head-MLP GEMMs: BLAS (%s); dot head, one user: %s; dot head, "
                 "users sharing candidates: BLAS; attention, LayerNorm, GELU: libflame, across requests and heads",
                 blas ? "blas (as configured)" : name, threads, fl_blas_name(), p->own_gemv ? "libflame" : "BLAS");
    fl_log(FLAME_LOG_DEBUG, "CPU kernels: %s", p->summary);
    *out = p;
    return FLAME_OK;
}

void fl_cpu_plan_destroy(fl_cpu_plan *p)
{
    free(p); /* the packed weights belong to the model */
}
