/* The feature file (docs/features.md "Feature file"): read by flame_feature_source_create_file,
 * then every record of ids 0..63 and a few odd ids read back through the batch API, whose
 * lengths must agree with the record they came from. */
#include "fuzz.h"

static void read_back(flame_feature_source *src)
{
    int32_t slots = flame_feature_source_num_slots(src);
    int64_t ids[68];
    for (int i = 0; i < 64; i++) ids[i] = i;
    ids[64] = -1, ids[65] = INT64_MAX, ids[66] = INT64_MIN, ids[67] = 1 << 20;
    flame_feature_batch *b = NULL;
    if (flame_feature_batch_create(slots, &b)) return;
    flame_status st = flame_feature_source_fetch(src, ids, 68, b);
    FZ_ASSERT(st == FLAME_OK, "a file source failed to fetch: %s", flame_last_error());
    for (size_t i = 0; i < 68; i++) {
        for (int32_t s = 0; s < slots; s++) {
            int found = -1;
            const int64_t *p = NULL;
            size_t n = 0;
            FZ_ASSERT(flame_feature_batch_get_slot(b, i, s, &found, &p, &n) == FLAME_OK, "%s", flame_last_error());
            fz_touch(p, n * sizeof *p);
            FZ_ASSERT(!found || p || n == 0, "slot %d of record %zu: NULL ids, count %zu", (int)s, i, n);
        }
        const float *d = NULL;
        size_t nd = 0;
        FZ_ASSERT(flame_feature_batch_get_dense(b, i, &d, &nd) == FLAME_OK, "%s", flame_last_error());
        fz_touch(d, nd * sizeof *d);
    }
    flame_feature_batch_destroy(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_file f;
    if (fz_file_open(&f, data, size)) return 0;
    flame_feature_source *src = NULL;
    flame_status st = flame_feature_source_create_file(f.path, &src);
    FZ_CHECK_ERROR(st);
    if (src) read_back(src);
    flame_feature_source_destroy(src);
    fz_file_close(&f);
    return 0;
}
