// tests/verify/test_attention_oracle.cpp — the forward fast oracle (src/verify/attention_oracle.hpp)
// row by row against the mp50 oracle's rows of the same call: the reference within the fast
// oracle's own error bound, and R of every output element (the probabilistic bound's piece, formed
// from matrix products with its sums of squares folded into one, prob_mix_from_folded) within the
// relative uncertainty the fast oracle declares for it (AttnRow::rho_out), from no sink up to sinks
// that push the weights to the bottom of the double range (at +738 the scale f of prob_mix_scale is
// its cap, 2^1022) and with values that are exactly 0. Beyond about +740 R itself is subnormal
// (the fast and mp50 rows' R then differ by about 1e-9 of it, as they did before the fold), and
// lambda u R lies far below the underflow floors that decide those elements.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "attention_oracle.hpp"
#include "float_sums.hpp"
#include "oracle_exp.hpp"
#include "oasis_random.hpp"

namespace det = oasis::verify::detail;
using oasis::index_t;
using oasis::Tensor;

namespace {
/// The fast oracle's rows of every query of the call's (b 0, head 0).
std::vector<det::AttnRow> fast_rows_of(const det::AttnCall& c) {
  det::AttnPacked pk;
  det::pack_kv(c, 0, 0, pk);
  det::AttnWorkspace ws;
  std::vector<index_t> ts(static_cast<std::size_t>(c.s.Tq));
  for (index_t t = 0; t < c.s.Tq; ++t) ts[static_cast<std::size_t>(t)] = t;
  std::vector<det::AttnRow> rows;
  det::fast_rows(c, pk, 0, ts.data(), c.s.Tq, ws, rows);
  return rows;
}
}  // namespace

TEST(AttentionOracle, FastRowsMixtureBoundIsTheMp50RowsAtEverySink) {
  auto rng = oasis::test::make_rng(401);
  const index_t Tq = 3, Tk = 700, d = 32;
  for (double sink : {0.0, 300.0, 650.0, 700.0, 730.0, 738.0}) {
    // scores up to ~|30|: sigma (the shared events' coefficient) in the tens
    const Tensor<double> q = oasis::test::randn<double>({1, 1, Tq, d}, rng, 3.0);
    const Tensor<double> k = oasis::test::randn<double>({1, 1, Tk, d}, rng, 3.0);
    Tensor<double> v = oasis::test::randn<double>({1, 1, Tk, d}, rng);
    for (index_t i = 0; i < v.size(); i += 7) v[i] = 0.0;
    oasis::AttentionOptions o;
    o.normalizer = oasis::RowNorm::softmax1;
    o.null_logits = {sink};
    const det::AttnCall c(q, k, v, o);
    const std::vector<det::AttnRow> fast = fast_rows_of(c);
    ASSERT_EQ(fast.size(), static_cast<std::size_t>(Tq));
    for (index_t t = 0; t < Tq; ++t) {
      const det::AttnRow exact = det::mp50_row(c, 0, 0, t);
      const det::AttnRow& f = fast[static_cast<std::size_t>(t)];
      for (index_t x = 0; x < d; ++x) {
        const auto xu = static_cast<std::size_t>(x);
        const std::string at = "sink " + std::to_string(sink) + " row " + std::to_string(t) + " column " + std::to_string(x);
        EXPECT_LE(std::abs(f.out[xu] - exact.out[xu]), f.err_out[xu] + std::abs(exact.out[xu]) * 0x1p-53) << at;
        ASSERT_TRUE(std::isfinite(f.out_R[xu])) << at << ": R " << f.out_R[xu];
        ASSERT_GT(exact.out_R[xu], 0.0) << at;
        EXPECT_LE(std::abs(f.out_R[xu] - exact.out_R[xu]), f.rho_out[xu] * exact.out_R[xu])
            << at << ": fast " << f.out_R[xu] << " mp50 " << exact.out_R[xu] << " rho " << f.rho_out[xu];
      }
    }
  }
}

