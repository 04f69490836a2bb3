// tests/fuzz/test_fuzz_catalogue.cpp — the regimes' catalogue and the driver (docs/fuzz.md):
// every op's regimes leave a correct kernel (the library's float32 reference) passing in f32, bf16
// and f16 inputs; docs/fuzz.md names every regime; a printed seed regenerates its run's case; a
// kernel that throws is a crash and one that overruns its time a hang, each with its case written;
// fixed options and missing features skip regimes and say so; bad arguments are named errors.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "oasis/core/error.hpp"
#include "oasis/verify/fuzz.hpp"
#include "oasis_random.hpp"

namespace fz = oasis::verify::fuzz;
using oasis::io::DType;
using oasis::io::TensorMap;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> fuzzed_ops() {
  std::set<std::string> ops;
  for (const auto& r : fz::regimes())
    for (const auto& o : r.ops) ops.insert(o);
  return {ops.begin(), ops.end()};
}

std::string scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("oasis-fuzz-test-" + name);
  fs::remove_all(p);
  return p.string();
}

}  // namespace

TEST(FuzzCatalogue, EveryOpsRegimesPassTheFloatReference) {
  for (std::uint64_t k = 0; k < 2; ++k) {
    fz::FuzzOptions opt;
    opt.dtypes = {DType::f32, DType::bf16, DType::f16};
    opt.seed = oasis::test::base_seed() + k;
    opt.replay_dir = scratch("reference");
    for (const std::string& op : fuzzed_ops()) {
      const fz::FuzzReport r = fz::fuzz(op, fz::reference_kernel(op), opt);
      EXPECT_TRUE(r.passed) << "seed " << opt.seed << "\n" << fz::format_fuzz_report(r);
      EXPECT_GE(r.runs.size(), 3u) << op;
    }
  }
}

TEST(FuzzCatalogue, DocsNameEveryRegimeAndItsOps) {
  std::ifstream f(std::string(OASIS_DOCS_DIR) + "/fuzz.md");
  ASSERT_TRUE(f) << "docs/fuzz.md";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  for (const auto& r : fz::regimes()) {
    EXPECT_NE(doc.find("`" + r.name + "`"), std::string::npos) << "docs/fuzz.md does not name regime " << r.name;
    EXPECT_FALSE(r.targets.empty()) << r.name;
    for (const auto& o : r.ops) EXPECT_NE(doc.find(o), std::string::npos) << o;
  }
}

TEST(FuzzCatalogue, APrintedSeedRegeneratesItsCase) {
  // the inputs the kernel saw in one run equal make_case(op, regime, dtype, seed) bit for bit
  std::map<std::string, TensorMap> seen;
  const fz::Kernel spy = [&](const TensorMap& in, const oasis::io::json::Value& o) {
    seen[std::to_string(seen.size())] = in;
    return fz::reference_kernel("attention")(in, o);
  };
  fz::FuzzOptions opt;
  opt.only = {"gqa"};
  opt.dtypes = {DType::bf16};
  const fz::FuzzReport r = fz::fuzz("attention", spy, opt);
  ASSERT_TRUE(r.passed) << fz::format_fuzz_report(r);
  ASSERT_EQ(r.runs.size(), 2u);
  for (std::size_t i = 0; i < r.runs.size(); ++i) {
    const fz::Case c = fz::make_case("attention", r.runs[i].regime, DType::bf16, r.runs[i].seed);
    const TensorMap& got = seen.at(std::to_string(i));
    ASSERT_EQ(c.inputs.size(), got.size());
    for (const auto& [name, t] : c.inputs) {
      EXPECT_EQ(t.dtype, got.at(name).dtype);
      EXPECT_EQ(t.values.storage(), got.at(name).values.storage()) << r.runs[i].regime << " " << name;
    }
    EXPECT_EQ(c.dims.str(), r.runs[i].dims.str());
  }
}

TEST(FuzzCatalogue, AThrowingKernelIsACrashWithItsCaseWritten) {
  fz::FuzzOptions opt;
  opt.replay_dir = scratch("crash");
  const fz::Kernel always = [](const TensorMap&, const oasis::io::json::Value&) -> TensorMap {
    throw std::runtime_error("tile overflow");
  };
  const fz::FuzzReport r = fz::fuzz("attention", always, opt);
  ASSERT_TRUE(r.has_failure);
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(r.failure.kind, "crash");
  EXPECT_EQ(r.runs.back().verdict, "CRASH");
  EXPECT_NE(r.failure.message.find("tile overflow"), std::string::npos);
  EXPECT_EQ(r.failure.shrunk.dims.Tq, 1);  // a crash shrinks like a wrong answer
  EXPECT_TRUE(fs::exists(fs::path(r.failure.replay_dir) / "q.npy"));
  EXPECT_TRUE(fs::exists(fs::path(r.failure.replay_dir) / "config.json"));
  EXPECT_TRUE(r.failure.replay_command.empty());
  EXPECT_NE(fz::format_fuzz_report(r).find("FIRST FAILURE (crash)"), std::string::npos);
}

