// tests/verify/compare_test_util.hpp — shared by the tests of `oasis-verify compare`: a fresh
// temporary directory, a configuration run through compare, a tensor of a report by name, the
// report's first wrong step, its failing tensors and a one-line-per-tensor summary, and the
// configuration of a model check.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <unistd.h>

#include "oasis/verify/compare.hpp"

namespace oasis::verify_test {

inline std::string tmp_dir(const std::string& leaf) {
  const std::string d = ::testing::TempDir() + "oasis_cmp_" + std::to_string(::getpid()) + "_" + leaf;
  std::string cmd = "mkdir -p '" + d + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return d;
}

inline void write_text(const std::string& path, const std::string& s) {
  std::ofstream f(path);
  f << s;
}

inline verify::CompareReport run_config(const std::string& dir, const std::string& json) {
  write_text(dir + "/config.json", json);
  return verify::compare_config_file(dir + "/config.json");
}

inline const verify::TensorReport& find(const verify::CompareReport& r, const std::string& name) {
  for (const auto& t : r.tensors)
    if (t.name == name) return t;
  throw std::runtime_error("tensor " + name + " not in the report");
}

/// The names of the report's failing tensors.
inline std::set<std::string> failing_tensors(const verify::CompareReport& r) {
  std::set<std::string> s;
  for (const auto& t : r.tensors)
    if (!t.passed) s.insert(t.name);
  return s;
}

/// The oracle line and each tensor's verdict and worst ratio, for a failure message.
inline std::string describe_report(const verify::CompareReport& r) {
  std::string s = "oracle " + r.oracle;
  for (const auto& t : r.tensors)
    s += "\n  " + t.name + " " + verify::verdict_word(t) + " worst ratio " + std::to_string(t.worst_ratio);
  return s;
}

/// A call of `op` that must be an input error naming `name` (oasis::invalid_argument).
inline void expect_named_error(const std::string& op, const io::TensorMap& in, const io::TensorMap& out,
                               const std::string& options, const std::string& name) {
  try {
    verify::check(op, in, out, io::json::parse(options), verify::CompareOptions{});
    ADD_FAILURE() << "no error for " << name << " (" << options << ")";
  } catch (const oasis::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

/// The report's "first wrong step" note names this tensor.
inline std::string first_wrong(const verify::CompareReport& r) {
  const std::string tag = "first wrong step (forward order): ";
  for (const auto& n : r.notes)
    if (n.rfind(tag, 0) == 0) return n.substr(tag.size(), n.find(' ', tag.size()) - tag.size());
  return "";
}

/// The model check of the files model.safetensors (weights) and run.safetensors (inputs and trace).
inline constexpr const char* kModelCfg =
    R"({"op": "model", "model": "model.safetensors", "inputs": "run.safetensors", "outputs": "run.safetensors"})";

}  // namespace oasis::verify_test
