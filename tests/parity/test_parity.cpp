// The parity suite: every registered backend (oasis/backends/registry.hpp; reference, cpu_fast,
// cuda and the recipe's echo) against the high-precision oracle. The test bodies are written once
// and instantiated for each backend of parity_backends(); a backend that is not available in
// this process skips with its reason. Every assertion is the kernel parity rule (parity_rule.hpp;
// docs/tolerances.md, "Fused kernels").
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention_parity.hpp"
#include "oasis/backends/registry.hpp"
#include "oasis/core/instances.hpp"
#include "oasis/core/multiprecision.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis_test.hpp"
#include "parity_rule.hpp"
#include "random_attention_case.hpp"
#include "replay.hpp"

namespace oasis::test {
namespace {

using R = mp50;

// --- token attention ----------------------------------------------------------------------------

class AttentionParity : public ::testing::TestWithParam<std::tuple<std::string, AttentionCase>> {};

TEST_P(AttentionParity, WithinTwiceReferenceErrorPlusFloor) {
  const auto& [name, c] = GetParam();
  const BackendOps& backend = backend_ops(name);
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const AttentionInputs in = make_inputs(c, salt_of(c.name));
  const AttentionResult<float> got = token_attention(backend, in.q, in.k, in.v, in.opt);
  expect_attention_parity<R>(got, in);
}

INSTANTIATE_TEST_SUITE_P(Backends, AttentionParity,
                         ::testing::Combine(::testing::ValuesIn(parity_backends()),
                                            ::testing::ValuesIn(attention_cases())),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

class BackendParity : public ::testing::TestWithParam<std::string> {};

// 8k keys, bottom-right causal with padding, GQA 4:1, d_h = 128; long double oracle.
TEST_P(BackendParity, LongSequence8kKeys) {
  const BackendOps& backend = backend_ops(GetParam());
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const AttentionCase c{"long_8k", 2, 4, 1, 16, 8192, 128, 128, RowNorm::softmax1, true, {8192, 6000}, true};
  AttentionInputs in = make_inputs(c, 8192);
  in.opt.return_probs = false;
  const AttentionResult<float> got = token_attention(backend, in.q, in.k, in.v, in.opt);
  expect_attention_parity<long double>(got, in);
}

// Random shapes: every backend but the reference available in this process on instances
// drawn over the kernels' tiling edges — Tq not a multiple of the 16-query block, Tk not a
// multiple of the 32-key tile, head sizes 1..128 on both sides of the 64/128 tiles, d_v != d_h,
// GQA groups, bottom-right causal with Tq > Tk, padding lengths 0..Tk (fully masked rows), both
// normalisers, null logits, extreme logits (q scaled by 40), sliding windows from 1 key to wider
// than the row, an additive bias of each broadcast shape with -inf masks and fully masked rows,
// both layouts. Oracle: long double (u = 2^-64); rule: parity_rule.hpp. Fully masked rows must
// be exact.
// A violation also writes the case as a replay (tests/support/replay.hpp; rapidcheck's shrinking
// overwrites it, so the files left are those of the last, smallest, failing case).
std::string random_case_violation(const BackendOps& backend, const AttentionInputs& in) {
  const AttentionResult<float> got = token_attention(backend, in.q, in.k, in.v, in.opt);
  for (const ::testing::AssertionResult& r : attention_parity<long double>(got, in))
    if (!r) {
      AttentionOptions hp_opt = in.opt;
      hp_opt.return_probs = !got.probs.empty();
      const AttentionResult<long double> hp =
          token_attention(in.q.cast<long double>(), in.k.cast<long double>(), in.v.cast<long double>(), hp_opt);
      const std::string config = replay::write("RandomShapeParity." + std::string(backend.name),
                                               replay::attention_case(in.q, in.k, in.v, in.opt, got, hp, r.message()));
      return std::string(r.message()) + "\nreplay: oasis-verify compare " + config;
    }
  return "";
}

const char* bias_name(BiasKind k) {
  switch (k) {
    case BiasKind::none: return "none";
    case BiasKind::tk: return "[Tq,Tk]";
    case BiasKind::batch: return "[B,1,Tq,Tk]";
    case BiasKind::head: return "[1,H,Tq,Tk]";
    case BiasKind::full: return "[B,H,Tq,Tk]";
  }
  return "?";
}

RC_GTEST_PROP(RandomShapeParity, FastBackendsWithinTwiceReferenceErrorPlusFloor, ()) {
  const AttentionCase c = random_attention_case();
  const AttentionInputs in = make_inputs(c, *rc::gen::inRange<std::uint64_t>(0, 1u << 30));
  int ran = 0;
  for (const std::string& name : parity_backends()) {
    const BackendOps& backend = backend_ops(name);
    if (name == "reference" || !backend_available(backend)) continue;
    ++ran;
    const std::string v = random_case_violation(backend, in);
    if (!v.empty())
      RC_FAIL(name + " [B H H_kv Tq Tk d_h d_v] = [" + std::to_string(c.B) + " " +
              std::to_string(c.H) + " " + std::to_string(c.H_kv) + " " + std::to_string(c.Tq) + " " +
              std::to_string(c.Tk) + " " + std::to_string(c.d_h) + " " + std::to_string(c.d_v) + "] " +
              std::string(to_string(c.normalizer)) + (c.causal ? " causal" : "") + " window " +
              std::to_string(c.window) + " bias " + bias_name(c.bias) + " " +
              std::string(to_string(c.layout)) + ": " + v);
  }
  RC_ASSERT(ran > 0);  // a fast backend is always available (cpu_fast, or the emulated cuda)
  RC_TAG(std::string(to_string(c.normalizer)));
  RC_TAG(c.window > 0 ? "window" : "no window");
  RC_TAG(c.bias != BiasKind::none ? "bias" : "no bias");
}

// Invalid input gets the reference's error (same argument named) on every backend.
TEST_P(BackendParity, InvalidInputNamesTheArgument) {
  const BackendOps& backend = backend_ops(GetParam());
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  AttentionInputs in = make_inputs(attention_cases()[0], 1);
  in.opt.key_lengths = {41, 3};
  try {
    token_attention(backend, in.q, in.k, in.v, in.opt);
    FAIL() << "a key length beyond Tk was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.argument(), "key_lengths") << e.what();
  }
  // softmax with rows fully masked by padding, by a window beyond the padding, by the bias
  for (const char* name : {"fully_masked_rows_softmax", "window_padded_tq_ne_tk", "bias_masked_rows_softmax"}) {
    const auto cs = attention_cases();
    const auto c = std::find_if(cs.begin(), cs.end(), [&](const AttentionCase& x) { return x.name == name; });
    ASSERT_NE(c, cs.end()) << name;
    in = make_inputs(*c, 2);
    in.opt.masked_row = MaskedRow::error;
    try {
      token_attention(backend, in.q, in.k, in.v, in.opt);
      FAIL() << name << ": MaskedRow::error on a fully masked row did not throw";
    } catch (const invalid_argument& e) {
      EXPECT_EQ(e.argument(), "scores") << name << ": " << e.what();
    }
  }
  in = make_inputs(attention_cases()[0], 3);
  in.opt.window = -1;
  try {
    token_attention(backend, in.q, in.k, in.v, in.opt);
    FAIL() << "a negative window was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.argument(), "window") << e.what();
  }
  in.opt.window = 0;
  in.opt.bias = Tensor<double>({40, 39});  // Tk = 40
  try {
    token_attention(backend, in.q, in.k, in.v, in.opt);
    FAIL() << "a bias of the wrong shape was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.argument(), "bias") << e.what();
  }
}

// --- depth routing ------------------------------------------------------------------------------

struct RouteCase {
  std::string name;
  index_t N, d;
  std::vector<SourceKind> kinds;
  DepthOptions opt;
  double g_scale = 2.0;
};

std::vector<RouteCase> route_cases() {
  using K = SourceKind;
  const std::vector<K> six{K::initial, K::attention, K::headless, K::attention, K::headless, K::attention};
  DepthOptions oasis_default;  // softmax1, coupling paper_v2, theta = -5
  DepthOptions strong = oasis_default;
  strong.beta = 3.0;
  DepthOptions authors;
  authors.coupling_options = CouplingOptions::authors_code();
  authors.beta = 20.0;  // capped at 10
  DepthOptions vanilla;
  vanilla.normalizer = RowNorm::softmax;
  vanilla.coupling = false;
  DepthOptions no_evidence = strong;
  no_evidence.coupling_options.headless = HeadlessRule::no_evidence;
  no_evidence.beta = 2.0;
  return {
      {"oasis_default", 37, 96, six, oasis_default},
      {"strong_coupling", 37, 96, six, strong},
      {"authors_code_clamped", 29, 64, six, authors, 40.0},
      {"vanilla_softmax", 31, 80, six, vanilla},
      {"initial_only", 17, 48, {K::initial}, oasis_default},
      {"headless_no_evidence", 23, 72, {K::initial, K::attention, K::headless, K::attention}, no_evidence},
  };
}

void PrintTo(const RouteCase& c, std::ostream* os) { *os << c.name; }

class RouteParity : public ::testing::TestWithParam<std::tuple<std::string, RouteCase>> {};

TEST_P(RouteParity, WithinTwiceReferenceErrorPlusFloor) {
  const auto& [name, c] = GetParam();
  const BackendOps& backend = backend_ops(name);
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const index_t n = static_cast<index_t>(c.kinds.size());
  std::mt19937_64 rng = make_rng(salt_of(c.name));
  const Tensor<float> sources = randn<float>({n, c.N, c.d}, rng);
  const Tensor<float> g_old = randn<float>({n, c.N}, rng, c.g_scale);
  const Tensor<float> psi = uniform<float>({n, c.N}, rng, 0.0, 1.0);
  const DepthRoute<float> got = attn_res_route(backend, sources, g_old, psi, c.kinds, c.opt);
  const DepthRoute<float> ref = attn_res_route(sources, g_old, psi, c.kinds, c.opt);
  const DepthRoute<R> hp = attn_res_route(sources.cast<R>(), g_old.cast<R>(), psi.cast<R>(), c.kinds, c.opt);
  const bounds::DepthRouteBounds b = bounds::depth_route_bounds(sources, psi, c.kinds, c.opt, hp);
  OASIS_EXPECT_PARITY(within_twice_reference("h", got.h, ref.h, hp.h, b.h));
  OASIS_EXPECT_PARITY(within_twice_reference("alpha", got.alpha, ref.alpha, hp.alpha, b.alpha));
  OASIS_EXPECT_PARITY(within_twice_reference("alpha_null", got.alpha_null, ref.alpha_null, hp.alpha_null, b.alpha_null));
  OASIS_EXPECT_PARITY(within_twice_reference("g", got.g, ref.g, hp.g, b.g));
  OASIS_EXPECT_PARITY(within_twice_reference("dpsi", got.dpsi, ref.dpsi, hp.dpsi, b.dpsi));
  if (!c.opt.coupling) {  // no coupling: g is g_old and Dpsi is 0, exactly
    EXPECT_TRUE(exactly_equal("g", got.g, g_old));
    EXPECT_TRUE(exactly_equal("dpsi", got.dpsi, Tensor<float>(g_old.shape())));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, RouteParity,
                         ::testing::Combine(::testing::ValuesIn(parity_backends()), ::testing::ValuesIn(route_cases())),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

TEST_P(BackendParity, RouteInvalidInputNamesTheArgument) {
  const BackendOps& backend = backend_ops(GetParam());
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  std::mt19937_64 rng = make_rng(5);
  const std::vector<SourceKind> kinds{SourceKind::initial, SourceKind::attention, SourceKind::attention};
  const Tensor<float> sources = randn<float>({3, 4, 8}, rng), g_old = randn<float>({3, 4}, rng);
  Tensor<float> psi = uniform<float>({3, 4}, rng, 0.0, 1.0);
  psi(1, 2) = 1.5f;  // not a probability, on a candidate with evidence
  try {
    attn_res_route(backend, sources, g_old, psi, kinds, DepthOptions{});
    FAIL() << "psi = 1.5 was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.argument(), "psi") << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendParity, ::testing::ValuesIn(parity_backends()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace oasis::test
