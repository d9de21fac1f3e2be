/* A model file: the safetensors header, the tensor table, the flame.config metadata and every
 * check of the loader (flame_model_load). A file that loads must answer get_info and, when
 * small, score one request (under the sanitizers; the scores are not judged). */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_file f;
    if (fz_file_open(&f, data, size)) return 0;
    flame_model *m = NULL;
    flame_status st = flame_model_load(f.path, &m);
    FZ_CHECK_ERROR(st);
    FZ_ASSERT((st == FLAME_OK) == (m != NULL), "status %d, model %p", (int)st, (void *)m);
    if (m) {
        flame_model_info info = {.struct_size = sizeof info};
        FZ_ASSERT(flame_model_get_info(m, &info) == FLAME_OK, "%s", flame_last_error());
        FZ_ASSERT(info.d_model > 0 && info.num_items > 0, "d_model %d num_items %lld", (int)info.d_model,
                  (long long)info.num_items);
        if (info.weight_bytes <= (1u << 22) && info.d_model <= 256 && info.ffn_dim <= 1024) fz_score_once(m);
    }
    flame_model_destroy(m);
    fz_file_close(&f);
    return 0;
}
