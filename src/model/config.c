/* Parses and validates the "flame.config" JSON document (docs/model-format.md). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/json_keys.h"
#include "model/model.h"

#define BAD(...) fl_error(FLAME_ERR_FORMAT, "config: " __VA_ARGS__)

/* Reads an integer member in [lo, hi]; `required` false leaves *out as its default. */
static flame_status get_int(const cJSON *obj, const char *path, const char *key, int64_t lo, int64_t hi,
                            bool required, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return required ? BAD("missing key '%s%s'", path, key) : FLAME_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return BAD("'%s%s' must be an integer", path, key);
    double d = v->valuedouble;
    if (d < (double)lo || d > (double)hi)
        return BAD("%s%s = %.17g is out of range [%lld, %lld]", path, key, d, (long long)lo, (long long)hi);
    *out = (int64_t)d;
    return FLAME_OK;
}

static flame_status get_bool(const cJSON *obj, const char *key, bool *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return FLAME_OK; /* default kept */
    if (!cJSON_IsBool(v)) return BAD("'%s' must be true or false", key);
    *out = cJSON_IsTrue(v);
    return FLAME_OK;
}

/* Maps a string member onto one of `names` (index returned through *out). */
static flame_status get_enum(const cJSON *obj, const char *path, const char *key, const char *const *names,
                             int count, bool required, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return required ? BAD("missing key '%s%s'", path, key) : FLAME_OK;
    if (!cJSON_IsString(v)) return BAD("'%s%s' must be a string", path, key);
    for (int i = 0; i < count; i++)
        if (!strcmp(v->valuestring, names[i])) {
            *out = i;
            return FLAME_OK;
        }
    return BAD("%s%s = '%.40s' is not a known value", path, key, v->valuestring);
}

static flame_status get_name(const cJSON *obj, const char *path, char *dst)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, "name");
    if (!cJSON_IsString(v)) return BAD("'%sname' must be a string", path);
    size_t n = strlen(v->valuestring);
    if (n == 0 || n >= FL_NAME_MAX) return BAD("%sname has length %zu, expected 1..%d", path, n, FL_NAME_MAX - 1);
    for (size_t i = 0; i < n; i++) {
        char c = v->valuestring[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return BAD("%sname '%s' may hold only letters, digits, '_' and '-'", path, v->valuestring);
    }
    memcpy(dst, v->valuestring, n + 1);
    return FLAME_OK;
}

static const char *const activations[] = {"none", "gelu_erf", "gelu_tanh", "relu"}; /* fl_activation order */

#define TRY(x)                                                                                                   \
    do {                                                                                                         \
        flame_status s_ = (x);                                                                                   \
        if (s_ != FLAME_OK) return s_;                                                                           \
    } while (0)

static int find_table(const fl_model_cfg *c, const char *name)
{
    for (int i = 0; i < c->num_tables; i++)
        if (!strcmp(c->tables[i].name, name)) return i;
    return -1;
}

static flame_status parse_tables(const cJSON *root, fl_model_cfg *c)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "tables");
    if (!cJSON_IsArray(arr)) return BAD("'tables' must be an array");
    int n = cJSON_GetArraySize(arr);
    if (n < 1 || n > FL_MAX_TABLES) return BAD("tables has %d entries, expected 1..%d", n, FL_MAX_TABLES);
    c->num_tables = n;
    for (int i = 0; i < n; i++) {
        const cJSON *t = cJSON_GetArrayItem(arr, i);
        char path[32];
        snprintf(path, sizeof path, "tables[%d].", i);
        if (!cJSON_IsObject(t)) return BAD("%s must be an object", path);
        TRY(get_name(t, path, c->tables[i].name));
        if (find_table(c, c->tables[i].name) != i) return BAD("table name '%s' is used twice", c->tables[i].name);
        int64_t v = 0;
        TRY(get_int(t, path, "rows", 1, (int64_t)1 << 40, true, &v));
        c->tables[i].rows = v;
        TRY(get_int(t, path, "dim", 1, 65536, true, &v));
        c->tables[i].dim = (int32_t)v;
    }
    return FLAME_OK;
}

static flame_status parse_features(const cJSON *root, fl_model_cfg *c)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "features");
    if (!cJSON_IsArray(arr)) return BAD("'features' must be an array");
    int n = cJSON_GetArraySize(arr);
    if (n < 1 || n > FL_MAX_FEATURES) return BAD("features has %d entries, expected 1..%d", n, FL_MAX_FEATURES);
    c->num_features = n;
    c->num_side = 0;
    static const char *const inputs[] = {"item", "side"};
    static const char *const pools[] = {"sum", "mean"};
    for (int i = 0; i < n; i++) {
        const cJSON *f = cJSON_GetArrayItem(arr, i);
        fl_feature_cfg *fc = &c->features[i];
        char path[32];
        snprintf(path, sizeof path, "features[%d].", i);
        if (!cJSON_IsObject(f)) return BAD("%s must be an object", path);
        TRY(get_name(f, path, fc->name));
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(f, "table");
        if (!cJSON_IsString(t)) return BAD("'%stable' must be a string", path);
        fc->table = find_table(c, t->valuestring);
        if (fc->table < 0) return BAD("%stable '%.40s' is not in tables", path, t->valuestring);
        int input = 0, pool = 0;
        TRY(get_enum(f, path, "input", inputs, 2, true, &input));
        TRY(get_enum(f, path, "pooling", pools, 2, false, &pool));
        fc->side_slot = input == 1 ? c->num_side++ : -1;
        fc->pooling = (fl_pooling)pool;
    }
    return FLAME_OK;
}

