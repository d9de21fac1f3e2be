/* The loaded model: parsed config plus float32 views of every weight (never installed). */
#ifndef FLAME_MODEL_MODEL_H
#define FLAME_MODEL_MODEL_H

#include <stdatomic.h>

#include "core/common.h"

#define FL_MAX_TABLES 64
#define FL_MAX_FEATURES 64
#define FL_MAX_TASKS 64
#define FL_MAX_TASK_LAYERS 9 /* up to 8 hidden layers + the output layer */
#define FL_MAX_BLOCKS 256
#define FL_NAME_MAX 64

typedef enum fl_pooling { FL_POOL_SUM = 0, FL_POOL_MEAN = 1 } fl_pooling;
typedef enum fl_activation { FL_ACT_NONE = 0, FL_ACT_GELU_ERF, FL_ACT_GELU_TANH, FL_ACT_RELU } fl_activation;
typedef enum fl_position_rule { FL_POS_NONE = 0, FL_POS_LEFT_PADDED_SLOT, FL_POS_FROM_RECENT } fl_position_rule;

typedef struct fl_table_cfg {
    char name[FL_NAME_MAX];
    int64_t rows;
    int32_t dim;
} fl_table_cfg;

typedef struct fl_feature_cfg {
    char name[FL_NAME_MAX];
    int32_t table;      /* index into tables */
    int32_t side_slot;  /* -1: the token's item id; else the request's side slot */
    fl_pooling pooling;
} fl_feature_cfg;

typedef struct fl_task_cfg {
    char name[FL_NAME_MAX];
    int32_t num_layers;                   /* hidden layers + 1 */
    int32_t width[FL_MAX_TASK_LAYERS + 1]; /* width[0] = d_model, width[num_layers] = 1 */
    fl_activation activation;
} fl_task_cfg;

/* The flame.config document, validated (docs/model-format.md). */
typedef struct fl_model_cfg {
    int32_t d_model, max_len;
    int32_t num_tables, num_features, num_side;
    fl_table_cfg tables[FL_MAX_TABLES];
    fl_feature_cfg features[FL_MAX_FEATURES];
    bool combine_concat;
    int32_t embed_dim; /* E: width after combining features */
    bool projection;
    fl_position_rule position_rule;
    int64_t position_rows;
    int64_t candidate_position; /* -1: none */
    bool input_layernorm, final_layernorm;
    int32_t num_blocks, num_heads, ffn_dim;
    bool pre_ln;
    fl_activation activation;
    float ln_eps;
    bool eps_inside_sqrt;
    flame_head_type head;
    int32_t dot_table;
    int32_t num_tasks;
    fl_task_cfg tasks[FL_MAX_TASKS];
} fl_model_cfg;

/* Parses and range-checks a flame.config document. FLAME_ERR_FORMAT naming the key. */
flame_status fl_config_parse(const char *json, size_t len, fl_model_cfg *cfg);

typedef struct fl_linear {
    const float *w; /* [out, in] */
    const float *b; /* [out] */
    int32_t out, in;
} fl_linear;

typedef struct fl_layernorm {
    const float *w, *b;
} fl_layernorm;

typedef struct fl_block {
    fl_linear q, k, v, o, fc1, fc2;
    fl_layernorm ln1, ln2;
} fl_block;

typedef struct fl_task {
    fl_linear layers[FL_MAX_TASK_LAYERS];
} fl_task;

struct flame_model {
    atomic_int refs;
    fl_model_cfg cfg;
    const float *tables[FL_MAX_TABLES]; /* [rows, dim] each */
    fl_linear proj;
    const float *position; /* [position_rows, d_model] */
    fl_layernorm input_ln, final_ln;
    fl_block *blocks;
    fl_task tasks[FL_MAX_TASKS];
    int64_t num_items; /* rows valid for item ids: min over the tables item ids index */
    int32_t num_items_table; /* the table that sets num_items (named in messages) */
    uint64_t weight_bytes;
    /* storage: the file mapping and the float32 buffers we converted or generated */
    void *map;
    size_t map_len;
    void **owned;
    size_t num_owned;
};

/* One tensor the config implies: where its view goes and how random init fills it. */
typedef enum fl_init { FL_INIT_WEIGHT, FL_INIT_BIAS, FL_INIT_LN_WEIGHT, FL_INIT_LN_BIAS } fl_init;
typedef struct fl_tensor_spec {
    char name[96];
    int32_t ndim;
    int64_t shape[2];
    const float **slot;
    fl_init init;
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
