// tests/parity/parity_rule.hpp — the kernel parity rule (bounds::check_parity; derivation in
// docs/tolerances.md, "Fused kernels") as a GoogleTest assertion, the backends a parity program
// runs, and the attention instances of the parity tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "oasis/ops/attention.hpp"
#include "oasis/backends/backend.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/core/tensor.hpp"
#include "oasis_random.hpp"

namespace oasis::test {

/// |a - b| with equal infinities at distance 0 (NaN propagates and fails a comparison).
inline double abs_err(double a, double b) {
  if (std::isinf(a) && std::isinf(b) && (a > 0) == (b > 0)) return 0.0;
  return std::abs(a - b);
}

/// The names of the backends a parity program runs: every registered backend
/// (oasis/backends/registry.hpp), available or not, or in a program built with
/// OASIS_PARITY_BACKENDS="a,b" only those (the emulator's programs: "cuda", the CPU backends
/// running in test_parity). Called from the test generators, after every registration.
inline std::vector<std::string> parity_backends() {
  std::vector<std::string> out;
  for (const BackendOps* b : registered_backends()) {
    const std::string name(b->name);
#if defined(OASIS_PARITY_BACKENDS)
    if (std::string("," OASIS_PARITY_BACKENDS ",").find("," + name + ",") == std::string::npos) continue;
#endif
    out.push_back(name);
  }
  return out;
}

/// A backend (a BackendOps) that is not available in this process skips the test with its reason.
#define OASIS_SKIP_UNLESS_AVAILABLE(b)                                                               \
  if (!backend_available(b))                                                                         \
  GTEST_SKIP() << "backend " << (b).name << " is not available: " << backend_unavailable_reason(b)

/// A per-case seed offset from the case's name.
inline std::uint64_t salt_of(const std::string& s) { return std::hash<std::string>{}(s) % 1000003ULL; }

/// The rule above as a GoogleTest assertion (the rule itself is bounds::check_parity).
template <class R>
::testing::AssertionResult within_twice_reference(const std::string& name, const Tensor<float>& got,
                                                  const Tensor<float>& ref, const Tensor<R>& hp,
                                                  const Tensor<double>& floor, int show = 5) {
  bounds::ParityOutcome o;
  bounds::check_parity(name, got, ref, hp, floor, o, show);
  if (!o.ok)
    return ::testing::AssertionFailure() << name << ": " << o.violations << " of " << got.size()
                                         << " elements outside 2|ref err| + floor\n" << o.first;
  return ::testing::AssertionSuccess() << name << ": max |err| " << o.worst_err << " (reference " << o.worst_ref_err
                                       << "), worst |err|/allowed " << o.worst_ratio;
}

/// EXPECT_TRUE on a parity result that also prints the realised errors and the margin of a passing
/// check ("[parity] test name: ..."), so a run on a device documents how close it came to the rule.
#define OASIS_EXPECT_PARITY(expr)                                                                    \
  do {                                                                                               \
    const ::testing::AssertionResult oasis_r_ = (expr);                                              \
    EXPECT_TRUE(oasis_r_);                                                                           \
    if (oasis_r_) {                                                                                  \
      const auto* oasis_i_ = ::testing::UnitTest::GetInstance()->current_test_info();                \
      std::cout << "[parity] " << oasis_i_->test_suite_name() << "." << oasis_i_->name() << " "     \
                << oasis_r_.message() << "\n";                                                       \
    }                                                                                                \
  } while (0)

/// The additive bias of an attention instance: none, or float-exact N(0, 2^2) values of the given
/// broadcast shape with -inf (masked keys) at a fraction of the entries and on every key of some
/// query rows (fully masked rows).
enum class BiasKind {
  none,
  tk,        ///< [Tq, Tk]
  batch,     ///< [B, 1, Tq, Tk]
  head,      ///< [1, H, Tq, Tk]
  full,      ///< [B, H, Tq, Tk]
};

/// One attention instance of the parity tests.
struct AttentionCase {
  std::string name;
  index_t B, H, H_kv, Tq, Tk, d_h, d_v;
  RowNorm normalizer = RowNorm::softmax1;
  bool causal = false;
  std::vector<index_t> key_lengths;
  bool null_logits = false;   ///< per-head null logits (float-exact), else s = 0
  double q_scale = 1.0;       ///< multiplies q: large values give extreme logits
  double null_scale = 2.0;    ///< spread of the null logits
  bool probs = true;
  index_t window = 0;         ///< sliding window (0: none)
  BiasKind bias = BiasKind::none;
  double bias_masked = 0.2;   ///< fraction of -inf bias entries
  index_t bias_masked_rows = 2;  ///< query rows whose bias is -inf at every key
  AttentionLayout layout = AttentionLayout::bhtd;
};

inline std::vector<AttentionCase> attention_cases() {
  using L = AttentionLayout;
  using BK = BiasKind;
  auto with = [](AttentionCase c, index_t window, BiasKind bias, AttentionLayout layout) {
    c.window = window;
    c.bias = bias;
    c.layout = layout;
    return c;
  };
  return {
      {"gqa_causal_padded_d64", 2, 4, 2, 40, 40, 64, 64, RowNorm::softmax1, true, {40, 17}, true},
      {"decode_block_d128", 1, 2, 1, 5, 70, 128, 128, RowNorm::softmax1, true, {}, true},
      {"fully_masked_rows_softmax1", 2, 2, 1, 40, 24, 64, 64, RowNorm::softmax1, true, {0, 24}, true},
      {"fully_masked_rows_softmax", 2, 2, 2, 40, 24, 64, 64, RowNorm::softmax, true, {0, 11}, false},
      {"extreme_logits", 1, 4, 2, 33, 65, 64, 64, RowNorm::softmax1, false, {}, true, 40.0, 60.0},
      {"extreme_logits_softmax", 1, 2, 1, 17, 65, 128, 128, RowNorm::softmax, true, {}, false, 40.0},
      {"odd_head_sizes", 2, 3, 3, 19, 37, 24, 40, RowNorm::softmax1, false, {37, 5}, true},
      {"mixed_head_sizes", 1, 2, 2, 9, 50, 128, 64, RowNorm::softmax1, false, {}, false},
      {"padding_softmax", 2, 2, 1, 12, 45, 64, 64, RowNorm::softmax, false, {5, 0}, false},
      // sliding windows (docs/spec.md §8): one key; the band across key tiles (tiles outside it skipped)
      // with padding and Tq != Tk, so some rows are fully masked; wider than every row (= causal)
      with({"window1_gqa_bthd", 1, 4, 2, 20, 20, 64, 64, RowNorm::softmax1, false, {}, true}, 1, BK::none, L::bthd),
      with({"window_padded_tq_ne_tk", 2, 2, 1, 21, 90, 64, 32, RowNorm::softmax, false, {90, 60}, false}, 20,
           BK::none, L::bhtd),
      with({"window_wider_than_rows", 1, 2, 2, 30, 40, 32, 32, RowNorm::softmax1, true, {}, true}, 100, BK::none,
           L::bhtd),
      // additive bias with -inf masks and rows masked at every key (fully masked by the bias)
      with({"bias_masked_rows_softmax1", 2, 2, 1, 24, 40, 64, 64, RowNorm::softmax1, false, {}, true}, 0,
           BK::batch, L::bhtd),
      with({"bias_masked_rows_softmax", 1, 2, 2, 24, 40, 64, 64, RowNorm::softmax, true, {}, false}, 0, BK::full,
           L::bhtd),
      // everything at once, GQA in [B, T, H, d]
      with({"bias_window_gqa_bthd", 2, 4, 2, 18, 50, 64, 48, RowNorm::softmax1, true, {50, 33}, true}, 13, BK::tk,
           L::bthd),
  };
}

inline void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }

