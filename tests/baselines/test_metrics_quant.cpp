// Outlier/sink metrics (docs/spec.md §6) on hand-computed cases, and the fake quantisers' properties
// (docs/baselines.md: tolerances derived there).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "oasis/ops/attention.hpp"
#include "oasis/research/metrics.hpp"
#include "oasis/ops/quantize.hpp"
#include "oasis/research/quant_presets.hpp"
#include "oasis_test.hpp"

using namespace oasis;
using oasis::test::make_rng;
using oasis::test::randn;

// ------------------------------------------------------------------------------------------------
// Kurtosis and infinity norm.

TEST(BaselineMetrics, KurtosisHandComputed) {
  // x = [-1, 1, -1, 1]: mu = 0, mean((x-mu)^4) = 1, s^2 = 4/3 (Bessel), s^4 = 16/9:
  // k = 1 / (16/9 + 1e-6).
  const Tensor<double> x({1, 4}, {-1, 1, -1, 1});
  EXPECT_NEAR(kurtosis_regularised(x), 1.0 / (16.0 / 9.0 + 1e-6), 1e-15);
  // Two sequences are averaged; a shifted and scaled copy has the same kurtosis up to the 1e-6
  // regulariser: y = 3 + 2x: s^4 = 16 * 16/9, mean (y - mu)^4 = 16 -> 16 / (256/9 + 1e-6).
  const Tensor<double> two({2, 2, 2}, {-1, 1, -1, 1, 1, 5, 1, 5});
  EXPECT_NEAR(kurtosis_regularised(two), 0.5 * (1.0 / (16.0 / 9 + 1e-6) + 16.0 / (256.0 / 9 + 1e-6)), 1e-15);
  // A single outlier among n zeros-and-ones raises kurtosis far above 3.
  Tensor<double> o({1, 1000});
  for (index_t i = 0; i < 1000; ++i) o[i] = (i % 2) ? 0.1 : -0.1;
  o[500] = 50;
  EXPECT_GT(kurtosis_regularised(o), 100.0);
  // The constant sequence: 0 / (0 + 1e-6) = 0, no division by zero.
  EXPECT_EQ(kurtosis_regularised(Tensor<double>({1, 5}, 2.0)), 0.0);
  EXPECT_THROW(kurtosis_regularised(Tensor<double>({3, 1})), oasis::invalid_argument);  // n = 1: no Bessel
  EXPECT_THROW(kurtosis_regularised(Tensor<double>({0, 4})), oasis::invalid_argument);
}

TEST(BaselineMetrics, GaussianKurtosisIsThreeWithinSamplingTolerance) {
  // Pearson kurtosis of n iid normals: mean 3 - 6/(n+1) (bias, and the Bessel factor adds a
  // relative -2/n), standard deviation sqrt(24/n) to first order. With S = 8 sequences of
  // n = 8192: sd of the average = sqrt(24/8192)/sqrt(8) = 0.0191; bias < 1e-3. Tolerance 5 sd =
  // 0.096 (a false failure has probability ~6e-7; the seed is fixed anyway).
  auto rng = make_rng(811);
  const auto x = randn<double>({8, 64, 128}, rng, 2.5, -1.0);  // location and scale do not matter
  EXPECT_NEAR(kurtosis_regularised(x), 3.0, 0.096);
  // Uniform on [-1, 1]: kurtosis 9/5; sd sqrt((m8 - m4^2 ...)/n) is smaller than the Gaussian's.
  const auto uni = oasis::test::uniform<double>({8, 8192}, rng, -1, 1);
  EXPECT_NEAR(kurtosis_regularised(uni), 1.8, 0.096);
}

