// verify/main.cpp — the oasis-verify command line.
//
//   oasis-verify [selfcheck] [--json FILE] [--only ID]... [--instances N] [--seed S] [--quiet]
//   oasis-verify compare CONFIG [--json FILE] [--show N] [--policy P] [--oracle O] [--sample N] [--seed S]
//                               [--mp50-budget N] [--mp50-memory B] [--html FILE] [--no-progress]
//   oasis-verify figures MODEL TRACE --out DIR
//   oasis-verify fuzz OP --cmd 'PROGRAM {in} {out}' [--dtypes L] [--without L] [--only L] [--timeout S] ...
//   oasis-verify help | --help | <subcommand> --help
// Exit status: 0 everything passed, 1 a check or a comparison failed (or was left undecided), 2 usage or input error
// (unknown option, unreadable or malformed file, missing tensor, invalid configuration).
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#if defined(__linux__)
#include <unistd.h>
#endif

#include "exit_status.hpp"
#include "oasis/verify/compare.hpp"
#include "figures_cmd.hpp"
#include "fuzz_cmd.hpp"
#include "selfcheck.hpp"

namespace {

using oasis::verify::kFailed;
using oasis::verify::kOk;
using oasis::verify::kUsage;

const char* kMainHelp =
    "usage: oasis-verify [selfcheck] [options]      run the verification report (default)\n"
    "       oasis-verify compare CONFIG [options]    check another implementation's tensors\n"
    "       oasis-verify figures MODEL TRACE --out DIR  draw the paper's diagnostics of a model trace\n"
    "       oasis-verify fuzz OP --cmd 'PROGRAM {in} {out}' [options]  fuzz another implementation of OP\n"
    "       oasis-verify help [selfcheck|compare|figures|fuzz]\n"
    "\n"
    "Exit status: 0 all passed, 1 a check or comparison failed, 2 usage or input error.\n"
    "Documentation: docs/verify.md.\n";

const char* kSelfcheckHelp =
    "usage: oasis-verify [selfcheck] [--json FILE] [--only ID]... [--instances N] [--seed S] [--quiet] [--list]\n"
    "\n"
    "Runs the catalogue of the paper's identities and bounds (proofs_checks/) in every scalar and on\n"
    "every available backend, and the parity of every backend against the mp50 oracle on built-in\n"
    "attention and depth-routing cases; prints one row per (check, scalar, backend).\n"
    "  --json FILE      also write the report as JSON\n"
    "  --only ID        run only this check id (or id prefix, e.g. 'parity'); repeatable\n"
    "  --instances N    random instances per (check, scalar, backend) (default: the catalogue's)\n"
    "  --seed S         seed of the random instances (default 20261129)\n"
    "  --quiet          no progress lines on stderr\n"
    "  --list           list the check ids and exit\n";

const char* kCompareHelp =
    "usage: oasis-verify compare CONFIG [--json FILE] [--show N] [--policy P] [--oracle O] [--sample N] [--seed S]\n"
    "                             [--mp50-budget N] [--mp50-memory B] [--html FILE] [--no-progress]\n"
    "\n"
    "Recomputes an op with the oracle from the inputs another implementation used, and compares that\n"
    "implementation's outputs element by element on two lines (docs/verify.md, docs/tolerances.md):\n"
    "the policy (default: probabilistic; f16/bf16 outputs as accumulated in float32 and stored once,\n"
    "attention with 16-bit inputs as computed in that type)\n"
    "and the certain worst-case bound |x - ref| <= 0.5 ulp_D(ref) + 2 B_plain(D). A tensor is PASS,\n"
    "FAIL (outside the policy) or FAIL-certain (outside even the certain bound).\n"
    "CONFIG is a JSON file {\"op\": ..., \"inputs\": ..., \"outputs\": ..., \"options\": {...}} where\n"
    "inputs/outputs are a .safetensors path or an object {\"name\": \"file.npy\"} (paths relative to\n"
    "CONFIG), or a .safetensors file holding inputs and outputs with the JSON in its __metadata__\n"
    "entry \"oasis_config\". Tensors: .npy (<f2, <f4, <f8; bf16 as <u2 in *.bf16.npy; ids also <i4, <i8)\n"
    "or safetensors (F16, BF16, F32, F64; ids also I32, I64).\n"
    "Op model checks every trace tensor against what the configured model computes from the\n"
    "tensors it reads, names the first wrong step, and gives logits without their producers an\n"
    "end-to-end verdict. Exit status: 0 all passed, 1 a tensor failed or was left\n"
    "undecided (UNDECIDED: past the mp50 budget), 2 an input error (also: a\n"
    "trace that checks nothing, an unknown tensor name, a step whose inputs the trace lacks).\n"
    "  --json FILE      also write the report as JSON\n"
    "  --show N         mismatching elements listed per tensor (default 5)\n"
    "  --policy P       probabilistic (default; attention with 16-bit q, k, v: every intermediate may be\n"
    "                   in that type) | p16 (f16/bf16 outputs of float32 kernels that also round P, or the\n"
    "                   depth weights, to 16 bits before the mixing) | worst_case\n"
    "  --oracle O       fast (default; attention, attention_backward, pseudo_query_backward, psi_backward,\n"
    "                   depth, coupling, attn_res, attn_res_backward, model: double,\n"
    "                   its own error bound folded in, what it cannot decide recomputed in mp50; model\n"
    "                   logits alone: error estimated by a long double replay except under worst_case;\n"
    "                   the other ops run in mp50) | mp50 (everything in 50 digits)\n"
    "  --sample N       check N rows drawn at random (attention: (b, h, t); depth, coupling, attn_res:\n"
    "                   tokens; normalizer: rows of z); unchecked rows can hide errors (default 0: all rows)\n"
    "  --seed S         seed of --sample (default 20261129)\n"
    "  --mp50-budget N  the fast oracle recomputes what double leaves undecided in mp50 only up to about\n"
    "                   N multiply-adds (default 6e8, about a minute on two cores); past it those elements\n"
    "                   stay undecided and are listed, and the verdict is not PASS (docs/policies.md)\n"
    "  --mp50-memory B  ... and only while the mp50 values it holds take at most B bytes (default 4e9)\n"
    "  --html FILE      also write the report as one self-contained HTML page: per tensor heat maps of\n"
    "                   err/bound, its histogram, the worst elements; the model's steps (docs/report.md)\n"
    "  --no-progress    no progress line on stderr (shown only when stderr is a terminal and the\n"
    "                   check runs longer than 2 s)\n"
    "\nOps, tensor names and options:\n";

int usage_error(const std::string& msg, const char* help) {
  std::cerr << "oasis-verify: " << msg << "\n\n" << help;
  return kUsage;
}

bool write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  if (!f) {
    std::cerr << "oasis-verify: cannot write '" << path << "'\n";
    return false;
  }
  return true;
}

