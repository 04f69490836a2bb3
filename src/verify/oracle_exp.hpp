// src/verify/oracle_exp.hpp — e^x in double for x in [-708, 0], branch-free so that loops over a
// row's keys vectorise (the forward fast oracle's exponentials, attention_oracle_fused.cpp).
//
// Relative error below 4u (u = 2^-53), twice the 2u that the bounds assume of an exp: the fast
// oracle's own error is therefore its worst-case bound at 2u (own_precision(), attention_oracle.hpp).
// Derivation (round to nearest, FLT_EVAL_METHOD 0; with or without fused multiply-add, which only
// removes roundings):
//  - n = nearest integer to x log2(e), read from t = x log2(e) + 1.5 2^52, whose low bits hold n
//    (-1021 <= n <= 0 on the range); |x - n ln2| <= 0.3466 + 2^-40.
//  - r = (x - n L_hi) - n L_lo, L_hi + L_lo = ln 2 within 2^-85 (L_hi has 32 significant bits):
//    n L_hi is exact, and so is the difference, since x and n L_hi are multiples of ulp(x) (or of
//    ulp(n L_hi) when |x| < 1/2) and |r| < 0.35; r is within u |r| + 2^-74 of x - n ln2: a relative
//    error of at most 0.35 u + 2^-74 in e^r.
//  - e^r by Horner's rule on the Taylor polynomial of degree 13: truncation below r^14 / 14! e^|r|
//    <= 0.053 u of e^r; the coefficients 1/k! rounded, below u (e^|r| - 1 - |r|) <= 0.07 u
//    absolute, 0.099 u of e^r >= 0.707. Each step q_k = q_{k+1} r + c_k rounds twice at most:
//    err(q_k) <= u (|q_k| + |q_{k+1} r|) + |r| err(q_{k+1}), with q_1 = (e^r - 1) / r <= 1.2,
//    q_2 <= 0.56, q_3 <= 0.19: err(q_2) <= 0.71 u, err(q_1) <= 1.65 u, and the last step adds
//    u |e^r| + 1.0 u: at most 2.41 u of e^r, 2.92 u with the rest.
//  - e^x = e^r 2^n: 2^n is built from n's bits (n >= -1021 for x >= -708, so it and the product are
//    normal) and the product is exact.
// OracleExp.WithinFourUnitRoundoffsOnItsRange (tests/verify/test_attention_oracle.cpp) measures it
// against expl on the whole range, with and without fused multiply-add.
#pragma once

#include <cfloat>
#include <cstdint>
#include <cstring>

namespace oasis::verify::detail {

static_assert(FLT_EVAL_METHOD == 0, "oracle_exp reads n from a double rounded to double (no wider evaluation)");

/// The arguments oracle_exp takes: x in [kOracleExpMin, 0].
inline constexpr double kOracleExpMin = -708.0;

/// e^x within 4u relative, for x in [kOracleExpMin, 0] (the header's derivation); outside, undefined.
inline __attribute__((always_inline)) double oracle_exp(double x) {
  constexpr double kLog2e = 0x1.71547652b82fep0, kShift = 0x1.8p52;
  constexpr double kLnHi = 0x1.62e42fee00000p-1, kLnLo = 0x1.a39ef35793c76p-33;
  const double t = x * kLog2e + kShift;
  const double n = t - kShift;
  const double r = (x - n * kLnHi) - n * kLnLo;
  double q = 1.0 / 6227020800.0;  // 1/13!
  q = q * r + 1.0 / 479001600.0;
  q = q * r + 1.0 / 39916800.0;
  q = q * r + 1.0 / 3628800.0;
  q = q * r + 1.0 / 362880.0;
  q = q * r + 1.0 / 40320.0;
  q = q * r + 1.0 / 5040.0;
  q = q * r + 1.0 / 720.0;
  q = q * r + 1.0 / 120.0;
  q = q * r + 1.0 / 24.0;
  q = q * r + 1.0 / 6.0;
  q = q * r + 0.5;
  q = q * r + 1.0;
  q = q * r + 1.0;
  // 2^n: t's bits are those of 1.5 2^52 plus n, whose low 11 bits, plus the bias, are 2^n's exponent
  std::uint64_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  bits = (bits + 1023u) << 52;
  double scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return q * scale;
}

}  // namespace oasis::verify::detail
