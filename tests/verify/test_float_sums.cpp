// tests/verify/test_float_sums.cpp — the float sums of src/verify/float_sums.hpp against exact sums:
// rows of up to 700 nonnegative weights spread over up to 300 binades (scaled or not), values at the
// ends of the range [2^-40, 2^40] and exactly 0, on every product variant this CPU runs; the exact
// sum (in __float128, where every product of a double and a float is exact and the sums' error is
// far below the bound) must lie within rel of the computed one, relative to the computed one, as
// tensor_check.cpp widens a decision. The signed sum X1 = sum_j w_j v_j within signed_error, and the
// scores' magnitudes Q = sum_c |q_c| |k_c| within gamma_{d+2}, likewise. And the probe of flush-to-zero.
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
    // the float sums did round, by a fair share of their bound (0.25 to 0.75 measured): the
    // comparison is not vacuous, and the bound is not loose by orders of magnitude
    EXPECT_GT(worst, 0.05) << G->isa;
    EXPECT_GT(redo, 0) << "the data should reach the double redo";
    EXPECT_GT(decided, 100 * redo);
  }
#endif
}

TEST(FloatSums, SignedSumsAndScoreMagnitudesWithinTheirBounds) {
#if !defined(__SIZEOF_FLOAT128__)
  GTEST_SKIP() << "no __float128 on this compiler: no exact reference";
#else
  auto rng = oasis::test::make_rng(406);
  std::uniform_real_distribution<double> U(0.5, 1.5);
  auto in_range_value = [&](int zero_one_in) {
    const int r = static_cast<int>(rng() % 6);
    if (rng() % zero_one_in == 0) return 0.0;
    return (rng() % 2 ? 1.0 : -1.0) * std::ldexp(U(rng), r == 1 ? 39 : r == 2 ? -40 : static_cast<int>(rng() % 79) - 39);
  };
  for (const kn::Gemm* G : kn::runnable_variants()) {
    double worst_x1 = 0, worst_q = 0;
    for (int it = 0; it < 400; ++it) {
      // X1: weights over up to 300 binades (most below float's normal range once scaled, at times),
      // values of both signs at the range's ends and 0; its sum of squares zsq from the same weights
      const long m = 1 + static_cast<long>(rng() % 700), Lp = (m + 31) / 32 * 32, N = 32;
      const int span = rng() % 4 == 0 ? 300 : 40, top = static_cast<int>(rng() % 200) - 150;
      std::vector<double> w(static_cast<std::size_t>(Lp), 0.0), v(static_cast<std::size_t>(m * N));
      for (long j = 0; j < m; ++j)
        if (rng() % 5 != 0) w[static_cast<std::size_t>(j)] = std::ldexp(U(rng), top - static_cast<int>(rng() % span));
      for (auto& x : v) x = in_range_value(6);
      std::vector<float> wf(static_cast<std::size_t>(Lp)), vf(static_cast<std::size_t>(m * N)), o(static_cast<std::size_t>(N));
      int e = 0;
      ASSERT_TRUE(fsum::scale_to_float(w.data(), Lp, wf.data(), e));
      for (std::size_t i = 0; i < v.size(); ++i) vf[i] = static_cast<float>(v[i]);
      G->gemm_f32(wf.data(), Lp, vf.data(), N, o.data(), N, 1, N, m, false);
      const double g = fsum::gamma(m + 3), s2 = std::ldexp(1.0, e);
      double sw = 0;
      for (long j = 0; j < m; ++j) sw += w[static_cast<std::size_t>(j)] * s2;
      for (long x = 0; x < N; ++x) {
        __float128 X = 0, Z = 0;
        double Y = 0;
        long k = 0;
        for (long j = 0; j < m; ++j) {
          const double a = v[static_cast<std::size_t>(j * N + x)], wj = w[static_cast<std::size_t>(j)] * s2;
          X += static_cast<__float128>(wj) * a;
          Z += static_cast<__float128>(wj) * a * a;
          Y += std::abs(a);
          k += a != 0.0;
        }
        const double bound = fsum::signed_error(g, sw, static_cast<double>(Z), fsum::abs_part(Y * (1.0 + 1e-12), k));
        const double dev = std::abs(static_cast<double>(X - static_cast<__float128>(o[static_cast<std::size_t>(x)])));
        ASSERT_LE(dev, bound) << G->isa << " m " << m << " e " << e << " computed " << o[static_cast<std::size_t>(x)];
        if (bound > 0) worst_x1 = std::max(worst_x1, dev / bound);
      }
      // Q: d terms |q_c| |k_c| of values in range (and 0), a row of |q| against N columns of |k|
      const long d = 1 + static_cast<long>(rng() % 300);
      std::vector<double> qa(static_cast<std::size_t>(d)), ka(static_cast<std::size_t>(d * N));
      for (auto& x : qa) x = std::abs(in_range_value(8));
      for (auto& x : ka) x = std::abs(in_range_value(8));
      const std::vector<float> qf(qa.begin(), qa.end()), kf(ka.begin(), ka.end());
      G->gemm_f32(qf.data(), d, kf.data(), N, o.data(), N, 1, N, d, false);
      const double gq = fsum::gamma(d + 2);
      for (long x = 0; x < N; ++x) {
        __float128 Q = 0;
        for (long c = 0; c < d; ++c) Q += static_cast<__float128>(qa[static_cast<std::size_t>(c)]) * ka[static_cast<std::size_t>(c * N + x)];
        const double qh = o[static_cast<std::size_t>(x)];
        const double dev = std::abs(static_cast<double>(Q - static_cast<__float128>(qh)));
        ASSERT_LE(dev, gq * qh) << G->isa << " d " << d << " computed " << qh;
        if (qh > 0) worst_q = std::max(worst_q, dev / (gq * qh));
      }
    }
    std::printf("signed sums (%s): largest |err| / bound %.3f; score magnitudes: %.3f\n", G->isa, worst_x1, worst_q);
    // (measured 0.25-0.45 for X1 and 0.59-0.74 for Q over the variants: the comparisons are not vacuous)
    EXPECT_GT(worst_x1, 0.05) << G->isa << ": the signed sums should round by a fair share of their bound";
    EXPECT_GT(worst_q, 0.05) << G->isa << ": the score magnitudes should round by a fair share of their bound";
  }
  // unscaled sums near the bottom of the double range (a row whose largest weight is near 2^-390,
  // left unscaled by prob_mix_scale): the bound does not underflow with them
  const double g = fsum::gamma(100);
  EXPECT_EQ(fsum::signed_error(g, 0x1p-780, 0x1p-780, 0.0), g * 0x1p-780 * (1.0 + 1e-9));
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
