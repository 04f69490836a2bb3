// Properties of the pathology scores (include/oasis/research/pathology.hpp, Definitions 5.1 and 5.2).
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <vector>

#include "oasis/research/pathology.hpp"

namespace {

using oasis::Mat;
using oasis::Vec;

TEST(Pathology, EntropyOfUniformIsLogM) {
  for (int m = 1; m <= 9; ++m) {
    std::vector<double> x(static_cast<std::size_t>(m), 1.0 / m);
    EXPECT_NEAR(oasis::shannon_entropy(x.data(), m), std::log(static_cast<double>(m)), 4 * m * 1.2e-16);
  }
  const double onehot[3] = {0.0, 1.0, 0.0};  // 0 log 0 = 0
  EXPECT_EQ(oasis::shannon_entropy(onehot, 3), 0.0);
}

TEST(Pathology, HandComputedScore) {
  // alpha = (0.75, 0.25), rows (0.5, 0.5) and (1, 0), N = {0}.
  Vec<double> a(2);
  a << 0.75, 0.25;
  Mat<double> p(2, 2);
  p << 0.5, 0.5, 1.0, 0.0;
  const std::vector<bool> N{true, false};
  const auto t = oasis::pathology_terms(a, p, N);
  EXPECT_DOUBLE_EQ(t.leakage, 0.75 * 0.5 + 0.25 * 1.0);
  EXPECT_DOUBLE_EQ(t.concentration, 0.375);
  const double Ha = -(0.75 * std::log(0.75) + 0.25 * std::log(0.25));
  EXPECT_NEAR(t.entropy_collapse, -Ha - 0.75 * std::log(2.0), 1e-15);
  EXPECT_NEAR(oasis::pathology_score(a, p, N, 2.0, 3.0), t.leakage + 2 * t.concentration + 3 * t.entropy_collapse, 1e-15);
}

TEST(Pathology, InvalidArgumentsNameTheArgument) {
  Vec<double> a(2);
  a << 0.5, 0.5;
  Mat<double> p(2, 2);
  p << 0.5, 0.5, 0.5, 0.5;
  const std::vector<bool> N{true, false};
  auto arg_of = [](auto&& f) {
    try { f(); } catch (const oasis::invalid_argument& e) { return e.argument(); }
    return std::string("<no throw>");
  };
  EXPECT_EQ(arg_of([&] { oasis::pathology_score(a, p, N, -1.0, 0.0); }), "lambda1");
  EXPECT_EQ(arg_of([&] { oasis::pathology_score(a, p, N, 0.0, std::nan("")); }), "lambda2");
  EXPECT_EQ(arg_of([&] { oasis::pathology_score(a, p, std::vector<bool>{true}, 0.0, 0.0); }), "irrelevant");
  Mat<double> p3(3, 2);
  p3.setConstant(0.5);
  EXPECT_EQ(arg_of([&] { oasis::pathology_score(a, p3, N, 0.0, 0.0); }), "probs");
  Vec<double> bad(2);
  bad << 0.5, std::nan("");
  EXPECT_EQ(arg_of([&] { oasis::pathology_score(bad, p, N, 0.0, 0.0); }), "alpha");
  EXPECT_EQ(arg_of([&] { oasis::vanilla_pathology_score(bad, N, 0.0, 0.0); }), "p");
  EXPECT_EQ(arg_of([&] { oasis::vanilla_pathology_score(Vec<double>(0), std::vector<bool>{}, 0.0, 0.0); }), "p");
}

// One branch with alpha = 1 is vanilla attention: the two definitions agree exactly.
RC_GTEST_PROP(PathologyProperty, OneBranchIsVanilla, ()) {
  const int m = *rc::gen::inRange(1, 12);
  std::vector<double> w = *rc::gen::container<std::vector<double>>(static_cast<std::size_t>(m), rc::gen::map(rc::gen::inRange(1, 1000), [](int x) { return x / 1000.0; }));
  double s = 0;
  for (double x : w) s += x;
  Vec<double> p(m);
  for (int j = 0; j < m; ++j) p[j] = w[static_cast<std::size_t>(j)] / s;
  std::vector<bool> N = *rc::gen::container<std::vector<bool>>(static_cast<std::size_t>(m), rc::gen::arbitrary<bool>());
  const double l1 = *rc::gen::inRange(0, 9) / 4.0, l2 = *rc::gen::inRange(0, 9) / 4.0;
  Mat<double> P(1, m);
  P.row(0) = p.transpose();
  Vec<double> one(1);
  one << 1.0;
  RC_ASSERT(oasis::pathology_score(one, P, N, l1, l2) == oasis::vanilla_pathology_score(p, N, l1, l2));
}

// Entropy term is <= 0 and the leakage is in [0, 1] for stochastic rows and weights.
RC_GTEST_PROP(PathologyProperty, TermRanges, ()) {
  const int L = *rc::gen::inRange(1, 5), m = *rc::gen::inRange(1, 8);
  auto simplex = [](int k) {
    std::vector<double> w = *rc::gen::container<std::vector<double>>(static_cast<std::size_t>(k), rc::gen::map(rc::gen::inRange(1, 1000), [](int x) { return x / 1000.0; }));
    double s = 0;
    for (double x : w) s += x;
    for (double& x : w) x /= s;
    return w;
  };
  const auto aw = simplex(L);
  Vec<double> a(L);
  for (int l = 0; l < L; ++l) a[l] = aw[static_cast<std::size_t>(l)];
  Mat<double> P(L, m);
  for (int l = 0; l < L; ++l) {
    const auto r = simplex(m);
    for (int j = 0; j < m; ++j) P(l, j) = r[static_cast<std::size_t>(j)];
  }
  std::vector<bool> N = *rc::gen::container<std::vector<bool>>(static_cast<std::size_t>(m), rc::gen::arbitrary<bool>());
  const auto t = oasis::pathology_terms(a, P, N);
  RC_ASSERT(t.entropy_collapse <= 0.0);
  RC_ASSERT(t.leakage >= 0.0);
  RC_ASSERT(t.leakage <= 1.0 + 1e-12);
  RC_ASSERT(t.concentration <= 1.0);
  RC_ASSERT(t.concentration > 0.0);
}

}  // namespace
