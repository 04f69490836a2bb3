// src/verify/op_support.cpp — the op files' shared glue (op_support.hpp): inputs, bounds and the
// element verdicts of every output against its oracle.
#include "op_support.hpp"

#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include "oasis/ops/error_bounds.hpp"
#include "oracle_arithmetic.hpp"

namespace oasis::verify {
namespace detail {

std::string names_of(const TensorMap& m) {
  std::vector<std::string> n;
  for (const auto& kv : m) n.push_back(kv.first);
  return join_names(n);
}

const StoredTensor& need(const TensorMap& m, const std::string& name, const std::string& op) {
  auto it = m.find(name);
  OASIS_REQUIRE(it != m.end(), name, "op ", op, " needs input tensor '", name, "' (the inputs hold: ", names_of(m), ")");
  for (index_t i = 0; i < it->second.values.size(); ++i)
    OASIS_REQUIRE(!std::isnan(it->second.values[i]), name, "tensor '", name, "' holds NaN at flat index ", i);
  return it->second;
}

namespace {
double scale_of(DType d) { return d == DType::f64 ? 1.0 : unit_roundoff(d) / unit_roundoff(DType::f32); }
}  // namespace

const BoundMap& PlainBounds::base(DType d) {
  BoundMap& m = d == DType::f64 ? wide_ : narrow_;
  if (m.empty()) m = fn_(d == DType::f64);
  return m;
}

const Tensor<double>* PlainBounds::fixed(const std::string& name, DType d) {
  if (!fixed_fn_) return nullptr;
  BoundMap& f = d == DType::f64 ? fixed_wide_ : fixed_narrow_;
  if (f.empty()) f = fixed_fn_(d == DType::f64);
  auto it = f.find(name);
  return it == f.end() || it->second.empty() ? nullptr : &it->second;
}

const Tensor<double>& PlainBounds::raw(const std::string& name, DType d) {
  const BoundMap& m = base(d);
  auto it = m.find(name);
  OASIS_REQUIRE(it != m.end(), name, "no error bound for '", name, "'");
  const Tensor<double>* fx = fixed(name, d);
  if (!fx) return it->second;
  auto done = done_.find({name, d});
  if (done != done_.end()) return done->second;
  Tensor<double> b = it->second;
  const double s = scale_of(d);
  for (index_t i = 0; i < b.size(); ++i) b[i] += (*fx)[i] / s;
  return done_.emplace(std::make_pair(name, d), std::move(b)).first->second;
}

const Tensor<double>& PlainBounds::unscaled(const std::string& name, DType d) {
  const Tensor<double>* fx = fixed(name, d);
  const BoundMap& m = base(d);
  auto it = m.find(name);
  OASIS_REQUIRE(it != m.end(), name, "no error bound for '", name, "'");
  if (!fx) return it->second;
  auto done = unscaled_.find({name, d});
  if (done != unscaled_.end()) return done->second;
  Tensor<double> b = it->second;
  for (index_t i = 0; i < b.size(); ++i) b[i] += (*fx)[i];
  return unscaled_.emplace(std::make_pair(name, d), std::move(b)).first->second;
}

Tensor<double> PlainBounds::get(const std::string& name, DType d) {
  Tensor<double> b = raw(name, d);
  const double s = scale_of(d);
  for (index_t i = 0; i < b.size(); ++i) b[i] *= s;
  return b;
}

Allowed allowed_terms(DType d, Policy p, double wc, double prob, double mix_mass, double rho, DType in) {
  const double scale16 = is16(d) ? unit_roundoff(d) / unit_roundoff(DType::f32) : 1.0;
  const double scale_in = is16(in) ? unit_roundoff(in) / unit_roundoff(DType::f32) : 1.0;
  const double certain = 2.0 * wc * std::max(scale16, scale_in);
  if (p == Policy::worst_case || std::isnan(prob)) return {certain, certain, false, rho};
  // 16-bit inputs: every rounding may be to the input type (the probabilistic bound at u_in)
  if (is16(in) && p == Policy::probabilistic) return {prob * scale_in, certain, is16(d), rho};
  if (!is16(d)) return {prob, certain, false, rho};
  // accumulated in float32 and rounded once to d (p16: the probabilities rounded to d before P·V)
  const double e = prob + (p == Policy::p16 ? bounds::kSecondOrder * unit_roundoff(d) * mix_mass : 0.0);
  return {e, certain, true, rho};
}

std::string bound_name(DType d, Policy p, bool has_prob, bool mixture, DType in) {
  if (p == Policy::worst_case) return is16(d) || is16(in) ? "worst-case, all in " + std::string(io::to_string(is16(in) ? in : d)) : "worst-case";
  if (!has_prob) return "worst-case (no probabilistic bound)";
  if (is16(in) && p == Policy::probabilistic) return "probabilistic, all in " + std::string(io::to_string(in));
  if (!is16(d)) return "probabilistic";
  const std::string ds(io::to_string(d));
  return (p == Policy::p16 && mixture ? "p16: f32, P in " + ds + ", stored " : "f32 stored as ") + ds;
}

DType input16(std::initializer_list<DType> xs) {
  DType r = DType::f32;
  for (DType x : xs)
    if (is16(x) && (!is16(r) || unit_roundoff(x) > unit_roundoff(r))) r = x;
  return r;
}

double psi_bound(double u, index_t H, index_t Tk, double psi) {
  // H - 1 additions of non-negative terms and one division, each rounding relative u: H u psi.
  // The mass estimator first forms 1 - sum_j p_j per head (Tk additions of terms summing to <= 1,
  // one subtraction): absolute (Tk + 1) u per head.
  return bounds::kSecondOrder * (static_cast<double>(H) * u * psi + static_cast<double>(Tk + (Tk ? 1 : 0)) * u);
}

namespace {

const Shape& shape_of(const Ref* r) { return r->shape(); }
index_t size_of(const Ref* r) { return r->size(); }
RefValue value_at(const Ref* r, index_t i) {
  const double hi = static_cast<double>((*r)[i]);
  const double lo = std::isfinite(hi) ? static_cast<double>((*r)[i] - mp50(hi)) : 0.0;
  return {hi, lo, 0.0, &(*r)[i]};
}
const Shape& shape_of(const DoubleRef& r) { return r.value->shape(); }
index_t size_of(const DoubleRef& r) { return r.value->size(); }
RefValue value_at(const DoubleRef& r, index_t i) { return {(*r.value)[i], 0.0, r.err_scale * (*r.err)[i]}; }

/// Both compare_outputs: every output present judged element by element; returns the number of
/// elements left undecided (always 0 for mp50 references).
/// The certain line of an output of dtype d at the wider of d and a 16-bit input type `in` (wc: the
/// worst-case bound at the accumulation precision); a worst-case policy line moves with it.
Allowed certain_at_input(Allowed a, DType d, DType in, double wc) {
  if (!is16(in)) return a;
  const double scale16 = is16(d) ? unit_roundoff(d) / unit_roundoff(DType::f32) : 1.0;
  const double c = 2.0 * wc * std::max(scale16, unit_roundoff(in) / unit_roundoff(DType::f32));
  if (c <= a.certain) return a;
  if (a.policy == a.certain) a.policy = c;
  a.certain = c;
  return a;
}

template <class R>
index_t compare_each(CompareReport& rep, const TensorMap& outputs, const std::map<std::string, R>& refs,
                     PlainBounds& bounds, const CompareOptions& opt, PlainBounds* prob, double rho, DType in) {
  index_t undecided = 0;
  for (const auto& [name, t] : outputs) {
    auto it = refs.find(name);
    if (it == refs.end()) continue;  // an input of the op held in the same file (the engine checked the names)
    const R& ref = it->second;
    if (t.values.shape() != shape_of(ref)) {
      rep.tensors.push_back(shape_mismatch(name, t, shape_of(ref)));
      continue;
    }
    const Tensor<double>& wc = bounds.raw(name, t.dtype);
    const Tensor<double>* pb = prob ? &prob->unscaled(name, t.dtype) : nullptr;
    TensorCheck chk(name, t, opt.show);
    for (index_t i = 0; i < size_of(ref); ++i)
      if (!chk.add(i, value_at(ref, i),
                   certain_at_input(allowed_terms(t.dtype, opt.policy, wc[i],
                                                  pb ? (*pb)[i] : std::numeric_limits<double>::quiet_NaN(), 0.0, rho),
                                    t.dtype, in, wc[i]))) {
        ++undecided;
        chk.leave_undecided(i);
      }
    const bool has_prob = pb != nullptr && (pb->empty() || !std::isnan((*pb)[0]));
    const bool prob16 = is16(in) && has_prob && opt.policy != Policy::worst_case;  // the bound holds 16-bit storage
    rep.tensors.push_back(chk.finish(prob16 ? "probabilistic, intermediates stored in " + std::string(io::to_string(in))
                                            : bound_name(t.dtype, opt.policy, has_prob, false, in)));
  }
  rep.passed = std::all_of(rep.tensors.begin(), rep.tensors.end(), [](const TensorReport& t) { return t.passed; });
  return undecided;
}

}  // namespace

void compare_outputs(CompareReport& rep, const TensorMap& outputs, const std::map<std::string, const Ref*>& refs,
                     PlainBounds& bounds, const CompareOptions& opt, PlainBounds* prob, DType in) {
  (void)compare_each(rep, outputs, refs, bounds, opt, prob, 0.0, in);
}

index_t compare_outputs(CompareReport& rep, const TensorMap& outputs, const std::map<std::string, DoubleRef>& refs,
                        PlainBounds& bounds, const CompareOptions& opt, double rho, PlainBounds* prob, DType in) {
  return compare_each(rep, outputs, refs, bounds, opt, prob, rho, in);
}

bool mp50_fits(CompareReport& rep, double work, double bytes, const CompareOptions& opt, const std::string& what) {
  if (work <= opt.mp50_budget && bytes <= opt.mp50_memory) return true;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "%s not recomputed in mp50: about %.3g multiply-adds and %.3g bytes, over the budget of %.3g and %.3g "
                "(--mp50-budget, --mp50-memory); the elements left undecided are listed per tensor",
                what.c_str(), work, bytes, opt.mp50_budget, opt.mp50_memory);
  rep.notes.emplace_back(buf);
  return false;
}

bool mp50_fallback(CompareReport& rep, const std::string& op, index_t undecided, double work, double bytes,
                   const CompareOptions& opt, const std::string& what, std::string& fallback) {
  if (!mp50_fits(rep, work, bytes, opt, what)) {
    rep.oracle = "fast (double, its own error bound folded in; " + std::to_string(undecided) + " elements undecided)";
    return false;
  }
  rep = CompareReport{};
  rep.op = op;
  rep.mp50_work = work;
  fallback = "; " + std::to_string(undecided) + " elements undecided by the fast oracle";
  return true;
}

std::vector<index_t> sample_rows(index_t total, index_t n, std::uint64_t seed) {
  std::vector<index_t> rows;
  if (n <= 0 || n >= total) {
    rows.resize(static_cast<std::size_t>(total));
    for (index_t i = 0; i < total; ++i) rows[static_cast<std::size_t>(i)] = i;
    return rows;
  }
  std::uint64_t state = seed;
  auto next = [&] {  // SplitMix64
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  // Floyd's algorithm: n distinct values of [0, total) with n draws.
  std::set<index_t> chosen;
  for (index_t j = total - n; j < total; ++j) {
    const std::uint64_t range = static_cast<std::uint64_t>(j) + 1;
    const std::uint64_t limit = ~std::uint64_t(0) - (~std::uint64_t(0) % range);
    std::uint64_t x;
    do x = next(); while (x >= limit);  // unbiased
    const index_t t = static_cast<index_t>(x % range);
    if (!chosen.insert(t).second) chosen.insert(j);
  }
  rows.assign(chosen.begin(), chosen.end());
  return rows;
}

void keep_worst_case_line(BoundMap& m) {
  for (auto& [name, t] : m)
    if (name != "kink_edge")
      for (index_t i = 0; i < t.size(); ++i) t[i] = std::numeric_limits<double>::quiet_NaN();
}

}  // namespace detail

TensorReport compare_tensor(const std::string& name, const io::StoredTensor& got, const Tensor<mp50>& ref,
                            const Tensor<double>& plain, int show) {
  using namespace detail;
  const OracleArithmetic arithmetic;
  if (got.values.shape() != ref.shape()) return shape_mismatch(name, got, ref.shape());
  TensorCheck chk(name, got, show);
  for (index_t i = 0; i < ref.size(); ++i) chk.add(i, value_at(&ref, i), Allowed{2.0 * plain[i], 2.0 * plain[i], false, 0.0});
  return chk.finish("worst-case");
}

}  // namespace oasis::verify
