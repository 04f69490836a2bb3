// tests/support/parity_bound.hpp — the acceptance criterion of the fast CPU path,
// shared by the parity tests and the benchmarks' pre-timing validation (no GoogleTest here).
//
// For every output element x (out, LSE, p_null, probabilities), with x_mp the oasis::mp50 result
// on the same float inputs, x_ref the plain float reference (token_attention<float>) and b_ref
// the derived per-element bound of that reference (oasis/error_bounds.hpp):
//
//     |x_fast - x_mp| <= 2 |x_ref - x_mp| + b_ref                                      (*)
//
// i.e. at most twice the reference's realised error plus a rounding floor. The floor is b_ref,
// the first-order worst case of any evaluation in float under the same error model; the fused
// kernel stays inside that model with the constants derived in docs/benchmarks.md (scores: a
// d_h-term dot product, as the reference; exp: the polynomial's measured error <= 2 ulp against
// the model's 1 ulp, covered by the factor 2; sums: at most kKeyTile + ceil(m/kKeyTile) + 1 roundings per
// term instead of the reference's m; the online rescale multiplies the output and the sum by the
// same rounded factor, so its rounding cancels in out = O / l and only the products' roundings
// (one per tile) remain, inside the same count).
#pragma once

#include "oasis/error_bounds.hpp"
#include "oasis/tensor.hpp"

namespace oasis::fast_parity {

/// (*) is bounds::check_parity (oasis/error_bounds.hpp), shared with the CUDA parity tests.
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
