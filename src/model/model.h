/* The loaded model: parsed config plus float32 views of every weight, int8 tables kept int8
 * (never installed). */
#ifndef FLAME_MODEL_MODEL_H
#define FLAME_MODEL_MODEL_H

#include <stdatomic.h>

#include "model/model_cfg.h"

struct flame_model {
    atomic_int refs;
    fl_model_cfg cfg;
    fl_weights w;
    int64_t num_items; /* rows valid for item ids: min over the tables item ids index */
    int32_t num_items_table; /* the table that sets num_items (named in messages) */
    uint64_t weight_bytes; /* float32 weights, int8 tables at 1 byte a value plus 8 bytes a row */
    /* storage: the file mapping and the float32 buffers we converted or generated */
    void *map;
    size_t map_len;
    void **owned;
    size_t num_owned;
    /* the CPU kernels' packed copy of the layers' weights (engine/cpu_plan.c): made by the
     * first CPU engine that needs it, shared by every engine on the model, freed with it */
    void *cpu_packed;
    void (*cpu_packed_free)(void *);
};

/* One tensor the config implies: where its view goes and how random init fills it. */
typedef enum fl_init { FL_INIT_WEIGHT, FL_INIT_BIAS, FL_INIT_LN_WEIGHT, FL_INIT_LN_BIAS } fl_init;
typedef struct fl_tensor_spec {
    char name[96];
    int32_t ndim;
    int64_t shape[2];
    const float **slot;
    fl_init init;
    int32_t table; /* the table index for "tables.{name}.weight" (which may be int8), else -1 */
} fl_tensor_spec;

/* Lists every tensor the config implies (docs/model-format.md, "Tensors"), binding slots into
 * `model`. Returns a malloc'ed array and its length through *count, or NULL on OOM. */
fl_tensor_spec *fl_tensor_specs(struct flame_model *model, size_t *count);

/* Allocation helpers used while building a model. */
struct flame_model *fl_model_alloc(void);
flame_status fl_model_own(struct flame_model *m, void *buffer);
/* Fills the derived fields (num_items, weight_bytes, layer dims) once all slots are bound. */
void fl_model_finish(struct flame_model *m);
void fl_model_retain(struct flame_model *m);
void fl_model_release(struct flame_model *m);

/* Reads a safetensors file into `m` (mapping, validation, binding). */
flame_status fl_model_load_file(struct flame_model *m, const char *path);

#endif
