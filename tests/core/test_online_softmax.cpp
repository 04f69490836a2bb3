// oasis/ops/online_softmax.hpp: the key range of a row against docs/spec.md §8's definition, checked key by key,
// and the exact values of the online state machine where they are exact (empty rows, rescaling
// from the empty state, masked keys). The kernels that run these functions are checked against
// the oracle in tests/cpu_fast and tests/cuda.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "oasis/ops/attention.hpp"
#include "oasis/ops/online_softmax.hpp"

namespace oasis {
namespace {

// docs/spec.md §2 and §8, one key at a time: j < len; j <= t' if causal or windowed; j > t' - W if windowed.
bool visible_by_definition(index_t j, index_t len, bool causal, index_t W, index_t t, index_t Tq, index_t Tk) {
  const index_t tp = t + (Tk - Tq);
  if (j >= len) return false;
  if ((causal || W > 0) && j > tp) return false;
  if (W > 0 && j <= tp - W) return false;
  return true;
}

TEST(OnlineSoftmax, KeySpanIsTheMaskOfTheSpecAndNeverDecreases) {
  index_t rows = 0, empty = 0;
  for (index_t Tq : {1, 5, 9})
    for (index_t Tk : {1, 4, 9, 13})
      for (bool causal : {false, true})
        for (index_t W : {0, 1, 2, 5, 20})
          for (index_t len = 0; len <= Tk; ++len) {
            online::KeySpan<index_t> prev{0, 0};
            for (index_t t = 0; t < Tq; ++t) {
              const online::KeySpan<index_t> k = online::key_span<index_t>(len, causal, W, t, Tq, Tk);
              ++rows;
              empty += k.begin >= k.end;
              for (index_t j = 0; j < Tk; ++j)
                ASSERT_EQ(j >= k.begin && j < k.end, visible_by_definition(j, len, causal, W, t, Tq, Tk))
                    << "Tq " << Tq << " Tk " << Tk << " causal " << causal << " W " << W << " len " << len << " t "
                    << t << " j " << j;
              ASSERT_LE(k.begin, k.end);
              if (t > 0) {
                ASSERT_GE(k.begin, prev.begin) << "begin decreased at t = " << t;
                ASSERT_GE(k.end, prev.end) << "end decreased at t = " << t;
              }
              prev = k;
              // the 32-bit instance (the CUDA kernels) agrees
              const online::KeySpan<int> k32 = online::key_span<int>(static_cast<int>(len), causal, static_cast<int>(W),
                                                                     static_cast<int>(t), static_cast<int>(Tq),
                                                                     static_cast<int>(Tk));
              ASSERT_EQ(k32.begin, k.begin);
              ASSERT_EQ(k32.end, k.end);
            }
          }
  EXPECT_GT(empty, 0) << "no fully masked row among " << rows;
  // the reference's visible_range is this rule
  const AttentionShape s{2, 1, 1, 6, 9, 1, 1};
  AttentionOptions opt;
  opt.window = 3;
  opt.key_lengths = {9, 5};
  for (index_t t = 0; t < 6; ++t) {
    const KeyRange r = visible_range(s, opt, 1, t);
    const online::KeySpan<index_t> k = online::key_span<index_t>(5, false, 3, t, 6, 9);
    EXPECT_EQ(r.begin, k.begin);
    EXPECT_EQ(r.end, k.end);
  }
}

TEST(OnlineSoftmax, EmptyRowsGiveTheDocumentedValuesExactly) {
  for (float s : {0.0f, -3.5f, 41.0f}) {
    const online::Finish f = online::finish(online::start(true, s), true, s);
    EXPECT_EQ(f.inv, 1.0f);
    EXPECT_EQ(f.lse, s);  // LSE1 = s + log 1
    EXPECT_EQ(f.p_null, 1.0f);
  }
  const online::Finish f = online::finish(online::start(false, 0.0f), false, 0.0f);
  EXPECT_EQ(f.inv, 0.0f);
  EXPECT_TRUE(std::isinf(f.lse) && f.lse < 0);
  EXPECT_EQ(f.p_null, 0.0f);
}

TEST(OnlineSoftmax, MaskedTilesAndTheEmptyStateNeverFormNaN) {
  const float inf = std::numeric_limits<float>::infinity();
  online::State r = online::start(false, 0.0f);
  EXPECT_EQ(online::rescale(r, 3.0f), 0.0f);  // from the empty state: factor 0, not e^{-inf + inf}
  EXPECT_EQ(r.m, 3.0f);
  EXPECT_EQ(r.l, 0.0f);
  online::State r1 = online::start(true, 2.0f);
  EXPECT_EQ(online::rescale(r1, 1.0f), 1.0f);  // below the null logit: no change
  EXPECT_EQ(r1.m, 2.0f);
  EXPECT_EQ(r1.l, 1.0f);
  // a tile whose logits are all -inf (masked: padding, window, bias) changes nothing
  online::State r2 = online::start(false, 0.0f);
  EXPECT_EQ(online::rescale(r2, -inf), 1.0f);
  EXPECT_TRUE(std::isinf(r2.m) && r2.m < 0);
  EXPECT_EQ(r2.l, 0.0f);
  online::State r3 = online::start(true, -1.0f);
  EXPECT_EQ(online::rescale(r3, -inf), 1.0f);
  EXPECT_EQ(online::finish(r3, true, -1.0f).p_null, 1.0f);
  EXPECT_EQ(online::weight(-inf, -inf), 0.0f);
  EXPECT_EQ(online::weight(-inf, 5.0f), 0.0f);
  EXPECT_EQ(online::weight(5.0f, 5.0f), 1.0f);
}

// merge (split-K): an empty partial changes nothing, bitwise, from any state; a partial of one key
// merged into a state is that key's tile update, bitwise; and partials merged from the null
// category's start state give the Softmax1 row of all their keys (null category once).
TEST(OnlineSoftmax, MergeOfPartialsIsTheStreamedRow) {
  const online::State empty = online::start(false, 0.0f);
  for (const online::State from : {online::start(true, 0.5f), empty, online::State{3.0f, 2.5f}}) {
    online::State r = from;
    const online::MergeFactors f = online::merge(r, empty);
    EXPECT_EQ(r.m, from.m);
    EXPECT_EQ(r.l, from.l);
    EXPECT_EQ(f.part, 0.0f);
    EXPECT_EQ(online::merge_output(1.25f, 7.0f, f), 1.25f);
  }
  for (const float z : {-4.0f, 0.25f, 9.0f}) {
    online::State merged = online::start(true, 0.5f), streamed = merged;
    online::merge(merged, online::State{z, 1.0f});  // one key: M_p = z, S_p = e^0 = 1
    online::rescale(streamed, z);
    streamed.l += online::weight(z, streamed.m);
    EXPECT_EQ(merged.m, streamed.m) << z;
    EXPECT_EQ(merged.l, streamed.l) << z;
  }
  // Keys {1, 2} and {3} as two partials, the null logit 0 once: S relative to M = 3.
  online::State a = empty, b = empty, row = online::start(true, 0.0f);
  for (const float z : {1.0f, 2.0f}) {
    online::rescale(a, z);
    a.l += online::weight(z, a.m);
  }
  online::rescale(b, 3.0f);
  b.l += online::weight(3.0f, b.m);
  online::merge(row, a);
  online::merge(row, b);
  EXPECT_EQ(row.m, 3.0f);
  const double want = std::exp(-3.0) + std::exp(-2.0) + std::exp(-1.0) + 1.0;
  EXPECT_NEAR(row.l, want, 8 * std::numeric_limits<float>::epsilon() * want);
  const online::Finish f = online::finish(row, true, 0.0f);
  EXPECT_NEAR(f.p_null, std::exp(-3.0) / want, 8 * std::numeric_limits<float>::epsilon());
}

}  // namespace
}  // namespace oasis
