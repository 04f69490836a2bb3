// CUDA backend, the fused AttnRes routing (oasis/ops/attn_res.hpp) and its backward
// (oasis/grad/attn_res_backward.hpp; src/cuda/attn_res.cpp): parity with the mp50 oracle under
// the kernel parity rule (tests/parity/parity_rule.hpp: |x - x_hp| <= 2 |x_ref - x_hp| + floor,
// x_ref the float reference), the floors the chained bounds of the reference
// (docs/tolerances.md, "Fused AttnRes routing"; as src/verify/op_attn_res_backward.cpp chains
// them): the logits' error e_g = |scale| (1 + 1/(d + 3)) B_pq, the route's bounds with e_g in
// g_old, the keys' backward with dg's error |scale| B(dg_old) + u |dg|. Repeated calls are
// bitwise equal; bad inputs throw naming the argument the reference names. Skips with the
// reason when no device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "oasis/backends/backend.hpp"
#include "oasis/backends/cuda.hpp"
#include "oasis/core/instances.hpp"
#include "oasis/core/multiprecision.hpp"
#include "oasis/grad/backward_bounds.hpp"
#include "oasis/grad/depth_backward_bounds.hpp"
#include "oasis_test.hpp"
#include "parity_rule.hpp"

namespace oasis::test {
namespace {

using R = mp50;

#define OASIS_SKIP_WITHOUT_CUDA()                                                                     \
  if (std::string why; !cuda::available(&why)) GTEST_SKIP() << "backend cuda is not available: " << why

using K = SourceKind;

struct FusedCase {
  std::string name;
  index_t N, d;
  std::vector<SourceKind> kinds;
  AttnResOptions opt;
  bool gain = false;
  double w_sd = 0.3;    ///< spread of w: |g| ~ w_sd sqrt(d)
  bool dalpha = false;  ///< cotangents of alpha and alpha_null too
};

void PrintTo(const FusedCase& c, std::ostream* os) { *os << c.name; }

AttnResOptions with(RowNorm norm, bool coupling, double scale = 1.0, double eps = 1e-6) {
  AttnResOptions o;
  o.depth.normalizer = norm;
  o.depth.coupling = coupling;
  o.scale = scale;
  o.key_norm.eps = eps;
  return o;
}

std::vector<FusedCase> fused_cases() {
  const std::vector<K> six{K::initial, K::attention, K::headless, K::attention, K::headless, K::attention};
  const std::vector<K> four{K::initial, K::attention, K::attention, K::attention};
  AttnResOptions strong = with(RowNorm::softmax1, true, 0.75);
  strong.depth.beta = 3.0;
  AttnResOptions authors = with(RowNorm::softmax1, true);
  authors.depth.coupling_options = CouplingOptions::authors_code();
  authors.depth.beta = 20.0;  // capped at beta_max
  AttnResOptions theta = with(RowNorm::softmax, true, 1.0, 1e-5);
  theta.depth.theta = 0.5;  // dtheta through softplus
  return {
      {"fla_default", 19, 64, four, AttnResOptions{}},
      {"softmax1_gain_d72", 23, 72, four, with(RowNorm::softmax1, false, 0.5, 1e-5), true, 0.3, true},
      {"coupling_strong_gain", 17, 50, six, strong, true, 0.3, true},
      {"coupling_authors_clamped", 13, 40, six, authors, false, 8.0},
      {"coupling_theta_softmax", 11, 96, six, theta, true},
      {"single_source", 7, 33, {K::initial}, AttnResOptions{}, true},
      {"single_source_softmax1", 9, 31, {K::initial}, with(RowNorm::softmax1, false, 2.0), false, 0.3, true},
      {"single_token", 1, 100, six, with(RowNorm::softmax1, false, -1.5), true, 0.3, true},
      {"larger", 96, 160, {K::initial, K::attention, K::attention, K::attention, K::attention, K::attention,
                           K::attention, K::attention},
       with(RowNorm::softmax, false, 0.125), true, 1.0, true},
  };
}

struct FusedInputs {
  Tensor<float> sources, w, gain, psi;
  DepthCotangents<float> cot;
};

FusedInputs make_fused(const FusedCase& c) {
  std::mt19937_64 rng = make_rng(salt_of(c.name) + 11);
  const index_t n = static_cast<index_t>(c.kinds.size());
  FusedInputs in;
  in.sources = randn<float>({n, c.N, c.d}, rng, 2.0);
  in.w = randn<float>({c.d}, rng, c.w_sd);
  if (c.gain) in.gain = uniform<float>({c.d}, rng, 0.5, 1.5);
  in.psi = uniform<float>({n, c.N}, rng, 0.0, 1.0);
  in.cot.h = randn<float>({c.N, c.d}, rng);
  if (c.dalpha) {
    in.cot.alpha = randn<float>({n, c.N}, rng);
    if (c.opt.depth.normalizer == RowNorm::softmax1) in.cot.alpha_null = randn<float>({c.N}, rng);
  }
  return in;
}

template <class T>
Tensor<T> opt_cast(const Tensor<float>& x) {
  return x.empty() ? Tensor<T>() : x.cast<T>();
}

/// The logits' error bound in float: |scale| (1 + 1/(d + 3)) times the pseudo-query bound (the
/// scale's own rounding is within 1/(d + 3) of the dot product's, attn_res_support.hpp).
Tensor<double> logit_error(const FusedInputs& in, const AttnResOptions& opt) {
  Tensor<double> e = bounds::pseudo_query_logits_bounds(in.sources, in.w, in.gain, opt.key_norm);
  const double k = std::abs(opt.scale) * (1.0 + 1.0 / (static_cast<double>(in.w.size()) + 3.0));
  for (index_t i = 0; i < e.size(); ++i) e[i] *= k;
  return e;
}

/// The rule on one scalar (dbeta, dtheta).
::testing::AssertionResult scalar_rule(const std::string& name, float got, float ref, double hp, double floor) {
  return within_twice_reference(name, Tensor<float>(Shape{1}, got), Tensor<float>(Shape{1}, ref),
                                Tensor<double>(Shape{1}, hp), Tensor<double>(Shape{1}, floor));
}

/// A second, aggregate check beside the rule (whose floors are worst-case bounds, loose by design):
/// max |x - x_hp| <= 32 max |x_ref - x_hp| + 32 u max |x_hp|, so that a systematic error far
/// beyond the reference's own (a wrong term, a dropped rounding) fails even under the floors.
template <class T>
::testing::AssertionResult aggregate_close(const std::string& name, const Tensor<float>& got, const Tensor<float>& ref,
                                           const Tensor<T>& hp) {
  double eg = 0, er = 0, mx = 0;
  for (index_t i = 0; i < hp.size(); ++i) {
    const double h = static_cast<double>(hp[i]);
    eg = std::max(eg, abs_err(got[i], h));
    er = std::max(er, abs_err(ref[i], h));
    mx = std::max(mx, std::abs(h));
  }
  const double allowed = 32.0 * er + 32.0 * bounds::Precision::of<float>().u * mx;
  if (eg <= allowed) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << name << ": max |err| " << eg << " exceeds 32 x the reference's " << er
                                       << " + 32 u max|x| (" << allowed << ")";
}

class FusedParity : public ::testing::TestWithParam<FusedCase> {};

TEST_P(FusedParity, ForwardWithinTwiceReferenceErrorPlusFloor) {
  const FusedCase& c = GetParam();
  OASIS_SKIP_WITHOUT_CUDA();
  const FusedInputs in = make_fused(c);
  const DepthRoute<float> got = attn_res(Backend::cuda, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt);
  const DepthRoute<float> ref = attn_res(in.sources, in.w, in.gain, in.psi, c.kinds, c.opt);
  const DepthRoute<R> hp = attn_res(in.sources.cast<R>(), in.w.cast<R>(), opt_cast<R>(in.gain), in.psi.cast<R>(),
                                    c.kinds, c.opt);
  const Tensor<double> eg = logit_error(in, c.opt);
  const bounds::DepthRouteBounds b = bounds::depth_route_bounds(in.sources, in.psi, c.kinds, c.opt.depth, hp, &eg);
  OASIS_EXPECT_PARITY(within_twice_reference("h", got.h, ref.h, hp.h, b.h));
  OASIS_EXPECT_PARITY(within_twice_reference("alpha", got.alpha, ref.alpha, hp.alpha, b.alpha));
  OASIS_EXPECT_PARITY(
      within_twice_reference("alpha_null", got.alpha_null, ref.alpha_null, hp.alpha_null, b.alpha_null));
  OASIS_EXPECT_PARITY(within_twice_reference("g", got.g, ref.g, hp.g, b.g));
  OASIS_EXPECT_PARITY(within_twice_reference("dpsi", got.dpsi, ref.dpsi, hp.dpsi, b.dpsi));
  EXPECT_TRUE(aggregate_close("h", got.h, ref.h, hp.h));
  EXPECT_TRUE(aggregate_close("alpha", got.alpha, ref.alpha, hp.alpha));
  EXPECT_TRUE(aggregate_close("g", got.g, ref.g, hp.g));
  if (!c.opt.depth.coupling) {
    // Uncoupled, g is the device's logits: cuda::pseudo_query_logits' kernel, times scale once.
    Tensor<float> g = cuda::pseudo_query_logits(in.sources, in.w, in.gain, c.opt.key_norm);
    for (index_t i = 0; i < g.size(); ++i) g[i] = g[i] * static_cast<float>(c.opt.scale);
    EXPECT_TRUE(exactly_equal("g", got.g, g));
    EXPECT_TRUE(exactly_equal("dpsi", got.dpsi, Tensor<float>(g.shape())));
  }
  if (c.opt.depth.normalizer == RowNorm::softmax)
    EXPECT_TRUE(exactly_equal("alpha_null", got.alpha_null, ref.alpha_null));
}

TEST_P(FusedParity, BackwardWithinTwiceReferenceErrorPlusFloor) {
  const FusedCase& c = GetParam();
  OASIS_SKIP_WITHOUT_CUDA();
  const FusedInputs in = make_fused(c);
  const AttnResGrads<float> got =
      attn_res_backward(Backend::cuda, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt, in.cot);
  const AttnResGrads<float> ref = attn_res_backward(in.sources, in.w, in.gain, in.psi, c.kinds, c.opt, in.cot);
  const Tensor<R> sr = in.sources.cast<R>(), wr = in.w.cast<R>(), gr = opt_cast<R>(in.gain), pr = in.psi.cast<R>();
  const DepthCotangents<R> cr{in.cot.h.cast<R>(), opt_cast<R>(in.cot.alpha), opt_cast<R>(in.cot.alpha_null)};
  const AttnResGrads<R> hp = attn_res_backward(sr, wr, gr, pr, c.kinds, c.opt, cr);
  // The chained floors (the file's header).
  const Tensor<R> g_hp = attn_res_logits(sr, wr, gr, c.opt);
  const DepthRoute<R> fwd = attn_res_route(sr, g_hp, pr, c.kinds, c.opt.depth);
  const Tensor<double> eg = logit_error(in, c.opt);
  const bounds::DepthBackwardBounds db = bounds::depth_route_backward_bounds(
      in.sources, g_hp.cast<float>(), in.psi, c.kinds, c.opt.depth, in.cot, fwd, &eg);
  const double u = bounds::Precision::of<float>().u;
  Tensor<double> edg = db.g_old;
  Tensor<R> dg_hp = hp.logits;
  for (index_t i = 0; i < edg.size(); ++i) {
    dg_hp[i] = dg_hp[i] * R(c.opt.scale);
    edg[i] = std::abs(c.opt.scale) * edg[i] + bounds::kSecondOrder * u * std::abs(static_cast<double>(dg_hp[i]));
  }
  const bounds::PseudoQueryBackwardBounds kb = bounds::pseudo_query_logits_backward_bounds(
      in.sources, in.w, in.gain, dg_hp.cast<float>(), c.opt.key_norm, &edg);
  Tensor<double> bs = db.sources;
  for (index_t i = 0; i < bs.size(); ++i) bs[i] += kb.sources[i];
  OASIS_EXPECT_PARITY(within_twice_reference("grad_sources", got.sources, ref.sources, hp.sources, bs));
  OASIS_EXPECT_PARITY(within_twice_reference("grad_w", got.w, ref.w, hp.w, kb.w));
  OASIS_EXPECT_PARITY(within_twice_reference("grad_logits", got.logits, ref.logits, hp.logits, db.g_old));
  OASIS_EXPECT_PARITY(within_twice_reference("grad_psi", got.psi, ref.psi, hp.psi, db.psi));
  EXPECT_TRUE(aggregate_close("grad_sources", got.sources, ref.sources, hp.sources));
  EXPECT_TRUE(aggregate_close("grad_w", got.w, ref.w, hp.w));
  EXPECT_TRUE(aggregate_close("grad_logits", got.logits, ref.logits, hp.logits));
  if (c.gain) EXPECT_TRUE(aggregate_close("grad_gain", got.gain, ref.gain, hp.gain));
  if (c.gain) {
    OASIS_EXPECT_PARITY(within_twice_reference("grad_gain", got.gain, ref.gain, hp.gain, kb.gain));
  } else {
    EXPECT_TRUE(got.gain.empty());
  }
  OASIS_EXPECT_PARITY(scalar_rule("grad_beta", got.beta, ref.beta, static_cast<double>(hp.beta), db.beta));
  OASIS_EXPECT_PARITY(scalar_rule("grad_theta", got.theta, ref.theta, static_cast<double>(hp.theta), db.theta));
  if (!c.opt.depth.coupling) {  // psi, beta and theta receive exactly 0 without coupling
    EXPECT_TRUE(exactly_equal("grad_psi", got.psi, Tensor<float>(in.psi.shape())));
    EXPECT_EQ(got.beta, 0.0f);
    EXPECT_EQ(got.theta, 0.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, FusedParity, ::testing::ValuesIn(fused_cases()),
                         [](const auto& info) { return info.param.name; });

// Repeated calls give bitwise equal results (dw and dgain: fixed-order partial sums, no atomics);
// "larger" has several row chunks in the column sums.
TEST(CudaAttnRes, RepeatedCallsAreBitwiseEqual) {
  OASIS_SKIP_WITHOUT_CUDA();
  for (const FusedCase& c : {fused_cases()[2], fused_cases().back()}) {
    const FusedInputs in = make_fused(c);
    const DepthRoute<float> f0 = attn_res(Backend::cuda, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt);
    const AttnResGrads<float> b0 =
        attn_res_backward(Backend::cuda, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt, in.cot);
    for (int rep = 0; rep < 2; ++rep) {
      const DepthRoute<float> f = attn_res(Backend::cuda, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt);
      EXPECT_TRUE(exactly_equal("h", f.h, f0.h)) << c.name;
      EXPECT_TRUE(exactly_equal("alpha", f.alpha, f0.alpha)) << c.name;
      EXPECT_TRUE(exactly_equal("alpha_null", f.alpha_null, f0.alpha_null)) << c.name;
      EXPECT_TRUE(exactly_equal("g", f.g, f0.g)) << c.name;
      const AttnResGrads<float> b =
          attn_res_backward(Backend::cuda, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt, in.cot);
      EXPECT_TRUE(exactly_equal("grad_sources", b.sources, b0.sources)) << c.name;
      EXPECT_TRUE(exactly_equal("grad_w", b.w, b0.w)) << c.name;
      EXPECT_TRUE(exactly_equal("grad_gain", b.gain, b0.gain)) << c.name;
      EXPECT_TRUE(exactly_equal("grad_psi", b.psi, b0.psi)) << c.name;
      EXPECT_TRUE(exactly_equal("grad_logits", b.logits, b0.logits)) << c.name;
      EXPECT_EQ(b.beta, b0.beta) << c.name;
      EXPECT_EQ(b.theta, b0.theta) << c.name;
    }
  }
}

// Bad inputs throw oasis::invalid_argument naming what the reference names, forward and backward.
TEST(CudaAttnRes, InvalidInputNamesTheArgumentAsTheReference) {
  OASIS_SKIP_WITHOUT_CUDA();
  const FusedCase c = fused_cases()[2];  // coupled, with a gain and dalpha
  const FusedInputs good = make_fused(c);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct Bad {
    std::string expect;
    FusedInputs in;
    AttnResOptions opt;
    std::vector<SourceKind> kinds;
  };
  std::vector<Bad> bad;
  auto add = [&](const std::string& expect, auto&& edit) {
    Bad b{expect, good, c.opt, c.kinds};
    edit(b);
    bad.push_back(std::move(b));
  };
  // Logits that overflow at token 9 only: w_0 = 1e38, feature 0 zero except in row (3, 9), whose
  // RMSNorm puts ~sqrt(d) there.
  auto overflow_at_9 = [&](Bad& b) {
    for (index_t i = 0; i < b.in.sources.dim(0); ++i)
      for (index_t t = 0; t < b.in.sources.dim(1); ++t) b.in.sources(i, t, 0) = 0.0f;
    b.in.sources(3, 9, 0) = 1e3f;
    b.in.w[0] = 1e38f;
  };
  add("sources", [&](Bad& b) { b.in.sources(2, 5, 7) = nan; });
  add("sources", [&](Bad& b) { b.in.sources(0, 0, 0) = inf; });
  add("w", [&](Bad& b) { b.in.w = Tensor<float>({c.d + 1}); });
  add("w", [&](Bad& b) { b.in.w[3] = inf; });
  add("gain", [&](Bad& b) { b.in.gain = Tensor<float>({c.d - 1}); });
  add("g_old", [&](Bad& b) { b.in.gain[4] = nan; });  // NaN logits at every row
  add("g_old", overflow_at_9);
  add("g_old", [&](Bad& b) {  // token 9's logits fail before token 12's psi
    overflow_at_9(b);
    b.in.psi(1, 12) = 1.5f;
  });
  add("psi", [&](Bad& b) {  // token 2's psi fails before token 9's logits
    overflow_at_9(b);
    b.in.psi(1, 2) = -0.5f;
  });
  add("psi", [&](Bad& b) { b.in.psi(1, 4) = 1.5f; });
  add("psi", [&](Bad& b) { b.in.psi(3, 0) = nan; });
  add("scale", [&](Bad& b) { b.opt.scale = inf; });
  add("eps", [&](Bad& b) { b.opt.key_norm.eps = 0.0; });
  add("beta", [&](Bad& b) { b.opt.depth.beta = -1.0; });
  add("psi", [&](Bad& b) { b.in.psi = Tensor<float>({2, c.N}); });
  add("kinds", [&](Bad& b) { b.kinds.pop_back(); });
  for (const Bad& b : bad) {
    const FusedInputs& in = b.in;
    EXPECT_EQ(thrown_argument([&] { attn_res(in.sources, in.w, in.gain, in.psi, b.kinds, b.opt); }), b.expect);
    EXPECT_EQ(thrown_argument([&] { attn_res(Backend::cuda, in.sources, in.w, in.gain, in.psi, b.kinds, b.opt); }),
              b.expect);
    EXPECT_EQ(thrown_argument([&] { attn_res_backward(in.sources, in.w, in.gain, in.psi, b.kinds, b.opt, in.cot); }),
              b.expect);
    EXPECT_EQ(thrown_argument(
                  [&] { attn_res_backward(Backend::cuda, in.sources, in.w, in.gain, in.psi, b.kinds, b.opt, in.cot); }),
              b.expect);
  }
  // The backward's own: the cotangents' shapes and values.
  FusedInputs in = good;
  auto backward = [&] { attn_res_backward(Backend::cuda, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt, in.cot); };
  in.cot.h = Tensor<float>({c.N, c.d + 1});
  EXPECT_EQ(thrown_argument(backward), "dh");
  in = good;
  in.cot.alpha(0, 0) = nan;
  EXPECT_EQ(thrown_argument(backward), "dalpha");
  // The CUDA backend's own limit: exponential normalisers only.
  AttnResOptions clipped = c.opt;
  clipped.depth.normalizer = RowNorm::clipped_softmax;
  EXPECT_EQ(
      thrown_argument([&] { attn_res(Backend::cuda, good.sources, good.w, good.gain, good.psi, c.kinds, clipped); }),
      "normalizer");
}

}  // namespace
}  // namespace oasis::test
