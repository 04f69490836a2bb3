// verify/selfcheck.hpp — `oasis-verify selfcheck`: the check catalogue (proofs_checks/) on every
// scalar and available backend, plus parity of every available backend against the mp50 oracle
// on built-in attention and depth-routing configurations.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace oasis::verify {

struct SelfcheckRow {
  std::string check;       ///< catalogue id, or "parity.attention.<config>" / "parity.depth.<config>"
  std::string paper_ref;
  std::string scalar;
  std::string backend;
  long instances = 0;
  double worst_error = 0;  ///< max |err| / bound (<= 1 passes); NaN when not applicable
  double worst_margin = 0; ///< normalised margin of the inequality (>= 0 passes); NaN when not applicable
  bool passed = false;
  std::string message;
};

struct SelfcheckOptions {
  std::vector<std::string> only;  ///< check ids or id prefixes ("parity" = every parity row); empty = all
  int instances = 0;              ///< random instances per (check, scalar, backend); 0 = the catalogue default
  std::uint64_t seed = 20261129;
  /// Called before each unit of work with (done, total, what); may be empty.
  std::function<void(int, int, const std::string&)> progress;
};

/// Every check id that --only accepts (catalogue ids and parity ids).
std::vector<std::string> selfcheck_ids();

/// Run the selected checks; throws oasis::invalid_argument for an --only that matches nothing.
std::vector<SelfcheckRow> run_selfcheck(const SelfcheckOptions& opt);

std::string format_selfcheck(const std::vector<SelfcheckRow>& rows);
std::string selfcheck_json(const std::vector<SelfcheckRow>& rows);

}  // namespace oasis::verify
