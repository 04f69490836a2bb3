// proofs_checks/check.hpp — the catalogue interface shared by `ctest -L proof` and
// `oasis-verify selfcheck`. One check per paper statement (docs/paper-map.md); each check runs
// its instances in every scalar it supports (and on every available backend where it applies)
// and returns one CheckResult per (scalar, backend).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace oasis::checks {

struct CheckConfig {
  std::uint64_t seed = 20261129;  ///< reproducible instances
  int instances = 200;            ///< random instances per (scalar, backend); tight cases come on top
  /// Called after each (scalar, backend) run; lets a tool show progress. May be empty.
  std::function<void(const std::string& check, const std::string& scalar, const std::string& backend)> progress;
  /// Run only this scalar ("mp50", "mpfr50", "double", "float"); empty = every scalar.
  std::string only_scalar;
  /// Run only this backend ("reference", "cpu_fast", "cuda"); empty = every available backend.
  std::string only_backend;
};

struct CheckResult {
  std::string check;         ///< check id, e.g. "lemma_5_1"
  std::string paper_ref;     ///< e.g. "Lemma 5.1 (§5, App. C)"
  std::string scalar;        ///< "mp50", "mpfr50", "long double", "double", "float"
  std::string backend;       ///< "reference", "cpu_fast", "cuda"
  long instances = 0;        ///< instances evaluated, tight cases included
  double worst_error = 0;    ///< max |value - high-precision value| / documented bound (<= 1 passes); 0 for mp
  double worst_margin = 0;   ///< min over instances of (rhs - lhs) of the inequality, normalised; >= 0 passes
  bool passed = false;
  std::string message;       ///< first failing instance, or a one-line summary
  /// Rounding allowance of the margin: an instance passes when its normalised margin is
  /// >= -allowance (derived from the error bounds of the scalar; docs/paper-map.md).
  double margin_slack = 0;
  long tight_instances = 0;  ///< of `instances`, those built at the equality case of the bound
};

/// A plausible wrong implementation that the check must reject (the check's teeth).
struct Mutant {
  std::string id;           ///< e.g. "null_logit_left_out_of_lse"
  std::string description;  ///< one line: what is wrong
  /// Runs the check's statement against the mutant (mp50 and double); every result must fail.
  std::function<std::vector<CheckResult>(const CheckConfig&)> run;
};

struct Check {
  std::string id;          ///< stable identifier (used by ctest names and --only filters)
  std::string paper_ref;   ///< the statement in the paper
  std::string statement;   ///< one line: what is checked
  std::function<std::vector<CheckResult>(const CheckConfig&)> run;
  std::vector<Mutant> mutants;  ///< wrong implementations the check rejects (teeth tests)
};

/// Every check, in paper order.
const std::vector<Check>& catalogue();

}  // namespace oasis::checks
