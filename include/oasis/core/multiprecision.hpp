// oasis/core/multiprecision.hpp — the high-precision reference scalars and their Eigen traits.
//
//   oasis::mp50    boost::multiprecision cpp_bin_float<50> (header-only, always available)
//   oasis::mpfr50  boost::multiprecision mpfr_float_backend<50> (when OASIS_HAVE_MPFR)
// Both use et_off (no expression templates) so that `auto` and Eigen see plain numbers.
// Boost 1.74's boost/multiprecision/eigen.hpp is incomplete for Eigen 3.4 (no infinity(),
// wrong lowest()), so the NumTraits come from Eigen's GenericNumTraits instead, as in Eigen's
// own multiprecision test.
#pragma once

#include <boost/multiprecision/cpp_bin_float.hpp>
#if defined(OASIS_HAVE_MPFR)
#include <boost/multiprecision/mpfr.hpp>
#endif
#include <Eigen/Core>

namespace oasis {
using mp50 = boost::multiprecision::number<boost::multiprecision::cpp_bin_float<50>,
                                           boost::multiprecision::et_off>;
#if defined(OASIS_HAVE_MPFR)
using mpfr50 = boost::multiprecision::number<boost::multiprecision::mpfr_float_backend<50>,
                                             boost::multiprecision::et_off>;
#endif
}  // namespace oasis

namespace Eigen {
template <>
struct NumTraits<oasis::mp50> : GenericNumTraits<oasis::mp50> {
  static inline oasis::mp50 dummy_precision() { return oasis::mp50(1e-45); }
  enum { IsComplex = 0, RequireInitialization = 1, ReadCost = 4, AddCost = 16, MulCost = 32 };
};
#if defined(OASIS_HAVE_MPFR)
template <>
struct NumTraits<oasis::mpfr50> : GenericNumTraits<oasis::mpfr50> {
  static inline oasis::mpfr50 dummy_precision() { return oasis::mpfr50(1e-45); }
  enum { IsComplex = 0, RequireInitialization = 1, ReadCost = 4, AddCost = 16, MulCost = 32 };
};
#endif
}  // namespace Eigen
