// src/verify/lse_convention.hpp — the conventions other libraries store a row's LSE in, as options
// of the attention ops (docs/verify.md, "Other libraries' conventions"; bounds in docs/tolerances.md,
// "The LSE in another convention").
//
// For a row with logits z_j over its visible keys and the null logit s:
//   lse_null "included" (default)   LSE1 = log(e^s + sum_j e^{z_j})    (plain softmax: no s)
//            "excluded"             LSE_keys = log sum_j e^{z_j}       (-inf for a row with no visible key)
//   lse_base "e" (default)          the value above
//            "2"                    the value / ln 2 = value * log2(e)  (Triton-style kernels: m log2(e) + log2(l))
// The keys-only value is plain softmax's LSE over the visible keys, so its bound is the row bound
// with the null term left out (error_bounds.hpp row_bound, prob_bounds.hpp prob_row). In base 2, with
// L = log2(e) and zabs = sum_k p_k |z_k| over the terms of the sum (the null included):
//   worst case      B_2 = L (B + 2.04 u zabs) + 2 u |LSE_2|
//   probabilistic   R_2^2 = L^2 (R^2 + 2 zabs^2) + 2 LSE_2^2
// (the product of every logit by the rounded L, and a conversion of the base-e value at the end).
#pragma once

#include <string>
#include <vector>

#include "oasis/core/multiprecision.hpp"
#include "oasis/ops/attention.hpp"
#include "oasis/ops/normalizer.hpp"
#include "op_options.hpp"

namespace oasis::verify::detail {

struct LseConvention {
  bool keys_only = false;  ///< lse_null = "excluded"
  bool base2 = false;      ///< lse_base = "2"
  bool is_default() const { return !keys_only && !base2; }
  /// "keys only, base 2", for the report's bound column ("" for the default).
  std::string describe() const;
};

/// The option keys: lse_null, lse_base.
extern const std::vector<std::string> kLseOptionKeys;
/// Options lse_null ("included" | "excluded") and lse_base ("e" | "2"); another value is an error
/// naming the option.
LseConvention lse_convention(const Options& o);

/// One row's LSE: the value (and its mp50 value when `exact`) and the u-free pieces of its bounds
/// (worst case wc: the bound is u wc; probabilistic R).
struct LseRow {
  double value = 0;
  mp50 value_mp;
  bool exact = false;
  double wc = 0, R = 0;
};

/// The logits of one row as the oracle holds them: z over the row's keys (-inf masked) with the
/// u-free pieces of their own errors (zc: worst case; zeta2: probabilistic), the null logit s of
/// `kind`, the shared-event sum sigma, the row's probabilities p and p_null (with the null).
struct RowLogits {
  RowNorm kind;
  const double *z, *zc, *zeta2;
  index_t m;
  double s, sigma;
  const double* p;
  double p_null;
};

/// `row` (the LSE with the null, base e) turned into convention `cv`. An exact row needs
/// `keys_mp`, the keys-only LSE in mp50, when cv.keys_only.
void to_convention(const LseConvention& cv, const RowLogits& g, const mp50* keys_mp, LseRow& row);

/// The keys-only LSE in mp50 from the row's LSE1 and probabilities in mp50: LSE1 + log(sum_j p_j)
/// (a sum of positive terms: no cancellation). False when LSE1 = +inf (a +inf null logit, p = 0):
/// the caller computes it from the logits.
bool keys_lse_from_probs(const mp50& lse1, const std::vector<mp50>& p, mp50& out);

/// A stored LSE [B, H, Tq] in convention `cv` as LSE1 in nats (with the null of `opt`, if any):
/// base 2 times ln 2; keys only, log(e^s + e^LSE_keys).
Tensor<double> lse1_of(const LseConvention& cv, const AttentionOptions& opt, const Tensor<double>& lse);

/// The incoming gradient g = grad_lse of the LSE in convention `cv` as the cotangents of LSE1 and
/// p_null that the reference backward takes (grad/attention_backward.hpp), from the exact forward
/// `fwd` (with probabilities): in base 2 dLSE1 = log2(e) g; keys only, LSE_keys = LSE1 +
/// log(sum_j p_j), so dLSE1 = g and dp_null = grad_p_null - g / sum_j p_j (a row with no visible
/// key has LSE_keys = -inf, a constant: nothing). `dpn` may be null (0). A keys-only gradient on a
/// head whose null logit is +inf (p = 0, no LSE1 to convert from) is refused, naming grad_lse.
void lse_cotangents(const LseConvention& cv, const AttentionResult<mp50>& fwd, RowNorm kind, const Tensor<double>& g,
                    const Tensor<double>* dpn, Tensor<mp50>& dlse1, Tensor<mp50>& dpn1);

}  // namespace oasis::verify::detail
