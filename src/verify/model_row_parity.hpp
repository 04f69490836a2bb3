// src/verify/model_row_parity.hpp — the end-to-end verdict's row rule (docs/verify-model.md, "The
// end-to-end verdict"), shared by the logits and state (op_model.cpp) and by the sublayer outputs of
// a trace that lacks their steps' inputs (model_sublayer_e2e.cpp): per token row, in the infinity
// norm, against a replay of the configured model from the ids in the trace's precision (x_ref) and
// the exact replay x_hp,
//   max_c |x - x_hp| <= 2 max_c |x_ref - x_hp| + 0.5 ulp_D(max_c |x_hp|) + 2 e_last(D).
#pragma once

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "op_support.hpp"
#include "oasis/core/multiprecision.hpp"
#include "oasis/model/model.hpp"

namespace oasis::verify::detail {

/// Relative uncertainty of the tolerance terms e(D) evaluated on the double reference (sums of
/// magnitudes and row norms of values within ~1e-13 relative of the exact ones).
constexpr double kBoundRho = 1e-6;
constexpr double kU53 = 0x1p-53;
/// Safety factor of the end-to-end verdict's estimate of the double replay's error from a long
/// double replay (docs/verify-model.md "The model level's fast oracle"): |x_d - x_ld| is |x_d - x_hp|
/// within a relative ~2^-11.
constexpr double kLdSafety = 4.0;

/// A row mismatch line of the end-to-end verdict.
inline void note_row_mismatch(TensorReport& t, const std::string& name, index_t i, double x, double h, double err, double allowed,
                       double e_ref) {
  Shape ix(t.shape.size());
  index_t f = i;
  for (std::size_t k = ix.size(); k-- > 0;) { ix[k] = f % t.shape[k]; f /= t.shape[k]; }
  char buf[256];
  std::snprintf(buf, sizeof buf, ": got %.9g oracle %.9g |err| %.9g allowed %.9g (2 x replay row error %.3g + floor %.3g)", x,
                h, err, allowed, e_ref, allowed - 2.0 * e_ref);
  t.first_mismatches.push_back(name + shape_str(ix) + buf);
}

/// Row parity of `got` (rows of w values) against the replay `oracle` (scalar S: double or mp50).
/// The exact replay x_hp is within E[r] of `oracle` on row r (exact: E empty, oracle = x_hp), and
/// the last step's error e_last is known to within the relative rho. Per row, with x_ref the plain
/// reference in the implementation's precision,
///   allowed = 2 max|x_ref - x_hp| + 0.5 ulp_D(max|x_hp|) + 2 max e_last,
/// and an element fails when |x - x_hp| > allowed. Differences are taken in S. With E given, each
/// element is decided on the intervals that E and rho leave (the largest and smallest allowed
/// against the error's range); false when one is left open (t is then incomplete). An exact
/// oracle decides every element.
template <class S>
bool row_verdict(const std::string& name, const StoredTensor& got, const Tensor<double>& x_ref, const Tensor<S>& oracle,
                 const std::vector<double>& E, double rho, const Tensor<double>& e_last, index_t w,
                 const CompareOptions& opt, TensorReport& t) {
  using std::abs;
  const DType D = got.dtype;
  const bool exact = E.empty();
  const index_t rows = got.values.size() / w;
  for (index_t r = 0; r < rows; ++r) {
    const double Er = exact ? 0.0 : E[static_cast<std::size_t>(r)];
    double e_ref = 0, hmax = 0, elast = 0, e_x = 0;
    for (index_t c = 0; c < w; ++c) {
      const index_t i = r * w + c;
      e_ref = std::max(e_ref, static_cast<double>(abs(S(x_ref[i]) - oracle[i])));
      hmax = std::max(hmax, std::abs(static_cast<double>(oracle[i])));
      elast = std::max(elast, e_last[i]);
    }
    const double lo = 2.0 * std::max(e_ref - Er, 0.0) + 0.5 * io::dtype_ulp(D, std::max(hmax - Er, 0.0)) +
                      2.0 * elast * (1 - rho);
    const double hi = 2.0 * (e_ref + Er) + 0.5 * io::dtype_ulp(D, hmax + Er) + 2.0 * elast * (1 + rho);
    const double allowed = 2.0 * e_ref + 0.5 * io::dtype_ulp(D, hmax) + 2.0 * elast;
    for (index_t c = 0; c < w; ++c) {
      const index_t i = r * w + c;
      const double x = got.values[i], h = static_cast<double>(oracle[i]);
      const double err = std::isfinite(x) ? static_cast<double>(abs(S(x) - oracle[i])) : INFINITY;
      const bool fails = exact ? !(err <= allowed) : err - Er > hi;
      if (!exact && !fails && !(err + Er <= lo)) return false;
      e_x = std::max(e_x, err);
      t.max_abs = std::max(t.max_abs, err);
      if (h != 0) t.max_rel = std::max(t.max_rel, err / std::abs(h));
      t.max_ulps = std::max(t.max_ulps, err / io::dtype_ulp(D, h));
      if (fails) {
        if (t.violations < opt.show) note_row_mismatch(t, name, i, x, h, err, allowed, e_ref);
        ++t.violations;
      }
    }
    t.worst_ratio = std::max(t.worst_ratio, allowed > 0 ? e_x / allowed : (e_x > 0 ? INFINITY : 0.0));
    t.checked += w;
  }
  t.passed = t.violations == 0;
  return true;
}

/// The end-to-end rows of the sublayer outputs `names` (each `<S>.output` of a trace that lacks its
/// sublayer's `.input`: a minimal trace, whose local check composes the router and the sublayer and
/// sees gross mistakes only): each judged by the row rule above against replays of the configured
/// model from the ids, named "<S>.output (end to end)". The exact replay is the double replay within
/// an error estimated per row from a long double replay (kLdSafety); a row it leaves open is judged
/// against the mp50 replay (`mp`), rounded to double. Only for traces narrower than f64 and under
/// the probabilistic and p16 policies (the estimate is not certain); `note` says which applied.
std::vector<TensorReport> sublayer_end_to_end(const oasis::model::Model<double>& d,
                                              const std::function<const oasis::model::Model<mp50>&()>& mp,
                                              const TensorMap& outputs, const std::vector<std::string>& names,
                                              const std::vector<index_t>& ids, index_t B, index_t Tn,
                                              const CompareOptions& opt, std::string& note);

}  // namespace oasis::verify::detail
