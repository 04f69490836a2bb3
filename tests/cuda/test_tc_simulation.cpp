// The tensor-core kernel (src/cuda/attention_tc.cu) simulated on the host, operation for
// operation in the emulator's stated arithmetic (src/cuda/emu/mma.h: products of 16-bit inputs
// accumulated in float in k order), with two deliberate mistakes a FlashAttention-style kernel
// with a null category can make. The simulation passes the parity rule with the P-rounding term
// (bounds::p_rounding_bound) and, where the emulator runs the kernel, equals it bitwise; each
// mistake is rejected by the rule. Runs without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "oasis/ops/error_bounds.hpp"
#include "oasis/io/tensor16.hpp"
#include "oasis_test.hpp"
#include "oasis/ops/online_softmax.hpp"
#include "parity_rule.hpp"
#if defined(OASIS_CUDA_EMU)
#include "oasis/backends/cuda.hpp"
#endif

namespace oasis::test {
namespace {

enum class Mistake {
  none,
  no_rescale,     ///< the output accumulators are not rescaled when the running maximum grows
  null_per_tile,  ///< the null category is added to S at every key tile, not once per row
};

/// What attention_tc.cu computes for 16-bit inputs (given widened in `in`) rounded P to `dtype`:
/// key tiles of 64 (head tiles of 64) or 32 keys; per tile the scores in column order, the
/// online softmax with the tile maximum, S += (sum of the tile's first half + sum of its second
/// half) as the two lanes of a row add them, O rescaled, O += P^ V in key order; out = O / S.
AttentionResult<float> simulate_tensor_cores(const AttentionInputs& in, io::DType dtype, Mistake mistake) {
  const AttentionShape s = check_attention_args(in.q, in.k, in.v, in.opt);
  const bool s1 = in.opt.normalizer == RowNorm::softmax1;
  const int BK = s.d_h <= 64 && s.d_v <= 64 ? 64 : 32;
  const float scale = in.opt.scale ? static_cast<float>(*in.opt.scale) : 1.0f / std::sqrt(static_cast<float>(s.d_h));
  AttentionResult<float> r{Tensor<float>({s.B, s.H, s.Tq, s.d_v}), Tensor<float>({s.B, s.H, s.Tq}),
                           Tensor<float>({s.B, s.H, s.Tq}), {}};
  const index_t group = s.H / s.H_kv;
  std::vector<float> o(static_cast<std::size_t>(s.d_v)), z(static_cast<std::size_t>(BK)), ph(z.size());
  for (index_t b = 0; b < s.B; ++b)
    for (index_t h = 0; h < s.H; ++h) {
      const index_t hk = h / group;
      const float sl =
          !s1 ? -INFINITY : in.opt.null_logits.empty() ? 0.0f : static_cast<float>(in.opt.null_logits[static_cast<std::size_t>(h)]);
      for (index_t t = 0; t < s.Tq; ++t) {
        const int len = in.opt.key_lengths.empty() ? static_cast<int>(s.Tk)
                                                   : static_cast<int>(in.opt.key_lengths[static_cast<std::size_t>(b)]);
        const int n = online::key_span<int>(len, in.opt.causal, 0, static_cast<int>(t), static_cast<int>(s.Tq), static_cast<int>(s.Tk)).end;
        online::State st = online::start(s1, sl);
        std::fill(o.begin(), o.end(), 0.0f);
        for (int j0 = 0; j0 < n; j0 += BK) {  // tiles past the row's last key change nothing
          float tile_max = -INFINITY;
          for (int jj = 0; jj < BK; ++jj) {
            float x = -INFINITY;
            if (j0 + jj < n) {
              float acc = 0.0f;
              for (index_t c = 0; c < s.d_h; ++c) acc = std::fma(in.q(b, h, t, c), in.k(b, hk, j0 + jj, c), acc);
              x = acc * scale;
            }
            z[static_cast<std::size_t>(jj)] = x;
            tile_max = std::max(tile_max, x);
          }
          const float corr = online::rescale(st, tile_max);
          float half_sum[2] = {0.0f, 0.0f};
          for (int jj = 0; jj < BK; ++jj) {
            const float p = online::weight(z[static_cast<std::size_t>(jj)], st.m);
            half_sum[jj < BK / 2 ? 0 : 1] += p;
            ph[static_cast<std::size_t>(jj)] = static_cast<float>(io::round_to_dtype(p, dtype));
          }
          st.l += half_sum[0] + half_sum[1];
          if (mistake == Mistake::null_per_tile && s1 && j0 > 0) st.l += online::weight(sl, st.m);
          for (index_t c = 0; c < s.d_v; ++c) {
            float oc = mistake == Mistake::no_rescale ? o[static_cast<std::size_t>(c)] : o[static_cast<std::size_t>(c)] * corr;
            for (int jj = 0; jj < BK && j0 + jj < n; ++jj)
              oc = std::fma(ph[static_cast<std::size_t>(jj)], in.v(b, hk, j0 + jj, c), oc);
            o[static_cast<std::size_t>(c)] = oc;
          }
        }
        const online::Finish f = online::finish(st, s1, sl);
        for (index_t c = 0; c < s.d_v; ++c) r.out(b, h, t, c) = o[static_cast<std::size_t>(c)] * f.inv;
        r.lse(b, h, t) = f.lse;
        r.p_null(b, h, t) = f.p_null;
      }
    }
  return r;
}

struct SimulationRun {
  AttentionInputs in;
  io::Tensor16 q, k, v;
};

/// A case over several key tiles (the running maximum grows between them) with padding, GQA
/// and a fully masked row, inputs rounded to dtype.
SimulationRun simulation_inputs(io::DType dtype, index_t d) {
  AttentionCase c{"tc_simulation", 2, 4, 2, 20, 170, d, d, RowNorm::softmax1, true, {170, 0}, true};
  c.probs = false;
  const AttentionInputs raw = make_inputs(c, 1234 + static_cast<std::uint64_t>(d));
  SimulationRun run{{}, io::round_to(raw.q, dtype), io::round_to(raw.k, dtype), io::round_to(raw.v, dtype)};
  run.in = AttentionInputs{io::widen(run.q), io::widen(run.k), io::widen(run.v), raw.opt};
  return run;
}

/// The parity outcome of the simulation's outputs (the P-rounding term in out's floor).
std::vector<::testing::AssertionResult> parity(const AttentionResult<float>& got, const AttentionInputs& in,
                                               io::DType dtype) {
  using L = long double;
  const AttentionResult<float> ref = token_attention(in.q, in.k, in.v, in.opt);
  AttentionOptions hp_opt = in.opt;
  hp_opt.return_probs = true;
  const AttentionResult<L> hp = token_attention(in.q.cast<L>(), in.k.cast<L>(), in.v.cast<L>(), hp_opt);
  bounds::AttentionBounds b = bounds::attention_bounds(in.q, in.k, in.v, in.opt, hp);
  const Tensor<double> term = bounds::p_rounding_bound(
      in.q, in.k, in.v, in.opt, hp, dtype == io::DType::f16 ? bounds::kBinary16 : bounds::kBfloat16);
  for (index_t i = 0; i < b.out.size(); ++i) b.out[i] += term[i];
  return {within_twice_reference("out", got.out, ref.out, hp.out, b.out),
          within_twice_reference("lse", got.lse, ref.lse, hp.lse, b.lse),
          within_twice_reference("p_null", got.p_null, ref.p_null, hp.p_null, b.p_null)};
}

TEST(TensorCoreSimulation, WithinTheRuleWithThePRoundingTerm) {
  for (const io::DType dtype : {io::DType::f16, io::DType::bf16})
    for (const index_t d : {64, 128}) {
      SCOPED_TRACE(std::string(io::to_string(dtype)) + " d=" + std::to_string(d));
      const SimulationRun run = simulation_inputs(dtype, d);
      for (const ::testing::AssertionResult& r : parity(simulate_tensor_cores(run.in, dtype, Mistake::none), run.in, dtype))
        OASIS_EXPECT_PARITY(r);
    }
}

TEST(TensorCoreSimulation, RuleRejectsAnOutputNotRescaledAndANullAddedPerTile) {
  for (const io::DType dtype : {io::DType::f16, io::DType::bf16}) {
    SCOPED_TRACE(io::to_string(dtype));
    const SimulationRun run = simulation_inputs(dtype, 64);
    const auto no_rescale = parity(simulate_tensor_cores(run.in, dtype, Mistake::no_rescale), run.in, dtype);
    EXPECT_FALSE(no_rescale[0]) << "an output not rescaled between tiles passed";
    const auto null_per_tile = parity(simulate_tensor_cores(run.in, dtype, Mistake::null_per_tile), run.in, dtype);
    EXPECT_FALSE(null_per_tile[2]) << "p_null with the null category added per tile passed";
    EXPECT_FALSE(null_per_tile[1]) << "LSE1 with the null category added per tile passed";
  }
}

#if defined(OASIS_CUDA_EMU)
// On the emulator (stated mma order, host libm) the kernel is the simulation, bit for bit: the
// simulation above is what runs, and the mistakes are one-line changes of it.
TEST(TensorCoreSimulation, IsTheEmulatedKernelBitForBit) {
  for (const io::DType dtype : {io::DType::f16, io::DType::bf16})
    for (const index_t d : {64, 128}) {
      SCOPED_TRACE(std::string(io::to_string(dtype)) + " d=" + std::to_string(d));
      const SimulationRun run = simulation_inputs(dtype, d);
      const AttentionResult<float> sim = simulate_tensor_cores(run.in, dtype, Mistake::none);
      const AttentionResult<float> dev =
          cuda::token_attention(run.q, run.k, run.v, run.in.opt, {cuda::AttentionKernel::tensor_cores, 0});
      EXPECT_TRUE(exactly_equal("out", dev.out, sim.out));
      EXPECT_TRUE(exactly_equal("lse", dev.lse, sim.lse));
      EXPECT_TRUE(exactly_equal("p_null", dev.p_null, sim.p_null));
    }
}
#endif

}  // namespace
}  // namespace oasis::test
