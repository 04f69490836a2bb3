// oasis/grad/router_backward_bounds.hpp — derived error bounds of the routers' backward in T
// (grad/router_backward.hpp), composed from the steps' bounds (docs/tolerances.md, "Backward").
//
// A router's backward chains: the logits computed in T (error e_g: pseudo_query_logits_bounds or
// authors_router_logits_bounds) -> the uncoupled clamp (1-Lipschitz; a kink within e_g of +-L
// admits both sides) -> depth_route_backward_bounds with that logit error -> the logits'
// backward with the depth bound of dL/dg_old as the error of its incoming gradient. The sources'
// bound is the sum of the mix part and the keys' (and query's) part.
#pragma once

#include <cmath>
#include <vector>

#include "oasis/grad/backward_bounds.hpp"
#include "oasis/grad/depth_backward_bounds.hpp"
#include "oasis/grad/router_backward.hpp"

namespace oasis::bounds {

namespace detail {
/// Exact (double) projections y_a = sum_c W_ac x_c of one row and their rounding bounds in T.
inline void projection(const Tensor<double>& W, const double* x, index_t d, double u, std::vector<double>& y,
                       std::vector<double>& e) {
  const index_t r = W.dim(0);
  y.assign(static_cast<std::size_t>(r), 0.0);
  e.assign(static_cast<std::size_t>(r), 0.0);
  for (index_t a = 0; a < r; ++a) {
    double s = 0, as = 0;
    for (index_t c = 0; c < d; ++c) {
      s += W(a, c) * x[c];
      as += std::abs(W(a, c) * x[c]);
    }
    y[static_cast<std::size_t>(a)] = s;
    e[static_cast<std::size_t>(a)] = static_cast<double>(d) * u * as;
  }
}
}  // namespace detail

/// Bound on |model::authors_router_logits<T>(sources, wq, wk, recency) - exact| per element [n, N]:
/// the projections (d u sum |W x|), the dot product, the scale (2u) and its product, the recency
/// term rec (i / (n - 1)) (2u) and the addition.
template <class T>
Tensor<double> authors_router_logits_bounds(const Tensor<T>& sources, const Tensor<T>& wq, const Tensor<T>& wk,
                                            const T& recency) {
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2), r = wq.dim(0);
  const double u = Precision::of<T>().u, s = 1.0 / std::sqrt(static_cast<double>(r));
  const Tensor<double> S = sources.template cast<double>(), Wq = wq.template cast<double>(), Wk = wk.template cast<double>();
  Tensor<double> b({n, N});
  std::vector<double> q, eq, k, ek;
  for (index_t t = 0; t < N; ++t) {
    detail::projection(Wq, S.ptr(n - 1, t), d, u, q, eq);
    for (index_t i = 0; i < n; ++i) {
      detail::projection(Wk, S.ptr(i, t), d, u, k, ek);
      double dot = 0, adot = 0, prop = 0;
      for (std::size_t a = 0; a < q.size(); ++a) {
        dot += q[a] * k[a];
        adot += std::abs(q[a] * k[a]);
        prop += eq[a] * std::abs(k[a]) + std::abs(q[a]) * ek[a];
      }
      const double rec = static_cast<double>(recency) * static_cast<double>(i) / static_cast<double>(n - 1);
      b(i, t) = kSecondOrder * (s * (prop + static_cast<double>(r + 3) * u * adot) + 2 * u * std::abs(rec) +
                                u * std::abs(s * dot + rec)) +
                Precision::of<T>().p_floor;
    }
  }
  return b;
}

/// Bounds of model::authors_router_logits_backward's results.
struct AuthorsLogitBackwardBounds {
  Tensor<double> sources, wq, wk;
  double recency = 0;
};

