/* FL_CLONES: compile a kernel for AVX-512F, AVX2 and baseline x86-64, the loader picking one
 * from the CPU's feature bits (cpuid). Not "arch=" clones: GCC dispatches those by CPU model
 * number, so a CPU newer than the compiler (or a virtual machine reporting an unusual model)
 * got the baseline code. No FMA is enabled, and -std=c11 keeps a * b + c two roundings, so
 * every clone computes the same bits. */
#ifndef FLAME_CPU_CLONES_H
#define FLAME_CPU_CLONES_H

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) &&        \
    !defined(__SANITIZE_THREAD__)
#define FL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FL_CLONES
#endif

#endif
