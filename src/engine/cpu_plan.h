/* What the CPU engine runs each GEMM class on, decided once at engine creation from the CPU's
 * feature bits (never its name): libflame's own kernels with the layers' weights packed for
 * them, or the BLAS library. Never installed. */
#ifndef FLAME_ENGINE_CPU_PLAN_H
#define FLAME_ENGINE_CPU_PLAN_H

#include "cpu/kernels.h"
#include "model/model.h"

/* Packed weights of one Linear (fl_cpu_pack layout), NULL when it runs on the BLAS. */
typedef struct fl_cpu_block_plan {
    const float *q, *k, *v, *o, *fc1, *fc2;
} fl_cpu_block_plan;

typedef struct fl_cpu_plan {
    /* own kernels' instruction set; FL_ISA_BASE: the encoder's GEMMs and batched dot-head
     * scoring go to the BLAS (a CPU without AVX2) */
    fl_cpu_isa isa;
    bool own_gemv; /* single-user dot-head scoring on libflame's kernel (else the BLAS's sgemv) */
    fl_cpu_isa dot_isa; /* the own dot-head kernel's set (isa, or the CPU's when isa is the BLAS) */
    size_t packed_bytes; /* the packed weights, held by the model (shared by its engines) */
    const float *proj;
    const fl_cpu_block_plan *blocks;
    const float *tasks[FL_MAX_TASKS][FL_MAX_TASK_LAYERS];
    char summary[512]; /* the choice per GEMM class, as logged */
} fl_cpu_plan;

/* Chooses the kernels (`choice`: FLAME_OPT_CPU_KERNELS, "auto", "avx512", "avx2" or "blas")
 * and packs the weights (once per model: later engines share them). FLAME_ERR_UNSUPPORTED
 * for a choice the CPU lacks (the message names it and the CPU's widest set);
 * FLAME_ERR_NOMEM. */
flame_status fl_cpu_plan_create(struct flame_model *m, int threads, const char *choice, fl_cpu_plan **out);
void fl_cpu_plan_destroy(fl_cpu_plan *p);

/* The instruction set FLAME_OPT_CPU_KERNELS `choice` asks for on a CPU whose widest is `cpu`
 * (FL_ISA_BASE: the BLAS); FLAME_ERR_UNSUPPORTED naming the choice when the CPU lacks it. */
flame_status fl_cpu_choose_isa(const char *choice, fl_cpu_isa cpu, fl_cpu_isa *isa);

#endif