namespace {
/// Every piece of the fast rows of the call's (b 0, head 0) against its mp50 rows: the references
/// within the fast row's own bound (plus the mp50 value's rounding to double), every bound piece
/// within the relative uncertainty the fast row declares (rho); each row's path as `fused` says.
/// Counts the rows of each path into n_fused, n_general.
void expect_rows_are_the_mp50_rows(const det::AttnCall& c, bool fused, const std::string& label, int& n_fused,
                                   int& n_general) {
  const oasis::bounds::Precision own = det::own_precision();
  const std::vector<det::AttnRow> fast = fast_rows_of(c);
  for (index_t t = 0; t < c.s.Tq; ++t) {
    const det::AttnRow& f = fast[static_cast<std::size_t>(t)];
    const det::AttnRow g = det::mp50_row(c, 0, 0, t);
    const std::string at = label + " row " + std::to_string(t);
    EXPECT_EQ(f.fused, fused) << at;
    (f.fused ? n_fused : n_general)++;
    auto near = [&](double a, double b, double tol, const std::string& what) {
      EXPECT_LE(std::abs(a - b), tol + std::abs(b) * 0x1p-53) << at << " " << what << ": fast " << a << " mp50 " << b;
    };
    // (the own bounds, with Q a float sum, within own_rel of their values at the exact Q)
    const double ow = 1.0 + f.own_rel;
    near(f.lse, g.lse, ow * f.lse_bounds(own).wc, "lse");
    near(f.p_null, g.p_null, ow * f.p_null_bounds(own).wc, "p_null");
    near(f.lse_wc, g.lse_wc, f.rho * g.lse_wc, "lse_wc");
    near(f.lse_R, g.lse_R, f.rho * g.lse_R, "lse_R");
    near(f.p_null_wc, g.p_null_wc, f.rho * g.p_null_wc, "p_null_wc");
    near(f.p_null_R, g.p_null_R, f.rho * g.p_null_R, "p_null_R");
    ASSERT_EQ(f.p.size(), g.p.size()) << at;
    ASSERT_EQ(f.p_R.size(), g.p_R.size()) << at;  // empty without the probabilities' bounds
    ASSERT_EQ(f.masked.size(), g.masked.size()) << at;
    for (std::size_t j = 0; j < f.p.size(); ++j) {
      const auto jj = static_cast<index_t>(j);
      // (p_bounds reads p_R, which is empty without the probabilities' bounds)
      near(f.p[j], g.p[j], ow * (f.p_R.empty() ? own.u * f.p_wc[j] + own.p_floor : f.p_bounds(jj, own).wc),
           "p_" + std::to_string(j));
      near(f.p_wc[j], g.p_wc[j], f.rho * g.p_wc[j], "p_wc_" + std::to_string(j));
      if (!f.p_R.empty()) near(f.p_R[j], g.p_R[j], f.rho * g.p_R[j], "p_R_" + std::to_string(j));
      EXPECT_EQ(f.masked[j], g.masked[j]) << at;
    }
    for (index_t x = 0; x < c.s.d_v; ++x) {
      const auto xu = static_cast<std::size_t>(x);
      near(f.out[xu], g.out[xu], f.err_out[xu], "out_" + std::to_string(x));
      if (c.mix_R_needed) near(f.out_R[xu], g.out_R[xu], f.rho_out[xu] * g.out_R[xu], "out_R_" + std::to_string(x));
      near(f.G1[xu], g.G1[xu], f.rho_out[xu] * g.G1[xu], "G1_" + std::to_string(x));
      near(f.V1[xu], g.V1[xu], f.rho_out[xu] * g.V1[xu], "V1_" + std::to_string(x));
    }
  }
}
}  // namespace

