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

#include "oasis/backends/backend.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/core/instances.hpp"
#include "oasis/core/multiprecision.hpp"
#include "oasis_test.hpp"
#include "parity_rule.hpp"
#include "replay.hpp"
#include "random_attention_case.hpp"
#if defined(OASIS_HAVE_CUDA)
#include "attention_dispatch.hpp"
#include "device_util.hpp"
#include "oasis/backends/cuda.hpp"
#include "oasis/ops/online_softmax.hpp"
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
/// `p_rounded`: the kernel rounds P to that format before P V (tensor cores), whose term
/// (bounds::p_rounding_bound) is added to the output's floor.
template <class H>
std::vector<::testing::AssertionResult> attention_parity(const AttentionResult<float>& got, const AttentionInputs& in,
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
void expect_attention_parity(const AttentionResult<float>& got, const AttentionInputs& in,
                             const bounds::Format16* p_rounded = nullptr) {
  for (const ::testing::AssertionResult& r : attention_parity<H>(got, in, p_rounded)) OASIS_EXPECT_PARITY(r);
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
// A violation also writes the case as a replay (tests/support/replay.hpp; rapidcheck's shrinking
// overwrites it, so the files left are those of the last, smallest, failing case).
std::string random_case_violation(Backend backend, const AttentionInputs& in) {
  const AttentionResult<float> got = token_attention(backend, in.q, in.k, in.v, in.opt);
  for (const ::testing::AssertionResult& r : attention_parity<long double>(got, in))
    if (!r) {
      AttentionOptions hp_opt = in.opt;
      hp_opt.return_probs = !got.probs.empty();
      const AttentionResult<long double> hp =
          token_attention(in.q.cast<long double>(), in.k.cast<long double>(), in.v.cast<long double>(), hp_opt);
      const std::string config = replay::write("RandomShapeParity." + std::string(to_string(backend)),
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
// --- CUDA only: the split-K and tensor-core kernels ------------------------------------------------

/// The case in the [B, T, H, d] layout.
AttentionCase in_bthd(AttentionCase c) {
  c.layout = AttentionLayout::bthd;
  return c;
}

/// An attention case run with an explicitly chosen kernel.
struct KernelCase {
  AttentionCase c;
  int key_splits = 0;  ///< split_keys: 0 for the heuristic's count
};
void PrintTo(const KernelCase& k, std::ostream* os) { *os << k.c.name; }

// Split-K: GQA groups of 4 and 3 rows, row groups split over one kv head, padding lengths down to
// 0, fully masked rows of both normalisers, extreme logits, more partial ranges than keys,
// prefill-sized row counts (20 groups of 4 rows), the [B, T, H, d] layout.
std::vector<KernelCase> split_cases() {
  using N = RowNorm;
  return {
      {{"decode_gqa4_padded", 3, 8, 2, 1, 700, 128, 128, N::softmax1, true, {700, 123, 0}, true}, 0},
      {{"decode_gqa4_padded_5_splits", 3, 8, 2, 1, 700, 128, 128, N::softmax1, true, {700, 123, 0}, true}, 5},
      {{"rows_beyond_one_group", 1, 6, 2, 2, 300, 40, 24, N::softmax1, true, {}, true}, 3},
      {{"fully_masked_rows_softmax", 2, 2, 1, 3, 90, 64, 64, N::softmax, true, {0, 50}, false}, 2},
      {{"fully_masked_rows_softmax1", 2, 4, 1, 1, 90, 64, 64, N::softmax1, false, {0, 90}, true}, 4},
      {{"extreme_logits", 1, 4, 2, 1, 513, 64, 64, N::softmax1, false, {}, true, 40.0, 60.0}, 7},
      {{"more_partials_than_keys", 1, 2, 2, 3, 10, 32, 32, N::softmax1, true, {}, true}, 8},
      {{"prefill_rows", 1, 2, 1, 40, 150, 64, 48, N::softmax1, true, {}, false}, 2},
      {in_bthd({"decode_gqa4_bthd", 2, 8, 2, 1, 400, 64, 64, N::softmax1, true, {400, 150}, true}), 3},
  };
}

class SplitKeysParity : public ::testing::TestWithParam<KernelCase> {};

TEST_P(SplitKeysParity, WithinTwiceReferenceErrorPlusFloor) {
  OASIS_SKIP_WITHOUT_CUDA();
  const KernelCase& kc = GetParam();
  const AttentionInputs in = make_inputs(kc.c, salt_of(kc.c.name));
  const cuda::KernelOptions ko{cuda::AttentionKernel::split_keys, kc.key_splits};
  expect_attention_parity<R>(cuda::token_attention(in.q, in.k, in.v, in.opt, ko), in);
}

INSTANTIATE_TEST_SUITE_P(Cuda, SplitKeysParity, ::testing::ValuesIn(split_cases()),
                         [](const auto& info) { return info.param.c.name; });

// 16-bit inputs through the split kernels' vector loads (d = 64, contiguous rows).
TEST(SplitKeysParity, SixteenBitInputs) {
  OASIS_SKIP_WITHOUT_CUDA();
  for (const io::DType dtype : {io::DType::f16, io::DType::bf16}) {
    SCOPED_TRACE(io::to_string(dtype));
    const AttentionCase c{"decode_16bit", 2, 4, 1, 1, 300, 64, 64, RowNorm::softmax1, true, {300, 77}, true};
    const AttentionInputs raw = make_inputs(c, 31);
    const io::Tensor16 q = io::round_to(raw.q, dtype), k = io::round_to(raw.k, dtype), v = io::round_to(raw.v, dtype);
    const AttentionInputs in{io::widen(q), io::widen(k), io::widen(v), raw.opt};
    expect_attention_parity<R>(cuda::token_attention(q, k, v, in.opt, {cuda::AttentionKernel::split_keys, 3}), in);
  }
}

// A decode step over 8192 keys (bottom-right causal with padding, GQA 4:1, d = 128), on the kernel
// the automatic choice picks for it; long double oracle.
TEST(SplitKeysParity, LongRows8kKeysChosenAutomatically) {
  OASIS_SKIP_WITHOUT_CUDA();
  const AttentionCase c{"decode_8k", 2, 4, 1, 1, 8192, 128, 128, RowNorm::softmax1, true, {8192, 6000}, true};
  AttentionInputs in = make_inputs(c, 8193);
  in.opt.return_probs = false;
  EXPECT_EQ(cuda::kernel_choice({c.B, c.H, c.H_kv, c.Tq, c.Tk, c.d_h, c.d_v}).kernel, cuda::AttentionKernel::split_keys);
  expect_attention_parity<long double>(cuda::token_attention(in.q, in.k, in.v, in.opt, cuda::KernelOptions{}), in);
}

TEST(CudaKernelChoice, AutomaticPicksSplitKeysForFewRowsPerKvHeadOverLongRows) {
  using K = cuda::AttentionKernel;
  EXPECT_EQ(cuda::kernel_choice({16, 32, 8, 1, 8192, 128, 128}).kernel, K::split_keys);  // decoding
  EXPECT_EQ(cuda::kernel_choice({16, 32, 8, 4, 8192, 128, 128}).kernel, K::split_keys);  // 16 rows per kv head
  EXPECT_EQ(cuda::kernel_choice({16, 32, 8, 5, 8192, 128, 128}).kernel, K::fused);       // 20 rows
  EXPECT_EQ(cuda::kernel_choice({16, 32, 8, 1, 100, 128, 128}).kernel, K::fused);        // short rows
  EXPECT_EQ(cuda::kernel_choice({4, 32, 8, 4096, 4096, 128, 128}).kernel, K::fused);     // prefill
  const cuda::KernelChoice c = cuda::kernel_choice({16, 32, 8, 1, 8192, 128, 128});
  EXPECT_GE(c.key_splits, 1);
  EXPECT_LE(c.key_splits, 8192 / 256);
  EXPECT_EQ(cuda::kernel_choice({1, 1, 1, 1, 300, 8, 8}, {K::split_keys, 7}).key_splits, 7);
  EXPECT_EQ(cuda::kernel_choice({1, 1, 1, 1, 300, 8, 8}, {K::tensor_cores, 0}).kernel, K::tensor_cores);
}

TEST(CudaKernelChoice, InvalidChoicesNameTheOption) {
  const AttentionInputs in = make_inputs(attention_cases()[0], 3);
  const io::Tensor16 q = io::round_to(in.q, io::DType::bf16), k = io::round_to(in.k, io::DType::bf16),
                     v = io::round_to(in.v, io::DType::bf16);
  using K = cuda::AttentionKernel;
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention(in.q, in.k, in.v, in.opt, {K::tensor_cores, 0}); }), "kernel");
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention(in.q, in.k, in.v, in.opt, {K::fused, 4}); }), "key_splits");
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention(in.q, in.k, in.v, in.opt, {K::split_keys, -1}); }), "key_splits");
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention(in.q, in.k, in.v, in.opt, {K::split_keys, 1025}); }), "key_splits");
  for (const K kernel : {K::split_keys, K::tensor_cores}) {
    AttentionOptions w = in.opt;
    w.window = 8;
    EXPECT_EQ(thrown_argument([&] { cuda::token_attention(q, k, v, w, {kernel, 0}); }), "window");
    AttentionOptions b = in.opt;
    b.bias = Tensor<double>({in.q.dim(2), in.k.dim(2)});
    EXPECT_EQ(thrown_argument([&] { cuda::token_attention(q, k, v, b, {kernel, 0}); }), "bias");
  }
}

