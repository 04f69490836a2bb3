// Depth routing backward (docs/spec.md §3–4, §8): psi, coupling (both centrings, both head-less rules,
// clamps, beta via theta), the depth normaliser and the mix. mp50 gradients against mp50 central
// finite differences with a derived tolerance (depth_grad_support.hpp); identities and kink
// conventions. The pseudo-query logits, the routers and float/double: test_router_backward.cpp;
// the zoo: test_depth_backward_zoo.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "depth_grad_support.hpp"

using namespace oasis;
using namespace oasis::depth_grad_test;

// ---- depth routing: finite differences, identities, kinks --------------------------------------

TEST(DepthBackward, MatchesFiniteDifferencesInMp50) {
  std::uint64_t seed = base_seed();
  double worst = 0;
  long checked = 0;
  for (const DepthCase& c : depth_cases()) {
    SCOPED_TRACE(c.name + " seed " + std::to_string(seed));
    const DepthInstance I = make_depth(c, seed++);
    const DepthGrads<R> g =
        attn_res_route_backward(I.sources.cast<R>(), I.g_old.cast<R>(), I.psi.cast<R>(), I.kinds, I.opt, depth_cot<R>(I));
    const fd::Summary s = fd_check_depth(I, g);
    EXPECT_TRUE(s.ok()) << s.failed << " of " << s.checked << " gradients off their finite difference\n" << s.first;
    worst = std::max(worst, s.worst_ratio);
    checked += s.checked;
  }
  std::printf("depth backward vs FD: %ld gradients, worst |analytic - fd| / tol = %.3g\n", checked, worst);
}

TEST(DepthBackward, SoftmaxLogitGradientsSumToZeroAndSoftmax1ToTheNullTerm) {
  // Shifting every depth logit by c: plain softmax is invariant (sum_i dg_i = 0); Softmax1's null
  // logit stays 0, so sum_i dg_i = -(null term) = alpha_null (D - dalpha_null).
  for (RowNorm norm : {RowNorm::softmax, RowNorm::softmax1}) {
    DepthCase c{"shift", 4, 3, 3, kinds_of("iaaa")};
    c.opt.coupling = false;
    c.opt.normalizer = norm;
    c.dalpha = c.dalpha_null = true;
    const DepthInstance I = make_depth(c, base_seed() + 30);
    const DepthGrads<R> g =
        attn_res_route_backward(I.sources.cast<R>(), I.g_old.cast<R>(), I.psi.cast<R>(), I.kinds, I.opt, depth_cot<R>(I));
    const DepthRoute<R> r = attn_res_route(I.sources.cast<R>(), I.g_old.cast<R>(), I.psi.cast<R>(), I.kinds, I.opt);
    for (index_t t = 0; t < 3; ++t) {
      R sum(0), D = norm == RowNorm::softmax1 ? R(r.alpha_null[t] * R(I.dalpha_null[t])) : R(0);
      for (index_t i = 0; i < 4; ++i) {
        sum += g.g_old(i, t);
        R da = R(I.dalpha(i, t));
        for (index_t x = 0; x < 3; ++x) da += R(I.dh(t, x)) * R(I.sources(i, t, x));
        D += r.alpha(i, t) * da;
      }
      const R expect = norm == RowNorm::softmax1 ? R(r.alpha_null[t] * (D - R(I.dalpha_null[t]))) : R(0);
      EXPECT_LT(std::abs(static_cast<double>(sum - expect)), 1e-40) << to_string(norm) << " token " << t;
    }
  }
}

TEST(DepthBackward, CentredPsiGradientsSumToZeroOverTheCentringSet) {
  DepthCase c{"centre", 5, 3, 2, kinds_of("iahah")};
  c.opt.theta = 0.75;
  const DepthInstance I = make_depth(c, base_seed() + 31);
  const DepthGrads<R> g =
      attn_res_route_backward(I.sources.cast<R>(), I.g_old.cast<R>(), I.psi.cast<R>(), I.kinds, I.opt, depth_cot<R>(I));
  for (index_t t = 0; t < 3; ++t) {
    R sum(0);
    for (index_t i = 0; i < 5; ++i) sum += g.psi(i, t);
    EXPECT_LT(std::abs(static_cast<double>(sum)), 1e-40);
    EXPECT_EQ(static_cast<double>(g.psi(0, t)), 0.0);  // the initial state's psi is never read
  }
}

TEST(DepthBackward, BetaZeroAndOneBranchSpecialCases) {
  DepthCase c{"special", 4, 3, 3, kinds_of("iaha")};
  c.dalpha = c.dalpha_null = true;
  DepthInstance I = make_depth(c, base_seed() + 32);
  // beta = 0 reproduces AoS: the same dg_old and dsources as without coupling, psi gets exactly 0
  I.opt.beta = 0.0;
  const DepthGrads<double> a =
      attn_res_route_backward(I.sources, I.g_old, I.psi, I.kinds, I.opt, depth_cot<double>(I));
  DepthInstance J = I;
  J.opt.coupling = false;
  const DepthGrads<double> b = attn_res_route_backward(J.sources, J.g_old, J.psi, J.kinds, J.opt, depth_cot<double>(J));
  EXPECT_TRUE(oasis::test::exactly_equal("dg_old", a.g_old, b.g_old));
  EXPECT_TRUE(oasis::test::exactly_equal("dsources", a.sources, b.sources));
  for (index_t i = 0; i < a.psi.size(); ++i) EXPECT_EQ(a.psi[i], 0.0);
  EXPECT_NE(a.beta, 0.0);  // the loss still depends on beta at beta = 0
  // one transformed branch (paper_v2): Dpsi = 0 identically: psi, beta and theta get exactly 0
  DepthInstance K = I;
  K.kinds = kinds_of("iaii");
  K.opt.beta.reset();
  K.opt.theta = 1.0;
  const DepthGrads<double> k = attn_res_route_backward(K.sources, K.g_old, K.psi, K.kinds, K.opt, depth_cot<double>(K));
  for (index_t i = 0; i < k.psi.size(); ++i) EXPECT_EQ(k.psi[i], 0.0);
  EXPECT_EQ(k.beta, 0.0);
  EXPECT_EQ(k.theta, 0.0);
}

