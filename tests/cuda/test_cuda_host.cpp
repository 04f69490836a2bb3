// CUDA backend, host-only tests: they run without a GPU. They check the availability
// report, argument validation (which runs before any device work, so every error names its
// argument on any machine), and the fused kernel's tiling with its per-row state machine
// (oasis/ops/online_softmax.hpp, the code the kernel runs) through a host simulation against the long
// double oracle. (The host's 16-bit conversions are the library's, tested in
// tests/verify/test_tensor16.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "oasis/backends/backend.hpp"
#include "oasis/backends/cuda.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/core/instances.hpp"
#include "oasis_test.hpp"
#include "oasis/ops/online_softmax.hpp"
#include "parity_rule.hpp"

namespace oasis::test {
namespace {

using io::DType;

// --- availability --------------------------------------------------------------------------------

TEST(CudaAvailability, ReasonIsConsistentAcrossTheApi) {
  std::string why;
  const bool ok = cuda::available(&why);
  EXPECT_EQ(ok, backend_available(Backend::cuda));
  EXPECT_EQ(why, backend_unavailable_reason(Backend::cuda));
  if (ok) {
    EXPECT_TRUE(why.empty());
    EXPECT_EQ(available_backends().back(), Backend::cuda);
  } else {
    EXPECT_FALSE(why.empty());
    EXPECT_NE(why.find("CUDA"), std::string::npos) << why;
    for (Backend b : available_backends()) EXPECT_NE(b, Backend::cuda);
  }
}

TEST(CudaAvailability, UnavailableBackendThrowsNamingBackendWithTheReason) {
  std::string why;
  if (cuda::available(&why)) GTEST_SKIP() << "a CUDA device is present; this checks the behaviour without one";
  std::mt19937_64 rng = make_rng(1);
  const Tensor<float> q = randn<float>({1, 1, 4, 8}, rng), k = randn<float>({1, 1, 4, 8}, rng);
  try {
    token_attention(Backend::cuda, q, k, k);
    FAIL() << "no exception without a device";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.argument(), "backend");
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
  EXPECT_EQ(thrown_argument([&] { cuda::null_statistic(Tensor<float>({1, 2, 3})); }), "backend");
}

// --- argument validation (before any device work) ---------------------------------------------------

TEST(CudaValidation, AttentionErrorsNameTheArgument) {
  std::mt19937_64 rng = make_rng(4);
  auto h16 = [&](Shape s, DType t = DType::f16) { return io::round_to(randn<float>(std::move(s), rng), t); };
  const io::Tensor16 q = h16({1, 2, 4, 64}), k = h16({1, 1, 6, 64}), v = h16({1, 1, 6, 64});
  AttentionOptions opt;
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention(h16({1, 2, 4, 256}), h16({1, 1, 6, 256}), v, opt); }), "q");
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention(q, k, h16({1, 1, 6, 200}), opt); }), "v");
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention(q, h16({1, 1, 6, 64}, DType::bf16), v, opt); }), "k");
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention(q, k, h16({1, 1, 6, 64}, DType::bf16), opt); }), "v");
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention(q, h16({1, 3, 6, 64}), h16({1, 3, 6, 64}), opt); }), "k");
  io::Tensor16 qf32 = q;
  qf32.dtype = DType::f32;  // float32 inputs take oasis::token_attention(Backend::cuda, ...)
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention(qf32, k, v, opt); }), "q");
  io::Tensor16 qnan = q;
  qnan.bits[5] = 0x7e00;  // f16 NaN
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention(qnan, k, v, opt); }), "q");
  AttentionOptions sparse = opt;
  sparse.normalizer = RowNorm::sparsemax;
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention(q, k, v, sparse); }), "normalizer");
  AttentionOptions nulls = opt;
  nulls.normalizer = RowNorm::softmax;
  nulls.null_logits = {0.5, 0.5};
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention(q, k, v, nulls); }), "null_logits");
  AttentionOptions masked;
  masked.normalizer = RowNorm::softmax;
  masked.masked_row = MaskedRow::error;
  masked.key_lengths = {0};
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention(q, k, v, masked); }), "scores");
  masked.key_lengths = {7};
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention(q, k, v, masked); }), "key_lengths");
  io::Tensor16 short_bits = q;
  short_bits.bits.pop_back();
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention(short_bits, k, v, opt); }), "bits");
}

