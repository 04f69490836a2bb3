// src/verify/error_map.cpp — the ErrorMapBuilder of error_map.hpp.
#include "error_map.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace oasis::verify::detail {
namespace {
const double kRatioLo = std::ldexp(1.0, ErrorMap::kHistLo), kRatioHi = std::ldexp(1.0, ErrorMap::kHistHi);
}  // namespace

ErrorMapBuilder::ErrorMapBuilder(const Shape& shape)
    : shape_(shape), blocks_(shape), shift_(shape.size(), 0), cstride_(shape.size(), 1),
      hist_(static_cast<std::size_t>(ErrorMap::kHistHi - ErrorMap::kHistLo + 2), 0) {
  // halve the longest axis (in blocks) until at most kMaxCells blocks remain
  auto count = [&] {
    index_t n = 1;
    for (index_t b : blocks_) n *= std::max<index_t>(b, 1);
    return n;
  };
  while (!blocks_.empty() && count() > ErrorMap::kMaxCells) {
    const auto d = static_cast<std::size_t>(std::max_element(blocks_.begin(), blocks_.end()) - blocks_.begin());
    ++shift_[d];
    blocks_[d] = (shape_[d] + (index_t(1) << shift_[d]) - 1) >> shift_[d];
  }
  cells_n_ = count();
  for (std::size_t d = blocks_.size(); d-- > 1;) cstride_[d - 1] = cstride_[d] * std::max<index_t>(blocks_[d], 1);
}

index_t ErrorMapBuilder::cell_of(index_t flat) {
  if (shape_.empty()) return 0;
  const index_t len = shape_.back();
  if (row_lo_ < 0 || flat < row_lo_ || flat >= row_lo_ + len) {
    row_lo_ = flat - flat % len;
    index_t cell = 0, f = row_lo_;
    for (std::size_t d = shape_.size(); d-- > 0;) {
      cell += ((f % shape_[d]) >> shift_[d]) * cstride_[d];
      f /= shape_[d];
    }
    row_cell_ = cell;
  }
  return row_cell_ + ((flat - row_lo_) >> shift_.back());
}

bool ErrorMapBuilder::worse(const Worst& a, const Worst& b) {
  const bool na = std::isnan(a.ratio), nb = std::isnan(b.ratio);
  if (na != nb) return na;
  if (!na && a.ratio != b.ratio) return a.ratio > b.ratio;
  return a.flat < b.flat;
}

void ErrorMapBuilder::note(index_t flat, double got, double ref, double err, double bound) {
  const double ratio = std::isnan(err) ? err : bound > 0 ? err / bound : (err > 0 ? HUGE_VAL : 0.0);
  if (cells_.empty()) cells_.assign(static_cast<std::size_t>(cells_n_), -1.0f);
  const index_t c = cell_of(flat);
  float& cell = cells_[static_cast<std::size_t>(c)];
  if (std::isnan(ratio)) cell = std::numeric_limits<float>::quiet_NaN();
  else if (!std::isnan(cell)) cell = std::max(cell, static_cast<float>(ratio));
  if (hi_ < lo_) lo_ = hi_ = c;
  lo_ = std::min(lo_, c);
  hi_ = std::max(hi_, c);
  if (std::isnan(ratio)) {
    ++nan_;
  } else {
    int bin = 0;
    if (ratio >= kRatioHi) bin = ErrorMap::kHistHi - ErrorMap::kHistLo + 1;
    else if (ratio >= kRatioLo) {
      std::uint64_t bits;  // a normal double: its binade is the biased exponent less 1023
      std::memcpy(&bits, &ratio, sizeof bits);
      bin = 1 + static_cast<int>((bits >> 52) & 0x7ff) - 1023 - ErrorMap::kHistLo;
    }
    ++hist_[static_cast<std::size_t>(bin)];
  }
  const Worst w{flat, got, ref, err, bound, ratio};
  if (worst_.size() == static_cast<std::size_t>(ErrorMap::kWorst) && !worse(w, worst_.back())) return;
  worst_.insert(std::upper_bound(worst_.begin(), worst_.end(), w, worse), w);
  if (worst_.size() > static_cast<std::size_t>(ErrorMap::kWorst)) worst_.pop_back();
}

void ErrorMapBuilder::merge(const ErrorMapBuilder& o) {
  if (o.hi_ >= o.lo_) {
    if (cells_.empty()) cells_.assign(static_cast<std::size_t>(cells_n_), -1.0f);
    for (index_t c = o.lo_; c <= o.hi_; ++c) {
      float& a = cells_[static_cast<std::size_t>(c)];
      const float b = o.cells_[static_cast<std::size_t>(c)];
      if (std::isnan(b)) a = b;
      else if (!std::isnan(a)) a = std::max(a, b);
    }
    lo_ = hi_ < lo_ ? o.lo_ : std::min(lo_, o.lo_);
    hi_ = std::max(hi_, o.hi_);
  }
  for (std::size_t i = 0; i < hist_.size(); ++i) hist_[i] += o.hist_[i];
  nan_ += o.nan_;
  std::vector<Worst> all = worst_;
  all.insert(all.end(), o.worst_.begin(), o.worst_.end());
  std::sort(all.begin(), all.end(), worse);
  all.resize(std::min(all.size(), static_cast<std::size_t>(ErrorMap::kWorst)));
  worst_ = std::move(all);
}

ErrorMap ErrorMapBuilder::finish() const {
  ErrorMap m;
  if (cells_.empty()) return m;
  m.blocks = blocks_;
  for (int s : shift_) m.block.push_back(index_t(1) << s);
  m.cells = cells_;
  m.histogram = hist_;
  m.nan = nan_;
  for (const Worst& w : worst_) {
    Shape ix(shape_.size());
    index_t f = w.flat;
    for (std::size_t d = shape_.size(); d-- > 0;) {
      ix[d] = shape_[d] ? f % shape_[d] : 0;
      f = shape_[d] ? f / shape_[d] : 0;
    }
    m.worst.push_back({ix, w.got, w.ref, w.err, w.bound, w.ratio});
  }
  return m;
}

}  // namespace oasis::verify::detail
