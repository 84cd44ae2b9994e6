// VERIFY_OPS_VECTOR_CLONES: marks a function whose loops the compiler
// vectorizes, to be compiled once per x86-64 level (AVX-512, AVX2+FMA, the
// baseline) and picked at load time by the CPU it runs on.
//
// Why not at::vec::Vectorized: ATen compiles its kernels once per CPU
// capability with per-file flags; an extension compiled once gets only the
// generic Vectorized (plain arrays, scalar exp) on x86. Plain loops compiled
// per level by target_clones give one source for AVX2 and AVX-512, and on
// Arm the baseline build already has NEON. The matrix products go through
// at::native::cpublas::brgemm, which picks its own kernel at run time.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define VERIFY_OPS_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define VERIFY_OPS_VECTOR_CLONES
#endif
