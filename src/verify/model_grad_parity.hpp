// src/verify/model_grad_parity.hpp — the gradient parity rule per row and its replays' tools, shared
// by the end-to-end gradient rows (op_model_grad.cpp) and the sublayers' local backward steps
// (model_grad_sublayer_steps.cpp); the rule and why it takes six replays: op_model_grad.cpp's header
// and docs/verify-model.md, "Model gradients".
#pragma once

#include <cfenv>
#include <cmath>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "op_support.hpp"
#include "oasis/core/multiprecision.hpp"

namespace oasis::verify::detail {

/// "i, j, k" of a flat index.
inline std::string index_of(const Shape& shape, index_t flat) {
  std::string s;
  index_t stride = 1;
  for (index_t d : shape) stride *= d;
  for (std::size_t k = 0; k < shape.size(); ++k) {
    stride /= shape[k];
    s += (k ? ", " : "") + std::to_string(flat / stride);
    flat %= stride;
  }
  return s;
}

/// The parity rule per row (header comment) of one gradient tensor.
template <class T>
TensorReport parity_rows(const std::string& name, const io::StoredTensor& got, const std::vector<Tensor<T>>& refs,
                         const Tensor<mp50>& hp, index_t N, int show) {
  if (got.values.shape() != hp.shape())
    return tensor_failure(name, got,
                          "shape " + shape_str(got.values.shape()) + " but the configured model's " + name + " has shape " +
                              shape_str(hp.shape()),
                          false);
  TensorReport r = report_of(name, got);
  r.checked = hp.size();
  const double u = io::dtype_eps(got.dtype) / 2;
  const index_t w = hp.rank() >= 2 ? hp.dim(hp.rank() - 1) : std::max<index_t>(hp.size(), 1);
  const index_t rows = hp.size() / w;
  for (index_t row = 0; row < rows; ++row) {
    double err = 0, ref_err = 0, mag = 0;
    index_t worst_i = row * w;
    bool nan = false;
    for (index_t c = 0; c < w; ++c) {
      const index_t i = row * w + c;
      const double h = static_cast<double>(hp[i]), x = got.values[i];
      const double e = std::abs(x - h);
      if (std::isnan(e)) nan = true;
      if (e > err || std::isnan(e)) { err = e; worst_i = i; }
      for (const Tensor<T>& ref : refs) ref_err = std::max(ref_err, std::abs(static_cast<double>(ref[i]) - h));
      mag = std::max(mag, std::abs(h));
      r.max_abs = std::max(r.max_abs, std::isfinite(e) ? e : r.max_abs);
      if (h != 0 && std::isfinite(e)) r.max_rel = std::max(r.max_rel, e / std::abs(h));
      if (std::isfinite(e)) r.max_ulps = std::max(r.max_ulps, e / io::dtype_ulp(got.dtype, h));
    }
    const double floor = 0.5 * io::dtype_ulp(got.dtype, mag) + 2 * 1.02 * static_cast<double>(N) * u * mag;
    const double allowed = 2 * ref_err + floor;
    const double ratio = nan ? INFINITY : err / allowed;
    r.worst_ratio = std::max(r.worst_ratio, ratio);
    if (!(err <= allowed) || nan) {
      if (static_cast<index_t>(r.first_mismatches.size()) < show) {
        std::ostringstream os;
        os.precision(9);
        os << name << " row " << row << ": max |err| " << err << " at [" << index_of(hp.shape(), worst_i) << "] (got "
           << got.values[worst_i] << ", oracle " << static_cast<double>(hp[worst_i]) << "), allowed " << allowed
           << " = 2 x replays' " << ref_err << " + floor " << floor;
        r.first_mismatches.push_back(os.str());
      }
      for (index_t c = 0; c < w; ++c)  // the elements of the row beyond its allowance
        if (!(std::abs(got.values[row * w + c] - static_cast<double>(hp[row * w + c])) <= allowed)) ++r.violations;
    }
  }
  r.passed = r.violations == 0;
  return r;
}

/// Sets the rounding mode for its lifetime (restored on exit, exceptions included).
class RoundingMode {
 public:
  explicit RoundingMode(int mode) : old_(std::fegetround()) { std::fesetround(mode); }
  ~RoundingMode() { std::fesetround(old_); }
  RoundingMode(const RoundingMode&) = delete;
  RoundingMode& operator=(const RoundingMode&) = delete;

 private:
  int old_;
};

/// grad_logits split exactly into dl = hi + lo: hi keeps the leading 12 of float's 24 (26 of
/// double's 53) significand bits, lo = dl - hi is exact (it fits in the bits hi dropped).
template <class T>
std::pair<Tensor<T>, Tensor<T>> split_cotangent(const Tensor<T>& dl) {
  const int bits = std::is_same<T, float>::value ? 12 : 26;
  std::pair<Tensor<T>, Tensor<T>> s{dl, dl};
  for (index_t i = 0; i < dl.size(); ++i) {
    int e = 0;
    const T m = std::frexp(dl[i], &e);  // dl = m 2^e, 0.5 <= |m| < 1
    s.first[i] = std::ldexp(std::trunc(std::ldexp(m, bits)), e - bits);
    s.second[i] = dl[i] - s.first[i];
  }
  return s;
}


}  // namespace oasis::verify::detail
