// tests/grad/router_grad_support.hpp — the routers' instances of the backward tests: the Kimi
// pseudo-query logits (bounds on the derivatives of an RMSNorm'd logit, the instance and its mp50
// finite-difference check) and the model's routers (Kimi and the authors') on stacked sources, with
// the finite-difference check of their total gradients (docs/spec.md §8).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "depth_grad_support.hpp"

namespace oasis::depth_grad_test {

inline constexpr double kPhi1 = 0.3850, kPhi2 = 1.0, kPhi3 = 1.9323, kPsi1 = 1.0, kPsi2 = 0.8587, kPsi3 = 3.0;  // RMSNorm

/// Bounds on |g'|, |g''|, |g'''| of g(tau) = w^T RMSNorm(x + tau e_c): with y = x_c + tau,
/// K = sum_{c' != c} x_c'^2 + d eps, g = sqrt(d) (W' phi(y) + kappa psi(y)), phi = (y^2 + K)^-1/2,
/// psi = y phi, W' = sum_{c' != c} w gain x, kappa = w_c gain_c; |phi^(k)| <= kPhi_k K^-(k+1)/2,
/// |psi^(k)| <= kPsi_k K^-k/2 (maxima of the scaled functions; the constants round them up).
inline std::array<double, 3> rms_logit_derivative_bounds(const Tensor<double>& x, index_t i, index_t t, index_t c,
                                                         const Tensor<double>& w, const Tensor<double>& gain, double eps) {
  const index_t d = x.dim(2);
  double K = static_cast<double>(d) * eps, W = 0;
  for (index_t c2 = 0; c2 < d; ++c2) {
    if (c2 == c) continue;
    K += x(i, t, c2) * x(i, t, c2);
    W += w[c2] * (gain.empty() ? 1.0 : gain[c2]) * x(i, t, c2);
  }
  const double kap = std::abs(w[c] * (gain.empty() ? 1.0 : gain[c])), sd = std::sqrt(static_cast<double>(d));
  W = std::abs(W);
  return {sd * (W * kPhi1 / K + kap * kPsi1 / std::sqrt(K)), sd * (W * kPhi2 / std::pow(K, 1.5) + kap * kPsi2 / K),
          sd * (W * kPhi3 / (K * K) + kap * kPsi3 / std::pow(K, 1.5))};
}

struct KimiInstance {
  Tensor<double> sources, w, gain, dg;
  KeyNormOptions opt;
};

inline KimiInstance make_kimi(index_t n, index_t N, index_t d, bool gain, std::uint64_t seed) {
  auto rng = oasis::test::make_rng(seed);
  KimiInstance K;
  K.sources = oasis::test::randn<float>({n, N, d}, rng).cast<double>();
  K.w = oasis::test::randn<float>({d}, rng).cast<double>();
  if (gain) K.gain = oasis::test::uniform<float>({d}, rng, 0.5, 1.5).cast<double>();
  K.dg = oasis::test::randn<float>({n, N}, rng).cast<double>();
  return K;
}

inline fd::Summary fd_check_kimi(const KimiInstance& K, const PseudoQueryGrads<R>& g, long stop_after = 0) {
  const index_t n = K.sources.dim(0), N = K.sources.dim(1), d = K.sources.dim(2);
  const Tensor<R> S = K.sources.cast<R>(), W = K.w.cast<R>(), Gn = K.gain.cast<R>();
  auto loss = [&](const Tensor<R>& s, const Tensor<R>& w, const Tensor<R>& gn) {
    const Tensor<R> g0 = pseudo_query_logits(s, w, gn, K.opt);
    R f(0);
    for (index_t i = 0; i < g0.size(); ++i) f += R(K.dg[i]) * g0[i];
    return f;
  };
  Checker ck;
  ck.sum.stop_after = stop_after;
  double F_abs = 0;
  for (index_t i = 0; i < K.dg.size(); ++i) F_abs += std::abs(K.dg[i]) * 64;
  ck.tol.n_ops = 8.0 * static_cast<double>(n * N * (d + 16));
  ck.tol.Z = 1;
  ck.tol.F_abs = F_abs;
  ck.tol.G_abs = F_abs * 64;
  for (index_t i = 0; i < n; ++i)
    for (index_t t = 0; t < N; ++t)
      for (index_t c = 0; c < d; ++c) {
        const double M3 = std::abs(K.dg(i, t)) * rms_logit_derivative_bounds(K.sources, i, t, c, K.w, K.gain, K.opt.eps)[2];
        ck.check("dsources" + oasis::test::index_str(S.shape(), S.offset(i, t, c)), g.sources(i, t, c),
                 [&](const R& e) { Tensor<R> x = S; x(i, t, c) += e; return loss(x, W, Gn); }, M3);
      }
  for (index_t c = 0; c < d; ++c) {  // linear in w and in the gain
    ck.check("dw[" + std::to_string(c) + "]", g.w[c], [&](const R& e) { Tensor<R> x = W; x[c] += e; return loss(S, x, Gn); },
             0.0);
    if (!K.gain.empty())
      ck.check("dgain[" + std::to_string(c) + "]", g.gain[c],
               [&](const R& e) { Tensor<R> x = Gn; x[c] += e; return loss(S, W, x); }, 0.0);
  }
  return ck.sum;
}

/// The model's router on stacked sources: DepthSource views of `sources` with `psi`.
template <class T>
std::vector<model::DepthSource<T>> depth_sources(const Tensor<T>& sources, const Tensor<T>& psi,
                                                 const std::vector<SourceKind>& kinds) {
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2);
  std::vector<model::DepthSource<T>> v(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i) {
    auto& s = v[static_cast<std::size_t>(i)];
    s.v.x = Tensor<T>({N, d});
    std::copy(sources.ptr(i), sources.ptr(i) + N * d, s.v.x.data());
    s.kind = kinds[static_cast<std::size_t>(i)];
    s.psi = Tensor<T>({N});
    for (index_t t = 0; t < N; ++t) s.psi[t] = psi(i, t);
  }
  return v;
}