TEST(BaselineMetrics, MaxInfNormAndSummary) {
  const Tensor<double> a({2, 3}, {1, -4, 2, 0.5, 0.25, -1});
  EXPECT_EQ(max_inf_norm(a), (4 + 1) / 2.0);  // per sequence max |x|, averaged over sequences
  const Tensor<double> b({1, 4}, {-1, 1, -1, 1});
  const OutlierSummary s = outlier_summary(std::vector<Tensor<double>>{a, b});
  EXPECT_EQ(s.tensors, 2);
  EXPECT_DOUBLE_EQ(s.avg_kurtosis, 0.5 * (kurtosis_regularised(a) + kurtosis_regularised(b)));
  EXPECT_DOUBLE_EQ(s.max_kurtosis, std::max(kurtosis_regularised(a), kurtosis_regularised(b)));
  EXPECT_EQ(s.max_inf_norm, 2.5);
  EXPECT_THROW(outlier_summary(std::vector<Tensor<double>>{}), oasis::invalid_argument);
  Tensor<double> bad = b;
  bad[2] = std::numeric_limits<double>::infinity();
  EXPECT_THROW(max_inf_norm(bad), oasis::invalid_argument);
}

// ------------------------------------------------------------------------------------------------
// Sink metrics.

namespace {
/// A pure first-token sink: every query of every head puts all its mass on key 0.
Tensor<double> pure_sink(index_t B, index_t H, index_t T) {
  Tensor<double> p({B, H, T, T});
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < T; ++t) p(b, h, t, 0) = 1.0;
  return p;
}
}  // namespace

TEST(BaselineMetrics, PureFirstTokenSinkHasBosMassOneAndSinkRateOne) {
  const Tensor<double> p = pure_sink(2, 3, 5);
  EXPECT_EQ(bos_mass(p), 1.0);
  EXPECT_EQ(sink_rate(std::vector<Tensor<double>>{p, p}), 1.0);
  EXPECT_EQ(attention_entropy(p), 0.0);
  // Uniform causal attention: p_{t,j} = 1/(t+1) for j <= t. BOS mass = mean_t 1/(t+1) = H_T / T
  // (harmonic number); with T = 5: (1 + 1/2 + 1/3 + 1/4 + 1/5)/5 = 137/300 > 0.3: a sink by
  // Gu et al.'s definition; with T = 8: H_8/8 = 0.3397 > 0.3; T = 16: 0.2107 < 0.3.
  for (auto [T, expect_sink] : {std::pair<index_t, bool>{5, true}, {8, true}, {16, false}}) {
    Tensor<double> u({1, 1, T, T});
    double h = 0;
    for (index_t t = 0; t < T; ++t) {
      for (index_t j = 0; j <= t; ++j) u(0, 0, t, j) = 1.0 / static_cast<double>(t + 1);
      h += 1.0 / static_cast<double>(t + 1);
    }
    EXPECT_NEAR(bos_mass(u), h / static_cast<double>(T), 1e-15);
    EXPECT_EQ(sink_rate(std::vector<Tensor<double>>{u}), expect_sink ? 1.0 : 0.0) << T;
    // Entropy of uniform over t+1 keys is log(t+1): mean_t log(t+1) = log(T!)/T.
    EXPECT_NEAR(attention_entropy(u), std::lgamma(static_cast<double>(T) + 1) / static_cast<double>(T), 1e-14);
  }
}

TEST(BaselineMetrics, SinkRateCountsHeadsAcrossLayers) {
  // Layer 0: head 0 pure sink (importance 1), head 1 uniform causal over T = 16 (H_16/16 =
  // 0.2113); layer 1: both heads give key 0 mass 1 at t = 0 and 1/4 after:
  // (1 + 15/4)/16 = 0.296875 (exact in binary) < 0.3. -> 1 of 4 heads at epsilon = 0.3,
  // 3 of 4 at epsilon = 0.25.
  const index_t T = 16;
  Tensor<double> l0({1, 2, T, T}), l1({1, 2, T, T});
  for (index_t t = 0; t < T; ++t) {
    l0(0, 0, t, 0) = 1.0;
    for (index_t j = 0; j <= t; ++j) l0(0, 1, t, j) = 1.0 / static_cast<double>(t + 1);
    for (index_t h = 0; h < 2; ++h) {
      l1(0, h, t, 0) = t == 0 ? 1.0 : 0.25;
      if (t > 0) l1(0, h, t, 1) = 0.75;
    }
  }
  EXPECT_EQ(sink_rate(std::vector<Tensor<double>>{l0, l1}), 0.25);
  EXPECT_EQ(sink_rate(std::vector<Tensor<double>>{l0, l1}, 0.25), 0.75);
  const std::vector<double> imp = first_key_importance(l1);
  EXPECT_EQ(imp[0], 0.296875);
  EXPECT_THROW(sink_rate(std::vector<Tensor<double>>{l0}, 1.5), oasis::invalid_argument);
  EXPECT_THROW(sink_rate(std::vector<Tensor<double>>{}), oasis::invalid_argument);
}

