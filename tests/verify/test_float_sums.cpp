// tests/verify/test_float_sums.cpp — the float sums of src/verify/float_sums.hpp against exact sums:
// rows of up to 700 nonnegative weights spread over up to 300 binades (scaled or not), values at the
// ends of the range [2^-40, 2^40] and exactly 0, on every product variant this CPU runs; the exact
// sum (in __float128, where every product of a double and a float is exact and the sums' error is
// far below the bound) must lie within rel of the computed one, relative to the computed one, as
// tensor_check.cpp widens a decision. And the probe of flush-to-zero.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "float_sums.hpp"
#include "oasis_random.hpp"
#include "oracle_kernels.hpp"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace fsum = oasis::verify::detail::fsum;
namespace kn = oasis::verify::kernels;

TEST(FloatSums, ExactSumWithinTheDeclaredUncertaintyOnEveryVariant) {
#if !defined(__SIZEOF_FLOAT128__)
  GTEST_SKIP() << "no __float128 on this compiler: no exact reference";
#else
  auto rng = oasis::test::make_rng(405);
  std::uniform_real_distribution<double> U(0.5, 1.5);
  for (const kn::Gemm* G : kn::runnable_variants()) {
    double worst = 0;
    long decided = 0, redo = 0;
    for (int it = 0; it < 600; ++it) {
      const long m = 1 + static_cast<long>(rng() % 700), Lp = (m + 31) / 32 * 32, N = 32;
      const int span = rng() % 4 == 0 ? 300 : 40, top = static_cast<int>(rng() % 200) - 150;
      std::vector<double> w(static_cast<std::size_t>(Lp), 0.0), v(static_cast<std::size_t>(m * N), 0.0);
      for (long j = 0; j < m; ++j)
        if (rng() % 5 != 0) w[static_cast<std::size_t>(j)] = std::ldexp(U(rng), top - static_cast<int>(rng() % span));
      for (auto& x : v) {
        const int r = static_cast<int>(rng() % 6);
        x = r == 0 ? 0.0 : (rng() % 2 ? 1.0 : -1.0) * std::ldexp(U(rng), r == 1 ? 39 : r == 2 ? -40 : static_cast<int>(rng() % 79) - 39);
      }
      std::vector<float> wf(static_cast<std::size_t>(Lp)), vf(static_cast<std::size_t>(m * 2 * N)), o(static_cast<std::size_t>(2 * N));
      int e = 0;
      ASSERT_TRUE(fsum::scale_to_float(w.data(), Lp, wf.data(), e));
      for (long j = 0; j < m; ++j)
        for (long x = 0; x < N; ++x) {
          const double a = v[static_cast<std::size_t>(j * N + x)];
          vf[static_cast<std::size_t>(j * 2 * N + x)] = static_cast<float>(std::abs(a));
          vf[static_cast<std::size_t>(j * 2 * N + N + x)] = static_cast<float>(a * a);
        }
      G->gemm_f32(wf.data(), Lp, vf.data(), 2 * N, o.data(), N, 1, N, m, false);
      G->gemm_f32(wf.data(), Lp, vf.data() + N, 2 * N, o.data() + N, N, 1, N, m, false);
      const double g = fsum::gamma(m + 3);
      for (long x = 0; x < N; ++x) {
        __float128 X1 = 0, X2 = 0;
        double Y = 0, vmax = 0;
        long k = 0;
        for (long j = 0; j < m; ++j) {
          const double a = std::abs(v[static_cast<std::size_t>(j * N + x)]), wj = w[static_cast<std::size_t>(j)];
          X1 += static_cast<__float128>(wj) * a;
          X2 += static_cast<__float128>(wj) * a * a;
          Y += a;
          vmax = std::max(vmax, a);
          k += a != 0.0;
        }
        Y *= 1.0 + 1e-12;  // an upper bound of the sum, as the oracle's range sums are
        for (int s = 0; s < 2; ++s) {
          const double xh = o[static_cast<std::size_t>(s * N + x)];
          const double rel = fsum::rel(xh, g, fsum::abs_part(s ? vmax * Y : Y, k));
          if (rel > fsum::kRedo) {  // the oracle sums these in double
            ++redo;
            continue;
          }
          ++decided;
          const __float128 X = (s ? X2 : X1) * static_cast<__float128>(std::ldexp(1.0, e));
          const double dev = k == 0 ? static_cast<double>(X - xh) : static_cast<double>((X - xh) / xh);
          ASSERT_LE(std::abs(dev), rel) << G->isa << " m " << m << " e " << e << (s ? " v^2" : " |v|") << " computed " << xh;
          if (rel > 0) worst = std::max(worst, std::abs(dev) / rel);
        }
      }
    }
    std::printf("float sums (%s): %ld sums within their bound (largest |err| / bound %.3f), %ld left to double\n", G->isa,
                decided, worst, redo);
    EXPECT_GT(redo, 0) << "the data should reach the double redo";
    EXPECT_GT(decided, 100 * redo);
  }
#endif
}

TEST(FloatSums, FlushToZeroIsDetected) {
  EXPECT_TRUE(fsum::subnormals_kept());
#if defined(__x86_64__)
  const unsigned int csr = _mm_getcsr();
  for (unsigned int bits : {0x8000u, 0x0040u, 0x8040u}) {  // FTZ, DAZ, both
    _mm_setcsr(csr | bits);
    const bool kept = fsum::subnormals_kept();
    _mm_setcsr(csr);
    EXPECT_FALSE(kept) << "MXCSR bits " << bits;
  }
#endif
}
