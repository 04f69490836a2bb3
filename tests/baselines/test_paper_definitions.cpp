// Each baseline and metric against its paper's definition, written here from the paper (and the
// authors' public code's convention, docs/baselines.md) with plain loops that share no code with
// the library: sink rate (Gu et al. 2025), kurtosis (Bondarenko et al. 2023; Pearson), clipped
// softmax with gamma = -alpha/T, the head-slice gate (Bondarenko et al.) and the elementwise gate
// (Qiu et al. 2025), the quantisers of the presets (Bondarenko et al.'s grids, MSE grid search
// and running min-max; OmniQuant's per-channel / per-token layout).
//
// Where the test's loop performs the same floating-point operations in the same order as the
// definition prescribes, equality is exact (EXPECT_EQ); elsewhere the tolerance is stated.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "oasis/ops/attention.hpp"
#include "oasis/research/baselines.hpp"
#include "oasis/research/metrics.hpp"
#include "oasis/ops/normalizer.hpp"
#include "oasis/ops/quantize.hpp"
#include "oasis/research/quant_presets.hpp"
#include "oasis_test.hpp"

using namespace oasis;
using oasis::test::make_rng;
using oasis::test::randn;

namespace {

// ------------------------------------------------------------------------------------------------
// Sink rate, Gu et al. (2025): importance of key k in one sample, layer, head is
// (1/(T-k)) sum_{t>=k} a_{t,k} (0-based k; k = 0 gives 1/T over all queries); a sink is
// importance > epsilon, and the rate is the mean of that indicator over samples, layers, heads.

double gu_sink_rate(const std::vector<Tensor<double>>& layers, double eps) {
  double hits = 0, n = 0;
  for (const Tensor<double>& a : layers)
    for (index_t b = 0; b < a.dim(0); ++b)
      for (index_t h = 0; h < a.dim(1); ++h) {
        double imp = 0;
        for (index_t t = 0; t < a.dim(2); ++t) imp += a(b, h, t, 0) / static_cast<double>(a.dim(2));
        hits += imp > eps ? 1.0 : 0.0;
        n += 1.0;
      }
  return hits / n;
}

/// probs [B, H, 1, 2] whose first-key importance of sample b, head h is imp[h][b].
Tensor<double> first_key_probs(const std::vector<std::vector<double>>& imp) {
  const auto H = static_cast<index_t>(imp.size()), B = static_cast<index_t>(imp[0].size());
  Tensor<double> p({B, H, 1, 2});
  for (index_t h = 0; h < H; ++h)
    for (index_t b = 0; b < B; ++b) {
      p(b, h, 0, 0) = imp[static_cast<std::size_t>(h)][static_cast<std::size_t>(b)];
      p(b, h, 0, 1) = 1.0 - p(b, h, 0, 0);
    }
  return p;
}

}  // namespace

TEST(PaperDefinitions, SinkRateCraftedCasesPerSampleVersusBatchMean) {
  // Two heads with per-sample importances [0.5, 0.28] and [0.6, 0.25]: batch means 0.39 and
  // 0.425 are both > 0.3 (batch mean: 1.0); per sample 2 of 4 exceed 0.3 (Gu et al.: 0.5).
  const std::vector<Tensor<double>> two{first_key_probs({{0.5, 0.28}, {0.6, 0.25}})};
  EXPECT_EQ(sink_rate(two), 0.5);
  EXPECT_EQ(sink_rate_batch_mean(two), 1.0);
  EXPECT_EQ(gu_sink_rate(two, 0.3), 0.5);
  // One head, three samples [0.31, 0.31, 0.27]: batch mean 0.2967 < 0.3 (0.0); per sample 2 of 3.
  const std::vector<Tensor<double>> three{first_key_probs({{0.31, 0.31, 0.27}})};
  EXPECT_EQ(sink_rate_batch_mean(three), 0.0);
  EXPECT_NEAR(sink_rate(three), 2.0 / 3.0, 1e-15);
  EXPECT_EQ(sink_rate(three), gu_sink_rate(three, 0.3));
  // B = 1: the two estimators coincide.
  const std::vector<Tensor<double>> one{first_key_probs({{0.31}, {0.29}})};
  EXPECT_EQ(sink_rate(one), sink_rate_batch_mean(one));
}

