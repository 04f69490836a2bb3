// Hostile inputs to `oasis-verify compare`: a catalogue of malformed, lying and oversized files,
// configurations and model metadata. Each case runs the real CLI in a child process under
// resource limits (address space 1 GiB, 5 s of CPU, killed after 60 s of wall time) and asserts
// exit status 2, a message naming the problem (the key, tensor or file), and that the refusal
// stayed within 1 s of CPU and 256 MiB of peak memory (getrusage of the child): a loader that
// allocates from a lying size, loops over declared blocks or blocks on a FIFO fails here.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "oasis/io/npy.hpp"
#include "oasis/io/safetensors.hpp"
#include "oasis/model/io.hpp"

#ifndef OASIS_VERIFY_CLI
#error "OASIS_VERIFY_CLI must name the oasis-verify executable"
#endif

namespace fs = std::filesystem;
namespace om = oasis::model;
namespace oio = oasis::io;
using oasis::Tensor;

namespace {

struct Outcome {
  int status = -1;        ///< exit status, or -signal
  std::string output;     ///< stdout and stderr together
  double cpu_s = 0;       ///< user + system CPU of the child
  long max_rss_kib = 0;   ///< peak resident set of the child
  bool killed = false;    ///< still running after the wall-clock limit
};

constexpr rlim_t kAddressSpace = rlim_t(1) << 30;  // 1 GiB
constexpr rlim_t kCpuSeconds = 5;
constexpr int kWallSeconds = 60;

// Run oasis-verify with `args` under the limits above; output to a file (a pipe could fill).
Outcome run_cli(const std::vector<std::string>& args, const std::string& log) {
  Outcome o;
  const pid_t pid = fork();
  if (pid == 0) {
    const rlimit cpu{kCpuSeconds, kCpuSeconds};
#if !defined(__SANITIZE_ADDRESS__)
    const rlimit as{kAddressSpace, kAddressSpace};
    setrlimit(RLIMIT_AS, &as);  // AddressSanitizer reserves terabytes of address space for its shadow
#endif
    setrlimit(RLIMIT_CPU, &cpu);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> argv;
    static std::string exe = OASIS_VERIFY_CLI;
    argv.push_back(exe.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  const auto start = std::chrono::steady_clock::now();
  int st = 0;
  rusage ru{};
  for (;;) {
    const pid_t r = wait4(pid, &st, WNOHANG, &ru);
    if (r == pid) break;
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(kWallSeconds)) {
      kill(pid, SIGKILL);
      wait4(pid, &st, 0, &ru);
      o.killed = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  o.status = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
  o.cpu_s = double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  o.max_rss_kib = ru.ru_maxrss;
  std::ifstream in(log);
  std::ostringstream ss;
  ss << in.rdbuf();
  o.output = ss.str();
  return o;
}

struct Case {
  std::string name;
  std::vector<std::string> args;  ///< after "compare"
  std::string message;            ///< must appear in the output
};

void expect_refused(const Case& c, const std::string& dir) {
  SCOPED_TRACE("hostile case '" + c.name + "'");
  std::vector<std::string> args = {"compare"};
  args.insert(args.end(), c.args.begin(), c.args.end());
  const Outcome o = run_cli(args, dir + "/" + c.name + ".log");
  EXPECT_FALSE(o.killed) << "still running after " << kWallSeconds << " s (blocked or looping)";
  EXPECT_EQ(o.status, 2) << o.output;
  EXPECT_NE(o.output.find(c.message), std::string::npos) << "expected '" << c.message << "' in:\n" << o.output;
  EXPECT_LT(o.cpu_s, 1.0) << "CPU seconds";
  EXPECT_LT(o.max_rss_kib, 256 * 1024) << "peak RSS KiB";
  std::printf("  %-28s exit %d  %.3f s CPU  %ld MiB\n", c.name.c_str(), o.status, o.cpu_s, o.max_rss_kib / 1024);
}

std::string bytes_le64(std::uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return s;
}

void write_text(const std::string& path, const std::string& text) { oio::detail::write_file_bytes(path, text); }

// A .npy 1.0 file with the given header dictionary and raw data bytes.
std::string npy_bytes(const std::string& dict, const std::string& data) {
  std::string h = dict;
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  std::string s = "\x93NUMPY";
  s += '\x01';
  s += '\x00';
  s += static_cast<char>(h.size() & 0xFF);
  s += static_cast<char>(h.size() >> 8);
  return s + h + data;
}

// A safetensors file with a raw JSON header and data bytes.
std::string st_bytes(const std::string& header, const std::string& data) {
  return bytes_le64(header.size()) + header + data;
}

class Hostile : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // one directory per process: ctest runs this suite's tests as concurrent processes
    dir_ = ::testing::TempDir() + "oasis_hostile_" + std::to_string(getpid());
    fs::remove_all(dir_);
    // Things that are not regular files, named as tensor files so that they reach the loaders.
    fs::create_directories(dir_ + "/a_directory.npy");
    fs::create_symlink("/dev/zero", dir_ + "/zero.npy");
    // Good inputs of an attention comparison, so that each case breaks one thing only.
    const Tensor<double> qkv({1, 1, 2, 4}, 0.25);
    for (const char* n : {"q", "k", "v", "out"}) oio::write_npy(dir_ + "/" + n + ".npy", oio::StoredTensor{oio::DType::f32, qkv});
    // A tiny model, its ids and logits for the model-level cases.
    om::ModelConfig cfg;
    om::save_model(om::Model<double>::initialized(cfg, 1), dir_ + "/model.safetensors");
    oio::write_npy(dir_ + "/ids.npy", oio::StoredTensor{oio::DType::i64, Tensor<double>({1, 4}, 1.0)});
    oio::write_npy(dir_ + "/logits.npy",
                   oio::StoredTensor{oio::DType::f32, Tensor<double>({1, 4, cfg.vocab_size}, 0.0)});
  }
  // An attention configuration whose input q is `q` (a path) and whose options are `options`.
  static std::string attention_config(const std::string& name, const std::string& q,
                                      const std::string& options = "{}", const std::string& extra = "") {
    const std::string path = dir_ + "/" + name + ".json";
    write_text(path, "{\"op\": \"attention\", \"inputs\": {\"q\": \"" + q +
                         "\", \"k\": \"k.npy\", \"v\": \"v.npy\"}, \"outputs\": {\"out\": \"out.npy\"}, \"options\": " +
                         options + extra + "}");
    return path;
  }
  // A model configuration whose weights file is the good model with `metadata` changed.
  static std::string model_config(const std::string& name, const std::map<std::string, std::string>& metadata,
                                  const std::map<std::string, oio::StoredTensor>& tensors = {}) {
    std::map<std::string, std::string> md;
    oio::TensorMap t = oio::parse_safetensors(oio::detail::read_file_bytes(dir_ + "/model.safetensors"), "model", &md);
    for (const auto& [k, v] : metadata) md[k] = v;
    for (const auto& [k, v] : tensors) t[k] = v;
    oio::write_safetensors(dir_ + "/" + name + ".safetensors", t, md);
    return model_config_for(name, name + ".safetensors");
  }
  static std::string model_config_for(const std::string& name, const std::string& weights) {
    const std::string path = dir_ + "/" + name + ".json";
    write_text(path, "{\"op\": \"model\", \"model\": \"" + weights +
                         "\", \"inputs\": {\"ids\": \"ids.npy\"}, \"outputs\": {\"logits\": \"logits.npy\"}}");
    return path;
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  static std::string dir_;
};
std::string Hostile::dir_;

}  // namespace

// The tensor-file loaders and the file kinds: every case names the file and what is wrong.
TEST_F(Hostile, Loaders) {
  const std::string d = dir_;
  write_text(d + "/lying_header.safetensors", bytes_le64(std::uint64_t(1) << 40) + "{}");
  write_text(d + "/huge_shape.safetensors",
             st_bytes("{\"q\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,4]}}",
                      std::string(4, '\0')));
  write_text(d + "/huge_shape.npy",
             npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }",
                       std::string(8, '\0')));
  write_text(d + "/overflow_shape.npy",
             npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 0), }", ""));
  write_text(d + "/empty.npy", "");
  write_text(d + "/deep.json", std::string(100000, '['));
  write_text(d + "/truncated.json", "{\"op\": \"attention\", \"inp");
  const std::string fifo = d + "/a_fifo.npy";
  fs::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  const std::vector<Case> cases = {
      {"safetensors_lying_header", {attention_config("c1", "lying_header.safetensors")}, "exceeds the 2 bytes"},
      {"safetensors_huge_shape", {attention_config("c2", "huge_shape.safetensors")}, "needs a different byte count"},
      {"npy_huge_shape", {attention_config("c3", "huge_shape.npy")}, "needs a different byte count"},
      {"npy_overflowing_shape", {attention_config("c4", "overflow_shape.npy")}, "needs a different byte count"},
      {"npy_empty", {attention_config("c5", "empty.npy")}, "empty file"},
      {"config_deep_nesting", {d + "/deep.json"}, "nesting deeper than 64"},
      {"config_truncated_json", {d + "/truncated.json"}, "not valid JSON"},
      {"config_missing", {d + "/no_such.json"}, "cannot open"},
      {"config_is_directory", {d + "/a_directory.npy"}, "is a directory, not a regular file"},
      {"config_is_fifo", {fifo}, "is a FIFO (named pipe), not a regular file"},
      {"config_is_device", {"/dev/zero"}, "is a device, not a regular file"},
      {"input_is_directory", {attention_config("c6", "a_directory.npy")}, "is a directory, not a regular file"},
      {"input_is_fifo", {attention_config("c7", "a_fifo.npy")}, "is a FIFO (named pipe), not a regular file"},
      {"input_is_device", {attention_config("c8", "zero.npy")}, "is a device, not a regular file"},
      {"input_missing", {attention_config("c9", "no_such.npy")}, "cannot open"},
  };
  for (const Case& c : cases) expect_refused(c, d);
}