TEST(BaselineMetrics, NullMassAndEntropyWithAndWithoutNullCategory) {
  // One row: p = [0.25, 0.25], p_null = 0.5.
  const Tensor<double> p({1, 1, 1, 2}, {0.25, 0.25}), pn({1, 1, 1}, {0.5});
  EXPECT_EQ(null_mass(pn), 0.5);
  const double l4 = std::log(4.0), l2 = std::log(2.0);
  EXPECT_NEAR(attention_entropy(p, pn, NullInEntropy::include), 2 * 0.25 * l4 + 0.5 * l2, 1e-15);
  EXPECT_NEAR(attention_entropy(p, pn, NullInEntropy::exclude), 2 * 0.25 * l4, 1e-15);
  EXPECT_NEAR(attention_entropy(p, pn, NullInEntropy::renormalize), l2, 1e-15);
  // Attention from the library: a Softmax1 row of two equal logits 0 -> 1/3 each and null 1/3.
  const Tensor<double> q({1, 1, 1, 1}, {0.0}), k({1, 1, 2, 1}, {0.0, 0.0}), v({1, 1, 2, 1}, {1.0, 2.0});
  AttentionOptions o;
  o.return_probs = true;
  const AttentionResult<double> a = token_attention(q, k, v, o);
  EXPECT_NEAR(attention_entropy(a.probs, a.p_null), std::log(3.0), 1e-15);
  EXPECT_NEAR(null_mass(a.p_null), 1.0 / 3, 1e-15);
  EXPECT_THROW(attention_entropy(p, Tensor<double>({1, 2, 1})), oasis::invalid_argument);
  EXPECT_THROW(bos_mass(Tensor<double>({1, 1, 1, 2}, {0.5, 1.5})), oasis::invalid_argument);
}

// ------------------------------------------------------------------------------------------------
// Fake quantisation.

TEST(BaselineQuant, RoundHalfToEvenTiesExactly) {
  EXPECT_EQ(round_half_even(0.5), 0.0);
  EXPECT_EQ(round_half_even(1.5), 2.0);
  EXPECT_EQ(round_half_even(2.5), 2.0);
  EXPECT_EQ(round_half_even(-0.5), 0.0);
  EXPECT_EQ(round_half_even(-1.5), -2.0);
  EXPECT_EQ(round_half_even(-2.5), -2.0);
  EXPECT_EQ(round_half_even(2.4999999999999996), 2.0);
  EXPECT_EQ(round_half_even(3.5f), 4.0f);
  EXPECT_EQ(round_half_even(1e300), 1e300);
  // Agrees with the IEEE default rounding mode (nearbyint) on many values.
  std::mt19937_64 rng(812);
  std::uniform_int_distribution<int> di(-4000, 4000);
  for (int i = 0; i < 2000; ++i) {
    const double x = di(rng) / 4.0;  // many exact ties
    EXPECT_EQ(round_half_even(x), std::nearbyint(x)) << x;
  }
  // In a quantiser: symmetric 8-bit with max |x| = 127/4 -> scale = 1/4 exactly; x = (k + 1/2)/4
  // are exact ties.
  const Tensor<double> x({1, 6}, {31.75, 0.125, 0.375, 0.625, -0.375, -0.125});
  const QuantParams<double> pr = minmax_quant_params(x, QuantScheme{8, true, QuantGranularity::per_tensor, 0});
  EXPECT_EQ(pr.scale[0], 0.25);
  const Tensor<double> c = quantize_codes(x, pr);
  EXPECT_EQ(c[0], 127.0);
  EXPECT_EQ(c[1], 0.0);
  EXPECT_EQ(c[2], 2.0);
  EXPECT_EQ(c[3], 2.0);
  EXPECT_EQ(c[4], -2.0);
  EXPECT_EQ(c[5], 0.0);
}