TEST(CudaValidation, DeviceEntryPointsCheckShapesAndPointers) {
  cuda::DeviceAttention a;
  a.shape = AttentionShape{1, 3, 2, 4, 4, 64, 64};
  float dummy = 0;
  a.q = a.k = a.v = &dummy;
  a.out = a.lse = a.p_null = &dummy;
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention_device(a); }), "shape");  // 2 does not divide 3
  a.shape.H_kv = 1;
  a.q = nullptr;
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention_device(a); }), "q");
  a.q = &dummy;
  a.shape.d_h = 129;
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention_device(a); }), "q");
  a.shape.d_h = 64;
  a.normalizer = RowNorm::clipped_softmax1;
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention_device(a); }), "normalizer");
  a.normalizer = RowNorm::softmax1;
  a.window = -1;
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention_device(a); }), "window");
  a.window = 2;
  a.bias = &dummy;
  a.bias_shape = {4, 5};  // Tk = 4
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention_device(a); }), "bias");
  a.bias_shape = {2, 3, 4, 4};  // batch 2 against B = 1
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention_device(a); }), "bias");
  a.bias_shape = {4, 4, 4};
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention_device(a); }), "bias");
  a.window = 0;
  a.bias = nullptr;
  a.bias_shape = {};
  a.dtype = DType::f64;
  EXPECT_EQ(thrown_argument([&] { cuda::token_attention_device(a); }), "dtype");
  EXPECT_EQ(thrown_argument([&] { cuda::null_statistic_device(nullptr, 1, 1, 1, nullptr); }), "p_null");
  EXPECT_EQ(thrown_argument([&] { cuda::null_statistic(Tensor<float>({2, 3})); }), "p_null");
  EXPECT_EQ(thrown_argument([&] { cuda::null_statistic(Tensor<float>({2, 0, 3})); }), "p_null");
}

TEST(CudaValidation, PseudoQueryAndSublayerErrorsNameTheArgument) {
  std::mt19937_64 rng = make_rng(6);
  const Tensor<float> sources = randn<float>({3, 8, 16}, rng), w = randn<float>({16}, rng);
  EXPECT_EQ(thrown_argument([&] { cuda::pseudo_query_logits(sources, randn<float>({15}, rng)); }), "w");
  EXPECT_EQ(thrown_argument([&] { cuda::pseudo_query_logits(sources, w, randn<float>({4}, rng)); }), "gain");
  EXPECT_EQ(thrown_argument([&] { cuda::pseudo_query_logits(sources, w, {}, KeyNormOptions{0.0, false}); }), "eps");
  Tensor<float> bad = sources;
  bad[7] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(thrown_argument([&] { cuda::pseudo_query_logits(bad, w); }), "sources");

  // The sublayer takes the model's types; every error names the argument or configuration field.
  const std::vector<SourceKind> kinds{SourceKind::initial, SourceKind::attention, SourceKind::attention};
  model::ModelConfig cfg;
  cfg.d_model = 16;
  cfg.n_heads = 2;
  cfg.n_kv_heads = 1;  // d_head = 8
  const Tensor<float> norm({16}, 1.0f), wq = randn<float>({16, 16}, rng), wk = randn<float>({8, 16}, rng),
                      wv = randn<float>({8, 16}, rng), wo = randn<float>({16, 16}, rng);
  const model::AttentionWeights<float> att{&norm, &wq, &wk, &wv, &wo, nullptr, nullptr};
  const cuda::KimiRouter router{&w, nullptr, -5.0};
  const Tensor<float> psi = uniform<float>({3, 8}, rng, 0.0, 1.0);
  auto run = [&](const model::AttentionWeights<float>& W, const model::ModelConfig& c, const Tensor<float>& p,
                 index_t batch = 2, const cuda::KimiRouter& r = {}) {
    return thrown_argument([&] { cuda::attn_res_sublayer(sources, p, kinds, batch, r.query ? r : router, W, c); });
  };
  model::AttentionWeights<float> w2 = att;
  const Tensor<float> wq_bad = randn<float>({16, 15}, rng), wo_bad = randn<float>({15, 16}, rng);
  w2.wq = &wq_bad;
  EXPECT_EQ(run(w2, cfg, psi), "wq");
  w2 = att;
  w2.wo = &wo_bad;
  EXPECT_EQ(run(w2, cfg, psi), "wo");
  w2 = att;
  w2.wk = nullptr;
  EXPECT_EQ(run(w2, cfg, psi), "wk");
  model::ModelConfig c2 = cfg;
  c2.qk_norm = true;
  EXPECT_EQ(run(att, c2, psi), "q_norm");  // qk-norm configured, no q/k gains given
  EXPECT_EQ(run(att, cfg, psi, 3), "batch");
  c2 = cfg;
  c2.n_kv_heads = 3;
  EXPECT_EQ(run(att, c2, psi), "n_kv_heads");
  c2 = cfg;
  c2.d_model = 32;
  EXPECT_EQ(run(att, c2, psi), "sources");  // width 16 is not d_model
  c2 = cfg;
  c2.token_normalizer = RowNorm::entmax15;
  EXPECT_EQ(run(att, c2, psi), "token_normalizer");
  c2 = cfg;
  c2.variant = Variant::original;
  EXPECT_EQ(run(att, c2, psi), "variant");
  c2 = cfg;
  c2.router = model::RouterFamily::authors_code;
  EXPECT_EQ(run(att, c2, psi), "router");
  c2 = cfg;
  c2.psi_estimator = model::PsiEstimator::mass_deficit;
  EXPECT_EQ(run(att, c2, psi), "psi_estimator");
  w2 = att;
  const Tensor<float> gate_w = randn<float>({2, 16}, rng);
  w2.gate_w = &gate_w;
  EXPECT_EQ(run(w2, cfg, psi), "gate_w");
  EXPECT_EQ(run(att, cfg, psi, 2, cuda::KimiRouter{&w, nullptr, std::nan("")}), "theta");
  const Tensor<float> gain_bad({15}, 1.0f);
  EXPECT_EQ(run(att, cfg, psi, 2, cuda::KimiRouter{&w, &gain_bad, -5.0}), "key_gain");
  const Tensor<float> query_bad({15});
  EXPECT_EQ(run(att, cfg, psi, 2, cuda::KimiRouter{&query_bad, nullptr, -5.0}), "query");
  Tensor<float> psi_bad = psi;
  psi_bad(2, 3) = -0.5f;
  EXPECT_EQ(run(att, cfg, psi_bad), "psi");
  EXPECT_EQ(run(att, cfg, Tensor<float>({3, 7})), "psi");
  const model::MlpWeights<float> no_mlp{&norm, nullptr, nullptr, nullptr};
  EXPECT_EQ(thrown_argument([&] { cuda::attn_res_sublayer(sources, psi, kinds, 2, router, no_mlp, cfg); }), "gate");
}

