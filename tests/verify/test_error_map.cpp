// tests/verify/test_error_map.cpp — the ErrorMap behind the HTML report's heat maps, histograms and
// worst elements (src/verify/error_map.hpp): the block geometry, the cells, the histogram's bins,
// the order of the worst elements, and results independent of how the per-thread parts merge.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "error_map.hpp"

using oasis::index_t;
using oasis::Shape;
using oasis::verify::ErrorMap;
using oasis::verify::detail::ErrorMapBuilder;

namespace {

TEST(ErrorMap, BlocksArePowersOfTwoCoveringTheShapeWithinTheCap) {
  for (const Shape& s : {Shape{3, 5, 100000}, Shape{2, 16, 4096, 128}, Shape{7}, Shape{300, 300}, Shape{4, 8, 64}}) {
    ErrorMapBuilder b(s);
    b.note(0, 1, 1, 0, 1);
    const ErrorMap m = b.finish();
    index_t cells = 1;
    for (std::size_t d = 0; d < s.size(); ++d) {
      EXPECT_EQ(m.block[d] & (m.block[d] - 1), 0) << "block length " << m.block[d] << " is not a power of two";
      EXPECT_GE(m.blocks[d] * m.block[d], s[d]);
      EXPECT_LT((m.blocks[d] - 1) * m.block[d], s[d]);
      cells *= m.blocks[d];
    }
    EXPECT_LE(cells, ErrorMap::kMaxCells);
    EXPECT_EQ(static_cast<index_t>(m.cells.size()), cells);
  }
  ErrorMapBuilder small(Shape{4, 8, 64});  // under the cap: one element per block
  small.note(0, 1, 1, 0, 1);
  EXPECT_EQ(small.finish().block, (Shape{1, 1, 1}));
}

TEST(ErrorMap, CellsHoldTheWorstOfTheirBlock) {
  const Shape s{2, 3, 200000};  // the last axis in blocks of 32 (6 x 6250 blocks)
  ErrorMapBuilder b(s);
  auto flat = [&](index_t i, index_t j, index_t k) { return (i * 3 + j) * 200000 + k; };
  b.note(flat(1, 2, 33), 0, 0, 3.0, 2.0);   // ratio 1.5
  b.note(flat(1, 2, 40), 0, 0, 1.0, 2.0);   // 0.5, same block (32..63)
  b.note(flat(0, 0, 0), 0, 0, 0.0, 1.0);    // exact
  b.note(flat(0, 1, 5), 0, 0, std::numeric_limits<double>::quiet_NaN(), 1.0);
  b.note(flat(0, 1, 6), 0, 0, 9.0, 1.0);    // NaN stays in its block
  const ErrorMap m = b.finish();
  ASSERT_EQ(m.block.back(), 32);
  auto cell = [&](index_t i, index_t j, index_t k) { return m.cells[static_cast<std::size_t>((i * 3 + j) * m.blocks[2] + k / 32)]; };
  EXPECT_EQ(cell(1, 2, 33), 1.5f);
  EXPECT_EQ(cell(0, 0, 0), 0.0f);
  EXPECT_TRUE(std::isnan(cell(0, 1, 5)));
  EXPECT_EQ(cell(1, 1, 0), -1.0f) << "a block with nothing checked";
}

TEST(ErrorMap, HistogramBinsAndWorstOrder) {
  ErrorMapBuilder b(Shape{100});
  b.note(0, 0, 0, 0.0, 1.0);                       // exact: below 2^kHistLo
  b.note(1, 0, 0, 1.0, 1.0);                       // ratio 1: bin of [2^0, 2^1)
  b.note(2, 0, 0, 1.999, 1.0);                     // same bin
  b.note(3, 0, 0, 0.75, 1.0);                      // [2^-1, 2^0)
  b.note(4, 0, 0, 1.0, 0.0);                       // infinite ratio: the last bin
  b.note(5, 0, 0, std::ldexp(1.0, 40), 1.0);       // beyond 2^kHistHi: the last bin
  b.note(6, 0, 0, std::numeric_limits<double>::quiet_NaN(), 1.0);
  b.note(7, 0, 0, 1.0, 1.0);                       // ties 1 with element 1: after it
  const ErrorMap m = b.finish();
  const int one = 1 - ErrorMap::kHistLo;
  EXPECT_EQ(m.histogram[0], 1);
  EXPECT_EQ(m.histogram[static_cast<std::size_t>(one)], 3);
  EXPECT_EQ(m.histogram[static_cast<std::size_t>(one - 1)], 1);
  EXPECT_EQ(m.histogram.back(), 2);
  EXPECT_EQ(m.nan, 1);
  std::vector<index_t> order;
  for (const auto& w : m.worst) order.push_back(w.index[0]);
  EXPECT_EQ(order, (std::vector<index_t>{6, 4, 5, 2, 1, 7, 3, 0}));
}

TEST(ErrorMap, MergeOrderDoesNotMatter) {
  const Shape s{4, 50000};
  ErrorMapBuilder parts[3] = {ErrorMapBuilder(s), ErrorMapBuilder(s), ErrorMapBuilder(s)};
  for (index_t i = 0; i < 200000; i += 7) {
    const double err = static_cast<double>((i * 2654435761u) % 1000) * 1e-3;
    parts[i % 3].note(i, 1.0, 1.0, err, 0.5);
  }
  ErrorMapBuilder a(s), b(s);
  for (int k : {0, 1, 2}) a.merge(parts[k]);
  for (int k : {2, 0, 1}) b.merge(parts[k]);
  const ErrorMap x = a.finish(), y = b.finish();
  EXPECT_EQ(x.cells, y.cells);
  EXPECT_EQ(x.histogram, y.histogram);
  ASSERT_EQ(x.worst.size(), static_cast<std::size_t>(ErrorMap::kWorst));
  for (std::size_t i = 0; i < x.worst.size(); ++i) {
    EXPECT_EQ(x.worst[i].index, y.worst[i].index);
    EXPECT_EQ(x.worst[i].ratio, y.worst[i].ratio);
  }
  EXPECT_EQ(x.worst[0].ratio, 1.998);
}

}  // namespace
