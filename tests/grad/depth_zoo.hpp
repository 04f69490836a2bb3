// tests/grad/depth_zoo.hpp — an independent depth-routing backward written straight from
// docs/spec.md §8, with one injected mistake (or none), and the glue to judge it with
// `oasis-verify compare` (op depth_backward). Shared by the zoo of mistakes
// (test_depth_backward_zoo.cpp) and the zoo of designs (test_depth_backward_designs.cpp).
//
// `store`: the type the implementation keeps its intermediates in. f32 (default): every value in T.
// f16 / bf16: torch eager code on 16-bit tensors — the weights, dalpha, D, each elementwise result
// and the gradients rounded to that type, the long sums (<dh, s_i>, over the candidates, dbeta
// over the tokens) accumulated in T.
#pragma once

#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "depth_grad_support.hpp"
#include "oasis/io/dtype.hpp"
#include "oasis/verify/compare.hpp"

namespace oasis::depth_grad_test {

enum class DepthMutant {
  none,                   ///< correct
  clamp_passes_through,   ///< an active score clamp passes the gradient
  cap_passes_through,     ///< an active beta cap passes the gradient
  beta_sign_flipped,      ///< dbeta = +sum dx Dpsi
  centring_mean_dropped,  ///< dpsi = dDpsi (the mean's gradient left out)
  d_without_null,         ///< D from weights that exclude the depth null: D / (1 - alpha_null)
  theta_without_sigmoid,  ///< dtheta = dbeta (softplus' chain rule left out)
  dalpha_null_dropped,    ///< D without alpha_null dalpha_null (the null weight's cotangent ignored)
  mix_without_null,       ///< ds_i = alpha_i / (1 - alpha_null) dh (the mix's weights renormalised)
};

inline const char* name_of(DepthMutant m) {
  switch (m) {
    case DepthMutant::none: return "depth_zoo_reference";
    case DepthMutant::clamp_passes_through: return "gradient_through_active_score_clamp";
    case DepthMutant::cap_passes_through: return "gradient_through_active_beta_cap";
    case DepthMutant::beta_sign_flipped: return "coupling_beta_gradient_wrong_sign";
    case DepthMutant::centring_mean_dropped: return "centring_mean_gradient_dropped";
    case DepthMutant::d_without_null: return "depth_D_without_the_null";
    case DepthMutant::theta_without_sigmoid: return "theta_gradient_without_sigmoid";
    case DepthMutant::dalpha_null_dropped: return "dalpha_null_dropped_from_D";
    case DepthMutant::mix_without_null: return "mix_gradient_with_weights_without_the_null";
  }
  return "?";
}

/// The depth-routing backward of docs/spec.md §8 with mistake mu, intermediates kept in `store`.
template <class T>
DepthGrads<T> zoo_depth_backward(const DepthInstance& I, DepthMutant mu, io::DType store = io::DType::f32) {
  using std::exp;
  using Mu = DepthMutant;
  const bool r16 = store == io::DType::f16 || store == io::DType::bf16;
  auto st = [&](const T& x) { return r16 ? T(io::round_to_dtype(static_cast<double>(x), store)) : x; };
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
      mean = st(mean / T(paper ? count : n));
      for (index_t i = 0; i < n; ++i)
        if (paper ? (count >= 2 && ev(i)) : true) dp[static_cast<std::size_t>(i)] = st((ev(i) ? T(I.psi(i, t)) : T(0)) - mean);
    }
    T M = null ? T(0) : neg_inf<T>(), S(0);
    for (index_t i = 0; i < n; ++i) {
      const T xi = st(T(I.g_old(i, t)) - st(beta * dp[static_cast<std::size_t>(i)]));
      x[static_cast<std::size_t>(i)] = xi;
      const T gi = I.opt.coupling ? (xi > L ? L : (xi < -L ? -L : xi)) : xi;
      a[static_cast<std::size_t>(i)] = gi;
      if (gi > M) M = gi;
    }
    T an = null ? exp(-M) : T(0);
    S = an;
    for (auto& v : a) S += (v = exp(v - M));
    an = st(an / S);
    for (auto& v : a) v = st(v / S);
    const T dan = I.dalpha_null.empty() ? T(0) : T(I.dalpha_null[t]);
    T D = mu == Mu::dalpha_null_dropped ? T(0) : an * dan;
    const T mix = mu == Mu::mix_without_null ? T(1) - an : T(1);
    for (index_t i = 0; i < n; ++i) {
      const std::size_t ii = static_cast<std::size_t>(i);
      T s(0);
      for (index_t c = 0; c < d; ++c) s += T(I.dh(t, c)) * T(I.sources(i, t, c));
      da[ii] = st(st(s) + (I.dalpha.empty() ? T(0) : T(I.dalpha(i, t))));
      D += a[ii] * da[ii];
      for (index_t c = 0; c < d; ++c) g.sources(i, t, c) = st(a[ii] / mix * T(I.dh(t, c)));
    }
    D = st(D);
    if (mu == Mu::d_without_null) D = st(D / (T(1) - an));
    std::vector<T> ddp(dp.size());
    for (index_t i = 0; i < n; ++i) {
      const std::size_t ii = static_cast<std::size_t>(i);
      const T dg = st(a[ii] * st(da[ii] - D));
      const bool pass = !I.opt.coupling || mu == Mu::clamp_passes_through || (!(x[ii] > L) && !(x[ii] < -L));
      dx[ii] = pass ? dg : T(0);
      g.g_old(i, t) = dx[ii];
      ddp[ii] = st(-beta * dx[ii]);
      dbeta += (mu == Mu::beta_sign_flipped ? T(1) : T(-1)) * dx[ii] * dp[ii];
    }
    if (!I.opt.coupling || (paper && count < 2)) continue;
    T mean(0);
    for (index_t i = 0; i < n; ++i)
      if (!paper || ev(i)) mean += ddp[static_cast<std::size_t>(i)];
    mean = st(mean / T(paper ? count : n));
    if (mu == Mu::centring_mean_dropped) mean = T(0);
    for (index_t i = 0; i < n; ++i)
      if (ev(i)) g.psi(i, t) = st(ddp[static_cast<std::size_t>(i)] - mean);
  }
  if (I.opt.coupling) {
    g.beta = (cap_ok || mu == Mu::cap_passes_through) ? dbeta : T(0);
    if (!I.opt.beta) g.theta = g.beta * (mu == Mu::theta_without_sigmoid ? T(1) : sigmoid(T(I.opt.theta)));
  }
  return g;
}

