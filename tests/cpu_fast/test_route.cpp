// Fast CPU path, depth routing: bitwise equal to the reference for every ISA and mixing streaming;
// identical validation messages, a non-finite source anywhere included; finite sources whose sum
// overflows are not an error.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cpu_fast_test.hpp"

using namespace oasis;
using namespace oasis::cpu_fast_test;

namespace {

struct RouteCase {
  const char* name;
  index_t n, N, d;
  std::vector<SourceKind> kinds;
  DepthOptions opt;
};

void PrintTo(const RouteCase& c, std::ostream* os) { *os << c.name; }

DepthOptions authors() {
  DepthOptions o;
  o.coupling_options = CouplingOptions::authors_code();
  o.beta = 30.0;  // clamped to 10
  return o;
}
DepthOptions plain_softmax() {
  DepthOptions o;
  o.normalizer = RowNorm::softmax;
  o.coupling = false;
  return o;
}
DepthOptions strong_v2() {
  DepthOptions o;
  o.beta = 2.0;
  o.coupling_options.headless = HeadlessRule::no_evidence;
  return o;
}

std::vector<RouteCase> route_cases() {
  using K = SourceKind;
  return {
      {"oasis_default", 5, 33, 300, {K::initial, K::attention, K::headless, K::attention, K::headless}, {}},
      {"authors_clamps", 4, 17, 129, {K::initial, K::attention, K::headless, K::attention}, authors()},
      {"vanilla_softmax", 6, 9, 37, {K::initial, K::attention, K::headless, K::attention, K::headless, K::attention}, plain_softmax()},
      {"single_source", 1, 11, 16, {K::initial}, {}},
      {"no_evidence_rule", 7, 20, 2048, {K::initial, K::attention, K::headless, K::attention, K::headless, K::attention, K::headless}, strong_v2()},
      // two whole passes of four and of two sources, then a pass of one or of two (the tails)
      {"ten_sources", 10, 13, 1100, {K::initial, K::attention, K::headless, K::attention, K::headless, K::attention, K::headless, K::attention, K::headless, K::attention}, {}},
  };
}

class RouteParity : public ::testing::TestWithParam<RouteCase> {};

TEST_P(RouteParity, BitwiseEqualToReferenceForEveryIsa) {
  const RouteCase& c = GetParam();
  auto rng = oasis::test::make_rng(8001);
  const Tensor<float> src = oasis::test::randn<float>({c.n, c.N, c.d}, rng, 3.0);
  const Tensor<float> g = oasis::test::randn<float>({c.n, c.N}, rng, 20.0);  // reaches the +-50 clamp
  const Tensor<float> psi = oasis::test::uniform<float>({c.n, c.N}, rng, 0.0, 1.0);
  const DepthRoute<float> ref = attn_res_route(src, g, psi, c.kinds, c.opt);
  for_each_isa_and_streaming([&] {
    const DepthRoute<float> f = attn_res_route(Backend::cpu_fast, src, g, psi, c.kinds, c.opt);
    EXPECT_TRUE(oasis::test::exactly_equal("h", f.h, ref.h));
    EXPECT_TRUE(oasis::test::exactly_equal("alpha", f.alpha, ref.alpha));
    EXPECT_TRUE(oasis::test::exactly_equal("alpha_null", f.alpha_null, ref.alpha_null));
    EXPECT_TRUE(oasis::test::exactly_equal("g", f.g, ref.g));
    EXPECT_TRUE(oasis::test::exactly_equal("dpsi", f.dpsi, ref.dpsi));
  });
}

INSTANTIATE_TEST_SUITE_P(CpuFast, RouteParity, ::testing::ValuesIn(route_cases()),
                         [](const ::testing::TestParamInfo<RouteCase>& i) { return std::string(i.param.name); });

std::string route_error(bool fast, const Tensor<float>& src, const Tensor<float>& g, const Tensor<float>& psi,
                        const std::vector<SourceKind>& kinds) {
  try {
    if (fast) cpu_fast::attn_res_route(src, g, psi, kinds, {});
    else attn_res_route(src, g, psi, kinds, {});
  } catch (const invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(CpuFastRoute, InvalidInputSameErrorAsReference) {
  using K = SourceKind;
  const std::vector<SourceKind> kinds{K::initial, K::attention, K::attention};
  auto rng = oasis::test::make_rng(8002);
  Tensor<float> src = oasis::test::randn<float>({3, 8, 40}, rng);
  Tensor<float> g = oasis::test::randn<float>({3, 8}, rng);
  Tensor<float> psi = oasis::test::uniform<float>({3, 8}, rng, 0.0, 1.0);
  Tensor<float> bad_psi = psi;
  bad_psi(2, 5) = 1.5f;  // not a probability
  Tensor<float> bad_src = src;
  bad_src(1, 6, 39) = std::numeric_limits<float>::infinity();
  Tensor<float> bad_g = g;
  bad_g(0, 3) = std::numeric_limits<float>::quiet_NaN();
  const std::pair<const char*, std::array<const Tensor<float>*, 3>> inputs[] = {
      {"psi", {&src, &g, &bad_psi}}, {"sources", {&bad_src, &g, &psi}},
      {"sources over psi", {&bad_src, &g, &bad_psi}}, {"g_old", {&src, &bad_g, &psi}}};
  for (const auto& [what, t] : inputs) {
    const std::string ref = route_error(false, *t[0], *t[1], *t[2], kinds);
    EXPECT_FALSE(ref.empty()) << what;
    EXPECT_EQ(route_error(true, *t[0], *t[1], *t[2], kinds), ref) << what;
  }
  EXPECT_EQ(route_error(true, src, g, psi, {K::initial}), route_error(false, src, g, psi, {K::initial}));
}

// A non-finite element in any source (every position within a pass of two or of four, and in the
// tail passes) and near either end of a row (d = 40: with 64-byte vectors columns 3 and 37 fall in
// the one-at-a-time head or tail, or in a vector, depending on the row's alignment; with narrower
// ones both fall in vectors) is reported as the reference reports it, with every ISA and streaming.
TEST(CpuFastRoute, NonFiniteSourceAnywhereSameErrorAsReference) {
  using K = SourceKind;
  const std::vector<SourceKind> kinds{K::initial, K::attention, K::headless, K::attention, K::headless, K::attention, K::headless};
  const index_t n = 7, N = 6, d = 40;
  auto rng = oasis::test::make_rng(8003);
  const Tensor<float> src = oasis::test::randn<float>({n, N, d}, rng);
  const Tensor<float> g = oasis::test::randn<float>({n, N}, rng);
  const Tensor<float> psi = oasis::test::uniform<float>({n, N}, rng, 0.0, 1.0);
  for_each_isa_and_streaming([&] {
    for (index_t i = 0; i < n; ++i)
      for (const index_t c : {index_t{3}, index_t{37}})
        for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
          SCOPED_TRACE("source " + std::to_string(i) + ", column " + std::to_string(c) + ", value " +
                       std::to_string(bad));
          Tensor<float> s = src;
          s(i, N - 1, c) = bad;
          const std::string ref = route_error(false, s, g, psi, kinds);
          ASSERT_FALSE(ref.empty());
          EXPECT_EQ(route_error(true, s, g, psi, kinds), ref);
        }
  });
}

// Finite sources whose weighted sum overflows (every source at the largest float; the rounded
// weights of a plain softmax may sum to just over 1) are not an error: the reference returns the
// infinite h, and so must the fast path, which reads finiteness off its output and tells this case
// from a non-finite source by checking the sources (Kernels::mix).
TEST(CpuFastRoute, FiniteSourcesWhoseSumOverflowsAreNotAnError) {
  using K = SourceKind;
  const index_t n = 3, N = 64, d = 40;
  const std::vector<SourceKind> kinds{K::initial, K::attention, K::headless};
  Tensor<float> src({n, N, d});
  for (index_t i = 0; i < src.size(); ++i) src.data()[i] = std::numeric_limits<float>::max();
  auto rng = oasis::test::make_rng(8004);
  const Tensor<float> g = oasis::test::randn<float>({n, N}, rng);
  const Tensor<float> psi = oasis::test::uniform<float>({n, N}, rng, 0.0, 1.0);
  const DepthRoute<float> ref = attn_res_route(src, g, psi, kinds, plain_softmax());
  index_t overflowed = 0;
  for (index_t t = 0; t < N; ++t) overflowed += std::isinf(ref.h(t, 0)) ? 1 : 0;
  ASSERT_GT(overflowed, 0) << "seed 8004 no longer makes an overflowing token; choose another";
  ASSERT_LT(overflowed, N);
  for_each_isa_and_streaming([&] {
    DepthRoute<float> f;
    ASSERT_NO_THROW(f = attn_res_route(Backend::cpu_fast, src, g, psi, kinds, plain_softmax()));
    EXPECT_TRUE(oasis::test::exactly_equal("h", f.h, ref.h));
    EXPECT_TRUE(oasis::test::exactly_equal("alpha", f.alpha, ref.alpha));
  });
}

}  // namespace
