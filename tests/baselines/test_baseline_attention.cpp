// Baseline attention mechanisms (docs/baselines.md): S1 sink logit, S2 prefix sink token, gated
// attention, the StreamingLLM cache policy, and the baseline normalisers inside token attention.
// Reference relations are checked exactly where the computation is the same sequence of
// operations, else in long double against double within derived bounds.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "oasis/ops/attention.hpp"
#include "oasis/research/baselines.hpp"
#include "oasis/core/instances.hpp"
#include "oasis/core/multiprecision.hpp"
#include "oasis_mp.hpp"
#include "oasis_test.hpp"

using namespace oasis;
using oasis::test::exactly_equal;
using oasis::test::make_rng;
using oasis::test::randn;

using R = mp50;

using oasis::test::kMpTol;
using oasis::test::mp_abs;

namespace {

struct Case {
  index_t B, H, H_kv, Tq, Tk, d;
};

Case gen_case() {
  Case c;
  c.B = *rc::gen::inRange(1, 3);
  c.H_kv = *rc::gen::inRange(1, 3);
  c.H = c.H_kv * *rc::gen::inRange(1, 3);
  c.Tk = *rc::gen::inRange(1, 9);
  c.Tq = *rc::gen::inRange<index_t>(1, c.Tk + 1);
  c.d = *rc::gen::inRange(1, 6);
  return c;
}

const RowNorm kAll[] = {RowNorm::softmax, RowNorm::softmax1, RowNorm::clipped_softmax, RowNorm::clipped_softmax1,
                        RowNorm::sparsemax, RowNorm::entmax15};

}  // namespace

// ------------------------------------------------------------------------------------------------
// S1: learnable sink logit.

TEST(BaselineAttention, SinkLogitS1OptionsAreSoftmaxWithPerHeadNullLogit) {
  // Identities of docs/spec.md §1, exact in exact arithmetic, checked in mp50 (1e-40: ~1e-49 roundings
  // on O(1) values, failing any real mistake by tens of orders of magnitude).
  auto rng = make_rng(801);
  const auto q = randn<R>({1, 2, 3, 4}, rng), k = randn<R>({1, 2, 3, 4}, rng), v = randn<R>({1, 2, 3, 4}, rng);
  const AttentionOptions o = sink_logit_options({0.7, -1.5});
  EXPECT_EQ(o.normalizer, RowNorm::softmax1);
  const AttentionResult<R> a = token_attention(q, k, v, o);
  // Per head h: p_null = sigmoid(s_h - LSE_keys) and out = (1 - p_null) * softmax output.
  AttentionOptions plain;
  plain.normalizer = RowNorm::softmax;
  const AttentionResult<R> b = token_attention(q, k, v, plain);
  for (index_t h = 0; h < 2; ++h)
    for (index_t t = 0; t < 3; ++t) {
      const R s = R(o.null_logits[static_cast<std::size_t>(h)]);
      EXPECT_LE(mp_abs(a.p_null(0, h, t) - sigmoid(R(s - b.lse(0, h, t)))), kMpTol);
      for (index_t c = 0; c < 4; ++c)
        EXPECT_LE(mp_abs(a.out(0, h, t, c) - (1 - a.p_null(0, h, t)) * b.out(0, h, t, c)), kMpTol);
    }
  EXPECT_THROW(sink_logit_options({}), oasis::invalid_argument);
  EXPECT_THROW(token_attention(q, k, v, sink_logit_options({0.5})), oasis::invalid_argument);  // one per head
}

// ------------------------------------------------------------------------------------------------
// S2: prefix sink token.

