// src/verify/report.cpp — one tensor under the tolerance policy, and the report's two forms
// (the table of `oasis-verify compare`, JSON).
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "engine.hpp"

namespace oasis::verify {
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

}  // namespace

TensorReport compare_tensor(const std::string& name, const io::StoredTensor& got, const Tensor<mp50>& ref,
                            const Tensor<double>& plain, int show) {
  TensorReport r;
  r.name = name;
  r.dtype = got.dtype;
  r.shape = got.values.shape();
  r.elements = got.values.size();
  if (got.values.shape() != ref.shape()) {
    r.problem = "shape " + shape_str(got.values.shape()) + " but the oracle's " + name + " has shape " + shape_str(ref.shape());
    r.violations = r.elements;
    return r;
  }
  for (index_t i = 0; i < got.values.size(); ++i) {
    const double x = got.values[i];
    const mp50& rm = ref[i];
    const double rd = static_cast<double>(rm);
    const double bound = 0.5 * io::dtype_ulp(got.dtype, rd) + 2.0 * plain[i];
    double err;
    if (is_finite(rm)) {
      err = std::isfinite(x) ? static_cast<double>(abs(mp50(x) - rm)) : std::numeric_limits<double>::infinity();
    } else {  // -inf (LSE of a fully masked plain-softmax row): must match exactly
      err = (x == rd) ? 0.0 : std::numeric_limits<double>::infinity();
    }
    if (std::isnan(x)) err = std::numeric_limits<double>::quiet_NaN();
    const bool ok = err <= bound;  // NaN fails
    const double shown_err = std::isnan(err) ? std::numeric_limits<double>::infinity() : err;
    r.max_abs = std::max(r.max_abs, shown_err);
    if (rd != 0 && std::isfinite(rd)) r.max_rel = std::max(r.max_rel, shown_err / std::fabs(rd));
    r.max_ulps = std::max(r.max_ulps, shown_err / io::dtype_ulp(got.dtype, rd));
    r.worst_ratio = std::max(r.worst_ratio, bound > 0 ? shown_err / bound : (shown_err > 0 ? INFINITY : 0.0));
    if (!ok) {
      if (r.violations < show)
        r.first_mismatches.push_back(name + index_str(r.shape, i) + ": got " + num(x) + " ref " + num(rd) + " |err| " +
                                     num(shown_err) + " (" + num(shown_err / io::dtype_ulp(got.dtype, rd)) + " ulp) bound " +
                                     num(bound));
      ++r.violations;
    }
  }
  r.passed = r.violations == 0;
  return r;
}

std::string format_report(const CompareReport& r) {
  std::ostringstream os;
  os << "oasis-verify compare: op " << r.op << "  (oracle: mp50; policy per element: |x - ref| <= 0.5 ulp_D(ref) + 2 B_plain(D))\n";
  char line[512];
  std::snprintf(line, sizeof line, "  %-12s %-5s %-18s %12s %12s %12s %12s  %s\n", "tensor", "dtype", "shape", "max|err|",
                "max rel", "max ulps", "err/bound", "verdict");
  os << line;
  for (const auto& t : r.tensors) {
    std::string verdict = t.informative ? "INFO (no verdict)" : t.passed ? "PASS" : "FAIL";
    if (!t.passed && t.problem.empty())
      verdict += " (" + std::to_string(t.violations) + " of " + std::to_string(t.elements) + " elements outside the bound)";
    if (!t.problem.empty()) verdict += " (" + t.problem + ")";
    std::snprintf(line, sizeof line, "  %-12s %-5s %-18s %12.4g %12.4g %12.4g %12.4g  %s\n", t.name.c_str(),
                  std::string(io::to_string(t.dtype)).c_str(), shape_str(t.shape).c_str(), t.max_abs, t.max_rel, t.max_ulps,
                  t.worst_ratio, verdict.c_str());
    os << line;
    for (const auto& m : t.first_mismatches) os << "      " << m << "\n";
  }
  for (const auto& n : r.notes) os << "  note: " << n << "\n";
  index_t failed = 0, checked = 0;
  for (const auto& t : r.tensors) {
    checked += t.informative ? 0 : 1;
    failed += t.informative || t.passed ? 0 : 1;
  }
  os << "verdict: " << (r.passed ? "PASS" : "FAIL") << " (" << (checked - failed) << " of " << checked
     << " tensors within the policy)\n";
  return os.str();
}

std::string report_json(const CompareReport& r) {
  using io::json::quote;
  auto jnum = [](double x) {
    return std::isfinite(x) ? num(x) : std::string("null");  // JSON has no inf/NaN
  };
  std::ostringstream os;
  os << "{\"op\":" << quote(r.op) << ",\"passed\":" << (r.passed ? "true" : "false") << ",\"tensors\":[";
  for (std::size_t i = 0; i < r.tensors.size(); ++i) {
    const auto& t = r.tensors[i];
    os << (i ? "," : "") << "{\"name\":" << quote(t.name) << ",\"dtype\":" << quote(std::string(io::to_string(t.dtype)))
       << ",\"shape\":[";
    for (std::size_t d = 0; d < t.shape.size(); ++d) os << (d ? "," : "") << t.shape[d];
    os << "],\"max_abs\":" << jnum(t.max_abs) << ",\"max_rel\":" << jnum(t.max_rel) << ",\"max_ulps\":" << jnum(t.max_ulps)
       << ",\"worst_ratio\":" << jnum(t.worst_ratio) << ",\"violations\":" << t.violations
       << ",\"passed\":" << (t.informative ? "null" : t.passed ? "true" : "false") << ",\"informative\":" << (t.informative ? "true" : "false")
       << ",\"problem\":" << quote(t.problem) << ",\"first_mismatches\":[";
    for (std::size_t k = 0; k < t.first_mismatches.size(); ++k) os << (k ? "," : "") << quote(t.first_mismatches[k]);
    os << "]}";
  }
  os << "],\"notes\":[";
  for (std::size_t k = 0; k < r.notes.size(); ++k) os << (k ? "," : "") << quote(r.notes[k]);
  os << "]}\n";
  return os.str();
}

}  // namespace oasis::verify
