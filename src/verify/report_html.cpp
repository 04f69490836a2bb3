// src/verify/report_html.cpp — the report as one self-contained HTML page (report_html()).
//
// The page holds two JSON documents and the script that draws them (report_page.js, styles in
// report_page.css, both embedded at build time: report_assets.inc): the report exactly as
// report_json() writes it, and per tensor what the JSON leaves out — its ErrorMap, the
// producer it was checked against (model level) and the names of its axes where the layout fixes
// them. Nothing is loaded from the network.
//
// The cells of an ErrorMap travel as one hex byte per block, log2(err/bound) in quarter binades:
//   00 none checked, 01 exactly 0, 02..fd round(4 log2(ratio)) + 160 clamped, fe infinite, ff NaN
// (the page's colours resolve no finer; the worst elements carry the exact figures).
#include <cmath>
#include <cstdio>
#include <sstream>

#include "oasis/io/json.hpp"
#include "oasis/verify/report.hpp"

namespace oasis::verify {
namespace {

#include "report_assets.inc"  // kReportScript, kReportStyle

std::string num(double x) {
  if (std::isnan(x)) return "\"NaN\"";
  if (std::isinf(x)) return x > 0 ? "\"inf\"" : "\"-inf\"";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

std::string ints(const Shape& s) {
  std::string o = "[";
  for (std::size_t i = 0; i < s.size(); ++i) o += (i ? "," : "") + std::to_string(s[i]);
  return o + "]";
}

unsigned cell_code(float v) {
  if (std::isnan(v)) return 0xff;
  if (v < 0) return 0x00;
  if (v == 0) return 0x01;
  if (std::isinf(v)) return 0xfe;
  const double q = std::round(4.0 * std::log2(static_cast<double>(v))) + 160.0;
  return static_cast<unsigned>(std::fmin(std::fmax(q, 2.0), 253.0));
}

std::string map_json(const ErrorMap& m) {
  if (m.empty()) return "null";
  std::string cells;
  cells.reserve(m.cells.size() * 2);
  const char* hex = "0123456789abcdef";
  for (float v : m.cells) {
    const unsigned c = cell_code(v);
    cells.push_back(hex[c >> 4]);
    cells.push_back(hex[c & 15]);
  }
  std::ostringstream os;
  os << "{\"blocks\":" << ints(m.blocks) << ",\"block\":" << ints(m.block) << ",\"cells\":\"" << cells
     << "\",\"hist_lo\":" << ErrorMap::kHistLo << ",\"hist\":[";
  for (std::size_t i = 0; i < m.histogram.size(); ++i) os << (i ? "," : "") << m.histogram[i];
  os << "],\"nan\":" << m.nan << ",\"worst\":[";
  for (std::size_t i = 0; i < m.worst.size(); ++i) {
    const ElementError& w = m.worst[i];
    os << (i ? "," : "") << "{\"index\":" << ints(w.index) << ",\"got\":" << num(w.got) << ",\"ref\":" << num(w.ref)
       << ",\"err\":" << num(w.err) << ",\"bound\":" << num(w.bound) << ",\"ratio\":" << num(w.ratio) << "}";
  }
  os << "]}";
  return os.str();
}

/// The names of the axes of a tensor where its layout fixes them: the attention ops' tensors of
/// rank 3 and 4 in their default layout bhtd ([B,H,Tq], [B,H,Tq,d]; docs/verify.md), the model
/// level's p_null and lse ([B,H,T]); empty otherwise.
std::vector<std::string> axis_names(const std::string& op, const TensorReport& t) {
  const std::string field = t.name.substr(t.name.rfind('.') + 1);
  if (op == "model") {
    if ((field == "p_null" || field == "lse") && t.shape.size() == 3) return {"B", "H", "T"};
    return {};
  }
  if (op != "attention" && op != "attention_backward") return {};
  if (t.shape.size() == 3) return {"B", "H", "Tq"};
  if (t.shape.size() == 4) return {"B", "H", field == "grad_k" || field == "grad_v" ? "Tk" : "Tq", field == "probs" ? "Tk" : "d"};
  return {};
}

/// JSON inside <script>: "</" would end the element ("<\/" is the same JSON string).
std::string script_safe(const std::string& json) {
  std::string out;
  out.reserve(json.size());
  for (std::size_t i = 0; i < json.size(); ++i) {
    if (json[i] == '<' && i + 1 < json.size() && json[i + 1] == '/') {
      out += "<\\/";
      ++i;
    } else {
      out.push_back(json[i]);
    }
  }
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace

std::string report_html(const CompareReport& r) {
  std::ostringstream extra;
  extra << "[";
  for (std::size_t i = 0; i < r.tensors.size(); ++i) {
    const TensorReport& t = r.tensors[i];
    extra << (i ? "," : "") << "{\"step\":" << io::json::quote(t.step) << ",\"axes\":[";
    const std::vector<std::string> axes = axis_names(r.op, t);
    for (std::size_t k = 0; k < axes.size(); ++k) extra << (k ? "," : "") << io::json::quote(axes[k]);
    extra << "],\"map\":" << map_json(t.map) << "}";
  }
  extra << "]";
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
     << "<title>oasis report: " << html_escape(r.op) << " (rendering)</title>\n"
     << "<style>\n" << kReportStyle << "</style>\n</head>\n"
     << "<body data-oasis-status=\"rendering\">\n"
     << "<noscript>This report draws its figures with JavaScript; the table is in the JSON below.</noscript>\n"
     << "<div id=\"oasis-errors\"></div>\n<main id=\"oasis-report\"></main>\n"
     << "<script type=\"application/json\" id=\"oasis-data\">" << script_safe(report_json(r)) << "</script>\n"
     << "<script type=\"application/json\" id=\"oasis-maps\">" << script_safe(extra.str()) << "</script>\n"
     << "<script>\n" << kReportScript << "</script>\n</body></html>\n";
  return os.str();
}

}  // namespace oasis::verify