static flame_status parse_embedding_shape(const cJSON *root, fl_model_cfg *c)
{
    static const char *const combines[] = {"sum", "concat"};
    int comb = 0;
    TRY(get_enum(root, "", "combine", combines, 2, false, &comb));
    c->combine_concat = comb == 1;
    int64_t e = 0;
    for (int i = 0; i < c->num_features; i++) {
        int32_t dim = c->tables[c->features[i].table].dim;
        if (c->combine_concat)
            e += dim;
        else if (i > 0 && dim != e)
            return BAD("combine 'sum' needs equal dims: feature '%s' has %d, feature '%s' has %lld",
                       c->features[i].name, dim, c->features[0].name, (long long)e);
        else
            e = dim;
    }
    if (e > 65536) return BAD("combined embedding width %lld exceeds 65536", (long long)e);
    c->embed_dim = (int32_t)e;
    c->projection = false;
    TRY(get_bool(root, "projection", &c->projection));
    if (!c->projection && c->embed_dim != c->d_model)
        return BAD("combined embedding width %d != d_model %d and projection is false", c->embed_dim, c->d_model);
    return FLAME_OK;
}

static flame_status parse_position(const cJSON *root, fl_model_cfg *c)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "position");
    c->position_rule = FL_POS_NONE;
    c->candidate_position = -1;
    if (!p) return FLAME_OK;
    if (!cJSON_IsObject(p)) return BAD("'position' must be an object");
    static const char *const rules[] = {"none", "left_padded_slot", "from_recent", "from_oldest"};
    int rule = 0;
    TRY(get_enum(p, "position.", "rule", rules, 4, true, &rule));
    c->position_rule = (fl_position_rule)rule;
    if (rule == FL_POS_NONE) return FLAME_OK;
    int64_t rows = 0;
    TRY(get_int(p, "position.", "rows", c->max_len, 1 << 20, true, &rows));
    c->position_rows = rows;
    TRY(get_int(p, "position.", "candidate_position", -1, rows - 1, false, &c->candidate_position));
    return FLAME_OK;
}

static flame_status parse_blocks(const cJSON *root, fl_model_cfg *c)
{
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "blocks");
    if (!cJSON_IsObject(b)) return BAD("'blocks' must be an object");
    int64_t v = 0;
    TRY(get_int(b, "blocks.", "count", 0, FL_MAX_BLOCKS, true, &v));
    c->num_blocks = (int32_t)v;
    TRY(get_int(b, "blocks.", "num_heads", 1, 256, true, &v));
    c->num_heads = (int32_t)v;
    if (c->d_model % c->num_heads)
        return BAD("d_model %d is not a multiple of blocks.num_heads %d", c->d_model, c->num_heads);
    TRY(get_int(b, "blocks.", "ffn_dim", 1, 1 << 20, true, &v));
    c->ffn_dim = (int32_t)v;
    static const char *const norms[] = {"post", "pre"};
    int norm = 0, act = 0;
    TRY(get_enum(b, "blocks.", "norm", norms, 2, true, &norm));
    c->pre_ln = norm == 1;
    TRY(get_enum(b, "blocks.", "activation", activations + 1, 3, true, &act));
    c->activation = (fl_activation)(act + 1);
    return FLAME_OK;
}

static flame_status parse_layernorm(const cJSON *root, fl_model_cfg *c)
{
    c->ln_eps = 1e-5f;
    c->eps_inside_sqrt = true;
    const cJSON *ln = cJSON_GetObjectItemCaseSensitive(root, "layernorm");
    if (!ln) return FLAME_OK;
    if (!cJSON_IsObject(ln)) return BAD("'layernorm' must be an object");
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(ln, "eps");
    if (eps) {
        if (!cJSON_IsNumber(eps) || !(eps->valuedouble >= 0 && eps->valuedouble <= 1))
            return BAD("layernorm.eps must be a number in [0, 1]");
        c->ln_eps = (float)eps->valuedouble;
    }
    return get_bool(ln, "eps_inside_sqrt", &c->eps_inside_sqrt);
}