/// The zoo's two small cases: paper_v2 with the weights' cotangents (centring, D, theta), and the
/// authors' conventions with the score clamp (1.0) and the beta cap (0.75) active.
inline DepthCase zoo_case_paper() {
  DepthCase a{"zoo_paper", 5, 3, 3, kinds_of("iahah")};
  a.opt.theta = 0.5;
  a.dalpha_null = a.dalpha = true;
  return a;
}
inline DepthCase zoo_case_clamps() {
  DepthCase b{"zoo_clamps", 4, 4, 2, kinds_of("iaha")};
  b.opt.coupling_options = CouplingOptions::authors_code();
  b.opt.coupling_options.score_clamp = 1.0;
  b.opt.coupling_options.beta_max = 0.75;
  b.opt.theta = 2.0;
  b.g_scale = 1.5;
  return b;
}

inline std::string depth_options_json(const DepthInstance& I) {
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

/// `oasis-verify compare` of gradients `g` of instance I: inputs stored in `in`, the gradients of
/// sources, g_old and psi in `out` (beta and theta in float32).
template <class T>
verify::CompareReport compare_depth(const DepthInstance& I, const DepthGrads<T>& g, const verify::CompareOptions& co = {},
                                    io::DType in = io::DType::f32, io::DType out = io::DType::f32) {
  auto put = [](io::TensorMap& m, const char* name, const Tensor<double>& t, io::DType dt) {
    if (!t.empty()) m.emplace(name, io::StoredTensor{dt, t});
  };
  auto rounded = [out](Tensor<double> x) {
    for (index_t i = 0; i < x.size(); ++i) x[i] = io::round_to_dtype(x[i], out);
    return x;
  };
  io::TensorMap im, om;
  put(im, "sources", I.sources, in);
  put(im, "g_old", I.g_old, io::DType::f32);
  put(im, "psi", I.psi, io::DType::f32);
  put(im, "grad_h", I.dh, in);
  put(im, "grad_alpha", I.dalpha, io::DType::f32);
  put(im, "grad_alpha_null", I.dalpha_null, io::DType::f32);
  put(om, "grad_sources", rounded(g.sources.template cast<double>()), out);
  put(om, "grad_g_old", rounded(g.g_old.template cast<double>()), out);
  put(om, "grad_psi", rounded(g.psi.template cast<double>()), out);
  put(om, "grad_beta", Tensor<double>({1}, {static_cast<double>(g.beta)}), io::DType::f32);
  put(om, "grad_theta", Tensor<double>({1}, {static_cast<double>(g.theta)}), io::DType::f32);
  return verify::check("depth_backward", im, om, io::json::parse(depth_options_json(I)), co);
}

}  // namespace oasis::depth_grad_test
