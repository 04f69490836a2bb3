// Depth routing backward (docs/spec.md §3–4, §8): psi, coupling (both centrings, both head-less rules,
// clamps, beta via theta), the depth normaliser and the mix; the Kimi pseudo-query logits; the
// routers (Kimi and the authors') with their sources' total gradient. mp50 gradients against
// mp50 central finite differences with a derived tolerance; identities and kink conventions;
// float/double within the derived backward bound; the zoo of correct and wrong backward
// implementations through the finite-difference check and `oasis-verify compare`.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fd_support.hpp"
#include "oasis/grad/grad.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis_test.hpp"

using namespace oasis;
using R = mp50;
namespace fd = oasis::test::fd;

namespace {

std::uint64_t base_seed() {
  const char* s = std::getenv("OASIS_GRAD_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 2500;
}

constexpr double kPhi1 = 0.3850, kPhi2 = 1.0, kPhi3 = 1.9323, kPsi1 = 1.0, kPsi2 = 0.8587, kPsi3 = 3.0;  // RMSNorm, below
constexpr double kSig1 = 0.25, kSig2 = 0.0963, kSig3 = 0.125;  // max |sigmoid'|, |sigmoid''|, |sigmoid'''|

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

DepthInstance make_depth(const DepthCase& c, std::uint64_t seed) {
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
DepthFacts depth_facts(const Tensor<double>& sources, const Tensor<double>& g_old, const DepthInstance& I, double margin) {
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
double token_m3(const DepthFacts& F, index_t t, const std::vector<Slope>& sl) {
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
double dcentre(const DepthInstance& I, index_t i, index_t r) {
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

fd::Tolerance depth_tolerance(const DepthFacts& F, index_t n, index_t N, index_t d) {
  fd::Tolerance t;
  t.n_ops = 8.0 * static_cast<double>(n * N * (d + 32));
  t.Z = 64;
  t.F_abs = F.F_abs;
  t.G_abs = 64 * F.F_abs;
  return t;
}

/// psi and theta / beta coordinates of a routing whose routed logits are `g_routed` (the routing
/// half of every router); `loss_psi(psi')` and `loss_opt(opt')` evaluate the whole loss.
void check_coupling_coordinates(Checker& ck, const DepthInstance& I, const DepthFacts& F, const DepthGrads<R>& g,
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
fd::Summary fd_check_depth(const DepthInstance& I, const DepthGrads<R>& g, long stop_after = 0) {
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

std::vector<SourceKind> kinds_of(const std::string& s) {
  std::vector<SourceKind> k;
  for (char ch : s) k.push_back(ch == 'i' ? SourceKind::initial : ch == 'a' ? SourceKind::attention : SourceKind::headless);
  return k;
}

const std::vector<DepthCase>& depth_cases() {
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

}  // namespace

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

// ---- the Kimi pseudo-query logits ---------------------------------------------------------------

namespace {

/// Bounds on |g'|, |g''|, |g'''| of g(tau) = w^T RMSNorm(x + tau e_c): with y = x_c + tau,
/// K = sum_{c' != c} x_c'^2 + d eps, g = sqrt(d) (W' phi(y) + kappa psi(y)), phi = (y^2 + K)^-1/2,
/// psi = y phi, W' = sum_{c' != c} w gain x, kappa = w_c gain_c; |phi^(k)| <= kPhi_k K^-(k+1)/2,
/// |psi^(k)| <= kPsi_k K^-k/2 (maxima of the scaled functions; the constants round them up).
std::array<double, 3> rms_logit_derivative_bounds(const Tensor<double>& x, index_t i, index_t t, index_t c,
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

KimiInstance make_kimi(index_t n, index_t N, index_t d, bool gain, std::uint64_t seed) {
  auto rng = oasis::test::make_rng(seed);
  KimiInstance K;
  K.sources = oasis::test::randn<float>({n, N, d}, rng).cast<double>();
  K.w = oasis::test::randn<float>({d}, rng).cast<double>();
  if (gain) K.gain = oasis::test::uniform<float>({d}, rng, 0.5, 1.5).cast<double>();
  K.dg = oasis::test::randn<float>({n, N}, rng).cast<double>();
  return K;
}

fd::Summary fd_check_kimi(const KimiInstance& K, const PseudoQueryGrads<R>& g, long stop_after = 0) {
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

}  // namespace

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

namespace {

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

RouterInstance make_router(bool authors, const std::string& kinds, bool coupled, std::uint64_t seed) {
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
fd::Summary fd_check_router(const RouterInstance& X, const model::RouteGrads<R>& g, long stop_after = 0) {
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

}  // namespace

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

// ---- the zoo ------------------------------------------------------------------------------------

namespace {

enum class Mutant {
  none,                   ///< correct
  clamp_passes_through,   ///< an active score clamp passes the gradient
  cap_passes_through,     ///< an active beta cap passes the gradient
  beta_sign_flipped,      ///< dbeta = +sum dx Dpsi
  centring_mean_dropped,  ///< dpsi = dDpsi (the mean's gradient left out)
  d_without_null,         ///< D from weights that exclude the depth null: D / (1 - alpha_null)
  theta_without_sigmoid,  ///< dtheta = dbeta (softplus' chain rule left out)
};

const char* name_of(Mutant m) {
  switch (m) {
    case Mutant::none: return "depth_zoo_reference";
    case Mutant::clamp_passes_through: return "gradient_through_active_score_clamp";
    case Mutant::cap_passes_through: return "gradient_through_active_beta_cap";
    case Mutant::beta_sign_flipped: return "coupling_beta_gradient_wrong_sign";
    case Mutant::centring_mean_dropped: return "centring_mean_gradient_dropped";
    case Mutant::d_without_null: return "depth_D_without_the_null";
    case Mutant::theta_without_sigmoid: return "theta_gradient_without_sigmoid";
  }
  return "?";
}

/// An independent depth-routing backward (straight from docs/spec.md §8), with one injected mistake.
template <class T>
DepthGrads<T> zoo_depth_backward(const DepthInstance& I, Mutant mu) {
  using std::exp;
  const index_t n = I.g_old.dim(0), N = I.g_old.dim(1), d = I.sources.dim(2);
  const CouplingOptions& co = I.opt.coupling_options;
  const bool null = I.opt.normalizer == RowNorm::softmax1;
  auto ev = [&](index_t i) { return has_null_evidence(I.kinds[static_cast<std::size_t>(i)], co.headless); };
  index_t count = 0;
  for (index_t i = 0; i < n; ++i) count += ev(i) ? 1 : 0;
  const bool paper = co.centring == Centring::paper_v2;
  const T raw = I.opt.beta ? T(*I.opt.beta) : softplus(T(I.opt.theta));
  const T cap(co.beta_max), L(co.score_clamp);
  const bool cap_ok = !(raw > cap);
  const T beta = I.opt.coupling ? (cap_ok ? raw : cap) : T(0);
  DepthGrads<T> g{Tensor<T>({n, N, d}), Tensor<T>({n, N}), Tensor<T>({n, N})};
  T dbeta(0);
  for (index_t t = 0; t < N; ++t) {
    std::vector<T> dp(static_cast<std::size_t>(n), T(0)), x(dp.size()), a(dp.size()), da(dp.size()), dx(dp.size());
    if (I.opt.coupling) {  // Dpsi
      T mean(0);
      for (index_t i = 0; i < n; ++i)
        if (ev(i)) mean += T(I.psi(i, t));
      mean /= T(paper ? count : n);
      for (index_t i = 0; i < n; ++i)
        if (paper ? (count >= 2 && ev(i)) : true) dp[static_cast<std::size_t>(i)] = (ev(i) ? T(I.psi(i, t)) : T(0)) - mean;
    }
    T M = null ? T(0) : neg_inf<T>(), S(0);
    for (index_t i = 0; i < n; ++i) {
      const T xi = T(I.g_old(i, t)) - beta * dp[static_cast<std::size_t>(i)];
      x[static_cast<std::size_t>(i)] = xi;
      const T gi = I.opt.coupling ? (xi > L ? L : (xi < -L ? -L : xi)) : xi;
      a[static_cast<std::size_t>(i)] = gi;
      if (gi > M) M = gi;
    }
    T an = null ? exp(-M) : T(0);
    S = an;
    for (auto& v : a) S += (v = exp(v - M));
    an /= S;
    for (auto& v : a) v /= S;
    const T dan = I.dalpha_null.empty() ? T(0) : T(I.dalpha_null[t]);
    T D = an * dan;
    for (index_t i = 0; i < n; ++i) {
      T s(0);
      for (index_t c = 0; c < d; ++c) s += T(I.dh(t, c)) * T(I.sources(i, t, c));
      da[static_cast<std::size_t>(i)] = s + (I.dalpha.empty() ? T(0) : T(I.dalpha(i, t)));
      D += a[static_cast<std::size_t>(i)] * da[static_cast<std::size_t>(i)];
      for (index_t c = 0; c < d; ++c) g.sources(i, t, c) = a[static_cast<std::size_t>(i)] * T(I.dh(t, c));
    }
    if (mu == Mutant::d_without_null) D /= (T(1) - an);
    std::vector<T> ddp(dp.size());
    for (index_t i = 0; i < n; ++i) {
      const std::size_t ii = static_cast<std::size_t>(i);
      const T dg = a[ii] * (da[ii] - D);
      const bool pass = !I.opt.coupling || mu == Mutant::clamp_passes_through || (!(x[ii] > L) && !(x[ii] < -L));
      dx[ii] = pass ? dg : T(0);
      g.g_old(i, t) = dx[ii];
      ddp[ii] = -beta * dx[ii];
      dbeta += (mu == Mutant::beta_sign_flipped ? T(1) : T(-1)) * dx[ii] * dp[ii];
    }
    if (!I.opt.coupling || (paper && count < 2)) continue;
    T mean(0);
    for (index_t i = 0; i < n; ++i)
      if (!paper || ev(i)) mean += ddp[static_cast<std::size_t>(i)];
    mean /= T(paper ? count : n);
    if (mu == Mutant::centring_mean_dropped) mean = T(0);
    for (index_t i = 0; i < n; ++i)
      if (ev(i)) g.psi(i, t) = ddp[static_cast<std::size_t>(i)] - mean;
  }
  if (I.opt.coupling) {
    g.beta = (cap_ok || mu == Mutant::cap_passes_through) ? dbeta : T(0);
    if (!I.opt.beta) g.theta = g.beta * (mu == Mutant::theta_without_sigmoid ? T(1) : sigmoid(T(I.opt.theta)));
  }
  return g;
}

io::TensorMap as_map(std::initializer_list<std::pair<const char*, Tensor<double>>> l) {
  io::TensorMap m;
  for (const auto& [name, t] : l)
    if (!t.empty()) m.emplace(name, io::StoredTensor{io::DType::f32, t});
  return m;
}

std::string depth_options_json(const DepthInstance& I) {
  const CouplingOptions& co = I.opt.coupling_options;
  std::string k = "[";
  for (std::size_t i = 0; i < I.kinds.size(); ++i)
    k += std::string(i ? ", " : "") + "\"" +
         (I.kinds[i] == SourceKind::initial ? "initial" : I.kinds[i] == SourceKind::attention ? "attention" : "headless") + "\"";
  k += "]";
  auto num = [](double x) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", std::isfinite(x) ? x : 1e308);
    return std::string(buf);
  };
  std::string o = "{\"kinds\": " + k + ", \"centring\": \"" + std::string(to_string(co.centring)) + "\", \"headless\": \"" +
                  std::string(to_string(co.headless)) + "\", \"beta_max\": " + num(co.beta_max) +
                  ", \"score_clamp\": " + num(co.score_clamp) + ", \"normalizer\": \"" +
                  std::string(to_string(I.opt.normalizer)) + "\", \"coupling\": " + (I.opt.coupling ? "true" : "false");
  if (I.opt.beta) o += ", \"beta\": " + num(*I.opt.beta);
  else o += ", \"theta\": " + num(I.opt.theta);
  return o + "}";
}

verify::CompareReport compare_float(const DepthInstance& I, const DepthGrads<float>& g) {
  const io::TensorMap in = as_map({{"sources", I.sources}, {"g_old", I.g_old}, {"psi", I.psi}, {"grad_h", I.dh},
                                   {"grad_alpha", I.dalpha}, {"grad_alpha_null", I.dalpha_null}});
  const io::TensorMap out = as_map({{"grad_sources", g.sources.cast<double>()}, {"grad_g_old", g.g_old.cast<double>()},
                                    {"grad_psi", g.psi.cast<double>()},
                                    {"grad_beta", Tensor<double>({1}, {static_cast<double>(g.beta)})},
                                    {"grad_theta", Tensor<double>({1}, {static_cast<double>(g.theta)})}});
  return verify::check("depth_backward", in, out, io::json::parse(depth_options_json(I)));
}

/// The zoo's instances: paper_v2 with dalpha_null (centring, D, theta), and the authors' clamps
/// with the score clamp and the beta cap active.
std::vector<DepthInstance> zoo_instances() {
  DepthCase a{"zoo_paper", 5, 3, 3, kinds_of("iahah")};
  a.opt.theta = 0.5;
  a.dalpha_null = a.dalpha = true;
  DepthCase b{"zoo_clamps", 4, 4, 2, kinds_of("iaha")};
  b.opt.coupling_options = CouplingOptions::authors_code();
  b.opt.coupling_options.score_clamp = 1.0;
  b.opt.coupling_options.beta_max = 0.75;
  b.opt.theta = 2.0;
  b.g_scale = 1.5;
  return {make_depth(a, base_seed() + 90), make_depth(b, base_seed() + 91)};
}

}  // namespace

TEST(DepthBackwardZoo, CorrectImplementationsPass) {
  for (const DepthInstance& I : zoo_instances()) {
    const fd::Summary s = fd_check_depth(I, zoo_depth_backward<R>(I, Mutant::none));
    EXPECT_TRUE(s.ok()) << s.first;
    for (const verify::CompareReport& r :
         {compare_float(I, zoo_depth_backward<float>(I, Mutant::none)),
          compare_float(I, attn_res_route_backward(I.sources.cast<float>(), I.g_old.cast<float>(), I.psi.cast<float>(),
                                                   I.kinds, I.opt, depth_cot<float>(I)))})
      EXPECT_TRUE(r.passed) << verify::format_report(r);
  }
}

TEST(DepthBackwardZoo, EveryMutantFailsBothChecks) {
  const std::vector<DepthInstance> zoo = zoo_instances();
  for (Mutant mu : {Mutant::clamp_passes_through, Mutant::cap_passes_through, Mutant::beta_sign_flipped,
                    Mutant::centring_mean_dropped, Mutant::d_without_null, Mutant::theta_without_sigmoid}) {
    SCOPED_TRACE(name_of(mu));
    bool fd_caught = false, cmp_caught = false;
    std::string failed;
    for (const DepthInstance& I : zoo) {
      fd_caught = fd_caught || !fd_check_depth(I, zoo_depth_backward<R>(I, mu), 1).ok();
      const verify::CompareReport r = compare_float(I, zoo_depth_backward<float>(I, mu));
      cmp_caught = cmp_caught || !r.passed;
      for (const auto& t : r.tensors)
        if (!t.passed) failed += " " + t.name + " (err/bound " + std::to_string(t.worst_ratio) + ")";
    }
    EXPECT_TRUE(fd_caught) << "the finite-difference check missed " << name_of(mu);
    EXPECT_TRUE(cmp_caught) << "compare missed " << name_of(mu);
    std::printf("mutant %-38s FD: %s; compare FAIL:%s\n", name_of(mu), fd_caught ? "FAIL" : "pass", failed.c_str());
  }
}

TEST(DepthBackwardZoo, KimiMutantsFail) {
  // RMSNorm backward without its projection term, and a router whose sources miss the key path.
  KimiInstance K = make_kimi(3, 2, 4, true, base_seed() + 95);
  PseudoQueryGrads<R> g = pseudo_query_logits_backward(K.sources.cast<R>(), K.w.cast<R>(), K.gain.cast<R>(),
                                                       K.dg.cast<R>(), K.opt);
  for (index_t i = 0; i < 3; ++i)
    for (index_t t = 0; t < 2; ++t) {  // projection dropped: ds = inv gain w dg
      double ss = 0;
      for (index_t c = 0; c < 4; ++c) ss += K.sources(i, t, c) * K.sources(i, t, c);
      const R inv = R(1) / boost::multiprecision::sqrt(R(ss) / 4 + R(K.opt.eps));
      for (index_t c = 0; c < 4; ++c) g.sources(i, t, c) = inv * R(K.gain[c]) * R(K.w[c]) * R(K.dg(i, t));
    }
  EXPECT_FALSE(fd_check_kimi(K, g, 1).ok()) << "rms_projection_dropped";
  const RouterInstance X = make_router(false, "iaha", true, base_seed() + 96);
  model::RouteGrads<R> rg = router_backward<R>(X);
  rg.sources = rg.depth.sources;  // the sources' key path dropped
  EXPECT_FALSE(fd_check_router(X, rg, 1).ok()) << "router_sources_without_key_gradient";
}
