// psi, centring conventions, coupling and depth routing (docs/spec.md §3): the teaching example, the
// identities as properties in high precision, float/double within the derived bound, bad input.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "core_gen.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/oasis.hpp"
#include "oasis_mp.hpp"
#include "oasis_test.hpp"

using namespace oasis;
using R = mp50;
using K = SourceKind;

using oasis::test::kMpTol;
using oasis::test::mp_abs;

namespace {

// Candidates of target layer l in Full AttnRes with attention-only sources: initial + (l-1) branches.
std::vector<SourceKind> attention_kinds(int n) {
  std::vector<SourceKind> k(static_cast<std::size_t>(n), K::attention);
  k[0] = K::initial;
  return k;
}

/// Random (kinds, g, psi) of a depth router: n candidates, initial first, the rest attention or
/// head-less sources; psi are k/256 in [0, 1], logits k/64 in [-8, 8].
struct DepthCase {
  std::vector<SourceKind> kinds;
  std::vector<double> g, psi;
};
DepthCase gen_depth_case(int max_n) {
  DepthCase c;
  const int n = *rc::gen::inRange(1, max_n + 1);
  for (int i = 0; i < n; ++i) {
    c.kinds.push_back(i == 0 ? K::initial : (*rc::gen::inRange(0, 4) == 0 ? K::headless : K::attention));
    c.g.push_back(*rc::gen::inRange(-512, 513) / 64.0);
    c.psi.push_back(*rc::gen::inRange(0, 257) / 256.0);
  }
  return c;
}
}  // namespace

TEST(Coupling, TeachingExampleThroughThePublicApi) {
  // docs/spec.md §3: psi = (0.8, 0.2), old logits 0, beta = 1, depth Softmax1, paper_v2.
  const std::vector<SourceKind> kinds{K::initial, K::attention, K::attention};
  Vec<double> g = Vec<double>::Zero(3), psi(3);
  psi << 0.0, 0.8, 0.2;
  DepthOptions o = depth_options(Variant::oasis);
  o.beta = 1.0;
  const DepthWeights<double> w = depth_weights(g, psi, kinds, o);
  // closed form: logits (0, -0.3, 0.3), null 0: alpha = e^{g} / (2 + e^{-0.3} + e^{0.3})
  const double S = 2.0 + std::exp(-0.3) + std::exp(0.3);
  EXPECT_NEAR(w.alpha[0], 1.0 / S, 1e-12);
  EXPECT_NEAR(w.alpha[1], std::exp(-0.3) / S, 1e-12);
  EXPECT_NEAR(w.alpha[2], std::exp(0.3) / S, 1e-12);
  EXPECT_NEAR(w.alpha_null, 1.0 / S, 1e-12);
  // the rounded table of docs/spec.md §3's teaching example
  EXPECT_NEAR(w.alpha[0], 0.2445, 5e-5);
  EXPECT_NEAR(w.alpha[1], 0.1811, 5e-5);
  EXPECT_NEAR(w.alpha[2], 0.3300, 5e-5);
  EXPECT_NEAR(w.alpha_null, 0.2445, 5e-5);
  EXPECT_NEAR(w.g[1], -0.3, 1e-15);
  EXPECT_NEAR(w.g[2], 0.3, 1e-15);
  const DepthWeights<double> aos = depth_weights(g, psi, kinds, depth_options(Variant::aos));
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(aos.alpha[i], 0.25, 1e-12);
  EXPECT_NEAR(aos.alpha_null, 0.25, 1e-12);
}

TEST(Coupling, DefaultThetaGivesDocumentedBeta) {
  EXPECT_NEAR(depth_beta<double>(DepthOptions{}), 0.0067153484891179, 1e-15);
  EXPECT_NEAR(to_double(coupling_beta(R(-5))), std::log1p(std::exp(-5.0)), 1e-16);
  // authors_code caps beta at 10
  EXPECT_EQ(coupling_beta(50.0, CouplingOptions::authors_code()), 10.0);
}

