// Fast CPU path: parity of the fused attention and of its backward with the mp50 oracle under
// the criterion of parity_bound.hpp, for every instruction-set variant this CPU runs (with sliding
// windows, additive biases with masked rows, and the [B, T, H, d] layout); the backward's
// mistakes rejected (null gradient dropped, D without the null, GQA not summed, masks missing in
// the backward); depth routing
// bitwise equal to the reference; the vectorised exp within its documented error; identical
// validation messages; overflowed scores (NaN, +inf) rejected as the reference rejects them, -inf
// scores masked; workspace reuse of the *_into API.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <tuple>

#include "oasis/backends/backend.hpp"
#include "oasis/backends/cpu_fast.hpp"
#include "oasis/grad/instances.hpp"
#include "oasis/oasis.hpp"
#include "oasis_test.hpp"
#include "parity_bound.hpp"
#include "replay.hpp"

using namespace oasis;
using R = mp50;

namespace {

// Restores the automatically selected variant after a test that forces one.
struct IsaGuard {
  std::string saved{cpu_fast::isa()};
  ~IsaGuard() { cpu_fast::set_isa(saved); }
};
// The same for the depth mixing's streaming (cpu_fast::route_streams).
struct StreamsGuard {
  std::string saved{cpu_fast::route_streams()};
  ~StreamsGuard() { cpu_fast::set_route_streams(saved); }
};
// Runs f() once per ISA x depth-mixing streaming of this CPU, with both set (and restored after)
// and a trace naming them.
template <class F>
void for_each_isa_and_streaming(F&& f) {
  IsaGuard guard;
  StreamsGuard streams_guard;
  for (const std::string& isa : cpu_fast::available_isas())
    for (const std::string& streams : cpu_fast::available_route_streams()) {
      SCOPED_TRACE("isa " + isa + ", route streams " + streams);
      cpu_fast::set_isa(isa);
      cpu_fast::set_route_streams(streams);
      f();
    }
}

// What f threw (an oasis::invalid_argument), if anything.
struct Thrown {
  bool threw = false;
  std::string argument, what;
};

template <class F>
Thrown thrown_by(F&& f) {
  Thrown r;
  try {
    f();
  } catch (const invalid_argument& e) {
    r.threw = true;
    r.argument = e.argument();
    r.what = e.what();
  }
  return r;
}

struct Case {
  const char* name;
  index_t B, H, H_kv, Tq, Tk, d_h, d_v;
  RowNorm norm;
  bool causal;
  std::vector<index_t> key_lengths;
  bool sinks;          // per-head null logits
  double q_sd, k_sd;   // input scales (large: extreme logits)
  bool probs;
  std::optional<double> scale;
  index_t window = 0;      // sliding window (0: none)
  int bias_rank = 0;       // 0: no bias; 2: [Tq, Tk]; 4: [B, H, Tq, Tk]; 3: [B, 1, Tq, Tk]
  AttentionLayout layout = AttentionLayout::bhtd;
  double v_sd = 1.0;       // value scale
  double null_mean = 0.0;  // per-head null logits ~ N(null_mean, 2^2)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

Case with(Case c, index_t window, int bias_rank, AttentionLayout layout) {
  c.window = window;
  c.bias_rank = bias_rank;
  c.layout = layout;
  return c;
}

Case scaled(Case c, double v_sd, double null_mean) {
  c.v_sd = v_sd;
  c.null_mean = null_mean;
  return c;
}

std::vector<Case> cases() {
  return {
      {"softmax1_gqa_causal_pad", 2, 4, 2, 37, 150, 16, 24, RowNorm::softmax1, true, {150, 90}, true, 1, 1, true, {}},
      {"softmax1_multi_tile_d64", 1, 2, 2, 70, 300, 64, 64, RowNorm::softmax1, false, {}, false, 1, 1, false, {}},
      {"softmax1_causal_d128_gqa4", 1, 4, 1, 66, 130, 128, 128, RowNorm::softmax1, true, {}, true, 1, 1, false, {}},
      // Tq > Tk, causal: the first Tq - Tk rows see no key (fully masked); batch 1 has no key at all
      {"softmax1_masked_rows", 2, 2, 2, 80, 50, 8, 5, RowNorm::softmax1, true, {50, 0}, true, 1, 1, true, {}},
      {"softmax_masked_rows_zero", 2, 2, 1, 80, 50, 8, 5, RowNorm::softmax, true, {50, 0}, false, 1, 1, true, {}},
      {"softmax_odd_dims", 1, 3, 3, 19, 77, 3, 17, RowNorm::softmax, false, {}, false, 1, 1, true, {}},
      // |z| up to ~1e4: near one-hot rows, rescaling by e^{m - m'} underflowing to 0
      {"softmax1_extreme_logits", 1, 2, 1, 40, 200, 16, 16, RowNorm::softmax1, true, {}, true, 50, 50, true, {}},
      {"softmax_extreme_logits", 1, 2, 2, 40, 200, 16, 16, RowNorm::softmax, false, {170}, false, 50, 50, false, {}},
      {"softmax1_explicit_scale", 1, 1, 1, 65, 129, 32, 16, RowNorm::softmax1, true, {}, false, 1, 1, true, 0.7},
      // sliding windows (docs/spec.md §8): one key, in [B, T, H, d] with GQA; a band of 70 keys over 300
      // (key tiles outside the band of a query block are skipped), d_v not a whole vector; padding
      // with Tq != Tk (rows of batch 1 past its padding fully masked); wider than every row (= causal)
      with({"window1_bthd_gqa", 1, 4, 2, 70, 70, 16, 16, RowNorm::softmax1, false, {}, true, 1, 1, true, {}}, 1, 0,
           AttentionLayout::bthd),
      with({"window_band_skips_tiles", 1, 2, 1, 300, 300, 32, 24, RowNorm::softmax1, false, {}, true, 1, 1, true, {}},
           70, 0, AttentionLayout::bhtd),
      with({"window_padded_tq_ne_tk", 2, 2, 2, 50, 200, 16, 16, RowNorm::softmax, false, {200, 160}, false, 1, 1, true,
            {}}, 30, 0, AttentionLayout::bhtd),
      with({"window_wider_than_rows", 1, 2, 2, 90, 90, 8, 8, RowNorm::softmax1, false, {}, true, 1, 1, false, {}}, 500,
           0, AttentionLayout::bhtd),
      // additive bias with -inf masks and rows masked at every key
      with({"bias_masked_rows_softmax1_bthd", 2, 2, 1, 70, 100, 16, 16, RowNorm::softmax1, false, {}, true, 1, 1, true,
            {}}, 0, 3, AttentionLayout::bthd),
      with({"bias_masked_rows_softmax", 1, 2, 2, 66, 66, 16, 16, RowNorm::softmax, true, {}, false, 1, 1, true, {}}, 0,
           2, AttentionLayout::bhtd),
      with({"bias_window_bthd_odd_dv", 1, 2, 2, 150, 150, 16, 17, RowNorm::softmax1, true, {150}, true, 1, 1, true, {}},
           40, 4, AttentionLayout::bthd),
      // The kernels' weights e^{z - M} carried times 2^32 (fast_kernels_impl.inc, kWeightScale).
      // Sinks at ~95 over logits ~N(0, 1): every key's weight is in [e^-104, 2^-126), subnormal
      // unscaled; out, the probabilities and the gradients of k and v are subnormal-small and must
      // keep their digits (a kernel that flushes such weights to zero fails here, as a mutant did).
      scaled({"sink_subnormal_weights_d64", 1, 2, 1, 70, 300, 64, 64, RowNorm::softmax1, true, {}, true, 1, 1, true,
              {}}, 1.0, 95.0),
      // Peaked plain-softmax rows (logits ~N(0, 30^2)): normal, subnormal and zero weights mixed.
      {"softmax_peaked_rows_d128", 1, 2, 2, 66, 200, 128, 128, RowNorm::softmax, true, {}, false, 30, 1, true, {}},
      // Values of 1e30: 2^32 times the output accumulator (and the dk sums) overflow, so the
      // kernels compute these blocks again unscaled (a kernel without that fallback gives inf).
      scaled({"huge_values_unscaled_fallback", 1, 2, 1, 70, 150, 32, 32, RowNorm::softmax1, true, {}, true, 1, 1, false,
              {}}, 1e30, 0.0),
  };
}

struct Inputs {
  Tensor<float> q, k, v;
  AttentionOptions opt;
};

Inputs make_inputs(const Case& c, std::uint64_t seed) {
  auto rng = oasis::test::make_rng(seed);
  Inputs in;
  in.q = oasis::test::randn<float>({c.B, c.H, c.Tq, c.d_h}, rng, c.q_sd);
  in.k = oasis::test::randn<float>({c.B, c.H_kv, c.Tk, c.d_h}, rng, c.k_sd);
  in.v = oasis::test::randn<float>({c.B, c.H_kv, c.Tk, c.d_v}, rng, c.v_sd);
  in.opt.normalizer = c.norm;
  in.opt.causal = c.causal;
  in.opt.key_lengths = c.key_lengths;
  in.opt.scale = c.scale;
  if (c.sinks) {
    std::normal_distribution<double> nd(c.null_mean, 2.0);
    for (index_t h = 0; h < c.H; ++h) in.opt.null_logits.push_back(static_cast<double>(static_cast<float>(nd(rng))));
  }
  in.opt.window = c.window;
  if (c.bias_rank) {
    // float-exact N(0, 2^2) values, -inf at a fifth of the entries and at every key of 3 rows
    Tensor<double> bias = c.bias_rank == 2 ? Tensor<double>({c.Tq, c.Tk})
                                           : Tensor<double>({c.B, c.bias_rank == 4 ? c.H : 1, c.Tq, c.Tk});
    std::normal_distribution<double> nd(0.0, 2.0);
    std::uniform_real_distribution<double> ud(0.0, 1.0);
    for (index_t i = 0; i < bias.size(); ++i)
      bias[i] = ud(rng) < 0.2 ? -std::numeric_limits<double>::infinity() : static_cast<double>(static_cast<float>(nd(rng)));
    for (index_t r = 0; r < 3; ++r) {
      const index_t row = static_cast<index_t>(ud(rng) * static_cast<double>(bias.size() / c.Tk));
      for (index_t j = 0; j < c.Tk; ++j) bias[row * c.Tk + j] = -std::numeric_limits<double>::infinity();
    }
    in.opt.bias = std::move(bias);
  }
  if (c.layout == AttentionLayout::bthd) {  // the same values in [B, T, H, d]
    in.opt.layout = c.layout;
    in.q = swap_head_time(in.q);
    in.k = swap_head_time(in.k);
    in.v = swap_head_time(in.v);
  }
  return in;
}

// True if row (b, h, t) sees no key: none in its key range, or each one masked by a -inf bias.
bool fully_masked(const AttentionShape& s, const AttentionOptions& opt, index_t b, index_t h, index_t t) {
  const KeyRange kr = visible_range(s, opt, b, t);
  for (index_t j = kr.begin; j < kr.end; ++j)
    if (attention_bias(opt, b, h, t, j) != -std::numeric_limits<double>::infinity()) return false;
  return true;
}

// The parity rule over every output of an attention call (parity_bound.hpp) as an expectation;
// a failure is also written as a replay (tests/support/replay.hpp) named after the test and ISA.
fast_parity::Outcome expect_fast_parity(const std::string& isa, const Tensor<float>& q, const Tensor<float>& k,
                                        const Tensor<float>& v, const AttentionOptions& opt,
                                        const AttentionResult<float>& fast, const AttentionResult<float>& ref,
                                        const AttentionResult<R>& mp) {
  const fast_parity::Outcome o = fast_parity::check_attention(q, k, v, opt, fast, ref, mp);
  EXPECT_TRUE(o.ok) << o.violations << " violations\n" << o.first;
  if (!o.ok) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "." + info->name() + "." + isa;
    std::replace(name.begin(), name.end(), '/', '_');
    replay::write(name, replay::attention_case(q, k, v, opt, fast, mp, name + ": " + std::to_string(o.violations) +
                                                                         " parity violations\n" + o.first));
  }
  return o;
}

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

// ---- attention backward: parity with the mp50 oracle for every ISA -------------------------------

template <class T>
AttentionCotangents<T> cast_cotangents(const AttentionCotangents<float>& d) {
  return {d.out.cast<T>(), d.lse.cast<T>(), d.p_null.cast<T>()};
}

// Float-exact cotangents of a case: dout N(0, 1), dLSE N(0, 1) and (softmax1) dp_null N(0, 1).
AttentionCotangents<float> make_cotangents(const Case& c, const AttentionOptions& opt, std::uint64_t seed) {
  auto rng = oasis::test::make_rng(seed);
  AttentionCotangents<float> d;
  d.out = oasis::test::randn<float>(opt.layout == AttentionLayout::bthd ? Shape{c.B, c.Tq, c.H, c.d_v}
                                                                         : Shape{c.B, c.H, c.Tq, c.d_v}, rng);
  d.lse = oasis::test::randn<float>({c.B, c.H, c.Tq}, rng);
  if (c.norm == RowNorm::softmax1) d.p_null = oasis::test::randn<float>({c.B, c.H, c.Tq}, rng);
  return d;
}

// The backward's oracle: long double (u = 2^-64, 10^12 times below float's; mp50 would make these
// cases take seconds each).
using HP = long double;

// One backward instance: inputs, cotangents, the float reference, the oracle (forward and backward).
struct BackwardCase {
  Inputs in;
  AttentionOptions opt;
  AttentionCotangents<float> d;
  AttentionGrads<float> ref;
  AttentionGrads<HP> mp;
  AttentionResult<HP> mp_fwd;
};

BackwardCase backward_case(const Case& c, std::uint64_t seed) {
  BackwardCase x;
  x.in = make_inputs(c, seed);
  x.opt = x.in.opt;
  x.opt.return_probs = c.probs;
  x.d = make_cotangents(c, x.opt, seed + 1);
  x.ref = token_attention_backward(x.in.q, x.in.k, x.in.v, x.d, x.opt);
  const Tensor<HP> q = x.in.q.cast<HP>(), k = x.in.k.cast<HP>(), v = x.in.v.cast<HP>();
  x.mp = token_attention_backward(q, k, v, cast_cotangents<HP>(x.d), x.opt);
  AttentionOptions fo = x.opt;
  fo.return_probs = true;  // the bounds need the oracle's probabilities
  x.mp_fwd = token_attention(q, k, v, fo);
  return x;
}

fast_parity::Outcome backward_parity(const BackwardCase& x, const AttentionGrads<float>& fast) {
  return fast_parity::check_attention_backward(x.in.q, x.in.k, x.in.v, x.d, x.opt, fast, x.ref, x.mp, x.mp_fwd);
}

class BackwardParity : public ::testing::TestWithParam<Case> {};

TEST_P(BackwardParity, FastWithinTwiceReferenceErrorPlusFloorForEveryIsa) {
  const Case& c = GetParam();
  const BackwardCase x = backward_case(c, 7201);
  const AttentionShape s{c.B, c.H, c.H_kv, c.Tq, c.Tk, c.d_h, c.d_v};
  const bool bthd = c.layout == AttentionLayout::bthd;
  IsaGuard guard;
  for (const std::string& isa : cpu_fast::available_isas()) {
    SCOPED_TRACE("isa " + isa);
    cpu_fast::set_isa(isa);
    const AttentionGrads<float> fast = cpu_fast::token_attention_backward(x.in.q, x.in.k, x.in.v, x.d, x.opt);
    ASSERT_EQ(fast.scores.empty(), !c.probs);
    ASSERT_EQ(fast.bias.empty(), x.opt.bias.empty());
    ASSERT_EQ(fast.null_logits.empty(), c.norm != RowNorm::softmax1);
    const fast_parity::Outcome o = backward_parity(x, fast);
    EXPECT_TRUE(o.ok) << c.name << ": " << o.violations << " violations\n" << o.first;
    RecordProperty("backward_worst_ratio_" + isa, std::to_string(o.worst_ratio));
    std::printf("[parity] backward %s %s: worst |err|/allowed %.3g\n", c.name, isa.c_str(), o.worst_ratio);
    // rows without a visible key: exactly zero gradient (dq, and dL/dz when returned)
    for (index_t b = 0; b < c.B; ++b)
      for (index_t h = 0; h < c.H; ++h)
        for (index_t t = 0; t < c.Tq; ++t) {
          if (!fully_masked(s, x.opt, b, h, t)) continue;
          for (index_t e = 0; e < c.d_h; ++e) ASSERT_EQ(bthd ? fast.q(b, t, h, e) : fast.q(b, h, t, e), 0.0f);
          if (c.probs)
            for (index_t j = 0; j < c.Tk; ++j) ASSERT_EQ(fast.scores(b, h, t, j), 0.0f);
        }
  }
  // the dispatcher runs the same code
  const AttentionGrads<float> a = token_attention_backward(Backend::cpu_fast, x.in.q, x.in.k, x.in.v, x.d, x.opt);
  const AttentionGrads<float> b = cpu_fast::token_attention_backward(x.in.q, x.in.k, x.in.v, x.d, x.opt);
  EXPECT_TRUE(oasis::test::exactly_equal("dq", a.q, b.q));
  EXPECT_TRUE(oasis::test::exactly_equal("dk", a.k, b.k));
  EXPECT_TRUE(oasis::test::exactly_equal("dv", a.v, b.v));
}

INSTANTIATE_TEST_SUITE_P(CpuFast, BackwardParity, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// The two-step API (forward with its row state, then the backward) gives the one-call results
// bitwise and reuses the gradients' storage; results do not depend on workspace reuse.
TEST(CpuFastBackward, TwoStepApiMatchesOneCallAndReusesBuffers) {
  const Case c = cases()[0];
  const Inputs in = make_inputs(c, 7202);
  const AttentionCotangents<float> d = make_cotangents(c, in.opt, 7203);
  const AttentionGrads<float> one = cpu_fast::token_attention_backward(in.q, in.k, in.v, d, in.opt);
  AttentionResult<float> fwd;
  cpu_fast::AttentionRowState state;
  cpu_fast::token_attention_into(in.q, in.k, in.v, in.opt, fwd, state);
  EXPECT_TRUE(oasis::test::exactly_equal("out", fwd.out, cpu_fast::token_attention(in.q, in.k, in.v, in.opt).out));
  AttentionGrads<float> g;
  cpu_fast::token_attention_backward_into(in.q, in.k, in.v, fwd, state, d, in.opt, g);
  const float* storage = g.q.data();
  cpu_fast::release_workspaces();
  cpu_fast::token_attention_backward_into(in.q, in.k, in.v, fwd, state, d, in.opt, g);
  EXPECT_EQ(g.q.data(), storage);
  for (const auto& [name, x, y] : {std::tuple{"dq", &g.q, &one.q}, std::tuple{"dk", &g.k, &one.k},
                                   std::tuple{"dv", &g.v, &one.v}, std::tuple{"dnull", &g.null_logits, &one.null_logits}})
    EXPECT_TRUE(oasis::test::exactly_equal(name, *x, *y));
  // a forward of another call is rejected, naming it
  AttentionResult<float> short_fwd = fwd;
  short_fwd.out = Tensor<float>({1, 1, 1, 1});
  try {
    cpu_fast::token_attention_backward_into(in.q, in.k, in.v, short_fwd, state, d, in.opt, g);
    ADD_FAILURE() << "a forward of the wrong shape was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.argument(), "forward") << e.what();
  }
  cpu_fast::AttentionRowState no_state;
  try {
    cpu_fast::token_attention_backward_into(in.q, in.k, in.v, fwd, no_state, d, in.opt, g);
    ADD_FAILURE() << "an empty row state was accepted";
  } catch (const invalid_argument& e) {
    EXPECT_EQ(e.argument(), "state") << e.what();
  }
}

// With more threads than kv heads the key tiles of a kv head are split into chunks with their own
// dq sums (one tile each here, some chunks of no work): the rule still holds.
TEST(CpuFastBackward, KeyTileChunksForManyThreads) {
  const std::vector<Case> cs = cases();
  for (const char* name : {"softmax1_multi_tile_d64", "window_band_skips_tiles"}) {
    SCOPED_TRACE(name);
    const Case c = *std::find_if(cs.begin(), cs.end(), [&](const Case& k) { return std::string(k.name) == name; });
    const BackwardCase x = backward_case(c, 7208);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(16);
    const AttentionGrads<float> g = cpu_fast::token_attention_backward(x.in.q, x.in.k, x.in.v, x.d, x.opt);
    omp_set_num_threads(saved);
    const fast_parity::Outcome o = backward_parity(x, g);
    EXPECT_TRUE(o.ok) << o.violations << " violations\n" << o.first;
  }
}

// Invalid cotangents and normalisers without a backward get the reference's error.
TEST(CpuFastBackward, InvalidInputSameErrorAsReference) {
  const Case c = cases()[0];
  const Inputs in = make_inputs(c, 7204);
  AttentionCotangents<float> d = make_cotangents(c, in.opt, 7205);
  auto message = [&](bool fast, const AttentionCotangents<float>& dd, const AttentionOptions& o) {
    try {
      if (fast) cpu_fast::token_attention_backward(in.q, in.k, in.v, dd, o);
      else token_attention_backward(in.q, in.k, in.v, dd, o);
    } catch (const invalid_argument& e) {
      return std::string(e.argument()) + ": " + e.what();
    }
    return std::string();
  };
  AttentionCotangents<float> bad = d;
  bad.out = Tensor<float>({1, 2, 3, 4});
  AttentionCotangents<float> nan = d;
  nan.lse[5] = std::numeric_limits<float>::quiet_NaN();
  AttentionOptions clipped = in.opt;
  clipped.normalizer = RowNorm::clipped_softmax1;
  for (const auto& [dd, o] : {std::pair{bad, in.opt}, std::pair{nan, in.opt}, std::pair{d, clipped}}) {
    const std::string ref = message(false, dd, o);
    EXPECT_FALSE(ref.empty());
    EXPECT_EQ(message(true, dd, o), ref);
  }
}

// The criterion has power over the backward: each of these mistakes, made by the kernel itself on
// altered inputs that are equivalent to it, is rejected by the parity rule.
//   null gradient dropped       ds = 0
//   D without the null          D computed from the probabilities renormalised without the null,
//                               <dO, O> / (1 - p_null): the same kernel with dLSE + D - D_wrong
//   D without p_null dP         D = <dO, O>: the same kernel with dLSE + p_null dP
//   GQA not summed              dk, dv of a kv head from its last query head only: the kernel with
//                               the other heads' cotangents zero
//   causal / window missing     the backward recomputes P without the mask the forward used
TEST(CpuFastBackwardCriterion, RejectsTheMutants) {
  Case c = cases()[0];  // softmax1, GQA 2 query heads per kv head, causal, padding, null logits
  const BackwardCase x = backward_case(c, 7206);
  ASSERT_TRUE(backward_parity(x, cpu_fast::token_attention_backward(x.in.q, x.in.k, x.in.v, x.d, x.opt)).ok);
  const AttentionResult<float> f = token_attention(x.in.q, x.in.k, x.in.v, x.opt);
  auto D_of = [&](index_t b, index_t h, index_t t) {  // <dO, O> and p_null dP in double
    double dot = 0;
    for (index_t e = 0; e < c.d_v; ++e) dot += static_cast<double>(x.d.out(b, h, t, e)) * f.out(b, h, t, e);
    return std::pair{dot, static_cast<double>(f.p_null(b, h, t)) * x.d.p_null(b, h, t)};
  };
  auto expect_rejected = [&](const char* what, const AttentionGrads<float>& g) {
    const fast_parity::Outcome o = backward_parity(x, g);
    EXPECT_FALSE(o.ok) << "the parity rule missed: " << what;
    std::printf("mutant %-28s rejected: %ld violations\n", what, static_cast<long>(o.violations));
  };
  {
    AttentionGrads<float> g = cpu_fast::token_attention_backward(x.in.q, x.in.k, x.in.v, x.d, x.opt);
    for (index_t h = 0; h < c.H; ++h) g.null_logits[h] = 0.0f;
    expect_rejected("null gradient dropped", g);
  }
  for (const bool renormalised : {true, false}) {
    AttentionCotangents<float> d = x.d;
    for (index_t b = 0; b < c.B; ++b)
      for (index_t h = 0; h < c.H; ++h)
        for (index_t t = 0; t < c.Tq; ++t) {
          const auto [dot, pdp] = D_of(b, h, t);
          const double pn = f.p_null(b, h, t);
          const double wrong = renormalised ? (pn < 1 ? (dot + pdp) / (1 - pn) : dot + pdp) : dot;
          d.lse(b, h, t) = static_cast<float>(d.lse(b, h, t) + (dot + pdp) - wrong);
        }
    expect_rejected(renormalised ? "D without the null" : "D without p_null dP",
                    cpu_fast::token_attention_backward(x.in.q, x.in.k, x.in.v, d, x.opt));
  }
  {
    const index_t group = c.H / c.H_kv;
    AttentionCotangents<float> d = x.d;
    for (index_t b = 0; b < c.B; ++b)
      for (index_t h = 0; h < c.H; ++h) {
        if (h % group == group - 1) continue;
        for (index_t t = 0; t < c.Tq; ++t) {
          for (index_t e = 0; e < c.d_v; ++e) d.out(b, h, t, e) = 0.0f;
          d.lse(b, h, t) = d.p_null(b, h, t) = 0.0f;
        }
      }
    const AttentionGrads<float> last = cpu_fast::token_attention_backward(x.in.q, x.in.k, x.in.v, d, x.opt);
    AttentionGrads<float> g = cpu_fast::token_attention_backward(x.in.q, x.in.k, x.in.v, x.d, x.opt);
    g.k = last.k;
    g.v = last.v;
    expect_rejected("GQA not summed", g);
  }
  {
    AttentionResult<float> fwd;
    cpu_fast::AttentionRowState state;
    cpu_fast::token_attention_into(x.in.q, x.in.k, x.in.v, x.opt, fwd, state);
    AttentionOptions unmasked = x.opt;
    unmasked.causal = false;
    AttentionGrads<float> g;
    cpu_fast::token_attention_backward_into(x.in.q, x.in.k, x.in.v, fwd, state, x.d, unmasked, g);
    expect_rejected("causal mask missing", g);
  }
  {
    const std::vector<Case> cs = cases();
    const Case w = *std::find_if(cs.begin(), cs.end(), [](const Case& k) { return k.window == 70; });  // 300 keys
    const BackwardCase y = backward_case(w, 7207);
    AttentionResult<float> fwd;
    cpu_fast::AttentionRowState state;
    cpu_fast::token_attention_into(y.in.q, y.in.k, y.in.v, y.opt, fwd, state);
    AttentionOptions unmasked = y.opt;
    unmasked.window = 0;
    AttentionGrads<float> g;
    cpu_fast::token_attention_backward_into(y.in.q, y.in.k, y.in.v, fwd, state, y.d, unmasked, g);
    const fast_parity::Outcome o = backward_parity(y, g);
    EXPECT_FALSE(o.ok) << "the parity rule missed: window missing";
    std::printf("mutant %-28s rejected: %ld violations\n", "window missing", static_cast<long>(o.violations));
  }
}

// ---- scores that overflow float: rejected like the reference (argument "scores") -------------
//
// q.k * scale overflowing float32 to +inf, or to NaN (inf - inf in a non-fused sum; a fused
// multiply-add sum of the same products stays +inf), must throw as normalize_row does in the
// reference; an overflow at a masked key (padding or causally hidden) is no score of the row and
// must change nothing; a visible -inf score is a masked key (weight 0), as in the reference.
// Inputs: B = 2, H = 2 over H_kv = 1 (GQA), Tq = 70 (two query blocks), Tk = 150 (three key
// tiles), d_h = 8; dimensions 0 and 1 of every q and k row are zero, so that only the planted
// (query, key) pairs reach the 1e20 * 1e20 scale and every other score is bitwise unchanged.

struct OverflowInputs {
  Tensor<float> q, k, v;
};

OverflowInputs overflow_inputs(std::uint64_t seed) {
  auto rng = oasis::test::make_rng(seed);
  OverflowInputs in;
  in.q = oasis::test::randn<float>({2, 2, 70, 8}, rng);
  in.k = oasis::test::randn<float>({2, 1, 150, 8}, rng);
  in.v = oasis::test::randn<float>({2, 1, 150, 5}, rng);
  for (index_t b = 0; b < 2; ++b)
    for (index_t c = 0; c < 2; ++c) {
      for (index_t h = 0; h < 2; ++h)
        for (index_t t = 0; t < 70; ++t) in.q(b, h, t, c) = 0.0f;
      for (index_t j = 0; j < 150; ++j) in.k(b, 0, j, c) = 0.0f;
    }
  return in;
}

// Query (b, h, t) and key j get (q0, q1) and (k0, k1) in dimensions 0 and 1.
void plant(OverflowInputs& in, index_t b, index_t h, index_t t, index_t j, float q0, float q1, float k0, float k1) {
  in.q(b, h, t, 0) = q0;
  in.q(b, h, t, 1) = q1;
  in.k(b, 0, j, 0) = k0;
  in.k(b, 0, j, 1) = k1;
}

struct OverflowMode {
  RowNorm norm;
  bool causal;
};

std::vector<OverflowMode> overflow_modes() {
  return {{RowNorm::softmax1, false}, {RowNorm::softmax1, true}, {RowNorm::softmax, false}, {RowNorm::softmax, true}};
}

AttentionOptions options_of(const OverflowMode& m) {
  AttentionOptions opt;
  opt.normalizer = m.norm;
  opt.causal = m.causal;
  return opt;
}

std::string mode_name(const OverflowMode& m) {
  return std::string(to_string(m.norm)) + (m.causal ? " causal" : " full");
}

// Every ISA variant and the dispatcher throw "scores" (with and without probabilities), and so
// does the reference, for the same inputs.
void expect_scores_rejected(const OverflowInputs& in, const AttentionOptions& base, const std::string& where) {
  for (bool probs : {false, true}) {
    AttentionOptions opt = base;
    opt.return_probs = probs;
    SCOPED_TRACE(where + (probs ? ", probs" : ""));
    const Thrown ref = thrown_by([&] { token_attention(in.q, in.k, in.v, opt); });
    EXPECT_TRUE(ref.threw) << "the reference accepted an overflowed score";
    EXPECT_EQ(ref.argument, "scores") << ref.what;
    IsaGuard guard;
    for (const std::string& isa : cpu_fast::available_isas()) {
      cpu_fast::set_isa(isa);
      const Thrown f = thrown_by([&] { cpu_fast::token_attention(in.q, in.k, in.v, opt); });
      EXPECT_TRUE(f.threw) << "isa " << isa << ": cpu_fast accepted an overflowed score";
      EXPECT_EQ(f.argument, "scores") << "isa " << isa << ": " << f.what;
      EXPECT_NE(f.what.find("batch 1, head 0, query 60"), std::string::npos) << "isa " << isa << ": " << f.what;
      AttentionResult<float> r;  // the *_into form throws as well
      EXPECT_EQ(thrown_by([&] { cpu_fast::token_attention_into(in.q, in.k, in.v, opt, r); }).argument, "scores");
    }
    const Thrown d = thrown_by([&] { token_attention(Backend::cpu_fast, in.q, in.k, in.v, opt); });
    EXPECT_EQ(d.argument, "scores") << "dispatcher: " << d.what;
  }
}

// +inf: 1e20 * 1e20 overflows in the first product, whatever the summation. Two rows overflow,
// (b, h, t) = (1, 1, 3) and (1, 0, 60); the error names the first in the reference's order.
TEST(CpuFastOverflow, PosInfScoreThrowsLikeReference) {
  for (const OverflowMode& m : overflow_modes()) {
    OverflowInputs in = overflow_inputs(7101);
    plant(in, 1, 1, 3, 70, 1e20f, 0.0f, 1e20f, 0.0f);  // key 70: visible to every query, even causal
    plant(in, 1, 0, 60, 70, 1e20f, 0.0f, 1e20f, 0.0f);
    AttentionOptions opt = options_of(m);
    if (m.norm == RowNorm::softmax1) opt.null_logits = {0.5, -1.0};
    expect_scores_rejected(in, opt, mode_name(m));
  }
}

// (1e20, 1e20) . (1e20, -1e20): the reference sums +inf + -inf = NaN; a fused multiply-add sum
// gives fma(1e20, -1e20, +inf) = +inf. Both are rejected.
TEST(CpuFastOverflow, InfMinusInfScoreThrowsLikeReference) {
  for (const OverflowMode& m : overflow_modes()) {
    OverflowInputs in = overflow_inputs(7102);
    plant(in, 1, 0, 60, 70, 1e20f, 1e20f, 1e20f, -1e20f);
    AttentionOptions opt = options_of(m);
    expect_scores_rejected(in, opt, mode_name(m));
  }
}

// Query (1, 0, 60) sees keys 0..33 (key_lengths[1] = 34): key 0 overflows ((1e20, 1e20) .
// (1e20, -1e20): NaN in a non-fused sum, +inf fused) and every other visible score is -inf, so
// plain softmax has no finite score in the row (the online maximum stays -inf and a NaN can be
// dropped by the lane maxima); the row must still be rejected, not returned as fully masked.
TEST(CpuFastOverflow, BadScoreAmongNegInfScoresThrowsLikeReference) {
  for (const OverflowMode& m : overflow_modes()) {
    OverflowInputs in = overflow_inputs(7106);
    plant(in, 1, 0, 60, 0, 1e20f, 1e20f, 1e20f, -1e20f);
    for (index_t j = 1; j < 150; ++j) in.k(1, 0, j, 0) = -1e20f;  // q(1, 0, 60) . k_j = -inf
    AttentionOptions opt = options_of(m);
    opt.key_lengths = {150, 34};
    expect_scores_rejected(in, opt, mode_name(m));
  }
}

// An overflow the row does not see changes nothing: on every ISA the fast result is bitwise that
// of the inputs without it (`clean`) and meets the parity criterion against the reference `ref`
// (computed on `in`, where it must not throw) and the mp50 oracle.
void expect_overflow_ignored(const OverflowInputs& in, const OverflowInputs& clean, const AttentionOptions& opt,
                             const AttentionResult<float>& ref) {
  const AttentionResult<R> mp = token_attention(clean.q.cast<R>(), clean.k.cast<R>(), clean.v.cast<R>(), opt);
  IsaGuard guard;
  for (const std::string& isa : cpu_fast::available_isas()) {
    SCOPED_TRACE("isa " + isa);
    cpu_fast::set_isa(isa);
    AttentionResult<float> fast;
    ASSERT_NO_THROW(fast = cpu_fast::token_attention(in.q, in.k, in.v, opt));
    const AttentionResult<float> fast_clean = cpu_fast::token_attention(clean.q, clean.k, clean.v, opt);
    EXPECT_TRUE(oasis::test::exactly_equal("out", fast.out, fast_clean.out));
    EXPECT_TRUE(oasis::test::exactly_equal("lse", fast.lse, fast_clean.lse));
    EXPECT_TRUE(oasis::test::exactly_equal("p_null", fast.p_null, fast_clean.p_null));
    EXPECT_TRUE(oasis::test::exactly_equal("probs", fast.probs, fast_clean.probs));
    expect_fast_parity(isa, in.q, in.k, in.v, opt, fast, ref, mp);
  }
}

// An overflowing (q, k) pair at a key the row does not see: beyond the batch element's key length,
// or causally hidden (in a tile the row partly sees, so the overflow sits in a masked lane).
// Nothing is thrown and the result is bitwise that of the same inputs without the overflow (only
// masked scores differ), which meets the parity criterion against the mp50 oracle.
TEST(CpuFastOverflow, OverflowAtMaskedKeyIsIgnoredLikeReference) {
  for (const OverflowMode& m : overflow_modes()) {
    SCOPED_TRACE(mode_name(m));
    const OverflowInputs clean = overflow_inputs(7103);
    OverflowInputs in = clean;
    AttentionOptions opt = options_of(m);
    opt.key_lengths = {150, 60};
    opt.return_probs = true;
    plant(in, 1, 1, 40, 70, 1e20f, 1e20f, 1e20f, -1e20f);  // key 70 >= key_lengths[1] = 60 (NaN or +inf)
    plant(in, 1, 0, 65, 100, 1e20f, 0.0f, 1e20f, 0.0f);    // key 100 >= 60 as well (+inf)
    if (m.causal) plant(in, 0, 1, 3, 100, 1e20f, 0.0f, 1e20f, 0.0f);  // 100 > 3 + (150 - 70): hidden
    const AttentionResult<float> ref = token_attention(in.q, in.k, in.v, opt);  // no throw
    const AttentionResult<float> ref_clean = token_attention(clean.q, clean.k, clean.v, opt);
    EXPECT_TRUE(oasis::test::exactly_equal("ref out", ref.out, ref_clean.out));
    expect_overflow_ignored(in, clean, opt, ref);
  }
}

// Overflowing (q, k) pairs at keys outside a sliding window of 10 (Tq = 70, Tk = 150: query t sees
// keys t + 71 .. t + 80): key 130 for query 65 sits in a tile the row partly sees (a masked lane),
// key 20 for query 3 in a tile outside the band of its query block (skipped). Nothing is thrown
// and the result is bitwise that of the inputs without the overflow.
TEST(CpuFastOverflow, OverflowOutsideTheWindowIsIgnoredLikeReference) {
  for (const OverflowMode& m : overflow_modes()) {
    SCOPED_TRACE(mode_name(m));
    const OverflowInputs clean = overflow_inputs(7107);
    OverflowInputs in = clean;
    AttentionOptions opt = options_of(m);
    opt.window = 10;
    opt.return_probs = true;
    plant(in, 1, 0, 65, 130, 1e20f, 1e20f, 1e20f, -1e20f);
    plant(in, 0, 1, 3, 20, 1e20f, 0.0f, 1e20f, 0.0f);
    const AttentionResult<float> ref = token_attention(in.q, in.k, in.v, opt);  // no throw
    expect_overflow_ignored(in, clean, opt, ref);
  }
}

// A -inf bias does not hide an overflowed score: the reference forms scale * q.k + b = +inf - inf
// = NaN and rejects the row, and so must every variant.
TEST(CpuFastOverflow, OverflowUnderAMaskingBiasThrowsLikeReference) {
  for (const OverflowMode& m : overflow_modes()) {
    OverflowInputs in = overflow_inputs(7108);
    plant(in, 1, 0, 60, 70, 1e20f, 0.0f, 1e20f, 0.0f);
    AttentionOptions opt = options_of(m);
    opt.bias = Tensor<double>({2, 2, 70, 150});
    opt.bias(1, 0, 60, 70) = -std::numeric_limits<double>::infinity();
    expect_scores_rejected(in, opt, mode_name(m));
  }
}

// (1e20) . (-1e20) = -inf at a visible key: a masked key for the reference's normalize_row
// (weight 0), so no throw and the same result as the reference, key weight exactly 0. In the
// causal case query 0 of head 1 sees keys 0..80 and gets -inf at key 75 (second tile).
TEST(CpuFastOverflow, NegInfScoreIsAMaskedKeyLikeReference) {
  for (const OverflowMode& m : overflow_modes()) {
    SCOPED_TRACE(mode_name(m));
    OverflowInputs in = overflow_inputs(7104);
    plant(in, 0, 1, 0, 75, 1e20f, 0.0f, -1e20f, 0.0f);
    plant(in, 1, 0, 69, 3, 1e20f, 1e20f, -1e20f, -1e20f);  // first tile; -inf in every summation
    AttentionOptions opt = options_of(m);
    opt.return_probs = true;
    const AttentionResult<float> ref = token_attention(in.q, in.k, in.v, opt);
    ASSERT_EQ(ref.probs(0, 1, 0, 75), 0.0f);
    const AttentionResult<R> mp = token_attention(in.q.cast<R>(), in.k.cast<R>(), in.v.cast<R>(), opt);
    IsaGuard guard;
    for (const std::string& isa : cpu_fast::available_isas()) {
      SCOPED_TRACE("isa " + isa);
      cpu_fast::set_isa(isa);
      AttentionResult<float> fast;
      ASSERT_NO_THROW(fast = cpu_fast::token_attention(in.q, in.k, in.v, opt));
      EXPECT_EQ(fast.probs(0, 1, 0, 75), 0.0f);
      EXPECT_EQ(fast.probs(1, 0, 69, 3), 0.0f);
      expect_fast_parity(isa, in.q, in.k, in.v, opt, fast, ref, mp);
    }
  }
}

// Plain softmax, causal with Tq = Tk: query 0 sees key 0 only, and its score is -inf. The
// reference treats the row as fully masked: the documented zero (out 0, LSE -inf, p_null 0) under
// MaskedRow::zero, and the fully-masked-row error under MaskedRow::error; cpu_fast the same (an
// online softmax whose running maximum stays -inf must not form -inf - (-inf) = NaN).
TEST(CpuFastOverflow, EveryVisibleScoreNegInfIsAFullyMaskedRow) {
  auto rng = oasis::test::make_rng(7105);
  Tensor<float> q = oasis::test::randn<float>({1, 2, 100, 8}, rng);
  Tensor<float> k = oasis::test::randn<float>({1, 2, 100, 8}, rng);
  const Tensor<float> v = oasis::test::randn<float>({1, 2, 100, 5}, rng);
  for (index_t c = 0; c < 8; ++c) {  // q.k_0 = -inf for query 0; 0 in dimension 0 elsewhere
    q(0, 1, 0, c) = 1e20f;
    k(0, 1, 0, c) = c == 0 ? -1e20f : 0.0f;
  }
  for (index_t t = 1; t < 100; ++t) q(0, 1, t, 0) = 0.0f;  // other rows: score 0 at key 0
  AttentionOptions opt;
  opt.normalizer = RowNorm::softmax;
  opt.causal = true;
  opt.return_probs = true;
  const AttentionResult<float> ref = token_attention(q, k, v, opt);
  ASSERT_TRUE(std::isinf(ref.lse(0, 1, 0)) && ref.lse(0, 1, 0) < 0);
  AttentionOptions err = opt;
  err.masked_row = MaskedRow::error;
  const Thrown ref_err = thrown_by([&] { token_attention(q, k, v, err); });
  ASSERT_TRUE(ref_err.threw);
  EXPECT_EQ(ref_err.argument, "scores");
  IsaGuard guard;
  for (const std::string& isa : cpu_fast::available_isas()) {
    SCOPED_TRACE("isa " + isa);
    cpu_fast::set_isa(isa);
    const AttentionResult<float> fast = cpu_fast::token_attention(q, k, v, opt);
    for (index_t e = 0; e < 5; ++e) EXPECT_EQ(fast.out(0, 1, 0, e), 0.0f);
    EXPECT_TRUE(std::isinf(fast.lse(0, 1, 0)) && fast.lse(0, 1, 0) < 0) << fast.lse(0, 1, 0);
    EXPECT_EQ(fast.p_null(0, 1, 0), 0.0f);
    EXPECT_EQ(fast.probs(0, 1, 0, 0), 0.0f);
    for (index_t t = 1; t < 100; t += 7) {  // the other rows of the head are ordinary
      EXPECT_NEAR(fast.lse(0, 1, t), ref.lse(0, 1, t), 1e-4f) << "t = " << t;
      EXPECT_NEAR(fast.out(0, 1, t, 0), ref.out(0, 1, t, 0), 1e-4f) << "t = " << t;
    }
    const Thrown f = thrown_by([&] { cpu_fast::token_attention(q, k, v, err); });
    EXPECT_EQ(f.argument, "scores");
    EXPECT_EQ(f.what, ref_err.what);
  }
}

// A score that overflows float is rejected by the backward as by the forward and the reference.
TEST(CpuFastBackward, OverflowedScoreThrowsLikeReference) {
  OverflowInputs in = overflow_inputs(7209);
  plant(in, 1, 0, 60, 70, 1e20f, 0.0f, 1e20f, 0.0f);
  AttentionOptions opt;
  opt.causal = true;
  auto rng = oasis::test::make_rng(7210);
  const AttentionCotangents<float> d{oasis::test::randn<float>({2, 2, 70, 5}, rng), {}, {}};
  const Thrown ref = thrown_by([&] { token_attention_backward(in.q, in.k, in.v, d, opt); });
  EXPECT_EQ(ref.argument, "scores") << ref.what;
  const Thrown fast = thrown_by([&] { cpu_fast::token_attention_backward(in.q, in.k, in.v, d, opt); });
  EXPECT_EQ(fast.argument, "scores") << fast.what;
}

// vector_exp: relative error against double exp on a strided sweep of every float with a
// normal result (1 of every 101 consecutive bit patterns, ~21 M points) and exact special values.
// The subnormal range has an absolute error below the smallest subnormal.
TEST(CpuFastExp, WithinDocumentedErrorForEveryIsa) {
  // The error model's exp (docs/tolerances.md, "Fused kernels") is within 2 u relative;
  // docs/benchmarks.md: exhaustively measured maximum 7.71e-8 (FMA variants) and 9.90e-8 (baseline).
  constexpr double kMaxRel = 0x1p-23;
  IsaGuard guard;
  std::vector<float> x, y;
  auto bits_of = [](float f) { std::uint32_t b; std::memcpy(&b, &f, 4); return b; };
  auto from_bits = [](std::uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; };
  for (std::uint32_t b = 0; b <= bits_of(88.72f); b += 101) x.push_back(from_bits(b));
  for (std::uint32_t b = bits_of(-0.0f); b <= bits_of(-87.33f); b += 101) x.push_back(from_bits(b));
  y.resize(x.size());
  for (const std::string& isa : cpu_fast::available_isas()) {
    SCOPED_TRACE("isa " + isa);
    cpu_fast::set_isa(isa);
    cpu_fast::vector_exp(x.data(), y.data(), static_cast<index_t>(x.size()));
    double worst = 0, at = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double e = std::exp(static_cast<double>(x[i]));
      const double rel = std::abs(static_cast<double>(y[i]) - e) / e;
      if (rel > worst) { worst = rel; at = x[i]; }
    }
    EXPECT_LE(worst, kMaxRel) << "at x = " << at;
    // subnormal results: absolute error at most one subnormal step
    for (float v = -87.4f; v > -104.5f; v -= 0.01f) {
      float out;
      cpu_fast::vector_exp(&v, &out, 1);
      ASSERT_LE(std::abs(static_cast<double>(out) - std::exp(static_cast<double>(v))),
                static_cast<double>(std::numeric_limits<float>::denorm_min())) << "x = " << v;
    }
    {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3e", worst);
      RecordProperty("exp_max_rel_" + isa, buf);
    }
    const float special[] = {0.0f, -0.0f, -std::numeric_limits<float>::infinity(), -105.0f, 89.0f,
                             std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
    float out[7];
    cpu_fast::vector_exp(special, out, 7);
    EXPECT_TRUE(std::isnan(out[6])) << out[6];  // the attention kernel's overflow check relies on it
    EXPECT_EQ(out[0], 1.0f);
    EXPECT_EQ(out[1], 1.0f);
    EXPECT_EQ(out[2], 0.0f);
    EXPECT_EQ(out[3], 0.0f);
    EXPECT_TRUE(std::isinf(out[4]) && out[4] > 0);
    EXPECT_TRUE(std::isinf(out[5]) && out[5] > 0);
  }
}

// ---- depth routing: bitwise the reference ----------------------------------------------------

struct RouteCase {
  const char* name;
  index_t n, N, d;
  std::vector<SourceKind> kinds;
  DepthOptions opt;
};

DepthOptions authors() {
  DepthOptions o;
  o.coupling_options = CouplingOptions::authors_code();
  o.beta = 30.0;  // clamped to 10
  return o;
}
DepthOptions plain_softmax() {
  DepthOptions o;
  o.normalizer = RowNorm::softmax;
  o.coupling = false;
  return o;
}
DepthOptions strong_v2() {
  DepthOptions o;
  o.beta = 2.0;
  o.coupling_options.headless = HeadlessRule::no_evidence;
  return o;
}

std::vector<RouteCase> route_cases() {
  using K = SourceKind;
  return {
      {"oasis_default", 5, 33, 300, {K::initial, K::attention, K::headless, K::attention, K::headless}, {}},
      {"authors_clamps", 4, 17, 129, {K::initial, K::attention, K::headless, K::attention}, authors()},
      {"vanilla_softmax", 6, 9, 37, {K::initial, K::attention, K::headless, K::attention, K::headless, K::attention}, plain_softmax()},
      {"single_source", 1, 11, 16, {K::initial}, {}},
      {"no_evidence_rule", 7, 20, 2048, {K::initial, K::attention, K::headless, K::attention, K::headless, K::attention, K::headless}, strong_v2()},
      // two whole passes of four and of two sources, then a pass of one or of two (the tails)
      {"ten_sources", 10, 13, 1100, {K::initial, K::attention, K::headless, K::attention, K::headless, K::attention, K::headless, K::attention, K::headless, K::attention}, {}},
  };
}

class RouteParity : public ::testing::TestWithParam<RouteCase> {};

TEST_P(RouteParity, BitwiseEqualToReferenceForEveryIsa) {
  const RouteCase& c = GetParam();
  auto rng = oasis::test::make_rng(8001);
  const Tensor<float> src = oasis::test::randn<float>({c.n, c.N, c.d}, rng, 3.0);
  const Tensor<float> g = oasis::test::randn<float>({c.n, c.N}, rng, 20.0);  // reaches the +-50 clamp
  const Tensor<float> psi = oasis::test::uniform<float>({c.n, c.N}, rng, 0.0, 1.0);
  const DepthRoute<float> ref = attn_res_route(src, g, psi, c.kinds, c.opt);
  for_each_isa_and_streaming([&] {
    const DepthRoute<float> f = attn_res_route(Backend::cpu_fast, src, g, psi, c.kinds, c.opt);
    EXPECT_TRUE(oasis::test::exactly_equal("h", f.h, ref.h));
    EXPECT_TRUE(oasis::test::exactly_equal("alpha", f.alpha, ref.alpha));
    EXPECT_TRUE(oasis::test::exactly_equal("alpha_null", f.alpha_null, ref.alpha_null));
    EXPECT_TRUE(oasis::test::exactly_equal("g", f.g, ref.g));
    EXPECT_TRUE(oasis::test::exactly_equal("dpsi", f.dpsi, ref.dpsi));
  });
}

INSTANTIATE_TEST_SUITE_P(CpuFast, RouteParity, ::testing::ValuesIn(route_cases()),
                         [](const ::testing::TestParamInfo<RouteCase>& i) { return std::string(i.param.name); });

std::string route_error(bool fast, const Tensor<float>& src, const Tensor<float>& g, const Tensor<float>& psi,
                        const std::vector<SourceKind>& kinds) {
  try {
    if (fast) cpu_fast::attn_res_route(src, g, psi, kinds, {});
    else attn_res_route(src, g, psi, kinds, {});
  } catch (const invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(CpuFastRoute, InvalidInputSameErrorAsReference) {
  using K = SourceKind;
  const std::vector<SourceKind> kinds{K::initial, K::attention, K::attention};
  auto rng = oasis::test::make_rng(8002);
  Tensor<float> src = oasis::test::randn<float>({3, 8, 40}, rng);
  Tensor<float> g = oasis::test::randn<float>({3, 8}, rng);
  Tensor<float> psi = oasis::test::uniform<float>({3, 8}, rng, 0.0, 1.0);
  Tensor<float> bad_psi = psi;
  bad_psi(2, 5) = 1.5f;  // not a probability
  Tensor<float> bad_src = src;
  bad_src(1, 6, 39) = std::numeric_limits<float>::infinity();
  Tensor<float> bad_g = g;
  bad_g(0, 3) = std::numeric_limits<float>::quiet_NaN();
  const std::pair<const char*, std::array<const Tensor<float>*, 3>> inputs[] = {
      {"psi", {&src, &g, &bad_psi}}, {"sources", {&bad_src, &g, &psi}},
      {"sources over psi", {&bad_src, &g, &bad_psi}}, {"g_old", {&src, &bad_g, &psi}}};
  for (const auto& [what, t] : inputs) {
    const std::string ref = route_error(false, *t[0], *t[1], *t[2], kinds);
    EXPECT_FALSE(ref.empty()) << what;
    EXPECT_EQ(route_error(true, *t[0], *t[1], *t[2], kinds), ref) << what;
  }
  EXPECT_EQ(route_error(true, src, g, psi, {K::initial}), route_error(false, src, g, psi, {K::initial}));
}

// A non-finite element in any source (every position within a pass of two or of four, and in the
// tail passes) and near either end of a row (d = 40: with 64-byte vectors columns 3 and 37 fall in
// the one-at-a-time head or tail, or in a vector, depending on the row's alignment; with narrower
// ones both fall in vectors) is reported as the reference reports it, with every ISA and streaming.
TEST(CpuFastRoute, NonFiniteSourceAnywhereSameErrorAsReference) {
  using K = SourceKind;
  const std::vector<SourceKind> kinds{K::initial, K::attention, K::headless, K::attention, K::headless, K::attention, K::headless};
  const index_t n = 7, N = 6, d = 40;
  auto rng = oasis::test::make_rng(8003);
  const Tensor<float> src = oasis::test::randn<float>({n, N, d}, rng);
  const Tensor<float> g = oasis::test::randn<float>({n, N}, rng);
  const Tensor<float> psi = oasis::test::uniform<float>({n, N}, rng, 0.0, 1.0);
  for_each_isa_and_streaming([&] {
    for (index_t i = 0; i < n; ++i)
      for (const index_t c : {index_t{3}, index_t{37}})
        for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
          SCOPED_TRACE("source " + std::to_string(i) + ", column " + std::to_string(c) + ", value " +
                       std::to_string(bad));
          Tensor<float> s = src;
          s(i, N - 1, c) = bad;
          const std::string ref = route_error(false, s, g, psi, kinds);
          ASSERT_FALSE(ref.empty());
          EXPECT_EQ(route_error(true, s, g, psi, kinds), ref);
        }
  });
}

// Finite sources whose weighted sum overflows (every source at the largest float; the rounded
// weights of a plain softmax may sum to just over 1) are not an error: the reference returns the
// infinite h, and so must the fast path, which reads finiteness off its output and tells this case
// from a non-finite source by checking the sources (Kernels::mix).
TEST(CpuFastRoute, FiniteSourcesWhoseSumOverflowsAreNotAnError) {
  using K = SourceKind;
  const index_t n = 3, N = 64, d = 40;
  const std::vector<SourceKind> kinds{K::initial, K::attention, K::headless};
  Tensor<float> src({n, N, d});
  for (index_t i = 0; i < src.size(); ++i) src.data()[i] = std::numeric_limits<float>::max();
  auto rng = oasis::test::make_rng(8004);
  const Tensor<float> g = oasis::test::randn<float>({n, N}, rng);
  const Tensor<float> psi = oasis::test::uniform<float>({n, N}, rng, 0.0, 1.0);
  const DepthRoute<float> ref = attn_res_route(src, g, psi, kinds, plain_softmax());
  index_t overflowed = 0;
  for (index_t t = 0; t < N; ++t) overflowed += std::isinf(ref.h(t, 0)) ? 1 : 0;
  ASSERT_GT(overflowed, 0) << "seed 8004 no longer makes an overflowing token; choose another";
  ASSERT_LT(overflowed, N);
  for_each_isa_and_streaming([&] {
    DepthRoute<float> f;
    ASSERT_NO_THROW(f = attn_res_route(Backend::cpu_fast, src, g, psi, kinds, plain_softmax()));
    EXPECT_TRUE(oasis::test::exactly_equal("h", f.h, ref.h));
    EXPECT_TRUE(oasis::test::exactly_equal("alpha", f.alpha, ref.alpha));
  });
}

TEST(CpuFastIsa, UnknownVariantIsRejected) {
  EXPECT_THROW(cpu_fast::set_isa("avx9000"), invalid_argument);
  const std::vector<std::string> isas = cpu_fast::available_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.back(), "generic");
  if (!std::getenv("OASIS_CPU_FAST_ISA")) EXPECT_EQ(std::string(cpu_fast::isa()), isas.front());  // widest by default
}

TEST(CpuFastRouteStreams, UnknownStreamingIsRejectedAndTheDefaultFollowsTheVendor) {
  const Thrown t = thrown_by([] { cpu_fast::set_route_streams("octets-l3"); });
  EXPECT_TRUE(t.threw);
  EXPECT_EQ(t.argument, "route_streams");
  EXPECT_NE(t.what.find("pairs-l2"), std::string::npos) << t.what;  // the message lists the choices
  const std::vector<std::string> all = cpu_fast::available_route_streams();
  EXPECT_EQ(all, (std::vector<std::string>{"pairs-l2", "quads-l1"}));
  if (!std::getenv("OASIS_CPU_FAST_ROUTE_STREAMS")) {
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line, vendor;
    while (vendor.empty() && std::getline(cpuinfo, line))
      if (line.rfind("vendor_id", 0) == 0) vendor = line.substr(line.find(':') + 1);
    const bool amd = vendor.find("AuthenticAMD") != std::string::npos;
    EXPECT_EQ(std::string(cpu_fast::route_streams()), amd ? "quads-l1" : "pairs-l2") << "vendor" << vendor;
  }
}

}  // namespace
