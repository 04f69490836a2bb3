// The fused AttnRes routing (ops attn_res, attn_res_backward; Block AttnRes through the layouts
// adaptor) on every registered backend (parity_backends(): reference, cpu_fast, cuda, the recipe's
// echo) against the high-precision oracle (long double, u = 2^-64) under the kernel parity rule
// |x - x_hp| <= 2 |x_ref - x_hp| + B (parity_rule.hpp; docs/tolerances.md, "Fused kernels"), x_ref
// the float reference (oasis::attn_res<float>, attn_res_backward<float>) on the same inputs.
//
// The floor B is the float reference's derived bound, composed as docs/tolerances.md, "Fused
// AttnRes routing" states (attn_res_bound.hpp, shared with the benchmark's validation).
// Options: fla's default (softmax, no coupling), Softmax1 (AoS), OASIS coupling (paper_v2, and the
// authors' code's centring with beta capped and logits clamped), the head-less no-evidence rule,
// gain present and absent, eps 1e-5 (with a source whose mean square is of eps's order),
// scale != 1, compute_in_float32 (a no-op in float); sizes with n = 1, N = 1, d = 1 and d not a
// multiple of any vector width. Invalid input names the argument the reference names, on every
// backend. cpu_fast: every ISA variant, repeated calls and other thread counts bitwise equal, a
// gradient large enough to be streamed, and finite sources whose squares overflow returned as the
// reference returns them.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attn_res_bound.hpp"
#include "oasis/backends/cpu_fast.hpp"
#include "oasis/backends/layouts.hpp"
#include "oasis/backends/registry.hpp"
#include "oasis_test.hpp"
#include "parity_rule.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace oasis::test {
namespace {

using HP = long double;

struct AttnResCase {
  std::string name;
  index_t N, d;
  std::vector<SourceKind> kinds;
  AttnResOptions opt;
  bool gain = false;
  double tiny = 0;  ///< > 0: source 1 scaled by it (mean square near or below eps: the norm is eps's)
};

std::vector<AttnResCase> attn_res_cases() {
  using K = SourceKind;
  const std::vector<K> six{K::initial, K::attention, K::headless, K::attention, K::headless, K::attention};
  const std::vector<K> nine{K::initial, K::attention, K::headless, K::attention, K::attention,
                            K::headless, K::attention, K::attention, K::attention};
  const AttnResOptions fla;  // softmax, no coupling, eps 1e-6, scale 1
  AttnResOptions fla_scaled = fla;
  fla_scaled.scale = 0.375;
  fla_scaled.key_norm.eps = 1e-5;
  fla_scaled.key_norm.compute_in_float32 = true;
  AttnResOptions aos = fla;
  aos.depth.normalizer = RowNorm::softmax1;
  AttnResOptions oasis = fla;
  oasis.depth = DepthOptions{};  // softmax1, coupling paper_v2, theta = -5
  oasis.scale = 2.0;
  AttnResOptions authors = oasis;
  authors.depth.coupling_options = CouplingOptions::authors_code();
  authors.depth.beta = 20.0;  // capped at 10
  authors.scale = 12.0;       // logits beyond the clamp
  AttnResOptions no_evidence = oasis;
  no_evidence.depth.coupling_options.headless = HeadlessRule::no_evidence;
  no_evidence.depth.beta = 2.0;
  return {
      {"fla_default_d67", 33, 67, nine, fla},
      {"fla_gain_scaled_eps", 20, 128, {K::initial, K::attention, K::attention, K::headless, K::attention},
       fla_scaled, true},
      {"softmax1_gain_d40", 17, 40, {K::initial, K::attention, K::headless, K::attention}, aos, true},
      {"oasis_coupled", 29, 48, six, oasis, true},
      {"authors_code_clamped", 23, 37, six, authors},
      {"headless_no_evidence", 19, 72, {K::initial, K::attention, K::headless, K::attention}, no_evidence, true},
      {"one_source", 7, 5, {K::initial}, fla},
      {"one_token", 1, 19, six, oasis, true},
      {"width_one", 9, 1, {K::initial, K::attention, K::attention}, aos},
      {"tiny_source_eps", 15, 33, {K::initial, K::attention, K::attention}, fla_scaled, true, 1e-3},
  };
}

void PrintTo(const AttnResCase& c, std::ostream* os) { *os << c.name; }

using fast_parity::AttnResInputs;

AttnResInputs make_inputs(const AttnResCase& c, std::uint64_t salt) {
  std::mt19937_64 rng = make_rng(salt);
  const index_t n = static_cast<index_t>(c.kinds.size());
  AttnResInputs in;
  in.sources = randn<float>({n, c.N, c.d}, rng);
  if (c.tiny > 0)
    for (index_t x = 0; x < c.N * c.d; ++x) in.sources.ptr(1)[x] *= static_cast<float>(c.tiny);
  in.w = randn<float>({c.d}, rng, 0.5);
  if (c.gain) in.gain = uniform<float>({c.d}, rng, 0.5, 1.5);
  in.psi = uniform<float>({n, c.N}, rng, 0.0, 1.0);
  in.kinds = c.kinds;
  in.opt = c.opt;
  in.d.h = randn<float>({c.N, c.d}, rng);
  in.d.alpha = randn<float>({n, c.N}, rng);
  in.d.alpha_null = randn<float>({c.N}, rng);
  return in;
}

/// Every output of a forward under the rule, each with its margin printed.
void expect_forward_parity(const DepthRoute<float>& got, const AttnResInputs& in) {
  const fast_parity::AttnResForwardOracle<HP> o = fast_parity::attn_res_forward_oracle<HP>(in);
  OASIS_EXPECT_PARITY(within_twice_reference("h", got.h, o.ref.h, o.hp.h, o.b.h));
  OASIS_EXPECT_PARITY(within_twice_reference("alpha", got.alpha, o.ref.alpha, o.hp.alpha, o.b.alpha));
  OASIS_EXPECT_PARITY(
      within_twice_reference("alpha_null", got.alpha_null, o.ref.alpha_null, o.hp.alpha_null, o.b.alpha_null));
  OASIS_EXPECT_PARITY(within_twice_reference("g", got.g, o.ref.g, o.hp.g, o.b.g));
  OASIS_EXPECT_PARITY(within_twice_reference("dpsi", got.dpsi, o.ref.dpsi, o.hp.dpsi, o.b.dpsi));
}

using BackwardOracle = fast_parity::AttnResBackwardOracle<HP>;

void expect_backward_parity(const AttnResGrads<float>& got, const BackwardOracle& b, const AttnResOptions& opt) {
  OASIS_EXPECT_PARITY(within_twice_reference("grad_sources", got.sources, b.ref.sources, b.hp.sources, b.sources));
  OASIS_EXPECT_PARITY(within_twice_reference("grad_w", got.w, b.ref.w, b.hp.w, b.w));
  if (!b.gain.empty()) {
    OASIS_EXPECT_PARITY(within_twice_reference("grad_gain", got.gain, b.ref.gain, b.hp.gain, b.gain));
  } else {
    EXPECT_TRUE(got.gain.empty()) << "a gradient of an absent gain";
  }
  OASIS_EXPECT_PARITY(within_twice_reference("grad_psi", got.psi, b.ref.psi, b.hp.psi, b.psi));
  OASIS_EXPECT_PARITY(within_twice_reference("grad_logits", got.logits, b.ref.logits, b.hp.logits, b.logits));
  if (opt.depth.coupling) {
    OASIS_EXPECT_PARITY(within_twice_reference("grad_beta", Tensor<float>({1}, got.beta),
                                               Tensor<float>({1}, b.ref.beta), Tensor<HP>({1}, b.hp.beta), b.beta));
    OASIS_EXPECT_PARITY(within_twice_reference("grad_theta", Tensor<float>({1}, got.theta),
                                               Tensor<float>({1}, b.ref.theta), Tensor<HP>({1}, b.hp.theta), b.theta));
  } else {  // without coupling psi, beta and theta receive 0
    EXPECT_TRUE(exactly_equal("grad_psi", got.psi, Tensor<float>(got.psi.shape())));
    EXPECT_EQ(got.beta, 0.0f);
    EXPECT_EQ(got.theta, 0.0f);
  }
}

/// Every output of two forwards, and of two backwards, bitwise equal.
void expect_bitwise(const DepthRoute<float>& a, const DepthRoute<float>& b) {
  EXPECT_TRUE(exactly_equal("h", a.h, b.h));
  EXPECT_TRUE(exactly_equal("alpha", a.alpha, b.alpha));
  EXPECT_TRUE(exactly_equal("alpha_null", a.alpha_null, b.alpha_null));
  EXPECT_TRUE(exactly_equal("g", a.g, b.g));
  EXPECT_TRUE(exactly_equal("dpsi", a.dpsi, b.dpsi));
}

void expect_bitwise(const AttnResGrads<float>& a, const AttnResGrads<float>& b) {
  EXPECT_TRUE(exactly_equal("grad_sources", a.sources, b.sources));
  EXPECT_TRUE(exactly_equal("grad_w", a.w, b.w));
  EXPECT_TRUE(exactly_equal("grad_gain", a.gain, b.gain));
  EXPECT_TRUE(exactly_equal("grad_psi", a.psi, b.psi));
  EXPECT_TRUE(exactly_equal("grad_logits", a.logits, b.logits));
  EXPECT_EQ(a.beta, b.beta);
  EXPECT_EQ(a.theta, b.theta);
}

class AttnResParity : public ::testing::TestWithParam<std::tuple<std::string, AttnResCase>> {};

TEST_P(AttnResParity, ForwardWithinTwiceReferenceErrorPlusFloor) {
  const auto& [name, c] = GetParam();
  const BackendOps& backend = backend_ops(name);
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const AttnResInputs in = make_inputs(c, salt_of(c.name));
  expect_forward_parity(attn_res(backend, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt), in);
}

TEST_P(AttnResParity, BackwardWithinTwiceReferenceErrorPlusFloor) {
  const auto& [name, c] = GetParam();
  const BackendOps& backend = backend_ops(name);
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const AttnResInputs in = make_inputs(c, salt_of(c.name) + 1);
  const AttnResGrads<float> got = attn_res_backward(backend, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt, in.d);
  expect_backward_parity(got, fast_parity::attn_res_backward_oracle<HP>(in), c.opt);
}

INSTANTIATE_TEST_SUITE_P(Backends, AttnResParity,
                         ::testing::Combine(::testing::ValuesIn(parity_backends()),
                                            ::testing::ValuesIn(attn_res_cases())),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + std::get<1>(info.param).name; });