template <class T>
std::vector<const model::DepthSource<T>*> ptrs(const std::vector<model::DepthSource<T>>& v) {
  std::vector<const model::DepthSource<T>*> p;
  for (const auto& s : v) p.push_back(&s);
  return p;
}

struct RouterInstance {
  DepthInstance depth;  // sources, psi, kinds, cotangents; g_old unused
  model::ModelConfig cfg;
  double theta = 0.5;
  Tensor<double> w, gain, wq, wk;
  double recency = 0.375;
};

inline RouterInstance make_router(bool authors, const std::string& kinds, bool coupled, std::uint64_t seed) {
  RouterInstance X;
  DepthCase c{"router", static_cast<index_t>(kinds.size()), 3, 4, kinds_of(kinds)};
  c.dalpha = c.dalpha_null = true;
  X.depth = make_depth(c, seed);
  auto rng = oasis::test::make_rng(seed + 7);
  X.cfg.variant = coupled ? Variant::oasis : Variant::aos;
  X.cfg.router = authors ? model::RouterFamily::authors_code : model::RouterFamily::kimi_full;
  X.cfg.coupling = authors ? CouplingOptions::authors_code() : CouplingOptions::paper_v2();
  if (authors) X.cfg.coupling->score_clamp = 1.5;  // some logits held by the clamp
  X.depth.opt = model::router_depth_options(X.cfg, X.theta);
  if (authors) {
    X.wq = oasis::test::randn<float>({3, 4}, rng, 0.8).cast<double>();
    X.wk = oasis::test::randn<float>({3, 4}, rng, 0.8).cast<double>();
  } else {
    X.w = oasis::test::randn<float>({4}, rng, 1.5).cast<double>();
    X.gain = oasis::test::uniform<float>({4}, rng, 0.5, 1.5).cast<double>();
    X.cfg.key_norm_gain = true;
  }
  return X;
}

template <class T>
model::RouteResult<T> router_forward(const RouterInstance& X, const Tensor<T>& sources, const Tensor<T>& psi,
                                     const Tensor<T>& w, const Tensor<T>& gain, const Tensor<T>& wq, const Tensor<T>& wk,
                                     const T& rec, double theta) {
  const auto src = depth_sources(sources, psi, X.depth.kinds);
  if (X.cfg.router == model::RouterFamily::authors_code)
    return model::authors_route(ptrs(src), wq, wk, rec, theta, X.cfg, model::ErrorModel{});
  return model::kimi_route(ptrs(src), w, gain, theta, X.cfg, model::ErrorModel{});
}

template <class T>
model::RouteGrads<T> router_backward(const RouterInstance& X) {
  const DepthInstance& I = X.depth;
  if (X.cfg.router == model::RouterFamily::authors_code)
    return model::authors_route_backward(I.sources.cast<T>(), X.wq.cast<T>(), X.wk.cast<T>(), T(X.recency),
                                         I.psi.cast<T>(), I.kinds, I.opt, depth_cot<T>(I));
  return model::kimi_route_backward(I.sources.cast<T>(), X.w.cast<T>(), X.gain.cast<T>(), X.cfg.key_norm, I.psi.cast<T>(),
                                    I.kinds, I.opt, depth_cot<T>(I));
}

