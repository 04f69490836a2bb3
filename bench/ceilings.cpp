// bench/ceilings.cpp — GEMM and triad ceilings (see ceilings.hpp). Built with -march=native.
// EIGEN_MAX_ALIGN_BYTES is pinned to 16 (the baseline value) by the build so that Eigen's
// allocation functions agree with the rest of the program.
#include "ceilings.hpp"

#include <Eigen/Core>
#include <string>

namespace oasis_bench {

void eigen_gemm(const float* A, const float* B, float* C, std::int64_t m, std::int64_t n, std::int64_t k, int threads) {
  using RM = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::setNbThreads(threads);
  Eigen::Map<const RM> a(A, m, k), b(B, k, n);
  Eigen::Map<RM> c(C, m, n);
  c.noalias() = a * b;
}

void triad(float* a, const float* b, const float* c, float s, std::int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (std::int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

const char* eigen_simd() {
#if !defined(EIGEN_VECTORIZE_AVX512) && defined(EIGEN_VECTORIZE_AVX2)
  // Eigen 3.4 names its AVX2 (+ FMA) builds "AVX SSE, ..."; it lists AVX2 and FMA only with AVX-512
  static const std::string s = std::string(
#if defined(EIGEN_VECTORIZE_FMA)
                                   "FMA, "
#endif
                                   "AVX2, ") +
                               Eigen::SimdInstructionSetsInUse();
  return s.c_str();
#else
  return Eigen::SimdInstructionSetsInUse();
#endif
}

}  // namespace oasis_bench
