// CUDA backend, determinism: repeated launches of every kernel on the same inputs give bitwise
// equal results (no atomics, no order that depends on scheduling: each kernel fixes its
// summation order). On a GPU this checks the device; on the emulator the three thread schedules
// of ctest check it too. Skips with the reason when no device is present.
#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "oasis/backends/backend.hpp"
#include "oasis/backends/cuda.hpp"
#include "oasis/core/instances.hpp"
#include "oasis_test.hpp"
#include "parity_rule.hpp"

namespace oasis::test {
namespace {

constexpr int kRepeats = 3;

::testing::AssertionResult same_result(const std::string& what, const AttentionResult<float>& a,
                                       const AttentionResult<float>& b) {
  for (const auto& [name, x, y] : {std::tuple{"out", &a.out, &b.out}, std::tuple{"lse", &a.lse, &b.lse},
                                   std::tuple{"p_null", &a.p_null, &b.p_null}})
    if (::testing::AssertionResult r = exactly_equal(name, *x, *y); !r) return r << " (" << what << ")";
  return ::testing::AssertionSuccess();
}

TEST(CudaDeterminism, RepeatedLaunchesAreBitwiseEqual) {
  if (std::string why; !cuda::available(&why)) GTEST_SKIP() << "backend cuda is not available: " << why;
  using K = cuda::AttentionKernel;
  AttentionCase c{"determinism", 2, 8, 2, 1, 1000, 128, 128, RowNorm::softmax1, true, {1000, 321}, true};
  c.probs = false;
  const AttentionInputs in = make_inputs(c, 77);
  const io::Tensor16 q = io::round_to(in.q, io::DType::bf16), k = io::round_to(in.k, io::DType::bf16),
                     v = io::round_to(in.v, io::DType::bf16);
  AttentionCase prefill = attention_cases()[0];  // 40 queries, GQA, causal, padded: several tiles and blocks
  prefill.probs = false;
  const AttentionInputs pin = make_inputs(prefill, 78);
  const io::Tensor16 pq = io::round_to(pin.q, io::DType::f16), pk = io::round_to(pin.k, io::DType::f16),
                     pv = io::round_to(pin.v, io::DType::f16);
  const struct {
    const char* name;
    std::function<AttentionResult<float>()> run;
  } calls[] = {
      {"fused", [&] { return cuda::token_attention(pin.q, pin.k, pin.v, pin.opt, {K::fused, 0}); }},
      {"split_keys f32", [&] { return cuda::token_attention(in.q, in.k, in.v, in.opt, {K::split_keys, 0}); }},
      {"split_keys bf16", [&] { return cuda::token_attention(q, k, v, in.opt, {K::split_keys, 5}); }},
      {"tensor_cores f16", [&] { return cuda::token_attention(pq, pk, pv, pin.opt, {K::tensor_cores, 0}); }},
  };
  for (const auto& call : calls) {
    const AttentionResult<float> first = call.run();
    for (int i = 1; i < kRepeats; ++i) EXPECT_TRUE(same_result(call.name, first, call.run()));
  }
  // Depth routing and psi.
  std::mt19937_64 rng = make_rng(79);
  const std::vector<SourceKind> kinds{SourceKind::initial, SourceKind::attention, SourceKind::headless,
                                      SourceKind::attention};
  const Tensor<float> sources = randn<float>({4, 300, 64}, rng), g_old = randn<float>({4, 300}, rng);
  const Tensor<float> psi = uniform<float>({4, 300}, rng, 0.0, 1.0);
  const Tensor<float> p_null = uniform<float>({2, 8, 50}, rng, 0.0, 1.0);
  const DepthRoute<float> r0 = attn_res_route(Backend::cuda, sources, g_old, psi, kinds, DepthOptions{});
  const Tensor<float> psi0 = cuda::null_statistic(p_null);
  for (int i = 1; i < kRepeats; ++i) {
    const DepthRoute<float> r = attn_res_route(Backend::cuda, sources, g_old, psi, kinds, DepthOptions{});
    EXPECT_TRUE(exactly_equal("h", r.h, r0.h));
    EXPECT_TRUE(exactly_equal("alpha", r.alpha, r0.alpha));
    EXPECT_TRUE(exactly_equal("g", r.g, r0.g));
    EXPECT_TRUE(exactly_equal("psi", cuda::null_statistic(p_null), psi0));
  }
}

}  // namespace
}  // namespace oasis::test
