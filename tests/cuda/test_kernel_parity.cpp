// CUDA backend: the parity of the CUDA-only entry points with the high-precision oracle — float16
// and bfloat16 inputs, the pseudo-query logits, the split-K and tensor-core kernels chosen
// explicitly, the kernel choice — under the kernel parity rule (tests/parity/parity_rule.hpp;
// docs/tolerances.md, "Fused kernels"). The backend's float32 ops are in the parity suite
// (tests/parity), which runs over every registered backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "attention_dispatch.hpp"
#include "attention_parity.hpp"
#include "device_util.hpp"
#include "oasis/backends/cuda.hpp"
#include "oasis/core/instances.hpp"
#include "oasis/core/multiprecision.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/ops/online_softmax.hpp"
#include "oasis_test.hpp"
#include "parity_rule.hpp"

namespace oasis::io {
inline void PrintTo(DType t, std::ostream* os) { *os << to_string(t); }
}  // namespace oasis::io

namespace oasis::test {
namespace {

using R = mp50;

// --- float16 / bfloat16 inputs, pseudo-query logits ----------------------------------------------

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
// --- the split-K and tensor-core kernels ------------------------------------------------------------

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

}  // namespace
}  // namespace oasis::test
