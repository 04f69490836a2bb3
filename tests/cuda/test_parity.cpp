// CUDA backend: parity of every backend with the high-precision oracle. The test bodies
// are written once and parameterised over the backends (reference, cpu_fast, cuda); a backend
// that is not available in this process skips with its reason. Every assertion is the kernel
// parity rule (parity_rule.hpp; docs/tolerances.md, "Fused kernels").
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "oasis/backend.hpp"
#include "oasis/error_bounds.hpp"
#include "oasis/instances.hpp"
#include "oasis/multiprecision.hpp"
#include "oasis_test.hpp"
#include "parity_rule.hpp"
#if defined(OASIS_HAVE_CUDA)
#include "oasis/cuda.hpp"
namespace oasis::io {
inline void PrintTo(DType t, std::ostream* os) { *os << to_string(t); }
}  // namespace oasis::io
#endif

namespace oasis::test {
namespace {

using R = mp50;

const std::vector<Backend> kBackends = parity_backends();

/// Exact outcomes of rows with no visible key (none in the key range, or all masked by the bias):
/// softmax1 out 0, p_null 1, LSE1 = s; plain softmax the documented zero (out 0, p_null 0, LSE -inf).
::testing::AssertionResult masked_rows_exact(const AttentionResult<float>& r, const AttentionInputs& in) {
  const AttentionShape s = check_attention_args(in.q, in.k, in.v, in.opt);
  index_t rows = 0;
  for (index_t b = 0; b < s.B; ++b)
    for (index_t h = 0; h < s.H; ++h)
      for (index_t t = 0; t < s.Tq; ++t) {
        if (!fully_masked_row(s, in.opt, b, h, t)) continue;
        ++rows;
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
      }
  return ::testing::AssertionSuccess() << rows << " fully masked rows exact";
}

/// The parity rule for every output of an attention result against the oracle in H (and the
/// probabilities, when requested), then the exactness of the fully masked rows.
template <class H>
std::vector<::testing::AssertionResult> attention_parity(const AttentionResult<float>& got, const AttentionInputs& in) {
  const AttentionResult<float> ref = token_attention(in.q, in.k, in.v, in.opt);
  AttentionOptions hp_opt = in.opt;
  hp_opt.return_probs = true;  // the bounds need the oracle's probabilities
  const AttentionResult<H> hp = token_attention(in.q.cast<H>(), in.k.cast<H>(), in.v.cast<H>(), hp_opt);
  const bounds::AttentionBounds b = bounds::attention_bounds(in.q, in.k, in.v, in.opt, hp);
  std::vector<::testing::AssertionResult> r = {
      within_twice_reference("out", got.out, ref.out, hp.out, b.out),
      within_twice_reference("lse", got.lse, ref.lse, hp.lse, b.lse),
      within_twice_reference("p_null", got.p_null, ref.p_null, hp.p_null, b.p_null)};
  if (in.opt.return_probs) r.push_back(within_twice_reference("probs", got.probs, ref.probs, hp.probs, b.probs));
  r.push_back(masked_rows_exact(got, in));
  return r;
}

template <class H>
void expect_attention_parity(const AttentionResult<float>& got, const AttentionInputs& in) {
  for (const ::testing::AssertionResult& r : attention_parity<H>(got, in)) OASIS_EXPECT_PARITY(r);
  if (!in.opt.return_probs) EXPECT_TRUE(got.probs.empty());
}

// --- token attention ----------------------------------------------------------------------------

class AttentionParity : public ::testing::TestWithParam<std::tuple<Backend, AttentionCase>> {};

TEST_P(AttentionParity, WithinTwiceReferenceErrorPlusFloor) {
  const auto& [backend, c] = GetParam();
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const AttentionInputs in = make_inputs(c, salt_of(c.name));
  const AttentionResult<float> got = token_attention(backend, in.q, in.k, in.v, in.opt);
  expect_attention_parity<R>(got, in);
}

INSTANTIATE_TEST_SUITE_P(Backends, AttentionParity,
                         ::testing::Combine(::testing::ValuesIn(kBackends), ::testing::ValuesIn(attention_cases())),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name;
                         });

class BackendParity : public ::testing::TestWithParam<Backend> {};

// 8k keys, bottom-right causal with padding, GQA 4:1, d_h = 128; long double oracle.
TEST_P(BackendParity, LongSequence8kKeys) {
  const Backend backend = GetParam();
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const AttentionCase c{"long_8k", 2, 4, 1, 16, 8192, 128, 128, RowNorm::softmax1, true, {8192, 6000}, true};
  AttentionInputs in = make_inputs(c, 8192);
  in.opt.return_probs = false;
  const AttentionResult<float> got = token_attention(backend, in.q, in.k, in.v, in.opt);
  expect_attention_parity<long double>(got, in);
}

// Random shapes: every fast backend available in this process (cpu_fast, cuda) on instances
// drawn over the kernels' tiling edges — Tq not a multiple of the 16-query block, Tk not a
// multiple of the 32-key tile, head sizes 1..128 on both sides of the 64/128 tiles, d_v != d_h,
// GQA groups, bottom-right causal with Tq > Tk, padding lengths 0..Tk (fully masked rows), both
// normalisers, null logits, extreme logits (q scaled by 40), sliding windows from 1 key to wider
// than the row, an additive bias of each broadcast shape with -inf masks and fully masked rows,
// both layouts. Oracle: long double (u = 2^-64); rule: parity_rule.hpp. Fully masked rows must
// be exact.
std::string random_case_violation(Backend backend, const AttentionInputs& in) {
  const AttentionResult<float> got = token_attention(backend, in.q, in.k, in.v, in.opt);
  for (const ::testing::AssertionResult& r : attention_parity<long double>(got, in))
    if (!r) return r.message();
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
  AttentionCase c;
  c.name = "random";
  c.B = *rc::gen::inRange<index_t>(1, 3);
  c.H_kv = *rc::gen::inRange<index_t>(1, 3);
  c.H = c.H_kv * *rc::gen::inRange<index_t>(1, 4);
  c.Tq = *rc::gen::inRange<index_t>(1, 49);
  c.Tk = *rc::gen::inRange<index_t>(1, 101);
  c.d_h = *rc::gen::inRange<index_t>(1, 129);
  c.d_v = *rc::gen::arbitrary<bool>() ? c.d_h : *rc::gen::inRange<index_t>(1, 129);
  c.normalizer = *rc::gen::element(RowNorm::softmax1, RowNorm::softmax);
  c.causal = *rc::gen::arbitrary<bool>();
  if (*rc::gen::arbitrary<bool>())
    for (index_t b = 0; b < c.B; ++b) c.key_lengths.push_back(*rc::gen::inRange<index_t>(0, c.Tk + 1));
  c.null_logits = c.normalizer == RowNorm::softmax1 && *rc::gen::arbitrary<bool>();
  c.q_scale = *rc::gen::element(1.0, 8.0, 40.0);
  c.probs = *rc::gen::arbitrary<bool>();
  if (*rc::gen::arbitrary<bool>()) c.window = *rc::gen::inRange<index_t>(1, c.Tk + 6);
  c.bias = *rc::gen::element(BiasKind::none, BiasKind::none, BiasKind::tk, BiasKind::batch, BiasKind::head,
                             BiasKind::full);
  c.bias_masked = *rc::gen::element(0.0, 0.3, 0.9);
  c.bias_masked_rows = *rc::gen::inRange<index_t>(0, 3);
  c.layout = *rc::gen::element(AttentionLayout::bhtd, AttentionLayout::bthd);
  const AttentionInputs in = make_inputs(c, *rc::gen::inRange<std::uint64_t>(0, 1u << 30));
  int ran = 0;
  for (const Backend backend : kBackends) {
    if (backend == Backend::reference || !backend_available(backend)) continue;
    ++ran;
    const std::string v = random_case_violation(backend, in);
    if (!v.empty())
      RC_FAIL(std::string(to_string(backend)) + " [B H H_kv Tq Tk d_h d_v] = [" + std::to_string(c.B) + " " +
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
  const Backend backend = GetParam();
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

class RouteParity : public ::testing::TestWithParam<std::tuple<Backend, RouteCase>> {};

TEST_P(RouteParity, WithinTwiceReferenceErrorPlusFloor) {
  const auto& [backend, c] = GetParam();
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
                         ::testing::Combine(::testing::ValuesIn(kBackends), ::testing::ValuesIn(route_cases())),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name;
                         });

TEST_P(BackendParity, RouteInvalidInputNamesTheArgument) {
  const Backend backend = GetParam();
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

INSTANTIATE_TEST_SUITE_P(Backends, BackendParity, ::testing::ValuesIn(kBackends),
                         [](const auto& info) { return std::string(to_string(info.param)); });

#if defined(OASIS_HAVE_CUDA)
// --- CUDA only: float16 / bfloat16 inputs, pseudo-query logits -----------------------------------

#define OASIS_SKIP_WITHOUT_CUDA()                                                                     \
  if (std::string why; !cuda::available(&why)) GTEST_SKIP() << "backend cuda is not available: " << why

class HalfInputParity : public ::testing::TestWithParam<std::tuple<io::DType, AttentionCase>> {};

// The 16-bit inputs are widened exactly to float; the float reference and the oracle run on the
// widened values, so the rule is the float rule (the kernel accumulates in float32).
TEST_P(HalfInputParity, WithinTwiceReferenceErrorPlusFloor) {
  const auto& [dtype, c] = GetParam();
  OASIS_SKIP_WITHOUT_CUDA();
  const AttentionInputs raw = make_inputs(c, salt_of(c.name) + 7);
  const io::Tensor16 q = io::round_to(raw.q, dtype), k = io::round_to(raw.k, dtype), v = io::round_to(raw.v, dtype);
  const AttentionInputs in{io::widen(q), io::widen(k), io::widen(v), raw.opt};
  const AttentionResult<float> got = cuda::token_attention(q, k, v, in.opt);
  expect_attention_parity<R>(got, in);
}

std::vector<AttentionCase> half_cases() {
  const std::vector<AttentionCase> all = attention_cases();
  return {all[0], all[1], all[2], all[4], all[6], all[14]};  // all[14]: bias, window, GQA, bthd
}

INSTANTIATE_TEST_SUITE_P(Cuda, HalfInputParity,
                         ::testing::Combine(::testing::Values(io::DType::f16, io::DType::bf16),
                                            ::testing::ValuesIn(half_cases())),
                         [](const auto& info) {
                           return std::string(io::to_string(std::get<0>(info.param))) + "_" +
                                  std::get<1>(info.param).name;
                         });

TEST(CudaPseudoQuery, WithinTwiceReferenceErrorPlusFloor) {
  OASIS_SKIP_WITHOUT_CUDA();
  std::mt19937_64 rng = make_rng(77);
  const Tensor<float> sources = randn<float>({5, 41, 200}, rng, 3.0), w = randn<float>({200}, rng, 0.1);
  const Tensor<float> gain = uniform<float>({200}, rng, 0.5, 1.5);
  for (const bool with_gain : {false, true}) {
    const Tensor<float> g = with_gain ? gain : Tensor<float>{};
    const KeyNormOptions opt{with_gain ? 1e-5 : 1e-6, false};
    const Tensor<float> got = cuda::pseudo_query_logits(sources, w, g, opt);
    const Tensor<float> ref = pseudo_query_logits(sources, w, g, opt);
    const Tensor<R> hp = pseudo_query_logits(sources.cast<R>(), w.cast<R>(), g.cast<R>(), opt);
    const Tensor<double> b = bounds::pseudo_query_logits_bounds(sources, w, g, opt);
    OASIS_EXPECT_PARITY(within_twice_reference(with_gain ? "g(gain)" : "g", got, ref, hp, b));
  }
}
#endif  // OASIS_HAVE_CUDA

}  // namespace
}  // namespace oasis::test