TEST(PaperDefinitions, SinkRateMatchesGuEtAlOnCausalAttention) {
  // Causal softmax attention rows of random logits (two layers, B = 3, H = 4, T = 9), at several
  // thresholds: the library's rate equals the loop above exactly (same sums in the same order).
  const std::uint64_t salt = 1801;
  SCOPED_TRACE(salt);
  auto rng = make_rng(salt);
  std::vector<Tensor<double>> layers;
  for (int l = 0; l < 2; ++l) {
    const index_t B = 3, H = 4, T = 9;
    Tensor<double> p({B, H, T, T});
    const Tensor<double> z = randn<double>({B, H, T, T}, rng, 2.0);
    for (index_t b = 0; b < B; ++b)
      for (index_t h = 0; h < H; ++h)
        for (index_t t = 0; t < T; ++t) {
          double m = -HUGE_VAL, s = 0;
          for (index_t j = 0; j <= t; ++j) m = std::max(m, z(b, h, t, j) + (j == 0 ? 1.5 : 0.0));
          for (index_t j = 0; j <= t; ++j) s += std::exp(z(b, h, t, j) + (j == 0 ? 1.5 : 0.0) - m);
          for (index_t j = 0; j <= t; ++j) p(b, h, t, j) = std::exp(z(b, h, t, j) + (j == 0 ? 1.5 : 0.0) - m) / s;
        }
    layers.push_back(p);
  }
  for (double eps : {0.1, 0.2, 0.3, 0.4, 0.6}) EXPECT_EQ(sink_rate(layers, eps), gu_sink_rate(layers, eps)) << eps;
}

// ------------------------------------------------------------------------------------------------
// Kurtosis. Bondarenko et al.'s code: per row, mean((x - mean)^4) / (std^4 + 1e-6) with the
// Bessel-corrected std (torch.std). Pearson: m4 / m2^2 with population moments; excess: minus 3.

namespace {
double bondarenko_kurtosis_row(const std::vector<double>& x) {
  const double n = static_cast<double>(x.size());
  double mu = 0;
  for (double v : x) mu += v;
  mu /= n;
  double s2 = 0, m4 = 0;
  for (double v : x) {
    s2 += (v - mu) * (v - mu);
    m4 += (v - mu) * (v - mu) * (v - mu) * (v - mu);
  }
  const double sd = std::sqrt(s2 / (n - 1));
  return (m4 / n) / (std::pow(sd, 4) + 1e-6);
}
double pearson_kurtosis_row(const std::vector<double>& x) {
  const double n = static_cast<double>(x.size());
  double mu = 0;
  for (double v : x) mu += v;
  mu /= n;
  double m2 = 0, m4 = 0;
  for (double v : x) {
    m2 += (v - mu) * (v - mu) / n;
    m4 += std::pow(v - mu, 4) / n;
  }
  return m4 / (m2 * m2);
}
std::vector<double> row(const Tensor<double>& x, index_t s) {
  const index_t n = x.size() / x.dim(0);
  return std::vector<double>(x.data() + s * n, x.data() + (s + 1) * n);
}
}  // namespace

TEST(PaperDefinitions, KurtosisRegularisedAndPearsonMatchTheirDefinitions) {
  const std::uint64_t salt = 1802;
  SCOPED_TRACE(salt);
  auto rng = make_rng(salt);
  // Heavy-tailed rows at three scales. The test's loops sum in another order (pow, per-term
  // division), so the comparison is relative: both are sums of n = 384 positive terms in double,
  // each with relative error <= ~8u; 1e-12 relative is ~4500u and far below any definitional
  // difference (the regulariser alone changes the value by > 1e-6 relative at scale 1).
  for (double scale : {1e-3, 1.0, 30.0}) {
    Tensor<double> x = randn<double>({3, 12, 32}, rng, scale);
    for (index_t i = 0; i < x.size(); i += 97) x[i] *= 25.0;  // outliers
    double reg = 0, pear = 0;
    for (index_t s = 0; s < 3; ++s) {
      reg += bondarenko_kurtosis_row(row(x, s)) / 3.0;
      pear += pearson_kurtosis_row(row(x, s)) / 3.0;
    }
    EXPECT_NEAR(kurtosis_regularised(x), reg, 1e-12 * reg) << scale;
    EXPECT_NEAR(kurtosis_pearson(x), pear, 1e-12 * pear) << scale;
    EXPECT_EQ(kurtosis_excess(x), kurtosis_pearson(x) - 3.0) << scale;
  }
}

