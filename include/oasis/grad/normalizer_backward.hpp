// oasis/grad/normalizer_backward.hpp — the backward of the row normaliser (docs/spec.md §1, §8).
//
// For softmax with a null category of logit s (Softmax1: s = 0) the null is one more category,
// with value vector 0, whose probability is an output too. With incoming gradients dp_j of the
// probabilities, dp_null of the null probability and dlse of LSE1, d p_i / d z_j = p_i (delta_ij - p_j)
// (the null included, z_null = s) gives
//   D      = sum_j p_j dp_j + p_null dp_null                (the expected incoming gradient)
//   dz_j   = p_j (dp_j - D + dlse)
//   ds     = p_null (dp_null - D + dlse)                     (gradient of the null logit)
// so that sum_j dz_j + ds = dlse (the row identity: shifting every logit of the row, the null
// included, moves only the LSE). Plain softmax is the same without the null (p_null = 0, ds = 0).
// A masked key has p_j = 0 and gets dz_j = 0; a fully masked plain-softmax row (documented zero,
// LSE = -inf) has no logit to receive a gradient.
//
// Token attention (dp_j = <dO_t, v_j>, so D = <dO_t, O_t>) and depth routing (dp_i = <dh, s_i>)
// both call this one function.
#pragma once

#include "oasis/ops/normalizer.hpp"

namespace oasis {

/// Backward of one row normalised by normalize_row: p[0..m) and p_null are the forward's outputs,
/// dp[0..m), dp_null and dlse the incoming gradients; writes dz[0..m) and returns ds (0 without a
/// null category). Only softmax and softmax1 have a backward here; other kinds throw.
template <class T>
T normalize_row_backward(RowNorm kind, const T* p, const T& p_null, index_t m, const T* dp, const T& dp_null,
                         const T& dlse, T* dz) {
  OASIS_REQUIRE(kind == RowNorm::softmax || kind == RowNorm::softmax1, "normalizer", "no backward for ",
                to_string(kind), " (the backward covers softmax and softmax1)");
  const bool has_null = kind == RowNorm::softmax1;
  T D = has_null ? T(p_null * dp_null) : T(0);
  for (index_t j = 0; j < m; ++j) D += p[j] * dp[j];
  for (index_t j = 0; j < m; ++j) dz[j] = p[j] * ((dp[j] - D) + dlse);
  return has_null ? T(p_null * ((dp_null - D) + dlse)) : T(0);
}

}  // namespace oasis
