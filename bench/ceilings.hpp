// bench/ceilings.hpp — the machine's own ceilings, measured in the same run as the benchmarks:
// float32 GEMM with Eigen and the STREAM triad. Implemented in ceilings.cpp, the one translation
// unit built with -march=native (so Eigen uses the widest vectors of this CPU, as the fast path
// does at run time); its interface passes only raw pointers, so no Eigen or oasis type crosses
// between code built for different instruction sets.
#pragma once

#include <cstdint>

namespace oasis_bench {

/// C[m x n] = A[m x k] B[k x n], row-major, Eigen's GEMM with `threads` threads.
void eigen_gemm(const float* A, const float* B, float* C, std::int64_t m, std::int64_t n, std::int64_t k, int threads);
/// a[i] = b[i] + s c[i] (STREAM triad) with OpenMP.
void triad(float* a, const float* b, const float* c, float s, std::int64_t n);
/// Eigen's SIMD instruction sets in the ceiling unit (e.g. "AVX512, FMA, AVX2, ...").
const char* eigen_simd();

}  // namespace oasis_bench
