/* Stand-in for the Redis feature source when the library is built without hiredis
 * (make WITH_REDIS=0): the same entry points, refusing with FLAME_ERR_UNSUPPORTED, as the CUDA
 * stand-in does for GPU engines. */
#include "core/common.h"

#define WHY "this libflame was built without Redis support (make WITH_REDIS=0)"

FLAME_API flame_status flame_feature_source_create_redis(const flame_redis_options *options,
                                                         flame_feature_source **out)
{
    fl_clear_error();
    if (out) *out = NULL;
    return fl_error(FLAME_ERR_UNSUPPORTED, "flame_feature_source_create_redis: %s", WHY);
}

FLAME_API flame_status flame_redis_load_features(const flame_redis_options *options, const char *path,
                                                 uint64_t *written)
{
    fl_clear_error();
    if (written) *written = 0;
    return fl_error(FLAME_ERR_UNSUPPORTED, "flame_redis_load_features: %s", WHY);
}
