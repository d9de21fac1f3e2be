/* Whether the CBLAS library fell back to pre-AVX kernels on a CPU that has AVX2 (OpenBLAS
 * 0.3.21 does this on CPUs newer than it, e.g. Emerald Rapids: "Prescott"). The CPU engine
 * does not call the BLAS on a CPU with AVX2 (its own kernels, engine/cpu_plan.h), so this is
 * only said at debug level; fl_cpu_linear, which goes to the BLAS, still avoids it. */
#include <cblas.h>
#include <pthread.h>
#include <string.h>

#include "cpu/kernels.h"

static bool weak;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void check(void)
{
    static const char *const old[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Katmai",
                                      "Coppermine", "Northwood", "Banias", "Generic"};
    const char *core = openblas_get_corename();
    bool avx2 = false;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2");
#endif
    for (size_t i = 0; core && avx2 && i < sizeof old / sizeof old[0]; i++)
        if (!strcasecmp(core, old[i])) weak = true;
    if (weak)
        fl_log(FLAME_LOG_DEBUG,
               "OpenBLAS uses its '%s' kernels on this AVX2 CPU (it does not recognise the CPU); the CPU engine "
               "runs its own AVX2/AVX-512 kernels here and does not call it",
               core);
}

bool fl_blas_is_weak(void)
{
    pthread_once(&once, check);
    return weak;
}

int fl_blas_threads(void)
{
    return openblas_get_num_threads();
}

const char *fl_blas_name(void)
{
    const char *core = openblas_get_corename();
    return core ? core : "unknown";
}
