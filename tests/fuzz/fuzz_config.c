/* The flame.config JSON (fl_config_parse: every key, range and cross-check). A config that
 * parses and is small enough is also built (flame_model_create_random) and scored once, so
 * the shapes it implies are exercised too. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "model/model_cfg.h"

static int small(const fl_model_cfg *c)
{
    int64_t cells = 0;
    for (int32_t t = 0; t < c->num_tables; t++) cells += c->tables[t].rows * c->tables[t].dim;
    for (int32_t t = 0; t < c->num_tasks; t++)
        for (int32_t l = 0; l <= c->tasks[t].num_layers; l++)
            if (c->tasks[t].width[l] > 256) return 0;
    return cells <= (1 << 16) && c->d_model <= 64 && c->embed_dim <= 256 && c->ffn_dim <= 256 &&
           c->num_blocks <= 4 && c->position_rows <= 1024 && c->max_len <= 64;
}

static void score_once(const char *json)
{
    flame_model *m = NULL;
    flame_status st = flame_model_create_random(json, 1, &m);
    FZ_CHECK_ERROR(st);
    if (m) fz_score_once(m);
    flame_model_destroy(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json = malloc(size + 1); /* the loader hands the parser a NUL-terminated copy */
    if (!json) return 0;
    memcpy(json, data, size);
    json[size] = '\0';
    fl_model_cfg cfg;
    flame_status st = fl_config_parse(json, size, &cfg);
    FZ_CHECK_ERROR(st);
    if (st == FLAME_OK) {
        FZ_ASSERT(cfg.d_model > 0 && cfg.num_tables > 0 && cfg.num_tables <= FL_MAX_TABLES, "d_model %d tables %d",
                  (int)cfg.d_model, (int)cfg.num_tables);
        if (small(&cfg) && strlen(json) == size) score_once(json);
    }
    free(json);
    return 0;
}
