// Attention backward: parity of every registered backend (parity_backends(); the CUDA backend on
// the CUDA emulator in the emu. programs) with the high-precision oracle under the kernel parity
// rule (parity_rule.hpp; docs/tolerances.md, "Fused kernels"), the floor being the derived bound
// of the float reference's backward (bounds::attention_backward_bounds); rows without a visible
// key exactly zero; the backward's mistakes rejected (null gradient dropped, D without the null,
// GQA not summed); invalid input named as the reference names it. Written once over the
// backends; an unavailable backend skips with its reason.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "oasis/backends/registry.hpp"
#include "oasis/grad/backward_bounds.hpp"
#include "oasis/grad/instances.hpp"
#include "oasis/core/instances.hpp"
#include "parity_rule.hpp"
#include "random_attention_case.hpp"

namespace oasis::test {
namespace {

/// The oracle: long double (u = 2^-64).
using HP = long double;

/// Float-exact cotangents: dout, dLSE and (softmax1) dp_null, N(0, 1).
AttentionCotangents<float> make_cotangents(const AttentionCase& c, const AttentionOptions& opt, std::uint64_t salt) {
  std::mt19937_64 rng(77003ULL * 1000003ULL + salt);
  std::normal_distribution<double> nd(0.0, 1.0);
  auto fill = [&](Shape s) {
    Tensor<float> t(std::move(s));
    for (index_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(nd(rng));
    return t;
  };
  AttentionCotangents<float> d;
  d.out = fill(opt.layout == AttentionLayout::bthd ? Shape{c.B, c.Tq, c.H, c.d_v} : Shape{c.B, c.H, c.Tq, c.d_v});
  d.lse = fill({c.B, c.H, c.Tq});
  if (c.normalizer == RowNorm::softmax1) d.p_null = fill({c.B, c.H, c.Tq});
  return d;
}

/// The reference backward in float and the oracle's (backward, and forward with probabilities).
struct Oracle {
  AttentionGrads<float> ref;
  AttentionGrads<HP> hp;
  bounds::AttentionBackwardBounds b;
};

Oracle oracle(const AttentionInputs& in, const AttentionCotangents<float>& d) {
  Oracle o;
  o.ref = token_attention_backward(in.q, in.k, in.v, d, in.opt);
  const Tensor<HP> q = in.q.cast<HP>(), k = in.k.cast<HP>(), v = in.v.cast<HP>();
  o.hp = token_attention_backward(q, k, v, AttentionCotangents<HP>{d.out.cast<HP>(), d.lse.cast<HP>(), d.p_null.cast<HP>()},
                                  in.opt);
  AttentionOptions fo = in.opt;
  fo.return_probs = true;  // the bounds need the oracle's probabilities
  o.b = bounds::attention_backward_bounds(in.q, in.k, in.v, d, in.opt, token_attention(q, k, v, fo));
  return o;
}

/// Rows without a visible key pass nothing to q (and their dL/dz is zero).
::testing::AssertionResult masked_rows_zero(const AttentionGrads<float>& g, const AttentionInputs& in) {
  return check_fully_masked_rows(in, " fully masked rows with zero gradients",
                                 [&](const AttentionShape& s, index_t b, index_t h, index_t t) -> ::testing::AssertionResult {
    for (index_t c = 0; c < s.d_h; ++c)
      if (out_at(g.q, in.opt, b, h, t, c) != 0.0f)
        return ::testing::AssertionFailure() << "masked row (" << b << "," << h << "," << t << ") dq[" << c
                                             << "] = " << out_at(g.q, in.opt, b, h, t, c);
    if (!g.scores.empty())
      for (index_t j = 0; j < s.Tk; ++j)
        if (g.scores(b, h, t, j) != 0.0f)
          return ::testing::AssertionFailure() << "masked row (" << b << "," << h << "," << t << ") dz[" << j
                                               << "] = " << g.scores(b, h, t, j);
    return ::testing::AssertionSuccess();
  });
}

/// The rule for every gradient the options ask for, then the masked rows.
std::vector<::testing::AssertionResult> backward_parity(const AttentionGrads<float>& got, const AttentionInputs& in,
                                                        const Oracle& o) {
  std::vector<::testing::AssertionResult> r = {within_twice_reference("dq", got.q, o.ref.q, o.hp.q, o.b.q),
                                               within_twice_reference("dk", got.k, o.ref.k, o.hp.k, o.b.k),
                                               within_twice_reference("dv", got.v, o.ref.v, o.hp.v, o.b.v)};
  if (in.opt.normalizer == RowNorm::softmax1)
    r.push_back(within_twice_reference("dnull_logits", got.null_logits, o.ref.null_logits, o.hp.null_logits,
                                       o.b.null_logits));
  else if (!got.null_logits.empty())
    r.push_back(::testing::AssertionFailure() << "plain softmax returned a null-logit gradient");
  if (!in.opt.bias.empty()) r.push_back(within_twice_reference("dbias", got.bias, o.ref.bias, o.hp.bias, o.b.bias));
  if (in.opt.return_probs)
    r.push_back(within_twice_reference("dscores", got.scores, o.ref.scores, o.hp.scores, o.b.scores));
  else if (!got.scores.empty())
    r.push_back(::testing::AssertionFailure() << "scores' gradient returned without return_probs");
  r.push_back(masked_rows_zero(got, in));
  return r;
}

class BackwardParity : public ::testing::TestWithParam<std::tuple<std::string, AttentionCase>> {};

// The forward's cases (parity_rule.hpp): GQA, causal with padding, fully masked rows of both
// normalisers, extreme logits, odd and mixed head sizes, windows, biases of every broadcast shape
// with masked rows, both layouts; dLSE and dp_null given.
TEST_P(BackwardParity, WithinTwiceReferenceErrorPlusFloor) {
  const auto& [name, c] = GetParam();
  const BackendOps& backend = backend_ops(name);
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const AttentionInputs in = make_inputs(c, salt_of(c.name) + 11);
  const AttentionCotangents<float> d = make_cotangents(c, in.opt, salt_of(c.name));
  const AttentionGrads<float> got = token_attention_backward(backend, in.q, in.k, in.v, d, in.opt);
  for (const ::testing::AssertionResult& r : backward_parity(got, in, oracle(in, d))) OASIS_EXPECT_PARITY(r);
}

INSTANTIATE_TEST_SUITE_P(Backends, BackwardParity,
                         ::testing::Combine(::testing::ValuesIn(parity_backends()),
                                            ::testing::ValuesIn(attention_cases())),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

// Random shapes over the kernels' tiling edges (random_attention_case, as the forward: query and key
// counts off the tiles, head sizes 1..128, d_v != d_h, GQA, causal with Tq > Tk, padding down to 0,
// both normalisers, null logits, extreme logits, windows, biases with masks and fully masked rows,
// both layouts), dLSE and dp_null given or not; every backend but the reference available in this
// process.
RC_GTEST_PROP(RandomShapeBackwardParity, FastBackendsWithinTwiceReferenceErrorPlusFloor, ()) {
  const AttentionCase c = random_attention_case();
  const std::uint64_t seed = *rc::gen::inRange<std::uint64_t>(0, 1u << 30);
  const AttentionInputs in = make_inputs(c, seed);
  AttentionCotangents<float> d = make_cotangents(c, in.opt, seed);
  if (*rc::gen::arbitrary<bool>()) d.lse = Tensor<float>();
  if (*rc::gen::arbitrary<bool>()) d.p_null = Tensor<float>();
  const Oracle o = oracle(in, d);
  int ran = 0;
  for (const std::string& name : parity_backends()) {
    const BackendOps& backend = backend_ops(name);
    if (name == "reference" || !backend_available(backend)) continue;
    ++ran;
    const AttentionGrads<float> got = token_attention_backward(backend, in.q, in.k, in.v, d, in.opt);
    for (const ::testing::AssertionResult& r : backward_parity(got, in, o))
      if (!r)
        RC_FAIL(name + " [B H H_kv Tq Tk d_h d_v] = [" + std::to_string(c.B) + " " +
                std::to_string(c.H) + " " + std::to_string(c.H_kv) + " " + std::to_string(c.Tq) + " " +
                std::to_string(c.Tk) + " " + std::to_string(c.d_h) + " " + std::to_string(c.d_v) + "] " +
                std::string(to_string(c.normalizer)) + (c.causal ? " causal" : "") + " window " +
                std::to_string(c.window) + " " + std::string(to_string(c.layout)) + " seed " + std::to_string(seed) +
                ": " + r.message());
  }
  RC_ASSERT(ran > 0);  // a fast backend is always available (cpu_fast, or the emulated cuda)
  RC_TAG(std::string(to_string(c.normalizer)));
  RC_TAG(c.bias != BiasKind::none ? "bias" : "no bias");
}

class BackwardBackend : public ::testing::TestWithParam<std::string> {};

// The rule has power over each backend's backward: a gradient with one of these mistakes, made by
// the backend itself on inputs that are equivalent to it, is rejected.
//   null gradient dropped    ds = 0
//   D without the null       D from the probabilities renormalised without the null,
//                            <dO, O> / (1 - p_null): the same backward with dLSE + D - D_wrong
//   D without p_null dP      D = <dO, O>: the same backward with dLSE + p_null dP
//   GQA not summed           dk, dv of a kv head from its last query head only: the backward with
//                            the other heads' cotangents zero
TEST_P(BackwardBackend, RejectsTheMutants) {
  const BackendOps& backend = backend_ops(GetParam());
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const AttentionCase c = attention_cases()[0];  // GQA 2:1, causal, padding, null logits, d = 64
  const AttentionInputs in = make_inputs(c, 31);
  const AttentionCotangents<float> d = make_cotangents(c, in.opt, 32);
  const Oracle o = oracle(in, d);
  auto passes = [&](const AttentionGrads<float>& g) {
    for (const ::testing::AssertionResult& r : backward_parity(g, in, o))
      if (!r) return false;
    return true;
  };
  ASSERT_TRUE(passes(token_attention_backward(backend, in.q, in.k, in.v, d, in.opt)));
  const AttentionResult<float> f = token_attention(in.q, in.k, in.v, in.opt);
  {
    AttentionGrads<float> g = token_attention_backward(backend, in.q, in.k, in.v, d, in.opt);
    for (index_t h = 0; h < c.H; ++h) g.null_logits[h] = 0.0f;
    EXPECT_FALSE(passes(g)) << "null gradient dropped";
  }
  for (const bool renormalised : {true, false}) {
    AttentionCotangents<float> dm = d;
    for (index_t b = 0; b < c.B; ++b)
      for (index_t h = 0; h < c.H; ++h)
        for (index_t t = 0; t < c.Tq; ++t) {
          double dot = 0;
          for (index_t e = 0; e < c.d_v; ++e) dot += static_cast<double>(d.out(b, h, t, e)) * f.out(b, h, t, e);
          const double pn = f.p_null(b, h, t), D = dot + pn * d.p_null(b, h, t);
          const double wrong = renormalised ? (pn < 1 ? D / (1 - pn) : D) : dot;
          dm.lse(b, h, t) = static_cast<float>(d.lse(b, h, t) + D - wrong);
        }
    EXPECT_FALSE(passes(token_attention_backward(backend, in.q, in.k, in.v, dm, in.opt)))
        << (renormalised ? "D without the null" : "D without p_null dP");
  }
  {
    const index_t group = c.H / c.H_kv;
    ASSERT_GT(group, 1);
    AttentionCotangents<float> dm = d;
    for (index_t b = 0; b < c.B; ++b)
      for (index_t h = 0; h < c.H; ++h)
        if (h % group != group - 1)
          for (index_t t = 0; t < c.Tq; ++t) {
            for (index_t e = 0; e < c.d_v; ++e) dm.out(b, h, t, e) = 0.0f;
            dm.lse(b, h, t) = dm.p_null(b, h, t) = 0.0f;
          }
    AttentionGrads<float> g = token_attention_backward(backend, in.q, in.k, in.v, d, in.opt);
    const AttentionGrads<float> last = token_attention_backward(backend, in.q, in.k, in.v, dm, in.opt);
    g.k = last.k;
    g.v = last.v;
    EXPECT_FALSE(passes(g)) << "GQA not summed";
  }
}

// Invalid input gets the reference's error (the same argument named) on every backend.
TEST_P(BackwardBackend, InvalidInputNamesTheArgument) {
  const BackendOps& backend = backend_ops(GetParam());
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const auto cs = attention_cases();
  const AttentionInputs in = make_inputs(cs[0], 41);
  const AttentionCotangents<float> d = make_cotangents(cs[0], in.opt, 42);
  auto argument = [&](const AttentionInputs& x, const AttentionCotangents<float>& dd) {
    try {
      token_attention_backward(backend, x.q, x.k, x.v, dd, x.opt);
    } catch (const invalid_argument& e) {
      return std::string(e.argument());
    }
    return std::string("(nothing thrown)");
  };
  AttentionCotangents<float> bad = d;
  bad.out = Tensor<float>({1, 1, 1, 1});
  EXPECT_EQ(argument(in, bad), "dout");
  bad = d;
  bad.p_null = Tensor<float>({2, 2});
  EXPECT_EQ(argument(in, bad), "dp_null");
  bad = d;
  bad.lse[3] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(argument(in, bad), "dlse");
  AttentionInputs other = in;
  other.opt.normalizer = RowNorm::clipped_softmax1;
  EXPECT_EQ(argument(other, d), "normalizer");
  // a score q.k * scale that overflows float (row 0 sees key 0)
  AttentionInputs big = in;
  for (index_t c = 0; c < 2; ++c) {
    big.q(0, 0, 0, c) = 1e30f;
    big.k(0, 0, 0, c) = 1e30f;
  }
  EXPECT_EQ(argument(big, d), "scores");
  // plain softmax with MaskedRow::error on rows masked by padding, and by the bias
  for (const char* name : {"fully_masked_rows_softmax", "bias_masked_rows_softmax"}) {
    const auto c = std::find_if(cs.begin(), cs.end(), [&](const AttentionCase& x) { return x.name == name; });
    ASSERT_NE(c, cs.end()) << name;
    AttentionInputs x = make_inputs(*c, 43);
    x.opt.masked_row = MaskedRow::error;
    EXPECT_EQ(argument(x, make_cotangents(*c, x.opt, 44)), "scores") << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, BackwardBackend, ::testing::ValuesIn(parity_backends()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace oasis::test
