/* Which vector instruction set libflame's own CPU kernels use (contract in kernels.h).
 * Decided from the CPU's feature bits and the operating system's register support (cpuid and
 * xgetbv, through the compiler's __builtin_cpu_supports), never from the CPU's name or model
 * number: a CPU newer than every table still reports its features. */
#include "cpu/kernels.h"

fl_cpu_isa fl_cpu_isa_detect(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return FL_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return FL_ISA_AVX2;
#endif
    return FL_ISA_BASE;
}

const char *fl_cpu_isa_name(fl_cpu_isa isa)
{
    switch (isa) {
    case FL_ISA_AVX512: return "avx512";
    case FL_ISA_AVX2: return "avx2";
    default: return "base";
    }
}
