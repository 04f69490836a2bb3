// oasis/verify/policy.hpp — how close an external tensor must be to the oracle, and which oracle
// computes the reference (docs/tolerances.md, "The compare policies", derives and measures them).
//
// Every checked element i of an output stored in dtype D is judged on two lines:
//   certain    |x_i - ref_i| <= 0.5 ulp_D(ref_i) + 2 B_i(D)
//              B_i: the sound worst-case first-order bound of the plain reference
//              (oasis/ops/error_bounds.hpp); f16/bf16 use the float bound scaled by u_D / u_f32, the
//              bound of a computation that rounds every intermediate to D (attention with 16-bit
//              inputs: to the wider of D and the inputs' type). Outside it, the element
//              is wrong whatever the implementation's evaluation order: FAIL-certain.
//   policy     the selected Policy below, never looser than the certain line (the minimum of the
//              two is used). Outside it: FAIL.
// A tensor PASSes when every element is within the policy. The process exit is 1 for any FAIL.
#pragma once

#include <string>
#include <string_view>

#include "oasis/core/error.hpp"

namespace oasis::verify {

/// The tolerance policy of a comparison.
enum class Policy {
  /// Default. f32 and f64 outputs: 0.5 ulp_D(ref) + E, E = 1.02 lambda u_D R + the underflow
  /// floors, R the probabilistic coefficient bound of oasis/ops/prob_bounds.hpp (Higham & Mary 2019)
  /// with lambda = kLambda. f16 and bf16 outputs are taken as accumulated in float32 and rounded
  /// once to D: 0.5 ulp_D(|ref| + E) + E with E the float32 term. Attention with 16-bit inputs:
  /// E at the inputs' unit roundoff (every intermediate may be 16-bit: tensor-core P·V, torch
  /// eager). Ops without a probabilistic bound (psi, pseudo_query, coupling's g and dpsi) use the
  /// certain line; 16-bit gradients of attention_backward the float bound stored once.
  probabilistic,
  /// As probabilistic, for kernels that also round the probabilities (attention) or the depth
  /// weights to the 16-bit output type before the mixing P·V (FlashAttention, torch SDPA): the
  /// mixture outputs (attention out, depth h) of f16/bf16 tensors get u_D sum_j p_j |v_jc| more.
  p16,
  /// The certain line alone (every intermediate in D for f16/bf16).
  worst_case,
};

/// Which oracle computes the reference.
enum class Oracle {
  /// The reference in double, vectorised and OpenMP-parallel, with its own worst-case error bound
  /// folded into each decision; an element whose verdict that error could change is recomputed,
  /// with its whole row, in mp50. Verdicts are the mp50 oracle's.
  fast,
  /// Everything in 50-digit arithmetic (oasis::mp50), single-threaded.
  mp50,
};

/// lambda of the probabilistic policy: per element, the probability that a correct implementation
/// exceeds the bound under the model is at most 2 exp(-lambda^2 / 2) = 7.5e-6 (the measured zoo
/// needs lambda <= 0.7, docs/tolerances.md).
inline constexpr double kLambda = 5.0;

inline std::string_view to_string(Policy p) {
  switch (p) {
    case Policy::probabilistic: return "probabilistic";
    case Policy::p16: return "p16";
    case Policy::worst_case: return "worst_case";
  }
  return "unknown";
}
inline Policy parse_policy(std::string_view name) {
  for (Policy p : {Policy::probabilistic, Policy::p16, Policy::worst_case})
    if (name == to_string(p)) return p;
  throw invalid_argument("policy", "unknown policy '" + std::string(name) + "' (expected probabilistic, p16 or worst_case)");
}

inline std::string_view to_string(Oracle o) { return o == Oracle::fast ? "fast" : "mp50"; }
inline Oracle parse_oracle(std::string_view name) {
  if (name == "fast") return Oracle::fast;
  if (name == "mp50") return Oracle::mp50;
  throw invalid_argument("oracle", "unknown oracle '" + std::string(name) + "' (expected fast or mp50)");
}

}  // namespace oasis::verify