/// Bound on |model::authors_router_logits_backward<T>(sources, wq, wk, recency, dg) - exact|;
/// `dg_err` (optional, [n, N]) bounds an error already present in dg.
template <class T>
AuthorsLogitBackwardBounds authors_router_logits_backward_bounds(const Tensor<T>& sources, const Tensor<T>& wq,
                                                                 const Tensor<T>& wk, const T& recency, const Tensor<T>& dg,
                                                                 const Tensor<double>* dg_err = nullptr) {
  (void)recency;
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2), r = wq.dim(0);
  const Precision pr = Precision::of<T>();
  const double u = pr.u, s = 1.0 / std::sqrt(static_cast<double>(r));
  const Tensor<double> S = sources.template cast<double>(), Wq = wq.template cast<double>(), Wk = wk.template cast<double>(),
                       G = dg.template cast<double>();
  AuthorsLogitBackwardBounds b{Tensor<double>({n, N, d}), Tensor<double>(wq.shape()), Tensor<double>(wk.shape())};
  Tensor<double> Sq(wq.shape()), Aq(wq.shape()), Sk(wk.shape()), Ak(wk.shape());
  double Sr = 0, Ar = 0;
  std::vector<double> q, eq;
  std::vector<std::vector<double>> k(static_cast<std::size_t>(n)), ek(k.size());
  const std::size_t R = static_cast<std::size_t>(r);
  for (index_t t = 0; t < N; ++t) {
    detail::projection(Wq, S.ptr(n - 1, t), d, u, q, eq);
    for (index_t i = 0; i < n; ++i) detail::projection(Wk, S.ptr(i, t), d, u, k[static_cast<std::size_t>(i)], ek[static_cast<std::size_t>(i)]);
    // dq_a = s sum_i dg_i k_ia (n products and sums, then the scale)
    std::vector<double> dq(R), edq(R);
    for (std::size_t a = 0; a < R; ++a) {
      double acc = 0, S1 = 0, A1 = 0;
      for (index_t i = 0; i < n; ++i) {
        const std::size_t ii = static_cast<std::size_t>(i);
        const double g = G(i, t), eg = dg_err ? (*dg_err)(i, t) : 0.0;
        acc += g * k[ii][a];
        S1 += eg * std::abs(k[ii][a]) + std::abs(g) * ek[ii][a];
        A1 += std::abs(g * k[ii][a]);
      }
      dq[a] = s * acc;
      edq[a] = s * (S1 + static_cast<double>(n + 3) * u * A1);
    }
    for (index_t i = 0; i < n; ++i) {
      const std::size_t ii = static_cast<std::size_t>(i);
      const double g = G(i, t), eg = dg_err ? (*dg_err)(i, t) : 0.0;
      const double rho = static_cast<double>(i) / static_cast<double>(n - 1);
      Sr += eg * rho;
      Ar += std::abs(g * rho);
      // dk_ia = (dg_i s) q_a
      std::vector<double> dk(R), edk(R);
      for (std::size_t a = 0; a < R; ++a) {
        dk[a] = g * s * q[a];
        edk[a] = eg * s * std::abs(q[a]) + s * std::abs(g) * eq[a] + 4 * u * std::abs(dk[a]);
      }
      const bool last = i == n - 1;
      const double cnt = static_cast<double>(last ? 2 * r : r);
      for (index_t c = 0; c < d; ++c) {
        double Ssrc = 0, Asrc = 0;
        for (std::size_t a = 0; a < R; ++a) {
          const index_t aa = static_cast<index_t>(a);
          Ssrc += std::abs(Wk(aa, c)) * edk[a];
          Asrc += std::abs(Wk(aa, c) * dk[a]);
          Sk(aa, c) += edk[a] * std::abs(S(i, t, c));
          Ak(aa, c) += std::abs(dk[a] * S(i, t, c));
          if (last) {
            Ssrc += std::abs(Wq(aa, c)) * edq[a];
            Asrc += std::abs(Wq(aa, c) * dq[a]);
            Sq(aa, c) += edq[a] * std::abs(S(i, t, c));
            Aq(aa, c) += std::abs(dq[a] * S(i, t, c));
          }
        }
        b.sources(i, t, c) = kSecondOrder * (Ssrc + cnt * u * Asrc) + pr.p_floor;
      }
    }
  }
  for (index_t x = 0; x < b.wq.size(); ++x) {
    b.wq[x] = kSecondOrder * (Sq[x] + static_cast<double>(N) * u * Aq[x]) + pr.p_floor;
    b.wk[x] = kSecondOrder * (Sk[x] + static_cast<double>(n * N) * u * Ak[x]) + pr.p_floor;
  }
  b.recency = kSecondOrder * (Sr + static_cast<double>(n * N + 2) * u * Ar) + pr.p_floor;
  return b;
}

/// Bounds of a whole router's backward (shapes as model::RouteGrads).
struct RouteBackwardBounds {
  Tensor<double> sources, g_old;
  DepthBackwardBounds depth;
  PseudoQueryBackwardBounds kimi;
  AuthorsLogitBackwardBounds authors;
};

