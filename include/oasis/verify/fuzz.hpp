// oasis/verify/fuzz.hpp — drive a user's kernel through the regimes where sink bugs live, judge
// every run with the compare engine, and shrink the first failure to a small replayable case.
//
// A regime is a named generator of one op's inputs and options (sinks far above the logits, fully
// masked rows, lengths at tile boundaries, ...); the catalogue, with the bug class each targets and
// the reports behind them, is docs/fuzz.md. fuzz() runs the kernel on every regime of the op in
// every dtype asked for, checks each result with check() under the default (probabilistic) policy,
// stops at the first failure, shrinks it (sizes, heads, rows, then values) to a case that still
// fails the same way, and writes it as a replay folder for `oasis-verify compare`.
//
// The kernel sees the op's compare tensors by name (the inputs of describe_ops(), in the case's
// dtype, bhtd layout) and the options object, and returns the outputs it computes (any subset of
// the op's outputs; names as describe_ops()). Errors: an unknown op, regime or feature, or an
// option the op does not take, throws oasis::invalid_argument naming it (the CLI exits 2); a kernel
// that throws is reported as a crash, one that overruns FuzzOptions::timeout_s as a hang.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "oasis/io/dtype.hpp"
#include "oasis/io/json.hpp"
#include "oasis/verify/report.hpp"