TEST(FuzzCatalogue, AnOverrunningKernelIsAHang) {
  fz::FuzzOptions opt;
  opt.replay_dir = scratch("hang");
  opt.timeout_s = 0.2;
  auto stop = std::make_shared<std::atomic<bool>>(false);
  const fz::Kernel slow = [stop](const TensorMap&, const oasis::io::json::Value&) -> TensorMap {
    while (!*stop) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return {};
  };
  const auto t0 = std::chrono::steady_clock::now();
  const fz::FuzzReport r = fz::fuzz("attention", slow, opt);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  *stop = true;  // release the detached thread
  ASSERT_TRUE(r.has_failure);
  EXPECT_EQ(r.failure.kind, "hang");
  EXPECT_EQ(r.runs.size(), 1u);
  EXPECT_EQ(r.failure.shrink_runs, 0);  // an in-process kernel cannot be killed: no shrinking
  EXPECT_LT(s, 10.0);
  EXPECT_TRUE(fs::exists(fs::path(r.failure.replay_dir) / "config.json"));
}

TEST(FuzzCatalogue, FixedOptionsAndMissingFeaturesSkipRegimes) {
  fz::FuzzOptions opt;
  opt.fixed = {{"causal", "true"}};
  opt.without = {"window", "gqa", "decode", "tq_gt_tk", "key_lengths", "bias", "batch", "infinite_null"};
  opt.dtypes = {DType::f32};
  const fz::FuzzReport r = fz::fuzz("attention", fz::reference_kernel("attention"), opt);
  ASSERT_TRUE(r.passed) << fz::format_fuzz_report(r);
  const std::string text = fz::format_fuzz_report(r);
  for (const char* skipped : {"noncausal: needs causal = false (fixed to true)", "tile_boundary_noncausal: needs causal", "window_edges: needs window", "gqa: needs gqa",
                              "decode: needs decode", "16-bit inputs"})
    EXPECT_NE(text.find(skipped), std::string::npos) << skipped << "\n" << text;
  for (const auto& run : r.runs) {
    EXPECT_EQ(run.dims.H, run.dims.Hkv) << run.regime;
    EXPECT_LE(run.dims.Tq, run.dims.Tk) << run.regime;
    EXPECT_EQ(run.dims.B, 1) << run.regime;
  }
}

TEST(FuzzCatalogue, BadArgumentsAreNamedErrors) {
  const fz::Kernel k = fz::reference_kernel("attention");
  auto arg_of = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const oasis::invalid_argument& e) {
      return e.argument();
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(arg_of([&] { fz::fuzz("model", k); }), "op");
  EXPECT_EQ(arg_of([&] { fz::fuzz("nope", k); }), "op");
  EXPECT_EQ(arg_of([&] { fz::reference_kernel("nope"); }), "op");
  fz::FuzzOptions o;
  o.without = {"warp_drive"};
  EXPECT_EQ(arg_of([&] { fz::fuzz("attention", k, o); }), "without");
  o = {};
  o.only = {"no_such_regime"};
  EXPECT_EQ(arg_of([&] { fz::fuzz("attention", k, o); }), "only");
  o = {};
  o.fixed = {{"frobnicate", "1"}};
  EXPECT_EQ(arg_of([&] { fz::fuzz("attention", k, o); }), "fixed");
  o.fixed = {{"causal", "maybe"}};
  EXPECT_EQ(arg_of([&] { fz::fuzz("attention", k, o); }), "fixed");
  o = {};
  o.dtypes = {};
  EXPECT_EQ(arg_of([&] { fz::fuzz("attention", k, o); }), "dtypes");
  o.dtypes = {DType::i32};
  EXPECT_EQ(arg_of([&] { fz::fuzz("attention", k, o); }), "dtypes");
  EXPECT_EQ(arg_of([&] { fz::fuzz("attention", fz::Kernel{}); }), "kernel");
  EXPECT_EQ(arg_of([&] { fz::make_case("attention", "tile_boundary[T=9999]", DType::f32, 1); }), "regime");
  EXPECT_EQ(arg_of([&] { fz::make_case("attention", "psi_ends", DType::f32, 1); }), "regime");
}