namespace {
struct QuantCase {
  QuantScheme scheme;
  Tensor<double> x;
};

QuantCase gen_quant_case(std::mt19937_64& rng) {
  QuantCase c;
  c.scheme.bits = *rc::gen::inRange(2, 9);
  c.scheme.symmetric = *rc::gen::arbitrary<bool>();
  c.scheme.granularity = *rc::gen::elementOf(std::vector<QuantGranularity>{
      QuantGranularity::per_tensor, QuantGranularity::per_channel, QuantGranularity::per_token});
  const index_t a = *rc::gen::inRange(1, 5), b = *rc::gen::inRange(1, 5), d = *rc::gen::inRange(1, 9);
  c.scheme.channel_axis = *rc::gen::inRange(0, 3);
  const double sd = std::ldexp(1.0, *rc::gen::inRange(-6, 7));
  const double mean = *rc::gen::inRange(-3, 4) * sd;  // skewed ranges exercise the zero point
  c.x = randn<double>({a, b, d}, rng, sd, mean);
  if (*rc::gen::inRange(0, 8) == 0) c.x[0] *= 40;  // an outlier
  return c;
}
}  // namespace

RC_GTEST_PROP(BaselineQuantProperty, ErrorAtMostHalfAStep, ()) {
  // In exact arithmetic |x - x^| <= scale/2 on the min-max range. In double, x/scale and
  // (q - zp) scale each add one rounding: |x - x^| <= scale/2 + u (2|x| + scale)
  // (docs/baselines.md). Codes lie on the grid and in range.
  auto rng = make_rng(813 + static_cast<std::uint64_t>(*rc::gen::inRange(0, 100000)));
  const QuantCase c = gen_quant_case(rng);
  const QuantParams<double> p = minmax_quant_params(c.x, c.scheme);
  const Tensor<double> q = quantize_codes(c.x, p), xh = dequantize(q, p);
  const auto G = detail::quant_groups(c.scheme, c.x.shape());
  const double u = std::numeric_limits<double>::epsilon() / 2;
  const double lo = c.scheme.symmetric ? -(std::ldexp(1.0, c.scheme.bits - 1) - 1) : 0;
  const double hi = c.scheme.symmetric ? std::ldexp(1.0, c.scheme.bits - 1) - 1 : std::ldexp(1.0, c.scheme.bits) - 1;
  for (index_t i = 0; i < c.x.size(); ++i) {
    const double s = p.scale[static_cast<std::size_t>(G.of(i))];
    RC_ASSERT(std::abs(c.x[i] - xh[i]) <= s / 2 + u * (2 * std::abs(c.x[i]) + s));
    RC_ASSERT(q[i] == std::nearbyint(q[i]));
    RC_ASSERT(q[i] >= lo && q[i] <= hi);
  }
  for (std::size_t g = 0; g < p.zero_point.size(); ++g) {
    RC_ASSERT(p.scale[g] > 0);
    if (c.scheme.symmetric) RC_ASSERT(p.zero_point[g] == 0.0);
  }
}

RC_GTEST_PROP(BaselineQuantProperty, Idempotent, ()) {
  // With fixed parameters, fake quantisation is a projection onto the grid: applying it twice
  // equals applying it once, bitwise (x^ = q s, and fl(fl(q s)/s) rounds back to q since |q| < 2^16).
  // Re-deriving min-max ranges from x^ reproduces the same integer codes (the range endpoints
  // move by at most a rounding).
  auto rng = make_rng(814 + static_cast<std::uint64_t>(*rc::gen::inRange(0, 100000)));
  const QuantCase c = gen_quant_case(rng);
  const QuantParams<double> p = minmax_quant_params(c.x, c.scheme);
  const Tensor<double> once = fake_quantize(c.x, p);
  RC_ASSERT(oasis::test::exactly_equal("twice", fake_quantize(once, p), once));
  const QuantParams<double> p2 = minmax_quant_params(once, c.scheme);
  RC_ASSERT(oasis::test::exactly_equal("codes", quantize_codes(once, p2), quantize_codes(c.x, p)));
}

