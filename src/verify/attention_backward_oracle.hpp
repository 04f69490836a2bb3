// src/verify/attention_backward_oracle.hpp — the fast (double) oracle of op attention_backward,
// blocked: the reference gradients, the oracle's own error bound and the policy's bounds in one
// pass over tiles of query rows, every sum over keys or rows a matrix product (oracle_kernels.hpp).
//
// It computes what the plain functions compute, in another summation order:
//   ref     token_attention_backward<double> (oasis/grad/attention_backward.hpp): each row's scores,
//           probabilities (normalize_row) and dz (normalize_row_backward) are the reference's own
//           functions; dp = dO V^T, dq = dz K, dk = dz^T Q, dv = P^T dO are products
//   own     attention_backward_bounds<double>            (no flush; the oracle's own error)
//   wc[f]   attention_backward_bounds<float>(flush)      (the worst-case line of f32/f16/bf16 outputs)
//   wc[d]   attention_backward_bounds<double>(flush)     (of f64 outputs; computed when asked)
//   prob    prob_attention_backward_bounds<float>        (the default policy's E; when asked)
// Every bound of backward_bounds.hpp is linear in u apart from its floors: a per-(row, key) term is
// u Z1 + (floors), so one product of the u-free Z1 serves every precision. The floors (2 denorm_min
// and min(T) per term, of the order 1e-38 or below) enter through a per-row or per-(b, kv head)
// maximum times a sum of magnitudes: never below the plain bound, above it by those floors only
// (one exception, below any policy's floor: double's floors of 1e-323 round as subnormals, which a
// product of sums rounds differently from a sum of products).
// Every other difference from the plain functions is a summation order, covered by the gamma_n
// bounds, or, in the bounds' own evaluation, an order or a fused multiply-add (a row's per-key passes
// are vector loops: attention_backward_oracle_rows.cpp), so a verdict never depends on which of the
// two computed it (tests/verify/test_attention_backward_oracle.cpp holds them side by side).
//
// Applies (fast_backward_applies) with finite null logits, on softmax or softmax1, inputs and
// cotangents exact in float. Threads over (batch, kv head) pairs, split into a fixed number of
// parts when they are few; a bias shared across pairs (or heads) runs the pairs in order. Every sum
// has an order fixed by the shape (and the instruction set the row passes run on): the values do not
// depend on the number of threads.
#pragma once

#include "oasis/grad/backward_bounds.hpp"

namespace oasis::verify::detail {

/// What the blocked backward oracle computes besides the reference and its own bound.
struct BackwardOracleRequest {
  bool wc_float = true;    ///< the worst-case line of float-accumulated outputs
  bool wc_double = false;  ///< the worst-case line of f64 outputs
  bool prob = true;        ///< the probabilistic bound (float, flushing)
  double lambda = 0;       ///< its lambda
  double u16 = 0, n16 = 0; ///< P and dS rounded to a 16-bit type (prob_attention_backward_bounds)
  /// The stored forward a FlashAttention-2 backward reads (null: none): its error
  /// (stored_forward_bounds<float>, and <double> with wc_double) and the forward's output with the
  /// bounds of attention_bounds<float> and <double> (out, lse), to check stored tensors against.
  const bounds::StoredForward* stored = nullptr;
};

/// The blocked oracle's results (scores empty; a bound not asked for is empty).
struct BackwardOracle {
  AttentionGrads<double> ref;
  bounds::AttentionBackwardBounds own, wc_float, wc_double, prob;
  AttentionResult<double> fwd;  ///< lse and p_null of every row; out with a stored forward (probs empty)
  bounds::AttentionBackwardBounds fixed_float, fixed_double;  ///< the stored forward's error (stored_forward_bounds)
  bounds::AttentionBounds fwd_float, fwd_double;              ///< attention_bounds' out and lse (stored forward)
};

/// Whether the blocked oracle covers a call with these options (validated).
bool fast_backward_applies(const AttentionOptions& opt);

/// The blocked oracle on inputs and cotangents held in double (either layout).
BackwardOracle fast_attention_backward(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                                       const AttentionCotangents<double>& d, const AttentionOptions& opt,
                                       const BackwardOracleRequest& req);

}  // namespace oasis::verify::detail
