// Row normalisers (docs/spec.md §1): identities as properties in high precision, float/double/long double
// within the derived bound of docs/tolerances.md, fully masked rows, bad input.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include "core_gen.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/oasis.hpp"
#include "oasis_mp.hpp"
#include "oasis_test.hpp"

using namespace oasis;
using oasis::test::gen_logits;
using oasis::test::to_vec;
using R = mp50;

using oasis::test::kMpTol;
using oasis::test::mp_abs;

RC_GTEST_PROP(NormalizerProperty, Softmax1IsSoftmaxOverZAndNullLogit, ()) {
  const auto z = gen_logits(12, 30, true);
  const double s = *rc::gen::inRange(-640, 641) / 64.0;
  const Vec<R> zr = to_vec<R>(z);
  Vec<R> ext(zr.size() + 1);
  ext << zr, R(s);
  const RowProbs<R> a = softmax_null(zr, R(s));
  const RowProbs<R> b = softmax(ext);
  for (index_t j = 0; j < zr.size(); ++j) RC_ASSERT(mp_abs(a.p[j] - b.p[j]) <= kMpTol);
  RC_ASSERT(mp_abs(a.p_null - b.p[zr.size()]) <= kMpTol);
  RC_ASSERT(mp_abs(a.lse - b.lse) <= kMpTol * (1 + mp_abs(b.lse)));
  // softmax_s(z) = Softmax1(z - s)
  Vec<R> zs = zr.array() - R(s);
  const RowProbs<R> c = softmax1(zs);
  for (index_t j = 0; j < zr.size(); ++j) RC_ASSERT(mp_abs(a.p[j] - c.p[j]) <= kMpTol);
}

RC_GTEST_PROP(NormalizerProperty, MassScalingAndRatioPreservation, ()) {
  auto z = gen_logits(12, 20, true);
  z.push_back(*rc::gen::inRange(-640, 641) / 64.0);  // at least one visible key
  const double s = *rc::gen::inRange(-640, 641) / 64.0;
  const Vec<R> zr = to_vec<R>(z);
  const RowProbs<R> p = softmax_null(zr, R(s));
  const RowProbs<R> q = softmax(zr);
  R total = p.p_null;
  for (index_t j = 0; j < zr.size(); ++j) {
    total += p.p[j];
    RC_ASSERT(mp_abs(p.p[j] - (1 - p.p_null) * q.p[j]) <= kMpTol);  // p_j = (1 - p_null) q_j
  }
  RC_ASSERT(mp_abs(total - 1) <= kMpTol);
  for (index_t j = 0; j < zr.size(); ++j)
    for (index_t k = 0; k < zr.size(); ++k)
      if (q.p[k] > R(1e-30) && p.p[k] > R(1e-30))
        RC_ASSERT(mp_abs(p.p[j] / p.p[k] - q.p[j] / q.p[k]) <= kMpTol * (1 + q.p[j] / q.p[k]));
}

RC_GTEST_PROP(NormalizerProperty, MaskingWithNegInfEqualsRemoval, ()) {
  const auto z = gen_logits(12, 30, true);
  const double s = *rc::gen::inRange(-640, 641) / 64.0;
  std::vector<double> kept;
  for (double x : z) if (!std::isinf(x)) kept.push_back(x);
  for (RowNorm kind : {RowNorm::softmax1, RowNorm::softmax}) {
    const RowProbs<R> full = normalize(kind, to_vec<R>(z), R(s));
    const RowProbs<R> removed = normalize(kind, to_vec<R>(kept), R(s));
    std::size_t r = 0;
    for (std::size_t j = 0; j < z.size(); ++j) {
      if (std::isinf(z[j])) { RC_ASSERT(full.p[static_cast<index_t>(j)] == 0); continue; }
      RC_ASSERT(full.p[static_cast<index_t>(j)] == removed.p[static_cast<index_t>(r++)]);  // same arithmetic: exact
    }
    RC_ASSERT(full.p_null == removed.p_null);
    RC_ASSERT(full.lse == removed.lse || (is_neg_inf(full.lse) && is_neg_inf(removed.lse)));
  }
}