TEST(BaselineQuant, GranularityGroupsAndPresets) {
  // [2, 3] tensor: per-token = per row, per-channel axis 1 = per column.
  const Tensor<double> x({2, 3}, {1, -2, 4, 0.5, 8, -1});
  const auto pt = minmax_quant_params(x, QuantScheme{8, true, QuantGranularity::per_token, 0});
  ASSERT_EQ(pt.scale.size(), 2u);
  EXPECT_EQ(pt.scale[0], 4.0 / 127);
  EXPECT_EQ(pt.scale[1], 8.0 / 127);
  const auto pc = minmax_quant_params(x, QuantScheme{8, true, QuantGranularity::per_channel, 1});
  ASSERT_EQ(pc.scale.size(), 3u);
  EXPECT_EQ(pc.scale[1], 8.0 / 127);
  const auto ptens = minmax_quant_params(x, QuantScheme{8, true, QuantGranularity::per_tensor, 0});
  ASSERT_EQ(ptens.scale.size(), 1u);
  // Asymmetric 4-bit: lo = -2, hi = 8 -> scale = 10/15, zp = rne(2 / (10/15)) = rne(3) = 3.
  const auto pa = minmax_quant_params(x, QuantScheme{4, false, QuantGranularity::per_tensor, 0});
  EXPECT_DOUBLE_EQ(pa.scale[0], 10.0 / 15);
  EXPECT_EQ(pa.zero_point[0], 3.0);
  // The range always holds 0: all-positive data still maps 0 exactly.
  const Tensor<double> pos({1, 3}, {2, 3, 4});
  const auto pp = minmax_quant_params(pos, QuantScheme{8, false, QuantGranularity::per_tensor, 0});
  EXPECT_EQ(pp.zero_point[0], 0.0);
  EXPECT_EQ(fake_quantize(Tensor<double>({1, 3}, {0, 0, 0}), QuantScheme{})[1], 0.0);  // all-zero group
  // Presets.
  for (const char* family : {"", "bondarenko-", "omniquant-rtn-", "rtn0-"})
    for (const char* wa : {"W8A8", "W6A6", "W4A4"}) {
      const std::string name = std::string(family) + wa + (*family ? "" : "-dynamic");
      const WAQuantConfig w = wa_preset(name);
      const bool layout = std::string(family) == "omniquant-rtn-" || std::string(family) == "rtn0-";
      EXPECT_EQ(w.name, name);
      EXPECT_EQ(w.weights.bits, w.activations.bits);
      EXPECT_EQ(w.weights.symmetric, !layout) << name;
      EXPECT_EQ(w.activations.range_holds_zero, std::string(family) != "omniquant-rtn-") << name;
      EXPECT_FALSE(w.activations.symmetric);
      EXPECT_EQ(w.activation_ranges == ActivationRanges::calibrated, std::string(family) == "bondarenko-") << name;
    }
  EXPECT_EQ(wa_preset("W4A4-dynamic").weights.bits, 4);
  EXPECT_THROW(wa_preset("W3A3"), oasis::invalid_argument);
  // Scheme options that do not combine are refused by name.
  QuantScheme bad{8, false, QuantGranularity::per_tensor, 0};
  bad.range = QuantRange::mse_grid;
  EXPECT_EQ(oasis::test::thrown_argument([&] { fake_quantize(x, bad); }), "range");
  bad = QuantScheme{8, false, QuantGranularity::per_tensor, 0};
  bad.unsigned_if_nonnegative = true;
  EXPECT_EQ(oasis::test::thrown_argument([&] { fake_quantize(x, bad); }), "scheme");
  RunningMinMax rm;
  EXPECT_EQ(oasis::test::thrown_argument([&] { rm.update(x, QuantScheme{8, false, QuantGranularity::per_token, 0}); }),
            "granularity");
  EXPECT_EQ(oasis::test::thrown_argument([&] { rm.params<double>(QuantScheme{}, x.shape()); }), "calibration");
  EXPECT_THROW(minmax_quant_params(x, QuantScheme{1, true, QuantGranularity::per_tensor, 0}), oasis::invalid_argument);
  EXPECT_THROW(minmax_quant_params(x, QuantScheme{8, true, QuantGranularity::per_channel, 2}), oasis::invalid_argument);
  Tensor<double> nan = x;
  nan[0] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(fake_quantize(nan, QuantScheme{}), oasis::invalid_argument);
  EXPECT_THROW(fake_quantize(Tensor<double>({2, 2}), pt), oasis::invalid_argument);  // shape mismatch
}

