// tests/fuzz/test_fuzz_zoo.cpp — the fuzzer's zoo (issue 33, item 4): correct sink-attention kernels
// fuzz clean, and each of fifteen plausible sink bugs (bug_zoo.hpp) is found, as a wrong answer,
// and shrunk to a small case written as a replay folder. The kernels are first judged without the
// fuzzer, by check() on hand-made cases of each regime (zoo_cases.hpp).
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "bug_zoo.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis/verify/fuzz.hpp"
#include "zoo_cases.hpp"

namespace io = oasis::io;
namespace verify = oasis::verify;
namespace zoo = oasis::fuzz_zoo;

namespace {

const char* dtype_name(io::DType d) { return d == io::DType::bf16 ? "bf16" : d == io::DType::f16 ? "f16" : "f32"; }

/// The case c run by kernel sp and judged by check(); the forward's stored out and lse (from the
/// correct tiled kernel) join a backward's inputs when `stored`.
verify::CompareReport run_case(const zoo::Spec& sp, const zoo::ZooCase& c, io::DType d, std::uint64_t seed, bool stored) {
  io::TensorMap in = zoo::zoo_inputs(c, sp.op, d, seed);
  const io::json::Value opt = zoo::zoo_options(c);
  if (stored && sp.op == "attention_backward") {
    const io::TensorMap f = zoo::kernel(zoo::correct_kernels()[0])(in, opt);
    in.emplace("out", f.at("out"));
    in.emplace("lse", f.at("lse"));
  }
  const io::TensorMap out = zoo::kernel(sp)(in, opt);
  return verify::check(sp.op, in, out, opt);
}

bool supports(const zoo::Spec& sp, const zoo::ZooCase& c) {
  auto lacks = [&](const char* f) { return sp.without.count(f) > 0; };
  bool inf = false;
  for (double s : c.sinks) inf = inf || std::isinf(s);
  return !(lacks("infinite_null") && inf) && !(lacks("key_lengths") && !c.len.empty()) &&
         !(lacks("window") && c.window > 0) && !(lacks("bias") && c.bias) && !(lacks("tq_gt_tk") && c.Tq > c.Tk) &&
         !(lacks("grad_lse") && c.grad_lse) && !(lacks("grad_p_null") && c.grad_p_null);
}

}  // namespace

TEST(FuzzZooDirect, CorrectKernelsPassEveryHandMadeCase) {
  const auto t0 = std::chrono::steady_clock::now();
  int n = 0;
  for (const zoo::Spec& sp : zoo::correct_kernels())
    for (const zoo::ZooCase& c : zoo::zoo_cases())
      for (io::DType d : {io::DType::f32, io::DType::bf16})
        for (bool stored : {false, true}) {
          if (stored && sp.op != "attention_backward") continue;
          const std::uint64_t seed = 1000 + static_cast<std::uint64_t>(n++);
          const verify::CompareReport r = run_case(sp, c, d, seed, stored);
          EXPECT_TRUE(r.passed) << sp.name << " on " << c.name << " (" << dtype_name(d) << (stored ? ", stored forward" : "")
                                << ", seed " << seed << ")\n"
                                << verify::format_report(r);
        }
  std::printf("%d checks in %.1f s (base seed %llu, salts 1000-%d)\n", n,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              static_cast<unsigned long long>(oasis::test::base_seed()), 999 + n);
}

TEST(FuzzZooDirect, EachBugFailsOnTheCaseOfItsRegime) {
  // bug -> the hand-made case of its regime (the fuzzer's regimes find them on their own)
  const std::map<std::string, std::string> where = {
      {"01_sink_linear", "basic_gqa"},           {"02_sink_outside_max", "sinks_far_above"},
      {"03_nan_masked_rows", "key_length_0"},    {"04_merge_linear", "huge_sinks"},
      {"05_bwd_p_without_sink", "basic_gqa"},    {"06_dsink_without_dlse", "grad_lse"},
      {"07_sink_dropped_decode", "decode"},      {"08_dsink_bf16", "basic_gqa"},
      {"09_sink_as_bias", "basic_gqa"},          {"10_lse_log2", "basic_gqa"},
      {"11_lse_without_sink", "basic_gqa"},      {"12_mask_sentinel", "below_sentinel"},
      {"13_bwd_padded_tile_zero", "tile_65"},    {"14_sink_per_kv_head", "mqa_8"},
      {"15_causal_top_left", "chunked_prefill"}};
  for (const zoo::Spec& sp : zoo::bug_kernels()) {
    const auto it = where.find(sp.name);
    ASSERT_NE(it, where.end()) << sp.name;
    std::string fails;
    int n = 0, nf = 0;
    for (const zoo::ZooCase& c : zoo::zoo_cases()) {
      if (!supports(sp, c)) continue;
      const verify::CompareReport r = run_case(sp, c, io::DType::f32, 77, false);
      if (c.name == it->second) EXPECT_FALSE(r.passed) << sp.name << " passes " << c.name;
      ++n;
      if (!r.passed) fails += (nf++ ? ", " : "") + c.name;
    }
    std::printf("%s fails %d of %d cases (base seed %llu, salt 77): %s\n", sp.name.c_str(), nf, n,
                static_cast<unsigned long long>(oasis::test::base_seed()), fails.c_str());
  }
}

// ---- through the fuzzer ---------------------------------------------------------------------------

