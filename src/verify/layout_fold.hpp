// src/verify/layout_fold.hpp — what the packed (THD) and paged checks of ops attention and
// attention_backward share (op_varlen.cpp, op_paged.cpp): the per-sequence dense calls they build
// and the folding of those calls' reports into one report on the packed tensors.
//
// A packed or paged call is checked as B dense calls of the registered op (its own run function,
// so every bound is the dense op's), one per sequence; each report's tensors are parts of the
// packed tensors. The fold sums the element counts, takes the maxima of the error figures, and maps
// every listed element (first mismatches, first undecided, the worst elements of the error map)
// back to its packed index. The heat map of a packed tensor places each sequence's blocks at their
// packed elements (a cell holds the maximum of the sequence blocks it overlaps).
#pragma once

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "error_map.hpp"
#include "op_support.hpp"

namespace oasis::verify::detail {

/// Adds a part's counts (checked, violations, undecided) to `into` and takes the maxima of the
/// error figures (NaN wins); passed and certain_failure combine. Shared by the packed folds and
/// attention_merge's per-split folds.
void fold_counts(TensorReport& into, const TensorReport& part);

/// The dense op a packed or paged call delegates each sequence to.
using DenseRun = std::function<CompareReport(const OpCall&)>;

/// Where a sequence's dense tensor lies in the packed one: its shape and dense flat -> packed flat.
struct PartPlace {
  Shape dense;
  std::function<index_t(index_t)> packed;
};
/// A part stored contiguously from packed flat index `offset`.
PartPlace contiguous_part(const Shape& dense, index_t offset);
/// Columns [c0, c0 + n) of a [H, total] statistic stored as the dense [1, H, n].
PartPlace stat_part(index_t H, index_t total, index_t c0, index_t n);

class ReportFold {
 public:
  /// `outputs`: the packed call's outputs (the folded tensors keep their name, dtype and shape).
  ReportFold(const TensorMap& outputs, int show) : outputs_(outputs), show_(show) {}
  /// The report of one dense call, `label` naming its part ("sequence 3"), its tensors placed by name.
  void add(const CompareReport& part, const std::string& label, const std::map<std::string, PartPlace>& where);
  /// A packed tensor judged as a whole (a shape mismatch).
  void whole(TensorReport r) { whole_.push_back(std::move(r)); }
  /// The comparison options of the next part: the mp50 budget less the parts' work so far.
  CompareOptions part_options(const CompareOptions& c) const {
    CompareOptions o = c;
    o.mp50_budget = std::max(0.0, c.mp50_budget - mp50_work_);
    return o;
  }
  /// The folded report; `parts`: what the dense calls were ("3 sequences, each a dense call").
  CompareReport finish(const std::string& parts);

 private:
  struct Acc {
    TensorReport r;
    bool seen = false;
    double bound_ratio = -1;  ///< worst_ratio of the part whose bound text is kept
    std::vector<std::pair<index_t, std::string>> mismatches, undecided;
    std::vector<std::pair<index_t, ElementError>> worst;
    std::vector<index_t> hist;
    index_t nan = 0;
    std::vector<std::pair<index_t, float>> cells;  ///< (packed flat, part cell value)
  };
  void fold_tensor(Acc& a, const TensorReport& t, const PartPlace& p, const std::string& label);
  const TensorMap& outputs_;
  int show_;
  std::map<std::string, Acc> acc_;
  std::vector<TensorReport> whole_;
  struct OracleLine {
    std::string tmpl;               ///< the line with its counts as '#'
    std::vector<long long> counts;  ///< summed over the parts
    std::vector<std::string> labels;
  };
  std::vector<std::pair<std::string, std::vector<std::string>>> notes_;
  std::vector<OracleLine> oracles_;
  double mp50_work_ = 0;
  index_t mp50_rows_ = 0;
};

/// Whether output `name` is given with the shape `want`; given with another shape, it is folded as
/// a whole-tensor failure (shape_mismatch) and not split.
bool placed(const TensorMap& outputs, const std::string& name, const Shape& want, ReportFold& fold);

/// A report on `slice` (stored as `name`) whose every element must be exactly 0: gradients of keys
/// no query sees, the null logits' partial gradient of a sequence without queries.
CompareReport zero_report(const std::string& name, const io::StoredTensor& slice, int show, const std::string& why);

/// A stored tensor with other values (the dtype kept).
inline io::StoredTensor stored(const io::StoredTensor& like, Tensor<double> values) { return {like.dtype, std::move(values)}; }

/// The options of a dense call: `o` less the keys `drop`, plus `set`.
io::json::Value dense_options(const Options& o, const std::vector<std::string>& drop,
                              const std::vector<std::pair<std::string, io::json::Value>>& set);
/// JSON values for dense_options.
io::json::Value json_string(const std::string& s);
io::json::Value json_integers(const std::vector<index_t>& v);

/// An integer input (int32 or int64) of `rank` dimensions, its values as index_t; `shape` for messages.
Tensor<index_t> integer_input(const TensorMap& in, const std::string& name, index_t rank, const std::string& shape);

}  // namespace oasis::verify::detail