class AttnResBackend : public ::testing::TestWithParam<std::string> {};

// Block AttnRes (Kimi Eq. 5-6) through the layouts adaptor: blocks b_0..b_2 and the partial sum,
// and blocks alone; the stacked sources' outputs and floors, the gradients split as the op splits them.
TEST_P(AttnResBackend, BlockAttnResWithinTwiceReferenceErrorPlusFloor) {
  const BackendOps& backend = backend_ops(GetParam());
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  using K = SourceKind;
  for (const bool partial : {true, false}) {
    SCOPED_TRACE(partial ? "with a partial sum" : "blocks only");
    const index_t m = 3, N = 21, d = 52;
    std::mt19937_64 rng = make_rng(partial ? 4101 : 4102);
    const Tensor<float> blocks = randn<float>({m, N, d}, rng);
    const Tensor<float> part = partial ? randn<float>({N, d}, rng) : Tensor<float>();
    AttnResCase c{"block", N, d, {K::initial, K::attention, K::attention}, AttnResOptions{}, true};
    if (partial) c.kinds.push_back(K::attention);
    const index_t n = static_cast<index_t>(c.kinds.size());
    AttnResInputs in;
    in.kinds = c.kinds;
    in.opt = c.opt;
    in.sources = stack_block_sources(blocks, part);
    in.w = randn<float>({d}, rng, 0.5);
    in.gain = uniform<float>({d}, rng, 0.5, 1.5);
    in.psi = uniform<float>({n, N}, rng, 0.0, 1.0);
    in.d.h = randn<float>({N, d}, rng);
    in.d.alpha = randn<float>({n, N}, rng);
    expect_forward_parity(block_attn_res(backend, blocks, part, in.w, in.gain, in.psi, c.kinds, c.opt), in);
    const BlockAttnResGrads<float> got =
        block_attn_res_backward(backend, blocks, part, in.w, in.gain, in.psi, c.kinds, c.opt, in.d);
    const BackwardOracle b = fast_parity::attn_res_backward_oracle<HP>(in);
    // the split of the floor and of the oracle's grad sources, as the op splits its own
    AttnResGrads<double> bs;
    bs.sources = b.sources;
    const BlockAttnResGrads<double> fb = split_block_grads(bs, m, partial);
    const BlockAttnResGrads<float> rb = split_block_grads(b.ref, m, partial);
    const BlockAttnResGrads<HP> ob = split_block_grads(b.hp, m, partial);
    OASIS_EXPECT_PARITY(within_twice_reference("grad_blocks", got.blocks, rb.blocks, ob.blocks, fb.blocks));
    if (partial)
      OASIS_EXPECT_PARITY(within_twice_reference("grad_partial", got.partial, rb.partial, ob.partial, fb.partial));
    else
      EXPECT_TRUE(got.partial.empty());
    AttnResGrads<float> fused = got.fused;
    fused.sources = b.ref.sources;  // checked above, split
    expect_backward_parity(fused, b, c.opt);
  }
}

