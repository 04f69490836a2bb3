// oasis/grad/router_backward.hpp — the backward of the depth routers of the AttnRes model (docs/spec.md §4, §8).
//
// A router computes old depth logits from its sources, then routes (oasis/model/router.hpp):
//   Kimi:      g_old = pseudo_query_logits(sources, w, gain)              (grad/pseudo_query_backward.hpp)
//   authors':  g_old = authors_router_logits(sources, W_q, W_k, rec)
//   then, as model::finish_route: without coupling a convention with a score clamp clamps g_old
//   (clamp rule of grad/coupling_backward.hpp), and attn_res_route (grad/depth_backward.hpp).
// The sources receive gradient through the mix and through their keys (and, for the current
// candidate of the authors' router, through the query): RouteGrads::sources is the total.
//
// The authors' logits g_i = (q·k_i) s + rec i/(n-1), q = W_q c, k_i = W_k s_i, s = 1/sqrt(r):
//   dq = s sum_i dg_i k_i,   dk_i = s dg_i q,   dW_q = sum_t dq c^T,   dW_k = sum_{i,t} dk_i s_i^T,
//   dc += W_q^T dq,          ds_i += W_k^T dk_i,   drec = sum_{i,t} dg_i i/(n-1).
#pragma once

#include <vector>

#include "oasis/grad/depth_backward.hpp"
#include "oasis/grad/pseudo_query_backward.hpp"
#include "oasis/model/router.hpp"

namespace oasis::model {

/// Gradients of authors_router_logits(sources, wq, wk, recency).
template <class T>
struct AuthorsLogitGrads {
  Tensor<T> sources;  ///< [n, N, d], through the keys and (last candidate) the query
  Tensor<T> wq, wk;   ///< [r, d]
  T recency = T(0);
};

/// The reference backward of authors_router_logits given dL/dg_old [n, N].
template <class T>
AuthorsLogitGrads<T> authors_router_logits_backward(const Tensor<T>& sources, const Tensor<T>& wq, const Tensor<T>& wk,
                                                    const T& recency, const Tensor<T>& dg) {
  using std::sqrt;
  (void)authors_router_logits(sources, wq, wk, recency);  // validates the arguments as the forward does
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2), rk = wq.dim(0);
  OASIS_REQUIRE(dg.shape() == (Shape{n, N}), "dg", "shape ", shape_str(dg.shape()), " is not [n, N] = [", n, ", ", N, "]");
  require_finite(dg, "dg");
  const T scale = T(1) / sqrt(T(rk));
  AuthorsLogitGrads<T> r{Tensor<T>({n, N, d}), Tensor<T>(wq.shape()), Tensor<T>(wk.shape()), T(0)};
  const std::size_t R = static_cast<std::size_t>(rk);
  std::vector<T> q(R), dq(R);
  std::vector<std::vector<T>> k(static_cast<std::size_t>(n), std::vector<T>(R));
  auto project = [&](const Tensor<T>& W, const T* x, std::vector<T>& y) {
    for (index_t a = 0; a < rk; ++a) {
      T acc(0);
      for (index_t c = 0; c < d; ++c) acc += W(a, c) * x[c];
      y[static_cast<std::size_t>(a)] = acc;
    }
  };
  // W^T dy added to dx, and dy x^T added to dW
  auto project_back = [&](const Tensor<T>& W, const T* x, const std::vector<T>& dy, T* dx, Tensor<T>& dW) {
    for (index_t a = 0; a < rk; ++a) {
      const T da = dy[static_cast<std::size_t>(a)];
      for (index_t c = 0; c < d; ++c) {
        dx[c] += W(a, c) * da;
        dW(a, c) += da * x[c];
      }
    }
  };
  for (index_t t = 0; t < N; ++t) {
    const T* cur = sources.ptr(n - 1, t);
    project(wq, cur, q);
    for (index_t i = 0; i < n; ++i) project(wk, sources.ptr(i, t), k[static_cast<std::size_t>(i)]);
    std::fill(dq.begin(), dq.end(), T(0));
    for (index_t i = 0; i < n; ++i) {
      const T gi = dg(i, t);
      r.recency += gi * (T(i) / T(n - 1));
      const std::vector<T>& ki = k[static_cast<std::size_t>(i)];
      std::vector<T> dk(R);
      for (std::size_t a = 0; a < R; ++a) {
        dq[a] += gi * ki[a];
        dk[a] = (gi * scale) * q[a];
      }
      project_back(wk, sources.ptr(i, t), dk, r.sources.ptr(i, t), r.wk);
    }
    for (std::size_t a = 0; a < R; ++a) dq[a] *= scale;
    project_back(wq, cur, dq, r.sources.ptr(n - 1, t), r.wq);
  }
  return r;
}

