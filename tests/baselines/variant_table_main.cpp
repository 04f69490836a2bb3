// oasis-variant-table: prints, for a small model with identical weights under each variant
// (docs/spec.md §4 table, OASIS at beta = 0, the token-normaliser baselines, gated attention, the S2
// prefix sink), the outlier and sink metrics of its trace, the Definition 5.1/5.2 pathology
// scores and the end-to-end logits error of a W8A8 / W6A6 / W4A4 fake-quantised forward
// (weights and activations; tests/baselines/variant_table.hpp).
//   usage: oasis_variant_table [--seed N] [--seq T]
#include <cstdlib>
#include <iostream>
#include <string>

#include "variant_table.hpp"

int main(int argc, char** argv) {
  using namespace oasis::baselines_table;
  TableOptions opt = default_table_options();
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if ((a == "--seed" || a == "--seq") && i + 1 < argc) {
        const long long v = std::stoll(argv[++i]);
        OASIS_REQUIRE(v > 0, a, "must be positive, got ", v);
        if (a == "--seed") opt.seed = static_cast<std::uint64_t>(v);
        else opt.seq = static_cast<oasis::index_t>(v);
      } else {
        throw oasis::invalid_argument(a, "unknown option (usage: oasis_variant_table [--seed N] [--seq T])");
      }
    }
    print_table(std::cout, opt, variant_table(opt));
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  return 0;
}
