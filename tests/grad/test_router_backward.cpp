// The Kimi pseudo-query logits and the routers (Kimi and the authors') with their sources' total
// gradient (docs/spec.md §8): mp50 gradients against mp50 central finite differences with a derived
// tolerance (router_grad_support.hpp); float/double of the depth routing, the pseudo-query logits
// and the routers within the derived backward bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "router_grad_support.hpp"

using namespace oasis;
using namespace oasis::depth_grad_test;

// ---- the Kimi pseudo-query logits ---------------------------------------------------------------

TEST(PseudoQueryBackward, MatchesFiniteDifferencesInMp50) {
  double worst = 0;
  long checked = 0;
  std::uint64_t seed = base_seed() + 50;
  for (bool gain : {false, true})
    for (double eps : {1e-6, 1e-5}) {
      KimiInstance K = make_kimi(3, 2, 4, gain, seed++);
      K.opt.eps = eps;
      const PseudoQueryGrads<R> g = pseudo_query_logits_backward(K.sources.cast<R>(), K.w.cast<R>(), K.gain.cast<R>(),
                                                                 K.dg.cast<R>(), K.opt);
      const fd::Summary s = fd_check_kimi(K, g);
      EXPECT_TRUE(s.ok()) << s.failed << " of " << s.checked << "\n" << s.first;
      worst = std::max(worst, s.worst_ratio);
      checked += s.checked;
    }
  std::printf("pseudo-query backward vs FD: %ld gradients, worst |analytic - fd| / tol = %.3g\n", checked, worst);
}

// ---- the routers: logits, the uncoupled clamp, coupling, normaliser and mix, sources in total ----

TEST(RouterBackward, MatchesFiniteDifferencesOfTheModelsRouters) {
  double worst = 0;
  long checked = 0;
  std::uint64_t seed = base_seed() + 60;
  for (bool authors : {false, true})
    for (bool coupled : {true, false}) {
      const RouterInstance X = make_router(authors, authors ? "iaha" : "iahah", coupled, seed++);
      SCOPED_TRACE(std::string(authors ? "authors" : "kimi") + (coupled ? " coupled" : " uncoupled") + " seed " +
                   std::to_string(seed - 1));
      const fd::Summary s = fd_check_router(X, router_backward<R>(X));
      EXPECT_TRUE(s.ok()) << s.failed << " of " << s.checked << "\n" << s.first;
      worst = std::max(worst, s.worst_ratio);
      checked += s.checked;
    }
  std::printf("router backward vs FD: %ld gradients, worst |analytic - fd| / tol = %.3g\n", checked, worst);
}

TEST(RouterBackward, SourcesGetTheMixAndTheKeyGradients) {
  const RouterInstance X = make_router(false, "iaa", true, base_seed() + 70);
  const model::RouteGrads<double> g = router_backward<double>(X);
  for (index_t i = 0; i < g.sources.size(); ++i) EXPECT_EQ(g.sources[i], g.depth.sources[i] + g.kimi.sources[i]);
  double key_part = 0;
  for (index_t i = 0; i < g.kimi.sources.size(); ++i) key_part += std::abs(g.kimi.sources[i]);
  EXPECT_GT(key_part, 0.0);
}

// ---- float and double within the derived backward bounds ---------------------------------------

template <class T>
class DepthBackwardPrecision : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(DepthBackwardPrecision, Scalars);