// --- the fused kernel's row state machine, simulated on the host -----------------------------------

/// The kernel's algorithm with its tiling (16-query blocks whose band of 32-key tiles starts at
/// the first query's first visible key), its per-row state functions and its operation order per
/// row; `double_null` folds the null category in twice (a deliberate bug, to show that the parity
/// rule detects it).
AttentionResult<float> simulate_fused(const AttentionInputs& in, bool double_null = false) {
  const AttentionShape s = check_attention_args(in.q, in.k, in.v, in.opt);
  const bool s1 = in.opt.normalizer == RowNorm::softmax1;
  const float scale = in.opt.scale ? static_cast<float>(*in.opt.scale) : 1.0f / std::sqrt(static_cast<float>(s.d_h));
  // the computation on [B, H, T, d] views; out is swapped back at the end
  const bool bthd = in.opt.layout == AttentionLayout::bthd;
  const Tensor<float> q = bthd ? swap_head_time(in.q) : in.q, k = bthd ? swap_head_time(in.k) : in.k,
                      v = bthd ? swap_head_time(in.v) : in.v;
  AttentionResult<float> r{Tensor<float>({s.B, s.H, s.Tq, s.d_v}), Tensor<float>({s.B, s.H, s.Tq}),
                           Tensor<float>({s.B, s.H, s.Tq}), {}};
  const index_t group = s.H / s.H_kv;
  std::vector<float> o(static_cast<std::size_t>(s.d_v)), z(32), p(32);
  for (index_t b = 0; b < s.B; ++b)
    for (index_t h = 0; h < s.H; ++h) {
      const float sl = s1 ? (in.opt.null_logits.empty() ? 0.0f : static_cast<float>(in.opt.null_logits[static_cast<std::size_t>(h)]))
                          : -INFINITY;
      const index_t len = in.opt.key_lengths.empty() ? s.Tk : in.opt.key_lengths[static_cast<std::size_t>(b)];
      auto span = [&](index_t t) { return online::key_span<index_t>(len, in.opt.causal, in.opt.window, t, s.Tq, s.Tk); };
      for (index_t t = 0; t < s.Tq; ++t) {
        const online::KeySpan<index_t> vis = span(t);
        const index_t band = span(t / 16 * 16).begin / 32 * 32;  // the block's first tile
        online::State row = online::start(s1, sl);
        if (double_null && s1) row.l += 1.0f;
        std::fill(o.begin(), o.end(), 0.0f);
        for (index_t j0 = band; j0 < vis.end; j0 += 32) {
          if (j0 + 32 <= vis.begin) continue;  // no visible key of this row in the tile
          float tile_max = -INFINITY;
          for (index_t jj = 0; jj < 32; ++jj) {
            const index_t j = j0 + jj;
            float& zj = z[static_cast<std::size_t>(jj)];
            zj = -INFINITY;
            if (j < vis.begin || j >= vis.end) continue;
            float acc = 0.0f;
            for (index_t c = 0; c < s.d_h; ++c) acc = std::fma(q(b, h, t, c), k(b, h / group, j, c), acc);
            zj = acc * scale;
            if (!in.opt.bias.empty()) zj += static_cast<float>(attention_bias(in.opt, b, h, t, j));
            tile_max = std::max(tile_max, zj);
          }
          const float corr = online::rescale(row, tile_max);
          float sum = 0.0f;
          for (index_t jj = 0; jj < 32; ++jj)
            sum += (p[static_cast<std::size_t>(jj)] = online::weight(z[static_cast<std::size_t>(jj)], row.m));
          row.l += sum;
          for (index_t c = 0; c < s.d_v; ++c) {
            float oc = o[static_cast<std::size_t>(c)] * corr;
            for (index_t jj = 0; jj < 32 && j0 + jj < s.Tk; ++jj)
              oc = std::fma(p[static_cast<std::size_t>(jj)], v(b, h / group, j0 + jj, c), oc);
            o[static_cast<std::size_t>(c)] = oc;
          }
        }
        const online::Finish f = online::finish(row, s1, sl);
        for (index_t c = 0; c < s.d_v; ++c) r.out(b, h, t, c) = o[static_cast<std::size_t>(c)] * f.inv;
        r.lse(b, h, t) = f.lse;
        r.p_null(b, h, t) = f.p_null;
      }
    }
  if (bthd) r.out = swap_head_time(r.out);
  return r;
}

