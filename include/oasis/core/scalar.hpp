// oasis/core/scalar.hpp — scalar helpers shared by every formula, generic over the scalar type.
//
// Scalars: float, double, long double, and the Boost.Multiprecision types of
// oasis/core/multiprecision.hpp. Math functions are called unqualified after `using std::...`
// so that argument-dependent lookup finds Boost's overloads for multiprecision types.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include <Eigen/Core>

namespace oasis {

using index_t = std::int64_t;

template <class T> using Vec = Eigen::Matrix<T, Eigen::Dynamic, 1>;
template <class T> using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T> inline T neg_inf() { return -std::numeric_limits<T>::infinity(); }
template <class T> inline T pos_inf() { return std::numeric_limits<T>::infinity(); }

/// Unit roundoff u = eps/2 of T (the bound of one correctly rounded operation).
template <class T> inline double unit_roundoff() {
  return static_cast<double>(std::numeric_limits<T>::epsilon()) / 2.0;
}

template <class T> inline bool is_nan(const T& x) { using std::isnan; return isnan(x); }
template <class T> inline bool is_finite(const T& x) { using std::isfinite; return isfinite(x); }
template <class T> inline bool is_neg_inf(const T& x) { using std::isinf; return isinf(x) && x < T(0); }
template <class T> inline bool is_pos_inf(const T& x) { using std::isinf; return isinf(x) && x > T(0); }

/// softplus(x) = log(1 + e^x), evaluated without overflow: max(x,0) + log1p(e^{-|x|}).
template <class T> inline T softplus(const T& x) {
  using std::abs; using std::exp; using std::log1p;
  const T zero(0);
  return (x > zero ? x : zero) + log1p(exp(-abs(x)));
}

/// sigmoid(x) = 1 / (1 + e^{-x}), evaluated on the non-overflowing branch.
template <class T> inline T sigmoid(const T& x) {
  using std::exp;
  if (x >= T(0)) return T(1) / (T(1) + exp(-x));
  const T e = exp(x);
  return e / (T(1) + e);
}

/// logaddexp(a, b) = log(e^a + e^b); -inf absorbs.
template <class T> inline T logaddexp(const T& a, const T& b) {
  using std::exp; using std::log1p;
  if (is_neg_inf(a)) return b;
  if (is_neg_inf(b)) return a;
  const T m = a > b ? a : b;
  const T d = a > b ? b - a : a - b;  // <= 0
  return m + log1p(exp(d));
}

/// Conversion to double for reporting (works for every supported scalar).
template <class T> inline double to_double(const T& x) { return static_cast<double>(x); }

}  // namespace oasis
