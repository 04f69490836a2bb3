// src/verify/progress.hpp — progress of a running comparison (CompareOptions::progress).
//
// The entry points of the engine (check, check_model) hold a ProgressRun for the duration of the
// comparison; while one is active, every TensorCheck reports its judged elements through a
// CheckProgress (in batches, so the element loop pays a counter increment), and a reporting
// thread calls the user's function with a snapshot about every 0.25 s, from 2 s on. One
// comparison at a time reports: one started while another is running in another thread reports
// nothing.
#pragma once

#include <string>
#include <vector>

#include "oasis/io/dtype.hpp"
#include "oasis/verify/report.hpp"

namespace oasis::verify::detail {

struct ProgressTracker;

/// Reports the comparison `op` of `outputs` through opt.progress while alive (nothing when it is
/// empty). Its totals count the floating-point tensors of `outputs` named in `checked` (empty: all
/// but the ids), the others being inputs held with the outputs.
class ProgressRun {
 public:
  ProgressRun(const CompareOptions& opt, const std::string& op, const io::TensorMap& outputs,
              const std::vector<std::string>& checked = {});
  ~ProgressRun();
  ProgressRun(const ProgressRun&) = delete;
  ProgressRun& operator=(const ProgressRun&) = delete;

 private:
  ProgressTracker* t_ = nullptr;
};

/// Names the stage the engine is in (shown as Progress::level), e.g. "long double replay"; empty:
/// the level follows the elements judged (double, mp50).
void progress_stage(const std::string& stage);

/// A TensorCheck's counts, passed on to the active ProgressRun in batches.
class CheckProgress {
 public:
  void note(bool exact) {
    ++pending_;
    pending_exact_ += exact ? 1 : 0;
    if (pending_ >= 4096) flush();
  }
  /// Takes over the unreported counts of a check merged into this one.
  void absorb(const CheckProgress& o) {
    pending_ += o.pending_;
    pending_exact_ += o.pending_exact_;
  }
  /// Reports what is pending and one tensor done.
  void finish();

 private:
  void flush();
  index_t pending_ = 0, pending_exact_ = 0;
};

}  // namespace oasis::verify::detail
