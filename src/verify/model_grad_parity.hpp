// src/verify/model_grad_parity.hpp — the gradient parity rule per row and its replays' tools, shared
// by the end-to-end gradient rows (op_model_grad.cpp) and the sublayers' local backward steps
// (model_grad_sublayer_steps.cpp); the rule and why it takes six replays: op_model_grad.cpp's header
// and docs/verify-model.md, "Model gradients".
#pragma once

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <map>
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

/// Rows of a gradient tensor for the parity rule: the last axis is a row (a rank <= 1 tensor is one).
inline index_t parity_row_width(const Shape& s) {
  index_t n = 1;
  for (index_t d : s) n *= d;
  return s.size() >= 2 ? std::max<index_t>(s.back(), 1) : std::max<index_t>(n, 1);
}

/// acc[row] = max(acc[row], max_c |x - ref|) over the rows of x (acc sized on first use): one
/// replay's row errors folded into the largest so far; a NaN difference wins (the row cannot be
/// judged, parity_rows leaves it undecided).
template <class T, class R>
void add_row_deviation(std::vector<double>& acc, const Tensor<T>& x, const Tensor<R>& ref) {
  const index_t w = parity_row_width(ref.shape()), rows = ref.size() / w;
  acc.resize(static_cast<std::size_t>(rows), 0.0);
  for (index_t row = 0; row < rows; ++row) {
    double m = acc[static_cast<std::size_t>(row)];
    for (index_t i = row * w; i < (row + 1) * w; ++i) {
      const double d = std::abs(static_cast<double>(x[i]) - static_cast<double>(ref[i]));
      if (!(d <= m)) m = d;
    }
    acc[static_cast<std::size_t>(row)] = m;
  }
}

/// Safety factor of the fast oracle's estimate of its own row error (docs/verify-model.md, "Model
/// gradients: the fast oracle").
constexpr double kDoubleFromFloatSafety = 1024.0;

/// The fast oracle's estimate of |x_d - x_exact| per row of a double gradient x_d whose float
/// replays deviate from it by dev32[row]: the same chain evaluated at u = 2^-53 instead of 2^-24,
///   E_row = 1024 * 2^-29 * dev32[row] + 2^-53 max_c |x_d|.
/// The float replays realise the chain's sensitivity to rounding (weights rounded to float
/// included, which the double chain does not have: an over-estimate there); an estimate, not a
/// bound: a row whose double error exceeds 1024 times its share of the float replays' is missed.
template <class R>
std::vector<double> double_row_error(const std::vector<double>& dev32, const Tensor<R>& xd) {
  const index_t w = parity_row_width(xd.shape());
  std::vector<double> e(dev32.size());
  for (std::size_t row = 0; row < e.size(); ++row) {
    double mag = 0;
    for (index_t i = static_cast<index_t>(row) * w; i < static_cast<index_t>(row + 1) * w; ++i)
      mag = std::max(mag, std::abs(static_cast<double>(xd[i])));
    e[row] = kDoubleFromFloatSafety * std::ldexp(dev32[row], -29) + std::ldexp(mag, -53);
  }
  return e;
}

