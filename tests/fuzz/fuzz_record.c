/* The feature record encoding (docs/features.md "Record encoding"; the item cache's entries
 * and the Redis value): fl_rec_check, then a record it accepts read back through the batch
 * API: every slot and the dense values stay inside the blob and add up to its length, every
 * id is >= 0 and every dense value finite.
 * Input: one byte of expected slot count, then the blob. */
#include <math.h>
#include <string.h>

#include "features/record.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int32_t slots = data[0] % (FL_MAX_SLOTS + 1);
    size_t len = size - 1;
    uint8_t *blob = malloc(len ? len : 1); /* its own allocation: ASan sees every byte past it */
    if (!blob) return 0;
    memcpy(blob, data + 1, len);
    flame_status st = fl_rec_check(blob, len, slots, "fuzzed record");
    FZ_CHECK_ERROR(st);
    if (st == FLAME_OK) {
        flame_feature_batch *b = NULL;
        FZ_ASSERT(flame_feature_batch_create(slots, &b) == FLAME_OK, "%s", flame_last_error());
        FZ_ASSERT(fl_batch_reset(b, 1) == FLAME_OK && fl_batch_put_blob(b, 0, blob, len) == FLAME_OK, "%s",
                  flame_last_error());
        size_t ids = 0;
        for (int32_t s = 0; s < slots; s++) {
            int found = 0;
            const int64_t *p = NULL;
            size_t n = 0;
            FZ_ASSERT(flame_feature_batch_get_slot(b, 0, s, &found, &p, &n) == FLAME_OK && found, "%s",
                      flame_last_error());
            for (size_t k = 0; k < n; k++) FZ_ASSERT(p[k] >= 0, "slot %d: id %lld accepted", s, (long long)p[k]);
            ids += n;
        }
        const float *d = NULL;
        size_t nd = 0;
        FZ_ASSERT(flame_feature_batch_get_dense(b, 0, &d, &nd) == FLAME_OK, "%s", flame_last_error());
        for (size_t k = 0; k < nd; k++) FZ_ASSERT(isfinite(d[k]), "dense[%zu] = %g accepted", k, (double)d[k]);
        FZ_ASSERT(fl_rec_bytes(slots, ids, nd) == len, "%zu ids and %zu dense values in a %zu-byte record", ids, nd,
                  len);
        flame_feature_batch_destroy(b);
    }
    free(blob);
    return 0;
}
