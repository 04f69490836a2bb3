// oasis/grad/depth_backward.hpp — the backward of depth routing (docs/spec.md §3–4, §8).
//
// Per token, over candidates i = 0..n-1 (forward: depth.hpp):
//   x_i = g_old_i - beta Dpsi_i,  g_i = clamp(x_i, -L, L),  alpha = Softmax1(g) (null logit 0) or softmax(g),
//   h = sum_i alpha_i s_i.
// With incoming gradients dh [d] and, optionally, dalpha_i and dalpha_null of the weights:
//   dalpha_i   += <dh, s_i>                       (the mix; the depth null's value is 0)
//   dg, (ds)    normalize_row_backward with dp = dalpha, dp_null = dalpha_null, dlse = 0
//   ds_i        = alpha_i dh                      (sources, through the mix)
//   then the coupling backward (grad/coupling_backward.hpp): clamp, dg_old, dDpsi, dbeta, dpsi.
// dbeta is summed over tokens and candidates; beta_raw = softplus(theta) (or the given beta) is
// capped at beta_max (the cap is a clamp: beyond it the gradient is 0, at it the gradient passes).
// Without coupling g = g_old and psi, beta, theta receive 0.
#pragma once

#include <vector>

#include "oasis/ops/depth.hpp"
#include "oasis/grad/coupling_backward.hpp"
#include "oasis/grad/normalizer_backward.hpp"

