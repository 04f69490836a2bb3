// tests/cpu_fast/cpu_fast_test.hpp — what the fast path's tests share: guards that restore the
// ISA variant and the mixing's streaming, the thrown-error capture, the attention cases and their
// inputs, and the parity expectation (parity_bound.hpp) that writes a replay on failure.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "oasis/backends/backend.hpp"
#include "oasis/backends/cpu_fast.hpp"
#include "oasis/grad/instances.hpp"
#include "oasis/oasis.hpp"
#include "oasis_test.hpp"
#include "parity_bound.hpp"
#include "replay.hpp"

namespace oasis::cpu_fast_test {

using R = mp50;

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

inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

inline Case with(Case c, index_t window, int bias_rank, AttentionLayout layout) {
  c.window = window;
  c.bias_rank = bias_rank;
  c.layout = layout;
  return c;
}

inline Case scaled(Case c, double v_sd, double null_mean) {
  c.v_sd = v_sd;
  c.null_mean = null_mean;
  return c;
}

inline std::vector<Case> cases() {
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
      // The kernels' weights e^{z - M} carried times 2^32 (src/cpu_fast/kernels/common.inc,
      // kWeightScale).
      // Sinks at ~95 over logits ~N(0, 1): every key's weight is in [e^-104, 2^-126), subnormal
      // unscaled; out, the probabilities and the gradients of k and v are subnormal-small and must
      // keep their digits (a kernel that flushes such weights to zero fails here).
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

inline Inputs make_inputs(const Case& c, std::uint64_t seed) {
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
inline bool fully_masked(const AttentionShape& s, const AttentionOptions& opt, index_t b, index_t h, index_t t) {
  const KeyRange kr = visible_range(s, opt, b, t);
  for (index_t j = kr.begin; j < kr.end; ++j)
    if (attention_bias(opt, b, h, t, j) != -std::numeric_limits<double>::infinity()) return false;
  return true;
}

// The parity rule over every output of an attention call (parity_bound.hpp) as an expectation;
// a failure is also written as a replay (tests/support/replay.hpp) named after the test and ISA.
inline fast_parity::Outcome expect_fast_parity(const std::string& isa, const Tensor<float>& q,
                                               const Tensor<float>& k, const Tensor<float>& v,
                                               const AttentionOptions& opt, const AttentionResult<float>& fast,
                                               const AttentionResult<float>& ref, const AttentionResult<R>& mp) {
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

}  // namespace oasis::cpu_fast_test
