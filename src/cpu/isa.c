/* Which vector instruction set libflame's own CPU kernels use (contract in kernels.h).
 * Decided from the CPU's feature bits and the operating system's register support (cpuid and
 * xgetbv, through the compiler's __builtin_cpu_supports), never from the CPU's name or model
 * number: a CPU newer than every table still reports its features. */
#include <stdatomic.h>

#include "cpu/kernels.h"
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

/* Read once: the kernels ask on every call. Relaxed atomics: concurrent first calls store the
 * same value. -1: not read yet. */
static _Atomic int isa_cache = -1, f16c_cache = -1;

fl_cpu_isa fl_cpu_isa_detect(void)
{
    int isa = atomic_load_explicit(&isa_cache, memory_order_relaxed);
    if (isa < 0) {
        isa = FL_ISA_BASE;
#if defined(__x86_64__) && defined(__GNUC__)
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f")) isa = FL_ISA_AVX512;
        else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) isa = FL_ISA_AVX2;
#endif
        atomic_store_explicit(&isa_cache, isa, memory_order_relaxed);
    }
    return (fl_cpu_isa)isa;
}

bool fl_cpu_has_f16c(void)
{
    int f = atomic_load_explicit(&f16c_cache, memory_order_relaxed);
    if (f < 0) {
        f = 0;
#if defined(__x86_64__) && defined(__GNUC__)
        /* CPUID leaf 1, ECX bit 29 (cpuid.h's bit_F16C): __builtin_cpu_supports has no "f16c"
         * in older clang; the OS's saving of the AVX state is the AVX2 level's check */
        unsigned a, b, c, d;
        f = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) ? 1 : 0;
#endif
        atomic_store_explicit(&f16c_cache, f, memory_order_relaxed);
    }
    return f == 1;
}

const char *fl_cpu_isa_name(fl_cpu_isa isa)
{
    switch (isa) {
    case FL_ISA_AVX512: return "avx512";
    case FL_ISA_AVX2: return "avx2";
    default: return "base";
    }
}
