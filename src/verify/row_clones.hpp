// src/verify/row_clones.hpp — OASIS_ROW_CLONES: a fast oracle's per-key row passes compiled for the
// baseline and for AVX2 and AVX-512 (with fused multiply-add), the version chosen when first called,
// so that their loops vectorise to the CPU's width. GCC's function multiversioning needs GCC 12 (the
// architecture levels) and an ELF glibc target (ifunc); elsewhere one version.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__INTEL_COMPILER) && __GNUC__ >= 12 && \
    defined(__ELF__) && defined(__GLIBC__)
#define OASIS_ROW_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define OASIS_ROW_CLONES
#endif
