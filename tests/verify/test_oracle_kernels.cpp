// tests/verify/test_oracle_kernels.cpp — the fast oracle's matrix product in every instruction-set
// variant this CPU runs equals the plain triple loop within the order-independent bound
// |C - AB| <= gamma_K sum_k |a_ik| |b_kj| (K u / (1 - K u), u = 2^-53), with and without
// accumulation, for row counts that exercise every partial tile and for an empty K (C = 0 or C);
// and the transposed-A product gemm_at gives gemm's bits on the transposed copy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "oasis_random.hpp"
#include "oracle_kernels.hpp"

namespace k = oasis::verify::kernels;

TEST(OracleKernels, EveryVariantIsAMatrixProduct) {
  const std::vector<const k::Gemm*> variants = k::runnable_variants();
  auto rng = oasis::test::make_rng(31);
  for (const k::idx M : {1, 2, 3, 4, 5, 13, 64})
    for (const k::idx K : {0, 300}) {
      const k::idx N = 2 * k::kColumnQuantum, lda = K + 3, ldb = N + k::kColumnQuantum, ldc = N + 5;
      const auto A = oasis::test::randn<double>({M, lda}, rng), B = oasis::test::randn<double>({K, ldb}, rng),
                 C0 = oasis::test::randn<double>({M, ldc}, rng);
      for (const k::Gemm* g : variants)
        for (bool acc : {false, true}) {
          std::vector<double> C(C0.storage());
          g->gemm(A.data(), lda, B.data(), ldb, C.data(), ldc, M, N, K, acc);
          const double gamma = K * std::ldexp(1.0, -53) / (1 - K * std::ldexp(1.0, -53));
          for (k::idx i = 0; i < M; ++i)
            for (k::idx j = 0; j < ldc; ++j) {
              const double c0 = C0.data()[i * ldc + j];
              if (j >= N) {  // columns beyond N are not touched
                EXPECT_EQ(C[static_cast<std::size_t>(i * ldc + j)], c0) << g->isa;
                continue;
              }
              double ref = acc ? c0 : 0.0, mag = acc ? std::abs(c0) : 0.0;
              for (k::idx x = 0; x < K; ++x) {
                ref += A.data()[i * lda + x] * B.data()[x * ldb + j];
                mag += std::abs(A.data()[i * lda + x] * B.data()[x * ldb + j]);
              }
              // both sums have an error of at most gamma (K + 1) mag
              EXPECT_LE(std::abs(C[static_cast<std::size_t>(i * ldc + j)] - ref), 2.0 * gamma * mag * 1.01)
                  << g->isa << " M " << M << " [" << i << ", " << j << "] acc " << acc;
            }
        }
    }
}

// gemm_at reads A transposed: on every variant it gives the bits of gemm on A's transposed copy
// (each element is the same multiply-add chain), for row tails of 1 to 5 rows and full tiles of 3,
// 4 and 6 (the variants' MR: AVX2, generic, AVX-512), two column strips, K across a panel boundary (KB = 256) and both
// accumulate modes.
TEST(OracleKernels, TransposedAIsGemmOnTheTransposedCopy) {
  auto rng = oasis::test::make_rng(37);
  for (const k::Gemm* g : k::runnable_variants())
    for (const k::idx M : {1, 2, 3, 5, 6, 7, 8, 13, 64})
      for (const k::idx K : {0, 1, 64, 300}) {
        const k::idx N = 2 * k::kColumnQuantum, lda = M + 2, ldb = N + k::kColumnQuantum, ldc = N + 3;
        const auto A = oasis::test::randn<double>({std::max<k::idx>(K, 1), lda}, rng);  // K x M, rows lda apart
        const auto B = oasis::test::randn<double>({std::max<k::idx>(K, 1), ldb}, rng);
        const auto C0 = oasis::test::randn<double>({M, ldc}, rng);
        std::vector<double> At(static_cast<std::size_t>(M * std::max<k::idx>(K, 1)));
        for (k::idx i = 0; i < M; ++i)
          for (k::idx x = 0; x < K; ++x) At[static_cast<std::size_t>(i * K + x)] = A.data()[x * lda + i];
        for (bool acc : {false, true}) {
          std::vector<double> C1(C0.storage()), C2(C0.storage());
          g->gemm_at(A.data(), lda, B.data(), ldb, C1.data(), ldc, M, N, K, acc);
          g->gemm(At.data(), K, B.data(), ldb, C2.data(), ldc, M, N, K, acc);
          for (std::size_t i = 0; i < C1.size(); ++i)
            ASSERT_EQ(std::memcmp(&C1[i], &C2[i], sizeof(double)), 0)
                << g->isa << " M " << M << " K " << K << " acc " << acc << " at " << i << ": " << C1[i] << " vs " << C2[i];
        }
      }
}