TEST(DepthBackward, ClampKinkConvention) {
  // Exact dyadic cases: a coupled logit exactly at +-L passes its gradient (torch.clamp); beyond
  // it passes 0. beta_raw exactly at beta_max passes; above it passes 0.
  DepthInstance I;
  I.kinds = kinds_of("iaa");
  I.sources = Tensor<double>({3, 1, 2}, {0.5, -1.0, 1.0, 0.25, -0.5, 2.0});
  I.psi = Tensor<double>({3, 1}, {0.0, 0.75, 0.25});  // Dpsi = (0, 0.25, -0.25)
  I.dh = Tensor<double>({1, 2}, {1.0, -0.5});
  I.opt.coupling_options.score_clamp = 2.0;
  I.opt.beta = 2.0;  // x = g_old - 2 Dpsi
  auto run = [&](double g1, double g2, double beta_max) {
    I.g_old = Tensor<double>({3, 1}, {0.0, g1, g2});
    I.opt.coupling_options.beta_max = beta_max;
    return attn_res_route_backward(I.sources, I.g_old, I.psi, I.kinds, I.opt, depth_cot<double>(I));
  };
  const DepthGrads<double> at = run(2.5, -2.5, 8.0);    // x = (0, 2, -2): both exactly at the bound
  const DepthGrads<double> out = run(2.625, -2.625, 8.0);  // x = (0, 2.125, -2.125): beyond
  EXPECT_NE(at.g_old(1, 0), 0.0);
  EXPECT_NE(at.g_old(2, 0), 0.0);
  EXPECT_EQ(out.g_old(1, 0), 0.0);
  EXPECT_EQ(out.g_old(2, 0), 0.0);
  EXPECT_NE(out.g_old(0, 0), 0.0);
  const DepthGrads<double> cap_at = run(0.5, 0.25, 2.0);    // beta_raw = 2 = beta_max
  const DepthGrads<double> cap_out = run(0.5, 0.25, 1.5);   // beta_raw = 2 > beta_max
  EXPECT_NE(cap_at.beta, 0.0);
  EXPECT_EQ(cap_out.beta, 0.0);
  EXPECT_NE(cap_out.psi(1, 0), 0.0);  // psi still gets gradient through the capped beta
  // the same rule in the authors' mass estimator: a deficit exactly 0 passes
  const Tensor<double> probs({1, 1, 2, 2}, {0.5, 0.5, 0.25, 0.5});
  const Tensor<double> dp = null_statistic_from_mass_backward(probs, Tensor<double>({1, 2}, {1.0, 1.0}));
  EXPECT_EQ(dp(0, 0, 0, 0), -1.0);
  EXPECT_EQ(dp(0, 0, 1, 1), -1.0);
  const Tensor<double> over({1, 1, 1, 2}, {0.75, 0.5});
  EXPECT_EQ(null_statistic_from_mass_backward(over, Tensor<double>({1, 1}, {1.0}))(0, 0, 0, 0), 0.0);
}

TEST(DepthBackward, NullStatisticBackward) {
  // psi = mean_h p_null: dp_null = dpsi / H, exactly for H a power of two.
  const Tensor<double> dpsi({2, 3}, {1.0, -2.0, 0.5, 3.0, 0.25, -1.0});
  const Tensor<double> dp = null_statistic_backward(dpsi, 4);
  for (index_t b = 0; b < 2; ++b)
    for (index_t h = 0; h < 4; ++h)
      for (index_t t = 0; t < 3; ++t) EXPECT_EQ(dp(b, h, t), dpsi(b, t) / 4);
}

TEST(DepthBackward, RejectsBadInput) {
  const DepthInstance I = make_depth(depth_cases()[0], 9);
  auto arg_of = [&](const DepthCotangents<double>& d) {
    try {
      attn_res_route_backward(I.sources, I.g_old, I.psi, I.kinds, I.opt, d);
    } catch (const oasis::invalid_argument& e) {
      return e.argument();
    }
    return std::string("none");
  };
  EXPECT_EQ(arg_of({Tensor<double>({3, 2})}), "dh");
  EXPECT_EQ(arg_of({I.dh, Tensor<double>({5, 2})}), "dalpha");
  EXPECT_EQ(arg_of({I.dh, {}, Tensor<double>({2})}), "dalpha_null");
  Tensor<double> bad = I.dh;
  bad[1] = INFINITY;
  EXPECT_EQ(arg_of({bad}), "dh");
  EXPECT_EQ(arg_of({I.dh}), "none");
  EXPECT_THROW(null_statistic_backward(Tensor<double>({2, 3}), 0), oasis::invalid_argument);
  EXPECT_THROW(pseudo_query_logits_backward(I.sources, Tensor<double>({3}), Tensor<double>(), Tensor<double>({5, 2})),
               oasis::invalid_argument);
}
