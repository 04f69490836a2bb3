// oasis/ops/normalizer.hpp — row normalisers: plain softmax and softmax with a null category.
//
// docs/spec.md §1. For logits z_1..z_m (masked entries are -inf) and a null logit s:
//   LSE1   = log(e^s + sum_k e^{z_k})
//   p_j    = exp(z_j - LSE1),  p_null = exp(s - LSE1),  sum_j p_j + p_null = 1.
// Softmax1 is s = 0; a learnable sink logit (baseline S1, gpt-oss sinks) is any s but NaN.
// The infinite null logits are limits: s = -inf is a row without a null (p_null = 0; p and LSE
// those of plain softmax, a row with no visible key following MaskedRow); s = +inf puts all the
// mass on the null (p = 0, p_null = 1, LSE1 = +inf).
// Stable evaluation uses M = max(s, max_j z_j), which includes the null logit, so the
// normaliser sum S = e^{s-M} + sum_k e^{z_k-M} is >= 1 and never overflows, and a fully
// masked row (m = 0 or all -inf) gives p = 0, p_null = 1, LSE1 = s — never NaN.
//
// Plain softmax has no value on a fully masked row. The library's documented choice
// (MaskedRow::zero, the default) is p = 0, LSE = -inf, so that the attention output is 0,
// the same value Softmax1 gives; MaskedRow::error throws instead.
//
// Baseline normalisers of the paper (docs/spec.md §4; docs/baselines.md), on the visible keys only
// (a -inf key is removed, so masking equals removal for every normaliser):
//   clipped_softmax   p_j = clip((zeta - gamma) q_j + gamma, 0, 1), q = softmax(z)
//                     (Bondarenko et al. 2023; NormParams gamma <= 0, zeta >= 1)
//   clipped_softmax1  the same with q = Softmax1 / softmax with null logit s ("Clipped
//                     OutEffHop", "Clipped AoS"); RowStats carries Softmax1's LSE1 and p_null
//   sparsemax         p_j = [z_j - tau]_+, sum_j p_j = 1 (Martins & Astudillo 2016), sort-based
//   entmax15          p_j = [z_j/2 - tau]_+^2, sum_j p_j = 1 (Peters et al. 2019, exact
//                     sort-based threshold); for both sparse maps RowStats::lse holds tau, the
//                     analogue of the LSE in p = exp(z - LSE), and p_null = 0.
// Fully masked rows: clipped_softmax, sparsemax and entmax15 follow MaskedRow like plain
// softmax (zero: p = 0, lse = -inf; error: throw); clipped_softmax1 gives p = 0, p_null = 1,
// lse = s like Softmax1.
#pragma once

#include <algorithm>
#include <string_view>
#include <vector>

#include "oasis/core/error.hpp"
#include "oasis/core/scalar.hpp"