TEST(PaperDefinitions, RegularisedKurtosisCollapsesAtSmallScalePearsonDoesNot) {
  // A Gaussian of std 1e-3: std^4 = 1e-12 << 1e-6, so the regularised value is ~3e-12/1e-6 = 3e-6;
  // Pearson is scale-invariant: about 3 (sd sqrt(24/n)/sqrt(S) = 0.027 for n = 8192, S = 4;
  // tolerance 5 sd). The scale warning of docs/baselines.md.
  const std::uint64_t salt = 1803;
  SCOPED_TRACE(salt);
  auto rng = make_rng(salt);
  const Tensor<double> x = randn<double>({4, 8192}, rng, 1e-3);
  EXPECT_LT(kurtosis_regularised(x), 1e-5);
  EXPECT_NEAR(kurtosis_pearson(x), 3.0, 0.14);
  EXPECT_NEAR(kurtosis_excess(x), 0.0, 0.14);
  EXPECT_NEAR(kurtosis(x, KurtosisEstimator::pearson), kurtosis_pearson(x), 0.0);
  // A constant row: regularised 0 / 1e-6 = 0; Pearson undefined, refused by name.
  EXPECT_EQ(kurtosis_regularised(Tensor<double>({1, 4}, 2.0)), 0.0);
  EXPECT_THROW(kurtosis_pearson(Tensor<double>({1, 4}, 2.0)), oasis::invalid_argument);
}

// ------------------------------------------------------------------------------------------------
// Clipped softmax, OPT setting (Bondarenko et al.): clip((zeta - gamma) softmax(z) + gamma, 0, 1)
// with zeta = 1, gamma = -alpha / T.

TEST(PaperDefinitions, ClippedSoftmaxWithGammaMinusAlphaOverT) {
  const std::uint64_t salt = 1804;
  SCOPED_TRACE(salt);
  auto rng = make_rng(salt);
  for (index_t T : {8, 64, 512}) {
    const NormParams np = clipped_softmax_params(12.0, T);
    EXPECT_EQ(np.gamma, -12.0 / static_cast<double>(T));
    EXPECT_EQ(np.zeta, 1.0);
    const Tensor<double> zt = randn<double>({T}, rng, 3.0);
    Vec<double> z(T);
    for (index_t j = 0; j < T; ++j) z[j] = zt[j];
    double m = -HUGE_VAL, s = 0;
    for (index_t j = 0; j < T; ++j) m = std::max(m, z[j]);
    for (index_t j = 0; j < T; ++j) s += std::exp(z[j] - m);
    const double gamma = -12.0 / static_cast<double>(T);
    const RowProbs<double> p = normalize(RowNorm::clipped_softmax, z, 0.0, np);
    index_t zeros = 0;
    for (index_t j = 0; j < T; ++j) {
      const double q = std::exp(z[j] - m) / s;
      const double want = std::min(1.0, std::max(0.0, (1.0 - gamma) * q + gamma));
      // q itself carries a few roundings (exp, the sum of T terms, the quotient): |dq| <= (T + 4) u q.
      EXPECT_NEAR(p.p[j], want, (1.0 - gamma) * (static_cast<double>(T) + 4) * 1.2e-16 * q + 4.5e-16) << T << " " << j;
      zeros += p.p[j] == 0.0;
    }
    EXPECT_GT(zeros, 0) << T;  // the point of clipping: exact zeros with finite logits
  }
  EXPECT_THROW(clipped_softmax_params(12.0, 0), oasis::invalid_argument);
  EXPECT_THROW(clipped_softmax_params(-1.0, 16), oasis::invalid_argument);
}

// ------------------------------------------------------------------------------------------------
// Gates. Bondarenko et al.: per head h, Linear(d/H, 1) on the head's slice of the block input,
// sigmoid, times the head's context. Qiu et al. (2025), elementwise: Y' = Y * sigmoid(X W^T + b)
// with one output per context channel (head h, channel c at row h d_v + c), after the attention,
// before the output projection.

