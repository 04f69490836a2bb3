// tests/support/replay.hpp — replayable failures: a failing parity or property check writes its
// inputs, options, result and reference as .npy files plus a compare configuration
// (docs/verify.md, "The configuration"), so that
//     oasis-verify compare DIR/config.json
// reruns the verdict of the compare engine on exactly the failing case. Shared by the parity
// tests of cpu_fast and of the CUDA backend (emulator) and by the property tests.
//
// Layout of DIR = replay_root()/NAME:
//   <input>.npy       every input the op reads (q, k, v, bias, ...), stored exactly (f32 or f64)
//   <output>.npy      the result under test (out, lse, p_null, probs, ...), stored exactly
//   reference.<output>.npy   what the failing check compared it with (for inspection; compare
//                    recomputes its own reference in mp50)
//   config.json       op, inputs, outputs, options; "description" holds the check's message
// replay_root(): $OASIS_REPLAY_DIR if set, else the build tree's replay/ (OASIS_REPLAY_DEFAULT_DIR,
// set by tests/support/CMakeLists.txt), else the system temporary directory.
//
// What a replay reproduces: compare judges the result with its tolerance policy (exit 1 on FAIL).
// A parity check (|x - x_hp| <= 2 |x_ref - x_hp| + floor) is tighter than compare's policies for
// most elements, so a parity failure within compare's bounds replays as PASS; the written
// reference and description still hold what failed.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "oasis/ops/attention.hpp"
#include "oasis/io/json.hpp"
#include "oasis/io/npy.hpp"

namespace oasis::replay {

/// A failing case in the terms of `oasis-verify compare`.
struct Case {
  std::string op;              ///< compare op ("attention", "depth", ...)
  io::TensorMap inputs;        ///< as the op reads them
  io::TensorMap outputs;       ///< the result under test
  io::TensorMap reference;     ///< what it was checked against (written as reference.<name>.npy)
  std::string options = "{}";  ///< the op's options as a JSON object
  std::string description;     ///< the failing check's message (seed, sizes, violations)
};

/// Where replays are written (see the header comment).
inline std::string replay_root() {
  if (const char* e = std::getenv("OASIS_REPLAY_DIR"); e && *e) return e;
#ifdef OASIS_REPLAY_DEFAULT_DIR
  return OASIS_REPLAY_DEFAULT_DIR;
#else
  return (std::filesystem::temp_directory_path() / "oasis-replay").string();
#endif
}

/// The attention options as compare's JSON options (docs/verify.md, op attention); the bias is
/// an input tensor ("bias"), not an option. return_probs is decided by the outputs present.
inline std::string attention_options_json(const AttentionOptions& opt) {
  auto num = [](double x) {
    char b[40];
    std::snprintf(b, sizeof b, "%.17g", x);
    return std::string(b);
  };
  std::string s = "{\"normalizer\": " + io::json::quote(std::string(to_string(opt.normalizer))) +
                  ", \"causal\": " + (opt.causal ? "true" : "false") + ", \"window\": " + std::to_string(opt.window) +
                  ", \"layout\": " + io::json::quote(std::string(to_string(opt.layout)));
  if (opt.scale) s += ", \"scale\": " + num(*opt.scale);
  s += ", \"key_lengths\": [";
  for (std::size_t i = 0; i < opt.key_lengths.size(); ++i) s += (i ? ", " : "") + std::to_string(opt.key_lengths[i]);
  s += "], \"null_logits\": [";
  for (std::size_t i = 0; i < opt.null_logits.size(); ++i) s += (i ? ", " : "") + num(opt.null_logits[i]);
  return s + "]}";
}

/// The stored form of a tensor: f32 for float (exact), f64 otherwise (exact for double; one
/// rounding for wider types).
template <class T> io::StoredTensor stored(const Tensor<T>& t) {
  return io::StoredTensor{std::is_same_v<T, float> ? io::DType::f32 : io::DType::f64, t.template cast<double>()};
}

/// A failing attention call: inputs q, k, v (and the bias), the options, the result under test and
/// the reference it failed against (outputs that are empty in `result` are left out).
template <class T, class R>
Case attention_case(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionOptions& opt,
                    const AttentionResult<T>& result, const AttentionResult<R>& reference,
                    const std::string& description) {
  Case c;
  c.op = "attention";
  c.inputs.emplace("q", stored(q));
  c.inputs.emplace("k", stored(k));
  c.inputs.emplace("v", stored(v));
  if (!opt.bias.empty()) c.inputs.emplace("bias", io::StoredTensor{io::DType::f64, opt.bias});
  auto put = [&](const char* name, const Tensor<T>& got, const Tensor<R>& ref) {
    if (got.empty()) return;
    c.outputs.emplace(name, stored(got));
    if (!ref.empty()) c.reference.emplace(name, stored(ref));
  };
  put("out", result.out, reference.out);
  put("lse", result.lse, reference.lse);
  put("p_null", result.p_null, reference.p_null);
  put("probs", result.probs, reference.probs);
  c.options = attention_options_json(opt);
  c.description = description;
  return c;
}

/// Write `c` under replay_root()/name (replaced if present); print the directory and the replay
/// command; return the configuration's path. `name` is a file name (one path component).
inline std::string write(const std::string& name, const Case& c) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(replay_root()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto files = [&](const io::TensorMap& m, const std::string& prefix) {
    std::string j = "{";
    for (const auto& [n, t] : m) {
      const std::string file = prefix + n + ".npy";
      io::write_npy((dir / file).string(), t);
      j += (j.size() > 1 ? ", " : "") + io::json::quote(n) + ": " + io::json::quote(file);
    }
    return j + "}";
  };
  const std::string in = files(c.inputs, ""), out = files(c.outputs, "");
  (void)files(c.reference, "reference.");
  const std::string config = (dir / "config.json").string();
  io::detail::write_file_bytes(config, "{\n  \"op\": " + io::json::quote(c.op) + ",\n  \"inputs\": " + in +
                                           ",\n  \"outputs\": " + out + ",\n  \"options\": " + c.options +
                                           ",\n  \"description\": " + io::json::quote(c.description) + "\n}\n");
  std::printf("replay: the failing case is in %s\nreplay: rerun its verdict with: oasis-verify compare %s\n",
              dir.string().c_str(), config.c_str());
  std::fflush(stdout);
  return config;
}

}  // namespace oasis::replay