/// The combine of split-K on the host, from the device's partial states: the null category's
/// state first and the partials merged in key order (online::merge, as the combine kernel);
/// `null_per_partial` instead adds the null category once per partial, the mistake a split
/// kernel makes when every partial starts from online::start(softmax1, s).
AttentionResult<float> combine_on_host(const AttentionShape& s, const AttentionOptions& opt, int P,
                                       const std::vector<float>& pm, const std::vector<float>& pl,
                                       const std::vector<float>& po, bool null_per_partial) {
  using namespace cuda::detail;
  const bool s1 = opt.normalizer == RowNorm::softmax1;
  AttentionResult<float> r{Tensor<float>({s.B, s.H, s.Tq, s.d_v}), Tensor<float>({s.B, s.H, s.Tq}),
                           Tensor<float>({s.B, s.H, s.Tq}), {}};
  std::vector<float> o(static_cast<std::size_t>(s.d_v));
  for (index_t row = 0; row < s.B * s.H * s.Tq; ++row) {
    const index_t h = row / s.Tq % s.H;
    const float sl = !s1 ? -INFINITY : opt.null_logits.empty() ? 0.0f : static_cast<float>(opt.null_logits[static_cast<std::size_t>(h)]);
    online::State st = online::start(s1, sl);
    std::fill(o.begin(), o.end(), 0.0f);
    for (int p = 0; p < P; ++p) {
      const std::size_t slot = static_cast<std::size_t>(row * P + p);
      if (null_per_partial && s1 && p > 0) {
        const online::MergeFactors n = online::merge(st, online::start(true, sl));
        for (float& x : o) x = online::merge_output(x, 0.0f, n);
      }
      const online::MergeFactors f = online::merge(st, online::State{pm[slot], pl[slot]});
      for (index_t c = 0; c < s.d_v; ++c)
        o[static_cast<std::size_t>(c)] = online::merge_output(o[static_cast<std::size_t>(c)], po[slot * static_cast<std::size_t>(s.d_v) + static_cast<std::size_t>(c)], f);
    }
    const online::Finish fin = online::finish(st, s1, sl);
    for (index_t c = 0; c < s.d_v; ++c) r.out[row * s.d_v + c] = o[static_cast<std::size_t>(c)] * fin.inv;
    r.lse[row] = fin.lse;
    r.p_null[row] = fin.p_null;
  }
  return r;
}