TEST(Coupling, NullStatisticIsMeanOverQueryHeads) {
  Tensor<double> p({1, 4, 2});
  for (index_t h = 0; h < 4; ++h) { p(0, h, 0) = 0.25 * static_cast<double>(h); p(0, h, 1) = 1.0; }
  const Tensor<double> psi = null_statistic(p);
  EXPECT_EQ(psi(0, 0), 0.375);  // (0 + .25 + .5 + .75) / 4, exact
  EXPECT_EQ(psi(0, 1), 1.0);
  EXPECT_THROW(null_statistic(Tensor<double>({1, 0, 2})), oasis::invalid_argument);
  // authors' estimator max(0, 1 - sum p) agrees with p_null on an exact case
  Tensor<double> probs({1, 2, 1, 2});
  probs(0, 0, 0, 0) = 0.25; probs(0, 0, 0, 1) = 0.25; probs(0, 1, 0, 0) = 0.5; probs(0, 1, 0, 1) = 0.5;
  EXPECT_EQ(null_statistic_from_mass(probs)(0, 0), 0.25);
}

TEST(Coupling, CentringConventions) {
  Vec<double> psi(4);
  psi << 0.9, 0.5, 0.25, 0.75;  // psi of the initial state is ignored
  const std::vector<SourceKind> k{K::initial, K::attention, K::headless, K::attention};
  // paper_v2 + inherit: E = {1, 2, 3}, mean 0.5; the initial state is untouched
  const Vec<double> a = centre_null_statistic(psi, k, CouplingOptions::paper_v2());
  EXPECT_EQ(a[0], 0.0); EXPECT_EQ(a[1], 0.0); EXPECT_EQ(a[2], -0.25); EXPECT_EQ(a[3], 0.25);
  // paper_v2 + no_evidence: E = {1, 3}, mean 0.625, head-less source excluded and zero
  CouplingOptions ne;
  ne.headless = HeadlessRule::no_evidence;
  const Vec<double> b = centre_null_statistic(psi, k, ne);
  EXPECT_EQ(b[0], 0.0); EXPECT_EQ(b[1], -0.125); EXPECT_EQ(b[2], 0.0); EXPECT_EQ(b[3], 0.125);
  // authors_code: mean over all four with psi_0 := 0 -> (0 + .5 + .25 + .75) / 4 = 0.375
  const Vec<double> c = centre_null_statistic(psi, k, CouplingOptions::authors_code());
  EXPECT_EQ(c[0], -0.375); EXPECT_EQ(c[1], 0.125); EXPECT_EQ(c[2], -0.125); EXPECT_EQ(c[3], 0.375);
  // authors_code + no_evidence: the head-less source counts as psi = 0 like the embedding
  CouplingOptions ane = CouplingOptions::authors_code();
  ane.headless = HeadlessRule::no_evidence;
  const Vec<double> d = centre_null_statistic(psi, k, ane);
  EXPECT_EQ(d[0], -0.3125); EXPECT_EQ(d[1], 0.1875); EXPECT_EQ(d[2], -0.3125); EXPECT_EQ(d[3], 0.4375);
}

TEST(Coupling, AuthorsCodeClampsScores) {
  Vec<double> g(2), dpsi(2);
  g << 60.0, -45.0;
  dpsi << 0.0, 1.0;
  const Vec<double> out = couple_depth_logits(g, dpsi, 10.0, CouplingOptions::authors_code());
  EXPECT_EQ(out[0], 50.0);
  EXPECT_EQ(out[1], -50.0);
  const Vec<double> free = couple_depth_logits(g, dpsi, 10.0, CouplingOptions::paper_v2());
  EXPECT_EQ(free[0], 60.0);
  EXPECT_EQ(free[1], -55.0);
}