TEST(BaselineQuant, OutliersInflatePerTensorError) {
  // The mechanism the paper's tables measure: one outlier stretches a per-tensor range, so the
  // error of every other value grows with it; per-token ranges confine the damage to one row.
  auto rng = make_rng(815);
  Tensor<double> x = randn<double>({16, 64}, rng);
  auto err = [](const Tensor<double>& a, const Tensor<double>& b) {
    double e = 0;
    for (index_t i = 0; i < a.size(); ++i) e += (a[i] - b[i]) * (a[i] - b[i]);
    return std::sqrt(e / static_cast<double>(a.size()));
  };
  const QuantScheme tensor8{8, false, QuantGranularity::per_tensor, 0};
  const double clean = err(x, fake_quantize(x, tensor8));
  x(3, 7) = 200;
  const double dirty = err(x, fake_quantize(x, tensor8));
  const double per_token = err(x, fake_quantize(x, QuantScheme{8, false, QuantGranularity::per_token, 0}));
  EXPECT_GT(dirty, 10 * clean);
  EXPECT_LT(per_token, dirty / 2);  // only 1 of 16 rows has the stretched range: ~dirty / 4
}

TEST(BaselineQuant, FakeQuantLinearErrorWithinQuantisationSteps) {
  // y = Q_A(x) Q_W(W)^T. With e_x = s_x/2 and e_W = s_W/2 per element (plus the roundings of
  // ErrorAtMostHalfAStep), |y - x W^T| <= sum_c (|x_c| e_W + |W_c| e_x + e_x e_W) + the float
  // error of two length-`in` dot products, 2 gamma_in sum_c |x_c W_c| (+ quantised magnitudes).
  auto rng = make_rng(816);
  const Tensor<double> x = randn<double>({5, 24}, rng), W = randn<double>({7, 24}, rng, 0.1);
  for (const char* preset : {"W8A8-dynamic", "W6A6-dynamic", "W4A4-dynamic"}) {
    const WAQuantConfig cfg = wa_preset(preset);
    const Tensor<double> y = fake_quant_linear(x, W, cfg);
    const double sx = minmax_quant_params(x, cfg.activations).scale[0];
    const double sw = minmax_quant_params(W, cfg.weights).scale[0];
    const double u = std::numeric_limits<double>::epsilon() / 2;
    double worst = 0;
    for (index_t n = 0; n < 5; ++n)
      for (index_t o = 0; o < 7; ++o) {
        double exact = 0, bound = 0, mag = 0;
        for (index_t c = 0; c < 24; ++c) {
          exact += x(n, c) * W(o, c);
          const double ex = sx / 2 + u * (2 * std::abs(x(n, c)) + sx), ew = sw / 2 + u * (2 * std::abs(W(o, c)) + sw);
          bound += std::abs(x(n, c)) * ew + std::abs(W(o, c)) * ex + ex * ew;
          mag += (std::abs(x(n, c)) + ex) * (std::abs(W(o, c)) + ew);
        }
        bound += 2 * 25 * u * mag;
        EXPECT_LE(std::abs(y(n, o) - exact), bound) << preset;
        worst = std::max(worst, std::abs(y(n, o) - exact));
      }
    EXPECT_GT(worst, 0.0) << preset;  // quantisation is not the identity at these widths
  }
  // Equals the plain product of the fake-quantised operands, bitwise.
  const WAQuantConfig c8 = wa_preset("W8A8-dynamic");
  const Tensor<double> xq = fake_quantize(x, c8.activations), wq = fake_quantize(W, c8.weights);
  const Tensor<double> y = fake_quant_linear(x, W, c8);
  for (index_t n = 0; n < 5; ++n)
    for (index_t o = 0; o < 7; ++o) {
      double acc = 0;
      for (index_t c = 0; c < 24; ++c) acc += xq(n, c) * wq(o, c);
      EXPECT_EQ(y(n, o), acc);
    }
  EXPECT_THROW(fake_quant_linear(x, Tensor<double>({7, 23}), c8), oasis::invalid_argument);
}
