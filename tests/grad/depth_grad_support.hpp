// tests/grad/depth_grad_support.hpp — depth-routing instances of the backward tests (docs/spec.md
// §3–4, §8): the cases (sources [n, N, d], g_old, psi [n, N], kinds, options, cotangents), the depth
// loss, and the mp50 finite-difference check of attn_res_route_backward with its derived tolerance
// (fd_support.hpp): the facts of a routing, the M3 bound of a token, the psi and theta / beta
// coordinates that every router shares.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "fd_support.hpp"
#include "oasis/grad/grad.hpp"
#include "oasis/oasis.hpp"
#include "oasis_test.hpp"

namespace oasis::depth_grad_test {

using R = mp50;
namespace fd = oasis::test::fd;

inline std::uint64_t base_seed() {
  const char* s = std::getenv("OASIS_GRAD_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 2500;
}

inline constexpr double kSig1 = 0.25, kSig2 = 0.0963, kSig3 = 0.125;  // max |sigmoid'|, |sigmoid''|, |sigmoid'''|

/// A depth-routing instance: sources [n, N, d], g_old, psi [n, N], kinds, options, cotangents.
struct DepthCase {
  std::string name;
  index_t n, N, d;
  std::vector<SourceKind> kinds;
  DepthOptions opt;
  bool dalpha = false, dalpha_null = false;
  double g_scale = 1.0;
};

struct DepthInstance {
  Tensor<double> sources, g_old, psi, dh, dalpha, dalpha_null;
  std::vector<SourceKind> kinds;
  DepthOptions opt;
};

inline DepthInstance make_depth(const DepthCase& c, std::uint64_t seed) {
  auto rng = oasis::test::make_rng(seed);
  DepthInstance I;
  I.sources = oasis::test::randn<float>({c.n, c.N, c.d}, rng).cast<double>();
  I.g_old = oasis::test::randn<float>({c.n, c.N}, rng, c.g_scale).cast<double>();
  I.psi = oasis::test::uniform<float>({c.n, c.N}, rng, 0.0, 1.0).cast<double>();
  I.dh = oasis::test::randn<float>({c.N, c.d}, rng).cast<double>();
  if (c.dalpha) I.dalpha = oasis::test::randn<float>({c.n, c.N}, rng).cast<double>();
  if (c.dalpha_null) I.dalpha_null = oasis::test::randn<float>({c.N}, rng).cast<double>();
  I.kinds = c.kinds;
  I.opt = c.opt;
  return I;
}

template <class T>
DepthCotangents<T> depth_cot(const DepthInstance& I) {
  return {I.dh.cast<T>(), I.dalpha.cast<T>(), I.dalpha_null.cast<T>()};
}

/// The depth loss sum <dh, h> + sum dalpha alpha + sum dalpha_null alpha_null of a routing result.
template <class Route>
R depth_loss(const Route& r, const DepthInstance& I) {
  R f(0);
  for (index_t i = 0; i < r.h.size(); ++i) f += R(I.dh[i]) * r.h[i];
  for (index_t i = 0; i < I.dalpha.size(); ++i) f += R(I.dalpha[i]) * r.alpha[i];
  for (index_t i = 0; i < I.dalpha_null.size(); ++i) f += R(I.dalpha_null[i]) * r.alpha_null[i];
  return f;
}

/// Per-token facts for the M3 bound: incoming gradients c_i = <dh, s_i> + dalpha_i of the candidates,
/// c_null = dalpha_null, whether each candidate's clamp passes, beta, Dpsi, and the centring set.
struct TokenInfo {
  std::vector<double> c, dpsi;
  std::vector<bool> pass;
  double c_null = 0;
};

struct DepthFacts {
  std::vector<TokenInfo> tok;
  bool has_null = false, cap_pass = true;
  double beta = 0, sig = 0;
  double F_abs = 0;
};

/// Facts of the routing of `sources`, `g_old` (the logits as routed: after any uncoupled clamp) and
/// `psi`; asserts that no clamp decision lies within `margin` of its kink (finite differences
/// need a smooth neighbourhood; the kink convention is tested on its own).
inline DepthFacts depth_facts(const Tensor<double>& sources, const Tensor<double>& g_old, const DepthInstance& I, double margin) {
  const index_t n = g_old.dim(0), N = g_old.dim(1), d = sources.dim(2);
  const DepthRoute<R> r = attn_res_route(sources.cast<R>(), g_old.cast<R>(), I.psi.cast<R>(), I.kinds, I.opt);
  DepthFacts F;
  F.has_null = I.opt.normalizer == RowNorm::softmax1;
  const bounds::BetaBound bb = bounds::beta_bound(I.opt, 0.0);
  F.beta = bb.beta;
  F.cap_pass = clamp_passes(bb.raw, -std::numeric_limits<double>::infinity(), I.opt.coupling_options.beta_max);
  if (I.opt.coupling && std::isfinite(I.opt.coupling_options.beta_max))
    EXPECT_GT(std::abs(bb.raw - I.opt.coupling_options.beta_max), margin) << "beta_raw at its cap";
  F.sig = 1.0 / (1.0 + std::exp(-I.opt.theta));
  const double L = I.opt.coupling_options.score_clamp;
  for (index_t t = 0; t < N; ++t) {
    TokenInfo T;
    double cm = 0;
    for (index_t i = 0; i < n; ++i) {
      double x = 0;
      for (index_t c = 0; c < d; ++c) x += I.dh(t, c) * sources(i, t, c);
      if (!I.dalpha.empty()) x += I.dalpha(i, t);
      T.c.push_back(x);
      cm = std::max(cm, std::abs(x));
      T.dpsi.push_back(static_cast<double>(r.dpsi(i, t)));
      const double xi = g_old(i, t) - F.beta * T.dpsi.back();
      const bool coupled = I.opt.coupling;
      T.pass.push_back(!coupled || clamp_passes(xi, -L, L));
      if (coupled && std::isfinite(L)) EXPECT_GT(std::abs(std::abs(xi) - L), margin) << "a coupled logit at its clamp";
    }
    T.c_null = I.dalpha_null.empty() ? 0.0 : I.dalpha_null[t];
    F.F_abs += cm + std::abs(T.c_null);
    F.tok.push_back(T);
  }
  return F;
}

/// A candidate logit's derivatives along the coordinate: a, b, e as values (exact: interval of
/// their variation on the segment) or as bounds on their magnitude (`bound_only`), and c'.
struct Slope {
  double a = 0, b = 0, e = 0, c1 = 0, e_slack = 0;
  bool bound_only = false;
};

/// M3 of token t given the slopes of the candidates' logits (zeroed where a clamp holds the logit).
inline double token_m3(const DepthFacts& F, index_t t, const std::vector<Slope>& sl) {
  const TokenInfo& T = F.tok[static_cast<std::size_t>(t)];
  const double h = fd::kStep;
  std::vector<fd::Category> cats;
  for (std::size_t i = 0; i < T.c.size(); ++i) {
    Slope s = sl[i];
    if (!T.pass[i]) s.a = s.b = s.e = 0;  // an active clamp: the logit is constant near x
    fd::Category k;
    k.c = fd::around(T.c[i], std::abs(s.c1) * h);
    k.c1 = fd::around(s.c1);
    if (s.bound_only) {
      k.a = {-std::abs(s.a), std::abs(s.a)};
      k.b = {-std::abs(s.b), std::abs(s.b)};
      k.e = {-std::abs(s.e), std::abs(s.e)};
    } else {
      k.a = fd::around(s.a, std::abs(s.b) * h + std::abs(s.e) * h * h);
      k.b = fd::around(s.b, std::abs(s.e) * h + s.e_slack * h);
      k.e = fd::around(s.e, s.e_slack * h);
    }
    cats.push_back(k);
  }
  if (F.has_null) {
    fd::Category k;
    k.c = fd::around(T.c_null);
    cats.push_back(k);
  }
  return fd::row_third_derivative_bound(cats, 0.0);
}

/// d Dpsi_i / d psi_r under the centring convention (linear).
inline double dcentre(const DepthInstance& I, index_t i, index_t r) {
  const CouplingOptions& co = I.opt.coupling_options;
  const index_t n = static_cast<index_t>(I.kinds.size());
  auto ev = [&](index_t x) { return has_null_evidence(I.kinds[static_cast<std::size_t>(x)], co.headless); };
  if (!ev(r)) return 0;
  if (co.centring == Centring::paper_v2) {
    index_t count = 0;
    for (index_t x = 0; x < n; ++x) count += ev(x) ? 1 : 0;
    if (count < 2 || !ev(i)) return 0;
    return (i == r ? 1.0 : 0.0) - 1.0 / static_cast<double>(count);
  }
  return (i == r ? 1.0 : 0.0) - 1.0 / static_cast<double>(n);
}

/// FD checks shared by the depth-level losses: g_old-independent coordinates psi, theta (or beta).
/// `loss_at` evaluates the loss with psi / options replaced.
struct Checker {
  fd::Summary sum;
  fd::Tolerance tol;
  void check(const std::string& name, const R& analytic, const std::function<R(const R&)>& f, double M3) {
    if (sum.done()) return;
    const R D = fd::central_difference(f);
    fd::Tolerance t = tol;
    t.M3 = M3;
    sum.add(name, analytic, D, t.value(static_cast<double>(D)));
  }
};

inline fd::Tolerance depth_tolerance(const DepthFacts& F, index_t n, index_t N, index_t d) {
  fd::Tolerance t;
  t.n_ops = 8.0 * static_cast<double>(n * N * (d + 32));
  t.Z = 64;
  t.F_abs = F.F_abs;
  t.G_abs = 64 * F.F_abs;
  return t;
}

/// psi and theta / beta coordinates of a routing whose routed logits are `g_routed` (the routing
/// half of every router); `loss_psi(psi')` and `loss_opt(opt')` evaluate the whole loss.
inline void check_coupling_coordinates(Checker& ck, const DepthInstance& I, const DepthFacts& F, const DepthGrads<R>& g,
                                       const std::function<R(const Tensor<R>&)>& loss_psi,
                                       const std::function<R(const DepthOptions&)>& loss_opt) {
  if (!I.opt.coupling) return;
  const index_t n = I.psi.dim(0), N = I.psi.dim(1);
  const Tensor<R> psi = I.psi.cast<R>();
  for (index_t r = 0; r < n; ++r)
    for (index_t t = 0; t < N; ++t) {
      std::vector<Slope> sl(static_cast<std::size_t>(n));
      for (index_t i = 0; i < n; ++i) sl[static_cast<std::size_t>(i)].a = -F.beta * dcentre(I, i, r);
      ck.check("dpsi[" + std::to_string(r) + ", " + std::to_string(t) + "]", g.psi(r, t),
               [&](const R& e) { Tensor<R> p = psi; p(r, t) += e; return loss_psi(p); }, token_m3(F, t, sl));
    }
  // theta (softplus) or the given beta: every token
  double M3 = 0;
  for (index_t t = 0; t < N; ++t) {
    std::vector<Slope> sl(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) {
      const double dp = F.tok[static_cast<std::size_t>(t)].dpsi[static_cast<std::size_t>(i)];
      Slope& s = sl[static_cast<std::size_t>(i)];
      if (!F.cap_pass) continue;
      if (I.opt.beta) {
        s.a = -dp;
      } else {  // x_i = g_old_i - softplus(theta) Dpsi_i
        s.a = -F.sig * dp;
        s.b = -F.sig * (1 - F.sig) * dp;
        s.e = -F.sig * (1 - F.sig) * (1 - 2 * F.sig) * dp;
        s.e_slack = kSig3 * std::abs(dp);
      }
    }
    M3 += token_m3(F, t, sl);
  }
  if (I.opt.beta)
    ck.check("dbeta", g.beta,
             [&](const R& e) { DepthOptions o = I.opt; o.beta = *I.opt.beta + static_cast<double>(e); return loss_opt(o); }, M3);
  else
    ck.check("dtheta", g.theta,
             [&](const R& e) { DepthOptions o = I.opt; o.theta = I.opt.theta + static_cast<double>(e); return loss_opt(o); },
             M3);
}

/// attn_res_route_backward's gradients against finite differences of the depth loss.
inline fd::Summary fd_check_depth(const DepthInstance& I, const DepthGrads<R>& g, long stop_after = 0) {
  const index_t n = I.g_old.dim(0), N = I.g_old.dim(1), d = I.sources.dim(2);
  const DepthFacts F = depth_facts(I.sources, I.g_old, I, 1e-6);
  Checker ck;
  ck.sum.stop_after = stop_after;
  ck.tol = depth_tolerance(F, n, N, d);
  const Tensor<R> S = I.sources.cast<R>(), G = I.g_old.cast<R>(), P = I.psi.cast<R>();
  auto loss = [&](const Tensor<R>& s, const Tensor<R>& g0, const Tensor<R>& p, const DepthOptions& o) {
    return depth_loss(attn_res_route(s, g0, p, I.kinds, o), I);
  };
  for (index_t i = 0; i < n; ++i)
    for (index_t t = 0; t < N; ++t) {
      for (index_t c = 0; c < d; ++c)  // linear in the sources (through the mix): M3 = 0
        ck.check("dsources" + oasis::test::index_str(S.shape(), S.offset(i, t, c)), g.sources(i, t, c),
                 [&](const R& e) { Tensor<R> x = S; x(i, t, c) += e; return loss(x, G, P, I.opt); }, 0.0);
      std::vector<Slope> sl(static_cast<std::size_t>(n));
      sl[static_cast<std::size_t>(i)].a = 1;
      ck.check("dg_old[" + std::to_string(i) + ", " + std::to_string(t) + "]", g.g_old(i, t),
               [&](const R& e) { Tensor<R> x = G; x(i, t) += e; return loss(S, x, P, I.opt); }, token_m3(F, t, sl));
    }
  check_coupling_coordinates(
      ck, I, F, g, [&](const Tensor<R>& p) { return loss(S, G, p, I.opt); },
      [&](const DepthOptions& o) { return loss(S, G, P, o); });
  return ck.sum;
}

inline std::vector<SourceKind> kinds_of(const std::string& s) {
  std::vector<SourceKind> k;
  for (char ch : s) k.push_back(ch == 'i' ? SourceKind::initial : ch == 'a' ? SourceKind::attention : SourceKind::headless);
  return k;
}

inline const std::vector<DepthCase>& depth_cases() {
  static const std::vector<DepthCase> cases = [] {
    std::vector<DepthCase> c;
    DepthCase x{"paper_v2_inherit", 5, 3, 3, kinds_of("iahah")};
    x.opt.theta = 0.5;
    x.dalpha = x.dalpha_null = true;
    c.push_back(x);
    x = {"paper_v2_no_evidence_softmax", 4, 3, 2, kinds_of("iaha")};
    x.opt.coupling_options.headless = HeadlessRule::no_evidence;
    x.opt.normalizer = RowNorm::softmax;
    x.opt.theta = 1.25;
    x.dalpha = true;
    c.push_back(x);
    x = {"authors_code_clamps_active", 4, 4, 2, kinds_of("iaha")};
    x.opt.coupling_options = CouplingOptions::authors_code();
    x.opt.coupling_options.score_clamp = 1.0;  // several coupled logits beyond +-1
    x.opt.theta = 2.0;
    x.g_scale = 1.5;
    x.dalpha_null = true;
    c.push_back(x);
    x = {"authors_code_no_evidence_beta_given", 4, 3, 3, kinds_of("iahh")};
    x.opt.coupling_options = CouplingOptions::authors_code();
    x.opt.coupling_options.headless = HeadlessRule::no_evidence;
    x.opt.beta = 1.5;
    x.dalpha = true;
    c.push_back(x);
    x = {"beta_cap_active", 3, 3, 2, kinds_of("iaa")};
    x.opt.coupling_options.beta_max = 0.75;  // softplus(2) = 2.13 > 0.75: theta gets 0
    x.opt.theta = 2.0;
    c.push_back(x);
    x = {"no_coupling_aos", 3, 2, 3, kinds_of("iaa")};
    x.opt.coupling = false;
    x.dalpha_null = true;
    c.push_back(x);
    return c;
  }();
  return cases;
}

}  // namespace oasis::depth_grad_test
