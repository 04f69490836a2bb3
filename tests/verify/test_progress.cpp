// tests/verify/test_progress.cpp — progress of a long check (CompareOptions::progress, docs/report.md):
// the callback is called once the check has run 2 s, last with `finished` and every element
// counted at the oracle's level, and never for a quick check; the CLI draws its status line only
// when stderr is a terminal (run under script(1)'s pseudo-terminal) and not with --no-progress.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>
#include <sys/wait.h>
#include <unistd.h>

#include "oasis/io/safetensors.hpp"
#include "oasis/ops/attention.hpp"
#include "oasis/verify/compare.hpp"

#ifndef OASIS_VERIFY_CLI
#error "OASIS_VERIFY_CLI must name the oasis-verify executable"
#endif

namespace fs = std::filesystem;
namespace io = oasis::io;
using oasis::index_t;
using oasis::Tensor;

namespace {

/// Causal attention of [1, 2, T, 32] in float32 storage: several seconds in mp50 for T = 576.
io::TensorMap attention_case(index_t T) {
  std::mt19937_64 rng(9);
  std::normal_distribution<double> n01;
  auto draw = [&] {
    Tensor<double> x({1, 2, T, 32});
    for (index_t i = 0; i < x.size(); ++i) x[i] = io::round_to_dtype(n01(rng), io::DType::f32);
    return x;
  };
  const Tensor<double> q = draw(), k = draw(), v = draw();
  oasis::AttentionOptions ao;
  ao.causal = true;
  const oasis::AttentionResult<double> r = oasis::token_attention(q, k, v, ao);
  io::TensorMap m;
  for (auto [name, t] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}, {"out", &r.out}}) {
    Tensor<double> s = *t;
    for (index_t i = 0; i < s.size(); ++i) s[i] = io::round_to_dtype(s[i], io::DType::f32);
    m[name] = {io::DType::f32, s};
  }
  return m;
}

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(Progress, CalledOnlyForALongCheckAndLastWhenFinished) {
  const io::TensorMap m = attention_case(576);
  const io::TensorMap in{{"q", m.at("q")}, {"k", m.at("k")}, {"v", m.at("v")}}, out{{"out", m.at("out")}};
  oasis::verify::CompareOptions opt;
  opt.oracle = oasis::verify::Oracle::mp50;
  std::vector<oasis::verify::Progress> calls;
  opt.progress = [&](const oasis::verify::Progress& p) { calls.push_back(p); };
  io::json::Value options = io::json::parse(R"({"causal": true})");
  const auto t0 = std::chrono::steady_clock::now();
  const auto rep = oasis::verify::check("attention", in, out, options, opt);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(rep.passed) << oasis::verify::format_report(rep);
  if (secs < 2.5) GTEST_SKIP() << "the check took " << secs << " s here: no progress is due";
  ASSERT_FALSE(calls.empty());
  for (std::size_t i = 0; i + 1 < calls.size(); ++i) {
    EXPECT_FALSE(calls[i].finished);
    EXPECT_GE(calls[i].seconds, 2.0);
    EXPECT_LE(calls[i].elements_done, calls[i + 1].elements_done);
  }
  const auto& last = calls.back();
  EXPECT_TRUE(last.finished);
  EXPECT_EQ(last.op, "attention");
  EXPECT_EQ(last.elements_done, m.at("out").values.size());
  EXPECT_EQ(last.elements_total, last.elements_done);
  EXPECT_EQ(last.elements_mp50, last.elements_done);
  EXPECT_EQ(last.level, "mp50");
  EXPECT_EQ(last.tensors_done, 1);
  EXPECT_EQ(last.tensors_total, 1);

  // a quick check: never called
  calls.clear();
  const io::TensorMap small = attention_case(4);
  (void)oasis::verify::check("attention", {{"q", small.at("q")}, {"k", small.at("k")}, {"v", small.at("v")}},
                             {{"out", small.at("out")}}, options, opt);
  EXPECT_TRUE(calls.empty());
}

TEST(Progress, TheCommandLineDrawsItOnlyOnATerminal) {
  if (std::system("command -v script > /dev/null 2>&1") != 0) GTEST_SKIP() << "script(1) is not installed";
  const fs::path dir = fs::path(::testing::TempDir()) / ("oasis_progress_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  io::write_safetensors((dir / "a.safetensors").string(), attention_case(576));
  std::ofstream(dir / "a.json") << R"({"op": "attention", "inputs": "a.safetensors", "outputs": "a.safetensors",
                                     "options": {"causal": true}})";
  const std::string cmd = std::string("'") + OASIS_VERIFY_CLI + "' compare '" + (dir / "a.json").string() + "' --oracle mp50";
  const std::string tty = (dir / "tty.log").string(), pipe_err = (dir / "err.log").string();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(std::system(("script -qec \"" + cmd + "\" /dev/null > '" + tty + "' 2>&1").c_str()), 0) << slurp(tty);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(std::system((cmd + " > /dev/null 2> '" + pipe_err + "'").c_str()), 0);
  EXPECT_EQ(slurp(pipe_err).find("oracle:"), std::string::npos) << "progress on a stderr that is not a terminal";
  ASSERT_EQ(std::system(("script -qec \"" + cmd + " --no-progress\" /dev/null > '" + tty + ".off' 2>&1").c_str()), 0);
  EXPECT_EQ(slurp(tty + ".off").find("oracle: mp50,"), std::string::npos) << "progress despite --no-progress";
  if (secs < 2.5) GTEST_SKIP() << "the check took " << secs << " s here: no progress is due";
  const std::string log = slurp(tty);
  EXPECT_NE(log.find("attention: 1 of 1 tensors"), std::string::npos) << log;
  EXPECT_NE(log.find("oracle: mp50,"), std::string::npos) << log;
  EXPECT_NE(log.find("(100 %)"), std::string::npos) << "the last line counts every element\n" << log;
}

}  // namespace