// The fast rows against the mp50 rows on both paths: plain softmax and softmax1 from a negative sink
// to one that leaves the keys' exponentials near the bottom of oracle_exp's range (the fused rows:
// fused_row of attention_oracle_fused.cpp), beyond it and with a bias (the general rows); without
// the probabilities' and the mixtures' probabilistic pieces, in the other LSE conventions, with a
// single key, and with every logit tied for the maximum.
TEST(AttentionOracle, FastRowsEveryPieceIsTheMp50RowsOnBothPaths) {
  auto rng = oasis::test::make_rng(402);
  const index_t Tq = 3, Tk = 300, d = 32;
  int fused = 0, general = 0;
  auto options = [](double sink) {  // -1e300: plain softmax
    oasis::AttentionOptions o;
    if (sink > -1e300) {
      o.normalizer = oasis::RowNorm::softmax1;
      o.null_logits = {sink};
    }
    return o;
  };
  for (double sink : {-1e300, -3.0, 0.0, 5.0, 650.0, 720.0}) {  // 720: beyond oracle_exp
    for (bool with_bias : {false, true}) {
      const Tensor<double> q = oasis::test::randn<double>({1, 1, Tq, d}, rng, 2.0);
      const Tensor<double> k = oasis::test::randn<double>({1, 1, Tk, d}, rng, 2.0);
      const Tensor<double> v = oasis::test::randn<double>({1, 1, Tk, d}, rng);
      oasis::AttentionOptions o = options(sink);
      if (with_bias) o.bias = oasis::test::randn<double>({Tq, Tk}, rng);
      const det::AttnCall c(q, k, v, o);
      const std::string label = (sink > -1e300 ? "sink " + std::to_string(sink) : std::string("softmax")) +
                                (with_bias ? " bias" : "");
      expect_rows_are_the_mp50_rows(c, !with_bias && sink < 700, label, fused, general);
    }
  }
  EXPECT_EQ(fused, 15);
  EXPECT_EQ(general, 21);
  fused = general = 0;
  const Tensor<double> q = oasis::test::randn<double>({1, 1, Tq, d}, rng, 2.0);
  const Tensor<double> k = oasis::test::randn<double>({1, 1, Tk, d}, rng, 2.0);
  const Tensor<double> v = oasis::test::randn<double>({1, 1, Tk, d}, rng);
  for (double sink : {-1e300, 5.0}) {
    const oasis::AttentionOptions o = options(sink);
    const std::string label = sink > -1e300 ? "sink 5" : "softmax";
    det::AttnCall bare(q, k, v, o);
    bare.probs_needed = bare.mix_R_needed = false;
    expect_rows_are_the_mp50_rows(bare, true, label + ", no probs, no R", fused, general);
    for (const det::LseConvention cv : {det::LseConvention{true, false}, det::LseConvention{false, true}, det::LseConvention{true, true}}) {
      det::AttnCall conv(q, k, v, o);
      conv.lse = cv;
      expect_rows_are_the_mp50_rows(conv, true, label + ", lse " + cv.describe(), fused, general);
    }
    const Tensor<double> k1 = oasis::test::randn<double>({1, 1, 1, d}, rng, 2.0);
    const Tensor<double> v1 = oasis::test::randn<double>({1, 1, 1, d}, rng);
    expect_rows_are_the_mp50_rows(det::AttnCall(q, k1, v1, o), true, label + ", one key", fused, general);
    Tensor<double> kt({1, 1, 8, d});  // eight equal keys: every logit ties for the maximum
    for (index_t j = 0; j < 8; ++j)
      for (index_t x = 0; x < d; ++x) kt(0, 0, j, x) = k1(0, 0, 0, x);
    const Tensor<double> vt = oasis::test::randn<double>({1, 1, 8, d}, rng);
    expect_rows_are_the_mp50_rows(det::AttnCall(q, kt, vt, o), true, label + ", tied keys", fused, general);
  }
  EXPECT_EQ(fused, 2 * 6 * Tq);
  EXPECT_EQ(general, 0);
}