TEST(PaperDefinitions, HeadSliceAndElementwiseGatesMatchTheirPapers) {
  const std::uint64_t salt = 1805;
  SCOPED_TRACE(salt);
  auto rng = make_rng(salt);
  const index_t B = 2, H = 3, T = 5, dh = 4, d = 12;
  const Tensor<double> q = randn<double>({B, H, T, dh}, rng), k = randn<double>({B, H, T, dh}, rng),
                       v = randn<double>({B, H, T, dh}, rng), x = randn<double>({B, T, d}, rng);
  AttentionOptions o;
  o.causal = true;
  const Tensor<double> A = token_attention(q, k, v, o).out;

  // Head slice: w [H, d/H], bias [H].
  const Tensor<double> ws = randn<double>({H, d / H}, rng), bs = randn<double>({H}, rng);
  const GatedAttentionResult<double> gs = gated_attention(q, k, v, x, ws, bs, o, AttentionGate::head_slice);
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < T; ++t) {
        double a = bs[h];
        for (index_t c = 0; c < d / H; ++c) a += x(b, t, h * (d / H) + c) * ws(h, c);
        const double g = 1.0 / (1.0 + std::exp(-a));
        EXPECT_NEAR(gs.gates(b, h, t), g, 4.5e-16) << b << " " << h << " " << t;  // two sigmoid forms, <= 2u each
        for (index_t c = 0; c < dh; ++c)
          EXPECT_EQ(gs.attn.out(b, h, t, c), A(b, h, t, c) * gs.gates(b, h, t)) << b << " " << h << " " << t;
      }

  // Elementwise: W [H d_v, d], bias [H d_v].
  const Tensor<double> we = randn<double>({H * dh, d}, rng), be = randn<double>({H * dh}, rng);
  const GatedAttentionResult<double> ge = gated_attention(q, k, v, x, we, be, o, AttentionGate::elementwise);
  ASSERT_EQ(ge.gates.shape(), (Shape{B, H, T, dh}));
  for (index_t b = 0; b < B; ++b)
    for (index_t t = 0; t < T; ++t)
      for (index_t r = 0; r < H * dh; ++r) {
        double a = be[r];
        for (index_t c = 0; c < d; ++c) a += x(b, t, c) * we(r, c);
        const double g = 1.0 / (1.0 + std::exp(-a));
        const index_t h = r / dh, c = r % dh;
        EXPECT_NEAR(ge.gates(b, h, t, c), g, 4.5e-16) << b << " " << t << " " << r;
        EXPECT_EQ(ge.attn.out(b, h, t, c), A(b, h, t, c) * ge.gates(b, h, t, c));
      }
  // Shapes that do not fit the form are refused by name.
  EXPECT_EQ(oasis::test::thrown_argument([&] { gated_attention(q, k, v, x, we, be, o, AttentionGate::head_slice); }),
            "w_gate");
  EXPECT_EQ(oasis::test::thrown_argument([&] { head_slice_gates(x, Tensor<double>({5, 2})); }), "w_gate");
  EXPECT_EQ(oasis::test::thrown_argument([&] { elementwise_gates(x, we, H, Tensor<double>({3})); }), "b_gate");
}

// ------------------------------------------------------------------------------------------------
// Quantisers of the presets.

namespace {
/// Bondarenko et al.'s symmetric quantiser of range [x_min, x_max] (their code's
/// SymmetricUniformQuantizer): signed iff x_min < 0; codes [-2^(b-1), 2^(b-1)-1] or [0, 2^b - 1];
/// scale = max(|x_min|, x_max) / top.
double bondarenko_symmetric(double x, double xmin, double xmax, int bits) {
  xmin = std::min(xmin, 0.0);
  const bool sgn = xmin < 0;
  const double top = sgn ? std::pow(2.0, bits - 1) - 1 : std::pow(2.0, bits) - 1;
  const double lo = sgn ? -std::pow(2.0, bits - 1) : 0.0;
  const double scale = std::max(-xmin, xmax) / top;
  const double q = std::clamp(std::nearbyint(x / scale), lo, top);
  return q * scale;
}
/// Their asymmetric quantiser: scale = (x_max - x_min) / (2^b - 1) with x_min <= 0 <= x_max,
/// zp = clamp(round(-x_min / scale)), codes [0, 2^b - 1].
double asymmetric(double x, double xmin, double xmax, int bits) {
  xmin = std::min(xmin, 0.0);
  xmax = std::max(xmax, 0.0);
  const double top = std::pow(2.0, bits) - 1;
  const double scale = (xmax - xmin) / top;
  const double zp = std::clamp(std::nearbyint(-xmin / scale), 0.0, top);
  return (std::clamp(std::nearbyint(x / scale) + zp, 0.0, top) - zp) * scale;
}
}  // namespace

