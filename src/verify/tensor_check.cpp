// src/verify/tensor_check.cpp — the element-by-element decisions of tensor_check.hpp.
#include "tensor_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

namespace oasis::verify::detail {
namespace {

std::string index_str(const Shape& shape, index_t flat) {
  std::vector<index_t> ix(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    ix[d] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  return shape_str(ix);
}

std::string num(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

constexpr int kBinadeOffset = 1100;
constexpr double kInf = std::numeric_limits<double>::infinity();

/// The policy and certain bounds at reference magnitude `mag` with terms scaled by `f`.
struct Bounds {
  double policy, certain;
};
Bounds bounds_at(io::DType d, double mag, const Allowed& a, double f) {
  const double C = a.certain * f, E = a.policy * f;
  const double certain = 0.5 * io::dtype_ulp(d, mag) + C;
  const double pol = a.storage ? 0.5 * io::dtype_ulp(d, mag + E) + E : 0.5 * io::dtype_ulp(d, mag) + E;
  return {std::min(pol, certain), certain};
}

/// Keeps the `show` smallest of `v` (amortised: sorts and cuts once it holds 4 show).
template <class T>
void keep_first(std::vector<T>& v, int show) {
  if (v.size() > 4 * static_cast<std::size_t>(show)) {
    std::sort(v.begin(), v.end());
    v.resize(static_cast<std::size_t>(show));
  }
}

}  // namespace

TensorCheck::TensorCheck(std::string name, const io::StoredTensor& got, int show)
    : name_(std::move(name)), got_(&got), show_(show), map_(got.values.shape()) {}

void TensorCheck::note_mismatch(const Mismatch& m) {
  if (show_ <= 0) return;
  mismatches_.push_back(m);
  keep_first(mismatches_, show_);
}

std::string TensorCheck::describe(const Mismatch& m) const {
  const double ulp = io::dtype_ulp(got_->dtype, m.ref);
  return name_ + index_str(got_->values.shape(), m.flat) + ": got " + num(m.got) + " ref " + num(m.ref) + " |err| " +
         num(m.dist) + " (" + num(m.dist / ulp) + " ulp) bound " + num(m.bound) +
         (m.pass_certain ? "" : " (outside the certain bound " + num(m.certain) + ")");
}

void TensorCheck::leave_undecided(index_t flat) {
  ++undecided_;
  if (show_ <= 0) return;
  undecided_at_.push_back(flat);
  keep_first(undecided_at_, show_);
}

bool TensorCheck::add(index_t flat, const RefValue& ref, const Allowed& a) {
  const io::DType d = got_->dtype;
  const double x = got_->values[flat];
  const double r = ref.hi + ref.lo;
  const double e = ref.exact ? 0.0 : ref.err;
  double dist;            // |x - r|, the best estimate of the error
  bool pass_p, pass_c;    // the decisions
  Bounds b = bounds_at(d, std::fabs(r), a, 1.0);
  if (std::isnan(x)) {
    dist = std::numeric_limits<double>::quiet_NaN();
    pass_p = pass_c = false;
  } else if (std::isinf(r)) {  // -inf (LSE of a fully masked plain-softmax row): exactly
    dist = x == r ? 0.0 : kInf;
    pass_p = pass_c = x == r;
    b = {0.0, 0.0};
  } else if (!std::isfinite(x)) {
    dist = kInf;
    pass_p = pass_c = false;
  } else if (ref.exact) {
    const mp50 dm = abs(mp50(x) - *ref.exact);
    dist = static_cast<double>(dm);
    pass_p = dm <= mp50(b.policy);
    pass_c = dm <= mp50(b.certain);
  } else {
    const double diff = (x - ref.hi) - ref.lo;
    dist = std::fabs(diff);
    // the reference's error and two roundings of diff; dist 2^-51 in its own statement (never fused
    // into the sum), rounded as ldexp(dist, -51)
    const double two_roundings = dist * 0x1p-51;
    const double slack = e + two_roundings;
    const double mag = std::fabs(r);
    const Bounds lo = bounds_at(d, std::max(0.0, mag - e), a, 1.0 - a.rho);
    const Bounds hi = bounds_at(d, mag + e, a, 1.0 + a.rho);
    auto decide = [&](double blo, double bhi, bool* pass) {
      if (dist + slack <= blo) { *pass = true; return true; }
      if (dist - slack > bhi) { *pass = false; return true; }
      return false;
    };
    if (!decide(lo.policy, hi.policy, &pass_p) || !decide(lo.certain, hi.certain, &pass_c)) return false;
  }
  ++checked_;
  if (std::isnan(dist)) nan_ = true;
  else max_abs_ = std::max(max_abs_, dist);
  if (std::isfinite(r)) {
    if (r != 0) max_rel_ = std::max(max_rel_, dist / std::fabs(r));
    sum_sq_ += r * r;
    ++n_sq_;
    if (r == 0) max_err_zero_ = std::max(max_err_zero_, dist);
    else {
      const int be = io::exponent_of(r) + kBinadeOffset;
      double& m = max_err_by_binade_[static_cast<std::size_t>(std::clamp(be, 0, static_cast<int>(max_err_by_binade_.size()) - 1))];
      m = std::max(m, dist);
    }
  }
  auto ratio = [&](double bound) { return bound > 0 ? dist / bound : (dist > 0 ? kInf : 0.0); };
  if (!std::isnan(dist)) {
    worst_ = std::max(worst_, ratio(b.policy));
    worst_certain_ = std::max(worst_certain_, ratio(b.certain));
  }
  if (e > 0 && std::isfinite(dist)) {  // a double reference: the figures are known within its error
    abs_hi_ = std::max(abs_hi_, dist + e);
    ratio_hi_ = std::max(ratio_hi_, b.policy > 0 ? (dist + e) / b.policy : kInf);
  }
  map_.note(flat, x, r, dist, b.policy);
  progress_.note(ref.exact != nullptr);
  if (!pass_c) ++violations_certain_;
  if (!pass_p) {
    ++violations_;
    note_mismatch({flat, x, r, dist, b.policy, b.certain, pass_c});
  }
  return true;
}

void TensorCheck::merge(const TensorCheck& o) {
  checked_ += o.checked_;
  violations_ += o.violations_;
  violations_certain_ += o.violations_certain_;
  undecided_ += o.undecided_;
  for (index_t f : o.undecided_at_) {
    if (show_ <= 0) break;
    undecided_at_.push_back(f);
    keep_first(undecided_at_, show_);
  }
  max_abs_ = std::max(max_abs_, o.max_abs_);
  abs_hi_ = std::max(abs_hi_, o.abs_hi_);
  ratio_hi_ = std::max(ratio_hi_, o.ratio_hi_);
  max_rel_ = std::max(max_rel_, o.max_rel_);
  worst_ = std::max(worst_, o.worst_);
  worst_certain_ = std::max(worst_certain_, o.worst_certain_);
  nan_ = nan_ || o.nan_;
  sum_sq_ += o.sum_sq_;
  n_sq_ += o.n_sq_;
  for (std::size_t i = 0; i < max_err_by_binade_.size(); ++i)
    max_err_by_binade_[i] = std::max(max_err_by_binade_[i], o.max_err_by_binade_[i]);
  max_err_zero_ = std::max(max_err_zero_, o.max_err_zero_);
  for (const auto& m : o.mismatches_) note_mismatch(m);
  map_.merge(o.map_);
  progress_.absorb(o.progress_);
}

TensorReport report_of(const std::string& name, const io::StoredTensor& got) {
  TensorReport r;
  r.name = name;
  r.dtype = got.dtype;
  r.shape = got.values.shape();
  r.elements = got.values.size();
  return r;
}

TensorReport TensorCheck::finish(const std::string& bound) const {
  TensorReport r = report_of(name_, *got_);
  r.checked = checked_;
  r.bound = bound;
  // A double reference's own error can exceed the error it measures (float64 outputs): where that
  // moves err/bound by more than 1/16 of itself (and 1/1024), the figures are said to be the double
  // reference's, with what the exact ones can be at most.
  if (!nan_ && ratio_hi_ - worst_ > std::max(worst_ / 16, 1.0 / 1024))
    r.bound += "; max|err|, err/bound against the double reference: exactly at most " + num(abs_hi_) + ", " +
               num(std::max(worst_, ratio_hi_));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  r.max_abs = nan_ ? nan : max_abs_;
  r.max_rel = nan_ ? nan : max_rel_;
  r.worst_ratio = nan_ ? nan : worst_;
  r.worst_ratio_certain = nan_ ? nan : worst_certain_;
  // ulps at max(|ref|, rms): ulp_D is constant on a binade [2^e, 2^(e+1)), so per binade it is
  // ulp_D(max(2^e, rms)).
  const double rms = n_sq_ ? std::sqrt(sum_sq_ / static_cast<double>(n_sq_)) : 0.0;
  double ulps = max_err_zero_ / io::dtype_ulp(r.dtype, rms);
  for (std::size_t i = 0; i < max_err_by_binade_.size(); ++i)
    if (max_err_by_binade_[i] > 0) {
      const double lo = std::ldexp(1.0, static_cast<int>(i) - kBinadeOffset);
      ulps = std::max(ulps, max_err_by_binade_[i] / io::dtype_ulp(r.dtype, std::max(lo, rms)));
    }
  r.max_ulps = nan_ ? nan : ulps;
  r.violations = violations_;
  r.violations_certain = violations_certain_;
  r.undecided = undecided_;
  r.passed = violations_ == 0 && undecided_ == 0;
  r.certain_failure = violations_certain_ > 0;
  std::vector<Mismatch> m = mismatches_;
  std::sort(m.begin(), m.end());
  for (std::size_t i = 0; i < m.size() && i < static_cast<std::size_t>(show_); ++i) r.first_mismatches.push_back(describe(m[i]));
  std::vector<index_t> u = undecided_at_;
  std::sort(u.begin(), u.end());
  for (std::size_t i = 0; i < u.size() && i < static_cast<std::size_t>(show_); ++i)
    r.first_undecided.push_back(name_ + index_str(got_->values.shape(), u[i]));
  r.map = map_.finish();
  progress_.finish();
  return r;
}

TensorReport tensor_failure(const std::string& name, const io::StoredTensor& got, std::string problem, bool certain) {
  TensorReport r = report_of(name, got);
  r.problem = std::move(problem);
  r.checked = r.violations = r.elements;  // the whole tensor judged, and outside
  if (certain) {
    r.violations_certain = r.elements;
    r.certain_failure = true;
    r.max_abs = r.worst_ratio = r.worst_ratio_certain = kInf;
  }
  return r;
}

TensorReport shape_mismatch(const std::string& name, const io::StoredTensor& got, const Shape& want) {
  return tensor_failure(name, got,
                        "shape " + shape_str(got.values.shape()) + " but the oracle's " + name + " has shape " + shape_str(want),
                        true);
}

}  // namespace oasis::verify::detail
