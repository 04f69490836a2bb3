// oasis/normalizer.hpp — row normalisers: plain softmax and softmax with a null category.
//
// SPEC §1. For logits z_1..z_m (masked entries are -inf) and a null logit s:
//   LSE1   = log(e^s + sum_k e^{z_k})
//   p_j    = exp(z_j - LSE1),  p_null = exp(s - LSE1),  sum_j p_j + p_null = 1.
// Softmax1 is s = 0; a learnable sink logit (baseline S1, gpt-oss sinks) is any finite s.
// Stable evaluation uses M = max(s, max_j z_j), which includes the null logit, so the
// normaliser sum S = e^{s-M} + sum_k e^{z_k-M} is >= 1 and never overflows, and a fully
// masked row (m = 0 or all -inf) gives p = 0, p_null = 1, LSE1 = s — never NaN.
//
// Plain softmax has no value on a fully masked row. The library's documented choice
// (MaskedRow::zero, the default) is p = 0, LSE = -inf, so that the attention output is 0,
// the same value Softmax1 gives; MaskedRow::error throws instead.
#pragma once

#include <string_view>

#include "oasis/error.hpp"
#include "oasis/scalar.hpp"

namespace oasis {

/// The row normaliser of token attention or of depth routing.
enum class RowNorm {
  softmax,   ///< plain softmax: all mass on real candidates
  softmax1,  ///< softmax with a null category of logit s (Softmax1 when s = 0)
};

/// What plain softmax does with a row that has no visible key.
enum class MaskedRow {
  zero,   ///< documented zero: p = 0, LSE = -inf, attention output 0 (default)
  error,  ///< throw oasis::invalid_argument
};

std::string_view to_string(RowNorm n);
RowNorm parse_row_norm(std::string_view name);  // "softmax" | "softmax1"

/// Per-row statistics of a normaliser.
template <class T>
struct RowStats {
  T lse;     ///< LSE1 = log(e^s + sum e^z) for softmax1; log(sum e^z) for softmax (-inf if empty)
  T p_null;  ///< null probability; 0 for plain softmax
};

/// Normalise one row in place into p[0..m). z may hold -inf (masked); NaN or +inf throws,
/// naming `arg`. `s` is the null logit (ignored by plain softmax) and must be finite.
template <class T>
RowStats<T> normalize_row(RowNorm kind, const T* z, index_t m, const T& s, T* p,
                          MaskedRow policy = MaskedRow::zero, const char* arg = "z") {
  using std::exp; using std::log;
  OASIS_REQUIRE(m >= 0, "m", "negative row length ", m);
  for (index_t j = 0; j < m; ++j)
    OASIS_REQUIRE(!is_nan(z[j]) && !is_pos_inf(z[j]), arg,
                  "logit ", to_double(z[j]), " at index ", j, " (NaN and +inf are not allowed; mask with -inf)");
  const bool has_null = kind == RowNorm::softmax1;
  if (has_null) OASIS_REQUIRE(is_finite(s), "null_logit", "must be finite, got ", to_double(s));

  T M = has_null ? s : neg_inf<T>();
  for (index_t j = 0; j < m; ++j) if (z[j] > M) M = z[j];

  if (!has_null && is_neg_inf(M)) {  // plain softmax, fully masked row
    OASIS_REQUIRE(policy == MaskedRow::zero, arg,
                  "plain softmax on a fully masked row (no visible key) and MaskedRow::error was requested");
    for (index_t j = 0; j < m; ++j) p[j] = T(0);
    return {neg_inf<T>(), T(0)};
  }

  T S = has_null ? exp(s - M) : T(0);
  for (index_t j = 0; j < m; ++j) {
    p[j] = is_neg_inf(z[j]) ? T(0) : exp(z[j] - M);
    S += p[j];
  }
  const T inv = T(1) / S;
  for (index_t j = 0; j < m; ++j) p[j] *= inv;
  const T lse = M + log(S);
  return {lse, has_null ? exp(s - M) * inv : T(0)};
}

/// A normalised row with its statistics.
template <class T>
struct RowProbs {
  Vec<T> p;   ///< probabilities of the real categories
  T p_null;   ///< null probability (0 for plain softmax)
  T lse;      ///< LSE1 (softmax with null) or LSE (plain softmax)
};

/// softmax with a null category of logit s (SPEC §1); the general sink-logit normaliser.
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

/// Either normaliser by name; `s` is used only by softmax1.
template <class T>
RowProbs<T> normalize(RowNorm kind, const Vec<T>& z, const T& s = T(0), MaskedRow policy = MaskedRow::zero) {
  return kind == RowNorm::softmax1 ? softmax_null(z, s) : softmax(z, policy);
}

/// LSE_keys = log sum_k e^{z_k} (-inf for an empty or fully masked row).
template <class T>
T logsumexp(const Vec<T>& z) {
  Vec<T> p(z.size());
  return normalize_row(RowNorm::softmax, z.data(), z.size(), T(0), p.data(), MaskedRow::zero).lse;
}

inline std::string_view to_string(RowNorm n) {
  return n == RowNorm::softmax ? "softmax" : "softmax1";
}
inline RowNorm parse_row_norm(std::string_view name) {
  if (name == "softmax") return RowNorm::softmax;
  if (name == "softmax1") return RowNorm::softmax1;
  throw invalid_argument("normalizer", "unknown row normaliser '" + std::string(name) +
                                           "' (expected softmax or softmax1)");
}

}  // namespace oasis
