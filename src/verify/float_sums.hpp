// src/verify/float_sums.hpp — sums of products in float, for the fast oracles' bound pieces: sums of
// magnitudes (Q_j = sum_c |q_c k_jc|, V1 = sum_j p_j |v_j|, G1 = sum_j g_j |v_j|, Z = sum_j Zw_j v_j^2)
// and one signed sum with nonnegative weights (X1 = sum_j W_j v_j), with the uncertainty the oracle then
// declares for them (AttnRow::rho, rho_out, own_rel).
//
// The oracle needs such a piece X = sum_j w_j y_j (w_j >= 0 weights in double, y_j >= 0) only within the
// uncertainty it declares: an element whose verdict that uncertainty could change goes to the mp50
// rows. Float matrix products run at twice the double rate. Each row of weights is rounded to float,
// scaled by a power of 2, 2^e, where its largest lies outside [2^-60, 2^30) (then into [1/2, 1)); the
// y_j are rounded to float in their normal range (in_range: every nonzero |v| in [2^-40, 2^40], so
// v^2 is normal and a sum of at most kMaxTerms terms stays below 2^125). The sum of a row's m terms
// is one multiply-add chain (oracle_kernels.hpp); terms with a zero weight or a zero y_j are exact.
// With u_f = 2^-24, gamma_n = n u_f / (1 - n u_f) and X^ the float sum times 2^-e:
//   |X^ - X| <= gamma_{m+3} X + E,   E = 2^-e 2^-148 (Y + k),
// gamma_{m+3}: each term's roundings (the weight's and y_j's to float, and the double product v^2
// below u_f: at most three) and the chain's m, in the normal range. Below it a rounding is at most
// 2^-150 absolute: a weight's (times its y_j; their sum at most Y >= sum_j y_j) and a step's (only
// where its product is nonzero: at most k, the count of nonzero y_j). 2^-148 is twice 2^-149 for the
// first-order (1 + u_f) factors. Hence, from X >= (X^ - E) / (1 + gamma),
//   |X^ - X| / X <= gamma + E (1 + gamma) / (X^ - E)   (infinite where X^ <= E),
// a ratio the same in the scaled row's units (rel and abs_part take those: no 2^-e underflows). A
// decision needs X within X^ (1 +- rel), relative to the computed X^: X^ <= (1 + u_f)^(m+3) X + E
// gives X^ - X <= gamma X + E <= rel X^ by the above, and X^ >= (1 - u_f)^(m+3) X - E with
// (1 - u_f)^-n - 1 <= gamma_n gives X - X^ <= gamma X^ + E (1 + gamma) <= rel X^.
//
// Q_j: the d_h terms |q_c| |k_jc| with every nonzero |q|, |k| in [2^-40, 2^40]: each product lies in
// float's normal range and no sum passes 2^127 (d_h <= kMaxTerms), so E = 0 and, from the same steps,
// Q_j within Q^_j (1 +- gamma_{d_h+2}) (the two operands' roundings and the chain's d_h).
//
// A signed sum X = sum_j w_j y_j (w_j >= 0, y_j = v_j in range) takes the same roundings with |y_j| in
// their magnitudes: |X^ - X| <= gamma_{m+3} sum_j w_j |y_j| + E (E as above, Y >= sum_j |y_j|). By
// Cauchy-Schwarz sum_j w_j |y_j| <= sqrt(sum_j w_j) sqrt(sum_j w_j y_j^2), and the oracle holds upper
// ends of both: sw (a double sum) and a sum of squares Z whose weights are at least the w_j
// (signed_error).
#pragma once

#include <cmath>
#include <limits>

#include "oasis/core/scalar.hpp"

namespace oasis::verify::detail::fsum {

inline constexpr double kUnit = 0x1p-24;  ///< float's unit roundoff u_f
/// The most terms a float sum takes: gamma_{m+3} stays below 1e-3 (longer rows: double products).
inline constexpr index_t kMaxTerms = 16384;

/// The largest relative uncertainty a fast oracle keeps for a float sum; beyond it (a sum mostly below
/// float's normal range) it sums that element in double.
inline constexpr double kRedo = 1e-3;

/// Whether y may enter a float sum as |y| or y^2: zero, or |y| within [2^-40, 2^40].
inline bool in_range(double y) {
  const double a = std::abs(y);
  return a == 0.0 || (a >= 0x1p-40 && a <= 0x1p40);
}

inline double gamma(index_t n) {
  const double nu = static_cast<double>(n) * kUnit;
  return nu / (1.0 - nu);
}

/// w[0..n) times 2^e rounded to float into out: e = 0 where the largest lies in [2^-60, 2^30) or is 0,
/// else such that it lies in [1/2, 1). False (out partly written) when the largest is not finite or
/// below 2^-1000 (2^e would leave the double range): the caller takes the double products.
bool scale_to_float(const double* w, index_t n, float* out, int& e);

/// Whether this thread's float arithmetic keeps subnormals (neither flush-to-zero nor
/// denormals-are-zero, which a host may set, e.g. torch.set_flush_denormal): E above assumes gradual
/// underflow, and under either mode a rounding below the normal range costs up to 2^-126. The modes
/// are a thread's own, so the thread that sums asks.
bool subnormals_kept();

/// E of the header in the scaled row's units (times 2^e): y_sum >= sum_j y_j, nonzero = the count of
/// nonzero y_j.
inline double abs_part(double y_sum, index_t nonzero) {
  return nonzero == 0 ? 0.0 : 0x1p-148 * (y_sum + static_cast<double>(nonzero));
}

/// The relative uncertainty of a float sum of m terms, both in the scaled row's units: its value x_hat
/// and E (abs_part); g = gamma(m + 3).
inline double rel(double x_hat, double g, double E) {
  if (E == 0.0) return g;
  if (!(x_hat > E)) return std::numeric_limits<double>::infinity();
  return g + E * (1.0 + g) / (x_hat - E);
}

/// The uncertainty of a signed float sum X^ of the header, unscaled: g = gamma(m + 3), sw >= sum_j w_j
/// and zsq >= sum_j w_j y_j^2 (each up to double roundings: sums of at most kMaxTerms + 2 terms, which
/// the factor 1 + 1e-9 covers), E its absolute part in the same units.
/// (Each root apart: sw and zsq may each lie near 2^-800, where their product would underflow.)
inline double signed_error(double g, double sw, double zsq, double E) {
  return g * std::sqrt(sw) * std::sqrt(zsq) * (1.0 + 1e-9) + E;
}

}  // namespace oasis::verify::detail::fsum
