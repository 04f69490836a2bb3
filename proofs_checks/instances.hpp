// proofs_checks/instances.hpp — how a check draws its instances and moves values between scalars.
//
// Instances are drawn in double from a reproducible stream (Rng, seeded per check by seed_for) and
// rounded once to the scalar T under test (rounded<T>), so that T and the high-precision reference
// oasis::mp50 see identical inputs. Outputs in T are converted exactly to mp50 (to_mp50), where the
// statement is evaluated.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "check.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/oasis.hpp"

namespace oasis::checks::detail {

/// A scalar type passed as a value, so that a generic lambda can receive it:
/// `[](auto scalar) { using T = typename decltype(scalar)::type; ... }`.
template <class T> struct ScalarTag { using type = T; };

template <class T> const char* scalar_name();
template <> inline const char* scalar_name<float>() { return "float"; }
template <> inline const char* scalar_name<double>() { return "double"; }
template <> inline const char* scalar_name<mp50>() { return "mp50"; }
#if defined(OASIS_HAVE_MPFR)
template <> inline const char* scalar_name<mpfr50>() { return "mpfr50"; }
#endif

template <class T> inline constexpr bool is_mp_v = !std::is_floating_point_v<T>;

/// Exact conversion to mp50 (mpfr50 goes through its full decimal expansion).
template <class T> mp50 to_mp50(const T& x) {
  if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, mp50>) {
    return mp50(x);
  } else {
    using std::isinf; using std::isnan;
    if (isnan(x)) return mp50(std::numeric_limits<double>::quiet_NaN());
    if (isinf(x)) return x > 0 ? pos_inf<mp50>() : neg_inf<mp50>();
    return mp50(x.str(0, std::ios_base::scientific));
  }
}
template <class T> Tensor<mp50> to_mp50(const Tensor<T>& t) {
  Tensor<mp50> out(t.shape());
  for (index_t i = 0; i < t.size(); ++i) out[i] = to_mp50(t[i]);
  return out;
}
inline double to_double(const mp50& x) { return static_cast<double>(x); }

/// x rounded to T (and back to double, exactly): an input every scalar represents identically.
template <class T> double rounded(double x) { return static_cast<double>(T(x)); }

/// The bounds of error_bounds.hpp are against the exact result; the mp50 reference carries its own
/// rounding (u_mp50), so a comparison with it allows bound * (1 + u_mp50 / u_T).
template <class T> double mp50_rounding_factor() {
  return 1.0 + bounds::Precision::of<mp50>().u / bounds::Precision::of<T>().u;
}

/// Random instances per run: the configured count, a fifth of it (at least 8) for mp scalars.
template <class T> int instances_for(const CheckConfig& cfg) {
  const int n = std::max(1, cfg.instances);
  return is_mp_v<T> ? std::max(8, n / 5) : n;
}

/// Seed of one check: the configured seed mixed with the check id (FNV-1a), the same stream for
/// every scalar.
inline std::uint64_t seed_for(const CheckConfig& cfg, const std::string& id) {
  std::uint64_t h = 1469598103934665603ULL;
  for (char c : id) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return cfg.seed ^ h;
}

/// The reproducible stream instances are drawn from (in double).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : g_(seed) {}
  double normal(double sd = 1.0) { return std::normal_distribution<double>(0.0, sd)(g_); }
  double uniform(double a, double b) { return std::uniform_real_distribution<double>(a, b)(g_); }
  int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g_); }
  /// A unit vector of dimension d.
  std::vector<double> unit(int d) {
    std::vector<double> x(static_cast<std::size_t>(d));
    double n2 = 0;
    do {
      n2 = 0;
      for (double& v : x) { v = normal(); n2 += v * v; }
    } while (n2 < 1e-6);
    for (double& v : x) v /= std::sqrt(n2);
    return x;
  }

 private:
  std::mt19937_64 g_;
};

}  // namespace oasis::checks::detail
