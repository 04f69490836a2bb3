// oasis/model/router.hpp — depth routers of the AttnRes model (docs/spec.md §3–4).
//
// Both router families produce old depth logits g_old [n, N] and then share one path: the core's
// attn_res_route (coupling g - beta Dpsi with the selected centring and head-less rule, the
// variant's depth normaliser, h = sum_i alpha_i s_i).
//
//   Kimi pseudo-query router:  g_i = w^T RMSNorm(s_i)                   (core pseudo_query_logits)
//   authors' router:           g_i = (W_q c)·(W_k s_i) / sqrt(r) + rec * i / (n - 1)
//                              c = the current candidate (the last source), r = low-rank width.
// When coupling is off but the convention clamps scores (authors_code: [-50, 50]) the clamp is
// applied to g_old, as the authors' code clamps whether or not psi is given.
#pragma once

#include <string>
#include <vector>

#include "oasis/ops/coupling.hpp"
#include "oasis/ops/depth.hpp"
#include "oasis/model/config.hpp"
#include "oasis/model/layers.hpp"
#include "oasis/ops/variant.hpp"

namespace oasis::model {

/// One depth source: its value rows [N, d], kind, null statistic psi [N] (read only for sources
/// with evidence under the head-less rule) and a name for traces.
template <class T>
struct DepthSource {
  Rows<T> v;
  SourceKind kind = SourceKind::initial;
  Tensor<T> psi;               ///< [N]; zeros for the initial state
  std::vector<double> e_psi;   ///< error bounds of psi (error model on)
  std::string name;
};

/// The routing decision of one router over N tokens.
template <class T>
struct RouteResult {
  Rows<T> h;                       ///< [N, d] routed state
  Tensor<T> sources;               ///< [n, N, d] candidate values
  DepthRoute<T> route;             ///< alpha [n, N], alpha_null [N], coupled g [n, N], dpsi [n, N]
  Tensor<T> g_old;                 ///< [n, N] logits before coupling (after the no-coupling clamp)
  std::vector<double> e_gold;      ///< [n * N] error bounds of g_old (error model on; the clamp is 1-Lipschitz)
  Tensor<T> psi;                   ///< [n, N] psi of each candidate as given to the coupling
  std::vector<SourceKind> kinds;
  std::vector<std::string> names;
  DepthOptions options;            ///< normaliser, coupling, conventions, theta / beta used
};

/// Depth options of a router of this model with learned theta.
inline DepthOptions router_depth_options(const ModelConfig& cfg, double theta) {
  DepthOptions base;
  base.coupling_options = cfg.coupling_or_default();
  base.theta = theta;
  base.beta = cfg.beta;
  return depth_options(cfg.variant, base);
}

/// True when a router clamps g_old to [-score_clamp, score_clamp] although coupling is off (the
/// header's rule: a convention with a finite clamp clamps whether or not psi couples).
inline bool clamps_uncoupled_logits(const DepthOptions& o) {
  return !o.coupling && std::isfinite(o.coupling_options.score_clamp);
}

/// Couple, normalise and mix (core attn_res_route) plus the error rule of that step:
///   e_Dpsi_i = e_psi_i + max_r e_psi_r + (n + 2) u max_r psi_r          (evidence sources)
///   dg_i = e_gold_i + beta e_Dpsi_i + beta |Dpsi_i| (7 + |theta|) u + u |g_i|  (coupling on)
///   Dg = max_i dg_i; a_i = u (|g_i - M| + 2); rho = 2 max a + (m' + 2) u
///   e_h = sum_i alpha_i e_i + (2 Dg + rho + gamma_n) sum_i alpha_i ||s_i||_inf.
template <class T>
RouteResult<T> finish_route(const std::vector<const DepthSource<T>*>& c, const Tensor<T>& sources, Tensor<T> g_old,
                            const std::vector<double>& e_gold, double theta, const ModelConfig& cfg,
                            const ErrorModel& em) {
  const index_t n = static_cast<index_t>(c.size()), N = sources.dim(1), d = sources.dim(2);
  RouteResult<T> r;
  r.options = router_depth_options(cfg, theta);
  if (clamps_uncoupled_logits(r.options)) {
    const T lim(r.options.coupling_options.score_clamp);
    for (index_t i = 0; i < g_old.size(); ++i) g_old[i] = g_old[i] > lim ? lim : (g_old[i] < -lim ? -lim : g_old[i]);
  }
  r.psi = Tensor<T>({n, N});
  for (index_t i = 0; i < n; ++i) {
    r.kinds.push_back(c[static_cast<std::size_t>(i)]->kind);
    r.names.push_back(c[static_cast<std::size_t>(i)]->name);
    for (index_t t = 0; t < N; ++t) r.psi(i, t) = c[static_cast<std::size_t>(i)]->psi[t];
  }
  r.route = attn_res_route(sources, g_old, r.psi, r.kinds, r.options);
  r.g_old = std::move(g_old);
  r.e_gold = e_gold;
  r.h.x = r.route.h;
  r.sources = sources;
  if (em.on()) {
    const HeadlessRule rule = r.options.coupling_options.headless;
    const double beta = to_double(depth_beta<double>(r.options));
    const bool has_null = r.options.normalizer == RowNorm::softmax1;
    r.h.e.resize(static_cast<std::size_t>(N));
    for (index_t t = 0; t < N; ++t) {
      double emax = 0, pmax = 0;
      for (index_t i = 0; i < n; ++i)
        if (has_null_evidence(r.kinds[static_cast<std::size_t>(i)], rule)) {
          emax = std::max(emax, c[static_cast<std::size_t>(i)]->e_psi[static_cast<std::size_t>(t)]);
          pmax = std::max(pmax, to_double(r.psi(i, t)));
        }
      double Dg = 0, M = has_null ? 0.0 : -std::numeric_limits<double>::infinity();
      for (index_t i = 0; i < n; ++i) {
        double dg = e_gold[static_cast<std::size_t>(i * N + t)];
        if (r.options.coupling) {
          const bool ev = has_null_evidence(r.kinds[static_cast<std::size_t>(i)], rule);
          const double edpsi = ev ? c[static_cast<std::size_t>(i)]->e_psi[static_cast<std::size_t>(t)] + emax +
                                        static_cast<double>(n + 2) * em.u * pmax
                                  : (r.options.coupling_options.centring == Centring::authors_code
                                         ? emax + static_cast<double>(n + 2) * em.u * pmax : 0.0);
          dg += beta * edpsi + beta * std::abs(to_double(r.route.dpsi(i, t))) * (7.0 + std::abs(theta)) * em.u +
                em.u * std::abs(to_double(r.route.g(i, t)));
        }
        Dg = std::max(Dg, dg);
        M = std::max(M, to_double(r.route.g(i, t)));
      }
      double amax = has_null ? em.u * (std::abs(M) + 2.0) : 0.0;
      double ae = 0, as = 0;
      for (index_t i = 0; i < n; ++i) {
        amax = std::max(amax, em.u * (std::abs(to_double(r.route.g(i, t)) - M) + 2.0));
        const double a = to_double(r.route.alpha(i, t));
        ae += a * c[static_cast<std::size_t>(i)]->v.e[static_cast<std::size_t>(t)];
        as += a * row_inf(sources.ptr(i, t), d);
      }
      const double rho = 2.0 * amax + (static_cast<double>(n + (has_null ? 1 : 0)) + 2.0) * em.u;
      r.h.e[static_cast<std::size_t>(t)] = ae + (2.0 * Dg + rho + em.gamma(static_cast<double>(n))) * as;
    }
  }
  return r;
}

/// Stack the candidates' rows into the core's source layout [n, N, d].
template <class T>
Tensor<T> stack_sources(const std::vector<const DepthSource<T>*>& c) {
  OASIS_REQUIRE(!c.empty(), "sources", "a router needs at least one candidate");
  const index_t n = static_cast<index_t>(c.size()), N = c[0]->v.n(), d = c[0]->v.w();
  Tensor<T> s({n, N, d});
  for (index_t i = 0; i < n; ++i)
    std::copy(c[static_cast<std::size_t>(i)]->v.x.data(), c[static_cast<std::size_t>(i)]->v.x.data() + N * d, s.ptr(i));
  return s;
}

/// Kimi pseudo-query router: g_i = w^T RMSNorm(s_i) (key gain optional), then finish_route.
/// Error rule of g: dg_i = ||w||_1 e_y + gamma_d sum_c |w_c y_c|, e_y from the RMSNorm rule.
template <class T>
RouteResult<T> kimi_route(const std::vector<const DepthSource<T>*>& c, const Tensor<T>& w, const Tensor<T>& gain,
                          double theta, const ModelConfig& cfg, const ErrorModel& em) {
  const Tensor<T> sources = stack_sources(c);
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2);
  Tensor<T> g_old = pseudo_query_logits(sources, w, gain, cfg.key_norm);
  std::vector<double> e_gold;
  if (em.on()) {
    e_gold.resize(static_cast<std::size_t>(n * N));
    const double w1 = row_l1(w.data(), d);
    for (index_t i = 0; i < n; ++i) {
      const Rows<T> y = rms_norm(c[static_cast<std::size_t>(i)]->v, gain, cfg.key_norm, em);
      for (index_t t = 0; t < N; ++t) {
        double absdot = 0;
        for (index_t k = 0; k < d; ++k) absdot += std::abs(to_double(w[k]) * to_double(y.x(t, k)));
        e_gold[static_cast<std::size_t>(i * N + t)] = w1 * y.e[static_cast<std::size_t>(t)] + em.gamma(static_cast<double>(d)) * absdot;
      }
    }
  }
  return finish_route(c, sources, std::move(g_old), e_gold, theta, cfg, em);
}