class SimulatedKernel : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(SimulatedKernel, WithinTwiceReferenceErrorPlusFloor) {
  const AttentionCase& c = GetParam();
  const AttentionInputs in = make_inputs(c, std::hash<std::string>{}(c.name) % 1000003ULL);
  const AttentionResult<float> got = simulate_fused(in), ref = token_attention(in.q, in.k, in.v, in.opt);
  AttentionOptions hp_opt = in.opt;
  hp_opt.return_probs = true;
  using L = long double;
  const AttentionResult<L> hp = token_attention(in.q.cast<L>(), in.k.cast<L>(), in.v.cast<L>(), hp_opt);
  const bounds::AttentionBounds b = bounds::attention_bounds(in.q, in.k, in.v, in.opt, hp);
  OASIS_EXPECT_PARITY(within_twice_reference("out", got.out, ref.out, hp.out, b.out));
  OASIS_EXPECT_PARITY(within_twice_reference("lse", got.lse, ref.lse, hp.lse, b.lse));
  OASIS_EXPECT_PARITY(within_twice_reference("p_null", got.p_null, ref.p_null, hp.p_null, b.p_null));
}

INSTANTIATE_TEST_SUITE_P(Cases, SimulatedKernel, ::testing::ValuesIn(attention_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(CudaOnlineRow, ParityRuleDetectsANullFoldedInTwice) {
  const AttentionInputs in = make_inputs(attention_cases()[0], 99);
  const AttentionResult<float> bad = simulate_fused(in, true), ref = token_attention(in.q, in.k, in.v, in.opt);
  AttentionOptions hp_opt = in.opt;
  hp_opt.return_probs = true;
  using L = long double;
  const AttentionResult<L> hp = token_attention(in.q.cast<L>(), in.k.cast<L>(), in.v.cast<L>(), hp_opt);
  const bounds::AttentionBounds b = bounds::attention_bounds(in.q, in.k, in.v, in.opt, hp);
  EXPECT_FALSE(within_twice_reference("p_null", bad.p_null, ref.p_null, hp.p_null, b.p_null));
  EXPECT_FALSE(within_twice_reference("out", bad.out, ref.out, hp.out, b.out));
}

}  // namespace
}  // namespace oasis::test
