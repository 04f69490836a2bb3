// src/verify/error_map.hpp — gathers a tensor's ErrorMap (oasis/verify/report.hpp) while its
// elements are judged: max err/bound per block, the histogram of err/bound, the worst elements.
//
// One builder per TensorCheck; the builders of one tensor's disjoint parts (the per-thread checks)
// merge. Every part of the result is independent of the order of notes and merges (maxima, counts,
// and the worst elements ordered by ratio, then by flat index), so reports are deterministic.
#pragma once

#include <vector>

#include "oasis/verify/report.hpp"

namespace oasis::verify::detail {

class ErrorMapBuilder {
 public:
  explicit ErrorMapBuilder(const Shape& shape);
  /// Element `flat` holding `got`, reference `ref`, error `err` (NaN for a NaN got) and bound `bound`.
  void note(index_t flat, double got, double ref, double err, double bound);
  void merge(const ErrorMapBuilder& o);
  ErrorMap finish() const;

 private:
  struct Worst {
    index_t flat;
    double got, ref, err, bound, ratio;
  };
  static bool worse(const Worst& a, const Worst& b);  ///< a ranks before b
  index_t cell_of(index_t flat);

  Shape shape_, blocks_;
  std::vector<int> shift_;         ///< log2 of the block length per axis
  std::vector<index_t> cstride_;   ///< row-major strides over the blocks
  index_t cells_n_ = 1;
  /// The last row (flat indices [row_lo_, row_lo_ + its length)) and its first cell: elements
  /// are mostly judged row by row, so cell_of divides once per row.
  index_t row_lo_ = -1, row_cell_ = 0;
  std::vector<float> cells_;       ///< allocated at the first note
  index_t lo_ = 0, hi_ = -1;       ///< the cells touched, [lo_, hi_]
  std::vector<index_t> hist_;
  index_t nan_ = 0;
  std::vector<Worst> worst_;       ///< sorted, at most ErrorMap::kWorst
};

}  // namespace oasis::verify::detail