// V1, G1 and Z by float sums (src/verify/float_sums.hpp) where every value is in their range and the
// rows are at most fsum::kMaxTerms keys long, by double products elsewhere; on both, every piece
// within the uncertainty the fast rows declare (the float sums' included). Wide scores (a spread of
// hundreds) leave most weights of a row below float's normal range once scaled, so the float sums'
// absolute part is exercised as well as values that are exactly 0.
TEST(AttentionOracle, FloatSumsWhereTheValuesAllowThemDoubleProductsElsewhere) {
  auto rng = oasis::test::make_rng(404);
  const index_t Tq = 3, Tk = 300, d = 32;
  oasis::AttentionOptions o;
  o.normalizer = oasis::RowNorm::softmax1;
  o.null_logits = {2.0};
  auto packed = [](const det::AttnCall& c) {
    det::AttnPacked pk;
    det::pack_kv(c, 0, 0, pk);
    return pk.float_sums;
  };
  int fused = 0, general = 0;
  for (double qk_scale : {1.0, 7.0}) {
    const Tensor<double> q = oasis::test::randn<double>({1, 1, Tq, d}, rng, qk_scale);
    const Tensor<double> k = oasis::test::randn<double>({1, 1, Tk, d}, rng, qk_scale);
    Tensor<double> v = oasis::test::randn<double>({1, 1, Tk, d}, rng);
    for (index_t i = 0; i < v.size(); i += 5) v[i] = 0.0;
    for (index_t j = 0; j < Tk / 2; ++j) v(0, 0, j, 3) = 0.0;  // a column zero on the first half of the keys
    const std::string label = "scores times " + std::to_string(qk_scale);
    {
      const det::AttnCall c(q, k, v, o);
      EXPECT_TRUE(packed(c)) << label;
      expect_rows_are_the_mp50_rows(c, true, label + ", float sums", fused, general);
    }
    for (double out_of_range : {0x1p41, 0x1p-41}) {
      Tensor<double> w = v;
      w(0, 0, Tk - 1, 1) = out_of_range;
      const det::AttnCall c(q, k, w, o);
      EXPECT_FALSE(packed(c)) << label << " with a value of " << out_of_range;
      expect_rows_are_the_mp50_rows(c, true, label + ", double products", fused, general);
    }
  }
  EXPECT_EQ(fused, 6 * Tq);
  {  // a column nonzero only at a key that a bias of -200 puts 2^-288 below its row's largest weight:
     // its float sums are 0 (the scaled weight underflows), so that element is summed in double, and
     // every declared uncertainty stays small
    const Tensor<double> q = oasis::test::randn<double>({1, 1, Tq, d}, rng);
    const Tensor<double> k = oasis::test::randn<double>({1, 1, Tk, d}, rng);
    Tensor<double> v = oasis::test::randn<double>({1, 1, Tk, d}, rng);
    for (index_t j = 0; j < Tk; ++j) v(0, 0, j, 5) = j == 7 ? 1.5 : 0.0;
    oasis::AttentionOptions ob = o;
    ob.bias = Tensor<double>({Tq, Tk});
    for (index_t t = 0; t < Tq; ++t) ob.bias(t, 7) = -200.0;
    const det::AttnCall c(q, k, v, ob);
    EXPECT_TRUE(packed(c));
    expect_rows_are_the_mp50_rows(c, false, "a value only where the weight is tiny", fused, general);
    for (const det::AttnRow& r : fast_rows_of(c)) {
      EXPECT_GT(r.V1[5], 0.0) << "row " << r.t;
      for (index_t x = 0; x < d; ++x) EXPECT_LT(r.rho_out[static_cast<std::size_t>(x)], 1e-2) << "row " << r.t << " column " << x;
    }
  }
  {  // one key with all the weight and a large sigma: R^2's expanded sums cancel (sigma^2 (Y2 - 2 A^2 +
     // A^2 sp) = 0 with p_0 = 1), and Z's float error would pass R^2 itself, so Z is summed in double
    Tensor<double> q = oasis::test::randn<double>({1, 1, Tq, d}, rng);
    Tensor<double> k = oasis::test::randn<double>({1, 1, Tk, d}, rng);
    const Tensor<double> v = oasis::test::randn<double>({1, 1, Tk, d}, rng);
    for (index_t t = 1; t < Tq; ++t)
      for (index_t x = 0; x < d; ++x) q(0, 0, t, x) = q(0, 0, 0, x);
    for (index_t x = 0; x < d; ++x) k(0, 0, 0, x) = 400.0 * q(0, 0, 0, x);  // z_0 in the thousands
    const det::AttnCall c(q, k, v, o);
    EXPECT_TRUE(packed(c));
    expect_rows_are_the_mp50_rows(c, false, "one key with all the weight", fused, general);
    for (const det::AttnRow& r : fast_rows_of(c))
      for (index_t x = 0; x < d; ++x) EXPECT_LT(r.rho_out[static_cast<std::size_t>(x)], 1e-2) << "row " << r.t << " column " << x;
  }
#if defined(__x86_64__)
  {  // under flush-to-zero and denormals-are-zero (MXCSR, as a host may set them) a weight below
     // float's normal range is lost whole, beyond E: the double products (weights 1, 2^-57, 2^-127
     // against values 0, 2^-40, 2^40, so V1 is mostly the third term)
    Tensor<double> q1({1, 1, 1, 1}), k3({1, 1, 3, 1}), v3({1, 1, 3, 1});
    q1[0] = 1.0;
    k3[0] = 0.0;
    k3[1] = -57.0 * std::log(2.0);
    k3[2] = -127.0 * std::log(2.0);
    v3[0] = 0.0;
    v3[1] = 0x1p-40;
    v3[2] = 0x1p40;
    oasis::AttentionOptions plain;
    plain.scale = 1.0;
    const det::AttnCall c(q1, k3, v3, plain);
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);
    const std::vector<det::AttnRow> f = fast_rows_of(c);
    _mm_setcsr(csr);
    const det::AttnRow g = det::mp50_row(c, 0, 0, 0);
    EXPECT_LE(std::abs(f[0].V1[0] - g.V1[0]), f[0].rho_out[0] * g.V1[0]) << "fast " << f[0].V1[0] << " mp50 " << g.V1[0];
  }
