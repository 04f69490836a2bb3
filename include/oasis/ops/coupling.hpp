// oasis/ops/coupling.hpp — the null statistic psi and the token-to-depth coupling (docs/spec.md §3).
//
//   psi_{i,t}       = (1/H) sum_h p_null^{(i,h)}_t           mean over the H *query* heads
//   g_new_{i->l,t}  = g_old_{i->l,t} - beta * Dpsi_{i->l,t},  beta = softplus(theta) >= 0
//
// Centring conventions (both offered, paper_v2 is the default):
//   paper_v2      Dpsi_i = psi_i - mean_{r in E} psi_r for i in E, else 0, where E is the set of
//                 transformed candidates that carry null evidence (attention sources, and
//                 head-less sources under HeadlessRule::inherit). The initial state (i = 0) has
//                 Dpsi = 0 and is not in the mean; |E| <= 1 gives Dpsi = 0 (no coupling at l = 1).
//   authors_code  Dpsi_i = psi_i - mean_{r = 0..n-1} psi_r over all n candidates, psi_0 := 0 for
//                 the embedding (and for head-less sources under no_evidence, which are treated as
//                 the initial state is); beta clamped to <= 10, coupled scores clamped to [-50, 50].
#pragma once

#include <limits>
#include <vector>

#include "oasis/core/tensor.hpp"

namespace oasis {

enum class Centring { paper_v2, authors_code };
/// How a depth source with no attention heads (an MLP sublayer) gets its null evidence.
enum class HeadlessRule {
  inherit,      ///< reuse the psi of the attention sublayer of the same block (authors' code)
  no_evidence,  ///< treated like the initial state
};
/// The kind of one depth candidate.
enum class SourceKind {
  initial,    ///< the token embedding v_0 = h_1 (no heads)
  attention,  ///< output of an attention sublayer (has psi)
  headless,   ///< output of a sublayer without heads (MLP)
};

struct CouplingOptions {
  Centring centring = Centring::paper_v2;
  HeadlessRule headless = HeadlessRule::inherit;
  double beta_max = std::numeric_limits<double>::infinity();     ///< authors_code: 10
  double score_clamp = std::numeric_limits<double>::infinity();  ///< authors_code: 50 -> [-50, 50]