namespace oasis::verify::fuzz {

/// Sizes of a case. Attention ops: B, H, Hkv, Tq, Tk, dh, dv (normalizer: rows B x H x Tq of Tk
/// logits; psi ops: B, H, Tq, Tk). Depth ops: L sources, N tokens, d width. attention_merge: S
/// partials of B, H, Tq rows of width dv.
struct Dims {
  index_t B = 0, H = 0, Hkv = 0, Tq = 0, Tk = 0, dh = 0, dv = 0, L = 0, N = 0, d = 0, S = 0;
  /// "B=1 H=2 Hkv=1 Tq=16 Tk=65 dh=8 dv=8" over the fields the op uses (nonzero ones).
  std::string str() const;
  /// Elements of the case's inputs, roughly: what shrinking lowers.
  double volume() const;
};

/// One generated run: the op's inputs and options, and where they came from.
struct Case {
  std::string op;
  std::string regime;        ///< the regime's name, with its variant, e.g. "tile_boundary[Tk=65]"
  std::uint64_t seed = 0;    ///< regenerates the case with make_case()
  io::DType dtype = io::DType::f32;
  Dims dims;
  io::TensorMap inputs;      ///< the op's input tensors (describe_ops()), stored in `dtype`
  /// The op's options as JSON literal texts by key, e.g. {"causal": "true", "window": "64"}.
  std::map<std::string, std::string> options;
  std::string options_json() const;  ///< as one JSON object
};

/// A kernel under test: the op's outputs from its inputs and options. May throw: a
/// kernel_timeout is a hang (the Python module's timer raises one), anything else a crash.
using Kernel = std::function<io::TensorMap(const io::TensorMap& inputs, const io::json::Value& options)>;

/// Thrown by a kernel (or its wrapper) that ran past its time limit.
struct kernel_timeout : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Thrown by a kernel (or its wrapper) to stop fuzzing at once: fuzz() lets it through, with no
/// report (the Python module's KeyboardInterrupt).
struct kernel_abort : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// What a regime needs from the kernel. A kernel that lacks a feature names it in
/// FuzzOptions::without; the regimes needing it are skipped and reported as not exercised.
/// Features: "noncausal" (a case with causal false), "causal", "window", "key_lengths", "bias",
/// "mask", "gqa" (H > Hkv), "decode" (Tq < Tk), "tq_gt_tk", "batch" (B > 1), "null_logits" (the
/// input null_logits; without it every case has none: plain softmax attention is not fuzzed),
/// "grad_lse", "grad_p_null", "infinite_null" (null logits of +-inf), "coupling" (depth ops),
/// "gain" (pseudo_query ops), "partial" (block_attn_res: a layer after its block's first).
std::vector<std::string> feature_names();

/// One entry of the catalogue (docs/fuzz.md).
struct RegimeInfo {
  std::string name;
  std::vector<std::string> ops;       ///< the ops it generates cases for
  std::string description;            ///< what its inputs look like
  std::string targets;                ///< the bug class it targets (and the report, where one exists)
  std::vector<std::string> needs;     ///< features it needs
  std::vector<std::string> variants;  ///< its variants' labels ("" alone: one case)
};

/// The regimes of `op` (every regime when op is empty), in the order fuzz() runs them.
std::vector<RegimeInfo> regimes(const std::string& op = "");

/// Generate the case of regime `regime` (with its variant label, e.g. "tile_boundary[Tk=65]", or
/// the bare name for its first variant) for `op` in `dtype`. `dims`: the sizes to generate at
/// (fields 0: the regime's own); the regime may raise a field to the least it needs.
Case make_case(const std::string& op, const std::string& regime, io::DType dtype, std::uint64_t seed,
               const Dims& dims = {});

struct FuzzOptions {
  std::vector<io::DType> dtypes{io::DType::f32};   ///< inputs stored in each of these, in turn
  /// Options every case carries, as JSON literal texts (e.g. {"lse_base", "\"2\""} for a kernel whose
  /// LSE is in base 2); a regime that needs another value of a fixed key is skipped, reported as not
  /// exercised. A key the op does not take, or a text that is not JSON, is an error naming it.
  std::map<std::string, std::string> fixed;
  std::set<std::string> without;       ///< features the kernel lacks (feature_names())
  std::vector<std::string> only;       ///< run only these regimes (empty: all)
  std::uint64_t seed = 20261206;       ///< each run's seed is derived from it and printed
  /// Per kernel call (0: none). A C++ kernel that overruns is left running on a detached thread
  /// and fuzzing stops at it (no shrinking, unless shrink_hangs: a kernel that can be killed).
  double timeout_s = 0;
  bool shrink_hangs = false;
  int max_shrink_runs = 400;           ///< kernel calls spent on shrinking
  /// Where the failing case is written (<replay_dir>/<op>-<regime>/); empty: a fresh folder under
  /// the system's temporary directory.
  std::string replay_dir;
  CompareOptions compare;              ///< the checks' options (policy, oracle, mp50 budget)
  std::function<void(const std::string&)> log;  ///< one line per run, if set
};

/// One regime run (in one dtype).
struct Run {
  std::string regime;
  io::DType dtype = io::DType::f32;
  std::uint64_t seed = 0;
  Dims dims;
  std::string verdict;   ///< PASS, FAIL, FAIL-certain, UNDECIDED, CRASH or HANG
  double worst_ratio = 0;  ///< the largest err/bound over the checked tensors
  std::string detail;    ///< the failing tensor, or the crash's message
};

/// The first failure, shrunk.
struct Failure {
  std::string kind;          ///< "wrong" (a tensor failed), "crash" or "hang"
  Case original, shrunk;
  CompareReport report;      ///< the shrunk case's check (empty for a crash or hang)
  std::string message;       ///< the crash's message
  int shrink_runs = 0;       ///< kernel calls spent shrinking
  std::vector<std::string> shrink_steps;  ///< what each accepted step changed, e.g. "Tk 65 -> 1"
  std::string replay_dir;    ///< where the shrunk case was written
  std::string replay_command;  ///< `oasis-verify compare <dir>/config.json`
};

struct FuzzReport {
  std::string op;
  std::vector<Run> runs;
  std::vector<std::string> not_exercised;  ///< "regime: why" (a missing feature, a fixed option)
  bool passed = false;       ///< at least one run, and every run passed
  bool has_failure = false;
  Failure failure;
};

/// Fuzz `kernel` as an implementation of op `op` (op_names(), every op but "model").
FuzzReport fuzz(const std::string& op, const Kernel& kernel, const FuzzOptions& opt = {});

/// The report as text: one line per run, what was not exercised, the shrunk failure and the
/// command that replays it.
std::string format_fuzz_report(const FuzzReport& r);
/// The same as a JSON document.
std::string fuzz_report_json(const FuzzReport& r);

/// Write `c` (its inputs, the kernel's `outputs`, the options) as a replay folder `dir`:
/// <name>.npy per input and output.<name>.npy per output (bf16 as *.bf16.npy, raw uint16 bits)
/// and config.json for `oasis-verify compare`; `description` goes into config.json. Returns the compare command.
std::string write_replay(const Case& c, const io::TensorMap& outputs, const std::string& dir,
                         const std::string& description);

/// The library's plain reference of `op` evaluated in float32 (inputs widened exactly, outputs
/// stored as f32; the LSE in the default convention): a correct kernel of every op in f32, bf16
/// and f16, the fuzzer's no-false-alarm baseline. Inputs stored in f64 are rounded to float32
/// first, which is not the op on the given inputs: attention_merge's uneven_scales (partial LSEs
/// far from 0) fails it in f64.
Kernel reference_kernel(const std::string& op);

/// A kernel that runs an external program (`oasis-verify fuzz --cmd`): `command` with {in} and
/// {out} replaced by two folders, run by /bin/sh. {in} holds the case's inputs as <name>.npy (bf16
/// as <name>.bf16.npy, raw uint16) and options.json; the program writes <name>.npy per output
/// into {out}. A nonzero exit is a crash (with the program's last stderr lines), overrunning
/// timeout_s a hang (the process group is killed). The protocol: docs/fuzz-protocol.md.
Kernel command_kernel(const std::string& command, double timeout_s);

}  // namespace oasis::verify::fuzz
