// tests/parity/parity_bound.hpp — the kernel parity rule (bounds::check_parity; derivation in
// docs/tolerances.md, "Fused kernels") over every output of an attention call and of its
// backward, shared by the cpu_fast tests, the backend recipe's test and the benchmarks'
// validation before timing (no GoogleTest here).
#pragma once

#include "oasis/ops/error_bounds.hpp"
#include "oasis/grad/backward_bounds.hpp"
#include "oasis/core/tensor.hpp"

namespace oasis::fast_parity {

using Outcome = bounds::ParityOutcome;

/// Check every output of an attention call; `mp` must hold probabilities (return_probs = true),
/// `fast`/`ref` may omit them (then they are not compared).
template <class R>
Outcome check_attention(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                        const AttentionOptions& opt, const AttentionResult<float>& fast,
                        const AttentionResult<float>& ref, const AttentionResult<R>& mp) {
  const bounds::AttentionBounds b = bounds::attention_bounds(q, k, v, opt, mp);
  Outcome o;
  bounds::check_parity("out", fast.out, ref.out, mp.out, b.out, o);
  bounds::check_parity("lse", fast.lse, ref.lse, mp.lse, b.lse, o);
  bounds::check_parity("p_null", fast.p_null, ref.p_null, mp.p_null, b.p_null, o);
  if (!fast.probs.empty() && !ref.probs.empty())
    bounds::check_parity("probs", fast.probs, ref.probs, mp.probs, b.probs, o);
  return o;
}

/// Check every gradient of an attention backward (q, k, v; null_logits with softmax1; bias and
/// scores when `fast` has them) against the reference's `ref` and the high-precision `mp` under
/// the rule, with attention_backward_bounds as the floor; `mp_fwd` is the high-precision forward
/// with return_probs = true.
template <class R>
Outcome check_attention_backward(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                 const AttentionCotangents<float>& d, const AttentionOptions& opt,
                                 const AttentionGrads<float>& fast, const AttentionGrads<float>& ref,
                                 const AttentionGrads<R>& mp, const AttentionResult<R>& mp_fwd) {
  const bounds::AttentionBackwardBounds b = bounds::attention_backward_bounds(q, k, v, d, opt, mp_fwd);
  Outcome o;
  bounds::check_parity("dq", fast.q, ref.q, mp.q, b.q, o);
  bounds::check_parity("dk", fast.k, ref.k, mp.k, b.k, o);
  bounds::check_parity("dv", fast.v, ref.v, mp.v, b.v, o);
  if (opt.normalizer == RowNorm::softmax1)
    bounds::check_parity("dnull_logits", fast.null_logits, ref.null_logits, mp.null_logits, b.null_logits, o);
  if (!opt.bias.empty()) bounds::check_parity("dbias", fast.bias, ref.bias, mp.bias, b.bias, o);
  if (opt.return_probs) bounds::check_parity("dscores", fast.scores, ref.scores, mp.scores, b.scores, o);
  return o;
}

}  // namespace oasis::fast_parity
