// oasis/verify/report.hpp — what a comparison returns: one row per checked tensor and a verdict.
//
// The compare engine (oasis/verify/compare.hpp) fills these; `oasis-verify compare` prints
// format_report() and writes report_json() and report_html(); the Python module wraps the same
// structures.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "oasis/io/dtype.hpp"
#include "oasis/core/tensor.hpp"
#include "oasis/verify/policy.hpp"

namespace oasis::verify {

/// One judged element: where it is, what it holds, how far from its bound.
struct ElementError {
  Shape index;         ///< its coordinates in the tensor
  double got = 0, ref = 0;
  double err = 0;      ///< |got - ref| (NaN for a NaN element)
  double bound = 0;    ///< the policy's bound at this element
  double ratio = 0;    ///< err / bound (NaN for a NaN element)
};

/// Where a tensor's errors lie (the heat maps, histogram and worst elements of report_html()),
/// filled where its elements are judged; empty for a tensor judged as a whole (a shape mismatch,
/// the model level's end-to-end verdict).
struct ErrorMap {
  static constexpr index_t kMaxCells = 65536;
  static constexpr int kHistLo = -24, kHistHi = 24;  ///< histogram range of err/bound: [2^kHistLo, 2^kHistHi)
  static constexpr int kWorst = 10;
  /// Blocks per axis: each axis of the tensor divided by the power of two in `block`, halving the
  /// longest axis until there are at most kMaxCells blocks.
  Shape blocks;
  Shape block;               ///< elements per block along each axis
  /// Per block (row-major over `blocks`): max err/bound over its checked elements; -1: none
  /// checked (unsampled rows); NaN: a NaN element.
  std::vector<float> cells;
  /// Counts of err/bound: [0] below 2^kHistLo (exact elements included), [1 + k - kHistLo] in
  /// [2^k, 2^(k+1)), the last at or above 2^kHistHi (infinite included). NaN elements in `nan`.
  std::vector<index_t> histogram;
  index_t nan = 0;
  std::vector<ElementError> worst;  ///< the largest err/bound first (NaN first), at most kWorst
  bool empty() const { return cells.empty(); }
};

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
  /// Elements the double oracle left undecided and mp50 did not settle: past the mp50 budget, or
  /// not needed because the tensor is already FAIL-certain (docs/policies.md, "Failing fast").
  /// They are not in `checked`; a tensor with any is never PASS.
  index_t undecided = 0;
  std::vector<std::string> first_undecided;  ///< "name[i, j]" of the first undecided elements
  std::vector<std::string> first_mismatches;  ///< "name[i, j]: got .. ref .. |err| .. bound .."
  bool passed = false;       ///< no element outside the policy bound, and none undecided
  bool certain_failure = false;  ///< some element outside the certain bound (FAIL-certain)
  /// Reported for information only, no verdict; `passed` is then true and ignored.
  bool informative = false;
  std::string problem;       ///< a whole-tensor failure (shape mismatch), empty otherwise
  std::string step;          ///< model level: the producer it was checked against
  ErrorMap map;              ///< where its errors lie (report_html)
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
  /// The work of the mp50 fallback, counted from the shapes (deterministic): rows recomputed and
  /// their estimated mp50 multiply-adds (docs/policies.md, "Failing fast").
  index_t mp50_rows = 0;
  double mp50_work = 0;
  SampleInfo sample;
};

/// How far a running comparison has got (CompareOptions::progress).
struct Progress {
  std::string op;
  index_t tensors_done = 0, tensors_total = 0;    ///< tensors judged, of the outputs given
  index_t elements_done = 0, elements_total = 0;  ///< elements judged, of the outputs' (0: not known, e.g. sampled)
  index_t elements_mp50 = 0;  ///< of elements_done, judged against an mp50 reference
  /// The oracle at work: "double", "mp50", "double, N elements recomputed in mp50", or a stage the
  /// engine names ("long double replay", "mp50 replay").
  std::string level;
  double seconds = 0;      ///< since the comparison started
  bool finished = false;   ///< the last call, at the end of the comparison
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
  /// The budget of the mp50 fallback of the fast oracle (docs/policies.md, "Failing fast"): the
  /// elements the double reference leaves undecided are recomputed in mp50 only while the estimated
  /// mp50 multiply-adds and the bytes of mp50 values held stay within these. Past the budget they
  /// stay undecided, the report names where, and the verdict is not PASS.
  double mp50_budget = 6e8;  // about a minute on two cores (mp50: about 5e6 multiply-adds per second per core)
  double mp50_memory = 4e9;
  /// Called about every 0.25 s, from a thread of its own, once the comparison has run 2 s, and
  /// once more at its end (Progress::finished) if it was called; empty: no progress.
  std::function<void(const Progress&)> progress;
};

/// The verdict word of a tensor: PASS, FAIL, FAIL-certain, UNDECIDED (no element outside the
/// bound, some left undecided: docs/policies.md, "Failing fast") or INFO (informative, no verdict).
std::string verdict_word(const TensorReport& t);
/// The verdict word of a report: PASS, or the strongest of its tensors' FAIL-certain, FAIL, UNDECIDED.
std::string verdict_word(const CompareReport& r);

/// Human-readable report (one line per tensor, its first mismatches, the notes, the verdict).
std::string format_report(const CompareReport& r);
/// The report as a JSON document.
std::string report_json(const CompareReport& r);
/// The report as one self-contained HTML page (no network; script and styles inline): per tensor
/// heat maps of err/bound, its histogram against the bound, the worst elements; at model level the
/// steps in forward order with the first wrong one marked (docs/report.md).
std::string report_html(const CompareReport& r);
/// A CompareOptions::progress that redraws one status line on stderr; empty (no progress) when
/// stderr is not a terminal.
std::function<void(const Progress&)> terminal_progress();

}  // namespace oasis::verify
