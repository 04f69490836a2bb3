// oasis/grad/coupling_backward.hpp — the backward of psi and of the coupling (docs/spec.md §3, §8).
//
//   psi = (1/H) sum_h p_null_h                      dp_null_h = dpsi / H
//   psi = mean_h max(0, 1 - sum_j p_j)  (authors)   dp_j = -dpsi / H where 1 - sum_j p_j >= 0, else 0
//   Dpsi_i = psi_i - mean_{r in C} psi_r            dpsi_r = dDpsi_r - mean_{i in C} dDpsi_i   (r in C)
//     C = the centring set of coupling.hpp (paper_v2: the candidates with evidence, |C| >= 2, else
//     Dpsi = 0 and dpsi = 0; authors_code: all n candidates, those without evidence counting as
//     psi = 0, so their psi entry gets gradient 0)
//   beta = min(beta_raw, beta_max), beta_raw = softplus(theta)   dtheta = dbeta_raw sigmoid(theta)
//   g = clamp(x, -L, L), x = g_old - beta Dpsi       dx = dg where -L <= x <= L, else 0;
//                                                    dg_old = dx, dDpsi = -beta dx, dbeta = -sum_i dx_i Dpsi_i
// Clamps (the subgradient at a kink): an active clamp (x beyond +-L, beta_raw beyond beta_max)
// passes gradient 0 to what it clamps; a value exactly at the bound passes its gradient, as
// torch.clamp does (clamp_passes). The same rule holds for max(0, .) of the authors' estimator.
#pragma once

#include <vector>

#include "oasis/ops/coupling.hpp"

namespace oasis {

/// The subgradient convention of every clamp: lo <= x <= hi passes the gradient (the bounds
/// included, as torch.clamp), anything beyond passes 0.
template <class T>
bool clamp_passes(const T& x, const T& lo, const T& hi) {
  return !(x < lo) && !(x > hi);
}

/// dL/dp_null [B, H, T] from dL/dpsi [B, T] for psi = null_statistic(p_null) with H heads.
template <class T>
Tensor<T> null_statistic_backward(const Tensor<T>& dpsi, index_t H) {
  require_rank(dpsi, 2, "dpsi", "[B, T]");
  OASIS_REQUIRE(H > 0, "H", "psi is a mean over H > 0 heads");
  require_finite(dpsi, "dpsi");
  const index_t B = dpsi.dim(0), Tn = dpsi.dim(1);
  Tensor<T> dp({B, H, Tn});
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < Tn; ++t) dp(b, h, t) = dpsi(b, t) / T(H);
  return dp;
}

/// dL/dprobs [B, H, Tq, Tk] for the authors' estimator psi = null_statistic_from_mass(probs).
template <class T>
Tensor<T> null_statistic_from_mass_backward(const Tensor<T>& probs, const Tensor<T>& dpsi) {
  require_rank(probs, 4, "probs", "[B, H, Tq, Tk]");
  require_rank(dpsi, 2, "dpsi", "[B, T]");
  const index_t B = probs.dim(0), H = probs.dim(1), Tq = probs.dim(2), Tk = probs.dim(3);
  OASIS_REQUIRE(dpsi.dim(0) == B && dpsi.dim(1) == Tq, "dpsi", "shape ", shape_str(dpsi.shape()), " is not [B, Tq] = [",
                B, ", ", Tq, "]");
  OASIS_REQUIRE(H > 0, "probs", "has no heads (H = 0)");
  require_finite(dpsi, "dpsi");
  Tensor<T> dp(probs.shape());
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < Tq; ++t) {
        T mass(0);
        const T* row = probs.ptr(b, h, t);
        for (index_t j = 0; j < Tk; ++j) mass += row[j];
        if (!clamp_passes(T(1) - mass, T(0), pos_inf<T>())) continue;
        const T g = -dpsi(b, t) / T(H);
        for (index_t j = 0; j < Tk; ++j) dp(b, h, t, j) = g;
      }
  return dp;
}

/// dL/dpsi [n] from dL/dDpsi [n] for Dpsi = centre_null_statistic(psi, kinds, opt) (linear in psi).
template <class T>
Vec<T> centre_null_statistic_backward(const Vec<T>& ddpsi, const std::vector<SourceKind>& kinds,
                                      const CouplingOptions& opt = {}) {
  const index_t n = ddpsi.size();
  OASIS_REQUIRE(static_cast<index_t>(kinds.size()) == n, "kinds", "has ", kinds.size(), " entries but ddpsi has ", n);
  auto ev = [&](index_t i) { return has_null_evidence(kinds[static_cast<std::size_t>(i)], opt.headless); };
  Vec<T> dpsi = Vec<T>::Zero(n);
  if (opt.centring == Centring::paper_v2) {
    T sum(0);
    index_t count = 0;
    for (index_t i = 0; i < n; ++i)
      if (ev(i)) { sum += ddpsi[i]; ++count; }
    if (count < 2) return dpsi;  // Dpsi = 0 identically
    const T mean = sum / T(count);
    for (index_t i = 0; i < n; ++i)
      if (ev(i)) dpsi[i] = ddpsi[i] - mean;
    return dpsi;
  }
  // authors_code: the mean runs over all n candidates; only those with evidence read their psi.
  const T mean = ddpsi.sum() / T(n);
  for (index_t i = 0; i < n; ++i)
    if (ev(i)) dpsi[i] = ddpsi[i] - mean;
  return dpsi;
}

/// dL/dbeta_raw from dL/dbeta for beta = min(beta_raw, beta_max) (the cap is a clamp).
template <class T>
T coupling_beta_cap_backward(const T& beta_raw, const T& dbeta, const CouplingOptions& opt = {}) {
  return clamp_passes(beta_raw, neg_inf<T>(), T(opt.beta_max)) ? dbeta : T(0);
}

/// dL/dtheta from dL/dbeta for beta = coupling_beta(theta, opt) = min(softplus(theta), beta_max).
template <class T>
T coupling_beta_backward(const T& theta, const T& dbeta, const CouplingOptions& opt = {}) {
  return coupling_beta_cap_backward(softplus(theta), dbeta, opt) * sigmoid(theta);
}

/// Gradients of couple_depth_logits(g_old, dpsi, beta, opt) given dL/dg.
template <class T>
struct CouplingGrads {
  Vec<T> g_old;  ///< dL/dg_old
  Vec<T> dpsi;   ///< dL/dDpsi
  T beta;        ///< dL/dbeta
};

template <class T>
CouplingGrads<T> couple_depth_logits_backward(const Vec<T>& g_old, const Vec<T>& dpsi, const T& beta, const Vec<T>& dg,
                                              const CouplingOptions& opt = {}) {
  const index_t n = g_old.size();
  OASIS_REQUIRE(dpsi.size() == n && dg.size() == n, "dg", "g_old, dpsi and dg differ in length (", n, ", ", dpsi.size(),
                ", ", dg.size(), ")");
  const T lim(opt.score_clamp);
  CouplingGrads<T> r{Vec<T>(n), Vec<T>(n), T(0)};
  for (index_t i = 0; i < n; ++i) {
    const T x = g_old[i] - beta * dpsi[i];
    const T dx = clamp_passes(x, T(-lim), lim) ? dg[i] : T(0);
    r.g_old[i] = dx;
    r.dpsi[i] = -beta * dx;
    r.beta -= dx * dpsi[i];
  }
  return r;
}

}  // namespace oasis