/// The router's gradients against finite differences of the loss of model::kimi_route /
/// model::authors_route (the model's forward, not the backward's recomputation).
inline fd::Summary fd_check_router(const RouterInstance& X, const model::RouteGrads<R>& g, long stop_after = 0) {
  const DepthInstance& I = X.depth;
  const bool authors = X.cfg.router == model::RouterFamily::authors_code;
  const index_t n = I.sources.dim(0), N = I.sources.dim(1), d = I.sources.dim(2);
  const Tensor<R> S = I.sources.cast<R>(), P = I.psi.cast<R>(), W = X.w.cast<R>(), Gn = X.gain.cast<R>(),
                  Wq = X.wq.cast<R>(), Wk = X.wk.cast<R>();
  const R rec(X.recency);
  auto loss = [&](const Tensor<R>& s, const Tensor<R>& p, const Tensor<R>& w, const Tensor<R>& gn, const Tensor<R>& wq,
                  const Tensor<R>& wk, const R& rc, double theta) {
    return depth_loss(router_forward(X, s, p, w, gn, wq, wk, rc, theta).route, I);
  };
  // the routed logits (after the uncoupled clamp) and the facts of the routing
  const model::RouteResult<R> fw = router_forward(X, S, P, W, Gn, Wq, Wk, rec, X.theta);
  const Tensor<double> g_routed = fw.g_old.cast<double>();
  DepthInstance J = I;
  J.g_old = g_routed;
  DepthFacts F = depth_facts(I.sources, g_routed, J, 1e-6);
  const Tensor<double> g_raw =
      authors ? model::authors_router_logits(S, Wq, Wk, rec).cast<double>() : pseudo_query_logits(S, W, Gn, X.cfg.key_norm).cast<double>();
  if (model::clamps_uncoupled_logits(I.opt)) {  // the uncoupled clamp holds some logits
    const double L = I.opt.coupling_options.score_clamp;
    for (index_t t = 0; t < N; ++t)
      for (index_t i = 0; i < n; ++i) {
        EXPECT_GT(std::abs(std::abs(g_raw(i, t)) - L), 1e-6) << "a logit at the uncoupled clamp";
        F.tok[static_cast<std::size_t>(t)].pass[static_cast<std::size_t>(i)] = clamp_passes(g_raw(i, t), -L, L);
      }
  }
  Checker ck;
  ck.sum.stop_after = stop_after;
  ck.tol = depth_tolerance(F, n, N, d);
  ck.tol.G_abs *= 64;
  // exact q, k of the authors' router (double: slopes only)
  const double sc = authors ? 1.0 / std::sqrt(static_cast<double>(X.wq.dim(0))) : 0.0;
  const index_t rk = authors ? X.wq.dim(0) : 0;
  auto proj = [&](const Tensor<double>& Wm, index_t i, index_t t, index_t a) {
    double acc = 0;
    for (index_t c = 0; c < d; ++c) acc += Wm(a, c) * I.sources(i, t, c);
    return acc;
  };
  for (index_t i = 0; i < n; ++i)
    for (index_t t = 0; t < N; ++t)
      for (index_t c = 0; c < d; ++c) {
        std::vector<Slope> sl(static_cast<std::size_t>(n));
        sl[static_cast<std::size_t>(i)].c1 = I.dh(t, c);  // through the mix
        if (!authors) {
          const auto D3 = rms_logit_derivative_bounds(I.sources, i, t, c, X.w, X.gain, X.cfg.key_norm.eps);
          Slope& s = sl[static_cast<std::size_t>(i)];
          s.bound_only = true;
          s.a = D3[0];
          s.b = D3[1];
          s.e = D3[2];
        } else {
          // key of candidate i: g_i slope sc sum_a q_a wk_ac; the current candidate also moves q
          double qk = 0;
          for (index_t a = 0; a < rk; ++a) qk += proj(X.wq, n - 1, t, a) * X.wk(a, c);
          sl[static_cast<std::size_t>(i)].a = sc * qk;
          if (i == n - 1) {
            double bq = 0;
            for (index_t a = 0; a < rk; ++a) bq += X.wq(a, c) * X.wk(a, c);
            for (index_t j = 0; j < n; ++j) {
              double s = 0;
              for (index_t a = 0; a < rk; ++a) s += X.wq(a, c) * proj(X.wk, j, t, a);
              sl[static_cast<std::size_t>(j)].a += sc * s;
            }
            sl[static_cast<std::size_t>(i)].b = 2 * sc * bq;
          }
        }
        ck.check("dsources" + oasis::test::index_str(S.shape(), S.offset(i, t, c)), g.sources(i, t, c),
                 [&](const R& e) { Tensor<R> x = S; x(i, t, c) += e; return loss(x, P, W, Gn, Wq, Wk, rec, X.theta); },
                 token_m3(F, t, sl));
      }
  auto all_tokens = [&](const std::function<void(index_t, std::vector<Slope>&)>& fill) {
    double M3 = 0;
    for (index_t t = 0; t < N; ++t) {
      std::vector<Slope> sl(static_cast<std::size_t>(n));
      fill(t, sl);
      M3 += token_m3(F, t, sl);
    }
    return M3;
  };
  if (!authors) {
    const Tensor<double> y = [&] {  // RMSNorm'd keys without and with the gain, for the slopes
      Tensor<double> r({n, N, d});
      for (index_t i = 0; i < n; ++i)
        for (index_t t = 0; t < N; ++t) rms_norm_row(I.sources.ptr(i, t), d, static_cast<const double*>(nullptr), X.cfg.key_norm, r.ptr(i, t));
      return r;
    }();
    for (index_t c = 0; c < d; ++c) {
      const double Mw = all_tokens([&](index_t t, std::vector<Slope>& sl) {
        for (index_t i = 0; i < n; ++i) sl[static_cast<std::size_t>(i)].a = y(i, t, c) * X.gain[c];
      });
      ck.check("dw[" + std::to_string(c) + "]", g.kimi.w[c],
               [&](const R& e) { Tensor<R> x = W; x[c] += e; return loss(S, P, x, Gn, Wq, Wk, rec, X.theta); }, Mw);
      const double Mg = all_tokens([&](index_t t, std::vector<Slope>& sl) {
        for (index_t i = 0; i < n; ++i) sl[static_cast<std::size_t>(i)].a = y(i, t, c) * X.w[c];
      });
      ck.check("dgain[" + std::to_string(c) + "]", g.kimi.gain[c],
               [&](const R& e) { Tensor<R> x = Gn; x[c] += e; return loss(S, P, W, x, Wq, Wk, rec, X.theta); }, Mg);
    }
  } else {
    for (index_t a = 0; a < rk; ++a)
      for (index_t c = 0; c < d; ++c) {
        const double Mq = all_tokens([&](index_t t, std::vector<Slope>& sl) {
          for (index_t i = 0; i < n; ++i) sl[static_cast<std::size_t>(i)].a = sc * proj(X.wk, i, t, a) * I.sources(n - 1, t, c);
        });
        ck.check("dwq[" + std::to_string(a) + ", " + std::to_string(c) + "]", g.authors.wq(a, c),
                 [&](const R& e) { Tensor<R> x = Wq; x(a, c) += e; return loss(S, P, W, Gn, x, Wk, rec, X.theta); }, Mq);
        const double Mk = all_tokens([&](index_t t, std::vector<Slope>& sl) {
          for (index_t i = 0; i < n; ++i) sl[static_cast<std::size_t>(i)].a = sc * proj(X.wq, n - 1, t, a) * I.sources(i, t, c);
        });
        ck.check("dwk[" + std::to_string(a) + ", " + std::to_string(c) + "]", g.authors.wk(a, c),
                 [&](const R& e) { Tensor<R> x = Wk; x(a, c) += e; return loss(S, P, W, Gn, Wq, x, rec, X.theta); }, Mk);
      }
    const double Mr = all_tokens([&](index_t, std::vector<Slope>& sl) {
      for (index_t i = 0; i < n; ++i) sl[static_cast<std::size_t>(i)].a = static_cast<double>(i) / static_cast<double>(n - 1);
    });
    ck.check("drecency", g.authors.recency,
             [&](const R& e) { return loss(S, P, W, Gn, Wq, Wk, rec + e, X.theta); }, Mr);
  }
  DepthInstance K = I;
  K.g_old = g_routed;
  check_coupling_coordinates(
      ck, K, F, g.depth, [&](const Tensor<R>& p) { return loss(S, p, W, Gn, Wq, Wk, rec, X.theta); },
      [&](const DepthOptions& o) { return loss(S, P, W, Gn, Wq, Wk, rec, o.theta); });
  return ck.sum;
}

}  // namespace oasis::depth_grad_test