// Invalid input: every backend throws oasis::invalid_argument naming the argument the reference
// names (the reference's own call, run here, must name the expected one too).
TEST_P(AttnResBackend, InvalidInputNamesTheArgument) {
  const BackendOps& backend = backend_ops(GetParam());
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const AttnResCase c = attn_res_cases()[3];  // coupled, with a gain
  const AttnResInputs good = make_inputs(c, 17);
  struct Bad {
    const char* what;
    std::string argument;
    AttnResInputs in;
    AttnResOptions opt;
  };
  std::vector<Bad> bad;
  auto add = [&](const char* what, const char* arg, auto&& edit) {
    Bad b{what, arg, good, c.opt};
    edit(b.in, b.opt);
    bad.push_back(std::move(b));
  };
  add("w of d + 1 entries", "w", [&](AttnResInputs& in, AttnResOptions&) { in.w = Tensor<float>({c.d + 1}, 0.5f); });
  add("psi [n, N + 1]", "psi", [&](AttnResInputs& in, AttnResOptions&) { in.psi = Tensor<float>({6, c.N + 1}, 0.5f); });
  add("gain [d - 1]", "gain", [&](AttnResInputs& in, AttnResOptions&) { in.gain = Tensor<float>({c.d - 1}, 1.0f); });
  add("a NaN source", "sources", [](AttnResInputs& in, AttnResOptions&) { in.sources(2, 5, 7) = std::nanf(""); });
  add("an infinite source", "sources", [](AttnResInputs& in, AttnResOptions&) {
    in.sources(0, 11, 3) = std::numeric_limits<float>::infinity();
  });
  add("an infinite w", "w", [](AttnResInputs& in, AttnResOptions&) {
    in.w[4] = -std::numeric_limits<float>::infinity();
  });
  add("a NaN scale", "scale", [](AttnResInputs&, AttnResOptions& o) { o.scale = std::nan(""); });
  add("eps = 0", "eps", [](AttnResInputs&, AttnResOptions& o) { o.key_norm.eps = 0.0; });
  add("psi = 1.5 with coupling", "psi", [](AttnResInputs& in, AttnResOptions&) { in.psi(1, 2) = 1.5f; });
  add("a NaN gain (a non-finite logit)", "g_old",
      [](AttnResInputs& in, AttnResOptions&) { in.gain[0] = std::nanf(""); });
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    const AttnResInputs& in = b.in;
    EXPECT_EQ(thrown_argument([&] { attn_res(in.sources, in.w, in.gain, in.psi, c.kinds, b.opt); }), b.argument);
    EXPECT_EQ(thrown_argument([&] { attn_res(backend, in.sources, in.w, in.gain, in.psi, c.kinds, b.opt); }),
              b.argument);
    EXPECT_EQ(thrown_argument([&] { attn_res_backward(in.sources, in.w, in.gain, in.psi, c.kinds, b.opt, in.d); }),
              b.argument);
    EXPECT_EQ(thrown_argument([&] {
                attn_res_backward(backend, in.sources, in.w, in.gain, in.psi, c.kinds, b.opt, in.d);
              }),
              b.argument);
  }
  AttnResInputs in = good;
  in.d.h = Tensor<float>({c.N, c.d + 1});
  EXPECT_EQ(thrown_argument([&] {
              attn_res_backward(backend, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt, in.d);
            }),
            "dh");
  const Tensor<float> blocks({3, c.N, c.d}), partial({c.N, c.d - 1});
  EXPECT_EQ(thrown_argument([&] {
              block_attn_res(backend, blocks, partial, in.w, in.gain, in.psi, c.kinds, c.opt);
            }),
            "partial");
}