namespace oasis {

/// The row normaliser of token attention or of depth routing.
enum class RowNorm {
  softmax,           ///< plain softmax: all mass on real candidates
  softmax1,          ///< softmax with a null category of logit s (Softmax1 when s = 0)
  clipped_softmax,   ///< clip((zeta - gamma) softmax + gamma, 0, 1) (Bondarenko et al. 2023)
  clipped_softmax1,  ///< the clip over softmax with null logit s (Clipped OutEffHop / AoS)
  sparsemax,         ///< Euclidean projection onto the simplex, [z - tau]_+
  entmax15,          ///< 1.5-entmax, [z/2 - tau]_+^2
};

/// Parameters of the parametrised normalisers (clipped softmax's stretch factors). Held in
/// double and converted to the scalar type; the other normalisers ignore them.
struct NormParams {
  double gamma = -0.025;  ///< lower stretch, finite and <= 0 (so a masked key keeps 0)
  double zeta = 1.0;      ///< upper stretch, finite and >= 1 (so a key can take mass 1)
};

/// True for the normalisers with a null category of logit s (softmax1, clipped_softmax1).
inline bool has_null_category(RowNorm n) {
  return n == RowNorm::softmax1 || n == RowNorm::clipped_softmax1;
}

/// What plain softmax does with a row that has no visible key.
enum class MaskedRow {
  zero,   ///< documented zero: p = 0, LSE = -inf, attention output 0 (default)
  error,  ///< throw oasis::invalid_argument
};

std::string_view to_string(RowNorm n);
/// "softmax" | "softmax1" | "clipped_softmax" | "clipped_softmax1" | "sparsemax" | "entmax15"
RowNorm parse_row_norm(std::string_view name);

/// Per-row statistics of a normaliser.
template <class T>
struct RowStats {
  T lse;     ///< LSE1 = log(e^s + sum e^z) for softmax1; log(sum e^z) for softmax (-inf if empty)
  T p_null;  ///< null probability; 0 for plain softmax
};

namespace detail {

/// Sparsemax of the visible logits x[0..n) (n >= 1, all finite), shifted so that max x = 0.
/// Sort descending; the support is the prefix of k with 1 + k x_(k) > sum_{r<=k} x_(r) (true
/// exactly for k <= k*, so the scan stops at the first failure);
/// tau = (sum_{r<=k*} x_(r) - 1) / k*; p = [x - tau]_+. Returns tau.
template <class T>
T sparsemax_threshold(const std::vector<T>& x) {
  std::vector<T> srt(x);
  std::sort(srt.begin(), srt.end(), [](const T& a, const T& b) { return a > b; });
  T cum(0), cum_k(0);
  index_t k = 0;
  for (std::size_t r = 0; r < srt.size(); ++r) {
    cum += srt[r];
    if (!(T(1) + T(static_cast<double>(r + 1)) * srt[r] > cum)) break;
    k = static_cast<index_t>(r + 1);
    cum_k = cum;
  }
  // k >= 1 always: for r = 0, 1 + x_(1) > x_(1).
  return (cum_k - T(1)) / T(static_cast<double>(k));
}

/// 1.5-entmax threshold of y[0..n) (y = (z - max z)/2, n >= 1): p = [y - tau]_+^2 with sum 1.
/// Peters et al. (2019), Alg. 2: for each prefix k of the descending sort,
/// tau_k = mean_k - sqrt(max(0, (1 - ss_k)/k)), ss_k = sum_{r<=k} (y_(r) - mean_k)^2; the
/// support is the prefix of k with tau_k <= y_(k) (true exactly for k <= k*; the scan stops at
/// the first failure). Prefix moments use Welford's update (no cancellation); tau is then
/// re-evaluated for k* with a two-pass variance (same value in exact arithmetic).
template <class T>
T entmax15_threshold(const std::vector<T>& y) {
  using std::sqrt;
  std::vector<T> srt(y);
  std::sort(srt.begin(), srt.end(), [](const T& a, const T& b) { return a > b; });
  T mean(0), ss(0);
  std::size_t k = 1;
  for (std::size_t r = 0; r < srt.size(); ++r) {
    const T kk = T(static_cast<double>(r + 1));
    const T d = srt[r] - mean;
    mean += d / kk;
    ss += d * (srt[r] - mean);
    T delta = (T(1) - ss) / kk;
    if (delta < T(0)) delta = T(0);
    if (!(mean - sqrt(delta) <= srt[r])) break;
    k = r + 1;
  }
  const T kk = T(static_cast<double>(k));
  T m(0);
  for (std::size_t r = 0; r < k; ++r) m += srt[r];
  m /= kk;
  T s2(0);
  for (std::size_t r = 0; r < k; ++r) s2 += (srt[r] - m) * (srt[r] - m);
  T delta = (T(1) - s2) / kk;
  if (delta < T(0)) delta = T(0);
  return m - sqrt(delta);
}

}  // namespace detail

/// Normalise one row in place into p[0..m). z may hold -inf (masked); NaN or +inf throws,
/// naming `arg`. `s` is the null logit (used by softmax1 and clipped_softmax1, which refuse NaN
/// and take +-inf as the limits above; ignored otherwise). `np` holds clipped softmax's gamma and zeta.
template <class T>
RowStats<T> normalize_row(RowNorm kind, const T* z, index_t m, const T& s, T* p, const NormParams& np,
                          MaskedRow policy = MaskedRow::zero, const char* arg = "z") {
  using std::exp;
  OASIS_REQUIRE(m >= 0, "m", "negative row length ", m);
  for (index_t j = 0; j < m; ++j)
    OASIS_REQUIRE(!is_nan(z[j]) && !is_pos_inf(z[j]), arg,
                  "logit ", to_double(z[j]), " at index ", j, " (NaN and +inf are not allowed; mask with -inf)");
  const bool clipped = kind == RowNorm::clipped_softmax || kind == RowNorm::clipped_softmax1;
  if (clipped) {
    OASIS_REQUIRE(std::isfinite(np.gamma) && np.gamma <= 0.0, "gamma",
                  "clipped softmax needs a finite gamma <= 0, got ", np.gamma);
    OASIS_REQUIRE(std::isfinite(np.zeta) && np.zeta >= 1.0, "zeta",
                  "clipped softmax needs a finite zeta >= 1, got ", np.zeta);
  }
  const bool has_null = has_null_category(kind);
  if (has_null) OASIS_REQUIRE(!is_nan(s), "null_logit", "must not be NaN (+-inf are allowed)");
  if (has_null && is_pos_inf(s)) {  // all the mass on the null
    for (index_t j = 0; j < m; ++j) p[j] = T(0);
    return {s, T(1)};
  }

  T M = has_null ? s : neg_inf<T>();
  for (index_t j = 0; j < m; ++j) if (z[j] > M) M = z[j];

  if (is_neg_inf(M)) {  // no mass anywhere: no null (or s = -inf) and no visible key
    OASIS_REQUIRE(policy == MaskedRow::zero, arg, "plain ", to_string(kind),
                  " on a fully masked row (no visible key) and MaskedRow::error was requested");
    for (index_t j = 0; j < m; ++j) p[j] = T(0);
    return {neg_inf<T>(), T(0)};
  }

  if (kind == RowNorm::sparsemax || kind == RowNorm::entmax15) {
    // Shift by the maximum (both maps are invariant to z + c); sparse maps ignore s.
    const bool ent = kind == RowNorm::entmax15;
    std::vector<T> x;
    for (index_t j = 0; j < m; ++j)
      if (!is_neg_inf(z[j])) x.push_back(ent ? (z[j] - M) / T(2) : z[j] - M);
    const T tau = ent ? detail::entmax15_threshold(x) : detail::sparsemax_threshold(x);
    for (index_t j = 0; j < m; ++j) {
      if (is_neg_inf(z[j])) { p[j] = T(0); continue; }
      const T d = (ent ? (z[j] - M) / T(2) : z[j] - M) - tau;
      p[j] = d > T(0) ? (ent ? d * d : d) : T(0);
    }
    return {ent ? tau + M / T(2) : tau + M, T(0)};
  }

  // The term attaining M (the null when s = M, else the first such key) is exactly e^0 = 1, so
  // LSE = M + log1p(rest) with rest the sum of the other terms: M + log(S) would lose the relative
  // accuracy of a tiny LSE (Softmax1 with every logit far below the null: LSE1 ~ sum e^{z_j}).
  const index_t top = [&] {
    if (has_null && !(M > s)) return index_t(-1);
    for (index_t j = 0; j < m; ++j)
      if (z[j] == M) return j;
    return index_t(-1);
  }();
  T S = has_null ? exp(s - M) : T(0);
  T rest = has_null && top >= 0 ? S : T(0);
  for (index_t j = 0; j < m; ++j) {
    p[j] = is_neg_inf(z[j]) ? T(0) : exp(z[j] - M);
    S += p[j];
    if (j != top) rest += p[j];
  }
  const T inv = T(1) / S;
  for (index_t j = 0; j < m; ++j) p[j] *= inv;
  using std::log1p;
  const T lse = M + log1p(rest);
  if (clipped) {
    // p_j = clip((zeta - gamma) q_j + gamma, 0, 1) on visible keys; masked keys stay 0.
    const T a = T(np.zeta) - T(np.gamma), g = T(np.gamma);
    for (index_t j = 0; j < m; ++j) {
      if (is_neg_inf(z[j])) continue;
      const T c = a * p[j] + g;
      p[j] = c < T(0) ? T(0) : (c > T(1) ? T(1) : c);
    }
  }
  return {lse, has_null ? exp(s - M) * inv : T(0)};
}

/// Normalise one row with the default NormParams (gamma = -0.025, zeta = 1 for the clipped
/// normalisers); see the overload above.
template <class T>
RowStats<T> normalize_row(RowNorm kind, const T* z, index_t m, const T& s, T* p,
                          MaskedRow policy = MaskedRow::zero, const char* arg = "z") {
  return normalize_row(kind, z, m, s, p, NormParams{}, policy, arg);
}

/// A normalised row with its statistics.
template <class T>
struct RowProbs {
  Vec<T> p;   ///< probabilities of the real categories
  T p_null;   ///< null probability (0 for plain softmax)
  T lse;      ///< LSE1 (softmax with null) or LSE (plain softmax)
};

/// softmax with a null category of logit s (docs/spec.md §1); the general sink-logit normaliser.
template <class T>
RowProbs<T> softmax_null(const Vec<T>& z, const T& s) {
  RowProbs<T> r{Vec<T>(z.size()), T(0), T(0)};
  const RowStats<T> st = normalize_row(RowNorm::softmax1, z.data(), z.size(), s, r.p.data());
  r.p_null = st.p_null;
  r.lse = st.lse;
  return r;
}

/// Softmax1(z) = softmax([z, 0]) without its last entry.
template <class T>
RowProbs<T> softmax1(const Vec<T>& z) { return softmax_null(z, T(0)); }

/// Plain softmax; fully masked rows follow `policy` (documented zero by default).
template <class T>
RowProbs<T> softmax(const Vec<T>& z, MaskedRow policy = MaskedRow::zero) {
  RowProbs<T> r{Vec<T>(z.size()), T(0), T(0)};
  const RowStats<T> st = normalize_row(RowNorm::softmax, z.data(), z.size(), T(0), r.p.data(), policy);
  r.p_null = st.p_null;
  r.lse = st.lse;
  return r;
}

/// Any normaliser by name; `s` is used only by the normalisers with a null category, `np` only
/// by the clipped ones.
template <class T>
RowProbs<T> normalize(RowNorm kind, const Vec<T>& z, const T& s, const NormParams& np,
                      MaskedRow policy = MaskedRow::zero) {
  RowProbs<T> r{Vec<T>(z.size()), T(0), T(0)};
  const RowStats<T> st = normalize_row(kind, z.data(), z.size(), s, r.p.data(), np, policy);
  r.p_null = st.p_null;
  r.lse = st.lse;
  return r;
}

/// Any normaliser by name with the default NormParams; `s` is used only by softmax1 and
/// clipped_softmax1.
template <class T>
RowProbs<T> normalize(RowNorm kind, const Vec<T>& z, const T& s = T(0), MaskedRow policy = MaskedRow::zero) {
  return normalize(kind, z, s, NormParams{}, policy);
}

/// Sparsemax (RowProbs::lse holds the threshold tau: p = [z - tau]_+).
template <class T>
RowProbs<T> sparsemax(const Vec<T>& z, MaskedRow policy = MaskedRow::zero) {
  return normalize(RowNorm::sparsemax, z, T(0), NormParams{}, policy);
}

/// 1.5-entmax (RowProbs::lse holds the threshold tau: p = [z/2 - tau]_+^2).
template <class T>
RowProbs<T> entmax15(const Vec<T>& z, MaskedRow policy = MaskedRow::zero) {
  return normalize(RowNorm::entmax15, z, T(0), NormParams{}, policy);
}

/// LSE_keys = log sum_k e^{z_k} (-inf for an empty or fully masked row).
template <class T>
T logsumexp(const Vec<T>& z) {
  Vec<T> p(z.size());
  return normalize_row(RowNorm::softmax, z.data(), z.size(), T(0), p.data(), MaskedRow::zero).lse;
}

inline std::string_view to_string(RowNorm n) {
  switch (n) {
    case RowNorm::softmax: return "softmax";
    case RowNorm::softmax1: return "softmax1";
    case RowNorm::clipped_softmax: return "clipped_softmax";
    case RowNorm::clipped_softmax1: return "clipped_softmax1";
    case RowNorm::sparsemax: return "sparsemax";
    case RowNorm::entmax15: return "entmax15";
  }
  return "unknown";
}
inline RowNorm parse_row_norm(std::string_view name) {
  for (RowNorm n : {RowNorm::softmax, RowNorm::softmax1, RowNorm::clipped_softmax, RowNorm::clipped_softmax1,
                    RowNorm::sparsemax, RowNorm::entmax15})
    if (name == to_string(n)) return n;
  throw invalid_argument("normalizer", "unknown row normaliser '" + std::string(name) +
                                           "' (expected softmax, softmax1, clipped_softmax, clipped_softmax1, "
                                           "sparsemax or entmax15)");
}

}  // namespace oasis