RC_GTEST_PROP(CouplingProperty, BetaZeroEqualsAoS, ()) {
  const DepthCase c = gen_depth_case(8);
  Vec<R> g(static_cast<index_t>(c.g.size())), psi(g.size());
  for (index_t i = 0; i < g.size(); ++i) { g[i] = R(c.g[static_cast<std::size_t>(i)]); psi[i] = R(c.psi[static_cast<std::size_t>(i)]); }
  DepthOptions o = depth_options(Variant::oasis);
  o.beta = 0.0;
  const DepthWeights<R> a = depth_weights(g, psi, c.kinds, o);
  const DepthWeights<R> b = depth_weights(g, psi, c.kinds, depth_options(Variant::aos));
  for (index_t i = 0; i < g.size(); ++i) RC_ASSERT(a.alpha[i] == b.alpha[i]);  // exactly
  RC_ASSERT(a.alpha_null == b.alpha_null);
}

RC_GTEST_PROP(CouplingProperty, OneTransformedBranchOrFirstLayerHasNoCoupling, ()) {
  // l = 1: only the initial state; l = 2: one transformed branch -> Dpsi = 0 exactly (paper_v2)
  const double theta = *rc::gen::inRange(-640, 641) / 64.0;
  for (int n : {1, 2}) {
    Vec<R> g(n), psi(n);
    for (int i = 0; i < n; ++i) { g[i] = R(*rc::gen::inRange(-512, 513) / 64.0); psi[i] = R(*rc::gen::inRange(0, 257) / 256.0); }
    DepthOptions o = depth_options(Variant::oasis);
    o.theta = theta;
    const DepthWeights<R> w = depth_weights(g, psi, attention_kinds(n), o);
    for (int i = 0; i < n; ++i) RC_ASSERT(w.dpsi[i] == 0);
    const DepthWeights<R> a = depth_weights(g, psi, attention_kinds(n), depth_options(Variant::aos));
    for (int i = 0; i < n; ++i) RC_ASSERT(w.alpha[i] == a.alpha[i]);
  }
}

RC_GTEST_PROP(CouplingProperty, CentringRatioIdentity, ()) {
  // alpha_i / alpha_k = exp(g_i - g_k) exp(-beta (psi_i - psi_k)) for transformed i, k with evidence
  const DepthCase c = gen_depth_case(8);
  const index_t n = static_cast<index_t>(c.g.size());
  Vec<R> g(n), psi(n);
  for (index_t i = 0; i < n; ++i) { g[i] = R(c.g[static_cast<std::size_t>(i)]); psi[i] = R(c.psi[static_cast<std::size_t>(i)]); }
  const double beta = *rc::gen::inRange(0, 641) / 64.0;
  const Centring centring = *rc::gen::arbitrary<bool>() ? Centring::paper_v2 : Centring::authors_code;
  DepthOptions o = depth_options(Variant::oasis);
  o.beta = beta;
  o.coupling_options.centring = centring;
  const DepthWeights<R> w = depth_weights(g, psi, c.kinds, o);
  using std::exp;
  // head-less candidates use the default inherit rule: they carry the psi given to them
  for (index_t i = 1; i < n; ++i)
    for (index_t k = 1; k < n; ++k) {
      const R expect = exp(g[i] - g[k]) * exp(-R(beta) * (psi[i] - psi[k]));
      RC_ASSERT(mp_abs(w.alpha[i] / w.alpha[k] - expect) <= kMpTol * expect);
    }
  // the mean does not cancel against the null category: alpha_i / alpha_null = exp(g_i - beta Dpsi_i)
  for (index_t i = 0; i < n; ++i) {
    const R expect = exp(g[i] - R(beta) * w.dpsi[i]);
    RC_ASSERT(mp_abs(w.alpha[i] / w.alpha_null - expect) <= kMpTol * expect);
  }
}