/// The parity rule per row (header comment) of one gradient tensor against the reference `hp`,
/// ref_err[row] being the replays' largest row error against hp. With `E` (the fast oracle: hp is
/// the double reference, within E[row] of the exact one per row), every quantity of the rule is
/// taken at its extremes: a row passes when err + E <= 2 (ref_err - E) + floor(mag - E), fails when
/// err - E > 2 (ref_err + E) + floor(mag + E), and is otherwise undecided (counted, never PASS; the
/// caller recomputes in mp50).
template <class R>
TensorReport parity_rows(const std::string& name, const io::StoredTensor& got, const std::vector<double>& ref_err,
                         const Tensor<R>& hp, index_t N, int show, const std::vector<double>* E = nullptr) {
  if (got.values.shape() != hp.shape())
    return tensor_failure(name, got,
                          "shape " + shape_str(got.values.shape()) + " but the configured model's " + name + " has shape " +
                              shape_str(hp.shape()),
                          false);
  TensorReport r = report_of(name, got);
  const double u = io::dtype_eps(got.dtype) / 2;
  const index_t w = parity_row_width(hp.shape()), rows = hp.size() / w;
  auto floor_at = [&](double mag) {
    mag = std::max(mag, 0.0);
    return 0.5 * io::dtype_ulp(got.dtype, mag) + 2 * 1.02 * static_cast<double>(N) * u * mag;
  };
  for (index_t row = 0; row < rows; ++row) {
    double err = 0, mag = 0;
    index_t worst_i = row * w;
    bool nan = false;
    for (index_t c = 0; c < w; ++c) {
      const index_t i = row * w + c;
      const double h = static_cast<double>(hp[i]), x = got.values[i];
      const double e = std::abs(x - h);
      if (std::isnan(e)) nan = true;
      if (e > err || std::isnan(e)) { err = e; worst_i = i; }
      mag = std::max(mag, std::abs(h));
      r.max_abs = std::max(r.max_abs, std::isfinite(e) ? e : r.max_abs);
      if (h != 0 && std::isfinite(e)) r.max_rel = std::max(r.max_rel, e / std::abs(h));
      if (std::isfinite(e)) r.max_ulps = std::max(r.max_ulps, e / io::dtype_ulp(got.dtype, h));
    }
    const double ref = ref_err[static_cast<std::size_t>(row)], er = E ? (*E)[static_cast<std::size_t>(row)] : 0.0;
    const double allowed = 2 * ref + floor_at(mag);
    const double allowed_lo = 2 * std::max(ref - er, 0.0) + floor_at(mag - er), allowed_hi = 2 * (ref + er) + floor_at(mag + er);
    // a replay (or the reference) not finite on this row gives no allowance: the row is undecided
    const bool judgeable = std::isfinite(ref) && std::isfinite(er) && std::isfinite(mag);
    const bool fails = judgeable && (nan || err - er > allowed_hi), passes = judgeable && !nan && err + er <= allowed_lo;
    if (!fails && !passes) {
      r.undecided += w;
      if (static_cast<index_t>(r.first_undecided.size()) < show) r.first_undecided.push_back(name + " row " + std::to_string(row));
      continue;
    }
    r.checked += w;
    r.worst_ratio = std::max(r.worst_ratio, nan ? INFINITY : err / allowed);
    if (fails) {
      if (static_cast<index_t>(r.first_mismatches.size()) < show) {
        std::ostringstream os;
        os.precision(9);
        os << name << " row " << row << ": max |err| " << err << " at [" << index_of(hp.shape(), worst_i) << "] (got "
           << got.values[worst_i] << ", oracle " << static_cast<double>(hp[worst_i]) << "), allowed " << allowed
           << " = 2 x replays' " << ref << " + floor " << floor_at(mag);
        if (E) os << " (oracle within " << er << ")";
        r.first_mismatches.push_back(os.str());
      }
      for (index_t c = 0; c < w; ++c)  // the elements of the row beyond its allowance
        if (!(std::abs(got.values[row * w + c] - static_cast<double>(hp[row * w + c])) - er <= allowed_hi)) ++r.violations;
    }
  }
  r.passed = r.violations == 0 && r.undecided == 0;
  return r;
}

/// The fast oracle's rows of one check (the end-to-end rows, or one sublayer step's): each tensor
/// `names` against the double reference ref(name) within double_row_error of the replays' row
/// errors dev; appended to `rows`. Returns whether mp50 could change a verdict: an undecided row in
/// a tensor with no failing row (failing fast, docs/policies.md).
template <class Ref>
bool fast_parity_rows(const std::vector<std::string>& names, const io::TensorMap& outputs,
                      const std::map<std::string, std::vector<double>>& dev, Ref&& ref, index_t N, int show,
                      std::vector<TensorReport>& rows) {
  bool need_mp50 = false;
  for (const std::string& n : names) {
    const auto& h = ref(n);
    const std::vector<double> E = double_row_error(dev.at(n), h);
    rows.push_back(parity_rows(n, outputs.at(n), dev.at(n), h, N, show, &E));
    need_mp50 = need_mp50 || (rows.back().undecided > 0 && rows.back().violations == 0);
  }
  return need_mp50;
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
