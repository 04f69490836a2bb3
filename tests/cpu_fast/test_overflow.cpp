// Fast CPU path, scores that overflow float: NaN and +inf scores rejected as the reference rejects
// them (forward and backward), overflows at keys a row does not see ignored, -inf scores masked.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cpu_fast_test.hpp"

using namespace oasis;
using namespace oasis::cpu_fast_test;

namespace {

// q.k * scale overflowing float32 to +inf, or to NaN (inf - inf in a non-fused sum; a fused
// multiply-add sum of the same products stays +inf), must throw as normalize_row does in the
// reference; an overflow at a masked key (padding or causally hidden) is no score of the row and
// must change nothing; a visible -inf score is a masked key (weight 0), as in the reference.
// Inputs: B = 2, H = 2 over H_kv = 1 (GQA), Tq = 70 (two query blocks), Tk = 150 (three key
// tiles), d_h = 8; dimensions 0 and 1 of every q and k row are zero, so that only the planted
// (query, key) pairs reach the 1e20 * 1e20 scale and every other score is bitwise unchanged.

struct OverflowInputs {
  Tensor<float> q, k, v;
};

OverflowInputs overflow_inputs(std::uint64_t seed) {
  auto rng = oasis::test::make_rng(seed);
  OverflowInputs in;
  in.q = oasis::test::randn<float>({2, 2, 70, 8}, rng);
  in.k = oasis::test::randn<float>({2, 1, 150, 8}, rng);
  in.v = oasis::test::randn<float>({2, 1, 150, 5}, rng);
  for (index_t b = 0; b < 2; ++b)
    for (index_t c = 0; c < 2; ++c) {
      for (index_t h = 0; h < 2; ++h)
        for (index_t t = 0; t < 70; ++t) in.q(b, h, t, c) = 0.0f;
      for (index_t j = 0; j < 150; ++j) in.k(b, 0, j, c) = 0.0f;
    }
  return in;
}

// Query (b, h, t) and key j get (q0, q1) and (k0, k1) in dimensions 0 and 1.
void plant(OverflowInputs& in, index_t b, index_t h, index_t t, index_t j, float q0, float q1, float k0, float k1) {
  in.q(b, h, t, 0) = q0;
  in.q(b, h, t, 1) = q1;
  in.k(b, 0, j, 0) = k0;
  in.k(b, 0, j, 1) = k1;
}

struct OverflowMode {
  RowNorm norm;
  bool causal;
};

std::vector<OverflowMode> overflow_modes() {
  return {{RowNorm::softmax1, false}, {RowNorm::softmax1, true}, {RowNorm::softmax, false}, {RowNorm::softmax, true}};
}

AttentionOptions options_of(const OverflowMode& m) {
  AttentionOptions opt;
  opt.normalizer = m.norm;
  opt.causal = m.causal;
  return opt;
}

std::string mode_name(const OverflowMode& m) {
  return std::string(to_string(m.norm)) + (m.causal ? " causal" : " full");
}

// Every ISA variant and the dispatcher throw "scores" (with and without probabilities), and so
// does the reference, for the same inputs.
void expect_scores_rejected(const OverflowInputs& in, const AttentionOptions& base, const std::string& where) {
  for (bool probs : {false, true}) {
    AttentionOptions opt = base;
    opt.return_probs = probs;
    SCOPED_TRACE(where + (probs ? ", probs" : ""));
    const Thrown ref = thrown_by([&] { token_attention(in.q, in.k, in.v, opt); });
    EXPECT_TRUE(ref.threw) << "the reference accepted an overflowed score";
    EXPECT_EQ(ref.argument, "scores") << ref.what;
    IsaGuard guard;
    for (const std::string& isa : cpu_fast::available_isas()) {
      cpu_fast::set_isa(isa);
      const Thrown f = thrown_by([&] { cpu_fast::token_attention(in.q, in.k, in.v, opt); });
      EXPECT_TRUE(f.threw) << "isa " << isa << ": cpu_fast accepted an overflowed score";
      EXPECT_EQ(f.argument, "scores") << "isa " << isa << ": " << f.what;
      EXPECT_NE(f.what.find("batch 1, head 0, query 60"), std::string::npos) << "isa " << isa << ": " << f.what;
      AttentionResult<float> r;  // the *_into form throws as well
      EXPECT_EQ(thrown_by([&] { cpu_fast::token_attention_into(in.q, in.k, in.v, opt, r); }).argument, "scores");
    }
    const Thrown d = thrown_by([&] { token_attention(Backend::cpu_fast, in.q, in.k, in.v, opt); });
    EXPECT_EQ(d.argument, "scores") << "dispatcher: " << d.what;
  }
}

// +inf: 1e20 * 1e20 overflows in the first product, whatever the summation. Two rows overflow,
// (b, h, t) = (1, 1, 3) and (1, 0, 60); the error names the first in the reference's order.
TEST(CpuFastOverflow, PosInfScoreThrowsLikeReference) {
  for (const OverflowMode& m : overflow_modes()) {
    OverflowInputs in = overflow_inputs(7101);
    plant(in, 1, 1, 3, 70, 1e20f, 0.0f, 1e20f, 0.0f);  // key 70: visible to every query, even causal
    plant(in, 1, 0, 60, 70, 1e20f, 0.0f, 1e20f, 0.0f);
    AttentionOptions opt = options_of(m);
    if (m.norm == RowNorm::softmax1) opt.null_logits = {0.5, -1.0};
    expect_scores_rejected(in, opt, mode_name(m));
  }
}

// (1e20, 1e20) . (1e20, -1e20): the reference sums +inf + -inf = NaN; a fused multiply-add sum
// gives fma(1e20, -1e20, +inf) = +inf. Both are rejected.
TEST(CpuFastOverflow, InfMinusInfScoreThrowsLikeReference) {
  for (const OverflowMode& m : overflow_modes()) {
    OverflowInputs in = overflow_inputs(7102);
    plant(in, 1, 0, 60, 70, 1e20f, 1e20f, 1e20f, -1e20f);
    AttentionOptions opt = options_of(m);
    expect_scores_rejected(in, opt, mode_name(m));
  }
}

// Query (1, 0, 60) sees keys 0..33 (key_lengths[1] = 34): key 0 overflows ((1e20, 1e20) .
// (1e20, -1e20): NaN in a non-fused sum, +inf fused) and every other visible score is -inf, so
// plain softmax has no finite score in the row (the online maximum stays -inf and a NaN can be
// dropped by the lane maxima); the row must still be rejected, not returned as fully masked.
TEST(CpuFastOverflow, BadScoreAmongNegInfScoresThrowsLikeReference) {
  for (const OverflowMode& m : overflow_modes()) {
    OverflowInputs in = overflow_inputs(7106);
    plant(in, 1, 0, 60, 0, 1e20f, 1e20f, 1e20f, -1e20f);
    for (index_t j = 1; j < 150; ++j) in.k(1, 0, j, 0) = -1e20f;  // q(1, 0, 60) . k_j = -inf
    AttentionOptions opt = options_of(m);
    opt.key_lengths = {150, 34};
    expect_scores_rejected(in, opt, mode_name(m));
  }
}

// An overflow the row does not see changes nothing: on every ISA the fast result is bitwise that
// of the inputs without it (`clean`) and meets the parity criterion against the reference `ref`
// (computed on `in`, where it must not throw) and the mp50 oracle.
void expect_overflow_ignored(const OverflowInputs& in, const OverflowInputs& clean, const AttentionOptions& opt,
                             const AttentionResult<float>& ref) {
  const AttentionResult<R> mp = token_attention(clean.q.cast<R>(), clean.k.cast<R>(), clean.v.cast<R>(), opt);
  IsaGuard guard;
  for (const std::string& isa : cpu_fast::available_isas()) {
    SCOPED_TRACE("isa " + isa);
    cpu_fast::set_isa(isa);
    AttentionResult<float> fast;
    ASSERT_NO_THROW(fast = cpu_fast::token_attention(in.q, in.k, in.v, opt));
    const AttentionResult<float> fast_clean = cpu_fast::token_attention(clean.q, clean.k, clean.v, opt);
    EXPECT_TRUE(oasis::test::exactly_equal("out", fast.out, fast_clean.out));
    EXPECT_TRUE(oasis::test::exactly_equal("lse", fast.lse, fast_clean.lse));
    EXPECT_TRUE(oasis::test::exactly_equal("p_null", fast.p_null, fast_clean.p_null));
    EXPECT_TRUE(oasis::test::exactly_equal("probs", fast.probs, fast_clean.probs));
    expect_fast_parity(isa, in.q, in.k, in.v, opt, fast, ref, mp);
  }
}

// An overflowing (q, k) pair at a key the row does not see: beyond the batch element's key length,
// or causally hidden (in a tile the row partly sees, so the overflow sits in a masked lane).
// Nothing is thrown and the result is bitwise that of the same inputs without the overflow (only
// masked scores differ), which meets the parity criterion against the mp50 oracle.
TEST(CpuFastOverflow, OverflowAtMaskedKeyIsIgnoredLikeReference) {
  for (const OverflowMode& m : overflow_modes()) {
    SCOPED_TRACE(mode_name(m));
    const OverflowInputs clean = overflow_inputs(7103);
    OverflowInputs in = clean;
    AttentionOptions opt = options_of(m);
    opt.key_lengths = {150, 60};
    opt.return_probs = true;
    plant(in, 1, 1, 40, 70, 1e20f, 1e20f, 1e20f, -1e20f);  // key 70 >= key_lengths[1] = 60 (NaN or +inf)
    plant(in, 1, 0, 65, 100, 1e20f, 0.0f, 1e20f, 0.0f);    // key 100 >= 60 as well (+inf)
    if (m.causal) plant(in, 0, 1, 3, 100, 1e20f, 0.0f, 1e20f, 0.0f);  // 100 > 3 + (150 - 70): hidden
    const AttentionResult<float> ref = token_attention(in.q, in.k, in.v, opt);  // no throw
    const AttentionResult<float> ref_clean = token_attention(clean.q, clean.k, clean.v, opt);
    EXPECT_TRUE(oasis::test::exactly_equal("ref out", ref.out, ref_clean.out));
    expect_overflow_ignored(in, clean, opt, ref);
  }
}

// Overflowing (q, k) pairs at keys outside a sliding window of 10 (Tq = 70, Tk = 150: query t sees
// keys t + 71 .. t + 80): key 130 for query 65 sits in a tile the row partly sees (a masked lane),
// key 20 for query 3 in a tile outside the band of its query block (skipped). Nothing is thrown
// and the result is bitwise that of the inputs without the overflow.
TEST(CpuFastOverflow, OverflowOutsideTheWindowIsIgnoredLikeReference) {
  for (const OverflowMode& m : overflow_modes()) {
    SCOPED_TRACE(mode_name(m));
    const OverflowInputs clean = overflow_inputs(7107);
    OverflowInputs in = clean;
    AttentionOptions opt = options_of(m);
    opt.window = 10;
    opt.return_probs = true;
    plant(in, 1, 0, 65, 130, 1e20f, 1e20f, 1e20f, -1e20f);
    plant(in, 0, 1, 3, 20, 1e20f, 0.0f, 1e20f, 0.0f);
    const AttentionResult<float> ref = token_attention(in.q, in.k, in.v, opt);  // no throw
    expect_overflow_ignored(in, clean, opt, ref);
  }
}

// A -inf bias does not hide an overflowed score: the reference forms scale * q.k + b = +inf - inf
// = NaN and rejects the row, and so must every variant.
TEST(CpuFastOverflow, OverflowUnderAMaskingBiasThrowsLikeReference) {
  for (const OverflowMode& m : overflow_modes()) {
    OverflowInputs in = overflow_inputs(7108);
    plant(in, 1, 0, 60, 70, 1e20f, 0.0f, 1e20f, 0.0f);
    AttentionOptions opt = options_of(m);
    opt.bias = Tensor<double>({2, 2, 70, 150});
    opt.bias(1, 0, 60, 70) = -std::numeric_limits<double>::infinity();
    expect_scores_rejected(in, opt, mode_name(m));
  }
}

// (1e20) . (-1e20) = -inf at a visible key: a masked key for the reference's normalize_row
// (weight 0), so no throw and the same result as the reference, key weight exactly 0. In the
// causal case query 0 of head 1 sees keys 0..80 and gets -inf at key 75 (second tile).
TEST(CpuFastOverflow, NegInfScoreIsAMaskedKeyLikeReference) {
  for (const OverflowMode& m : overflow_modes()) {
    SCOPED_TRACE(mode_name(m));
    OverflowInputs in = overflow_inputs(7104);
    plant(in, 0, 1, 0, 75, 1e20f, 0.0f, -1e20f, 0.0f);
    plant(in, 1, 0, 69, 3, 1e20f, 1e20f, -1e20f, -1e20f);  // first tile; -inf in every summation
    AttentionOptions opt = options_of(m);
    opt.return_probs = true;
    const AttentionResult<float> ref = token_attention(in.q, in.k, in.v, opt);
    ASSERT_EQ(ref.probs(0, 1, 0, 75), 0.0f);
    const AttentionResult<R> mp = token_attention(in.q.cast<R>(), in.k.cast<R>(), in.v.cast<R>(), opt);
    IsaGuard guard;
    for (const std::string& isa : cpu_fast::available_isas()) {
      SCOPED_TRACE("isa " + isa);
      cpu_fast::set_isa(isa);
      AttentionResult<float> fast;
      ASSERT_NO_THROW(fast = cpu_fast::token_attention(in.q, in.k, in.v, opt));
      EXPECT_EQ(fast.probs(0, 1, 0, 75), 0.0f);
      EXPECT_EQ(fast.probs(1, 0, 69, 3), 0.0f);
      expect_fast_parity(isa, in.q, in.k, in.v, opt, fast, ref, mp);
    }
  }
}

// Plain softmax, causal with Tq = Tk: query 0 sees key 0 only, and its score is -inf. The
// reference treats the row as fully masked: the documented zero (out 0, LSE -inf, p_null 0) under
// MaskedRow::zero, and the fully-masked-row error under MaskedRow::error; cpu_fast the same (an
// online softmax whose running maximum stays -inf must not form -inf - (-inf) = NaN).
TEST(CpuFastOverflow, EveryVisibleScoreNegInfIsAFullyMaskedRow) {
  auto rng = oasis::test::make_rng(7105);
  Tensor<float> q = oasis::test::randn<float>({1, 2, 100, 8}, rng);
  Tensor<float> k = oasis::test::randn<float>({1, 2, 100, 8}, rng);
  const Tensor<float> v = oasis::test::randn<float>({1, 2, 100, 5}, rng);
  for (index_t c = 0; c < 8; ++c) {  // q.k_0 = -inf for query 0; 0 in dimension 0 elsewhere
    q(0, 1, 0, c) = 1e20f;
    k(0, 1, 0, c) = c == 0 ? -1e20f : 0.0f;
  }
  for (index_t t = 1; t < 100; ++t) q(0, 1, t, 0) = 0.0f;  // other rows: score 0 at key 0
  AttentionOptions opt;
  opt.normalizer = RowNorm::softmax;
  opt.causal = true;
  opt.return_probs = true;
  const AttentionResult<float> ref = token_attention(q, k, v, opt);
  ASSERT_TRUE(std::isinf(ref.lse(0, 1, 0)) && ref.lse(0, 1, 0) < 0);
  AttentionOptions err = opt;
  err.masked_row = MaskedRow::error;
  const Thrown ref_err = thrown_by([&] { token_attention(q, k, v, err); });
  ASSERT_TRUE(ref_err.threw);
  EXPECT_EQ(ref_err.argument, "scores");
  IsaGuard guard;
  for (const std::string& isa : cpu_fast::available_isas()) {
    SCOPED_TRACE("isa " + isa);
    cpu_fast::set_isa(isa);
    const AttentionResult<float> fast = cpu_fast::token_attention(q, k, v, opt);
    for (index_t e = 0; e < 5; ++e) EXPECT_EQ(fast.out(0, 1, 0, e), 0.0f);
    EXPECT_TRUE(std::isinf(fast.lse(0, 1, 0)) && fast.lse(0, 1, 0) < 0) << fast.lse(0, 1, 0);
    EXPECT_EQ(fast.p_null(0, 1, 0), 0.0f);
    EXPECT_EQ(fast.probs(0, 1, 0, 0), 0.0f);
    for (index_t t = 1; t < 100; t += 7) {  // the other rows of the head are ordinary
      EXPECT_NEAR(fast.lse(0, 1, t), ref.lse(0, 1, t), 1e-4f) << "t = " << t;
      EXPECT_NEAR(fast.out(0, 1, t, 0), ref.out(0, 1, t, 0), 1e-4f) << "t = " << t;
    }
    const Thrown f = thrown_by([&] { cpu_fast::token_attention(q, k, v, err); });
    EXPECT_EQ(f.argument, "scores");
    EXPECT_EQ(f.what, ref_err.what);
  }
}

// A score that overflows float is rejected by the backward as by the forward and the reference.
TEST(CpuFastBackward, OverflowedScoreThrowsLikeReference) {
  OverflowInputs in = overflow_inputs(7209);
  plant(in, 1, 0, 60, 70, 1e20f, 0.0f, 1e20f, 0.0f);
  AttentionOptions opt;
  opt.causal = true;
  auto rng = oasis::test::make_rng(7210);
  const AttentionCotangents<float> d{oasis::test::randn<float>({2, 2, 70, 5}, rng), {}, {}};
  const Thrown ref = thrown_by([&] { token_attention_backward(in.q, in.k, in.v, d, opt); });
  EXPECT_EQ(ref.argument, "scores") << ref.what;
  const Thrown fast = thrown_by([&] { cpu_fast::token_attention_backward(in.q, in.k, in.v, d, opt); });
  EXPECT_EQ(fast.argument, "scores") << fast.what;
}

}  // namespace
