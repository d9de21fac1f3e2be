#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "cublaslt_loader.cuh"

#define STR2(x) #x
#define STR(x) STR2(x)

static fl_cublaslt_api api;
static bool loaded;
static char failure[512];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void)
{
    // the soname of the major version we were compiled against, then the toolkit's own copy
    static const char *const names[] = {"libcublasLt.so." STR(CUBLAS_VER_MAJOR),
#ifdef FL_CUDA_LIBDIR
                                        FL_CUDA_LIBDIR "/libcublasLt.so." STR(CUBLAS_VER_MAJOR),
#endif
                                        nullptr};
    void *h = nullptr;
    for (int i = 0; names[i] && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(failure, sizeof failure, "cannot load %s: %s", names[0], dlerror());
        return;
    }
#define FL_LT_LOAD(name)                                                                                       \
    api.name = reinterpret_cast<decltype(api.name)>(dlsym(h, #name));                                          \
    if (!api.name) {                                                                                           \
        snprintf(failure, sizeof failure, "%s has no symbol %s", names[0], #name);                            \
        return;                                                                                                \
    }
    FL_LT_LOAD(cublasLtCreate)
    FL_LT_LOAD(cublasLtDestroy)
    FL_LT_LOAD(cublasLtMatmul)
    FL_LT_LOAD(cublasLtMatmulAlgoGetHeuristic)
    FL_LT_LOAD(cublasLtMatmulDescCreate)
    FL_LT_LOAD(cublasLtMatmulDescDestroy)
    FL_LT_LOAD(cublasLtMatmulDescSetAttribute)
    FL_LT_LOAD(cublasLtMatmulPreferenceCreate)
    FL_LT_LOAD(cublasLtMatmulPreferenceDestroy)
    FL_LT_LOAD(cublasLtMatmulPreferenceSetAttribute)
    FL_LT_LOAD(cublasLtMatrixLayoutCreate)
    FL_LT_LOAD(cublasLtMatrixLayoutDestroy)
    FL_LT_LOAD(cublasLtMatrixLayoutSetAttribute)
#undef FL_LT_LOAD
    loaded = true; // the handle stays open for the life of the process
}

const fl_cublaslt_api *fl_cublaslt(void)
{
    pthread_once(&once, load);
    if (!loaded) {
        fl_error(FLAME_ERR_NO_DEVICE, "%s", failure);
        return nullptr;
    }
    return &api;
}
