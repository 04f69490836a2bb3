// Teeth.<check>/<mutant>: each check, run against a plausible wrong implementation, must reject
// it — in mp50 (the statement alone) and in double (statement and error bounds).
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "check.hpp"

namespace {

using oasis::checks::Check;
using oasis::checks::CheckConfig;
using oasis::checks::CheckResult;
using oasis::checks::Mutant;

class TeethTest : public ::testing::Test {
 public:
  TeethTest(const Check* check, const Mutant* mutant) : check_(check), mutant_(mutant) {}
  void TestBody() override {
    CheckConfig cfg;
    cfg.instances = 40;  // mp50 runs a fifth of it (8); a quarter of the instances are equality cases
    const std::vector<CheckResult> results = mutant_->run(cfg);
    ASSERT_EQ(results.size(), 2u) << "expected an mp50 and a double run";
    for (const CheckResult& r : results) {
      std::cout << "[" << check_->id << " vs " << mutant_->id << " | " << r.scalar << "] " << r.message << "\n";
      EXPECT_FALSE(r.passed) << check_->id << " accepted the mutant '" << mutant_->id << "' (" << mutant_->description
                             << ") in " << r.scalar << ": " << r.message;
    }
  }

 private:
  const Check* check_;
  const Mutant* mutant_;
};

const bool registered = [] {
  for (const Check& c : oasis::checks::catalogue())
    for (const Mutant& m : c.mutants) {
      const Check* cp = &c;
      const Mutant* mp = &m;
      ::testing::RegisterTest("Teeth", (c.id + "/" + m.id).c_str(), nullptr, nullptr, __FILE__, __LINE__,
                              [cp, mp]() -> ::testing::Test* { return new TeethTest(cp, mp); });
    }
  return true;
}();

TEST(TeethCatalogue, EveryCheckHasAMutant) {
  for (const Check& c : oasis::checks::catalogue()) EXPECT_FALSE(c.mutants.empty()) << c.id << " has no teeth test";
}

}  // namespace
