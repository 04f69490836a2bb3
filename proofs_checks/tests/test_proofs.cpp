// Proof.<check>/<scalar>: runs each check of the catalogue in one scalar (float: on every
// available backend) and requires every (scalar, backend) result to pass. Each test prints the
// number of instances, the worst margin and the worst error against mp50.
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "check.hpp"

namespace {

using oasis::checks::Check;
using oasis::checks::CheckConfig;
using oasis::checks::CheckResult;

std::vector<std::string> scalars() {
  std::vector<std::string> s{"mp50"};
#if defined(OASIS_HAVE_MPFR)
  s.push_back("mpfr50");
#endif
  s.push_back("double");
  s.push_back("float");
  return s;
}

class ProofTest : public ::testing::Test {
 public:
  ProofTest(const Check* check, std::string scalar) : check_(check), scalar_(std::move(scalar)) {}
  void TestBody() override {
    CheckConfig cfg;
    cfg.only_scalar = scalar_;
    const std::vector<CheckResult> results = check_->run(cfg);
    ASSERT_FALSE(results.empty()) << check_->id << " produced no result for scalar " << scalar_;
    for (const CheckResult& r : results) {
      std::cout << "[" << r.check << " | " << r.scalar << " | " << r.backend << "] " << r.message << "\n";
      EXPECT_EQ(r.scalar, scalar_);
      EXPECT_GT(r.instances, 0);
      EXPECT_TRUE(r.passed) << r.paper_ref << " [" << r.scalar << ", " << r.backend << "]: " << r.message;
    }
  }

 private:
  const Check* check_;
  std::string scalar_;
};

const bool registered = [] {
  for (const Check& c : oasis::checks::catalogue())
    for (const std::string& s : scalars()) {
      const Check* cp = &c;
      ::testing::RegisterTest("Proof", (c.id + "/" + s).c_str(), nullptr, nullptr, __FILE__, __LINE__,
                              [cp, s]() -> ::testing::Test* { return new ProofTest(cp, s); });
    }
  return true;
}();

TEST(ProofCatalogue, IdsAreUniqueAndDocumented) {
  const auto& cat = oasis::checks::catalogue();
  ASSERT_GE(cat.size(), 9u);
  for (std::size_t i = 0; i < cat.size(); ++i) {
    EXPECT_FALSE(cat[i].paper_ref.empty()) << cat[i].id;
    EXPECT_FALSE(cat[i].statement.empty()) << cat[i].id;
    for (std::size_t j = i + 1; j < cat.size(); ++j) EXPECT_NE(cat[i].id, cat[j].id);
  }
}

}  // namespace
