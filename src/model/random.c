/* flame_model_create_random: deterministic random weights for any config. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

/* splitmix64 (Steele, Lea, Flood, OOPSLA 2014): tiny, fast, identical on every platform. */
static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1) from the top 24 bits: exact in float32. */
static float uniform(uint64_t *s)
{
    return (float)(splitmix64(s) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

static flame_status fill(struct flame_model *m, const fl_tensor_spec *sp, uint64_t seed)
{
    uint64_t count = (uint64_t)sp->shape[0] * (uint64_t)(sp->ndim == 2 ? sp->shape[1] : 1);
    float *w = fl_aligned_alloc(count * sizeof(float));
    if (!w) return fl_error(FLAME_ERR_NOMEM, "out of memory for tensor '%s' (%llu floats)", sp->name,
                            (unsigned long long)count);
    /* Each tensor has its own stream (seed mixed with its name) so adding a tensor to a config
     * does not change the others' weights. */
    uint64_t s = seed;
    for (const char *c = sp->name; *c; c++) s = (s ^ (uint8_t)*c) * 0x100000001b3ull;
    float scale = sp->ndim == 2 ? 1.0f / sqrtf((float)sp->shape[1]) : 1.0f;
    for (uint64_t i = 0; i < count; i++) {
        float u = uniform(&s);
        switch (sp->init) {
        case FL_INIT_WEIGHT: w[i] = u * scale; break;
        case FL_INIT_BIAS: w[i] = 0.01f * u; break;
        case FL_INIT_LN_WEIGHT: w[i] = 1.0f + 0.1f * u; break;
        case FL_INIT_LN_BIAS: w[i] = 0.1f * u; break;
        }
    }
    flame_status st = fl_model_own(m, w);
    if (st) return st;
    *sp->slot = w;
    m->weight_bytes += count * sizeof(float);
    return FLAME_OK;
}

FLAME_API flame_status flame_model_create_random(const char *config_json, uint64_t seed, flame_model **out)
{
    fl_clear_error();
    if (out) *out = NULL;
    if (!config_json || !out) return fl_error(FLAME_ERR_INVALID_ARG, "flame_model_create_random: NULL argument");
    struct flame_model *m = fl_model_alloc();
    if (!m) return fl_error(FLAME_ERR_NOMEM, "out of memory allocating a model");
    flame_status st = fl_config_parse(config_json, strlen(config_json), &m->cfg);
    size_t n = 0;
    fl_tensor_spec *specs = NULL;
    if (!st) {
        m->w.blocks = calloc(m->cfg.num_blocks ? m->cfg.num_blocks : 1, sizeof *m->w.blocks);
        specs = m->w.blocks ? fl_tensor_specs(m, &n) : NULL;
        if (!specs) st = fl_error(FLAME_ERR_NOMEM, "out of memory listing model tensors");
    }
    for (size_t i = 0; i < n && !st; i++) st = fill(m, &specs[i], seed);
    free(specs);
    if (st) {
        fl_model_release(m);
        return st;
    }
    fl_model_finish(m);
    *out = m;
    return FLAME_OK;
}