INSTANTIATE_TEST_SUITE_P(Backends, AttnResBackend, ::testing::ValuesIn(parity_backends()),
                         [](const auto& info) { return info.param; });

#if !defined(OASIS_PARITY_BACKENDS)  // the programs of every backend, not the emulator's (cuda only)
// cpu_fast on each of its ISA variants (cpu_fast::set_isa): the rule at a size with full vectors
// and a tail (d = 200), and repeated calls, and calls with 1 and 2 OpenMP threads, bitwise equal
// (the per-token work and the chunked sums of dL/dw, dL/dgain, dbeta do not depend on the threads).
TEST(CpuFastAttnRes, EveryIsaWithinTheRuleAndDeterministic) {
  const BackendOps& backend = backend_ops("cpu_fast");
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const std::string saved(cpu_fast::isa());
  AttnResCase c = attn_res_cases()[3];
  c.N = 70;  // three chunks of the backward's partial sums
  c.d = 200;
  const AttnResInputs in = make_inputs(c, 909);
  const BackwardOracle b = fast_parity::attn_res_backward_oracle<HP>(in);
  for (const std::string& isa : cpu_fast::available_isas()) {
    SCOPED_TRACE(isa);
    cpu_fast::set_isa(isa);
    const DepthRoute<float> f1 = attn_res(backend, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt);
    expect_forward_parity(f1, in);
    const AttnResGrads<float> g1 = attn_res_backward(backend, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt, in.d);
    expect_backward_parity(g1, b, c.opt);
    for (int threads : {0, 1, 2}) {
#if defined(_OPENMP)
      const int before = omp_get_max_threads();
      if (threads > 0) omp_set_num_threads(threads);
#endif
      const DepthRoute<float> f2 = attn_res(backend, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt);
      const AttnResGrads<float> g2 =
          attn_res_backward(backend, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt, in.d);
#if defined(_OPENMP)
      omp_set_num_threads(before);
#endif
      SCOPED_TRACE("threads " + std::to_string(threads));
      expect_bitwise(f2, f1);
      expect_bitwise(g2, g1);
    }
  }
  cpu_fast::set_isa(saved);
}
// cpu_fast::attn_res_into and attn_res_backward_into reuse the caller's storage (the same buffers,
// filled with NaN beforehand: every element must be written) and give bitwise the results of the
// backend's fresh calls; a result of another shape is reshaped.
TEST(CpuFastAttnRes, IntoReusesTheCallersStorage) {
  const BackendOps& backend = backend_ops("cpu_fast");
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const AttnResCase c = attn_res_cases()[3];
  const AttnResInputs in = make_inputs(c, 911);
  const DepthRoute<float> f = attn_res(backend, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt);
  const AttnResGrads<float> g = attn_res_backward(backend, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt, in.d);
  DepthRoute<float> fr;
  AttnResGrads<float> gr;
  cpu_fast::attn_res_into(in.sources, in.w, in.gain, in.psi, c.kinds, c.opt, fr);  // fresh: shapes set
  cpu_fast::attn_res_backward_into(in.sources, in.w, in.gain, in.psi, c.kinds, c.opt, in.d, gr);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (Tensor<float>* t : {&fr.h, &fr.alpha, &fr.alpha_null, &fr.g, &fr.dpsi, &gr.sources, &gr.w, &gr.gain, &gr.psi, &gr.logits})
    for (index_t i = 0; i < t->size(); ++i) (*t)[i] = nan;
  const float* hs = fr.h.data();
  const float* gs = gr.sources.data();
  cpu_fast::attn_res_into(in.sources, in.w, in.gain, in.psi, c.kinds, c.opt, fr);
  cpu_fast::attn_res_backward_into(in.sources, in.w, in.gain, in.psi, c.kinds, c.opt, in.d, gr);
  EXPECT_EQ(fr.h.data(), hs) << "h was reallocated";
  EXPECT_EQ(gr.sources.data(), gs) << "grad sources was reallocated";
  expect_bitwise(fr, f);
  expect_bitwise(gr, g);
  AttnResGrads<float> other;  // a result of another shape: reshaped
  other.sources = Tensor<float>({2, 3});
  cpu_fast::attn_res_backward_into(in.sources, in.w, in.gain, in.psi, c.kinds, c.opt, in.d, other);
  EXPECT_TRUE(exactly_equal("grad_sources", other.sources, g.sources));
}