static flame_status parse_tasks(const cJSON *head, fl_model_cfg *c)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(head, "tasks");
    if (!cJSON_IsArray(arr)) return BAD("'head.tasks' must be an array");
    int n = cJSON_GetArraySize(arr);
    if (n < 1 || n > FL_MAX_TASKS) return BAD("head.tasks has %d entries, expected 1..%d", n, FL_MAX_TASKS);
    c->num_tasks = n;
    for (int t = 0; t < n; t++) {
        const cJSON *task = cJSON_GetArrayItem(arr, t);
        fl_task_cfg *tc = &c->tasks[t];
        char path[40];
        snprintf(path, sizeof path, "head.tasks[%d].", t);
        if (!cJSON_IsObject(task)) return BAD("%s must be an object", path);
        TRY(get_name(task, path, tc->name));
        const cJSON *hidden = cJSON_GetObjectItemCaseSensitive(task, "hidden");
        int nh = hidden ? cJSON_GetArraySize(hidden) : 0;
        if (hidden && !cJSON_IsArray(hidden)) return BAD("'%shidden' must be an array", path);
        if (nh > FL_MAX_TASK_LAYERS - 1)
            return BAD("%shidden has %d layers, at most %d", path, nh, FL_MAX_TASK_LAYERS - 1);
        tc->num_layers = nh + 1;
        tc->width[0] = c->d_model;
        for (int l = 0; l < nh; l++) {
            const cJSON *w = cJSON_GetArrayItem(hidden, l);
            if (!cJSON_IsNumber(w) || w->valuedouble != floor(w->valuedouble) || w->valuedouble < 1 ||
                w->valuedouble > 65536)
                return BAD("%shidden[%d] must be an integer in [1, 65536]", path, l);
            tc->width[l + 1] = (int32_t)w->valuedouble;
        }
        tc->width[nh + 1] = 1;
        int act = 2; /* index of "relu" in activations + 1: the default */
        TRY(get_enum(task, path, "activation", activations + 1, 3, false, &act));
        tc->activation = (fl_activation)(act + 1);
    }
    return FLAME_OK;
}

static flame_status parse_head(const cJSON *root, fl_model_cfg *c)
{
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(root, "head");
    if (!cJSON_IsObject(h)) return BAD("'head' must be an object");
    static const char *const types[] = {"dot", "sumi"};
    int type = 0;
    TRY(get_enum(h, "head.", "type", types, 2, true, &type));
    c->head = (flame_head_type)type;
    if (c->head == FLAME_HEAD_SUMI) return parse_tasks(h, c);
    c->num_tasks = 1;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(h, "table");
    if (!cJSON_IsString(t)) return BAD("'head.table' must be a string");
    c->dot_table = find_table(c, t->valuestring);
    if (c->dot_table < 0) return BAD("head.table '%.40s' is not in tables", t->valuestring);
    if (c->tables[c->dot_table].dim != c->d_model)
        return BAD("head.table '%s' has dim %d, the dot head needs d_model %d", t->valuestring,
                   c->tables[c->dot_table].dim, c->d_model);
    return FLAME_OK;
}

static flame_status parse_root(const cJSON *root, fl_model_cfg *c)
{
    if (!cJSON_IsObject(root)) return BAD("not a JSON object");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "flame"))
        return BAD("'format' must be \"flame\"");
    int64_t v = 0;
    TRY(get_int(root, "", "version", 1, 1, true, &v));
    TRY(get_int(root, "", "d_model", 1, 65536, true, &v));
    c->d_model = (int32_t)v;
    TRY(get_int(root, "", "max_len", 1, 1 << 20, true, &v));
    c->max_len = (int32_t)v;
    TRY(parse_tables(root, c));
    TRY(parse_features(root, c));
    TRY(parse_embedding_shape(root, c));
    TRY(parse_position(root, c));
    c->input_layernorm = false;
    c->final_layernorm = false;
    TRY(get_bool(root, "input_layernorm", &c->input_layernorm));
    TRY(get_bool(root, "final_layernorm", &c->final_layernorm));
    TRY(parse_blocks(root, c));
    TRY(parse_layernorm(root, c));
    return parse_head(root, c);
}

flame_status fl_config_parse(const char *json, size_t len, fl_model_cfg *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    /* cJSON_GetErrorPtr is process-global, so concurrent loads cannot say where it failed. */
    if (!root) return BAD("flame.config is not valid JSON");
    for (const char *c = end; c < json + len; c++)
        if (*c != ' ' && *c != '\n' && *c != '\t' && *c != '\r') {
            cJSON_Delete(root);
            return BAD("flame.config has bytes after its JSON (at offset %td)", c - json);
        }
    bool raw;
    long nul = fl_json_string_nul(json, (size_t)(end - json), &raw);
    if (nul >= 0) {
        cJSON_Delete(root);
        return raw ? BAD("flame.config has a raw control byte 0x%02x inside a string at offset %ld (JSON forbids them)",
                         (unsigned char)json[nul], nul)
                   : BAD("flame.config has a \\u0000 escape at offset %ld (its strings may not hold NUL)", nul);
    }
    bool nomem = false;
    const char *dup = fl_json_duplicate_key(root, true, &nomem);
    flame_status st = nomem ? fl_error(FLAME_ERR_NOMEM, "out of memory checking the keys of flame.config")
                      : dup ? BAD("key '%.60s' appears twice in an object of flame.config", dup)
                            : parse_root(root, cfg);
    cJSON_Delete(root);
    return st;
}
