// oasis/verify/report.hpp — what a comparison returns: one row per checked tensor and a verdict.
//
// The compare engine (oasis/verify/compare.hpp) fills these; `oasis-verify compare` prints
// format_report() and writes report_json(); the Python module wraps the same structures.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "oasis/io/dtype.hpp"
#include "oasis/core/tensor.hpp"
#include "oasis/verify/policy.hpp"

namespace oasis::verify {

/// Comparison of one output tensor (policies: oasis/verify/policy.hpp).
struct TensorReport {
  std::string name;
  io::DType dtype = io::DType::f32;
  Shape shape;
  index_t elements = 0;      ///< elements of the tensor
  index_t checked = 0;       ///< elements compared (fewer than `elements` when rows are sampled)
  std::string bound;         ///< the policy's bound for this tensor, e.g. "probabilistic (f32)"
  double max_abs = 0;        ///< max |x - ref| (inf for NaN or a wrong infinity)
  double max_rel = 0;        ///< max |x - ref| / |ref| over ref != 0
  /// max |x - ref| / ulp_D(max(|ref|, rms)): error in units of D's precision at the element's
  /// magnitude, or at the tensor's root-mean-square reference when the element is smaller, so that
  /// near-zero references do not dominate.
  double max_ulps = 0;
  double worst_ratio = 0;    ///< max |x - ref| / policy bound (<= 1 passes)
  double worst_ratio_certain = 0;  ///< max |x - ref| / certain bound
  index_t violations = 0;    ///< elements outside the policy bound (NaN counts)
  index_t violations_certain = 0;  ///< elements outside the certain bound
  std::vector<std::string> first_mismatches;  ///< "name[i, j]: got .. ref .. |err| .. bound .."
  bool passed = false;       ///< no element outside the policy bound
  bool certain_failure = false;  ///< some element outside the certain bound (FAIL-certain)
  /// Reported for information only, no verdict; `passed` is then true and ignored.
  bool informative = false;
  std::string problem;       ///< a whole-tensor failure (shape mismatch), empty otherwise
};

/// Rows checked when a comparison samples (CompareOptions::sample).
struct SampleInfo {
  index_t rows = 0;          ///< rows checked (0: every row)
  index_t total = 0;         ///< rows of the op
  std::uint64_t seed = 0;
  std::string row_kind;      ///< what a row is, e.g. "(b, h, t)"
  std::vector<std::string> which;  ///< the rows checked, in order
};

struct CompareReport {
  std::string op;
  std::vector<TensorReport> tensors;
  std::vector<std::string> notes;  ///< e.g. what the comparison could not see
  bool passed = false;
  std::string policy = "probabilistic";
  std::string oracle = "mp50";     ///< which oracle computed the reference, e.g. "fast (double; 2 rows in mp50)"
  SampleInfo sample;
};

/// Options of the comparison (not of the op).
struct CompareOptions {
  int show = 5;                          ///< mismatching elements listed per tensor
  Policy policy = Policy::probabilistic;
  Oracle oracle = Oracle::fast;
  /// Check this many rows drawn at random (0: all rows); a row is what one query (attention), one
  /// token (depth, coupling) or one row of logits (normalizer) produces. Other ops check all.
  index_t sample = 0;
  std::uint64_t seed = 20261129;         ///< of the sample
};

/// Human-readable report (one line per tensor, its first mismatches, the notes, the verdict).
std::string format_report(const CompareReport& r);
/// The report as a JSON document.
std::string report_json(const CompareReport& r);

}  // namespace oasis::verify