RC_GTEST_PROP(NormalizerProperty, NullProbabilityIsSigmoidOfSMinusLseKeys, ()) {
  const auto z = gen_logits(12, 30, true);
  const double s = *rc::gen::inRange(-640, 641) / 64.0;
  const Vec<R> zr = to_vec<R>(z);
  const RowProbs<R> p = softmax_null(zr, R(s));
  const R lse_keys = logsumexp(zr);
  const R expect = is_neg_inf(lse_keys) ? R(1) : sigmoid(R(s) - lse_keys);
  RC_ASSERT(mp_abs(p.p_null - expect) <= kMpTol);
  RC_ASSERT(mp_abs(p.lse - logaddexp(R(s), lse_keys)) <= kMpTol * (1 + mp_abs(p.lse)));
}

RC_GTEST_PROP(NormalizerProperty, ShiftLaw, ()) {
  auto z = gen_logits(12, 20, true);
  z.push_back(*rc::gen::inRange(-640, 641) / 64.0);
  const double s = *rc::gen::inRange(-640, 641) / 64.0;
  const double c = *rc::gen::inRange(1, 641) / 64.0 * (*rc::gen::arbitrary<bool>() ? 1 : -1);
  const Vec<R> zr = to_vec<R>(z);
  const Vec<R> zc = zr.array() + R(c);
  // softmax is shift invariant
  const RowProbs<R> q = softmax(zr), qc = softmax(zc);
  for (index_t j = 0; j < zr.size(); ++j) RC_ASSERT(mp_abs(q.p[j] - qc.p[j]) <= kMpTol);
  // softmax_s(z + c) with s + c is invariant
  const RowProbs<R> p = softmax_null(zr, R(s)), pc = softmax_null(zc, R(s + c));
  for (index_t j = 0; j < zr.size(); ++j) RC_ASSERT(mp_abs(p.p[j] - pc.p[j]) <= kMpTol);
  RC_ASSERT(mp_abs(p.p_null - pc.p_null) <= kMpTol);
  // Softmax1 (fixed null logit) is not: p_null moves by the exact factor predicted by the sigmoid.
  const RowProbs<R> p1 = softmax1(zr), p1c = softmax1(zc);
  const R expect = sigmoid(-(logsumexp(zr) + R(c)));
  RC_ASSERT(mp_abs(p1c.p_null - expect) <= kMpTol);
  RC_ASSERT(mp_abs(p1c.p_null - p1.p_null) > R(1e-30));
}

TEST(Normalizer, FullyMaskedRowIsDefined) {
  for (int m : {0, 1, 5}) {
    Vec<double> z = Vec<double>::Constant(m, neg_inf<double>());
    const RowProbs<double> p = softmax_null(z, 0.75);
    EXPECT_EQ(p.p_null, 1.0);
    EXPECT_EQ(p.lse, 0.75);  // LSE1 = s
    for (index_t j = 0; j < m; ++j) EXPECT_EQ(p.p[j], 0.0);
    const RowProbs<double> q = softmax(z);  // documented zero
    EXPECT_EQ(q.p_null, 0.0);
    EXPECT_TRUE(is_neg_inf(q.lse));
    for (index_t j = 0; j < m; ++j) EXPECT_EQ(q.p[j], 0.0);
    EXPECT_THROW(softmax(z, MaskedRow::error), oasis::invalid_argument);
  }
}

TEST(Normalizer, LimitOfVeryNegativeLogits) {
  // all z -> -inf: p_null -> 1 for Softmax1, uniform for softmax
  Vec<double> z = Vec<double>::Constant(4, -1e4);
  const RowProbs<double> p = softmax1(z);
  EXPECT_EQ(p.p_null, 1.0);
  EXPECT_EQ(p.p.sum(), 0.0);
  const RowProbs<double> q = softmax(z);
  for (index_t j = 0; j < 4; ++j) EXPECT_EQ(q.p[j], 0.25);
}

