// OmniQuant's round-to-nearest quantiser (Shao et al. 2024, Eq. 2 with gamma = beta = 1): each
// group's own range [min, max], h = (max - min) / (2^N - 1), z = -round(min / h),
// q = clamp(round(x / h) + z, 0, 2^N - 1), x^ = (q - z) h — written here from the paper with plain
// loops and compared exactly with the omniquant-rtn presets; the rtn0 presets widen each range to
// hold 0 (QuantScheme::range_holds_zero), which changes one-signed channels and tokens only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "oasis/ops/quantize.hpp"
#include "oasis/research/quant_presets.hpp"
#include "oasis_test.hpp"

using namespace oasis;
using oasis::test::make_rng;
using oasis::test::randn;

namespace {

/// Eq. 2 on one value of a group with range [xmin, xmax] (xmax > xmin).
double omniquant_eq2(double x, double xmin, double xmax, int bits) {
  const double top = std::pow(2.0, bits) - 1;
  const double h = (xmax - xmin) / top;
  const double z = -std::nearbyint(xmin / h);
  return (std::clamp(std::nearbyint(x / h) + z, 0.0, top) - z) * h;
}

/// W [rows, cols] with rows 0 and 1 all positive, row 2 all negative, the others of both signs.
Tensor<double> one_signed_rows(std::uint64_t seed, index_t rows, index_t cols) {
  auto rng = make_rng(seed);
  Tensor<double> w = randn<double>({rows, cols}, rng, 0.5);
  for (index_t c = 0; c < cols; ++c) {
    w(0, c) = 1.0 + std::abs(w(0, c));
    w(1, c) = 0.25 + 0.1 * std::abs(w(1, c));
    w(2, c) = -2.0 - std::abs(w(2, c));
  }
  return w;
}

/// max |x - x^| over row r.
double row_error(const Tensor<double>& x, const Tensor<double>& xq, index_t r) {
  double e = 0;
  for (index_t c = 0; c < x.dim(1); ++c) e = std::max(e, std::abs(x(r, c) - xq(r, c)));
  return e;
}

}  // namespace

TEST(OmniQuantRtn, PresetsFollowEq2OnEachGroupsOwnRange) {
  for (const char* name : {"omniquant-rtn-W4A4", "omniquant-rtn-W6A6", "omniquant-rtn-W8A8"}) {
    SCOPED_TRACE(name);
    const WAQuantConfig cfg = wa_preset(name);
    const int bits = cfg.weights.bits;
    const Tensor<double> W = one_signed_rows(1811, 6, 11);
    const Tensor<double> x = one_signed_rows(1812, 4, 11);  // tokens: rows of [N, in]
    const Tensor<double> wq = fake_quantize(W, cfg.weights), xq = fake_quantize(x, cfg.activations);
    for (const auto& [t, tq] : {std::pair{&W, &wq}, std::pair{&x, &xq}})
      for (index_t r = 0; r < t->dim(0); ++r) {
        double lo = HUGE_VAL, hi = -HUGE_VAL;
        for (index_t c = 0; c < t->dim(1); ++c) lo = std::min(lo, (*t)(r, c)), hi = std::max(hi, (*t)(r, c));
        for (index_t c = 0; c < t->dim(1); ++c) EXPECT_EQ((*tq)(r, c), omniquant_eq2((*t)(r, c), lo, hi, bits)) << r << " " << c;
      }
  }
}

