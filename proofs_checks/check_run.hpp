// proofs_checks/check_run.hpp — CheckRun: what one (check, scalar, backend) run records, and the
// CheckResult it turns into.
//
// A check reports, per instance, its evidence (docs/paper-map.md, "What passes means"):
//   error(what, err, bound)            |x_T - x_mp50| <= bound        (worst_error = max err/bound)
//   margin(stmt, m, allowed)           an inequality's normalised margin m >= -allowed
//   tight_margin(stmt, m, allowed)     the same at an equality case, where also m <= allowed
//   identity(stmt, r, allowed)         an identity's residual |r| <= allowed (margin -|r|)
// and fail(stmt, ...) for anything that must hold exactly. The first failure is kept with its
// instance index for the message.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "check.hpp"
#include "instances.hpp"

namespace oasis::checks::detail {

/// Rounding of evaluating a margin in mp50 (a few hundred operations at u ~ 1e-50), relative.
inline constexpr double kEvalAllowance = 1e-44;

class CheckRun {
 public:
  /// bound_factor multiplies the documented bounds for the implementation under test: 1 for the
  /// plain reference, 2 for a fused kernel (cpu_fast, cuda), which the tolerance policy allows twice
  /// the plain reference's error (docs/tolerances.md, item 4).
  explicit CheckRun(double bound_factor = 1.0) : bound_factor_(bound_factor) {}
  double bound_factor() const { return bound_factor_; }

  void begin_instance(long index, bool tight, std::string what = {}) {
    ++instances_;
    if (tight) ++tight_;
    index_ = index;
    is_tight_ = tight;
    what_ = std::move(what);
  }
  /// Inequality with normalised margin m = (rhs - lhs) / scale; passes when m >= -allowed.
  void margin(const char* stmt, double m, double allowed) {
    slack_ = std::max(slack_, allowed);
    if (std::isnan(m) || m < worst_margin_) worst_margin_ = std::isnan(m) ? -std::numeric_limits<double>::infinity() : m;
    if (!(m >= -allowed)) fail(stmt, "margin ", m, " < -", allowed);
  }
  /// Equality case of an inequality: |m| <= allowed (a bound off by a constant fails here).
  void tight_margin(const char* stmt, double m, double allowed) {
    margin(stmt, m, allowed);
    if (!(m <= allowed)) fail(stmt, "equality case not attained: margin ", m, " > ", allowed, " (bound not tight)");
  }
  /// Identity with normalised residual r >= 0 (recorded as margin -r).
  void identity(const char* stmt, double r, double allowed) { margin(stmt, -std::abs(r), allowed); }
  /// Error against the high-precision reference: err <= bound.
  void error(const char* what, double err, double bound) {
    const double ratio = bound > 0 ? err / bound : (err == 0 ? 0.0 : std::numeric_limits<double>::infinity());
    if (std::isnan(ratio) || ratio > worst_error_) worst_error_ = std::isnan(ratio) ? std::numeric_limits<double>::infinity() : ratio;
    if (!(err <= bound)) fail(what, "|T - mp50| = ", err, " > bound ", bound);
  }
  /// A property that must hold exactly (or a guarantee of the construction) failed.
  template <class... P> void fail(const char* stmt, const P&... parts) {
    ++failures_;
    if (first_.empty()) {
      std::ostringstream os;
      os.precision(6);
      os << "instance " << index_ << (is_tight_ ? " (equality case)" : "") << (what_.empty() ? "" : " [" + what_ + "]")
         << ": " << stmt << ": ";
      (os << ... << parts);
      first_ = os.str();
    }
  }
  long failures() const { return failures_; }

  CheckResult result(const std::string& id, const std::string& paper_ref, const std::string& scalar,
                     const std::string& backend) const {
    CheckResult r;
    r.check = id;
    r.paper_ref = paper_ref;
    r.scalar = scalar;
    r.backend = backend;
    r.instances = instances_;
    r.tight_instances = tight_;
    r.worst_error = worst_error_;
    r.worst_margin = std::isinf(worst_margin_) && worst_margin_ > 0 ? 0.0 : worst_margin_;
    r.margin_slack = slack_;
    r.passed = failures_ == 0 && instances_ > 0;
    std::ostringstream os;
    if (r.passed)
      os << instances_ << " instances (" << tight_ << " at equality), worst margin " << r.worst_margin
         << " (allowance " << slack_ << "), worst |error|/bound " << worst_error_;
    else
      os << failures_ << " failure(s) in " << instances_ << " instances; first: " << first_;
    r.message = os.str();
    return r;
  }

 private:
  double bound_factor_;
  long instances_ = 0, tight_ = 0, failures_ = 0, index_ = 0;
  bool is_tight_ = false;
  std::string what_, first_;
  double worst_error_ = 0, worst_margin_ = std::numeric_limits<double>::infinity(), slack_ = 0;
};

/// Every element of `got` against the mp50 reference `ref` under the per-element `bound` (equal
/// infinities count as error 0).
inline void compare(CheckRun& run, const char* what, const Tensor<mp50>& got, const Tensor<mp50>& ref,
                    const Tensor<double>& bound) {
  if (got.shape() != ref.shape()) {
    run.fail(what, "shape ", shape_str(got.shape()), " differs from the reference ", shape_str(ref.shape()));
    return;
  }
  for (index_t i = 0; i < got.size(); ++i) {
    const mp50& g = got[i];
    const mp50& r = ref[i];
    using std::isinf; using std::abs;
    const double err = (isinf(g) && isinf(r) && (g > 0) == (r > 0)) ? 0.0 : to_double(abs(g - r));
    run.error(what, err, bound.empty() ? 0.0 : bound[i]);
  }
}

}  // namespace oasis::checks::detail
