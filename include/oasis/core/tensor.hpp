// oasis/core/tensor.hpp — a small dense, row-major (C order) tensor: shape + contiguous storage.
//
// C order matches NumPy/PyTorch contiguous tensors, so a user's buffer maps in without copies.
// Which shape each function takes: docs/conventions.md ("tensor layout") and its header.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "oasis/core/error.hpp"
#include "oasis/core/huge_pages.hpp"
#include "oasis/core/scalar.hpp"

namespace oasis {

using Shape = std::vector<index_t>;

inline std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

/// Product of dimensions, or false when a dimension is negative or the product exceeds `cap`
/// (checked, no overflow). The product of the non-zero dimensions must also fit index_t, so that
/// no size computation on the shape can overflow, even for a shape such as [2^40, 2^40, 0].
inline bool checked_numel(const Shape& shape, std::uint64_t cap, std::uint64_t* numel) {
  std::uint64_t n = 1;
  bool zero = false;
  for (index_t d : shape) {
    if (d < 0) return false;
    if (d == 0) { zero = true; continue; }
    const std::uint64_t ud = static_cast<std::uint64_t>(d);
    if (n > static_cast<std::uint64_t>(INT64_MAX) / ud) return false;
    n *= ud;
  }
  *numel = zero ? 0 : n;
  return *numel <= cap;
}

/// Number of elements of a shape; invalid_argument naming `arg` when a dimension is negative or
/// the product does not fit index_t.
inline index_t shape_numel(const Shape& s, const char* arg = "shape") {
  for (index_t d : s) OASIS_REQUIRE(d >= 0, arg, "negative dimension in ", shape_str(s));
  std::uint64_t n = 0;
  OASIS_REQUIRE(checked_numel(s, static_cast<std::uint64_t>(INT64_MAX), &n), arg, "shape ", shape_str(s),
                " has more elements than an index_t can count (the product of its dimensions overflows)");
  return static_cast<index_t>(n);
}

template <class T>
class Tensor {
 public:
  using value_type = T;

  Tensor() = default;
  explicit Tensor(Shape shape, const T& fill = T(0)) : shape_(std::move(shape)) {
    resize_advised(data_, static_cast<std::size_t>(shape_numel(shape_)), fill);
  }
  Tensor(Shape shape, std::vector<T> data) : shape_(std::move(shape)), data_(std::move(data)) {
    OASIS_REQUIRE(static_cast<index_t>(data_.size()) == shape_numel(shape_), "data",
                  "has ", data_.size(), " elements but shape ", shape_str(shape_), " needs ",
                  shape_numel(shape_));
  }

  const Shape& shape() const noexcept { return shape_; }
  index_t rank() const noexcept { return static_cast<index_t>(shape_.size()); }
  index_t dim(index_t i) const { return shape_.at(static_cast<std::size_t>(i)); }
  index_t size() const noexcept { return static_cast<index_t>(data_.size()); }
  bool empty() const noexcept { return data_.empty(); }

  T* data() noexcept { return data_.data(); }
  const T* data() const noexcept { return data_.data(); }
  std::vector<T>& storage() noexcept { return data_; }
  const std::vector<T>& storage() const noexcept { return data_; }

  T& operator[](index_t i) { return data_[static_cast<std::size_t>(i)]; }
  const T& operator[](index_t i) const { return data_[static_cast<std::size_t>(i)]; }

  /// Flat offset of a multi-index (row-major). Unchecked in release builds.
  template <class... I>
  index_t offset(I... idx) const {
    const index_t ix[] = {static_cast<index_t>(idx)...};
    index_t off = 0;
    for (std::size_t d = 0; d < sizeof...(I); ++d) off = off * shape_[d] + ix[d];
    return off;
  }
  template <class... I> T& operator()(I... idx) { return data_[static_cast<std::size_t>(offset(idx...))]; }
  template <class... I> const T& operator()(I... idx) const {
    return data_[static_cast<std::size_t>(offset(idx...))];
  }

  /// Pointer to the contiguous sub-tensor selected by fixing the leading indices.
  template <class... I> T* ptr(I... lead) { return data() + offset_lead(lead...); }
  template <class... I> const T* ptr(I... lead) const { return data() + offset_lead(lead...); }

  /// Element-wise conversion (e.g. float -> high precision for a reference run).
  template <class U> Tensor<U> cast() const {
    // The default tensor (no shape, no elements: an absent optional argument such as a gain) casts
    // to the default tensor, not to a rank-0 tensor of one element.
    if (shape_.empty() && data_.empty()) return Tensor<U>{};
    Tensor<U> out(shape_);
    for (index_t i = 0; i < size(); ++i) out[i] = static_cast<U>((*this)[i]);
    return out;
  }

  /// A copy with a new shape of the same number of elements.
  Tensor reshaped(Shape s) const {
    OASIS_REQUIRE(shape_numel(s) == size(), "shape", "cannot reshape ", shape_str(shape_), " to ",
                  shape_str(s));
    return Tensor(std::move(s), data_);
  }

 private:
  template <class... I> index_t offset_lead(I... lead) const {
    const index_t ix[] = {0, static_cast<index_t>(lead)...};
    index_t off = 0;
    for (std::size_t d = 0; d < sizeof...(I); ++d) off = off * shape_[d] + ix[d + 1];
    index_t inner = 1;
    for (std::size_t d = sizeof...(I); d < shape_.size(); ++d) inner *= shape_[d];
    return off * inner;
  }

  Shape shape_;
  std::vector<T> data_;
};

/// Require a tensor to have exactly `rank` dimensions; names the argument otherwise.
template <class T>
void require_rank(const Tensor<T>& t, index_t rank, const char* arg, const char* layout) {
  OASIS_REQUIRE(t.rank() == rank, arg, "expected rank ", rank, " ", layout, ", got shape ",
                shape_str(t.shape()));
}

/// True when the n values at x (float or double; n a multiple of 16) are all finite, without a
/// branch per element: x * 0 is 0 for a finite x and NaN for NaN or +-inf, so 16 independent lane
/// sums stay 0 exactly when every value is finite (the compiler vectorises the lanes).
template <class T>
bool finite_lanes(const T* x, index_t n) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  constexpr index_t kLanes = 16;
  T acc[kLanes] = {};
  for (index_t i = 0; i < n; i += kLanes)
    for (index_t l = 0; l < kLanes; ++l) acc[l] += x[i + l] * T(0);
  bool finite = true;
  for (index_t l = 0; l < kLanes; ++l) finite = finite && acc[l] == T(0);
  return finite;
}

/// Require every element to be finite (no NaN, no +-inf); names argument and first bad index.
/// For float and double, blocks of 1024 are first scanned by finite_lanes; the element-wise search
/// names the first bad index from the first block that is not finite.
template <class T>
void require_finite(const Tensor<T>& t, const char* arg) {
  index_t from = 0;
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    constexpr index_t kBlock = 1024;
    while (from + kBlock <= t.size() && finite_lanes(t.data() + from, kBlock)) from += kBlock;
  }
  for (index_t i = from; i < t.size(); ++i)
    OASIS_REQUIRE(is_finite(t[i]), arg, "non-finite value ", to_double(t[i]), " at flat index ", i);
}

}  // namespace oasis
