// verify/fuzz_cmd.cpp — `oasis-verify fuzz OP --cmd 'PROGRAM {in} {out}'`: an external program
// fuzzed as an implementation of OP through the --cmd protocol (docs/fuzz-protocol.md), with the
// library's driver (oasis/verify/fuzz.hpp: the regimes, the checks, the shrinker, the replay).
#include "exit_status.hpp"
#include "fuzz_cmd.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "oasis/core/error.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis/verify/fuzz.hpp"

namespace oasis::verify {
namespace {

const char* kFuzzHelp =
    "usage: oasis-verify fuzz OP --cmd 'PROGRAM {in} {out}' [--dtypes f32,bf16,f16,f64] [--fixed KEY=JSON]...\n"
    "                         [--without F1,F2] [--only R1,R2] [--seed S] [--timeout SECONDS] [--replay DIR]\n"
    "                         [--json FILE] [--max-shrink N] [--policy P] [--quiet] [--list]\n"
    "\n"
    "Runs PROGRAM as an implementation of OP on every regime of the catalogue (docs/fuzz.md: sinks far\n"
    "above the logits, fully masked rows, lengths at tile boundaries, ...), checks each result with the\n"
    "compare engine, stops at the first failure, shrinks it to a small case that fails the same way and\n"
    "writes it as a replay folder for `oasis-verify compare`. The protocol (docs/fuzz-protocol.md): {in}\n"
    "holds the inputs as <name>.npy (bf16: <name>.bf16.npy, raw '<u2' bits; f16: '<f2') and\n"
    "options.json; PROGRAM writes <name>.npy per output into {out} and exits 0. A nonzero exit or a\n"
    "signal is a crash, running past --timeout a hang (its process group is killed).\n"
    "Exit status: 0 every run passed, 1 a failure (wrong output, crash or hang), 2 usage or input error\n"
    "(unknown op, regime or feature, bad dtype, a command without {in} or {out}, nothing left to run).\n"
    "  --cmd COMMAND     run by /bin/sh -c with {in} and {out} replaced by the two folders (quoted)\n"
    "  --dtypes LIST     the inputs' dtypes, each fuzzed in turn (default f32)\n"
    "  --fixed KEY=JSON  an option every case carries, e.g. --fixed lse_base='\"2\"'; regimes needing\n"
    "                    another value are skipped (repeatable)\n"
    "  --without LIST    features PROGRAM lacks (their regimes are skipped; the features are listed below)\n"
    "  --only LIST       run only these regimes (--list names them)\n"
    "  --seed S          the seed every run's seed derives from (default 20261206)\n"
    "  --timeout SECONDS per run of PROGRAM (default 60; 0: none)\n"
    "  --replay DIR      write the shrunk failure as DIR/<op>-<regime>-<dtype>/ (default DIR: oasis-fuzz-<seed>\n"
    "                    in the temporary directory)\n"
    "  --json FILE       also write the report as JSON\n"
    "  --max-shrink N    runs of PROGRAM spent on shrinking a failure (default 400)\n"
    "  --policy P        the checks' policy: probabilistic (default) | p16 | worst_case (compare --help)\n"
    "  --quiet           no progress line per run on stderr\n"
    "  --list            list the regimes of OP (name, features needed, the bug class targeted) and exit\n"
    "Environment: OASIS_FUZZ_KEEP=1 keeps every run's {in} and {out} folders (their paths on stderr).\n";

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

std::string help() { return std::string(kFuzzHelp) + "Features: " + join(fuzz::feature_names(), ", ") + "\n"; }

int usage(const std::string& msg) {
  std::cerr << "oasis-verify fuzz: " << msg << "\n\n" << help();
  return kUsage;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

bool parse_u64(const std::string& s, std::uint64_t* out) {
  if (s.empty() || s[0] == '-') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno || *end) return false;
  *out = v;
  return true;
}

/// A finite number >= 0, the whole string.
bool parse_seconds(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (*end || !(v >= 0) || std::isinf(v)) return false;
  *out = v;
  return true;
}

void print_regimes(const std::string& op) {
  const std::vector<fuzz::RegimeInfo> rs = fuzz::regimes(op);
  std::size_t w = 6;
  for (const auto& r : rs) w = std::max(w, r.name.size());
  for (const auto& r : rs) {
    std::cout << r.name << std::string(w + 2 - r.name.size(), ' ') << "needs: " << (r.needs.empty() ? "-" : join(r.needs, ","));
    if (r.variants.size() > 1) std::cout << "  (" << r.variants.size() << " variants)";
    std::cout << "\n" << std::string(w + 2, ' ') << "targets: " << r.targets << "\n";
  }
}

}  // namespace

int cmd_fuzz(const std::vector<std::string>& args) {
  std::string op, cmd, json;
  bool list = false, quiet = false;
  double timeout = 60;
  fuzz::FuzzOptions opt;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= args.size()) return false;
      *out = args[++i];
      return true;
    };
    std::string v;
    if (a == "--help" || a == "-h") {
      std::cout << help();
      return kOk;
    } else if (a == "--cmd") {
      if (!value(&cmd)) return usage("--cmd needs a command");
    } else if (a == "--dtypes") {
      if (!value(&v)) return usage("--dtypes needs a list, e.g. f32,bf16");
      opt.dtypes.clear();
      for (const std::string& d : split_list(v)) {
        if (d != "f32" && d != "f64" && d != "f16" && d != "bf16")
          return usage("--dtypes: unknown dtype '" + d + "' (expected f32, f64, f16 or bf16)");
        opt.dtypes.push_back(io::parse_dtype(d));
      }
      if (opt.dtypes.empty()) return usage("--dtypes needs at least one dtype");
    } else if (a == "--fixed") {
      if (!value(&v)) return usage("--fixed needs KEY=JSON");
      const std::size_t eq = v.find('=');
      if (eq == std::string::npos || eq == 0) return usage("--fixed needs KEY=JSON, got '" + v + "'");
      const std::string text = v.substr(eq + 1);
      try {
        io::json::parse(text);
      } catch (const std::exception& e) {
        return usage("--fixed " + v.substr(0, eq) + ": the value is not JSON (" + e.what() +
                     "); a string needs its quotes, e.g. lse_null='\"excluded\"'");
      }
      opt.fixed[v.substr(0, eq)] = text;
    } else if (a == "--without") {
      if (!value(&v)) return usage("--without needs a list of features");
      for (const std::string& f : split_list(v)) opt.without.insert(f);
    } else if (a == "--only") {
      if (!value(&v)) return usage("--only needs a list of regimes");
      for (const std::string& r : split_list(v)) opt.only.push_back(r);
    } else if (a == "--seed") {
      if (!value(&v) || !parse_u64(v, &opt.seed)) return usage("--seed needs a non-negative integer");
    } else if (a == "--timeout") {
      if (!value(&v) || !parse_seconds(v, &timeout)) return usage("--timeout needs a number of seconds >= 0 (0: none)");
    } else if (a == "--replay") {
      if (!value(&opt.replay_dir)) return usage("--replay needs a directory");
    } else if (a == "--json") {
      if (!value(&json)) return usage("--json needs a file name");
    } else if (a == "--max-shrink") {
      std::uint64_t n = 0;
      if (!value(&v) || !parse_u64(v, &n) || n > 1000000) return usage("--max-shrink needs an integer in [0, 1000000]");
      opt.max_shrink_runs = static_cast<int>(n);
    } else if (a == "--policy") {
      if (!value(&v)) return usage("--policy needs a value");
      try {
        opt.compare.policy = parse_policy(v);
      } catch (const std::exception& e) {
        return usage(e.what());
      }
    } else if (a == "--quiet") {
      quiet = true;
    } else if (a == "--list") {
      list = true;
    } else if (!a.empty() && a[0] == '-') {
      return usage("unknown option '" + a + "'");
    } else if (op.empty()) {
      op = a;
    } else {
      return usage("more than one OP given ('" + op + "', '" + a + "')");
    }
  }
  if (op.empty()) return usage("missing OP (e.g. attention)");
  try {
    if (list) {
      print_regimes(op);
      return kOk;
    }
    const std::vector<std::string> known = fuzz::feature_names();
    for (const std::string& f : opt.without)
      if (std::find(known.begin(), known.end(), f) == known.end())
        return usage("--without: unknown feature '" + f + "' (known: " + join(known, ", ") + ")");
    if (cmd.empty()) return usage("missing --cmd 'PROGRAM {in} {out}'");
    const fuzz::Kernel kernel = fuzz::command_kernel(cmd, timeout);
    // The kernel kills the program at `timeout` itself (its process group); the driver's own
    // timer is a backstop set later, so that the kill, not the timer, decides a hang.
    opt.timeout_s = timeout > 0 ? timeout + std::max(5.0, 0.5 * timeout) : 0;
    opt.shrink_hangs = true;
    if (!quiet)
      opt.log = [](const std::string& line) {
        std::cerr << line << "\n";
        std::cerr.flush();
      };
    const fuzz::FuzzReport rep = fuzz::fuzz(op, kernel, opt);
    std::cout << fuzz::format_fuzz_report(rep);
    if (!json.empty()) {
      std::ofstream f(json, std::ios::binary | std::ios::trunc);
      f << fuzz::fuzz_report_json(rep);
      if (!f) {
        std::cerr << "oasis-verify fuzz: cannot write '" << json << "'\n";
        return kUsage;
      }
    }
    if (rep.runs.empty() && !rep.has_failure) {
      std::cerr << "oasis-verify fuzz: nothing was run: every regime of '" << op
                << "' was skipped (see the regimes not exercised above)\n";
      return kUsage;
    }
    return rep.passed && !rep.has_failure ? kOk : kFailed;
  } catch (const std::exception& e) {
    std::cerr << "oasis-verify fuzz: " << e.what() << "\n";
    return kUsage;
  }
}

}  // namespace oasis::verify
