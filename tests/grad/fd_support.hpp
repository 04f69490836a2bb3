// tests/grad/fd_support.hpp — mp50 central finite differences with a derived tolerance
// (docs/tolerances.md, "Finite differences").
//
// For a loss f evaluated in mp50 along one input coordinate, x -> x + tau, the central difference
//   D(h) = (f(x + h) - f(x - h)) / (2h),   h = 2^-40
// satisfies |D(h) - f'(x)| <= h^2/6 M3 + delta_f / h + 2 u50 |D|, where M3 bounds |f'''| on
// [x - h, x + h] and delta_f bounds the rounding error of one evaluation of f in mp50. h = 2^-40 makes
// x +- h exact for every input of the tests (doubles of magnitude < 2^12 in mp50; null logits and
// theta, which the options hold in double, are multiples of 2^-5 below 2^7).
//
// M3 (rigorous, no estimate): every loss here is a sum over rows of E_p[c] + dlse * LSE, where p is a
// softmax (with or without the null category) of logits l_i(tau) and c_i(tau) are the incoming
// gradients of the categories (<dO, v_j>, <dh, s_i> + dalpha_i, dP and dalpha_null for the null).
// Exponential tilting gives, with a = l', b = l'', e = l''' and c affine in tau,
//   d^3/dtau^3 E_p[c] = kappa(c,a,a,a) + 3 kappa(c,a,b) + kappa(c,e) + 3 kappa(c',a,a) + 3 kappa(c',b)
//   d^3/dtau^3 LSE    = kappa_3(a) + 3 kappa(a,b) + E[e]
// (kappa: joint cumulants under p), and a joint cumulant of centred variables is bounded by the
// product of their ranges over the categories (4 R_c R_a^3 for the fourth-order one), so
//   |f'''| <= R_c (4 R_a^3 + 3 R_a R_b + R_e) + 3 R_c' (R_a^2 + R_b) + |dlse| (max|e| + 3 R_a R_b + R_a^3)
// per row. Each quantity is given as an interval covering its values on the whole segment.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "oasis/core/multiprecision.hpp"
#include "oasis/core/scalar.hpp"

namespace oasis::test::fd {

inline constexpr double kStep = 0x1p-40;

inline double u50() { return unit_roundoff<mp50>(); }

struct Interval {
  double lo = 0, hi = 0;
};
inline Interval around(double x, double slack = 0) { return {x - std::abs(slack), x + std::abs(slack)}; }

/// One category of a row along the coordinate line: its incoming gradient c (and slope c') and its
/// logit's first three derivatives a, b, e, each as an interval over the segment.
struct Category {
  Interval c, c1, a, b, e;
};

inline double range_of(const std::vector<Category>& cats, Interval Category::*f) {
  if (cats.empty()) return 0;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& k : cats) {
    lo = std::min(lo, (k.*f).lo);
    hi = std::max(hi, (k.*f).hi);
  }
  return hi - lo;
}

/// Bound on |d^3/dtau^3 (E_p[c] + dlse LSE)| of one row (header comment).
inline double row_third_derivative_bound(const std::vector<Category>& cats, double dlse) {
  const double Rc = range_of(cats, &Category::c), Rc1 = range_of(cats, &Category::c1), Ra = range_of(cats, &Category::a),
               Rb = range_of(cats, &Category::b), Re = range_of(cats, &Category::e);
  double Emax = 0;
  for (const auto& k : cats) Emax = std::max({Emax, std::abs(k.e.lo), std::abs(k.e.hi)});
  return Rc * (4 * Ra * Ra * Ra + 3 * Ra * Rb + Re) + 3 * Rc1 * (Ra * Ra + Rb) +
         std::abs(dlse) * (Emax + 3 * Ra * Rb + Ra * Ra * Ra);
}

/// The derived tolerance of one difference quotient: truncation h^2/6 M3, rounding delta_f / h with
/// delta_f <= n_ops (2 + Z) u50 F_abs (n_ops roundings of relative u50, exp/log arguments of
/// magnitude <= Z amplify an argument error by at most Z; F_abs bounds the sum of |terms| of f),
/// plus the division (2 u50 |D|) and the analytic gradient's own mp50 rounding (same model with
/// G_abs).
struct Tolerance {
  double M3 = 0, n_ops = 0, Z = 0, F_abs = 0, G_abs = 0;
  double value(double D) const {
    const double h = kStep, u = u50();
    return h * h / 6 * M3 + n_ops * (2 + Z) * u * F_abs / h + 2 * u * std::abs(D) + n_ops * (2 + Z) * u * G_abs;
  }
};

/// Worst |analytic - FD| / tolerance over many coordinates, with the first failures named. The
/// difference is taken in mp50 (both agree to far more digits than a double holds).
struct Summary {
  double worst_ratio = 0;
  long checked = 0, failed = 0;
  long stop_after = 0;  ///< > 0: the caller may stop once this many failures are seen
  std::string first;
  void add(const std::string& name, const mp50& analytic, const mp50& fdq, double tol, int show = 5) {
    const mp50 diff = analytic - fdq;
    double err = std::abs(static_cast<double>(diff));
    if (std::isnan(err)) err = INFINITY;  // a NaN gradient is as wrong as it gets
    ++checked;
    worst_ratio = std::max(worst_ratio, tol > 0 ? err / tol : (err > 0 ? INFINITY : 0));
    if (!(err <= tol)) {
      if (failed < show) {
        std::ostringstream os;
        os.precision(17);
        os << "  " << name << ": analytic " << static_cast<double>(analytic) << " fd " << static_cast<double>(fdq)
           << " |diff| " << err << " tol " << tol << "\n";
        first += os.str();
      }
      ++failed;
    }
  }
  bool done() const { return stop_after > 0 && failed >= stop_after; }
  bool ok() const { return failed == 0 && checked > 0; }
};

/// (f(+h) - f(-h)) / (2h) in mp50, f taking the signed step.
inline mp50 central_difference(const std::function<mp50(const mp50&)>& f) {
  const mp50 h(kStep);
  return (f(h) - f(-h)) / (2 * h);
}

}  // namespace oasis::test::fd