TEST(PaperDefinitions, MseGridWeightRangesMatchBondarenkoEtAlsSearch) {
  const std::uint64_t salt = 1806;
  SCOPED_TRACE(salt);
  auto rng = make_rng(salt);
  const WAQuantConfig cfg = wa_preset("bondarenko-W8A8");
  ASSERT_EQ(cfg.weights.range, QuantRange::mse_grid);
  for (bool nonneg : {false, true}) {
    Tensor<double> W = randn<double>({16, 24}, rng, 0.4);
    if (nonneg)
      for (index_t i = 0; i < W.size(); ++i) W[i] = std::abs(W[i]);
    W[7] = nonneg ? 3.0 : -3.0;  // an outlier
    // The search: N = 100 candidates c * step, step = (max |w| + 0.5) / N, range [-a, a] (or
    // [0, a] for a non-negative tensor), the least sum of squared errors, first on ties.
    double mx = 0;
    for (index_t i = 0; i < W.size(); ++i) mx = std::max(mx, std::abs(W[i]));
    const double step = (mx + 0.5) / 100;
    double best = HUGE_VAL, best_a = 0;
    for (int c = 1; c <= 100; ++c) {
      const double a = step * c;
      double loss = 0;
      for (index_t i = 0; i < W.size(); ++i) {
        const double e = W[i] - bondarenko_symmetric(W[i], nonneg ? 0.0 : -a, a, 8);
        loss += e * e;
      }
      if (loss < best) {
        best = loss;
        best_a = a;
      }
    }
    const Tensor<double> got = fake_quantize(W, cfg.weights);
    for (index_t i = 0; i < W.size(); ++i)
      EXPECT_EQ(got[i], bondarenko_symmetric(W[i], nonneg ? 0.0 : -best_a, best_a, 8)) << nonneg << " " << i;
  }
}

TEST(PaperDefinitions, UnsignedGridHalvesTheErrorOfANonNegativeTensor) {
  // An all-positive weight channel on 8 bits: the restricted signed grid spends half its codes
  // on negative values (step max/127); Bondarenko et al.'s rule uses [0, 255] (step max/255).
  const std::uint64_t salt = 1807;
  SCOPED_TRACE(salt);
  auto rng = make_rng(salt);
  Tensor<double> w = oasis::test::uniform<double>({1, 4096}, rng, 0.0, 1.4);
  QuantScheme restricted{8, true, QuantGranularity::per_tensor, 0};
  QuantScheme authors = restricted;
  authors.full_signed_grid = true;
  authors.unsigned_if_nonnegative = true;
  double mx = 0;
  for (index_t i = 0; i < w.size(); ++i) mx = std::max(mx, w[i]);
  const Tensor<double> a = fake_quantize(w, authors), r = fake_quantize(w, restricted);
  double ea = 0, er = 0;
  for (index_t i = 0; i < w.size(); ++i) {
    EXPECT_EQ(a[i], bondarenko_symmetric(w[i], 0.0, mx, 8)) << i;
    ea = std::max(ea, std::abs(a[i] - w[i]));
    er = std::max(er, std::abs(r[i] - w[i]));
  }
  // Max errors of uniform data approach half a step: mx/510 and mx/254 (+ roundings).
  EXPECT_LE(ea, mx / 510 * (1 + 1e-12));
  EXPECT_GT(er, 1.8 * ea);
  // A tensor with one negative value uses the full signed grid, including the code -128.
  Tensor<double> s({1, 2}, {-1.0, 1.0});
  EXPECT_EQ(minmax_quant_params(s, authors).code_min, -128.0);
  EXPECT_EQ(minmax_quant_params(s, restricted).code_min, -127.0);
}

