// proofs_checks/catalogue.cpp — the explicit list of checks, in paper order (docs/paper-map.md).
// Explicit on purpose: oasis_proofs is a static library, and a self-registering object that
// nothing references would be dropped by the linker.
#include "check.hpp"
#include "statements.hpp"

namespace oasis::checks {

const std::vector<Check>& catalogue() {
  static const std::vector<Check> all = {
      make_mass_scaling(),
      make_lemma_5_1(),
      make_theorem_5_1(),
      make_lemma_5_2(),
      make_theorem_5_2(),
      make_centring_ratio(),
      make_coupling_limits(),
      make_depth_null_decomposition(),
      make_pathology_sum_rule(),
  };
  return all;
}

}  // namespace oasis::checks
