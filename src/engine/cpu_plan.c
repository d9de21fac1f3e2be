/* The CPU engine's kernel choice and packed weights (cpu_plan.h).
 *
 * Why own kernels: the encoder's GEMMs are small (a user's few tokens times 64..1024 columns),
 * and a BLAS packs the fixed weights again on every call (half of the encoder's instructions
 * with OpenBLAS), or runs pre-AVX kernels on a CPU newer than itself (OpenBLAS 0.3.21 on
 * Emerald Rapids). Packed once here, the weights are streamed straight into the micro-kernels.
 * The choice is a function of the CPU's feature bits alone, so one machine always computes
 * the same bits. */
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

flame_status fl_cpu_plan_create(const struct flame_model *m, int threads, fl_cpu_plan **out)
{
    *out = NULL;
    const fl_model_cfg *c = &m->cfg;
    fl_cpu_plan *p = calloc(1, sizeof *p);
    if (!p) return fl_error(FLAME_ERR_NOMEM, "out of memory allocating the CPU kernel plan");
    p->isa = fl_cpu_isa_detect();
    const char *force = getenv("FLAME_CPU_KERNELS");
    if (force && !strcmp(force, "blas")) p->isa = FL_ISA_BASE;
    if (force && !strcmp(force, "avx2") && p->isa > FL_ISA_AVX2) p->isa = FL_ISA_AVX2;
    /* the own dot-head kernel beats a BLAS's sgemv with its vector kernels as well (3 MB
     * table, 2 threads: 17 vs 24 us), and it is the only fast one where the BLAS fell back */
    p->own_gemv = p->isa != FL_ISA_BASE || fl_blas_is_weak();
    if (p->isa != FL_ISA_BASE) {
        size_t bytes = pack_bytes(&m->w.proj);
        for (int i = 0; i < c->num_blocks; i++) {
            const fl_block *b = &m->w.blocks[i];
            bytes += pack_bytes(&b->q) + pack_bytes(&b->k) + pack_bytes(&b->v) + pack_bytes(&b->o) +
                     pack_bytes(&b->fc1) + pack_bytes(&b->fc2);
        }
        for (int t = 0; c->head == FLAME_HEAD_SUMI && t < c->num_tasks; t++)
            for (int l = 0; l < c->tasks[t].num_layers; l++) bytes += pack_bytes(&m->w.tasks[t].layers[l]);
        p->blocks = calloc((size_t)(c->num_blocks > 0 ? c->num_blocks : 1), sizeof *p->blocks);
        p->arena = bytes ? fl_aligned_alloc(bytes) : NULL;
        if (!p->blocks || (bytes && !p->arena)) {
            fl_cpu_plan_destroy(p);
            return fl_error(FLAME_ERR_NOMEM, "out of memory packing %zu bytes of weights for the CPU kernels", bytes);
        }
        p->arena_bytes = bytes;
        uint8_t *cur = (uint8_t *)p->arena;
        if (c->projection) p->proj = pack_into(&m->w.proj, &cur);
        for (int i = 0; i < c->num_blocks; i++) {
            const fl_block *b = &m->w.blocks[i];
            fl_cpu_block_plan *bp = &p->blocks[i];
            bp->q = pack_into(&b->q, &cur);
            bp->k = pack_into(&b->k, &cur);
            bp->v = pack_into(&b->v, &cur);
            bp->o = pack_into(&b->o, &cur);
            bp->fc1 = pack_into(&b->fc1, &cur);
            bp->fc2 = pack_into(&b->fc2, &cur);
        }
        for (int t = 0; c->head == FLAME_HEAD_SUMI && t < c->num_tasks; t++)
            for (int l = 0; l < c->tasks[t].num_layers; l++) p->tasks[t][l] = pack_into(&m->w.tasks[t].layers[l], &cur);
    }
    const char *isa = fl_cpu_isa_name(p->isa);
    if (p->isa != FL_ISA_BASE)
        snprintf(p->summary, sizeof p->summary,
                 "isa %s, %d thread(s); encoder and head-MLP GEMMs: libflame %s, weights packed at creation "
                 "(%zu bytes); dot head, one user: libflame %s; dot head, users sharing candidates: libflame %s "
                 "(table packed as it streams); attention, LayerNorm, GELU: libflame, across requests and heads",
                 isa, threads, isa, p->arena_bytes, isa, isa);
    else
        snprintf(p->summary, sizeof p->summary,
                 "isa %s, %d thread(s); encoder and head-MLP GEMMs: BLAS (%s); dot head, one user: %s; dot head, "
                 "users sharing candidates: BLAS; attention, LayerNorm, GELU: libflame, across requests and heads",
                 isa, threads, fl_blas_name(), p->own_gemv ? "libflame" : "BLAS");
    fl_log(FLAME_LOG_DEBUG, "CPU kernels: %s", p->summary);
    *out = p;
    return FLAME_OK;
}

void fl_cpu_plan_destroy(fl_cpu_plan *p)
{
    if (!p) return;
    fl_aligned_free(p->arena);
    free(p->blocks);
    free(p);
}