namespace {

namespace fuzz = oasis::verify::fuzz;
namespace fs = std::filesystem;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

fuzz::FuzzOptions options_for(const zoo::Spec& sp, std::vector<io::DType> dtypes) {
  fuzz::FuzzOptions o;
  o.dtypes = std::move(dtypes);
  o.without = sp.without;
  o.seed = oasis::test::base_seed();  // 20261129, or $OASIS_TEST_SEED (scripts/soak.sh)
  o.replay_dir = (fs::temp_directory_path() / ("oasis-fuzz-zoo-" + std::to_string(::getpid())) / sp.name).string();
  return o;
}

std::string names(const std::vector<zoo::Spec>& v, std::size_t i) { return v[i].name; }

class FuzzZooCorrect : public ::testing::TestWithParam<std::size_t> {};
class FuzzZooBug : public ::testing::TestWithParam<std::size_t> {};

}  // namespace

// A correct kernel fuzzes clean in f32 and bf16 inputs: every regime of its op PASSes.
TEST_P(FuzzZooCorrect, FuzzesClean) {
  const zoo::Spec sp = zoo::correct_kernels()[GetParam()];
  const fuzz::FuzzOptions o = options_for(sp, {io::DType::f32, io::DType::bf16});
  const auto t0 = std::chrono::steady_clock::now();
  const fuzz::FuzzReport r = fuzz::fuzz(sp.op, zoo::kernel(sp), o);
  std::printf("%s (%s): seed %llu, %zu runs, %.1f s\n", sp.name.c_str(), sp.op.c_str(),
              static_cast<unsigned long long>(o.seed), r.runs.size(), seconds_since(t0));
  EXPECT_TRUE(r.passed && !r.has_failure) << fuzz::format_fuzz_report(r);
  EXPECT_TRUE(r.not_exercised.empty()) << fuzz::format_fuzz_report(r);  // it lacks no feature
  EXPECT_GT(r.runs.size(), 40u);
}

INSTANTIATE_TEST_SUITE_P(Zoo, FuzzZooCorrect, ::testing::Range<std::size_t>(0, zoo::correct_kernels().size()),
                         [](const auto& i) { return names(zoo::correct_kernels(), i.param); });

// Each bug is found as a wrong answer, shrunk to a small case, and written as a replay folder.
TEST_P(FuzzZooBug, IsFoundAndShrunk) {
  const zoo::Spec sp = zoo::bug_kernels()[GetParam()];
  const fuzz::FuzzOptions o = options_for(sp, {io::DType::f32});
  const auto t0 = std::chrono::steady_clock::now();
  const fuzz::FuzzReport r = fuzz::fuzz(sp.op, zoo::kernel(sp), o);
  const double secs = seconds_since(t0);
  ASSERT_TRUE(r.has_failure) << sp.name << " (" << sp.regime << ") not found\n" << fuzz::format_fuzz_report(r);
  const fuzz::Failure& f = r.failure;
  std::printf("%s: seed %llu, found in %s (case seed %llu, %s), shrunk in %d runs to %s [%s], %.1f s\n", sp.name.c_str(),
              static_cast<unsigned long long>(o.seed), f.original.regime.c_str(),
              static_cast<unsigned long long>(f.original.seed), f.original.dims.str().c_str(), f.shrink_runs,
              f.shrunk.dims.str().c_str(), f.shrunk.regime.c_str(), secs);
  for (const std::string& s : f.shrink_steps) std::printf("    %s\n", s.c_str());
  EXPECT_EQ(f.kind, "wrong") << f.message;
  const fuzz::Dims& d = f.shrunk.dims;
  EXPECT_LE(d.B, 2) << d.str();
  EXPECT_LE(d.H, 2) << d.str();
  EXPECT_LE(d.Tq, 16) << d.str();
  if (sp.bug == zoo::Bug::bwd_padded_tile_zero) {
    // the padded tile exists whenever Tk is not a multiple of 64: it shrinks below one tile
    EXPECT_NE(d.Tk % 64, 0) << d.str();
    EXPECT_LE(d.Tk, 16) << d.str();
  } else {
    EXPECT_LE(d.Tk, 16) << d.str();
  }
  // what the bug needs survives shrinking: a GQA group (H shrinks only with Hkv: H = 2 Hkv), the
  // offset Tk - Tq that top-left alignment ignores, the split path taken for Tq < Tk
  if (sp.bug == zoo::Bug::sink_per_kv_head) EXPECT_GT(d.H, d.Hkv) << d.str();
  if (sp.bug == zoo::Bug::causal_top_left) EXPECT_NE(d.Tq, d.Tk) << d.str();
  if (sp.bug == zoo::Bug::sink_dropped_decode) EXPECT_LT(d.Tq, d.Tk) << d.str();
  EXPECT_FALSE(f.report.passed);
  const fs::path cfg = fs::path(f.replay_dir) / "config.json";
  ASSERT_TRUE(fs::exists(cfg)) << f.replay_dir;
  EXPECT_NE(f.replay_command.find(cfg.string()), std::string::npos) << f.replay_command;
  // the replay folder reproduces the failure (what `oasis-verify compare` reads)
  const verify::CompareReport replay = verify::compare_config_file(cfg.string());
  EXPECT_FALSE(replay.passed) << verify::format_report(replay);
  EXPECT_EQ(verify::verdict_word(replay), verify::verdict_word(f.report));
  if (!HasFailure()) {  // kept for a failing test
    std::error_code ec;
    fs::remove_all(o.replay_dir, ec);
    fs::remove(fs::path(o.replay_dir).parent_path(), ec);  // the run's folder, once empty
  }
}

INSTANTIATE_TEST_SUITE_P(Zoo, FuzzZooBug, ::testing::Range<std::size_t>(0, zoo::bug_kernels().size()),
                         [](const auto& i) { return names(zoo::bug_kernels(), i.param); });