// The rule rejects a split kernel that adds the null category once per partial instead of once
// per row: the device's partial states are combined on the host both ways.
TEST(SplitKeysParity, RuleRejectsTheNullCategoryAddedOncePerPartial) {
  OASIS_SKIP_WITHOUT_CUDA();
  using namespace cuda::detail;
  const AttentionCase c{"null_per_partial", 2, 4, 2, 1, 300, 64, 64, RowNorm::softmax1, true, {300, 200}, true,
                        1.0, 2.0, false};
  const AttentionInputs in = make_inputs(c, 41);
  const AttentionShape s = check_attention_args(in.q, in.k, in.v, in.opt);
  DeviceBuffer<float> dq = to_device(in.q), dk = to_device(in.k), dv = to_device(in.v);
  AttentionLaunch a = layout_launch(io::DType::f32, dq.get(), dk.get(), dv.get(), s, AttentionLayout::bhtd);
  const DeviceAttentionOptions options = set_attention_options(a, s, in.opt);  // causal, null logits, lengths
  SplitLaunch sp = split_plan(a, 3);
  const int P = sp.splits;
  const std::size_t slots = static_cast<std::size_t>(s.B * s.H * s.Tq) * static_cast<std::size_t>(P);
  DeviceBuffer<float> dm(slots), dl(slots), dpo(slots * static_cast<std::size_t>(s.d_v));
  sp.part_m = dm.get();
  sp.part_l = dl.get();
  sp.part_o = dpo.get();
  ASSERT_EQ(launch_attention_split_partials(a, sp, nullptr), 0);
  std::vector<float> pm(slots), pl(slots), po(slots * static_cast<std::size_t>(s.d_v));
  dm.download(pm.data());
  dl.download(pl.data());
  dpo.download(po.data());
  const AttentionResult<float> once = combine_on_host(s, in.opt, P, pm, pl, po, false);
  const AttentionResult<float> per_partial = combine_on_host(s, in.opt, P, pm, pl, po, true);
  for (const ::testing::AssertionResult& r : attention_parity<R>(once, in)) OASIS_EXPECT_PARITY(r);
  const std::vector<::testing::AssertionResult> bad = attention_parity<R>(per_partial, in);
  EXPECT_FALSE(bad[0]) << "out";
  EXPECT_FALSE(bad[2]) << "p_null";
#if defined(OASIS_CUDA_EMU)
  // On the emulator (host libm on both sides) the combine kernel is bitwise the host combine.
  const AttentionResult<float> dev =
      cuda::token_attention(in.q, in.k, in.v, in.opt, {cuda::AttentionKernel::split_keys, 3});
  EXPECT_TRUE(exactly_equal("out", dev.out, once.out));
  EXPECT_TRUE(exactly_equal("lse", dev.lse, once.lse));
  EXPECT_TRUE(exactly_equal("p_null", dev.p_null, once.p_null));
#endif
}