bool parse_int(const std::string& s, long long lo, long long hi, long long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

/// A number (strtod: 6e8, inf), whole string.
bool parse_number(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (errno == ERANGE || *end || std::isnan(v)) return false;
  *out = v;
  return true;
}

int cmd_selfcheck(const std::vector<std::string>& args) {
  oasis::verify::SelfcheckOptions opt;
  std::string json;
  bool quiet = false, list = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string* out) {
      if (i + 1 >= args.size()) return false;
      *out = args[++i];
      return true;
    };
    std::string v;
    long long n;
    if (a == "--help" || a == "-h") { std::cout << kSelfcheckHelp; return kOk; }
    else if (a == "--json") { if (!value(&json)) return usage_error("--json needs a file name", kSelfcheckHelp); }
    else if (a == "--only") { if (!value(&v)) return usage_error("--only needs a check id", kSelfcheckHelp); opt.only.push_back(v); }
    else if (a == "--instances") {
      if (!value(&v) || !parse_int(v, 1, 1000000, &n)) return usage_error("--instances needs an integer in [1, 1000000]", kSelfcheckHelp);
      opt.instances = static_cast<int>(n);
    } else if (a == "--seed") {
      if (!value(&v) || !parse_int(v, 0, 9223372036854775807LL, &n)) return usage_error("--seed needs a non-negative integer", kSelfcheckHelp);
      opt.seed = static_cast<std::uint64_t>(n);
    } else if (a == "--quiet") quiet = true;
    else if (a == "--list") list = true;
    else return usage_error("selfcheck: unknown option '" + a + "'", kSelfcheckHelp);
  }
  if (list) {
    for (const auto& id : oasis::verify::selfcheck_ids()) std::cout << id << "\n";
    return kOk;
  }
  if (!quiet)
    opt.progress = [](int done, int total, const std::string& what) {
      std::fprintf(stderr, "[%3d/%3d] %s\n", done + (done < total ? 1 : 0), total, what.c_str());
      std::fflush(stderr);
    };
  std::vector<oasis::verify::SelfcheckRow> rows;
  try {
    rows = oasis::verify::run_selfcheck(opt);
  } catch (const std::exception& e) {
    std::cerr << "oasis-verify: " << e.what() << "\n";
    return kUsage;
  }
  std::cout << oasis::verify::format_selfcheck(rows);
  if (!json.empty() && !write_text(json, oasis::verify::selfcheck_json(rows))) return kUsage;
  for (const auto& r : rows)
    if (!r.passed) return kFailed;
  return rows.empty() ? kFailed : kOk;
}