TEST(Coupling, MeanDoesNotCancelAgainstNullOrInitialState) {
  // same psi differences, shifted mean: ratios among branches agree, ratios to null/initial differ
  const std::vector<SourceKind> kinds{K::initial, K::attention, K::attention};
  Vec<double> g = Vec<double>::Zero(3), psi_a(3), psi_b(3);
  psi_a << 0.0, 0.6, 0.2;
  psi_b << 0.0, 0.9, 0.5;
  DepthOptions o = depth_options(Variant::oasis);
  o.beta = 2.0;
  o.coupling_options = CouplingOptions::authors_code();  // mean over all: shifts with psi
  const auto a = depth_weights(g, psi_a, kinds, o), b = depth_weights(g, psi_b, kinds, o);
  EXPECT_NEAR(a.alpha[1] / a.alpha[2], b.alpha[1] / b.alpha[2], 1e-13);
  // authors_code mean over (0, psi_1, psi_2): 0.8/3 for a, 1.4/3 for b, so against the null
  // category (and the initial state, whose Dpsi = -mean) the ratio moves by exp(-beta * dmean) terms
  const double mean_a = 0.8 / 3, mean_b = 1.4 / 3;
  EXPECT_NEAR(a.alpha[1] / a.alpha_null, std::exp(-2.0 * (0.6 - mean_a)), 1e-13);
  EXPECT_NEAR(b.alpha[1] / b.alpha_null, std::exp(-2.0 * (0.9 - mean_b)), 1e-13);
  EXPECT_NEAR(a.alpha[1] / a.alpha[0], std::exp(-2.0 * 0.6), 1e-13);  // (psi_1 - mean) - (0 - mean)
  EXPECT_NEAR(b.alpha[1] / b.alpha[0], std::exp(-2.0 * 0.9), 1e-13);
  EXPECT_GT(std::abs(a.alpha[1] / a.alpha_null - b.alpha[1] / b.alpha_null), 0.05);
}

// ---- depth routing in float / double within the derived bound ---------------------------------

template <class T>
class DepthPrecision : public ::testing::Test {};
using Scalars = ::testing::Types<float, double, long double>;
TYPED_TEST_SUITE(DepthPrecision, Scalars);

TYPED_TEST(DepthPrecision, RouteWithinDerivedBoundOfHighPrecision) {
  using T = TypeParam;
  auto rng = oasis::test::make_rng(21);
  int cfg = 0;
  for (index_t n : {1, 2, 5, 16})
    for (Variant var : {Variant::vanilla_attnres, Variant::depth_only, Variant::oasis})
      for (Centring cen : {Centring::paper_v2, Centring::authors_code}) {
        const index_t N = 6, d = 24;
        const Tensor<T> S = oasis::test::randn<T>({n, N, d}, rng, 2.0);
        const Tensor<T> w = oasis::test::randn<T>({d}, rng, 1.5);
        const Tensor<T> g = pseudo_query_logits(S, w);
        const Tensor<T> psi = oasis::test::uniform<T>({n, N}, rng, 0.0, 1.0);
        std::vector<SourceKind> kinds = attention_kinds(static_cast<int>(n));
        if (n > 2) kinds[2] = K::headless;
        DepthOptions o = depth_options(var);
        o.coupling_options = cen == Centring::paper_v2 ? CouplingOptions::paper_v2() : CouplingOptions::authors_code();
        o.theta = (cfg++ % 2) ? 1.5 : -5.0;
        const DepthRoute<T> got = attn_res_route(S, g, psi, kinds, o);
        const DepthRoute<R> ref = attn_res_route(S.template cast<R>(), g.template cast<R>(), psi.template cast<R>(), kinds, o);
        const bounds::DepthRouteBounds b = bounds::depth_route_bounds(S, psi, kinds, o, ref);
        auto use = [](const Tensor<double>& bt) { return [&bt](index_t i, double) { return bt[i]; }; };
        const std::string tag = std::string(to_string(var)) + " n=" + std::to_string(n) + " " + std::string(to_string(cen));
        EXPECT_TRUE(oasis::test::within_bound("h", got.h, ref.h, use(b.h))) << tag;
        EXPECT_TRUE(oasis::test::within_bound("alpha", got.alpha, ref.alpha, use(b.alpha))) << tag;
        EXPECT_TRUE(oasis::test::within_bound("alpha_null", got.alpha_null, ref.alpha_null, use(b.alpha_null))) << tag;
        EXPECT_TRUE(oasis::test::within_bound("g", got.g, ref.g, use(b.g))) << tag;
        EXPECT_TRUE(oasis::test::within_bound("dpsi", got.dpsi, ref.dpsi, use(b.dpsi))) << tag;
        // logits: the pseudo-query in T against high precision
        const Tensor<R> gref = pseudo_query_logits(S.template cast<R>(), w.template cast<R>());
        const Tensor<double> gb = bounds::pseudo_query_logits_bounds(S, w);
        EXPECT_TRUE(oasis::test::within_bound("pseudo_query_logits", g, gref, use(gb))) << tag;
      }
}