/// Gradients of a whole router: logits, the uncoupled clamp, coupling, normaliser and mix.
template <class T>
struct RouteGrads {
  Tensor<T> sources;  ///< [n, N, d], the total: mix + keys (+ query)
  Tensor<T> g_old;    ///< [n, N], dL/dg_old of the router's logits (before the uncoupled clamp)
  DepthGrads<T> depth;             ///< attn_res_route's gradients (sources through the mix only)
  PseudoQueryGrads<T> kimi;        ///< Kimi router: w, gain, sources through the keys
  AuthorsLogitGrads<T> authors;    ///< authors' router: W_q, W_k, recency, sources through keys and query
};

namespace detail {
/// The routing half shared by both routers: returns the depth gradients and dL/dg_old of the raw logits.
template <class T>
DepthGrads<T> route_backward(const Tensor<T>& sources, const Tensor<T>& g_old_raw, const Tensor<T>& psi,
                             const std::vector<SourceKind>& kinds, const DepthOptions& opt, const DepthCotangents<T>& d,
                             Tensor<T>& dg_raw) {
  Tensor<T> g_old = g_old_raw;
  const bool clamp = clamps_uncoupled_logits(opt);
  const T lim(opt.coupling_options.score_clamp);
  if (clamp)
    for (index_t i = 0; i < g_old.size(); ++i) g_old[i] = g_old[i] > lim ? lim : (g_old[i] < -lim ? -lim : g_old[i]);
  DepthGrads<T> dg = attn_res_route_backward(sources, g_old, psi, kinds, opt, d);
  dg_raw = dg.g_old;
  if (clamp)
    for (index_t i = 0; i < dg_raw.size(); ++i)
      if (!clamp_passes(g_old_raw[i], T(-lim), lim)) dg_raw[i] = T(0);
  return dg;
}
}  // namespace detail

/// Backward of the Kimi router (model::kimi_route on stacked sources [n, N, d]).
template <class T>
RouteGrads<T> kimi_route_backward(const Tensor<T>& sources, const Tensor<T>& w, const Tensor<T>& gain,
                                  const KeyNormOptions& key_norm, const Tensor<T>& psi,
                                  const std::vector<SourceKind>& kinds, const DepthOptions& opt,
                                  const DepthCotangents<T>& d) {
  RouteGrads<T> r;
  const Tensor<T> g_old = pseudo_query_logits(sources, w, gain, key_norm);
  r.depth = detail::route_backward(sources, g_old, psi, kinds, opt, d, r.g_old);
  r.kimi = pseudo_query_logits_backward(sources, w, gain, r.g_old, key_norm);
  r.sources = r.depth.sources;
  for (index_t i = 0; i < r.sources.size(); ++i) r.sources[i] += r.kimi.sources[i];
  return r;
}

/// Backward of the authors' router (model::authors_route on stacked sources [n, N, d]).
template <class T>
RouteGrads<T> authors_route_backward(const Tensor<T>& sources, const Tensor<T>& wq, const Tensor<T>& wk, const T& recency,
                                     const Tensor<T>& psi, const std::vector<SourceKind>& kinds, const DepthOptions& opt,
                                     const DepthCotangents<T>& d) {
  RouteGrads<T> r;
  const Tensor<T> g_old = authors_router_logits(sources, wq, wk, recency);
  r.depth = detail::route_backward(sources, g_old, psi, kinds, opt, d, r.g_old);
  r.authors = authors_router_logits_backward(sources, wq, wk, recency, r.g_old);
  r.sources = r.depth.sources;
  for (index_t i = 0; i < r.sources.size(); ++i) r.sources[i] += r.authors.sources[i];
  return r;
}

}  // namespace oasis::model