  static CouplingOptions paper_v2() { return {}; }
  static CouplingOptions authors_code() {
    return {Centring::authors_code, HeadlessRule::inherit, 10.0, 50.0};
  }
};

std::string_view to_string(Centring c);
Centring parse_centring(std::string_view name);
std::string_view to_string(HeadlessRule r);
HeadlessRule parse_headless_rule(std::string_view name);

/// psi per token: mean of p_null over the H query heads. p_null [B, H, T] -> psi [B, T].
template <class T>
Tensor<T> null_statistic(const Tensor<T>& p_null) {
  require_rank(p_null, 3, "p_null", "[B, H, T]");
  const index_t B = p_null.dim(0), H = p_null.dim(1), Tn = p_null.dim(2);
  OASIS_REQUIRE(H > 0, "p_null", "has no heads (H = 0): psi is a mean over heads");
  Tensor<T> psi({B, Tn});
  for (index_t b = 0; b < B; ++b)
    for (index_t t = 0; t < Tn; ++t) {
      T sum(0);
      for (index_t h = 0; h < H; ++h) sum += p_null(b, h, t);
      psi(b, t) = sum / T(H);
    }
  return psi;
}

/// The authors' estimator psi = mean_h max(0, 1 - sum_j p_{t,j}) from probabilities [B, H, T, Tk].
template <class T>
Tensor<T> null_statistic_from_mass(const Tensor<T>& probs) {
  require_rank(probs, 4, "probs", "[B, H, Tq, Tk]");
  Tensor<T> p_null({probs.dim(0), probs.dim(1), probs.dim(2)});
  for (index_t r = 0; r < p_null.size(); ++r) {
    T mass(0);
    const T* row = probs.data() + r * probs.dim(3);
    for (index_t j = 0; j < probs.dim(3); ++j) mass += row[j];
    const T rest = T(1) - mass;
    p_null[r] = rest > T(0) ? rest : T(0);
  }
  return null_statistic(p_null);
}

/// True if candidate kind carries null evidence under the rule (paper_v2's set E).
inline bool has_null_evidence(SourceKind k, HeadlessRule rule) {
  return k == SourceKind::attention || (k == SourceKind::headless && rule == HeadlessRule::inherit);
}

/// Dpsi over the n candidates of one target layer at one token. psi[i] is read only for
/// candidates with evidence (for inherit, the caller puts the inherited psi there).
template <class T>
Vec<T> centre_null_statistic(const Vec<T>& psi, const std::vector<SourceKind>& kinds,
                             const CouplingOptions& opt = {}) {
  const index_t n = psi.size();
  OASIS_REQUIRE(static_cast<index_t>(kinds.size()) == n, "kinds", "has ", kinds.size(),
                " entries but psi has ", n);
  for (index_t i = 0; i < n; ++i) {
    const bool ev = has_null_evidence(kinds[static_cast<std::size_t>(i)], opt.headless);
    OASIS_REQUIRE(!ev || (is_finite(psi[i]) && psi[i] >= T(0) && psi[i] <= T(1)), "psi", "entry ",
                  i, " = ", to_double(psi[i]), " is not a probability in [0, 1]");
  }
  Vec<T> dpsi = Vec<T>::Zero(n);
  if (opt.centring == Centring::paper_v2) {
    T sum(0);
    index_t count = 0;
    for (index_t i = 0; i < n; ++i)
      if (has_null_evidence(kinds[static_cast<std::size_t>(i)], opt.headless)) { sum += psi[i]; ++count; }
    if (count < 2) return dpsi;  // nothing to centre against: exactly zero, not psi - psi
    const T mean = sum / T(count);
    for (index_t i = 0; i < n; ++i)
      if (has_null_evidence(kinds[static_cast<std::size_t>(i)], opt.headless)) dpsi[i] = psi[i] - mean;
    return dpsi;
  }
  // authors_code: every candidate is in the mean; those without evidence count as psi = 0.
  Vec<T> full(n);
  for (index_t i = 0; i < n; ++i)
    full[i] = has_null_evidence(kinds[static_cast<std::size_t>(i)], opt.headless) ? psi[i] : T(0);
  const T mean = n > 0 ? full.sum() / T(n) : T(0);
  for (index_t i = 0; i < n; ++i) dpsi[i] = full[i] - mean;
  return dpsi;
}

/// beta = min(softplus(theta), beta_max).
template <class T>
T coupling_beta(const T& theta, const CouplingOptions& opt = {}) {
  const T beta = softplus(theta);
  const T cap(opt.beta_max);
  return beta < cap ? beta : cap;
}

/// g_new = clamp(g_old - beta * Dpsi, -score_clamp, score_clamp).
template <class T>
Vec<T> couple_depth_logits(const Vec<T>& g_old, const Vec<T>& dpsi, const T& beta,
                           const CouplingOptions& opt = {}) {
  OASIS_REQUIRE(g_old.size() == dpsi.size(), "dpsi", "has ", dpsi.size(), " entries but g_old has ",
                g_old.size());
  OASIS_REQUIRE(is_finite(beta) && beta >= T(0), "beta", "must be finite and >= 0, got ", to_double(beta));
  const T lim(opt.score_clamp);
  Vec<T> g(g_old.size());
  for (index_t i = 0; i < g.size(); ++i) {
    T x = g_old[i] - beta * dpsi[i];
    if (x > lim) x = lim;
    if (x < -lim) x = -lim;
    g[i] = x;
  }
  return g;
}

inline std::string_view to_string(Centring c) { return c == Centring::paper_v2 ? "paper_v2" : "authors_code"; }
inline Centring parse_centring(std::string_view name) {
  if (name == "paper_v2") return Centring::paper_v2;
  if (name == "authors_code") return Centring::authors_code;
  throw invalid_argument("centring", "unknown convention '" + std::string(name) +
                                         "' (expected paper_v2 or authors_code)");
}
inline std::string_view to_string(HeadlessRule r) { return r == HeadlessRule::inherit ? "inherit" : "no_evidence"; }
inline HeadlessRule parse_headless_rule(std::string_view name) {
  if (name == "inherit") return HeadlessRule::inherit;
  if (name == "no_evidence") return HeadlessRule::no_evidence;
  throw invalid_argument("headless", "unknown rule '" + std::string(name) +
                                         "' (expected inherit or no_evidence)");
}

}  // namespace oasis