// LSE1 of tiny magnitude keeps its relative accuracy: with s = 0 and every logit near -107,
// LSE1 = log(1 + x), x = sum_j e^{z_j} ~ 8e-47, equals x - x^2/2 to ~1e-92 relative; M + log(S)
// would keep only the ~4 digits of x that survive in 1 + x (50 digits).
TEST(Normalizer, TinyLse1IsRelativelyAccurateInMp50) {
  Vec<R> z(3);
  z << R(-107), R(-107.5), R(-108);
  R x(0);
  for (index_t j = 0; j < z.size(); ++j) x += exp(z[j]);
  const R expected = x - x * x / 2;
  ASSERT_LT(to_double(expected), 1e-46);
  ASSERT_GT(to_double(expected), 5e-47);
  const RowProbs<R> r = softmax1(z);
  EXPECT_LE(to_double(mp_abs(r.lse - expected) / expected), 1e-45) << to_double(r.lse);
  // and in double: the same row in binary64 is accurate to a few ulps, not to 1e-16 absolute
  const RowProbs<double> d = softmax1(Vec<double>(z.cast<double>()));
  EXPECT_LE(std::abs(d.lse - to_double(expected)) / to_double(expected), 1e-15) << d.lse;
}

TEST(Normalizer, BadInputNamesTheArgument) {
  Vec<double> z(3);
  z << 1.0, std::nan(""), 0.0;
  try {
    softmax1(z);
    FAIL() << "NaN logit accepted";
  } catch (const oasis::invalid_argument& e) {
    EXPECT_EQ(e.argument(), "z");
    EXPECT_NE(std::string(e.what()).find("index 1"), std::string::npos) << e.what();
  }
  z << 1.0, pos_inf<double>(), 0.0;
  EXPECT_THROW(softmax(z), oasis::invalid_argument);
  z << 1.0, 2.0, 0.0;
  try {
    softmax_null(z, std::nan(""));
    FAIL() << "NaN null logit accepted";
  } catch (const oasis::invalid_argument& e) {
    EXPECT_EQ(e.argument(), "null_logit");
  }
  EXPECT_THROW(parse_row_norm("softmax2"), oasis::invalid_argument);
}

// ---- float / double / long double against mp50 within the derived bound ----------------------

template <class T>
class NormalizerPrecision : public ::testing::Test {};
using Scalars = ::testing::Types<float, double, long double>;
TYPED_TEST_SUITE(NormalizerPrecision, Scalars);

template <class T>
void check_row_against_mp(RowNorm kind, const std::vector<double>& zd, double s) {
  const Vec<T> z = to_vec<T>(zd);
  const T sT = static_cast<T>(s);
  const RowProbs<T> got = normalize(kind, z, sT);
  const RowProbs<R> ref = normalize(kind, z.template cast<R>().eval(), R(sT));
  std::vector<double> zz(zd.size()), pref(zd.size());
  for (std::size_t j = 0; j < zd.size(); ++j) {
    zz[j] = static_cast<double>(z[static_cast<index_t>(j)]);
    pref[j] = to_double(ref.p[static_cast<index_t>(j)]);
  }
  const auto b = bounds::row_bound(bounds::Precision::of<T>(), kind, zz.data(), nullptr,
                                   static_cast<index_t>(zz.size()), static_cast<double>(sT), 0.0, pref.data(),
                                   to_double(ref.p_null), to_double(ref.lse));
  for (std::size_t j = 0; j < zd.size(); ++j) {
    const double err = std::abs(to_double(R(got.p[static_cast<index_t>(j)]) - ref.p[static_cast<index_t>(j)]));
    ASSERT_LE(err, b.p[j]) << "p[" << j << "] kind " << to_string(kind);
    ASSERT_TRUE(std::isfinite(static_cast<double>(got.p[static_cast<index_t>(j)])));
  }
  ASSERT_LE(std::abs(to_double(R(got.p_null) - ref.p_null)), b.p_null);
  if (!is_neg_inf(ref.lse)) {
    ASSERT_LE(std::abs(to_double(R(got.lse) - ref.lse)), b.lse);
  } else {
    ASSERT_TRUE(is_neg_inf(got.lse));
  }
}