// Configurations: unknown names and impossible options are named, before any heavy work.
TEST_F(Hostile, Configurations) {
  const std::string d = dir_;
  write_text(d + "/unknown_op.json", "{\"op\": \"atention\", \"inputs\": {}, \"outputs\": {}}");
  write_text(d + "/not_object.json", "[1, 2, 3]");
  write_text(d + "/thd_float_offsets.json",
             "{\"op\": \"attention\", \"inputs\": {\"q\": \"q.npy\", \"k\": \"k.npy\", \"v\": \"v.npy\", "
             "\"cu_seqlens_q\": \"q.npy\", \"cu_seqlens_k\": \"q.npy\"}, \"outputs\": {\"out\": \"out.npy\"}, "
             "\"options\": {\"layout\": \"thd\"}}");
  // Block AttnRes: a partial that is not [N, d] of the blocks, blocks of rank 2
  const auto f32 = [](oasis::Shape sh) { return oio::StoredTensor{oio::DType::f32, Tensor<double>(std::move(sh), 0.25)}; };
  oio::write_npy(d + "/blocks.npy", f32({2, 3, 4}));
  oio::write_npy(d + "/partial_bad.npy", f32({3, 5}));
  oio::write_npy(d + "/w4.npy", f32({4}));
  oio::write_npy(d + "/h.npy", f32({3, 4}));
  const auto block_config = [&](const std::string& name, const std::string& blocks, const std::string& partial) {
    write_text(d + "/" + name + ".json", "{\"op\": \"block_attn_res\", \"inputs\": {\"blocks\": \"" + blocks +
                                             "\", \"partial\": \"" + partial +
                                             "\", \"w\": \"w4.npy\"}, \"outputs\": {\"h\": \"h.npy\"}}");
    return d + "/" + name + ".json";
  };
  const std::vector<Case> cases = {
      {"unknown_op", {d + "/unknown_op.json"}, "atention"},
      {"block_partial_shape", {block_config("b1", "blocks.npy", "partial_bad.npy")}, "is not [N, d] = [3, 4]"},
      {"block_blocks_rank_2", {block_config("b2", "partial_bad.npy", "partial_bad.npy")}, "blocks"},
      {"config_not_an_object", {d + "/not_object.json"}, "must be a JSON object"},
      {"unknown_option", {attention_config("k1", "q.npy", "{\"casual\": true}")}, "casual"},
      {"unknown_key", {attention_config("k2", "q.npy", "{}", ", \"outptus\": {}")}, "outptus"},
      {"option_wrong_type", {attention_config("k3", "q.npy", "{\"causal\": 17}")}, "causal"},
      {"window_huge", {attention_config("k4", "q.npy", "{\"window\": 1e300}")}, "window"},
      {"key_lengths_negative", {attention_config("k5", "q.npy", "{\"key_lengths\": [-1]}")}, "key_lengths"},
      {"scale_nan_text", {attention_config("k6", "q.npy", "{\"scale\": \"nan\"}")}, "scale"},
      {"model_key_on_other_op", {attention_config("k7", "q.npy", "{}", ", \"model\": \"model.safetensors\"")},
       "belongs to op model only"},
      // packed (THD) metadata: the offsets missing, or given as a float tensor
      {"thd_without_offsets", {attention_config("k8", "q.npy", "{\"layout\": \"thd\"}")}, "cu_seqlens_q"},
      {"thd_float_offsets", {d + "/thd_float_offsets.json"}, "must be an integer tensor"},
  };
  for (const Case& c : cases) expect_refused(c, d);
}

