// Fast CPU path, attention backward: parity with the oracle for every instruction-set variant, the
// two-step API, key-tile chunks for many threads, identical validation messages; the backward's
// mistakes rejected (null gradient dropped, D without the null, GQA not summed, masks missing in
// the backward).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu_fast_test.hpp"

using namespace oasis;
using namespace oasis::cpu_fast_test;

namespace {

template <class T>
AttentionCotangents<T> cast_cotangents(const AttentionCotangents<float>& d) {
  return {d.out.cast<T>(), d.lse.cast<T>(), d.p_null.cast<T>()};
}

// Float-exact cotangents of a case: dout N(0, 1), dLSE N(0, 1) and (softmax1) dp_null N(0, 1).
AttentionCotangents<float> make_cotangents(const Case& c, const AttentionOptions& opt, std::uint64_t seed) {
  auto rng = oasis::test::make_rng(seed);
  AttentionCotangents<float> d;
  d.out = oasis::test::randn<float>(opt.layout == AttentionLayout::bthd ? Shape{c.B, c.Tq, c.H, c.d_v}
                                                                         : Shape{c.B, c.H, c.Tq, c.d_v}, rng);
  d.lse = oasis::test::randn<float>({c.B, c.H, c.Tq}, rng);
  if (c.norm == RowNorm::softmax1) d.p_null = oasis::test::randn<float>({c.B, c.H, c.Tq}, rng);
  return d;
}

// The backward's oracle: long double (u = 2^-64, 10^12 times below float's; mp50 would make these
// cases take seconds each).
using HP = long double;

// One backward instance: inputs, cotangents, the float reference, the oracle (forward and backward).
struct BackwardCase {
  Inputs in;
  AttentionOptions opt;
  AttentionCotangents<float> d;
  AttentionGrads<float> ref;
  AttentionGrads<HP> mp;
  AttentionResult<HP> mp_fwd;
};

BackwardCase backward_case(const Case& c, std::uint64_t seed) {
  BackwardCase x;
  x.in = make_inputs(c, seed);
  x.opt = x.in.opt;
  x.opt.return_probs = c.probs;
  x.d = make_cotangents(c, x.opt, seed + 1);
  x.ref = token_attention_backward(x.in.q, x.in.k, x.in.v, x.d, x.opt);
  const Tensor<HP> q = x.in.q.cast<HP>(), k = x.in.k.cast<HP>(), v = x.in.v.cast<HP>();
  x.mp = token_attention_backward(q, k, v, cast_cotangents<HP>(x.d), x.opt);
  AttentionOptions fo = x.opt;
  fo.return_probs = true;  // the bounds need the oracle's probabilities
  x.mp_fwd = token_attention(q, k, v, fo);
  return x;
}

fast_parity::Outcome backward_parity(const BackwardCase& x, const AttentionGrads<float>& fast) {
  return fast_parity::check_attention_backward(x.in.q, x.in.k, x.in.v, x.d, x.opt, fast, x.ref, x.mp, x.mp_fwd);
}

class BackwardParity : public ::testing::TestWithParam<Case> {};

TEST_P(BackwardParity, FastWithinTwiceReferenceErrorPlusFloorForEveryIsa) {
  const Case& c = GetParam();
  const BackwardCase x = backward_case(c, 7201);
  const AttentionShape s{c.B, c.H, c.H_kv, c.Tq, c.Tk, c.d_h, c.d_v};
  const bool bthd = c.layout == AttentionLayout::bthd;
  IsaGuard guard;
  for (const std::string& isa : cpu_fast::available_isas()) {
    SCOPED_TRACE("isa " + isa);
    cpu_fast::set_isa(isa);
    const AttentionGrads<float> fast = cpu_fast::token_attention_backward(x.in.q, x.in.k, x.in.v, x.d, x.opt);
    ASSERT_EQ(fast.scores.empty(), !c.probs);
    ASSERT_EQ(fast.bias.empty(), x.opt.bias.empty());
    ASSERT_EQ(fast.null_logits.empty(), c.norm != RowNorm::softmax1);
    const fast_parity::Outcome o = backward_parity(x, fast);
    EXPECT_TRUE(o.ok) << c.name << ": " << o.violations << " violations\n" << o.first;
    RecordProperty("backward_worst_ratio_" + isa, std::to_string(o.worst_ratio));
    std::printf("[parity] backward %s %s: worst |err|/allowed %.3g\n", c.name, isa.c_str(), o.worst_ratio);
    // rows without a visible key: exactly zero gradient (dq, and dL/dz when returned)
    for (index_t b = 0; b < c.B; ++b)
      for (index_t h = 0; h < c.H; ++h)
        for (index_t t = 0; t < c.Tq; ++t) {
          if (!fully_masked(s, x.opt, b, h, t)) continue;
          for (index_t e = 0; e < c.d_h; ++e) ASSERT_EQ(bthd ? fast.q(b, t, h, e) : fast.q(b, h, t, e), 0.0f);
          if (c.probs)
            for (index_t j = 0; j < c.Tk; ++j) ASSERT_EQ(fast.scores(b, h, t, j), 0.0f);
        }
  }
  // the dispatcher runs the same code
  const AttentionGrads<float> a = token_attention_backward(Backend::cpu_fast, x.in.q, x.in.k, x.in.v, x.d, x.opt);
  const AttentionGrads<float> b = cpu_fast::token_attention_backward(x.in.q, x.in.k, x.in.v, x.d, x.opt);
  EXPECT_TRUE(oasis::test::exactly_equal("dq", a.q, b.q));
  EXPECT_TRUE(oasis::test::exactly_equal("dk", a.k, b.k));
  EXPECT_TRUE(oasis::test::exactly_equal("dv", a.v, b.v));
}

INSTANTIATE_TEST_SUITE_P(CpuFast, BackwardParity, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// The two-step API (forward with its row state, then the backward) gives the one-call results
// bitwise and reuses the gradients' storage; results do not depend on workspace reuse.
TEST(CpuFastBackward, TwoStepApiMatchesOneCallAndReusesBuffers) {
  const Case c = cases()[0];
  const Inputs in = make_inputs(c, 7202);
  const AttentionCotangents<float> d = make_cotangents(c, in.opt, 7203);
  const AttentionGrads<float> one = cpu_fast::token_attention_backward(in.q, in.k, in.v, d, in.opt);
  AttentionResult<float> fwd;
  cpu_fast::AttentionRowState state;
  cpu_fast::token_attention_into(in.q, in.k, in.v, in.opt, fwd, state);
  EXPECT_TRUE(oasis::test::exactly_equal("out", fwd.out, cpu_fast::token_attention(in.q, in.k, in.v, in.opt).out));
  AttentionGrads<float> g;
  cpu_fast::token_attention_backward_into(in.q, in.k, in.v, fwd, state, d, in.opt, g);
  const float* storage = g.q.data();
  cpu_fast::release_workspaces();
  cpu_fast::token_attention_backward_into(in.q, in.k, in.v, fwd, state, d, in.opt, g);
  EXPECT_EQ(g.q.data(), storage);
  for (const auto& [name, x, y] : {std::tuple{"dq", &g.q, &one.q}, std::tuple{"dk", &g.k, &one.k},
                                   std::tuple{"dv", &g.v, &one.v}, std::tuple{"dnull", &g.null_logits, &one.null_logits}})
    EXPECT_TRUE(oasis::test::exactly_equal(name, *x, *y));
  // a forward of another call is rejected, naming it
  AttentionResult<float> short_fwd = fwd;
  short_fwd.out = Tensor<float>({1, 1, 1, 1});
  try {
    cpu_fast::token_attention_backward_into(in.q, in.k, in.v, short_fwd, state, d, in.opt, g);
    ADD_FAILURE() << "a forward of the wrong shape was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.argument(), "forward") << e.what();
  }
  cpu_fast::AttentionRowState no_state;
  try {
    cpu_fast::token_attention_backward_into(in.q, in.k, in.v, fwd, no_state, d, in.opt, g);
    ADD_FAILURE() << "an empty row state was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.argument(), "state") << e.what();
  }
}

// With more threads than kv heads the key tiles of a kv head are split into chunks with their own
// dq sums (one tile each here, some chunks of no work): the rule still holds.
TEST(CpuFastBackward, KeyTileChunksForManyThreads) {
  const std::vector<Case> cs = cases();
  for (const char* name : {"softmax1_multi_tile_d64", "window_band_skips_tiles"}) {
    SCOPED_TRACE(name);
    const Case c = *std::find_if(cs.begin(), cs.end(), [&](const Case& k) { return std::string(k.name) == name; });
    const BackwardCase x = backward_case(c, 7208);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(16);
    const AttentionGrads<float> g = cpu_fast::token_attention_backward(x.in.q, x.in.k, x.in.v, x.d, x.opt);
    omp_set_num_threads(saved);
    const fast_parity::Outcome o = backward_parity(x, g);
    EXPECT_TRUE(o.ok) << o.violations << " violations\n" << o.first;
  }
}

// Invalid cotangents and normalisers without a backward get the reference's error.
TEST(CpuFastBackward, InvalidInputSameErrorAsReference) {
  const Case c = cases()[0];
  const Inputs in = make_inputs(c, 7204);
  AttentionCotangents<float> d = make_cotangents(c, in.opt, 7205);
  auto message = [&](bool fast, const AttentionCotangents<float>& dd, const AttentionOptions& o) {
    try {
      if (fast) cpu_fast::token_attention_backward(in.q, in.k, in.v, dd, o);
      else token_attention_backward(in.q, in.k, in.v, dd, o);
    } catch (const invalid_argument& e) {
      return std::string(e.argument()) + ": " + e.what();
    }
    return std::string();
  };
  AttentionCotangents<float> bad = d;
  bad.out = Tensor<float>({1, 2, 3, 4});
  AttentionCotangents<float> nan = d;
  nan.lse[5] = std::numeric_limits<float>::quiet_NaN();
  AttentionOptions clipped = in.opt;
  clipped.normalizer = RowNorm::clipped_softmax1;
  for (const auto& [dd, o] : {std::pair{bad, in.opt}, std::pair{nan, in.opt}, std::pair{d, clipped}}) {
    const std::string ref = message(false, dd, o);
    EXPECT_FALSE(ref.empty());
    EXPECT_EQ(message(true, dd, o), ref);
  }
}

// The criterion has power over the backward: each of these mistakes, made by the kernel itself on
// altered inputs that are equivalent to it, is rejected by the parity rule.
//   null gradient dropped       ds = 0
//   D without the null          D computed from the probabilities renormalised without the null,
//                               <dO, O> / (1 - p_null): the same kernel with dLSE + D - D_wrong
//   D without p_null dP         D = <dO, O>: the same kernel with dLSE + p_null dP
//   GQA not summed              dk, dv of a kv head from its last query head only: the kernel with
//                               the other heads' cotangents zero
//   causal / window missing     the backward recomputes P without the mask the forward used
TEST(CpuFastBackwardCriterion, RejectsTheMutants) {
  Case c = cases()[0];  // softmax1, GQA 2 query heads per kv head, causal, padding, null logits
  const BackwardCase x = backward_case(c, 7206);
  ASSERT_TRUE(backward_parity(x, cpu_fast::token_attention_backward(x.in.q, x.in.k, x.in.v, x.d, x.opt)).ok);
  const AttentionResult<float> f = token_attention(x.in.q, x.in.k, x.in.v, x.opt);
  auto D_of = [&](index_t b, index_t h, index_t t) {  // <dO, O> and p_null dP in double
    double dot = 0;
    for (index_t e = 0; e < c.d_v; ++e) dot += static_cast<double>(x.d.out(b, h, t, e)) * f.out(b, h, t, e);
    return std::pair{dot, static_cast<double>(f.p_null(b, h, t)) * x.d.p_null(b, h, t)};
  };
  auto expect_rejected = [&](const char* what, const AttentionGrads<float>& g) {
    const fast_parity::Outcome o = backward_parity(x, g);
    EXPECT_FALSE(o.ok) << "the parity rule missed: " << what;
    std::printf("mutant %-28s rejected: %ld violations\n", what, static_cast<long>(o.violations));
  };
  {
    AttentionGrads<float> g = cpu_fast::token_attention_backward(x.in.q, x.in.k, x.in.v, x.d, x.opt);
    for (index_t h = 0; h < c.H; ++h) g.null_logits[h] = 0.0f;
    expect_rejected("null gradient dropped", g);
  }
  for (const bool renormalised : {true, false}) {
    AttentionCotangents<float> d = x.d;
    for (index_t b = 0; b < c.B; ++b)
      for (index_t h = 0; h < c.H; ++h)
        for (index_t t = 0; t < c.Tq; ++t) {
          const auto [dot, pdp] = D_of(b, h, t);
          const double pn = f.p_null(b, h, t);
          const double wrong = renormalised ? (pn < 1 ? (dot + pdp) / (1 - pn) : dot + pdp) : dot;
          d.lse(b, h, t) = static_cast<float>(d.lse(b, h, t) + (dot + pdp) - wrong);
        }
    expect_rejected(renormalised ? "D without the null" : "D without p_null dP",
                    cpu_fast::token_attention_backward(x.in.q, x.in.k, x.in.v, d, x.opt));
  }
  {
    const index_t group = c.H / c.H_kv;
    AttentionCotangents<float> d = x.d;
    for (index_t b = 0; b < c.B; ++b)
      for (index_t h = 0; h < c.H; ++h) {
        if (h % group == group - 1) continue;
        for (index_t t = 0; t < c.Tq; ++t) {
          for (index_t e = 0; e < c.d_v; ++e) d.out(b, h, t, e) = 0.0f;
          d.lse(b, h, t) = d.p_null(b, h, t) = 0.0f;
        }
      }
    const AttentionGrads<float> last = cpu_fast::token_attention_backward(x.in.q, x.in.k, x.in.v, d, x.opt);
    AttentionGrads<float> g = cpu_fast::token_attention_backward(x.in.q, x.in.k, x.in.v, x.d, x.opt);
    g.k = last.k;
    g.v = last.v;
    expect_rejected("GQA not summed", g);
  }
  {
    AttentionResult<float> fwd;
    cpu_fast::AttentionRowState state;
    cpu_fast::token_attention_into(x.in.q, x.in.k, x.in.v, x.opt, fwd, state);
    AttentionOptions unmasked = x.opt;
    unmasked.causal = false;
    AttentionGrads<float> g;
    cpu_fast::token_attention_backward_into(x.in.q, x.in.k, x.in.v, fwd, state, x.d, unmasked, g);
    expect_rejected("causal mask missing", g);
  }
  {
    const std::vector<Case> cs = cases();
    const Case w = *std::find_if(cs.begin(), cs.end(), [](const Case& k) { return k.window == 70; });  // 300 keys
    const BackwardCase y = backward_case(w, 7207);
    AttentionResult<float> fwd;
    cpu_fast::AttentionRowState state;
    cpu_fast::token_attention_into(y.in.q, y.in.k, y.in.v, y.opt, fwd, state);
    AttentionOptions unmasked = y.opt;
    unmasked.window = 0;
    AttentionGrads<float> g;
    cpu_fast::token_attention_backward_into(y.in.q, y.in.k, y.in.v, fwd, state, y.d, unmasked, g);
    const fast_parity::Outcome o = backward_parity(y, g);
    EXPECT_FALSE(o.ok) << "the parity rule missed: window missing";
    std::printf("mutant %-28s rejected: %ld violations\n", "window missing", static_cast<long>(o.violations));
  }
}

}  // namespace
