/* The model's config and weight views as plain structs: shared by the C engine and the CUDA
 * backend (no C11 atomics here, so C++ can include it). Never installed. */
#ifndef FLAME_MODEL_MODEL_CFG_H
#define FLAME_MODEL_MODEL_CFG_H

#include "core/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FL_MAX_TABLES 64
#define FL_MAX_FEATURES 64
#define FL_MAX_TASKS 64
#define FL_MAX_TASK_LAYERS 9 /* up to 8 hidden layers + the output layer */
#define FL_MAX_BLOCKS 256
#define FL_NAME_MAX 64

typedef enum fl_pooling { FL_POOL_SUM = 0, FL_POOL_MEAN = 1 } fl_pooling;
typedef enum fl_activation { FL_ACT_NONE = 0, FL_ACT_GELU_ERF, FL_ACT_GELU_TANH, FL_ACT_RELU } fl_activation;
typedef enum fl_position_rule {
    FL_POS_NONE = 0,
    FL_POS_LEFT_PADDED_SLOT,
    FL_POS_FROM_RECENT,
    FL_POS_FROM_OLDEST /* row i for history item i of the window, 0 = oldest */
} fl_position_rule;

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

/* Float32 views of every weight (pointers into the mapping or into owned buffers), except
 * int8 tables (docs/model-format.md, "int8 tables"): those stay int8, with per-row scale and
 * bias, value[r][c] = qparams[2r] * q[r][c] + qparams[2r + 1], and their float view is NULL. */
typedef struct fl_weights {
    const float *tables[FL_MAX_TABLES]; /* [rows, dim] each; NULL for an int8 table */
    const int8_t *tables_q8[FL_MAX_TABLES]; /* int8 tables: [rows, dim]; NULL for float ones */
    const float *qparams[FL_MAX_TABLES];    /* int8 tables: [rows, 2] (scale, bias); else NULL */
    fl_linear proj;
    const float *position; /* [position_rows, d_model] */
    fl_layernorm input_ln, final_ln;
    fl_block *blocks;
    fl_task tasks[FL_MAX_TASKS];
} fl_weights;

#ifdef __cplusplus
}
#endif
#endif