namespace oasis {

/// Incoming gradients (cotangents) of attn_res_route's outputs.
template <class T>
struct DepthCotangents {
  Tensor<T> h;           ///< dL/dh [N, d], required
  Tensor<T> alpha;       ///< dL/dalpha [n, N]; empty: 0
  Tensor<T> alpha_null;  ///< dL/dalpha_null [N]; empty: 0
};

/// Gradients of a loss with respect to attn_res_route's inputs and coupling parameters.
template <class T>
struct DepthGrads {
  Tensor<T> sources;  ///< [n, N, d], through the mix h = sum_i alpha_i s_i
  Tensor<T> g_old;    ///< [n, N]
  Tensor<T> psi;      ///< [n, N]; 0 for candidates whose psi is not read
  T beta = T(0);      ///< dL/dbeta_raw, beta_raw = DepthOptions::beta when given, else softplus(theta) (before the cap)
  T theta = T(0);     ///< dL/dtheta (0 when DepthOptions::beta is given)
};

/// Gradients of depth_weights for one token (dbeta is the gradient of the capped beta).
template <class T>
struct DepthWeightsGrads {
  Vec<T> g_old, psi;
  T beta;
};

/// beta_raw: DepthOptions::beta when given, else softplus(theta) (depth_beta caps it at beta_max).
template <class T>
T depth_beta_raw(const DepthOptions& opt) {
  return opt.beta ? T(*opt.beta) : softplus(T(opt.theta));
}

/// Backward of depth_weights given its forward result `w` (on g_old, kinds, opt) and dL/dalpha,
/// dL/dalpha_null.
template <class T>
DepthWeightsGrads<T> depth_weights_backward(const DepthWeights<T>& w, const Vec<T>& g_old,
                                            const std::vector<SourceKind>& kinds, const DepthOptions& opt,
                                            const Vec<T>& dalpha, const T& dalpha_null) {
  const index_t n = g_old.size();
  OASIS_REQUIRE(dalpha.size() == n, "dalpha", "has ", dalpha.size(), " entries but g_old has ", n);
  Vec<T> dg(n);
  normalize_row_backward(opt.normalizer, w.alpha.data(), w.alpha_null, n, dalpha.data(), dalpha_null, T(0), dg.data());
  DepthWeightsGrads<T> r{dg, Vec<T>::Zero(n), T(0)};
  if (!opt.coupling) return r;
  const CouplingGrads<T> c = couple_depth_logits_backward(g_old, w.dpsi, depth_beta<T>(opt), dg, opt.coupling_options);
  r.g_old = c.g_old;
  r.psi = centre_null_statistic_backward(c.dpsi, kinds, opt.coupling_options);
  r.beta = c.beta;
  return r;
}

/// Backward of depth_weights(g_old, psi, kinds, opt) for one token given dL/dalpha and
/// dL/dalpha_null (recomputes the forward).
template <class T>
DepthWeightsGrads<T> depth_weights_backward(const Vec<T>& g_old, const Vec<T>& psi, const std::vector<SourceKind>& kinds,
                                            const DepthOptions& opt, const Vec<T>& dalpha, const T& dalpha_null) {
  return depth_weights_backward(depth_weights(g_old, psi, kinds, opt), g_old, kinds, opt, dalpha, dalpha_null);
}

/// Validates the cotangents of attn_res_route; throws naming the argument.
template <class T>
void check_depth_cotangents(const RouteShape& s, const DepthCotangents<T>& d) {
  OASIS_REQUIRE(d.h.shape() == (Shape{s.N, s.d}), "dh", "shape ", shape_str(d.h.shape()), " is not [N, d] = [", s.N, ", ",
                s.d, "]");
  OASIS_REQUIRE(d.alpha.empty() || d.alpha.shape() == (Shape{s.n, s.N}), "dalpha", "shape ", shape_str(d.alpha.shape()),
                " is not [n, N] = [", s.n, ", ", s.N, "]");
  OASIS_REQUIRE(d.alpha_null.empty() || d.alpha_null.shape() == (Shape{s.N}), "dalpha_null", "shape ",
                shape_str(d.alpha_null.shape()), " is not [N] = [", s.N, "]");
  require_finite(d.h, "dh");
  require_finite(d.alpha, "dalpha");
  require_finite(d.alpha_null, "dalpha_null");
}

/// The reference backward of attn_res_route(sources, g_old, psi, kinds, opt).
template <class T>
DepthGrads<T> attn_res_route_backward(const Tensor<T>& sources, const Tensor<T>& g_old, const Tensor<T>& psi,
                                      const std::vector<SourceKind>& kinds, const DepthOptions& opt,
                                      const DepthCotangents<T>& d) {
  const RouteShape s = check_route_shapes(sources, g_old, psi, kinds);
  require_finite(sources, "sources");
  check_depth_cotangents(s, d);
  const auto [n, N, dim] = s;
  DepthGrads<T> r{Tensor<T>({n, N, dim}), Tensor<T>({n, N}), Tensor<T>({n, N})};
  T dbeta(0);
  Vec<T> g(n), ps(n), da(n);
  for (index_t t = 0; t < N; ++t) {
    const T* dh = d.h.ptr(t);
    for (index_t i = 0; i < n; ++i) {
      g[i] = g_old(i, t);
      ps[i] = psi(i, t);
      const T* si = sources.ptr(i, t);
      T acc(0);
      for (index_t c = 0; c < dim; ++c) acc += dh[c] * si[c];
      da[i] = d.alpha.empty() ? acc : T(acc + d.alpha(i, t));
    }
    const T dan = d.alpha_null.empty() ? T(0) : d.alpha_null[t];
    const DepthWeights<T> fw = depth_weights(g, ps, kinds, opt);
    const DepthWeightsGrads<T> w = depth_weights_backward(fw, g, kinds, opt, da, dan);
    for (index_t i = 0; i < n; ++i) {
      r.g_old(i, t) = w.g_old[i];
      r.psi(i, t) = w.psi[i];
      T* ds = r.sources.ptr(i, t);
      for (index_t c = 0; c < dim; ++c) ds[c] = fw.alpha[i] * dh[c];
    }
    dbeta += w.beta;
  }
  if (opt.coupling) {
    r.beta = coupling_beta_cap_backward(depth_beta_raw<T>(opt), dbeta, opt.coupling_options);
    if (!opt.beta) r.theta = r.beta * sigmoid(T(opt.theta));
  }
  return r;
}

}  // namespace oasis
