// tests/cuda/parity_rule.hpp — the kernel parity rule (bounds::check_parity; derivation in
// docs/tolerances.md, "Fused kernels") as a GoogleTest assertion, and the attention instances of
// the parity tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "oasis/attention.hpp"
#include "oasis/backend.hpp"
#include "oasis/error_bounds.hpp"
#include "oasis/tensor.hpp"

namespace oasis {
/// GoogleTest prints a backend parameter by name (test names in ctest stay readable).
inline void PrintTo(Backend b, std::ostream* os) { *os << to_string(b); }
}  // namespace oasis

namespace oasis::test {

/// |a - b| with equal infinities at distance 0 (NaN propagates and fails a comparison).
inline double abs_err(double a, double b) {
  if (std::isinf(a) && std::isinf(b) && (a > 0) == (b > 0)) return 0.0;
  return std::abs(a - b);
}

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
};

inline std::vector<AttentionCase> attention_cases() {
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
  };
}

inline void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }

struct AttentionInputs {
  Tensor<float> q, k, v;
  AttentionOptions opt;
};

/// Reproducible inputs of a case (float values; the high-precision run casts them exactly).
inline AttentionInputs make_inputs(const AttentionCase& c, std::uint64_t salt) {
  std::mt19937_64 rng(20261129ULL * 1000003ULL + salt);
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
  return in;
}

}  // namespace oasis::test
