// oasis/ops/depth.hpp — depth routing of Attention Residuals (docs/spec.md §3–4).
//
// For target layer l and token t, over candidates i = 0..n-1 with values s_i:
//   g_i      = w_l^T RMSNorm(s_i)                        (Kimi pseudo-query logits)
//   g_new    = g - beta * Dpsi                           (OASIS coupling, oasis/ops/coupling.hpp)
//   alpha_i  = e^{g_i} / (1 + sum_r e^{g_r}),  alpha_null = 1 / (1 + sum_r e^{g_r})   (Softmax1)
//            or plain softmax over depth (Vanilla AttnRes, token-only)
//   h_l      = sum_i alpha_i s_i.
// The depth null value is the zero vector: the null category attenuates the mixture, it is not
// an identity shortcut:  h - h_ref = sum_i alpha_i (s_i - h_ref) - alpha_null h_ref.
#pragma once

#include <optional>
#include <type_traits>
#include <vector>

#include "oasis/ops/coupling.hpp"
#include "oasis/ops/normalizer.hpp"
#include "oasis/core/tensor.hpp"

namespace oasis {

struct DepthOptions {
  RowNorm normalizer = RowNorm::softmax1;  ///< softmax1 (AoS/OASIS, depth-only) or softmax
  bool coupling = true;                    ///< OASIS coupling on/off (off = AoS when softmax1)
  CouplingOptions coupling_options{};      ///< centring convention, head-less rule, clamps
  double theta = -5.0;                     ///< beta = softplus(theta); -5 gives beta ≈ 0.0067153
  std::optional<double> beta;              ///< overrides softplus(theta) (still capped by beta_max)
};

/// Depth routing decision of one token.
template <class T>
struct DepthWeights {
  Vec<T> g;      ///< coupled logits g_new (equal to g_old without coupling)
  Vec<T> dpsi;   ///< centred null statistic (zeros without coupling)
  Vec<T> alpha;  ///< weights of the n candidates
  T alpha_null;  ///< depth null weight (0 for plain softmax)
  T lse;         ///< log(1 + sum e^g) (softmax1) or log(sum e^g) (softmax)
};

template <class T>
T depth_beta(const DepthOptions& opt) {
  if (opt.beta) {
    OASIS_REQUIRE(std::isfinite(*opt.beta) && *opt.beta >= 0, "beta", "must be finite and >= 0");
    const T b(*opt.beta), cap(opt.coupling_options.beta_max);
    return b < cap ? b : cap;
  }
  OASIS_REQUIRE(std::isfinite(opt.theta), "theta", "must be finite");
  return coupling_beta(T(opt.theta), opt.coupling_options);
}

/// Couple (if enabled) and normalise the depth logits of one token.
template <class T>
DepthWeights<T> depth_weights(const Vec<T>& g_old, const Vec<T>& psi, const std::vector<SourceKind>& kinds,
                              const DepthOptions& opt = {}) {
  const index_t n = g_old.size();
  OASIS_REQUIRE(n > 0, "g_old", "no depth candidates (n = 0): layer l attends to at least v_0");
  OASIS_REQUIRE(psi.size() == n, "psi", "has ", psi.size(), " entries but g_old has ", n);
  for (index_t i = 0; i < n; ++i)
    OASIS_REQUIRE(is_finite(g_old[i]), "g_old", "non-finite depth logit ", to_double(g_old[i]),
                  " at candidate ", i);
  DepthWeights<T> w;
  if (opt.coupling) {
    w.dpsi = centre_null_statistic(psi, kinds, opt.coupling_options);
    w.g = couple_depth_logits(g_old, w.dpsi, depth_beta<T>(opt), opt.coupling_options);
  } else {
    OASIS_REQUIRE(static_cast<index_t>(kinds.size()) == n, "kinds", "has ", kinds.size(),
                  " entries but g_old has ", n);
    w.dpsi = Vec<T>::Zero(n);
    w.g = g_old;
  }
  w.alpha.resize(n);
  const RowStats<T> st = normalize_row(opt.normalizer, w.g.data(), n, T(0), w.alpha.data(),
                                       MaskedRow::error, "g");
  w.alpha_null = st.p_null;
  w.lse = st.lse;
  return w;
}

/// h = sum_i alpha_i s_i for sources as rows of an n x d matrix.
template <class T>
Vec<T> attn_res_mix(const Mat<T>& sources, const Vec<T>& alpha) {
  OASIS_REQUIRE(sources.rows() == alpha.size(), "alpha", "has ", alpha.size(),
                " weights but there are ", sources.rows(), " sources");
  Vec<T> h = Vec<T>::Zero(sources.cols());
  for (index_t i = 0; i < sources.rows(); ++i)
    for (index_t c = 0; c < sources.cols(); ++c) h[c] += alpha[i] * sources(i, c);
  return h;
}

/// Depth routing of one layer over N tokens.
template <class T>
struct DepthRoute {
  Tensor<T> h;           ///< [N, d] routed input of the layer
  Tensor<T> alpha;       ///< [n, N]
  Tensor<T> alpha_null;  ///< [N]
  Tensor<T> g;           ///< [n, N] coupled logits
  Tensor<T> dpsi;        ///< [n, N]
};

/// Shape facts of one depth-routing call.
struct RouteShape {
  index_t n, N, d;
};

/// Validates the shapes of attn_res_route's arguments (shared by every backend); throws naming
/// the argument. Values (finite sources and logits, psi in [0, 1]) are checked by the routing.
template <class T>
RouteShape check_route_shapes(const Tensor<T>& sources, const Tensor<T>& g_old, const Tensor<T>& psi,
                              const std::vector<SourceKind>& kinds) {
  require_rank(sources, 3, "sources", "[n, N, d]");
  require_rank(g_old, 2, "g_old", "[n, N]");
  require_rank(psi, 2, "psi", "[n, N]");
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2);
  OASIS_REQUIRE(n > 0 && N > 0 && d > 0, "sources", "empty dimension in ", shape_str(sources.shape()));
  OASIS_REQUIRE(g_old.dim(0) == n && g_old.dim(1) == N, "g_old", "shape ", shape_str(g_old.shape()),
                " does not match sources [n, N] = [", n, ", ", N, "]");
  OASIS_REQUIRE(psi.dim(0) == n && psi.dim(1) == N, "psi", "shape ", shape_str(psi.shape()),
                " does not match sources [n, N] = [", n, ", ", N, "]");
  OASIS_REQUIRE(static_cast<index_t>(kinds.size()) == n, "kinds", "has ", kinds.size(),
                " entries but there are ", n, " sources");
  return {n, N, d};
}