TYPED_TEST(DepthBackwardPrecision, WithinDerivedBoundOfHighPrecision) {
  using T = TypeParam;
  double worst = 0;
  auto ratio = [&](const Tensor<T>& g, const Tensor<R>& r, const Tensor<double>& b) {
    for (index_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(R(g[i]) - r[i])) / b[i]);
  };
  auto use = [](const Tensor<double>& bt) { return [&bt](index_t i, double) { return bt[i]; }; };
  std::uint64_t seed = base_seed() + 80;
  for (DepthCase c : depth_cases()) {
    c.N = 6;
    c.d = 16;
    c.dalpha = c.dalpha_null = true;
    SCOPED_TRACE(c.name + " seed " + std::to_string(seed));
    const DepthInstance I = make_depth(c, seed++);
    const Tensor<R> S = I.sources.cast<R>(), G = I.g_old.cast<R>(), P = I.psi.cast<R>();
    const DepthRoute<R> fwd = attn_res_route(S, G, P, I.kinds, I.opt);
    const DepthGrads<R> ref = attn_res_route_backward(S, G, P, I.kinds, I.opt, depth_cot<R>(I));
    const DepthGrads<T> got = attn_res_route_backward(I.sources.cast<T>(), I.g_old.cast<T>(), I.psi.cast<T>(), I.kinds,
                                                      I.opt, depth_cot<T>(I));
    const bounds::DepthBackwardBounds b = bounds::depth_route_backward_bounds(
        I.sources.cast<T>(), I.g_old.cast<T>(), I.psi.cast<T>(), I.kinds, I.opt, depth_cot<T>(I), fwd);
    EXPECT_TRUE(oasis::test::within_bound("dsources", got.sources, ref.sources, use(b.sources)));
    EXPECT_TRUE(oasis::test::within_bound("dg_old", got.g_old, ref.g_old, use(b.g_old)));
    EXPECT_TRUE(oasis::test::within_bound("dpsi", got.psi, ref.psi, use(b.psi)));
    EXPECT_LE(std::abs(static_cast<double>(R(got.beta) - ref.beta)), b.beta);
    EXPECT_LE(std::abs(static_cast<double>(R(got.theta) - ref.theta)), b.theta);
    ratio(got.sources, ref.sources, b.sources);
    ratio(got.g_old, ref.g_old, b.g_old);
    ratio(got.psi, ref.psi, b.psi);
  }
  // the pseudo-query logits, with and without gain and float32 evaluation
  for (bool gain : {false, true})
    for (bool f32 : {false, true}) {
      KimiInstance K = make_kimi(3, 5, 24, gain, seed++);
      K.opt.compute_in_float32 = f32;
      const PseudoQueryGrads<R> ref = pseudo_query_logits_backward(K.sources.cast<R>(), K.w.cast<R>(), K.gain.cast<R>(),
                                                                   K.dg.cast<R>(), KeyNormOptions{K.opt.eps, false});
      const PseudoQueryGrads<T> got =
          pseudo_query_logits_backward(K.sources.cast<T>(), K.w.cast<T>(), K.gain.cast<T>(), K.dg.cast<T>(), K.opt);
      const bounds::PseudoQueryBackwardBounds b = bounds::pseudo_query_logits_backward_bounds(
          K.sources.cast<T>(), K.w.cast<T>(), K.gain.cast<T>(), K.dg.cast<T>(), K.opt);
      EXPECT_TRUE(oasis::test::within_bound("kimi dsources", got.sources, ref.sources, use(b.sources)));
      EXPECT_TRUE(oasis::test::within_bound("kimi dw", got.w, ref.w, use(b.w)));
      if (gain) EXPECT_TRUE(oasis::test::within_bound("kimi dgain", got.gain, ref.gain, use(b.gain)));
      if (!f32) {
        ratio(got.sources, ref.sources, b.sources);
        ratio(got.w, ref.w, b.w);
      }
    }
  std::printf("depth / pseudo-query backward %s: worst |err| / bound = %.3g\n", sizeof(T) == 4 ? "float" : "double", worst);
}

TYPED_TEST(DepthBackwardPrecision, RoutersWithinComposedBound) {
  using T = TypeParam;
  double worst = 0;
  auto use = [](const Tensor<double>& bt) { return [&bt](index_t i, double) { return bt[i]; }; };
  auto ratio = [&](const Tensor<T>& g, const Tensor<R>& r, const Tensor<double>& b) {
    for (index_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(R(g[i]) - r[i])) / b[i]);
  };
  std::uint64_t seed = base_seed() + 85;
  for (bool authors : {false, true})
    for (bool coupled : {true, false}) {
      const RouterInstance X = make_router(authors, authors ? "iahaa" : "iahah", coupled, seed++);
      SCOPED_TRACE(std::string(authors ? "authors" : "kimi") + (coupled ? " coupled" : " uncoupled"));
      const DepthInstance& I = X.depth;
      const model::RouteGrads<R> ref = router_backward<R>(X);
      const model::RouteGrads<T> got = router_backward<T>(X);
      const bounds::RouteBackwardBounds b =
          authors ? bounds::authors_route_backward_bounds(I.sources.cast<T>(), X.wq.cast<T>(), X.wk.cast<T>(), T(X.recency),
                                                          I.psi.cast<T>(), I.kinds, I.opt, depth_cot<T>(I))
                  : bounds::kimi_route_backward_bounds(I.sources.cast<T>(), X.w.cast<T>(), X.gain.cast<T>(), X.cfg.key_norm,
                                                       I.psi.cast<T>(), I.kinds, I.opt, depth_cot<T>(I));
      EXPECT_TRUE(oasis::test::within_bound("sources", got.sources, ref.sources, use(b.sources)));
      EXPECT_TRUE(oasis::test::within_bound("g_old", got.g_old, ref.g_old, use(b.g_old)));
      EXPECT_TRUE(oasis::test::within_bound("psi", got.depth.psi, ref.depth.psi, use(b.depth.psi)));
      EXPECT_LE(std::abs(static_cast<double>(R(got.depth.theta) - ref.depth.theta)), b.depth.theta);
      ratio(got.sources, ref.sources, b.sources);
      ratio(got.g_old, ref.g_old, b.g_old);
      if (authors) {
        EXPECT_TRUE(oasis::test::within_bound("wq", got.authors.wq, ref.authors.wq, use(b.authors.wq)));
        EXPECT_TRUE(oasis::test::within_bound("wk", got.authors.wk, ref.authors.wk, use(b.authors.wk)));
        EXPECT_LE(std::abs(static_cast<double>(R(got.authors.recency) - ref.authors.recency)), b.authors.recency);
        ratio(got.authors.wq, ref.authors.wq, b.authors.wq);
        ratio(got.authors.wk, ref.authors.wk, b.authors.wk);
      } else {
        EXPECT_TRUE(oasis::test::within_bound("w", got.kimi.w, ref.kimi.w, use(b.kimi.w)));
        EXPECT_TRUE(oasis::test::within_bound("gain", got.kimi.gain, ref.kimi.gain, use(b.kimi.gain)));
        ratio(got.kimi.w, ref.kimi.w, b.kimi.w);
      }
    }
  std::printf("router backward %s: worst |err| / bound = %.3g\n", sizeof(T) == 4 ? "float" : "double", worst);
}