TEST(OmniQuantRtn, OneSignedGroupsDifferFromTheZeroHoldingRange) {
  // The same layout with ranges widened to hold 0 (rtn0): equal on rows of both signs, coarser on
  // one-signed rows (the step covers [0, max] instead of [min, max]).
  const Tensor<double> W = one_signed_rows(1813, 6, 16);
  const QuantScheme own = wa_preset("omniquant-rtn-W4A4").weights, held = wa_preset("rtn0-W4A4").weights;
  ASSERT_FALSE(own.range_holds_zero);
  ASSERT_TRUE(held.range_holds_zero);
  const Tensor<double> a = fake_quantize(W, own), b = fake_quantize(W, held);
  for (index_t r = 3; r < 6; ++r)
    for (index_t c = 0; c < 16; ++c) EXPECT_EQ(a(r, c), b(r, c)) << r << " " << c;
  for (index_t r = 0; r < 3; ++r) {
    double lo = HUGE_VAL, hi = -HUGE_VAL, amax = 0;
    for (index_t c = 0; c < 16; ++c) lo = std::min(lo, W(r, c)), hi = std::max(hi, W(r, c)), amax = std::max(amax, std::abs(W(r, c)));
    const double e_own = row_error(W, a, r), e_held = row_error(W, b, r);
    // each within half its step (plus roundings): (hi - lo) / 15 against amax / 15; and the
    // zero-holding range's error passes the one-signed range's bound (the row's values fall anywhere
    // in the coarser steps: that the 15 off the grid's top all lie within the finer half step has
    // probability about ((hi - lo) / amax)^15, below 1e-3 for these rows)
    EXPECT_LE(e_own, (hi - lo) / 30 * (1 + 1e-12)) << r;
    EXPECT_LE(e_held, amax / 30 * (1 + 1e-12)) << r;
    EXPECT_GT(e_held, (hi - lo) / 30 * (1 + 1e-12)) << r;
  }
}

TEST(OmniQuantRtn, OffGridZeroPointsKeepTheErrorBound) {
  // A one-signed group's zero point lies off [0, 2^N - 1] (z = -round(min / h) < 0 for min > 0);
  // the quantiser error stays within scale / 2 + u (2 |x| + scale) (docs/baselines.md).
  QuantScheme s{4, false, QuantGranularity::per_token, 0};
  s.range_holds_zero = false;
  const Tensor<double> x = one_signed_rows(1814, 5, 13);
  const QuantParams<double> p = minmax_quant_params(x, s);
  EXPECT_LT(p.zero_point[0], 0.0);   // all positive
  EXPECT_GT(p.zero_point[2], 15.0);  // all negative
  const Tensor<double> xq = fake_quantize(x, p);
  const double u = std::numeric_limits<double>::epsilon() / 2;
  for (index_t r = 0; r < 5; ++r)
    for (index_t c = 0; c < 13; ++c)
      EXPECT_LE(std::abs(x(r, c) - xq(r, c)), p.scale[static_cast<std::size_t>(r)] / 2 +
                                                  u * (2 * std::abs(x(r, c)) + p.scale[static_cast<std::size_t>(r)]))
          << r << " " << c;
  // A constant group is exact under both range rules (its zero-width range is widened to hold 0).
  const Tensor<double> k({2, 3}, {0.7, 0.7, 0.7, -3.0, -3.0, -3.0});
  for (bool holds : {false, true}) {
    s.range_holds_zero = holds;
    const Tensor<double> kq = fake_quantize(k, s);
    for (index_t i = 0; i < k.size(); ++i) EXPECT_NEAR(kq[i], k[i], 4 * u * std::abs(k[i])) << holds << " " << i;
  }
}

TEST(OmniQuantRtn, CalibratedOwnRangesAndRefusals) {
  // Static ranges follow the same rule: the running estimates as they are, not widened.
  QuantScheme s{8, false, QuantGranularity::per_channel, 1};
  s.range_holds_zero = false;
  const Tensor<double> x({2, 2}, {1.0, -3.0, 2.0, -1.0});  // channel 0 in [1, 2], channel 1 in [-3, -1]
  RunningMinMax rm;
  rm.update(x, s);
  const QuantParams<double> p = rm.params<double>(s, x.shape());
  EXPECT_DOUBLE_EQ(p.scale[0], 1.0 / 255);
  EXPECT_DOUBLE_EQ(p.scale[1], 2.0 / 255);
  EXPECT_EQ(p.zero_point[0], -255.0);
  // A symmetric range always holds 0: the own-range flag is refused there by name.
  QuantScheme bad{8, true, QuantGranularity::per_tensor, 0};
  bad.range_holds_zero = false;
  EXPECT_EQ(oasis::test::thrown_argument([&] { fake_quantize(x, bad); }), "range_holds_zero");
  EXPECT_EQ(oasis::test::thrown_argument([] { wa_preset("rtn0-W3A3"); }), "preset");
  EXPECT_EQ(oasis::test::thrown_argument([] { wa_preset("omniquant-W4A4"); }), "preset");
}
