/* Model lifetime and the canonical tensor list implied by a config. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/abi.h"
#include "model/model.h"

struct flame_model *fl_model_alloc(void)
{
    struct flame_model *m = calloc(1, sizeof *m);
    if (m) atomic_init(&m->refs, 1);
    return m;
}

flame_status fl_model_own(struct flame_model *m, void *buffer)
{
    void **grown = realloc(m->owned, (m->num_owned + 1) * sizeof *grown);
    if (!grown) {
        fl_aligned_free(buffer);
        return fl_error(FLAME_ERR_NOMEM, "out of memory tracking model buffers");
    }
    m->owned = grown;
    m->owned[m->num_owned++] = buffer;
    return FLAME_OK;
}

static void model_free(struct flame_model *m)
{
    if (m->cpu_packed_free) m->cpu_packed_free(m->cpu_packed);
    for (size_t i = 0; i < m->num_owned; i++) fl_aligned_free(m->owned[i]);
    free(m->owned);
    free(m->w.blocks);
    if (m->map) munmap(m->map, m->map_len);
    free(m);
}

void fl_model_retain(struct flame_model *m)
{
    atomic_fetch_add_explicit(&m->refs, 1, memory_order_relaxed);
}

void fl_model_release(struct flame_model *m)
{
    if (m && atomic_fetch_sub_explicit(&m->refs, 1, memory_order_acq_rel) == 1) model_free(m);
}

typedef struct spec_list {
    fl_tensor_spec *v;
    size_t n, cap;
    bool oom;
} spec_list;

static void add(spec_list *l, const char *name, int64_t d0, int64_t d1, const float **slot, fl_init init)
{
    if (l->oom) return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        fl_tensor_spec *v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            l->oom = true;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    fl_tensor_spec *s = &l->v[l->n++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->ndim = d1 > 0 ? 2 : 1;
    s->shape[0] = d0;
    s->shape[1] = d1 > 0 ? d1 : 0;
    s->slot = slot;
    s->init = init;
    s->table = -1;
}

/* Adds "<prefix>.weight" [out, in] and "<prefix>.bias" [out], recording dims in `lin`. */
static void add_linear(spec_list *l, const char *prefix, fl_linear *lin, int32_t out, int32_t in)
{
    char name[96];
    lin->out = out;
    lin->in = in;
    snprintf(name, sizeof name, "%s.weight", prefix);
    add(l, name, out, in, &lin->w, FL_INIT_WEIGHT);
    snprintf(name, sizeof name, "%s.bias", prefix);
    add(l, name, out, 0, &lin->b, FL_INIT_BIAS);
}

static void add_layernorm(spec_list *l, const char *prefix, fl_layernorm *ln, int32_t d)
{
    char name[96];
    snprintf(name, sizeof name, "%s.weight", prefix);
    add(l, name, d, 0, &ln->w, FL_INIT_LN_WEIGHT);
    snprintf(name, sizeof name, "%s.bias", prefix);
    add(l, name, d, 0, &ln->b, FL_INIT_LN_BIAS);
}

fl_tensor_spec *fl_tensor_specs(struct flame_model *m, size_t *count)
{
    const fl_model_cfg *c = &m->cfg;
    spec_list l = {0};
    char name[96];
    const int32_t d = c->d_model;
    for (int t = 0; t < c->num_tables; t++) {
        snprintf(name, sizeof name, "tables.%s.weight", c->tables[t].name);
        add(&l, name, c->tables[t].rows, c->tables[t].dim, &m->w.tables[t], FL_INIT_WEIGHT);
        if (!l.oom) l.v[l.n - 1].table = t;
    }
    if (c->projection) add_linear(&l, "input_proj", &m->w.proj, d, c->embed_dim);
    if (c->position_rule != FL_POS_NONE) add(&l, "position.weight", c->position_rows, d, &m->w.position, FL_INIT_WEIGHT);
    if (c->input_layernorm) add_layernorm(&l, "input_ln", &m->w.input_ln, d);
    for (int b = 0; b < c->num_blocks; b++) {
        fl_block *blk = &m->w.blocks[b];
        static const char *const qkvo[] = {"q", "k", "v", "o"};
        fl_linear *lins[] = {&blk->q, &blk->k, &blk->v, &blk->o};
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof name, "blocks.%d.attn.%s", b, qkvo[i]);
            add_linear(&l, name, lins[i], d, d);
        }
        snprintf(name, sizeof name, "blocks.%d.ln1", b);
        add_layernorm(&l, name, &blk->ln1, d);
        snprintf(name, sizeof name, "blocks.%d.ln2", b);
        add_layernorm(&l, name, &blk->ln2, d);
        snprintf(name, sizeof name, "blocks.%d.ffn.fc1", b);
        add_linear(&l, name, &blk->fc1, c->ffn_dim, d);
        snprintf(name, sizeof name, "blocks.%d.ffn.fc2", b);
        add_linear(&l, name, &blk->fc2, d, c->ffn_dim);
    }
    if (c->final_layernorm) add_layernorm(&l, "final_ln", &m->w.final_ln, d);
    if (c->head == FLAME_HEAD_SUMI)
        for (int t = 0; t < c->num_tasks; t++)
            for (int k = 0; k < c->tasks[t].num_layers; k++) {
                snprintf(name, sizeof name, "heads.%d.layers.%d", t, k);
                add_linear(&l, name, &m->w.tasks[t].layers[k], c->tasks[t].width[k + 1], c->tasks[t].width[k]);
            }
    if (l.oom) {
        free(l.v);
        return NULL;
    }
    *count = l.n;
    return l.v;
}

void fl_model_finish(struct flame_model *m)
{
    const fl_model_cfg *c = &m->cfg;
    int64_t items = INT64_MAX;
    m->num_items_table = c->head == FLAME_HEAD_DOT ? c->dot_table : 0;
    for (int f = 0; f < c->num_features; f++)
        if (c->features[f].side_slot < 0 && c->tables[c->features[f].table].rows < items) {
            items = c->tables[c->features[f].table].rows;
            m->num_items_table = c->features[f].table;
        }
    if (c->head == FLAME_HEAD_DOT && c->tables[c->dot_table].rows < items) {
        items = c->tables[c->dot_table].rows;
        m->num_items_table = c->dot_table;
    }
    /* A model whose features are all side features still names candidates by id: no bound
     * beyond int64 then, and ids are only checked against the tables that use them. */
    m->num_items = items;
}

FLAME_API void flame_model_destroy(flame_model *model)
{
    fl_model_release(model);
}

FLAME_API flame_status flame_model_get_info(const flame_model *model, flame_model_info *info)
{
    fl_clear_error();
    if (!model || !info) return fl_error(FLAME_ERR_INVALID_ARG, "flame_model_get_info: NULL argument");
    const fl_model_cfg *c = &model->cfg;
    flame_model_info v = {
        .struct_size = sizeof v,
        .d_model = c->d_model,
        .num_blocks = c->num_blocks,
        .num_heads = c->num_heads,
        .ffn_dim = c->ffn_dim,
        .max_len = c->max_len,
        .num_tasks = c->num_tasks,
        .num_side_features = c->num_side,
        .head = c->head,
        .num_items = model->num_items,
        .weight_bytes = model->weight_bytes,
    };
    return fl_struct_out("flame_model_info", info, &v, sizeof v);
}
