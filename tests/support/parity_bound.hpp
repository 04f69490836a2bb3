// tests/support/parity_bound.hpp — the kernel parity rule (bounds::check_parity; derivation in
// docs/tolerances.md, "Fused kernels") over every output of an attention call, shared by the
// cpu_fast tests and the benchmarks' validation before timing (no GoogleTest here).
#pragma once

#include "oasis/error_bounds.hpp"
#include "oasis/tensor.hpp"

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

}  // namespace oasis::fast_parity
