// src/verify/fuzz/fuzz_report.cpp — the fuzz report as text and JSON, and the replay folder of a
// failing case (the layout of `oasis-verify compare`'s configuration, docs/verify.md).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "oasis/core/error.hpp"
#include "oasis/io/npy.hpp"
#include "regimes.hpp"

namespace oasis::verify::fuzz {
namespace {

std::string file_name(const std::string& name, io::DType d) {
  return name + (d == io::DType::bf16 ? ".bf16.npy" : ".npy");
}

std::string pad(std::string s, std::size_t w) {  // at least one space after the field
  s.append(s.size() < w ? w - s.size() : 1, ' ');
  return s;
}

std::string ratio_text(double r) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g", r);
  return b;
}

}  // namespace

std::string write_replay(const Case& c, const io::TensorMap& outputs, const std::string& dir,
                         const std::string& description) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  OASIS_REQUIRE(!ec, "replay_dir", "cannot create ", dir, ": ", ec.message());
  std::string ins, outs;
  for (const auto& [name, t] : c.inputs) {
    const std::string f = file_name(name, t.dtype);
    io::write_npy((fs::path(dir) / f).string(), t);
    ins += (ins.empty() ? "" : ", ") + io::json::quote(name) + ": " + io::json::quote(f);
  }
  for (const auto& [name, t] : outputs) {
    const std::string f = file_name("output." + name, t.dtype);
    io::write_npy((fs::path(dir) / f).string(), t);
    outs += (outs.empty() ? "" : ", ") + io::json::quote(name) + ": " + io::json::quote(f);
  }
  {  // the options as the --cmd protocol hands them, so that the folder is also a program's {in}
    std::ofstream opts((fs::path(dir) / "options.json").string());
    opts << c.options_json() << "\n";
  }
  const std::string cfg = (fs::path(dir) / "config.json").string();
  std::ofstream o(cfg);
  o << "{\n  \"op\": " << io::json::quote(c.op) << ",\n  \"inputs\": {" << ins << "},\n  \"outputs\": {" << outs
    << "},\n  \"options\": " << c.options_json() << ",\n  \"description\": " << io::json::quote(description) << "\n}\n";
  OASIS_REQUIRE(static_cast<bool>(o), "replay_dir", "cannot write ", cfg);
  return "oasis-verify compare " + cfg;
}

std::string format_fuzz_report(const FuzzReport& r) {
  std::string s = "fuzz " + r.op + ": " + std::to_string(r.runs.size()) + (r.runs.size() == 1 ? " run\n" : " runs\n");
  for (const Run& run : r.runs)
    s += "  " + pad(run.regime, 30) + pad(std::string(io::to_string(run.dtype)), 6) + pad(run.verdict, 13) +
         pad("worst " + ratio_text(run.worst_ratio), 14) + "seed " + std::to_string(run.seed) + "  " + run.dims.str() +
         (run.verdict != "PASS" && !run.detail.empty() ? "  (" + run.detail + ")" : "") + "\n";
  if (!r.not_exercised.empty()) {
    s += "never exercised:\n";
    for (const std::string& n : r.not_exercised) s += "  " + n + "\n";
  }
  if (r.has_failure) {
    const Failure& f = r.failure;
    s += "\nFIRST FAILURE (" + f.kind + ") in regime " + f.original.regime + ", " +
         std::string(io::to_string(f.original.dtype)) + ", seed " + std::to_string(f.original.seed) + "\n";
    s += "  found at   " + f.original.dims.str() + "\n";
    s += "  shrunk to  " + f.shrunk.dims.str() + "  (" + std::to_string(f.shrink_runs) + " kernel calls";
    for (std::size_t i = 0; i < f.shrink_steps.size(); ++i) s += (i ? ", " : "; ") + f.shrink_steps[i];
    s += ")\n  options    " + f.shrunk.options_json() + "\n";
    if (!f.message.empty()) s += "  kernel     " + f.message + "\n";
    if (f.kind == "wrong") {
      s += "\n" + format_report(f.report);
      if (s.back() != '\n') s += "\n";
    }
    s += "\n  case written to " + f.replay_dir + "\n";
    if (!f.replay_command.empty()) s += "  replay: " + f.replay_command + "\n";
    s += "fuzz: FAIL\n";
  } else {
    s += r.runs.empty() ? "fuzz: NOTHING RUN (every regime was skipped)\n"
         : r.passed     ? "fuzz: PASS (every run passed)\n"
                        : "fuzz: NOT PASSED (some runs were left undecided)\n";
  }
  return s;
}

std::string fuzz_report_json(const FuzzReport& r) {
  using io::json::quote;
  std::string s = "{\"op\": " + quote(r.op) + ", \"passed\": " + (r.passed ? "true" : "false") + ", \"runs\": [";
  for (std::size_t i = 0; i < r.runs.size(); ++i) {
    const Run& x = r.runs[i];
    s += std::string(i ? ", " : "") + "{\"regime\": " + quote(x.regime) + ", \"dtype\": " +
         quote(std::string(io::to_string(x.dtype))) + ", \"seed\": " + quote(std::to_string(x.seed)) + ", \"dims\": " +
         quote(x.dims.str()) + ", \"verdict\": " + quote(x.verdict) + ", \"worst_ratio\": " +
         (std::isfinite(x.worst_ratio) ? detail::num(x.worst_ratio) : "null") + ", \"detail\": " + quote(x.detail) + "}";
  }
  s += "], \"never_exercised\": [";
  for (std::size_t i = 0; i < r.not_exercised.size(); ++i) s += (i ? ", " : "") + quote(r.not_exercised[i]);
  s += "], \"failure\": ";
  if (!r.has_failure) return s + "null}";
  const Failure& f = r.failure;
  s += "{\"kind\": " + quote(f.kind) + ", \"regime\": " + quote(f.original.regime) + ", \"dtype\": " +
       quote(std::string(io::to_string(f.original.dtype))) + ", \"seed\": " + quote(std::to_string(f.original.seed)) +
       ", \"found_at\": " + quote(f.original.dims.str()) + ", \"shrunk_to\": " + quote(f.shrunk.dims.str()) +
       ", \"shrink_runs\": " + std::to_string(f.shrink_runs) + ", \"shrink_steps\": [";
  for (std::size_t i = 0; i < f.shrink_steps.size(); ++i) s += (i ? ", " : "") + quote(f.shrink_steps[i]);
  s += "], \"options\": " + f.shrunk.options_json() + ", \"message\": " + quote(f.message) + ", \"replay_dir\": " +
       quote(f.replay_dir) + ", \"replay_command\": " + quote(f.replay_command) + ", \"report\": " +
       (f.kind == "wrong" ? report_json(f.report) : "null") + "}}";
  return s;
}

}  // namespace oasis::verify::fuzz