TEST(Depth, ZeroPseudoQueryGivesUniformWeights) {
  auto rng = oasis::test::make_rng(22);
  const Tensor<double> S = oasis::test::randn<double>({5, 3, 8}, rng);
  const Tensor<double> g = pseudo_query_logits(S, Tensor<double>({8}));
  const DepthRoute<double> r = attn_res_route(S, g, Tensor<double>({5, 3}), attention_kinds(5), depth_options(Variant::aos));
  for (index_t t = 0; t < 3; ++t) {
    EXPECT_DOUBLE_EQ(r.alpha_null[t], 1.0 / 6.0);
    for (index_t i = 0; i < 5; ++i) EXPECT_DOUBLE_EQ(r.alpha(i, t), 1.0 / 6.0);
  }
  const DepthRoute<double> v = attn_res_route(S, g, Tensor<double>({5, 3}), attention_kinds(5), depth_options(Variant::vanilla_attnres));
  for (index_t i = 0; i < 5; ++i) EXPECT_DOUBLE_EQ(v.alpha(i, 0), 0.2);
  EXPECT_EQ(v.alpha_null[0], 0.0);
}

TEST(Depth, DepthNullAttenuatesNotIdentity) {
  // h - h_ref = sum_i alpha_i (s_i - h_ref) - alpha_null h_ref, checked in mp50
  auto rng = oasis::test::make_rng(23);
  const Tensor<R> S = oasis::test::randn<double>({4, 1, 6}, rng).cast<R>();
  const Tensor<R> g = oasis::test::randn<double>({4, 1}, rng).cast<R>();
  const Tensor<R> href = oasis::test::randn<double>({6}, rng).cast<R>();
  const DepthRoute<R> r = attn_res_route(S, g, Tensor<R>({4, 1}), attention_kinds(4), depth_options(Variant::aos));
  for (index_t c = 0; c < 6; ++c) {
    R rhs = -r.alpha_null[0] * href[c];
    for (index_t i = 0; i < 4; ++i) rhs += r.alpha(i, 0) * (S(i, 0, c) - href[c]);
    EXPECT_LT(to_double(mp_abs(r.h(0, c) - href[c] - rhs)), 1e-45);
  }
}