/// Route N tokens over n sources: sources [n, N, d], g_old [n, N], psi [n, N] (entries of
/// candidates without evidence are ignored), kinds[n].
template <class T>
DepthRoute<T> attn_res_route(const Tensor<T>& sources, const Tensor<T>& g_old, const Tensor<T>& psi,
                             const std::vector<SourceKind>& kinds, const DepthOptions& opt = {}) {
  const auto [n, N, d] = check_route_shapes(sources, g_old, psi, kinds);
  require_finite(sources, "sources");

  DepthRoute<T> r{Tensor<T>({N, d}), Tensor<T>({n, N}), Tensor<T>({N}), Tensor<T>({n, N}), Tensor<T>({n, N})};
  Vec<T> g(n), ps(n);
  for (index_t t = 0; t < N; ++t) {
    for (index_t i = 0; i < n; ++i) { g[i] = g_old(i, t); ps[i] = psi(i, t); }
    const DepthWeights<T> w = depth_weights(g, ps, kinds, opt);
    r.alpha_null[t] = w.alpha_null;
    T* h = r.h.ptr(t);
    for (index_t i = 0; i < n; ++i) {
      r.alpha(i, t) = w.alpha[i];
      r.g(i, t) = w.g[i];
      r.dpsi(i, t) = w.dpsi[i];
      const T* si = sources.ptr(i, t);
      for (index_t c = 0; c < d; ++c) h[c] += w.alpha[i] * si[c];
    }
  }
  return r;
}

/// Key RMSNorm of the Kimi depth router.
struct KeyNormOptions {
  double eps = 1e-6;                ///< peers use 1e-6 (default) or 1e-5
  bool compute_in_float32 = false;  ///< evaluate the norm in float32 then cast back (mixed-precision peers)
};

/// RMSNorm(x) = x / sqrt(mean(x^2) + eps) * gain (gain empty = 1) of a length-d row, in place.
template <class T>
void rms_norm_row(const T* x, index_t d, const T* gain, const KeyNormOptions& opt, T* y) {
  using std::sqrt;
  if (opt.compute_in_float32 && !std::is_same_v<T, float>) {
    std::vector<float> xf(static_cast<std::size_t>(d)), yf(static_cast<std::size_t>(d)), gf;
    for (index_t c = 0; c < d; ++c) xf[static_cast<std::size_t>(c)] = static_cast<float>(x[c]);
    if (gain) { gf.resize(static_cast<std::size_t>(d)); for (index_t c = 0; c < d; ++c) gf[static_cast<std::size_t>(c)] = static_cast<float>(gain[c]); }
    KeyNormOptions o = opt;
    o.compute_in_float32 = false;
    rms_norm_row<float>(xf.data(), d, gain ? gf.data() : nullptr, o, yf.data());
    for (index_t c = 0; c < d; ++c) y[c] = T(yf[static_cast<std::size_t>(c)]);
    return;
  }
  T ss(0);
  for (index_t c = 0; c < d; ++c) ss += x[c] * x[c];
  const T inv = T(1) / sqrt(ss / T(d) + T(opt.eps));
  for (index_t c = 0; c < d; ++c) y[c] = x[c] * inv * (gain ? gain[c] : T(1));
}

/// Kimi pseudo-query logits g_i = w^T RMSNorm(s_i): sources [n, N, d], w [d], gain [d] or empty.
/// No temperature and no 1/sqrt(d). Returns [n, N].
template <class T>
Tensor<T> pseudo_query_logits(const Tensor<T>& sources, const Tensor<T>& w, const Tensor<T>& gain = {},
                              const KeyNormOptions& opt = {}) {
  require_rank(sources, 3, "sources", "[n, N, d]");
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2);
  require_rank(w, 1, "w", "[d]");
  OASIS_REQUIRE(w.dim(0) == d, "w", "has ", w.dim(0), " entries, sources have width d = ", d);
  OASIS_REQUIRE(gain.empty() || (gain.rank() == 1 && gain.dim(0) == d), "gain", "shape ",
                shape_str(gain.shape()), " is not [d] = [", d, "]");
  OASIS_REQUIRE(opt.eps > 0 && std::isfinite(opt.eps), "eps", "must be finite and positive");
  require_finite(w, "w");
  Tensor<T> g({n, N});
  std::vector<T> y(static_cast<std::size_t>(d));
  for (index_t i = 0; i < n; ++i)
    for (index_t t = 0; t < N; ++t) {
      rms_norm_row(sources.ptr(i, t), d, gain.empty() ? nullptr : gain.data(), opt, y.data());
      T acc(0);
      for (index_t c = 0; c < d; ++c) acc += w[c] * y[static_cast<std::size_t>(c)];
      g(i, t) = acc;
    }
  return g;
}

}  // namespace oasis
