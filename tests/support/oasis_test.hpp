// tests/support/oasis_test.hpp — shared helpers of the test families.
//
//  * reproducible random tensors (oasis_random.hpp, shared with the benchmarks);
//  * comparison against a reference under a per-element bound that reports the count of
//    violations and the first few mismatching indices (llm.c style), as a gtest AssertionResult;
//  * the argument that a rejected call names (bad input must name the offending argument);
//  * a tensor rounded to a storage dtype.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <sstream>
#include <string>

#include "oasis/core/error.hpp"
#include "oasis/core/tensor.hpp"
#include "oasis/io/dtype.hpp"
#include "oasis_random.hpp"

namespace oasis::test {

/// x with every entry rounded to dtype d (inputs exact in d).
inline Tensor<double> rounded(Tensor<double> x, io::DType d) {
  for (index_t i = 0; i < x.size(); ++i) x[i] = io::round_to_dtype(x[i], d);
  return x;
}

/// Multi-index of a flat offset, for messages.
inline std::string index_str(const Shape& shape, index_t flat) {
  std::vector<index_t> ix(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    ix[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  return shape_str(ix);
}

/// |got_i - ref_i| <= bound(i, ref_i) for every element; reports the first `show` violations.
template <class T, class R>
::testing::AssertionResult within_bound(const std::string& name, const Tensor<T>& got, const Tensor<R>& ref,
                                        const std::function<double(index_t, double)>& bound, int show = 5) {
  if (got.shape() != ref.shape())
    return ::testing::AssertionFailure() << name << ": shape " << shape_str(got.shape()) << " vs reference "
                                         << shape_str(ref.shape());
  index_t bad = 0;
  double worst = 0;
  std::ostringstream os;
  for (index_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    const double r = static_cast<double>(ref[i]);
    const double b = bound(i, r);
    // the difference is taken in the reference type: rounding both to double first would add
    // double-precision noise to a long double comparison
    const double err = (std::isinf(g) && std::isinf(r) && (g > 0) == (r > 0))
                           ? 0.0
                           : std::abs(static_cast<double>(static_cast<R>(got[i]) - ref[i]));
    const bool ok = err <= b;  // NaN fails
    if (b > 0 && std::isfinite(err)) worst = std::max(worst, err / b);
    if (!ok) {
      if (bad < show)
        os << "\n  " << name << index_str(got.shape(), i) << ": got " << g << " ref " << r << " |err| " << err
           << " bound " << b;
      ++bad;
    }
  }
  if (bad)
    return ::testing::AssertionFailure() << name << ": " << bad << " of " << got.size()
                                         << " elements outside the bound" << os.str();
  return ::testing::AssertionSuccess() << name << ": worst |err|/bound = " << worst;
}

/// Bitwise-equal tensors (exact checks: integer-valued inputs, save/load round trips).
template <class T>
::testing::AssertionResult exactly_equal(const std::string& name, const Tensor<T>& a, const Tensor<T>& b) {
  return within_bound<T, T>(name, a, b, [](index_t, double) { return 0.0; });
}

/// The argument named by the oasis::invalid_argument that f() throws; "(no error)" when f() returns
/// (any other exception propagates).
template <class F> std::string thrown_argument(F&& f) {
  try {
    f();
  } catch (const oasis::invalid_argument& e) {
    return e.argument();
  }
  return "(no error)";
}

}  // namespace oasis::test