namespace detail {
/// The routing half: logits `g_raw` computed in T with error `e_raw`, exact logits `g_exact`.
template <class T, class R>
RouteBackwardBounds route_backward_bounds(const Tensor<T>& sources, const Tensor<R>& g_exact, const Tensor<double>& e_raw,
                                          const Tensor<T>& psi, const std::vector<SourceKind>& kinds,
                                          const DepthOptions& opt, const DepthCotangents<T>& d, Tensor<R>& dg_raw_exact) {
  const bool clamp = model::clamps_uncoupled_logits(opt);
  const double L = opt.coupling_options.score_clamp;
  Tensor<R> g_routed = g_exact;
  if (clamp)
    for (index_t i = 0; i < g_routed.size(); ++i)
      g_routed[i] = g_routed[i] > R(L) ? R(L) : (g_routed[i] < R(-L) ? R(-L) : g_routed[i]);
  const Tensor<R> Sr = sources.template cast<R>(), Pr = psi.template cast<R>();
  const DepthRoute<R> ref = attn_res_route(Sr, g_routed, Pr, kinds, opt);
  const DepthCotangents<R> dr{d.h.template cast<R>(), d.alpha.template cast<R>(), d.alpha_null.template cast<R>()};
  const DepthGrads<R> gr = attn_res_route_backward(Sr, g_routed, Pr, kinds, opt, dr);
  RouteBackwardBounds b;
  b.depth = depth_route_backward_bounds(sources, g_routed.template cast<T>(), psi, kinds, opt, d, ref, &e_raw);
  b.g_old = b.depth.g_old;
  dg_raw_exact = gr.g_old;
  if (clamp)
    for (index_t i = 0; i < b.g_old.size(); ++i) {
      const double x = static_cast<double>(g_exact[i]);
      const bool pass = clamp_passes(x, -L, L);
      if (!pass) dg_raw_exact[i] = R(0);
      if (std::abs(std::abs(x) - L) <= e_raw[i]) b.g_old[i] += std::abs(static_cast<double>(gr.g_old[i]));
      else if (!pass) b.g_old[i] = 0;
    }
  return b;
}
}  // namespace detail

/// Bound on |model::kimi_route_backward<T>(...) - exact| per element.
template <class T>
RouteBackwardBounds kimi_route_backward_bounds(const Tensor<T>& sources, const Tensor<T>& w, const Tensor<T>& gain,
                                               const KeyNormOptions& key_norm, const Tensor<T>& psi,
                                               const std::vector<SourceKind>& kinds, const DepthOptions& opt,
                                               const DepthCotangents<T>& d) {
  using R = mp50;
  const Tensor<R> g = pseudo_query_logits(sources.template cast<R>(), w.template cast<R>(),
                                          gain.empty() ? Tensor<R>() : gain.template cast<R>(), key_norm);
  const Tensor<double> e = pseudo_query_logits_bounds(sources, w, gain, key_norm);
  Tensor<R> dg;
  RouteBackwardBounds b = detail::route_backward_bounds(sources, g, e, psi, kinds, opt, d, dg);
  b.kimi = pseudo_query_logits_backward_bounds(sources, w, gain, dg.template cast<T>(), key_norm, &b.g_old);
  b.sources = b.depth.sources;
  for (index_t i = 0; i < b.sources.size(); ++i) b.sources[i] += b.kimi.sources[i];
  return b;
}

/// Bound on |model::authors_route_backward<T>(...) - exact| per element.
template <class T>
RouteBackwardBounds authors_route_backward_bounds(const Tensor<T>& sources, const Tensor<T>& wq, const Tensor<T>& wk,
                                                  const T& recency, const Tensor<T>& psi,
                                                  const std::vector<SourceKind>& kinds, const DepthOptions& opt,
                                                  const DepthCotangents<T>& d) {
  using R = mp50;
  const Tensor<R> g = model::authors_router_logits(sources.template cast<R>(), wq.template cast<R>(), wk.template cast<R>(),
                                                   R(recency));
  const Tensor<double> e = authors_router_logits_bounds(sources, wq, wk, recency);
  Tensor<R> dg;
  RouteBackwardBounds b = detail::route_backward_bounds(sources, g, e, psi, kinds, opt, d, dg);
  b.authors = authors_router_logits_backward_bounds(sources, wq, wk, recency, dg.template cast<T>(), &b.g_old);
  b.sources = b.depth.sources;
  for (index_t i = 0; i < b.sources.size(); ++i) b.sources[i] += b.authors.sources[i];
  return b;
}

}  // namespace oasis::bounds
