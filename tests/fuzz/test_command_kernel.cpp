// tests/fuzz/test_command_kernel.cpp — the --cmd kernel (fuzz::command_kernel) with shell
// programs: the folders and file names of docs/fuzz-protocol.md, options.json, exit statuses and
// signals as crashes with the stderr tail, the timeout killing the whole process group, outputs
// read back by name, and the temporary folders removed.
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "oasis/core/error.hpp"
#include "oasis/io/npy.hpp"
#include "oasis/verify/fuzz.hpp"

namespace {

namespace fs = std::filesystem;
using oasis::io::DType;
using oasis::io::StoredTensor;
using oasis::io::TensorMap;
using oasis::verify::fuzz::command_kernel;
using oasis::verify::fuzz::kernel_timeout;

/// A scratch folder of the test (removed at the end), for files the commands leave behind.
class CommandKernel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("oasis-cmd-kernel-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

StoredTensor tensor(DType dt, oasis::Shape shape, double first) {
  oasis::Tensor<double> t(shape);
  for (oasis::index_t i = 0; i < t.size(); ++i) t[i] = first + 0.5 * static_cast<double>(i);
  return {dt, t};
}

TensorMap inputs() {
  TensorMap m;
  m.emplace("q", tensor(DType::f32, {1, 2, 3, 4}, 1.0));
  m.emplace("k", tensor(DType::bf16, {1, 1, 5, 4}, -2.0));
  m.emplace("v", tensor(DType::f16, {1, 1, 5, 2}, 0.25));
  return m;
}

oasis::io::json::Value options() {
  return oasis::io::json::parse(R"({"causal": true, "scale": 0.125, "key_lengths": [3, 0], "note": "a \"q\""})");
}

std::string read_text(const std::string& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST_F(CommandKernel, InputsAndOptionsInOutputsBackByName) {
  // The program sees q.npy ('<f4'), k.bf16.npy ('<u2' bits), v.npy ('<f2') and options.json; its
  // outputs *.npy, *.bf16.npy and *.f16.npy come back under the names without those suffixes.
  const std::string cmd = "ls {in} > " + path("listing") + " && cp {in}/options.json " + path("options.json") +
                          " && cp {in}/q.npy {out}/out.npy && cp {in}/k.bf16.npy {out}/lse.bf16.npy"
                          " && cp {in}/v.npy {out}/p_null.f16.npy && echo ignored > {out}/notes.txt";
  const TensorMap in = inputs();
  const TensorMap out = command_kernel(cmd, 30)(in, options());
  EXPECT_EQ(read_text(path("listing")), "k.bf16.npy\noptions.json\nq.npy\nv.npy\n");
  const oasis::io::json::Value back = oasis::io::json::parse(read_text(path("options.json")));
  ASSERT_TRUE(back.is_object());
  ASSERT_EQ(back.members.size(), 4u);
  EXPECT_TRUE(back.find("causal")->b);
  EXPECT_EQ(back.find("scale")->text, "0.125");
  EXPECT_EQ(back.find("key_lengths")->items.size(), 2u);
  EXPECT_EQ(back.find("note")->text, "a \"q\"");
  ASSERT_EQ(out.size(), 3u);
  const std::pair<const char*, const char*> pairs[] = {{"out", "q"}, {"lse", "k"}, {"p_null", "v"}};
  for (const auto& [o, i] : pairs) {
    ASSERT_TRUE(out.count(o)) << o;
    EXPECT_EQ(out.at(o).dtype, in.at(i).dtype) << o;
    EXPECT_EQ(out.at(o).values.shape(), in.at(i).values.shape()) << o;
    for (oasis::index_t e = 0; e < in.at(i).values.size(); ++e)
      EXPECT_EQ(out.at(o).values[e], oasis::io::round_to_dtype(in.at(i).values[e], in.at(i).dtype)) << o << " " << e;
  }
}

TEST_F(CommandKernel, FoldersAreFreshPerCallAndRemoved) {
  const std::string cmd = "echo {in} {out} >> " + path("dirs") + " && touch {out}/mark && cp {in}/q.npy {out}/out.npy";
  const auto k = command_kernel(cmd, 30);
  k(inputs(), options());
  k(inputs(), options());
  std::ifstream f(path("dirs"));
  std::string a_in, a_out, b_in, b_out;
  f >> a_in >> a_out >> b_in >> b_out;
  ASSERT_FALSE(b_out.empty());
  EXPECT_NE(a_in, b_in);
  EXPECT_NE(a_out, b_out);
  for (const std::string& d : {a_in, a_out, b_in, b_out}) EXPECT_FALSE(fs::exists(d)) << d;
}

TEST_F(CommandKernel, PathsWithQuotesAndSpacesAreShellQuoted) {
  const fs::path odd = dir_ / "it's a $dir";
  fs::create_directories(odd);
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old ? old : "";
  setenv("TMPDIR", odd.c_str(), 1);
  TensorMap out;
  const std::string msg = message_of([&] { out = command_kernel("cp {in}/q.npy {out}/out.npy", 30)(inputs(), options()); });
  if (old) setenv("TMPDIR", saved.c_str(), 1);
  else unsetenv("TMPDIR");
  EXPECT_EQ(msg, "(no exception)");
  EXPECT_EQ(out.count("out"), 1u);
  EXPECT_TRUE(fs::is_empty(odd));
}

TEST_F(CommandKernel, NonzeroExitIsAnErrorWithTheStderrTail) {
  std::string cmd = "for i in $(seq 1 40); do echo line$i >&2; done; exit 3; : {in} {out}";
  const std::string msg = message_of([&] { command_kernel(cmd, 30)(inputs(), options()); });
  EXPECT_NE(msg.find("exit status 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line40"), std::string::npos) << msg;
  EXPECT_NE(msg.find("line21"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("line20\n"), std::string::npos) << msg;  // the last 20 lines only
  // A crash is not a usage error: the driver must report it, not pass it on as exit status 2.
  EXPECT_THROW(command_kernel(cmd, 30)(inputs(), options()), std::runtime_error);
  try {
    command_kernel(cmd, 30)(inputs(), options());
  } catch (const std::invalid_argument&) {
    ADD_FAILURE() << "a crash thrown as invalid_argument";
  } catch (const kernel_timeout&) {
    ADD_FAILURE() << "a crash thrown as kernel_timeout";
  } catch (const std::runtime_error&) {
  }
}

TEST_F(CommandKernel, SignalIsAnError) {
  const std::string msg = message_of([&] { command_kernel("echo about to die >&2; kill -SEGV $$; : {in} {out}", 30)(inputs(), options()); });
  EXPECT_NE(msg.find("killed by signal 11 (SIGSEGV)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("about to die"), std::string::npos) << msg;
}

TEST_F(CommandKernel, NoOutputsIsAnError) {
  const std::string msg = message_of([&] { command_kernel("echo hi > {out}/out.txt; : {in}", 30)(inputs(), options()); });
  EXPECT_NE(msg.find("the program wrote no outputs"), std::string::npos) << msg;
}

TEST_F(CommandKernel, MalformedOutputIsACrashNotAUsageError) {
  const auto k = command_kernel("echo garbage > {out}/out.npy; : {in}", 30);
  EXPECT_THROW(k(inputs(), options()), std::runtime_error);
  const std::string msg = message_of([&] { k(inputs(), options()); });
  EXPECT_NE(msg.find("unreadable output"), std::string::npos) << msg;
  try {
    k(inputs(), options());
  } catch (const std::invalid_argument&) {
    ADD_FAILURE() << "a malformed output thrown as invalid_argument (the CLI's usage error)";
  } catch (const std::exception&) {
  }
}

TEST_F(CommandKernel, TimeoutKillsTheProcessGroup) {
  // A background grandchild shares the group: both die at the timeout, and the call returns
  // promptly although the grandchild holds the stderr pipe open.
  const std::string pidfile = path("grandchild");
  const std::string cmd = "sleep 300 & echo $! > " + pidfile + "; echo waiting >&2; wait; : {in} {out}";
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    command_kernel(cmd, 0.5)(inputs(), options());
    msg = "(no exception)";
  } catch (const kernel_timeout& e) {
    msg = e.what();
  } catch (const std::exception& e) {
    msg = std::string("wrong type: ") + e.what();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(msg.find("ran past the 0.5 s limit"), std::string::npos) << msg;
  EXPECT_NE(msg.find("waiting"), std::string::npos) << msg;
  EXPECT_LT(secs, 5.0);
  std::ifstream f(pidfile);
  long pid = 0;
  f >> pid;
  ASSERT_GT(pid, 0);
  // Killed: gone, or a zombie waiting for its new parent to reap it.
  bool dead = false;
  for (int i = 0; i < 100 && !dead; ++i) {
    const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
    const std::size_t close = stat.rfind(')');
    dead = stat.empty() || (close != std::string::npos && stat.compare(close + 2, 1, "Z") == 0);
    if (!dead) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(dead) << "grandchild " << pid << " survived the timeout";
  if (!dead) ::kill(static_cast<pid_t>(pid), SIGKILL);
}

TEST_F(CommandKernel, ChattyProgramDoesNotStall) {
  // 4 MB on each stream: more than any pipe buffer, so the program finishes only if both are read.
  const std::string cmd =
      "head -c 4000000 /dev/zero | tr '\\0' x; head -c 4000000 /dev/zero | tr '\\0' y >&2; cp {in}/q.npy {out}/out.npy";
  TensorMap out;
  EXPECT_EQ(message_of([&] { out = command_kernel(cmd, 60)(inputs(), options()); }), "(no exception)");
  EXPECT_EQ(out.count("out"), 1u);
}

TEST_F(CommandKernel, CommandMustNameBothFolders) {
  EXPECT_THROW(command_kernel("python3 k.py {in}", 10), oasis::invalid_argument);
  EXPECT_THROW(command_kernel("python3 k.py {out}", 10), oasis::invalid_argument);
  EXPECT_THROW(command_kernel("python3 k.py {in} {out}", -1), oasis::invalid_argument);
}

TEST_F(CommandKernel, KeepLeavesTheFolders) {
  setenv("OASIS_FUZZ_KEEP", "1", 1);
  const std::string cmd = "echo {in} {out} > " + path("dirs") + " && cp {in}/q.npy {out}/out.npy";
  const std::string msg = message_of([&] { command_kernel(cmd, 30)(inputs(), options()); });
  unsetenv("OASIS_FUZZ_KEEP");
  EXPECT_EQ(msg, "(no exception)");
  std::ifstream f(path("dirs"));
  std::string in, out;
  f >> in >> out;
  EXPECT_TRUE(fs::exists(fs::path(in) / "q.npy"));
  EXPECT_TRUE(fs::exists(fs::path(out) / "out.npy"));
  fs::remove_all(in);
  fs::remove_all(out);
}

}  // namespace