RC_GTEST_PROP(BaselineAttentionProperty, PrefixSinkIsAttentionOverPrependedKeyValue, ()) {
  // Definition: token attention over k' = [k_sink; k], v' = [v_sink; v] with the sink visible to
  // every row. Built here independently (a padded row of length n sees the sink + n keys;
  // causal rows see the sink + their causal prefix) and compared bitwise: the same operations.
  const Case c = gen_case();
  const bool causal = *rc::gen::arbitrary<bool>();
  const RowNorm norm = *rc::gen::elementOf(std::vector<RowNorm>(std::begin(kAll), std::end(kAll)));
  auto rng = make_rng(802 + static_cast<std::uint64_t>(*rc::gen::inRange(0, 1000)));
  const auto q = randn<double>({c.B, c.H, c.Tq, c.d}, rng), k = randn<double>({c.B, c.H_kv, c.Tk, c.d}, rng),
             v = randn<double>({c.B, c.H_kv, c.Tk, c.d}, rng);
  const auto sk = randn<double>({c.H_kv, c.d}, rng), sv = randn<double>({c.H_kv, c.d}, rng);
  AttentionOptions o;
  o.normalizer = norm;
  o.causal = causal;
  o.return_probs = true;
  for (index_t b = 0; b < c.B; ++b) o.key_lengths.push_back(*rc::gen::inRange<index_t>(0, c.Tk + 1));
  const PrefixSinkResult<double> r = prefix_sink_attention(q, k, v, sk, sv, o);
  RC_ASSERT(r.attn.probs.shape() == (Shape{c.B, c.H, c.Tq, c.Tk + 1}));
  const index_t group = c.H / c.H_kv;
  for (index_t b = 0; b < c.B; ++b)
    for (index_t h = 0; h < c.H; ++h)
      for (index_t t = 0; t < c.Tq; ++t) {
        index_t n = o.key_lengths[static_cast<std::size_t>(b)];
        if (causal) n = std::min(n, t + c.Tk - c.Tq + 1);
        Tensor<double> q1({1, 1, 1, c.d}), k1({1, 1, n + 1, c.d}), v1({1, 1, n + 1, c.d});
        for (index_t x = 0; x < c.d; ++x) {
          q1[x] = q(b, h, t, x);
          k1(0, 0, 0, x) = sk(h / group, x);
          v1(0, 0, 0, x) = sv(h / group, x);
          for (index_t j = 0; j < n; ++j) {
            k1(0, 0, j + 1, x) = k(b, h / group, j, x);
            v1(0, 0, j + 1, x) = v(b, h / group, j, x);
          }
        }
        AttentionOptions o1;
        o1.normalizer = norm;
        o1.return_probs = true;
        const AttentionResult<double> e = token_attention(q1, k1, v1, o1);
        for (index_t x = 0; x < c.d; ++x) RC_ASSERT(r.attn.out(b, h, t, x) == e.out(0, 0, 0, x));
        RC_ASSERT(r.p_sink(b, h, t) == e.probs(0, 0, 0, 0));
        for (index_t j = 0; j <= c.Tk; ++j)
          RC_ASSERT(r.attn.probs(b, h, t, j) == (j <= n ? e.probs(0, 0, 0, j) : 0.0));
      }
}

TEST(BaselineAttention, PrefixSinkWithZeroValueScalesTheOutputLikeANullCategory) {
  // With v_sink = 0 and softmax, the sink is a null category of per-query logit
  // z_0 = scale <q_t, k_sink>: out = (1 - p_sink) * (softmax attention without the sink).
  // Exact in exact arithmetic; checked in mp50 within kMpTol.
  auto rng = make_rng(803);
  const auto q = randn<R>({2, 2, 4, 3}, rng), k = randn<R>({2, 1, 5, 3}, rng), v = randn<R>({2, 1, 5, 3}, rng),
             sk = randn<R>({1, 3}, rng);
  const Tensor<R> sv({1, 3});
  AttentionOptions o;
  o.normalizer = RowNorm::softmax;
  o.causal = true;
  const PrefixSinkResult<R> r = prefix_sink_attention(q, k, v, sk, sv, o);
  const AttentionResult<R> plain = token_attention(q, k, v, o);
  for (index_t i = 0; i < plain.out.size(); ++i)
    EXPECT_LE(mp_abs(r.attn.out[i] - (1 - r.p_sink[i / 3]) * plain.out[i]), kMpTol) << i;
  // The sink is always visible: rows with no real key attend only to it.
  o.key_lengths = {0, 5};
  o.causal = false;
  const PrefixSinkResult<R> r0 = prefix_sink_attention(q, k, v, sk, sv, o);
  for (index_t h = 0; h < 2; ++h)
    for (index_t t = 0; t < 4; ++t) EXPECT_EQ(r0.p_sink(0, h, t), R(1));
  EXPECT_THROW(prefix_sink_attention(q, k, v, randn<R>({2, 3}, rng), sv, o), oasis::invalid_argument);
  EXPECT_THROW(prefix_sink_attention(q, k, v, sk, Tensor<R>({1, 2}), o), oasis::invalid_argument);
}