#endif
  for (index_t keys : {oasis::verify::detail::fsum::kMaxTerms, oasis::verify::detail::fsum::kMaxTerms + 1}) {
    const Tensor<double> q = oasis::test::randn<double>({1, 1, 1, 4}, rng);
    const Tensor<double> k = oasis::test::randn<double>({1, 1, keys, 4}, rng);
    const Tensor<double> v = oasis::test::randn<double>({1, 1, keys, 4}, rng);
    EXPECT_EQ(packed(det::AttnCall(q, k, v, o)), keys <= oasis::verify::detail::fsum::kMaxTerms) << keys << " keys";
  }
}

// Q_j = sum_c |q_c k_jc| by a float sum (src/verify/float_sums.hpp) where every q and k is in its
// range, by a double product elsewhere: own_rel says which (gamma_{d_h+2}, or 0), and on both every
// piece is the mp50 rows' within the declared uncertainty. A k out of range turns it off for its
// (batch, kv head), a q out of range for its block of rows.
TEST(AttentionOracle, ScoreMagnitudesInFloatWhereTheValuesAllowThem) {
  auto rng = oasis::test::make_rng(405);
  const index_t Tq = 3, Tk = 200, d = 48;
  oasis::AttentionOptions o;
  o.normalizer = oasis::RowNorm::softmax1;
  o.null_logits = {1.0};
  const Tensor<double> q = oasis::test::randn<double>({1, 1, Tq, d}, rng, 2.0);
  const Tensor<double> k = oasis::test::randn<double>({1, 1, Tk, d}, rng, 2.0);
  const Tensor<double> v = oasis::test::randn<double>({1, 1, Tk, d}, rng);
  const double g = oasis::verify::detail::fsum::gamma(d + 2);
  int fused = 0, general = 0;
  struct Case {
    std::string label;
    Tensor<double> q, k;
    double own_rel;
  };
  std::vector<Case> cases = {{"in range", q, k, g}};
  for (double out_of_range : {0x1p41, 0x1p-41}) {  // (against a zero column of the other: scores unchanged in scale)
    Case ck{"a k of " + std::to_string(out_of_range), q, k, 0.0};
    ck.k(0, 0, Tk / 2, 7) = out_of_range;
    for (index_t t = 0; t < Tq; ++t) ck.q(0, 0, t, 7) = 0.0;
    Case cq{"a q of " + std::to_string(out_of_range), q, k, 0.0};
    cq.q(0, 0, Tq - 1, 3) = out_of_range;
    for (index_t j = 0; j < Tk; ++j) cq.k(0, 0, j, 3) = 0.0;
    cases.push_back(ck);
    cases.push_back(cq);
  }
  for (const Case& cs : cases) {
    const det::AttnCall c(cs.q, cs.k, v, o);
    for (const det::AttnRow& r : fast_rows_of(c)) {
      EXPECT_EQ(r.own_rel, cs.own_rel) << cs.label << " row " << r.t;
      EXPECT_GE(r.rho, cs.own_rel) << cs.label << " row " << r.t;
    }
    expect_rows_are_the_mp50_rows(c, true, cs.label, fused, general);
  }
  EXPECT_EQ(fused, 5 * Tq);
}