// Model metadata: sizes beyond what the weights file holds are refused naming the key before
// anything is allocated (a few KB declaring 10^9 blocks or a 2^40-row embedding); products that
// overflow index_t, weights stored as integers, and weights files that are not regular files.
TEST_F(Hostile, ModelMetadata) {
  const std::string p40 = std::to_string(std::int64_t(1) << 40), p62 = std::to_string(std::int64_t(1) << 62);
  const oio::StoredTensor int_norm{oio::DType::i64, Tensor<double>({16}, 1.0)};
  const std::vector<Case> cases = {
      {"n_blocks_1e9", {model_config("m1", {{"oasis.n_blocks", "1000000000"}})}, "oasis.n_blocks"},
      {"n_blocks_1e5", {model_config("m2", {{"oasis.n_blocks", "100000"}})}, "oasis.n_blocks"},
      {"n_blocks_int64_max", {model_config("m3", {{"oasis.n_blocks", "9223372036854775807"}})}, "oasis.n_blocks"},
      {"n_blocks_beyond_int64", {model_config("m4", {{"oasis.n_blocks", "99999999999999999999"}})}, "oasis.n_blocks"},
      {"vocab_size_2^40", {model_config("m5", {{"oasis.vocab_size", p40}})}, "oasis.vocab_size"},
      {"d_ff_2^62", {model_config("m6", {{"oasis.d_ff", p62}})}, "oasis.d_ff"},
      {"vocab_and_d_model_2^40", {model_config("m7", {{"oasis.vocab_size", p40}, {"oasis.d_model", p40}})}, "oasis.vocab_size"},
      {"d_head_2^40", {model_config("m8", {{"oasis.d_head", p40}})}, "oasis.d_head"},
      {"n_heads_2^62", {model_config("m9", {{"oasis.n_heads", p62}})}, "oasis.d_head"},
      {"block_sizes_overflow",
       {model_config("m10", {{"oasis.router", "kimi_block"}, {"oasis.block_sizes", p62 + "," + p62}})}, "oasis.block_sizes"},
      {"n_blocks_negative", {model_config("m11", {{"oasis.n_blocks", "-1"}})}, "oasis.n_blocks"},
      {"unknown_metadata_key", {model_config("m12", {{"oasis.n_block", "2"}})}, "oasis.n_block"},
      {"weights_as_integers", {model_config("m13", {}, {{"norm.weight", int_norm}})}, "norm.weight"},
      {"weights_is_directory", {model_config_for("m14", "a_directory.npy")}, "is a directory, not a regular file"},
      {"weights_missing", {model_config_for("m15", "no_such.safetensors")}, "cannot open"},
  };
  for (const Case& c : cases) expect_refused(c, dir_);
}
