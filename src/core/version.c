#include "core/common.h"

FLAME_API unsigned flame_version(void)
{
    return FLAME_VERSION_NUMBER;
}

FLAME_API const char *flame_version_string(void)
{
    return FLAME_VERSION_STRING;
}