namespace {
double exp_rel_error(double x, double (*f)(double)) {
  const long double e = expl(static_cast<long double>(x));
  return static_cast<double>(std::fabs((static_cast<long double>(f(x)) - e) / e));
}
double exp_plain(double x) { return det::oracle_exp(x); }
#if defined(__x86_64__) && defined(__GNUC__)
// the same function with fused multiply-adds (GCC contracts a * b + c under this target), as the
// oracle's AVX2 and AVX-512 versions run it
__attribute__((target("avx2,fma"))) double exp_fma(double x) { return det::oracle_exp(x); }
#endif
}  // namespace

// oracle_exp (src/verify/oracle_exp.hpp) against expl on its range [-708, 0]: random and structured
// arguments (the reduction's boundaries at odd multiples of ln(2) / 2, the ends, tiny arguments),
// with and without fused multiply-add: within its stated 4u; exactly 1 at 0.
TEST(OracleExp, WithinFourUnitRoundoffsOnItsRange) {
  std::vector<double (*)(double)> fs = {&exp_plain};
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) fs.push_back(&exp_fma);
#endif
  auto rng = oasis::test::make_rng(403);
  std::uniform_real_distribution<double> wide(det::kOracleExpMin, 0.0), narrow(-1.0, 0.0);
  std::vector<double> xs = {det::kOracleExpMin, -0.0, 0.0, -0x1p-60, -1e-300, -0.5, -1.0, -700.0};
  for (int i = 0; i < 1 << 20; ++i) xs.push_back(wide(rng));
  for (int i = 0; i < 1 << 18; ++i) xs.push_back(narrow(rng));
  for (int k = 1; k <= 2043; k += 2)  // x log2(e) at n + 1/2: the reduction's widest |r|
    for (double dx : {-0x1p-40, 0.0, 0x1p-40}) {
      const double x = -k * 0.5 * std::log(2.0) + dx;
      if (x >= det::kOracleExpMin) xs.push_back(x);
    }
  const double u = 0x1p-53;
  for (auto* f : fs) {
    double worst = 0, worst_at = 0;
    for (double x : xs) {
      const double e = exp_rel_error(x, f);
      if (e > worst) {
        worst = e;
        worst_at = x;
      }
    }
    std::printf("oracle_exp (%s): largest relative error %.3f u at x = %.17g over %zu arguments\n",
                f == &exp_plain ? "baseline" : "fma", worst / u, worst_at, xs.size());
    EXPECT_LE(worst, 4.0 * u) << "at x = " << worst_at;
    EXPECT_EQ(f(0.0), 1.0);
    EXPECT_EQ(f(-0.0), 1.0);
  }
}
