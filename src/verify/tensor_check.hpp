// src/verify/tensor_check.hpp — one output tensor judged element by element on the two lines of
// the policy (oasis/verify/policy.hpp), with the reference's own error folded into each decision.
//
// For element i with reference r (hi + lo, within `err` of the exact value), the allowed errors
// besides the rounding floor are the policy term E and the certain term C:
//   certain line   T_c = 0.5 ulp_D(r) + C
//   policy line    T_p = min(T_c, 0.5 ulp_D(r) + E)            (E of an f32/f64 output)
//                  T_p = min(T_c, 0.5 ulp_D(|r| + E) + E)       (storage: f16/bf16 rounded once from float)
// The exact error |x - exact| lies within |x - r| ± err, and the terms within a relative rho of
// their values at the exact reference; a line is decided when the whole interval is on one side of
// its bound. add() returns false for an element with an undecided line: its reference must be
// recomputed exactly (mp50; err = rho = 0, decisions exact) and the element added again.
#pragma once

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "oasis/io/dtype.hpp"
#include "oasis/core/multiprecision.hpp"
#include "oasis/verify/report.hpp"
#include "error_map.hpp"
#include "progress.hpp"

namespace oasis::verify::detail {

/// The reference of one element.
struct RefValue {
  double hi = 0, lo = 0;         ///< reference = hi + lo
  double err = 0;                ///< bound on |hi + lo - exact|
  const mp50* exact = nullptr;   ///< the mp50 value when known (then decisions are exact)
};

/// The allowed error terms of one element besides the rounding floor 0.5 ulp_D(ref).
struct Allowed {
  double policy = 0;     ///< E
  double certain = 0;    ///< C = 2 B(D)
  bool storage = false;  ///< the policy line takes the 16-bit storage form
  double rho = 0;        ///< relative uncertainty of E and C
};

class TensorCheck {
 public:
  TensorCheck(std::string name, const io::StoredTensor& got, int show);
  /// Judges element `flat` (a flat index of `got`); false when a line is undecided (nothing recorded).
  bool add(index_t flat, const RefValue& ref, const Allowed& a);
  /// Records element `flat` as left undecided (TensorReport::undecided): not judged, never PASS.
  void leave_undecided(index_t flat);
  /// True once some element lies outside the certain bound: the tensor's verdict is FAIL-certain
  /// whatever its undecided elements are.
  bool failed_certain() const { return violations_certain_ > 0; }
  /// Adds the counts of another check of the same tensor (disjoint elements).
  void merge(const TensorCheck& o);
  /// The report; `bound` describes the policy's bound for this tensor.
  TensorReport finish(const std::string& bound) const;

 private:
  /// A mismatching element, formatted only if it is listed (the failing path stays as fast as the
  /// passing one).
  struct Mismatch {
    index_t flat;
    double got, ref, dist, bound, certain;
    bool pass_certain;
    bool operator<(const Mismatch& o) const { return flat < o.flat; }
  };
  void note_mismatch(const Mismatch& m);
  std::string describe(const Mismatch& m) const;
  std::string name_;
  const io::StoredTensor* got_;
  int show_;
  index_t checked_ = 0, violations_ = 0, violations_certain_ = 0, undecided_ = 0;
  double max_abs_ = 0, max_rel_ = 0, worst_ = 0, worst_certain_ = 0;
  /// The largest |x - r| + err and (|x - r| + err) / policy bound: what the figures of elements
  /// judged against a double reference can be at most (the report states it when it matters).
  double abs_hi_ = 0, ratio_hi_ = 0;
  bool nan_ = false;
  double sum_sq_ = 0;       ///< of the finite references (for the ulps scale)
  index_t n_sq_ = 0;
  std::array<double, 2200> max_err_by_binade_{};  ///< max |err| per binade of |ref| (index ilogb + 1100)
  double max_err_zero_ = 0;                       ///< max |err| at ref = 0
  std::vector<Mismatch> mismatches_;
  std::vector<index_t> undecided_at_;  ///< the first undecided elements (at most 4 show_ kept)
  ErrorMapBuilder map_;               ///< where the errors lie (TensorReport::map)
  mutable CheckProgress progress_;   ///< the elements judged (CompareOptions::progress)
};

/// The report of `got` before any verdict: its name, dtype, shape and element count.
TensorReport report_of(const std::string& name, const io::StoredTensor& got);
/// A whole-tensor failure stating `problem`; `certain`: a proof that the tensor is wrong (FAIL-certain).
TensorReport tensor_failure(const std::string& name, const io::StoredTensor& got, std::string problem, bool certain);
/// A tensor whose shape differs from the oracle's: the whole tensor fails, naming both shapes.
TensorReport shape_mismatch(const std::string& name, const io::StoredTensor& got, const Shape& want);

}  // namespace oasis::verify::detail