/// The authors' router logits over stacked sources [n, N, d] (the current candidate c = s_{n-1}):
///   q = W_q c,  k_i = W_k s_i  (W [r, d], left-to-right dot products as linear()),
///   g_i = (q·k_i) * (1 / sqrt(r)) + rec * (i / (n - 1)).
template <class T>
Tensor<T> authors_router_logits(const Tensor<T>& sources, const Tensor<T>& wq, const Tensor<T>& wk, const T& recency) {
  using std::sqrt;
  require_rank(sources, 3, "sources", "[n, N, d]");
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2);
  OASIS_REQUIRE(n >= 2, "sources", "the authors' router always sees the embedding and the current candidate");
  OASIS_REQUIRE(wq.rank() == 2 && wq.dim(1) == d, "wq", "shape ", shape_str(wq.shape()), " is not [r, d = ", d, "]");
  OASIS_REQUIRE(wk.shape() == wq.shape(), "wk", "shape ", shape_str(wk.shape()), " differs from wq's ", shape_str(wq.shape()));
  const index_t rk = wq.dim(0);
  const T scale = T(1) / sqrt(T(rk));
  auto project = [&](const Tensor<T>& W, const T* x, std::vector<T>& y) {
    for (index_t a = 0; a < rk; ++a) {
      T acc(0);
      for (index_t c = 0; c < d; ++c) acc += W(a, c) * x[c];
      y[static_cast<std::size_t>(a)] = acc;
    }
  };
  Tensor<T> g({n, N});
  std::vector<T> q(static_cast<std::size_t>(rk)), k(q.size());
  for (index_t t = 0; t < N; ++t) {
    project(wq, sources.ptr(n - 1, t), q);
    for (index_t i = 0; i < n; ++i) {
      project(wk, sources.ptr(i, t), k);
      T dot(0);
      for (index_t a = 0; a < rk; ++a) dot += q[static_cast<std::size_t>(a)] * k[static_cast<std::size_t>(a)];
      g(i, t) = dot * scale + recency * (T(i) / T(n - 1));
    }
  }
  return g;
}