// ------------------------------------------------------------------------------------------------
// Gated attention.

RC_GTEST_PROP(BaselineAttentionProperty, GatedAttentionScalesEachHeadContextByItsGate, ()) {
  const Case c = gen_case();
  const RowNorm norm = *rc::gen::elementOf(std::vector<RowNorm>(std::begin(kAll), std::end(kAll)));
  auto rng = make_rng(804 + static_cast<std::uint64_t>(*rc::gen::inRange(0, 1000)));
  const index_t dm = *rc::gen::inRange(1, 7);
  const auto q = randn<double>({c.B, c.H, c.Tq, c.d}, rng), k = randn<double>({c.B, c.H_kv, c.Tk, c.d}, rng),
             v = randn<double>({c.B, c.H_kv, c.Tk, c.d}, rng), x = randn<double>({c.B, c.Tq, dm}, rng),
             w = randn<double>({c.H, dm}, rng), bias = randn<double>({c.H}, rng);
  AttentionOptions o;
  o.normalizer = norm;
  o.causal = true;
  const GatedAttentionResult<double> g = gated_attention(q, k, v, x, w, bias, o);
  const AttentionResult<double> a = token_attention(q, k, v, o);
  for (index_t b = 0; b < c.B; ++b)
    for (index_t h = 0; h < c.H; ++h)
      for (index_t t = 0; t < c.Tq; ++t) {
        double logit = bias[h];
        for (index_t i = 0; i < dm; ++i) logit += x(b, t, i) * w(h, i);
        const double gate = sigmoid(logit);
        RC_ASSERT(g.gates(b, h, t) == gate);  // same operations in the same order
        RC_ASSERT(g.gates(b, h, t) >= 0.0 && g.gates(b, h, t) <= 1.0);
        for (index_t i = 0; i < c.d; ++i) RC_ASSERT(g.attn.out(b, h, t, i) == a.out(b, h, t, i) * gate);
        RC_ASSERT(g.attn.p_null(b, h, t) == a.p_null(b, h, t));
      }
}

TEST(BaselineAttention, GatedAttentionGateLimitsAndBadInput) {
  auto rng = make_rng(805);
  const auto q = randn<double>({1, 2, 3, 2}, rng), k = randn<double>({1, 2, 3, 2}, rng),
             v = randn<double>({1, 2, 3, 2}, rng), x = randn<double>({1, 3, 4}, rng);
  Tensor<double> w({2, 4}), bias({2});
  bias[0] = -800;  // gate 0 (exp underflow): the head does nothing, exactly
  bias[1] = 800;   // gate 1: the plain head
  const GatedAttentionResult<double> g = gated_attention(q, k, v, x, w, bias);
  const AttentionResult<double> a = token_attention(q, k, v);
  for (index_t t = 0; t < 3; ++t)
    for (index_t c = 0; c < 2; ++c) {
      EXPECT_EQ(g.attn.out(0, 0, t, c), 0.0);
      EXPECT_EQ(g.attn.out(0, 1, t, c), a.out(0, 1, t, c));
    }
  EXPECT_THROW(gated_attention(q, k, v, randn<double>({1, 2, 4}, rng), w), oasis::invalid_argument);  // Tq
  EXPECT_THROW(gated_attention(q, k, v, x, Tensor<double>({3, 4})), oasis::invalid_argument);          // H
  EXPECT_THROW(head_gates(x, Tensor<double>({2, 5})), oasis::invalid_argument);                          // width
  Tensor<double> xn = x;
  xn[1] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(head_gates(xn, w), oasis::invalid_argument);
}

// ------------------------------------------------------------------------------------------------
// StreamingLLM cache policy.

