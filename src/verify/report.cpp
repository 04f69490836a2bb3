// src/verify/report.cpp — the report's two forms: the table of `oasis-verify compare` and JSON.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "oasis/io/json.hpp"
#include "oasis/verify/report.hpp"

namespace oasis::verify {
namespace {

std::string num(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

}  // namespace

std::string verdict_word(const TensorReport& t) {
  if (t.informative) return "INFO";
  if (t.passed) return "PASS";
  if (t.certain_failure) return "FAIL-certain";
  return t.violations == 0 && t.problem.empty() && t.undecided > 0 ? "UNDECIDED" : "FAIL";
}

std::string verdict_word(const CompareReport& r) {
  if (r.passed) return "PASS";
  bool fail = false;
  for (const auto& t : r.tensors) {
    if (t.informative) continue;
    const std::string w = verdict_word(t);
    if (w == "FAIL-certain") return w;
    fail = fail || w == "FAIL";
  }
  return fail ? "FAIL" : "UNDECIDED";
}

std::string format_report(const CompareReport& r) {
  std::ostringstream os;
  os << "oasis-verify compare: op " << r.op << "  (oracle: " << r.oracle << "; policy: " << r.policy
     << (r.policy == "worst_case" ? "" : ", certain line: worst case") << ")\n";
  char line[640];
  std::snprintf(line, sizeof line, "  %-12s %-5s %-18s %11s %11s %11s %11s %11s  %s\n", "tensor", "dtype", "shape", "max|err|",
                "max rel", "max ulps", "err/bound", "err/certain", "verdict");
  os << line;
  for (const auto& t : r.tensors) {
    std::string verdict = t.informative ? "INFO (no verdict)" : verdict_word(t);
    if (!t.informative && !t.passed && t.problem.empty()) {
      verdict += " (" + std::to_string(t.violations) + " of " + std::to_string(t.checked) + " elements outside the bound";
      if (t.certain_failure) verdict += ", " + std::to_string(t.violations_certain) + " outside the certain bound";
      if (t.undecided > 0) verdict += "; " + std::to_string(t.undecided) + " undecided";
      verdict += ")";
    }
    if (!t.problem.empty()) verdict += " (" + t.problem + ")";
    if (!t.informative && !t.bound.empty()) verdict += "  [" + t.bound + "]";
    std::snprintf(line, sizeof line, "  %-12s %-5s %-18s %11.4g %11.4g %11.4g %11.4g %11.4g  %s\n", t.name.c_str(),
                  std::string(io::to_string(t.dtype)).c_str(), shape_str(t.shape).c_str(), t.max_abs, t.max_rel, t.max_ulps,
                  t.worst_ratio, t.worst_ratio_certain, verdict.c_str());
    os << line;
    for (const auto& m : t.first_mismatches) os << "      " << m << "\n";
    if (!t.first_undecided.empty()) {
      os << "      undecided:";
      for (const auto& u : t.first_undecided) os << " " << u;
      os << (t.undecided > static_cast<index_t>(t.first_undecided.size()) ? " ...\n" : "\n");
    }
  }
  if (r.sample.rows > 0) {
    os << "  sample: " << r.sample.rows << " of " << r.sample.total << " rows " << r.sample.row_kind << " checked (seed "
       << r.sample.seed << "):";
    for (std::size_t i = 0; i < r.sample.which.size() && i < 12; ++i) os << " " << r.sample.which[i];
    if (r.sample.which.size() > 12) os << " ... (all in the JSON report)";
    os << "\n  sample: the unchecked rows can hide errors; a PASS covers the checked rows only\n";
  }
  for (const auto& n : r.notes) os << "  note: " << n << "\n";
  index_t failed = 0, checked = 0;
  for (const auto& t : r.tensors) {
    checked += t.informative ? 0 : 1;
    failed += t.informative || t.passed ? 0 : 1;
  }
  os << "verdict: " << verdict_word(r) << " (" << (checked - failed)
     << " of " << checked << " tensors within the policy)\n";
  return os.str();
}

std::string report_json(const CompareReport& r) {
  using io::json::quote;
  auto jnum = [](double x) {
    return std::isfinite(x) ? num(x) : std::string("null");  // JSON has no inf/NaN
  };
  std::ostringstream os;
  os << "{\"op\":" << quote(r.op) << ",\"passed\":" << (r.passed ? "true" : "false")
     << ",\"verdict\":" << quote(verdict_word(r)) << ",\"policy\":" << quote(r.policy) << ",\"oracle\":" << quote(r.oracle)
     << ",\"mp50_rows\":" << r.mp50_rows << ",\"mp50_work\":" << jnum(r.mp50_work) << ",\"tensors\":[";
  for (std::size_t i = 0; i < r.tensors.size(); ++i) {
    const auto& t = r.tensors[i];
    os << (i ? "," : "") << "{\"name\":" << quote(t.name) << ",\"dtype\":" << quote(std::string(io::to_string(t.dtype)))
       << ",\"shape\":[";
    for (std::size_t d = 0; d < t.shape.size(); ++d) os << (d ? "," : "") << t.shape[d];
    os << "],\"elements\":" << t.elements << ",\"checked\":" << t.checked << ",\"bound\":" << quote(t.bound)
       << ",\"max_abs\":" << jnum(t.max_abs) << ",\"max_rel\":" << jnum(t.max_rel) << ",\"max_ulps\":" << jnum(t.max_ulps)
       << ",\"worst_ratio\":" << jnum(t.worst_ratio) << ",\"worst_ratio_certain\":" << jnum(t.worst_ratio_certain)
       << ",\"has_nan\":" << (std::isnan(t.max_abs) ? "true" : "false") << ",\"violations\":" << t.violations
       << ",\"violations_certain\":" << t.violations_certain << ",\"undecided\":" << t.undecided
       << ",\"passed\":" << (t.informative ? "null" : t.passed ? "true" : "false")
       << ",\"informative\":" << (t.informative ? "true" : "false")
       << ",\"verdict\":" << (t.informative ? "null" : quote(verdict_word(t))) << ",\"problem\":" << quote(t.problem)
       << ",\"first_mismatches\":[";
    for (std::size_t k = 0; k < t.first_mismatches.size(); ++k) os << (k ? "," : "") << quote(t.first_mismatches[k]);
    os << "],\"first_undecided\":[";
    for (std::size_t k = 0; k < t.first_undecided.size(); ++k) os << (k ? "," : "") << quote(t.first_undecided[k]);
    os << "]}";
  }
  os << "],\"sample\":";
  if (r.sample.rows > 0) {
    os << "{\"rows\":" << r.sample.rows << ",\"total\":" << r.sample.total << ",\"seed\":" << r.sample.seed
       << ",\"row\":" << quote(r.sample.row_kind) << ",\"which\":[";
    for (std::size_t k = 0; k < r.sample.which.size(); ++k) os << (k ? "," : "") << quote(r.sample.which[k]);
    os << "]}";
  } else {
    os << "null";
  }
  os << ",\"notes\":[";
  for (std::size_t k = 0; k < r.notes.size(); ++k) os << (k ? "," : "") << quote(r.notes[k]);
  os << "]}\n";
  return os.str();
}

}  // namespace oasis::verify