TEST(PaperDefinitions, CalibratedActivationRangesAreBondarenkoEtAlsRunningMinMax) {
  // Three calibration batches; the estimator: first batch's min/max, then
  // r <- (1 - 0.9) r_batch + 0.9 r; evaluation quantises with the fixed estimate (asymmetric, per tensor).
  const std::uint64_t salt = 1808;
  SCOPED_TRACE(salt);
  auto rng = make_rng(salt);
  WAQuantConfig cfg = wa_preset("bondarenko-W8A8");
  ASSERT_EQ(cfg.activation_ranges, ActivationRanges::calibrated);
  ActivationCalibration cal;
  cfg.calibration = &cal;
  const Tensor<double> W = randn<double>({5, 6}, rng, 0.3);
  double lo = 0, hi = 0;
  for (int c = 0; c < 3; ++c) {
    const Tensor<double> xb = randn<double>({7, 6}, rng, 1.0 + c, 0.2 * c);
    double bl = HUGE_VAL, bh = -HUGE_VAL;
    for (index_t i = 0; i < xb.size(); ++i) bl = std::min(bl, xb[i]), bh = std::max(bh, xb[i]);
    lo = c == 0 ? bl : (1 - 0.9) * bl + 0.9 * lo;
    hi = c == 0 ? bh : (1 - 0.9) * bh + 0.9 * hi;
    cal.begin_pass();
    fake_quant_linear(xb, W, cfg);
  }
  cal.frozen = true;
  cal.begin_pass();
  const Tensor<double> x = randn<double>({4, 6}, rng, 3.0);  // wider than the calibration: clipped
  const Tensor<double> y = fake_quant_linear(x, W, cfg);
  const Tensor<double> wq = fake_quantize(W, cfg.weights);
  for (index_t n = 0; n < 4; ++n)
    for (index_t o = 0; o < 5; ++o) {
      double acc = 0;
      for (index_t c = 0; c < 6; ++c) acc += asymmetric(x(n, c), lo, hi, 8) * wq(o, c);
      EXPECT_EQ(y(n, o), acc) << n << " " << o;
    }
  cal.end_pass();
  // A second, uncalibrated quantiser in a frozen pass is refused by name.
  EXPECT_EQ(oasis::test::thrown_argument([&] { fake_quant_linear(x, W, cfg); }), "calibration");
  WAQuantConfig nocal = wa_preset("bondarenko-W8A8");
  EXPECT_EQ(oasis::test::thrown_argument([&] { fake_quant_linear(x, W, nocal); }), "calibration");
}

TEST(PaperDefinitions, OmniQuantLayoutPerChannelWeightsPerTokenActivations) {
  // OmniQuant's quantiser layout with ranges widened to hold 0 (the rtn0 presets; OmniQuant's own
  // ranges: test_omniquant_rtn.cpp): each output channel of W [out, in] and each token (row) of
  // x [N, in] has its own asymmetric min-max range.
  const std::uint64_t salt = 1809;
  SCOPED_TRACE(salt);
  auto rng = make_rng(salt);
  for (const char* name : {"rtn0-W4A4", "rtn0-W6A6", "rtn0-W8A8"}) {
    const WAQuantConfig cfg = wa_preset(name);
    const int bits = cfg.weights.bits;
    const Tensor<double> W = randn<double>({5, 9}, rng, 0.5), x = randn<double>({3, 9}, rng, 2.0);
    const Tensor<double> wq = fake_quantize(W, cfg.weights), xq = fake_quantize(x, cfg.activations);
    for (index_t r = 0; r < 5; ++r) {
      double lo = 0, hi = 0;
      for (index_t c = 0; c < 9; ++c) lo = std::min(lo, W(r, c)), hi = std::max(hi, W(r, c));
      for (index_t c = 0; c < 9; ++c) EXPECT_EQ(wq(r, c), asymmetric(W(r, c), lo, hi, bits)) << name << " " << r;
    }
    for (index_t n = 0; n < 3; ++n) {
      double lo = 0, hi = 0;
      for (index_t c = 0; c < 9; ++c) lo = std::min(lo, x(n, c)), hi = std::max(hi, x(n, c));
      for (index_t c = 0; c < 9; ++c) EXPECT_EQ(xq(n, c), asymmetric(x(n, c), lo, hi, bits)) << name << " " << n;
    }
  }
  EXPECT_EQ(oasis::test::thrown_argument([] { wa_preset("W8A8"); }), "preset");
}

TEST(PaperDefinitions, SmallRoundHalfEvenEqualsTheGeneralOne) {
  // The MSE search's rounding of clamped codes: every half-integer and its neighbours in
  // [-2^16, 2^16], in double and float, against round_half_even.
  for (double y = -65536.0; y <= 65536.0; y += 0.5)
    for (double d : {-1e-9, 0.0, 1e-9}) {
      ASSERT_EQ(detail::round_half_even_small(y + d), round_half_even(y + d)) << y + d;
      const float f = static_cast<float>(y + d * 1e6);
      ASSERT_EQ(detail::round_half_even_small(f), round_half_even(f)) << f;
    }
}