TEST(BaselineAttention, StreamingKeptKeys) {
  const StreamingPolicy pol{2, 3};
  EXPECT_EQ(streaming_kept_keys(0, pol), (std::vector<index_t>{}));
  EXPECT_EQ(streaming_kept_keys(4, pol), (std::vector<index_t>{0, 1, 2, 3}));
  EXPECT_EQ(streaming_kept_keys(5, pol), (std::vector<index_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(streaming_kept_keys(6, pol), (std::vector<index_t>{0, 1, 3, 4, 5}));
  EXPECT_EQ(streaming_kept_keys(10, pol), (std::vector<index_t>{0, 1, 7, 8, 9}));
  EXPECT_EQ(streaming_kept_keys(10, StreamingPolicy{0, 2}), (std::vector<index_t>{8, 9}));
  EXPECT_EQ(streaming_kept_keys(10, StreamingPolicy{3, 0}), (std::vector<index_t>{0, 1, 2}));
  EXPECT_THROW(streaming_kept_keys(-1, pol), oasis::invalid_argument);
  EXPECT_THROW(streaming_kept_keys(3, StreamingPolicy{-1, 2}), oasis::invalid_argument);
  EXPECT_THROW(streaming_kept_keys(3, StreamingPolicy{0, 0}), oasis::invalid_argument);
}

RC_GTEST_PROP(BaselineAttentionProperty, StreamingKeptKeysStructure, ()) {
  const index_t n = *rc::gen::inRange(0, 200);
  const StreamingPolicy pol{*rc::gen::inRange(0, 8), *rc::gen::inRange(1, 40)};
  const auto keep = streaming_kept_keys(n, pol);
  RC_ASSERT(static_cast<index_t>(keep.size()) == std::min(n, pol.n_sink + pol.window));
  for (std::size_t i = 1; i < keep.size(); ++i) RC_ASSERT(keep[i - 1] < keep[i]);  // ascending, distinct
  for (index_t j = 0; j < std::min(n, pol.n_sink); ++j) RC_ASSERT(keep[static_cast<std::size_t>(j)] == j);
  for (index_t j = std::max<index_t>(0, n - pol.window); j < n; ++j)  // the recent window is kept
    RC_ASSERT(std::find(keep.begin(), keep.end(), j) != keep.end());
}

RC_GTEST_PROP(BaselineAttentionProperty, StreamingAttentionIsAttentionOverKeptKeys, ()) {
  // (1) With a budget covering every key it is token_attention, bitwise (same rows). (2) In
  // incremental decoding (Tq = 1 at the end of the keys) it equals token_attention on the kept
  // keys gathered by hand, bitwise, and evicted keys get probability 0.
  const Case c = gen_case();
  const RowNorm norm = *rc::gen::elementOf(std::vector<RowNorm>(std::begin(kAll), std::end(kAll)));
  auto rng = make_rng(806 + static_cast<std::uint64_t>(*rc::gen::inRange(0, 1000)));
  const auto q = randn<double>({c.B, c.H, c.Tq, c.d}, rng), k = randn<double>({c.B, c.H_kv, c.Tk, c.d}, rng),
             v = randn<double>({c.B, c.H_kv, c.Tk, c.d}, rng);
  AttentionOptions o;
  o.normalizer = norm;
  o.causal = true;
  o.return_probs = true;
  const AttentionResult<double> full = token_attention(q, k, v, o);
  const AttentionResult<double> s = streaming_attention(q, k, v, StreamingPolicy{1, c.Tk}, o);
  RC_ASSERT(exactly_equal("out", s.out, full.out));
  RC_ASSERT(exactly_equal("probs", s.probs, full.probs));
  RC_ASSERT(exactly_equal("p_null", s.p_null, full.p_null));

  const StreamingPolicy pol{*rc::gen::inRange(0, 3), *rc::gen::inRange(1, 4)};
  const index_t group = c.H / c.H_kv;
  Tensor<double> q1({c.B, c.H, 1, c.d});
  for (index_t b = 0; b < c.B; ++b)
    for (index_t h = 0; h < c.H; ++h)
      for (index_t x = 0; x < c.d; ++x) q1(b, h, 0, x) = q(b, h, c.Tq - 1, x);
  const AttentionResult<double> dec = streaming_attention(q1, k, v, pol, o);
  const auto keep = streaming_kept_keys(c.Tk, pol);
  const auto n = static_cast<index_t>(keep.size());
  Tensor<double> kg({c.B, c.H_kv, n, c.d}), vg({c.B, c.H_kv, n, c.d});
  for (index_t b = 0; b < c.B; ++b)
    for (index_t g = 0; g < c.H_kv; ++g)
      for (index_t i = 0; i < n; ++i)
        for (index_t x = 0; x < c.d; ++x) {
          kg(b, g, i, x) = k(b, g, keep[static_cast<std::size_t>(i)], x);
          vg(b, g, i, x) = v(b, g, keep[static_cast<std::size_t>(i)], x);
        }
  AttentionOptions og = o;
  og.causal = false;
  const AttentionResult<double> ref = token_attention(q1, kg, vg, og);
  RC_ASSERT(exactly_equal("out", dec.out, ref.out));
  (void)group;
  for (index_t b = 0; b < c.B; ++b)
    for (index_t h = 0; h < c.H; ++h) {
      index_t i = 0;
      for (index_t j = 0; j < c.Tk; ++j) {
        const bool kept = i < n && keep[static_cast<std::size_t>(i)] == j;
        RC_ASSERT(dec.probs(b, h, 0, j) == (kept ? ref.probs(b, h, 0, i) : 0.0));
        if (kept) ++i;
      }
    }
}

TEST(BaselineAttention, StreamingAttentionWithPaddingAndFullyMaskedRows) {
  // A batch element with key length 0 has no visible key: the normaliser's documented
  // fully-masked-row value (softmax: 0, Softmax1: p_null = 1), as in token_attention.
  auto rng = make_rng(807);
  const auto q = randn<double>({2, 1, 1, 2}, rng), k = randn<double>({2, 1, 6, 2}, rng),
             v = randn<double>({2, 1, 6, 2}, rng);
  AttentionOptions o;
  o.key_lengths = {0, 6};
  o.normalizer = RowNorm::softmax1;
  const AttentionResult<double> s = streaming_attention(q, k, v, StreamingPolicy{1, 2}, o);
  EXPECT_EQ(s.p_null(0, 0, 0), 1.0);
  EXPECT_EQ(s.out(0, 0, 0, 0), 0.0);
  EXPECT_LT(s.p_null(1, 0, 0), 1.0);
  o.normalizer = RowNorm::softmax;
  o.masked_row = MaskedRow::error;
  EXPECT_THROW(streaming_attention(q, k, v, StreamingPolicy{1, 2}, o), oasis::invalid_argument);
}

// ------------------------------------------------------------------------------------------------
// Baseline normalisers inside token attention, with parameters.

TEST(BaselineAttention, ClippedParametersReachTokenAttention) {
  auto rng = make_rng(808);
  const auto q = randn<double>({1, 1, 2, 3}, rng), k = randn<double>({1, 1, 4, 3}, rng),
             v = randn<double>({1, 1, 4, 3}, rng);
  AttentionOptions o;
  o.normalizer = RowNorm::clipped_softmax;
  o.return_probs = true;
  o.norm_params = NormParams{-0.3, 1.2};
  const AttentionResult<double> a = token_attention(q, k, v, o);
  o.normalizer = RowNorm::softmax;
  const AttentionResult<double> b = token_attention(q, k, v, o);
  for (index_t i = 0; i < a.probs.size(); ++i)
    EXPECT_EQ(a.probs[i], std::min(1.0, std::max(0.0, 1.5 * b.probs[i] - 0.3)));
  // Clipped OutEffHop/AoS with learned sink logits (S1 + clipping) is accepted.
  o.normalizer = RowNorm::clipped_softmax1;
  o.null_logits = {0.5};
  EXPECT_NO_THROW(token_attention(q, k, v, o));
  o.normalizer = RowNorm::sparsemax;
  EXPECT_THROW(token_attention(q, k, v, o), oasis::invalid_argument);  // no null category
}
