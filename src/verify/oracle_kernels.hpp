// src/verify/oracle_kernels.hpp — the matrix products of the fast oracle (double) and of
// matrix_products.hpp (float and double).
//
// One routine, C (+)= A B on row-major matrices (or A^T B: gemm_at), written once
// (oracle_kernels_impl.inc) over a GCC/Clang vector type of W lanes and compiled per scalar and
// instruction set as the fast CPU kernels are (src/cpu_fast/fast_kernels.hpp explains the target
// regions): avx512 (W = 8 doubles, 16 floats), avx2+fma (4, 8), the baseline (2, 4).
// oracle_gemm() uses the widest one the CPU supports.
// Any summation order is covered by the oracle's own error bound (gamma_n bounds hold for every
// order, with or without fused multiply-add), so the choice of kernel never changes a verdict.
#pragma once

#include <cstdint>
#include <vector>

namespace oasis::verify::kernels {

using idx = std::int64_t;

/// Column count that every B and C passed to oracle_gemm must be a multiple of.
inline constexpr idx kColumnQuantum = 32;

/// n rounded up to a multiple of q (q > 0).
inline constexpr idx round_up(idx n, idx q) { return (n + q - 1) / q * q; }

struct Gemm {
  const char* isa;
  /// C[M x N] = (accumulate ? C : 0) + A[M x K] B[K x N]; leading dimensions lda, ldb, ldc;
  /// N a multiple of kColumnQuantum.
  void (*gemm)(const double* A, idx lda, const double* B, idx ldb, double* C, idx ldc, idx M, idx N, idx K,
               bool accumulate);
  /// C[M x N] = (accumulate ? C : 0) + A^T B with A stored K x M (its first M columns, rows lda
  /// apart): bitwise gemm on A's transposed copy.
  void (*gemm_at)(const double* A, idx lda, const double* B, idx ldb, double* C, idx ldc, idx M, idx N, idx K,
                  bool accumulate);
  /// The same as gemm in float.
  void (*gemm_f32)(const float* A, idx lda, const float* B, idx ldb, float* C, idx ldc, idx M, idx N, idx K,
                   bool accumulate);
};

const Gemm& gemm_generic();
#if defined(__x86_64__) || defined(_M_X64)
const Gemm& gemm_avx2();
const Gemm& gemm_avx512();
#endif

/// Every variant this CPU runs, narrowest first.
std::vector<const Gemm*> runnable_variants();

/// The widest variant this CPU runs (OASIS_ORACLE_ISA=generic|avx2 forces a narrower one).
const Gemm& oracle_gemm();

}  // namespace oasis::verify::kernels