TYPED_TEST(NormalizerPrecision, WithinDerivedBoundOfHighPrecision) {
  auto rng = oasis::test::make_rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int m = static_cast<int>(rng() % 40);
    // magnitudes from O(1) to 1e4 (the float overflow regime of a naive implementation)
    const double range = std::pow(10.0, static_cast<double>(rng() % 5));
    std::uniform_real_distribution<double> ud(-range, range);
    std::vector<double> z(static_cast<std::size_t>(m));
    for (auto& x : z) x = (rng() % 6 == 0) ? neg_inf<double>() : ud(rng);
    const double s = trial % 3 == 0 ? 0.0 : ud(rng);
    check_row_against_mp<TypeParam>(RowNorm::softmax1, z, s);
    check_row_against_mp<TypeParam>(RowNorm::softmax, z, 0.0);
  }
}

TYPED_TEST(NormalizerPrecision, ExtremeLogitsNeverOverflow) {
  using T = TypeParam;
  for (double big : {1e4, -1e4, 88.0, 89.0, 709.0, 710.0}) {
    const std::vector<double> z{big, big - 1.0, 0.0, -big};
    check_row_against_mp<T>(RowNorm::softmax1, z, 0.0);
    check_row_against_mp<T>(RowNorm::softmax, z, 0.0);
    const RowProbs<T> p = softmax1(to_vec<T>(z));
    EXPECT_TRUE(std::isfinite(static_cast<double>(p.lse)));
    EXPECT_TRUE(std::isfinite(static_cast<double>(p.p_null)));
  }
}

// The bound has teeth: a plausible wrong implementation (null logit left out of the LSE, i.e.
// plain softmax returned as Softmax1) violates it on generic rows.
TEST(NormalizerBound, RejectsNullLeftOutOfLse) {
  const std::vector<double> z{0.5, -1.0, 2.0};
  const Vec<double> zd = to_vec<double>(z);
  const RowProbs<R> ref = softmax1(zd.cast<R>().eval());
  const RowProbs<double> wrong = softmax(zd);
  std::vector<double> pref(3);
  for (int j = 0; j < 3; ++j) pref[static_cast<std::size_t>(j)] = to_double(ref.p[j]);
  const auto b = bounds::row_bound(bounds::Precision::of<double>(), RowNorm::softmax1, z.data(), nullptr, 3, 0.0, 0.0,
                                   pref.data(), to_double(ref.p_null), to_double(ref.lse));
  EXPECT_GT(std::abs(wrong.p[2] - pref[2]), 1e6 * b.p[2]);
  // normalisers without a derived bound are refused, not silently given softmax's bound
  EXPECT_THROW(bounds::row_bound(bounds::Precision::of<double>(), RowNorm::sparsemax, z.data(), nullptr, 3, 0.0, 0.0,
                                 pref.data(), 0.0, 0.0),
               oasis::invalid_argument);
}

#if defined(OASIS_HAVE_MPFR)
// The two high-precision scalars agree: the reference does not depend on one library's exp/log.
TEST(Normalizer, Mp50AndMpfr50Agree) {
  auto rng = oasis::test::make_rng(12);
  std::uniform_real_distribution<double> ud(-50.0, 50.0);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<double> z(static_cast<std::size_t>(1 + rng() % 20));
    for (auto& x : z) x = ud(rng);
    const double s = ud(rng);
    const RowProbs<mp50> a = softmax_null(to_vec<mp50>(z), mp50(s));
    const RowProbs<mpfr50> b = softmax_null(to_vec<mpfr50>(z), mpfr50(s));
    for (std::size_t j = 0; j < z.size(); ++j) {
      const mp50 pa = a.p[static_cast<index_t>(j)];
      const mp50 pb(b.p[static_cast<index_t>(j)].str(60));
      EXPECT_LE(to_double(mp_abs(pa - pb)), 1e-40 * to_double(pa) + 1e-300);
    }
    EXPECT_LE(to_double(mp_abs(a.lse - mp50(b.lse.str(60)))), 1e-40 * (1 + std::abs(to_double(a.lse))));
  }
}
#endif