/// The authors' router: g_old = authors_router_logits(sources, W_q, W_k, rec), then finish_route.
/// Error rule of g: dg_i = s (e_q ||k_i||_1 + ||q||_1 e_ki) + (gamma_r + 3u) s sum |q k_i| + 3u |rec i/(n-1)| + u |g_i|.
template <class T>
RouteResult<T> authors_route(const std::vector<const DepthSource<T>*>& c, const Tensor<T>& wq, const Tensor<T>& wk,
                             const T& recency, double theta, const ModelConfig& cfg, const ErrorModel& em) {
  const Tensor<T> sources = stack_sources(c);
  const index_t n = sources.dim(0), N = sources.dim(1), rk = wq.dim(0);
  Tensor<T> g_old = authors_router_logits(sources, wq, wk, recency);
  std::vector<double> e_gold(em.on() ? static_cast<std::size_t>(n * N) : 0);
  if (em.on()) {
    const Rows<T> q = linear(c.back()->v, wq, em);
    std::vector<Rows<T>> k;
    for (index_t i = 0; i < n; ++i) k.push_back(linear(c[static_cast<std::size_t>(i)]->v, wk, em));
    const double sc = 1.0 / std::sqrt(static_cast<double>(rk));
    for (index_t i = 0; i < n; ++i) {
      const double rec = to_double(T(recency * (T(i) / T(n - 1))));
      for (index_t t = 0; t < N; ++t) {
        double absdot = 0;
        for (index_t a = 0; a < rk; ++a) absdot += std::abs(to_double(q.x(t, a)) * to_double(k[static_cast<std::size_t>(i)].x(t, a)));
        e_gold[static_cast<std::size_t>(i * N + t)] =
            sc * (q.e[static_cast<std::size_t>(t)] * row_l1(k[static_cast<std::size_t>(i)].x.ptr(t), rk) +
                  row_l1(q.x.ptr(t), rk) * k[static_cast<std::size_t>(i)].e[static_cast<std::size_t>(t)]) +
            (em.gamma(static_cast<double>(rk)) + 3.0 * em.u) * sc * absdot + 3.0 * em.u * std::abs(rec) +
            em.u * std::abs(to_double(g_old(i, t)));
      }
    }
  }
  return finish_route(c, sources, std::move(g_old), e_gold, theta, cfg, em);
}

}  // namespace oasis::model
