// tests/parity/attention_parity.hpp — the parity of one attention result with the oracle: the
// kernel parity rule (parity_rule.hpp) for every output, then the exactness of the rows without a
// visible key. Shared by the parity suite (test_parity.cpp) and the CUDA kernels' own parity
// tests (tests/cuda/test_kernel_parity.cpp).
#pragma once

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "oasis/core/instances.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "parity_rule.hpp"

namespace oasis::test {

/// Exact outcomes of rows with no visible key (none in the key range, or all masked by the bias):
/// softmax1 out 0, p_null 1, LSE1 = s; plain softmax the documented zero (out 0, p_null 0, LSE -inf).
inline ::testing::AssertionResult masked_rows_exact(const AttentionResult<float>& r, const AttentionInputs& in) {
  return check_fully_masked_rows(in, " fully masked rows exact", [&](const AttentionShape& s, index_t b, index_t h,
                                                                      index_t t) -> ::testing::AssertionResult {
    const bool s1 = in.opt.normalizer == RowNorm::softmax1;
    const float sl = in.opt.null_logits.empty() ? 0.0f : static_cast<float>(in.opt.null_logits[static_cast<std::size_t>(h)]);
    for (index_t c = 0; c < s.d_v; ++c)
      if (out_at(r.out, in.opt, b, h, t, c) != 0.0f)
        return ::testing::AssertionFailure() << "masked row (" << b << "," << h << "," << t << ") out[" << c
                                             << "] = " << out_at(r.out, in.opt, b, h, t, c);
    const float want_pn = s1 ? 1.0f : 0.0f;
    const float want_lse = s1 ? sl : -std::numeric_limits<float>::infinity();
    if (r.p_null(b, h, t) != want_pn || r.lse(b, h, t) != want_lse)
      return ::testing::AssertionFailure() << "masked row (" << b << "," << h << "," << t << "): p_null "
                                           << r.p_null(b, h, t) << " lse " << r.lse(b, h, t);
    return ::testing::AssertionSuccess();
  });
}

/// The parity rule for every output of an attention result against the oracle in H (and the
/// probabilities, when requested), then the exactness of the fully masked rows.
/// `p_rounded`: the kernel rounds P to that format before P V (tensor cores), whose term
/// (bounds::p_rounding_bound) is added to the output's floor.
template <class H>
inline std::vector<::testing::AssertionResult> attention_parity(const AttentionResult<float>& got, const AttentionInputs& in,
                                                         const bounds::Format16* p_rounded = nullptr) {
  const AttentionResult<float> ref = token_attention(in.q, in.k, in.v, in.opt);
  AttentionOptions hp_opt = in.opt;
  hp_opt.return_probs = true;  // the bounds need the oracle's probabilities
  const AttentionResult<H> hp = token_attention(in.q.cast<H>(), in.k.cast<H>(), in.v.cast<H>(), hp_opt);
  bounds::AttentionBounds b = bounds::attention_bounds(in.q, in.k, in.v, in.opt, hp);
  if (p_rounded) {
    const Tensor<double> term = bounds::p_rounding_bound(in.q, in.k, in.v, in.opt, hp, *p_rounded);
    for (index_t i = 0; i < b.out.size(); ++i) b.out[i] += term[i];
  }
  std::vector<::testing::AssertionResult> r = {
      within_twice_reference("out", got.out, ref.out, hp.out, b.out),
      within_twice_reference("lse", got.lse, ref.lse, hp.lse, b.lse),
      within_twice_reference("p_null", got.p_null, ref.p_null, hp.p_null, b.p_null)};
  if (in.opt.return_probs) r.push_back(within_twice_reference("probs", got.probs, ref.probs, hp.probs, b.probs));
  r.push_back(masked_rows_exact(got, in));
  return r;
}

template <class H>
inline void expect_attention_parity(const AttentionResult<float>& got, const AttentionInputs& in,
                             const bounds::Format16* p_rounded = nullptr) {
  for (const ::testing::AssertionResult& r : attention_parity<H>(got, in, p_rounded)) OASIS_EXPECT_PARITY(r);
  if (!in.opt.return_probs) EXPECT_TRUE(got.probs.empty());
}

}  // namespace oasis::test
