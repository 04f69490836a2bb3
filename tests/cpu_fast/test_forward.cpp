// Fast CPU path, token attention: parity with the mp50 oracle under the criterion of
// parity_bound.hpp, for every instruction-set variant this CPU runs (with sliding windows, additive
// biases with masked rows, and the [B, T, H, d] layout), and the criterion's power; the dispatcher
// runs the same code; workspace reuse of the *_into API; values read in place or copied, and the
// phases of one kv head, bitwise equal; identical validation messages, non-finite inputs included.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cpu_fast_test.hpp"

using namespace oasis;
using namespace oasis::cpu_fast_test;

namespace {

class Parity : public ::testing::TestWithParam<Case> {};

TEST_P(Parity, FastWithinTwiceReferenceErrorPlusFloorForEveryIsa) {
  const Case& c = GetParam();
  const Inputs in = make_inputs(c, 7001);
  AttentionOptions opt = in.opt;
  opt.return_probs = c.probs;
  AttentionOptions opt_mp = in.opt;
  opt_mp.return_probs = true;
  const AttentionResult<R> mp = token_attention(in.q.cast<R>(), in.k.cast<R>(), in.v.cast<R>(), opt_mp);
  const AttentionResult<float> ref = token_attention(in.q, in.k, in.v, opt);
  IsaGuard guard;
  for (const std::string& isa : cpu_fast::available_isas()) {
    SCOPED_TRACE("isa " + isa);
    cpu_fast::set_isa(isa);
    const AttentionResult<float> fast = cpu_fast::token_attention(in.q, in.k, in.v, opt);
    ASSERT_EQ(fast.probs.empty(), !c.probs);
    const fast_parity::Outcome o = expect_fast_parity(isa, in.q, in.k, in.v, opt, fast, ref, mp);
    RecordProperty("worst_ratio_" + isa, std::to_string(o.worst_ratio));

    // rows without a visible key are exact: out 0, p_null 1 / LSE1 = s (softmax1), LSE -inf (softmax)
    const AttentionShape s{c.B, c.H, c.H_kv, c.Tq, c.Tk, c.d_h, c.d_v};
    const bool bthd = c.layout == AttentionLayout::bthd;
    index_t masked = 0;
    for (index_t b = 0; b < c.B; ++b)
      for (index_t h = 0; h < c.H; ++h)
        for (index_t t = 0; t < c.Tq; ++t) {
          if (!fully_masked(s, opt, b, h, t)) continue;
          ++masked;
          const float sl = opt.null_logits.empty() ? 0.0f : static_cast<float>(opt.null_logits[static_cast<std::size_t>(h)]);
          for (index_t e = 0; e < c.d_v; ++e) ASSERT_EQ(bthd ? fast.out(b, t, h, e) : fast.out(b, h, t, e), 0.0f);
          if (c.norm == RowNorm::softmax1) {
            ASSERT_EQ(fast.p_null(b, h, t), 1.0f);
            ASSERT_EQ(fast.lse(b, h, t), sl);
          } else {
            ASSERT_EQ(fast.p_null(b, h, t), 0.0f);
            ASSERT_TRUE(std::isinf(fast.lse(b, h, t)) && fast.lse(b, h, t) < 0);
          }
        }
    RecordProperty("fully_masked_rows", std::to_string(masked));
  }
}

INSTANTIATE_TEST_SUITE_P(CpuFast, Parity, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// The criterion has power: a kernel that folded the null category in with a logit off by 1e-3
// (or twice) would be caught.
TEST(CpuFastCriterion, RejectsAWrongNullFold) {
  const Case c = cases()[0];
  const Inputs in = make_inputs(c, 7002);
  AttentionOptions opt = in.opt;
  opt.return_probs = true;
  const AttentionResult<R> mp = token_attention(in.q.cast<R>(), in.k.cast<R>(), in.v.cast<R>(), opt);
  const AttentionResult<float> ref = token_attention(in.q, in.k, in.v, opt);
  AttentionOptions shifted = opt;
  for (double& s : shifted.null_logits) s += 1e-3;
  const AttentionResult<float> wrong = cpu_fast::token_attention(in.q, in.k, in.v, shifted);
  EXPECT_FALSE(fast_parity::check_attention(in.q, in.k, in.v, opt, wrong, ref, mp).ok);
  AttentionOptions twice = opt;  // e^s counted twice == one null logit s + log 2
  for (double& s : twice.null_logits) s += std::log(2.0);
  const AttentionResult<float> doubled = cpu_fast::token_attention(in.q, in.k, in.v, twice);
  EXPECT_FALSE(fast_parity::check_attention(in.q, in.k, in.v, opt, doubled, ref, mp).ok);
}

TEST(CpuFastAttention, BackendDispatchIsTheFastPath) {
  const Inputs in = make_inputs(cases()[0], 7003);
  ASSERT_TRUE(backend_available(Backend::cpu_fast)) << backend_unavailable_reason(Backend::cpu_fast);
  const AttentionResult<float> a = token_attention(Backend::cpu_fast, in.q, in.k, in.v, in.opt);
  const AttentionResult<float> b = cpu_fast::token_attention(in.q, in.k, in.v, in.opt);
  EXPECT_TRUE(oasis::test::exactly_equal("out", a.out, b.out));
  EXPECT_TRUE(oasis::test::exactly_equal("lse", a.lse, b.lse));
  EXPECT_TRUE(oasis::test::exactly_equal("p_null", a.p_null, b.p_null));
}

TEST(CpuFastAttention, IntoReusesBuffersAndMatchesFreshResults) {
  const Inputs x = make_inputs(cases()[0], 7004);
  const Inputs y = make_inputs(cases()[5], 7005);
  AttentionResult<float> r;
  cpu_fast::token_attention_into(x.q, x.k, x.v, x.opt, r);
  const float* storage = r.out.data();
  cpu_fast::token_attention_into(x.q, x.k, x.v, x.opt, r);  // same shape: same storage
  EXPECT_EQ(r.out.data(), storage);
  EXPECT_TRUE(oasis::test::exactly_equal("out", r.out, cpu_fast::token_attention(x.q, x.k, x.v, x.opt).out));
  AttentionOptions yo = y.opt;
  yo.return_probs = true;
  cpu_fast::token_attention_into(y.q, y.k, y.v, yo, r);  // other shape, probs on
  const AttentionResult<float> fresh = cpu_fast::token_attention(y.q, y.k, y.v, yo);
  EXPECT_TRUE(oasis::test::exactly_equal("out", r.out, fresh.out));
  EXPECT_TRUE(oasis::test::exactly_equal("probs", r.probs, fresh.probs));
  cpu_fast::token_attention_into(x.q, x.k, x.v, x.opt, r);  // back, probs off
  EXPECT_TRUE(r.probs.empty());
  const Tensor<float> before = r.out;
  cpu_fast::release_workspaces();  // workspaces are rebuilt on the next call
  cpu_fast::token_attention_into(x.q, x.k, x.v, x.opt, r);
  EXPECT_TRUE(oasis::test::exactly_equal("out after release", r.out, before));
}

// Values are read in place only when every row starts on a cache line (else they are copied
// first): both paths give bitwise the same result on every ISA. The two copies of v differ only in
// where the heap put them (small tensors: below the allocator's mmap threshold, so the addresses
// modulo 64 vary; spacer allocations move the next one along).
TEST(CpuFastAttention, ValuesInPlaceOrCopiedGiveTheSameResult) {
  Case c = cases()[1];  // d_v = 64: whole AVX-512 vectors, in place when aligned
  c.H_kv = 1;
  c.Tk = 100;  // v is 25.6 KB
  const Inputs in = make_inputs(c, 7006);
  std::vector<Tensor<float>> copies;
  std::vector<std::vector<char>> spacers;
  const Tensor<float>* on_line = nullptr;
  const Tensor<float>* off_line = nullptr;
  copies.reserve(256);  // element addresses stay put
  for (int i = 0; i < 256 && !(on_line && off_line); ++i) {
    spacers.emplace_back(static_cast<std::size_t>(16 * (i % 5 + 1)));
    copies.push_back(in.v);
    const Tensor<float>& t = copies.back();
    (reinterpret_cast<std::uintptr_t>(t.data()) % 64 == 0 ? on_line : off_line) = &t;
  }
  ASSERT_TRUE(on_line && off_line) << "no cache-line-aligned and misaligned copies of v in 256 allocations";
  IsaGuard guard;
  for (const std::string& isa : cpu_fast::available_isas()) {
    cpu_fast::set_isa(isa);
    const AttentionResult<float> a = cpu_fast::token_attention(in.q, in.k, *on_line, in.opt);
    const AttentionResult<float> b = cpu_fast::token_attention(in.q, in.k, *off_line, in.opt);
    EXPECT_TRUE(oasis::test::exactly_equal("out (" + isa + ")", a.out, b.out));
    EXPECT_TRUE(oasis::test::exactly_equal("lse (" + isa + ")", a.lse, b.lse));
    EXPECT_TRUE(oasis::test::exactly_equal("p_null (" + isa + ")", a.p_null, b.p_null));
  }
}

// With at least two query blocks per thread in each kv head's group, the forward packs and runs
// one kv head at a time in a buffer of one head's room (attention_impl's phases); otherwise every
// kv head in one phase. One thread takes the first path here (3 blocks x 2 query heads per kv
// head), 64 threads the second: the results are bitwise equal, and within the parity rule.
TEST(CpuFastAttention, PhasesOfOneKvHeadGiveTheSameResult) {
  for (const AttentionLayout layout : {AttentionLayout::bhtd, AttentionLayout::bthd}) {
    const Case c = with({"phases_gqa_padded", 2, 4, 2, 150, 150, 16, 24, RowNorm::softmax1, true, {150, 120}, true, 1,
                         1, false, {}}, 0, 0, layout);
    SCOPED_TRACE(to_string(layout));
    const Inputs in = make_inputs(c, 7007);
    AttentionOptions opt_mp = in.opt;
    opt_mp.return_probs = true;
    const AttentionResult<R> mp = token_attention(in.q.cast<R>(), in.k.cast<R>(), in.v.cast<R>(), opt_mp);
    const AttentionResult<float> ref = token_attention(in.q, in.k, in.v, in.opt);
    IsaGuard guard;
    const int saved = omp_get_max_threads();
    for (const std::string& isa : cpu_fast::available_isas()) {
      cpu_fast::set_isa(isa);
      omp_set_num_threads(1);
      const AttentionResult<float> phased = cpu_fast::token_attention(in.q, in.k, in.v, in.opt);
      omp_set_num_threads(64);
      const AttentionResult<float> single = cpu_fast::token_attention(in.q, in.k, in.v, in.opt);
      omp_set_num_threads(saved);
      EXPECT_TRUE(oasis::test::exactly_equal("out (" + isa + ")", phased.out, single.out));
      EXPECT_TRUE(oasis::test::exactly_equal("lse (" + isa + ")", phased.lse, single.lse));
      EXPECT_TRUE(oasis::test::exactly_equal("p_null (" + isa + ")", phased.p_null, single.p_null));
      expect_fast_parity(isa, in.q, in.k, in.v, in.opt, phased, ref, mp);
    }
  }
}

TEST(CpuFastAttention, InvalidInputSameErrorAsReference) {
  const Inputs in = make_inputs(cases()[4], 7006);  // plain softmax with fully masked rows
  AttentionOptions opt = in.opt;
  opt.masked_row = MaskedRow::error;
  std::string ref_msg, fast_msg;
  try { token_attention(in.q, in.k, in.v, opt); } catch (const invalid_argument& e) { ref_msg = e.what(); }
  try { cpu_fast::token_attention(in.q, in.k, in.v, opt); } catch (const invalid_argument& e) { fast_msg = e.what(); }
  EXPECT_FALSE(ref_msg.empty());
  EXPECT_EQ(fast_msg, ref_msg);
  Tensor<float> bad_q = in.q;
  bad_q[3] = std::numeric_limits<float>::quiet_NaN();
  try {
    cpu_fast::token_attention(bad_q, in.k, in.v, in.opt);
    ADD_FAILURE() << "NaN in q accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.argument(), "q");
  }
}

// The fast path checks q, k and v for finiteness while it packs and reads them; a NaN or +-inf
// anywhere (first, middle and last element, so also the packing's tail rows and columns) must
// give the reference's error message, argument and first index, in the reference's order (q, then
// k, then v) when several inputs are bad, on every ISA, through every forward entry point, with
// values copied or read in place.
TEST(CpuFastAttention, NonFiniteInputsSameErrorAsReference) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  IsaGuard guard;
  for (const std::size_t ci : {std::size_t{0}, std::size_t{1}, std::size_t{3}}) {
    Case c = cases()[ci];
    if (ci == 1) {  // small enough for some copies of v to start on a cache line (in place)
      c.H_kv = 1;
      c.Tk = 100;
    }
    for (const AttentionLayout layout : {AttentionLayout::bhtd, AttentionLayout::bthd}) {
      const Inputs in = make_inputs(with(c, 0, 0, layout), 7100 + ci);
      struct Bad {
        int which;  // 0 q, 1 k, 2 v
        index_t at;
        float value;
      };
      std::vector<std::vector<Bad>> patterns;
      for (int w = 0; w < 3; ++w) {
        const index_t n = (w == 0 ? in.q : w == 1 ? in.k : in.v).size();
        patterns.push_back({{w, 0, nan}});
        patterns.push_back({{w, n / 2 + 1, inf}});
        patterns.push_back({{w, n - 1, -inf}});
      }
      patterns.push_back({{2, 5, nan}, {0, in.q.size() - 2, inf}});  // v and q bad: q reported
      patterns.push_back({{2, 0, inf}, {1, in.k.size() - 1, nan}});  // v and k bad: k reported
      // the backward checks q, k and v as it packs them, before the cotangents and the forward:
      // with a cotangent of the wrong shape as well, the input's error is still the one reported
      const AttentionCotangents<float> bad_d{Tensor<float>({1, 1, 1, 1}), {}, {}};
      AttentionResult<float> clean_fwd;
      cpu_fast::AttentionRowState clean_st;
      cpu_fast::token_attention_into(in.q, in.k, in.v, in.opt, clean_fwd, clean_st);
      for (const auto& pattern : patterns) {
        Tensor<float> q = in.q, k = in.k, v = in.v;
        for (const Bad& b : pattern) (b.which == 0 ? q : b.which == 1 ? k : v)[b.at] = b.value;
        const Thrown ref = thrown_by([&] { token_attention(q, k, v, in.opt); });
        SCOPED_TRACE(std::string(c.name) + " " + std::string(to_string(layout)) + ": " + ref.what);
        ASSERT_TRUE(ref.threw);
        for (const std::string& isa : cpu_fast::available_isas()) {
          cpu_fast::set_isa(isa);
          EXPECT_EQ(thrown_by([&] { cpu_fast::token_attention(q, k, v, in.opt); }).what, ref.what) << isa;
          EXPECT_EQ(thrown_by([&] { token_attention(Backend::cpu_fast, q, k, v, in.opt); }).what, ref.what) << isa;
          AttentionResult<float> r;
          cpu_fast::AttentionRowState st;
          EXPECT_EQ(thrown_by([&] { cpu_fast::token_attention_into(q, k, v, in.opt, r, st); }).what, ref.what) << isa;
          EXPECT_EQ(thrown_by([&] { token_attention_backward(q, k, v, bad_d, in.opt); }).what, ref.what);
          EXPECT_EQ(thrown_by([&] { cpu_fast::token_attention_backward(q, k, v, bad_d, in.opt); }).what, ref.what)
              << isa;
          EXPECT_EQ(thrown_by([&] { token_attention_backward(Backend::cpu_fast, q, k, v, bad_d, in.opt); }).what,
                    ref.what) << isa;
          AttentionGrads<float> g;
          EXPECT_EQ(thrown_by([&] {
                      cpu_fast::token_attention_backward_into(q, k, v, clean_fwd, clean_st, bad_d, in.opt, g);
                    }).what,
                    ref.what) << isa;
        }
      }
    }
  }
}

}  // namespace
