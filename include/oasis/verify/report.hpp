// oasis/verify/report.hpp — what a comparison returns: one row per checked tensor and a verdict.
//
// The compare engine (oasis/verify/compare.hpp) fills these; `oasis-verify compare` prints
// format_report() and writes report_json(); the Python module wraps the same structures.
#pragma once

#include <string>
#include <vector>

#include "oasis/io/dtype.hpp"
#include "oasis/tensor.hpp"

namespace oasis::verify {

/// Comparison of one output tensor.
struct TensorReport {
  std::string name;
  io::DType dtype = io::DType::f32;
  Shape shape;
  index_t elements = 0;
  double max_abs = 0;        ///< max |x - ref|
  double max_rel = 0;        ///< max |x - ref| / |ref| over ref != 0
  double max_ulps = 0;       ///< max |x - ref| / ulp_D(ref): error in units of D's precision
  double worst_ratio = 0;    ///< max |x - ref| / bound (<= 1 passes)
  index_t violations = 0;    ///< elements outside the bound (NaN counts)
  std::vector<std::string> first_mismatches;  ///< "name[i, j]: got .. ref .. |err| .. bound .."
  bool passed = false;
  /// Reported for information only, no verdict; `passed` is then true and ignored.
  bool informative = false;
  std::string problem;       ///< a whole-tensor failure (shape mismatch), empty otherwise
};

struct CompareReport {
  std::string op;
  std::vector<TensorReport> tensors;
  std::vector<std::string> notes;  ///< e.g. what the comparison could not see
  bool passed = false;
};

/// Options of the comparison (not of the op).
struct CompareOptions {
  int show = 5;  ///< mismatching elements listed per tensor
};

/// Human-readable report (one line per tensor, its first mismatches, the notes, the verdict).
std::string format_report(const CompareReport& r);
/// The report as a JSON document.
std::string report_json(const CompareReport& r);

}  // namespace oasis::verify
