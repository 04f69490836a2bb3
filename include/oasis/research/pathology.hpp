// oasis/research/pathology.hpp — the pathology scores of Definitions 5.1 and 5.2 (§5, Assumption D.4).
//
// For one query token t, depth weights alpha_l over the branches l (rows of `probs` are the
// branches' token distributions p^{(l)}_{t,j}) and a set N_t of irrelevant key positions:
//
//   leakage            L = sum_l alpha_l sum_{j in N_t} p^{(l)}_j
//   concentration      C = max_{l,j} alpha_l p^{(l)}_j
//   entropy collapse   E = -H(alpha) - sum_l alpha_l H(p^{(l)}),   H(x) = -sum_k x_k log x_k
//   S_t = L + lambda1 C + lambda2 E                                  (Definition 5.1)
//
// and for vanilla attention (one softmax row p, Definition 5.2):
//   L = sum_{j in N_t} p_j,  C = max_j p_j,  E = -H(p),   S_t^Vanilla = L + lambda1 C + lambda2 E.
//
// Conventions (the paper is silent): 0 log 0 = 0; H is taken over the given entries only, so
// for Softmax1 rows (token or depth) the null category is not a token/branch and is not part of
// H, of the leakage or of the maximum; lambda1, lambda2 must be finite and >= 0 (the sign
// condition of Proposition 5.1). Proposition 5.1 is the sum rule: if each of L, C, E of
// AttnResidual dominates the vanilla one, then S^AR >= S^V — checked by proofs_checks
// (pathology_sum_rule), which does not assume Assumption D.4 holds in any model.
#pragma once

#include <vector>

#include "oasis/core/error.hpp"
#include "oasis/core/scalar.hpp"

namespace oasis {

/// The three terms of a pathology score (Assumption D.4's L_t, C_t, E_t).
template <class T>
struct PathologyTerms {
  T leakage;           ///< L: (depth-weighted) mass on irrelevant positions
  T concentration;     ///< C: largest (depth-weighted) single probability
  T entropy_collapse;  ///< E: negative (joint) entropy
};

/// Shannon entropy H(x) = -sum_k x_k log x_k of x[0..m), with 0 log 0 = 0 (natural log).
template <class T>
T shannon_entropy(const T* x, index_t m) {
  using std::log;
  T h(0);
  for (index_t k = 0; k < m; ++k)
    if (x[k] > T(0)) h -= x[k] * log(x[k]);
  return h;
}

namespace detail {
template <class T>
void require_distribution_entries(const T* x, index_t m, const char* arg) {
  for (index_t k = 0; k < m; ++k)
    OASIS_REQUIRE(is_finite(x[k]) && x[k] >= T(0) && x[k] <= T(1), arg, "entry ", k, " = ", to_double(x[k]),
                  " is not a probability in [0, 1]");
}
template <class T>
void require_lambdas(const T& lambda1, const T& lambda2) {
  OASIS_REQUIRE(is_finite(lambda1) && lambda1 >= T(0), "lambda1", "must be finite and >= 0, got ", to_double(lambda1));
  OASIS_REQUIRE(is_finite(lambda2) && lambda2 >= T(0), "lambda2", "must be finite and >= 0, got ", to_double(lambda2));
}
}  // namespace detail

/// L, C, E of AttnResidual for one token: alpha [L], probs [L, m] (row l = p^{(l)}),
/// irrelevant[m] marks N_t. Rows may be sub-stochastic (Softmax1); see the conventions above.
template <class T>
PathologyTerms<T> pathology_terms(const Vec<T>& alpha, const Mat<T>& probs, const std::vector<bool>& irrelevant) {
  const index_t L = alpha.size(), m = probs.cols();
  OASIS_REQUIRE(L > 0, "alpha", "no depth branch (L = 0)");
  OASIS_REQUIRE(probs.rows() == L, "probs", "has ", probs.rows(), " rows but alpha has ", L, " branches");
  OASIS_REQUIRE(m > 0, "probs", "no key position (m = 0)");
  OASIS_REQUIRE(static_cast<index_t>(irrelevant.size()) == m, "irrelevant", "has ", irrelevant.size(),
                " entries but rows have m = ", m);
  detail::require_distribution_entries(alpha.data(), L, "alpha");
  for (index_t l = 0; l < L; ++l) detail::require_distribution_entries(probs.row(l).data(), m, "probs");
  PathologyTerms<T> r{T(0), T(0), -shannon_entropy(alpha.data(), L)};
  for (index_t l = 0; l < L; ++l) {
    const T* p = probs.row(l).data();
    T leak(0);
    for (index_t j = 0; j < m; ++j) {
      if (irrelevant[static_cast<std::size_t>(j)]) leak += p[j];
      const T c = alpha[l] * p[j];
      if (c > r.concentration) r.concentration = c;
    }
    r.leakage += alpha[l] * leak;
    r.entropy_collapse -= alpha[l] * shannon_entropy(p, m);
  }
  return r;
}

/// L, C, E of vanilla attention for one token: p [m], irrelevant[m] marks N_t.
template <class T>
PathologyTerms<T> vanilla_pathology_terms(const Vec<T>& p, const std::vector<bool>& irrelevant) {
  const index_t m = p.size();
  OASIS_REQUIRE(m > 0, "p", "no key position (m = 0)");
  OASIS_REQUIRE(static_cast<index_t>(irrelevant.size()) == m, "irrelevant", "has ", irrelevant.size(),
                " entries but p has m = ", m);
  detail::require_distribution_entries(p.data(), m, "p");
  PathologyTerms<T> r{T(0), T(0), -shannon_entropy(p.data(), m)};
  for (index_t j = 0; j < m; ++j) {
    if (irrelevant[static_cast<std::size_t>(j)]) r.leakage += p[j];
    if (p[j] > r.concentration) r.concentration = p[j];
  }
  return r;
}

/// S = L + lambda1 C + lambda2 E.
template <class T>
T pathology_score_from_terms(const PathologyTerms<T>& t, const T& lambda1, const T& lambda2) {
  detail::require_lambdas(lambda1, lambda2);
  return t.leakage + lambda1 * t.concentration + lambda2 * t.entropy_collapse;
}

/// Definition 5.1: the per-token pathology score S_t of AttnResidual.
template <class T>
T pathology_score(const Vec<T>& alpha, const Mat<T>& probs, const std::vector<bool>& irrelevant, const T& lambda1,
                  const T& lambda2) {
  detail::require_lambdas(lambda1, lambda2);
  return pathology_score_from_terms(pathology_terms(alpha, probs, irrelevant), lambda1, lambda2);
}

/// Definition 5.2: the vanilla pathology score S_t^Vanilla.
template <class T>
T vanilla_pathology_score(const Vec<T>& p, const std::vector<bool>& irrelevant, const T& lambda1, const T& lambda2) {
  detail::require_lambdas(lambda1, lambda2);
  return pathology_score_from_terms(vanilla_pathology_terms(p, irrelevant), lambda1, lambda2);
}

}  // namespace oasis
