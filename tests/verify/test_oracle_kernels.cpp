// tests/verify/test_oracle_kernels.cpp — the fast oracle's matrix product in every instruction-set
// variant this CPU runs equals the plain triple loop within the order-independent bound
// |C - AB| <= gamma_K sum_k |a_ik| |b_kj| (K u / (1 - K u), u = 2^-53), with and without
// accumulation, for row counts that exercise every partial tile and for an empty K (C = 0 or C).
#include <gtest/gtest.h>

#include <cmath>
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