// Tensor cores: the rule with the term of P's rounding to the input type (p_rounding_bound)
// added to the output's floor. The cases cross the kernel's 64-query blocks and key tiles (64
// keys for d <= 64, 32 for d <= 128), so rows are rescaled between tiles.
std::vector<AttentionCase> tensor_core_cases() {
  const std::vector<AttentionCase> all = attention_cases();
  std::vector<AttentionCase> c = {all[0], all[1], all[2], all[4], all[6]};  // no window, no bias
  c.push_back(in_bthd({"gqa_causal_bthd", 1, 4, 2, 70, 70, 64, 64, RowNorm::softmax1, true, {}, true}));
  c.push_back({"multi_block_tiles", 1, 4, 2, 80, 150, 64, 64, RowNorm::softmax1, true, {}, true, 1.0, 2.0, false});
  c.push_back({"multi_block_d128_softmax", 2, 2, 1, 70, 90, 128, 96, RowNorm::softmax, true, {90, 0}, false});
  return c;
}

const bounds::Format16& format_of(io::DType t) { return t == io::DType::f16 ? bounds::kBinary16 : bounds::kBfloat16; }

class TensorCoreParity : public ::testing::TestWithParam<std::tuple<io::DType, AttentionCase>> {};

TEST_P(TensorCoreParity, WithinTwiceReferenceErrorPlusFloorAndPRounding) {
  const auto& [dtype, c] = GetParam();
  OASIS_SKIP_WITHOUT_CUDA();
  const AttentionInputs raw = make_inputs(c, salt_of(c.name) + 11);
  const io::Tensor16 q = io::round_to(raw.q, dtype), k = io::round_to(raw.k, dtype), v = io::round_to(raw.v, dtype);
  const AttentionInputs in{io::widen(q), io::widen(k), io::widen(v), raw.opt};
  const AttentionResult<float> got = cuda::token_attention(q, k, v, in.opt, {cuda::AttentionKernel::tensor_cores, 0});
  expect_attention_parity<R>(got, in, &format_of(dtype));
}

INSTANTIATE_TEST_SUITE_P(Cuda, TensorCoreParity,
                         ::testing::Combine(::testing::Values(io::DType::f16, io::DType::bf16),
                                            ::testing::ValuesIn(tensor_core_cases())),
                         [](const auto& info) {
                           return std::string(io::to_string(std::get<0>(info.param))) + "_" +
                                  std::get<1>(info.param).name;
                         });

// The P-rounding term is not vacuous: without it the tensor-core output breaks the float rule.
TEST(TensorCoreParity, PRoundingTermIsNeeded) {
  OASIS_SKIP_WITHOUT_CUDA();
  for (const io::DType dtype : {io::DType::f16, io::DType::bf16}) {
    const AttentionInputs raw = make_inputs(tensor_core_cases()[0], 5);
    const io::Tensor16 q = io::round_to(raw.q, dtype), k = io::round_to(raw.k, dtype), v = io::round_to(raw.v, dtype);
    const AttentionInputs in{io::widen(q), io::widen(k), io::widen(v), raw.opt};
    const AttentionResult<float> got = cuda::token_attention(q, k, v, in.opt, {cuda::AttentionKernel::tensor_cores, 0});
    EXPECT_FALSE(attention_parity<R>(got, in)[0]) << io::to_string(dtype) << ": out within the float rule";
    EXPECT_TRUE(attention_parity<R>(got, in, &format_of(dtype))[0]) << io::to_string(dtype);
  }
}
#endif  // OASIS_HAVE_CUDA

}  // namespace
}  // namespace oasis::test