struct AttentionInputs {
  Tensor<float> q, k, v;
  AttentionOptions opt;
};

/// Reproducible inputs of a case (float values; the high-precision run casts them exactly).
inline AttentionInputs make_inputs(const AttentionCase& c, std::uint64_t salt) {
  std::mt19937_64 rng = make_rng(salt);  // base seed: oasis_random.hpp ($OASIS_TEST_SEED)
  std::normal_distribution<double> nd(0.0, 1.0);
  auto fill = [&](Shape s, double sd) {
    Tensor<float> t(std::move(s));
    for (index_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(sd * nd(rng));
    return t;
  };
  AttentionInputs in{fill({c.B, c.H, c.Tq, c.d_h}, c.q_scale), fill({c.B, c.H_kv, c.Tk, c.d_h}, 1.0),
                     fill({c.B, c.H_kv, c.Tk, c.d_v}, 1.0), {}};
  in.opt.normalizer = c.normalizer;
  in.opt.causal = c.causal;
  in.opt.key_lengths = c.key_lengths;
  in.opt.return_probs = c.probs;
  if (c.null_logits)
    for (index_t h = 0; h < c.H; ++h)
      in.opt.null_logits.push_back(static_cast<double>(static_cast<float>(c.null_scale * nd(rng))));
  in.opt.window = c.window;
  if (c.bias != BiasKind::none) {
    const index_t bb = c.bias == BiasKind::batch || c.bias == BiasKind::full ? c.B : 1;
    const index_t bh = c.bias == BiasKind::head || c.bias == BiasKind::full ? c.H : 1;
    Tensor<double> bias = c.bias == BiasKind::tk ? Tensor<double>({c.Tq, c.Tk}) : Tensor<double>({bb, bh, c.Tq, c.Tk});
    std::uniform_real_distribution<double> ud(0.0, 1.0);
    for (index_t i = 0; i < bias.size(); ++i)
      bias[i] = ud(rng) < c.bias_masked ? -std::numeric_limits<double>::infinity()
                                        : static_cast<double>(static_cast<float>(2.0 * nd(rng)));
    for (index_t r = 0; r < c.bias_masked_rows; ++r) {  // rows of the [.., Tq, Tk] slices masked at every key
      const index_t slice = static_cast<index_t>(ud(rng) * static_cast<double>(bias.size() / (c.Tq * c.Tk)));
      const index_t t = static_cast<index_t>(ud(rng) * static_cast<double>(c.Tq));
      for (index_t j = 0; j < c.Tk; ++j) bias[(slice * c.Tq + t) * c.Tk + j] = -std::numeric_limits<double>::infinity();
    }
    in.opt.bias = std::move(bias);
  }
  if (c.layout == AttentionLayout::bthd) {
    in.opt.layout = AttentionLayout::bthd;
    in.q = swap_head_time(in.q);
    in.k = swap_head_time(in.k);
    in.v = swap_head_time(in.v);
  }
  return in;
}

/// True if row (b, h, t) has no visible key: none in its key range, or every one masked by a -inf bias.
inline bool fully_masked_row(const AttentionShape& s, const AttentionOptions& opt, index_t b, index_t h, index_t t) {
  const KeyRange kr = visible_range(s, opt, b, t);
  for (index_t j = kr.begin; j < kr.end; ++j)
    if (!(std::isinf(attention_bias(opt, b, h, t, j)) && attention_bias(opt, b, h, t, j) < 0)) return false;
  return true;
}

/// check(s, b, h, t) on every row without a visible key, up to the first failure; the success
/// counts the rows, followed by `what`.
template <class Check>
::testing::AssertionResult check_fully_masked_rows(const AttentionInputs& in, const char* what, Check check) {
  const AttentionShape s = check_attention_args(in.q, in.k, in.v, in.opt);
  index_t rows = 0;
  for (index_t b = 0; b < s.B; ++b)
    for (index_t h = 0; h < s.H; ++h)
      for (index_t t = 0; t < s.Tq; ++t) {
        if (!fully_masked_row(s, in.opt, b, h, t)) continue;
        ++rows;
        ::testing::AssertionResult r = check(s, b, h, t);
        if (!r) return r;
      }
  return ::testing::AssertionSuccess() << rows << what;
}

/// Element (b, h, t, c) of an output in the layout of `opt`.
inline float out_at(const Tensor<float>& out, const AttentionOptions& opt, index_t b, index_t h, index_t t, index_t c) {
  return opt.layout == AttentionLayout::bhtd ? out(b, h, t, c) : out(b, t, h, c);
}

}  // namespace oasis::test
