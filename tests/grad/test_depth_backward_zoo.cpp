// The zoo of depth-routing backward implementations (docs/spec.md §8): an independent backward
// written from the contract passes, and each injected mistake fails both the finite-difference
// check (depth_grad_support.hpp) and `oasis-verify compare` (op depth_backward); the Kimi
// RMSNorm and router mutants fail the finite-difference check.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>

#include "oasis/verify/compare.hpp"
#include "router_grad_support.hpp"

using namespace oasis;
using namespace oasis::depth_grad_test;

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
