// proofs_checks/catalogue.cpp — the explicit list of checks, in paper order (docs/paper-map.md).
// Explicit on purpose: oasis_proofs is a static library, and a self-registering object that
// nothing references would be dropped by the linker.
#include "check.hpp"
#include "statements.hpp"

namespace oasis::checks {

const std::vector<Check>& catalogue() {
  static const std::vector<Check> all = {
      make_lemma_5_1(),
  };
  return all;
}

}  // namespace oasis::checks