// Finite sources whose squares overflow (|s| near 1e20): the reference's inverse RMS is 0, so its
// normalised row and logit are 0 and nothing is reported; cpu_fast returns the same logit, and a
// gradient without error, for that row.
TEST(CpuFastAttnRes, FiniteSourcesWhoseSquaresOverflowAreNotAnError) {
  const BackendOps& backend = backend_ops("cpu_fast");
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  AttnResInputs in = make_inputs(attn_res_cases()[0], 31);
  for (index_t c = 0; c < in.sources.dim(2); ++c) in.sources(4, 3, c) = (c % 2 ? 1e20f : -1e20f);
  const DepthRoute<float> ref = attn_res(in.sources, in.w, in.gain, in.psi, in.kinds, in.opt);
  const DepthRoute<float> got = attn_res(backend, in.sources, in.w, in.gain, in.psi, in.kinds, in.opt);
  EXPECT_EQ(ref.g(4, 3), 0.0f);
  EXPECT_EQ(got.g(4, 3), 0.0f);
  const AttnResGrads<float> g = attn_res_backward(backend, in.sources, in.w, in.gain, in.psi, in.kinds, in.opt, in.d);
  const AttnResGrads<float> r = attn_res_backward(in.sources, in.w, in.gain, in.psi, in.kinds, in.opt, in.d);
  for (index_t c = 0; c < in.sources.dim(2); ++c) {  // the keys pass nothing to the row: alpha dh alone
    EXPECT_EQ(g.sources(4, 3, c), got.alpha(4, 3) * in.d.h(3, c)) << c;
    EXPECT_EQ(r.sources(4, 3, c), ref.alpha(4, 3) * in.d.h(3, c)) << c;
  }
}
// A grad sources above 4 MiB is written with non-temporal stores from each row's first aligned
// column (d = 1000: the rows start at every offset within a vector): the rule on every ISA variant,
// and the first tokens' rows bitwise those of a call on those tokens alone (not streamed).
TEST(CpuFastAttnRes, StreamedLargeGradientWithinTheRule) {
  const BackendOps& backend = backend_ops("cpu_fast");
  OASIS_SKIP_UNLESS_AVAILABLE(backend);
  const std::string saved(cpu_fast::isa());
  AttnResCase c = attn_res_cases()[2];  // softmax1 with a gain
  c.kinds.resize(3);
  c.N = 360;
  c.d = 1000;  // 3 x 360 x 1000 floats > 2^20
  const AttnResInputs in = make_inputs(c, 4242);
  const BackwardOracle b = fast_parity::attn_res_backward_oracle<HP>(in);
  // the first 8 tokens alone: a gradient small enough not to be streamed
  AttnResInputs head = in;
  const index_t T = 8, n = 3;
  head.sources = Tensor<float>({n, T, c.d});
  head.psi = Tensor<float>({n, T});
  head.d.h = Tensor<float>({T, c.d});
  head.d.alpha = Tensor<float>({n, T});
  head.d.alpha_null = Tensor<float>({T});
  for (index_t t = 0; t < T; ++t) {
    for (index_t i = 0; i < n; ++i) {
      for (index_t x = 0; x < c.d; ++x) head.sources(i, t, x) = in.sources(i, t, x);
      head.psi(i, t) = in.psi(i, t);
      head.d.alpha(i, t) = in.d.alpha(i, t);
    }
    for (index_t x = 0; x < c.d; ++x) head.d.h(t, x) = in.d.h(t, x);
    head.d.alpha_null[t] = in.d.alpha_null[t];
  }
  for (const std::string& isa : cpu_fast::available_isas()) {
    SCOPED_TRACE(isa);
    cpu_fast::set_isa(isa);
    const AttnResGrads<float> g = attn_res_backward(backend, in.sources, in.w, in.gain, in.psi, c.kinds, c.opt, in.d);
    expect_backward_parity(g, b, c.opt);
    const AttnResGrads<float> gh =
        attn_res_backward(backend, head.sources, head.w, head.gain, head.psi, c.kinds, c.opt, head.d);
    index_t differ = 0;
    for (index_t i = 0; i < n; ++i)
      for (index_t t = 0; t < T; ++t)
        for (index_t x = 0; x < c.d; ++x) differ += g.sources(i, t, x) != gh.sources(i, t, x) ? 1 : 0;
    EXPECT_EQ(differ, 0) << "streamed rows differ from the same rows not streamed";
  }
  cpu_fast::set_isa(saved);
}
#endif

}  // namespace
}  // namespace oasis::test