int cmd_compare(const std::vector<std::string>& args) {
  const std::string help = std::string(kCompareHelp) + oasis::verify::describe_ops();
  std::string config, json, html;
  bool progress = true;
  oasis::verify::CompareOptions opt;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    long long n;
    if (a == "--help" || a == "-h") { std::cout << help; return kOk; }
    else if (a == "--json") {
      if (i + 1 >= args.size()) return usage_error("--json needs a file name", help.c_str());
      json = args[++i];
    } else if (a == "--show") {
      if (i + 1 >= args.size() || !parse_int(args[i + 1], 0, 1000000, &n)) return usage_error("--show needs an integer >= 0", help.c_str());
      opt.show = static_cast<int>(n);
      ++i;
    } else if (a == "--sample") {
      if (i + 1 >= args.size() || !parse_int(args[i + 1], 1, 9223372036854775807LL, &n))
        return usage_error("--sample needs an integer >= 1 (rows to check)", help.c_str());
      opt.sample = static_cast<oasis::index_t>(n);
      ++i;
    } else if (a == "--seed") {
      if (i + 1 >= args.size() || !parse_int(args[i + 1], 0, 9223372036854775807LL, &n))
        return usage_error("--seed needs a non-negative integer", help.c_str());
      opt.seed = static_cast<std::uint64_t>(n);
      ++i;
    } else if (a == "--mp50-budget" || a == "--mp50-memory") {
      double x = -1;
      if (i + 1 >= args.size() || !parse_number(args[i + 1], &x) || x < 0)
        return usage_error(a + " needs a non-negative number", help.c_str());
      (a == "--mp50-budget" ? opt.mp50_budget : opt.mp50_memory) = x;
      ++i;
    } else if (a == "--html") {
      if (i + 1 >= args.size()) return usage_error("--html needs a file name", help.c_str());
      html = args[++i];
    } else if (a == "--no-progress") {
      progress = false;
    } else if (a == "--policy" || a == "--oracle") {
      if (i + 1 >= args.size()) return usage_error(a + " needs a value", help.c_str());
      try {
        if (a == "--policy") opt.policy = oasis::verify::parse_policy(args[i + 1]);
        else opt.oracle = oasis::verify::parse_oracle(args[i + 1]);
      } catch (const std::exception& e) {
        return usage_error(e.what(), help.c_str());
      }
      ++i;
    } else if (!a.empty() && a[0] == '-') {
      return usage_error("compare: unknown option '" + a + "'", help.c_str());
    } else if (config.empty()) {
      config = a;
    } else {
      return usage_error("compare: more than one CONFIG given ('" + config + "', '" + a + "')", help.c_str());
    }
  }
  if (config.empty()) return usage_error("compare: missing CONFIG", help.c_str());
  oasis::verify::CompareReport rep;
  try {
    if (progress) opt.progress = oasis::verify::terminal_progress();  // empty unless stderr is a terminal
    rep = oasis::verify::compare_config_file(config, opt);
  } catch (const std::exception& e) {
    std::cerr << "oasis-verify compare: " << e.what() << "\n";
    return kUsage;
  }
  std::cout << oasis::verify::format_report(rep);
  if (!json.empty() && !write_text(json, oasis::verify::report_json(rep))) return kUsage;
  if (!html.empty() && !write_text(html, oasis::verify::report_html(rep))) return kUsage;
  return rep.passed ? kOk : kFailed;
}

}  // namespace

// The OpenMP runtime's default wait policy lets idle workers spin after each parallel region; the
// selfcheck and compare run many small regions, and on a busy machine the spinning workers take
// the cores the work needs (measurements: docs/benchmarks.md, "Two threads"). libgomp reads
// OMP_WAIT_POLICY once, when it is loaded, so the tool sets it to passive by re-executing itself
// once, before any work; a value the user set is kept.
static void prefer_passive_openmp_waiting(char** argv) {
#if defined(__linux__)
  if (std::getenv("OMP_WAIT_POLICY")) return;
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  execv("/proc/self/exe", argv);  // returns only on failure: run on with the default policy
#else
  (void)argv;
#endif
}

int main(int argc, char** argv) {
  prefer_passive_openmp_waiting(argv);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || (args[0].size() > 1 && args[0][0] == '-' && args[0] != "--help" && args[0] != "-h"))
    return cmd_selfcheck(args);
  const std::string sub = args[0];
  std::vector<std::string> rest(args.begin() + 1, args.end());
  if (sub == "selfcheck") return cmd_selfcheck(rest);
  if (sub == "compare") return cmd_compare(rest);
  if (sub == "figures") return oasis::verify::cmd_figures(rest);
  if (sub == "fuzz") return oasis::verify::cmd_fuzz(rest);
  if (sub == "help" || sub == "--help" || sub == "-h") {
    if (!rest.empty() && rest[0] == "selfcheck") { std::cout << kSelfcheckHelp; return kOk; }
    if (!rest.empty() && rest[0] == "compare") return cmd_compare({"--help"});
    if (!rest.empty() && rest[0] == "figures") return oasis::verify::cmd_figures({"--help"});
    if (!rest.empty() && rest[0] == "fuzz") return oasis::verify::cmd_fuzz({"--help"});
    if (!rest.empty()) return usage_error("help: unknown subcommand '" + rest[0] + "'", kMainHelp);
    std::cout << kMainHelp;
    return kOk;
  }
  return usage_error("unknown subcommand '" + sub + "'", kMainHelp);
}
