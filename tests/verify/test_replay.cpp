// The replay writer of failing checks (tests/support/replay.hpp), tested by forcing a failure:
// an attention result with one element moved far beyond any tolerance is written as a replay and
// `oasis-verify compare` on the written configuration must FAIL (exit 1) naming that element;
// the same case unperturbed must PASS (exit 0), so the writer carries the inputs, the options
// (normaliser, null logits, causal, window, key lengths, scale, bias, layout) and the outputs
// exactly. OASIS_REPLAY_DIR chooses where the files go.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "oasis/oasis.hpp"
#include "oasis_random.hpp"
#include "replay.hpp"

#ifndef OASIS_VERIFY_CLI
#error "OASIS_VERIFY_CLI must name the oasis-verify executable"
#endif

using namespace oasis;

namespace {

struct Cli {
  int status;
  std::string output;
};

Cli compare(const std::string& config) {
  const std::string log = config + ".log";
  const std::string cmd = std::string("\"") + OASIS_VERIFY_CLI + "\" compare \"" + config + "\" > \"" + log + "\" 2>&1";
  const int st = std::system(cmd.c_str());
  std::ifstream in(log);
  std::ostringstream ss;
  ss << in.rdbuf();
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, ss.str()};
}

struct Attn {
  Tensor<float> q, k, v;
  AttentionOptions opt;
};

// A case with every option the writer carries set away from its default.
Attn make_case(AttentionLayout layout) {
  auto rng = test::make_rng(9100);
  const index_t B = 2, H = 2, Hkv = 1, Tq = 5, Tk = 7, d = 4;
  const bool bthd = layout == AttentionLayout::bthd;
  Attn a{test::randn<float>(bthd ? Shape{B, Tq, H, d} : Shape{B, H, Tq, d}, rng),
         test::randn<float>(bthd ? Shape{B, Tk, Hkv, d} : Shape{B, Hkv, Tk, d}, rng),
         test::randn<float>(bthd ? Shape{B, Tk, Hkv, d} : Shape{B, Hkv, Tk, d}, rng), {}};
  a.opt.normalizer = RowNorm::softmax1;
  a.opt.null_logits = {0.5, -1.25};
  a.opt.causal = true;
  a.opt.window = 4;
  a.opt.key_lengths = {7, 6};
  a.opt.scale = 0.375;
  a.opt.layout = layout;
  a.opt.bias = test::randn<double>({Tq, Tk}, rng, 0.5);
  return a;
}

}  // namespace

TEST(ReplayWriter, ReplaysReproduceTheVerdict) {
  const std::string root = ::testing::TempDir() + "oasis_replay_test";
  ASSERT_EQ(setenv("OASIS_REPLAY_DIR", root.c_str(), 1), 0);
  EXPECT_EQ(replay::replay_root(), root);
  for (const AttentionLayout layout : {AttentionLayout::bhtd, AttentionLayout::bthd}) {
    const std::string L(to_string(layout));
    SCOPED_TRACE("layout " + L);
    const Attn a = make_case(layout);
    const AttentionResult<float> got = token_attention(a.q, a.k, a.v, a.opt);
    const AttentionResult<long double> ref =
        token_attention(a.q.cast<long double>(), a.k.cast<long double>(), a.v.cast<long double>(), a.opt);

    const std::string ok = replay::write("correct_" + L, replay::attention_case(a.q, a.k, a.v, a.opt, got, ref, "unperturbed"));
    EXPECT_EQ(ok, root + "/correct_" + L + "/config.json");
    for (const char* f : {"q.npy", "k.npy", "v.npy", "bias.npy", "out.npy", "lse.npy", "p_null.npy", "reference.out.npy"})
      EXPECT_TRUE(std::filesystem::exists(root + "/correct_" + L + "/" + f)) << f;
    const Cli pass = compare(ok);
    EXPECT_EQ(pass.status, 0) << pass.output;

    AttentionResult<float> wrong = got;
    wrong.out[3] += 0.01f;  // out[0, 0, 0, 3] in both layouts; far beyond every policy's bound
    const std::string bad = replay::write("perturbed_" + L, replay::attention_case(a.q, a.k, a.v, a.opt, wrong, ref, "out moved"));
    const Cli fail = compare(bad);
    EXPECT_EQ(fail.status, 1) << fail.output;
    EXPECT_NE(fail.output.find("out[0, 0, 0, 3]"), std::string::npos) << fail.output;
  }
  unsetenv("OASIS_REPLAY_DIR");
}