TEST(Depth, BadInputNamesTheArgument) {
  auto arg_of = [](auto&& f) -> std::string {
    try { f(); } catch (const oasis::invalid_argument& e) { return e.argument(); }
    return "<no exception>";
  };
  const Tensor<double> S({3, 2, 4}), g({3, 2}), psi({3, 2});
  const auto kinds = attention_kinds(3);
  EXPECT_EQ(arg_of([&] { attn_res_route(S, Tensor<double>({2, 2}), psi, kinds); }), "g_old");
  EXPECT_EQ(arg_of([&] { attn_res_route(S, g, Tensor<double>({3, 3}), kinds); }), "psi");
  EXPECT_EQ(arg_of([&] { attn_res_route(S, g, psi, attention_kinds(2)); }), "kinds");
  EXPECT_EQ(arg_of([&] { attn_res_route(Tensor<double>({0, 2, 4}), Tensor<double>({0, 2}), Tensor<double>({0, 2}), {}); }), "sources");
  Tensor<double> bad = psi;
  bad[2] = 1.5;
  EXPECT_EQ(arg_of([&] { attn_res_route(S, g, bad, kinds); }), "psi");
  Tensor<double> gn = g;
  gn[1] = std::nan("");
  EXPECT_EQ(arg_of([&] { attn_res_route(S, gn, psi, kinds); }), "g_old");
  DepthOptions o;
  o.beta = -1.0;
  EXPECT_EQ(arg_of([&] { attn_res_route(S, g, psi, kinds, o); }), "beta");
  EXPECT_EQ(arg_of([&] { pseudo_query_logits(S, Tensor<double>({5})); }), "w");
  EXPECT_EQ(arg_of([&] { parse_centring("paper_v3"); }), "centring");
  EXPECT_EQ(arg_of([&] { parse_headless_rule("skip"); }), "headless");
}

TEST(Variants, TableOfSpecSection4) {
  struct Row { const char* name; RowNorm token, depth; bool coupling, attn_res; };
  const Row rows[] = {{"original", RowNorm::softmax, RowNorm::softmax, false, false},
                      {"vanilla_attnres", RowNorm::softmax, RowNorm::softmax, false, true},
                      {"token_only", RowNorm::softmax1, RowNorm::softmax, false, true},
                      {"depth_only", RowNorm::softmax, RowNorm::softmax1, false, true},
                      {"aos", RowNorm::softmax1, RowNorm::softmax1, false, true},
                      {"oasis", RowNorm::softmax1, RowNorm::softmax1, true, true}};
  for (const Row& r : rows) {
    const Variant v = parse_variant(r.name);
    EXPECT_EQ(to_string(v), r.name);
    EXPECT_EQ(attention_options(v).normalizer, r.token) << r.name;
    EXPECT_EQ(variant_spec(v).attn_res, r.attn_res) << r.name;
    if (r.attn_res) {
      EXPECT_EQ(depth_options(v).normalizer, r.depth) << r.name;
      EXPECT_EQ(depth_options(v).coupling, r.coupling) << r.name;
    }
  }
  EXPECT_THROW(parse_variant("oasis2"), oasis::invalid_argument);
}

// An absent optional tensor (the default Tensor, e.g. no key gain) stays absent through cast<>():
// the high-precision reference of a call without a gain is a call without a gain, where a rank-0
// tensor of one element would be a gain of the wrong size that pseudo_query_logits rejects.
TEST(Tensor, DefaultTensorCastsToTheDefaultTensor) {
  const Tensor<float> none;
  EXPECT_TRUE(none.empty());
  const Tensor<R> hp = none.cast<R>();
  EXPECT_TRUE(hp.empty());
  EXPECT_EQ(hp.rank(), 0);
  const Tensor<double> scalar = Tensor<float>(Shape{}, 2.5f).cast<double>();  // a real rank-0 tensor stays one
  EXPECT_EQ(scalar.size(), 1);
  EXPECT_EQ(scalar[0], 2.5);
  std::mt19937_64 rng(5);
  Tensor<double> S({3, 4, 8});
  for (index_t i = 0; i < S.size(); ++i) S[i] = std::normal_distribution<double>(0.0, 1.0)(rng);
  const Tensor<double> w({8}, 0.25);
  const Tensor<R> g = pseudo_query_logits(S.cast<R>(), w.cast<R>(), Tensor<double>{}.cast<R>());
  EXPECT_EQ(g.shape(), (Shape{3, 4}));
}
