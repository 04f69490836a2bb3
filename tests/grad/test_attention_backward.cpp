// Token attention backward (docs/spec.md §8): the mp50 gradients against mp50 central finite differences
// with a derived tolerance (attention_grad_support.hpp); the stated identities; float/double within
// the derived backward bound. The zoo of blockwise backwards: test_attention_backward_zoo.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "attention_grad_support.hpp"

using namespace oasis;
using namespace oasis::attention_grad_test;

namespace {

const std::vector<Case>& fd_cases() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> c;
    c.push_back({"softmax1_plain", 1, 2, 2, 3, 3, 3, 2});
    Case x{"softmax1_causal_gqa_sinks_dlse_dpnull", 2, 4, 2, 3, 4, 2, 2};
    x.causal = x.sinks = x.dlse = x.dp_null = true;
    c.push_back(x);
    x = {"softmax_causal_padding_dlse", 2, 2, 1, 3, 4, 3, 2};
    x.norm = RowNorm::softmax;
    x.causal = x.padding = x.dlse = true;
    c.push_back(x);
    x = {"softmax1_window_bias_bthd", 1, 2, 1, 4, 4, 2, 3};
    x.window = 2;
    x.bias = x.sinks = x.dp_null = true;
    x.layout = AttentionLayout::bthd;
    c.push_back(x);
    x = {"softmax1_padding_causal_Tq_lt_Tk", 2, 2, 2, 2, 5, 2, 2};
    x.causal = x.padding = x.dlse = x.sinks = true;
    c.push_back(x);
    x = {"softmax1_large_scores", 1, 1, 1, 3, 3, 4, 2};
    x.q_scale = 3.0;
    x.sinks = x.dp_null = true;
    c.push_back(x);
    return c;
  }();
  return cases;
}

}  // namespace

// ---- analytic gradients against finite differences --------------------------------------------

TEST(AttentionBackward, MatchesFiniteDifferencesInMp50) {
  std::uint64_t seed = base_seed();
  double worst = 0;
  long checked = 0;
  for (const Case& c : fd_cases()) {
    SCOPED_TRACE(c.name + " seed " + std::to_string(seed));
    const Instance I = make_instance(c, seed++);
    const fd::Summary s = fd_check(I, library_backward<R>(I));
    EXPECT_TRUE(s.ok()) << s.failed << " of " << s.checked << " gradients off their finite difference\n" << s.first;
    worst = std::max(worst, s.worst_ratio);
    checked += s.checked;
  }
  std::printf("attention backward vs FD: %ld gradients, worst |analytic - fd| / tol = %.3g\n", checked, worst);
}

// ---- identities --------------------------------------------------------------------------------

TEST(AttentionBackward, RowIdentityScoresPlusNullSumToDlse) {
  // Shifting every logit of a row, the null included, moves only LSE1: summed over the rows of a
  // head, sum dz + ds_h = sum dLSE; with plain softmax sum_j dz_tj = dLSE_t row by row.
  for (RowNorm norm : {RowNorm::softmax1, RowNorm::softmax}) {
    Case c{"identity", 2, 3, 3, 4, 5, 3, 2};
    c.norm = norm;
    c.causal = c.dlse = c.dp_null = true;
    c.sinks = norm == RowNorm::softmax1;
    const Instance I = make_instance(c, base_seed() + 40);
    const AttentionGrads<R> g = library_backward<R>(I, true);
    for (index_t h = 0; h < c.H; ++h) {
      R lhs = norm == RowNorm::softmax1 ? g.null_logits[h] : R(0), rhs(0);
      for (index_t b = 0; b < c.B; ++b)
        for (index_t t = 0; t < c.Tq; ++t) {
          R row(0);
          for (index_t j = 0; j < c.Tk; ++j) row += g.scores(b, h, t, j);
          lhs += row;
          rhs += R(I.dlse(b, h, t));
          if (norm == RowNorm::softmax) EXPECT_LT(std::abs(static_cast<double>(row - R(I.dlse(b, h, t)))), 1e-40);
        }
      EXPECT_LT(std::abs(static_cast<double>(lhs - rhs)), 1e-40) << to_string(norm) << " head " << h;
    }
  }
}

TEST(AttentionBackward, SinkGradientIdentity) {
  // Without dLSE and dP: ds_h = -sum_{b,t} p_null,t <dO_t, O_t>.
  Case c{"sink", 2, 4, 2, 5, 5, 3, 3};
  c.causal = c.sinks = true;
  const Instance I = make_instance(c, base_seed() + 41);
  const AttentionGrads<R> g = library_backward<R>(I);
  const AttentionResult<R> a = token_attention(I.q.cast<R>(), I.k.cast<R>(), I.v.cast<R>(), I.opt);
  for (index_t h = 0; h < c.H; ++h) {
    R ds(0);
    for (index_t b = 0; b < c.B; ++b)
      for (index_t t = 0; t < c.Tq; ++t) {
        R D(0);
        for (index_t x = 0; x < c.d_v; ++x) D += R(I.dout(b, h, t, x)) * a.out(b, h, t, x);
        ds -= a.p_null(b, h, t) * D;
      }
    EXPECT_LT(std::abs(static_cast<double>(g.null_logits[h] - ds)), 1e-40 * (1 + std::abs(static_cast<double>(ds))));
  }
}

TEST(AttentionBackward, GroupedQueryGradientsAreSumsOverTheGroup) {
  // GQA = replicated kv heads: dq and ds are the same, dk and dv of a kv head are the sums of the
  // replicated heads' gradients over its group (ds is per query head, never summed).
  Case c{"gqa", 1, 6, 2, 4, 4, 3, 2};
  c.causal = c.sinks = c.dlse = true;
  const Instance I = make_instance(c, base_seed() + 42);
  Instance J = I;
  J.k = Tensor<double>({1, 6, 4, 3});
  J.v = Tensor<double>({1, 6, 4, 2});
  for (index_t h = 0; h < 6; ++h)
    for (index_t j = 0; j < 4; ++j) {
      for (index_t x = 0; x < 3; ++x) J.k(0, h, j, x) = I.k(0, h / 3, j, x);
      for (index_t x = 0; x < 2; ++x) J.v(0, h, j, x) = I.v(0, h / 3, j, x);
    }
  const AttentionGrads<R> g = library_backward<R>(I), r = library_backward<R>(J);
  auto close = [](const R& a, const R& b) { return std::abs(static_cast<double>(a - b)) <= 1e-40; };
  for (index_t i = 0; i < g.q.size(); ++i) EXPECT_TRUE(close(g.q[i], r.q[i])) << "dq " << i;
  for (index_t h = 0; h < 6; ++h) EXPECT_TRUE(close(g.null_logits[h], r.null_logits[h])) << "ds " << h;
  for (index_t hk = 0; hk < 2; ++hk)
    for (index_t j = 0; j < 4; ++j) {
      for (index_t x = 0; x < 3; ++x)
        EXPECT_TRUE(close(g.k(0, hk, j, x), r.k(0, 3 * hk, j, x) + r.k(0, 3 * hk + 1, j, x) + r.k(0, 3 * hk + 2, j, x)));
      for (index_t x = 0; x < 2; ++x)
        EXPECT_TRUE(close(g.v(0, hk, j, x), r.v(0, 3 * hk, j, x) + r.v(0, 3 * hk + 1, j, x) + r.v(0, 3 * hk + 2, j, x)));
    }
}

TEST(AttentionBackward, LayoutDoesNotChangeAnyValue) {
  Case c{"layout", 2, 4, 2, 3, 5, 4, 3};
  c.causal = c.sinks = c.dlse = c.dp_null = c.bias = true;
  c.window = 3;
  Instance I = make_instance(c, base_seed() + 43);
  const AttentionGrads<double> a = library_backward<double>(I);
  I.opt.layout = AttentionLayout::bthd;
  const AttentionGrads<double> b = library_backward<double>(I);  // converted back to [B, H, T, d]
  EXPECT_TRUE(oasis::test::exactly_equal("dq", a.q, b.q));
  EXPECT_TRUE(oasis::test::exactly_equal("dk", a.k, b.k));
  EXPECT_TRUE(oasis::test::exactly_equal("dv", a.v, b.v));
  EXPECT_TRUE(oasis::test::exactly_equal("dnull", a.null_logits, b.null_logits));
  EXPECT_TRUE(oasis::test::exactly_equal("dbias", a.bias, b.bias));
}

TEST(AttentionBackward, PaddingEqualsTruncationAndPaddedKeysGetNothing) {
  Case c{"pad", 1, 2, 2, 3, 6, 3, 2};
  c.dlse = c.sinks = true;
  Instance I = make_instance(c, base_seed() + 44);
  I.opt.key_lengths = {4};
  Instance J = I;
  J.opt.key_lengths.clear();
  J.k = Tensor<double>({1, 2, 4, 3});
  J.v = Tensor<double>({1, 2, 4, 2});
  for (index_t h = 0; h < 2; ++h)
    for (index_t j = 0; j < 4; ++j) {
      for (index_t x = 0; x < 3; ++x) J.k(0, h, j, x) = I.k(0, h, j, x);
      for (index_t x = 0; x < 2; ++x) J.v(0, h, j, x) = I.v(0, h, j, x);
    }
  const AttentionGrads<double> a = library_backward<double>(I), b = library_backward<double>(J);
  EXPECT_TRUE(oasis::test::exactly_equal("dq", a.q, b.q));
  EXPECT_TRUE(oasis::test::exactly_equal("dnull", a.null_logits, b.null_logits));
  for (index_t h = 0; h < 2; ++h)
    for (index_t j = 0; j < 6; ++j) {
      for (index_t x = 0; x < 3; ++x) EXPECT_EQ(a.k(0, h, j, x), j < 4 ? b.k(0, h, j, x) : 0.0);
      for (index_t x = 0; x < 2; ++x) EXPECT_EQ(a.v(0, h, j, x), j < 4 ? b.v(0, h, j, x) : 0.0);
    }
}

TEST(AttentionBackward, FullyMaskedRows) {
  // Softmax1: a fully padded sequence has p_null = 1, O = 0 and passes dLSE to the null logit;
  // plain softmax (documented zero) passes nothing.
  Case c{"masked", 1, 1, 1, 2, 3, 2, 2};
  c.dlse = c.dp_null = true;
  for (RowNorm norm : {RowNorm::softmax1, RowNorm::softmax}) {
    c.norm = norm;
    Instance I = make_instance(c, base_seed() + 45);
    I.opt.key_lengths = {0};
    const AttentionGrads<double> g = library_backward<double>(I);
    for (index_t i = 0; i < g.q.size(); ++i) EXPECT_EQ(g.q[i], 0.0);
    for (index_t i = 0; i < g.k.size(); ++i) EXPECT_EQ(g.k[i], 0.0);
    for (index_t i = 0; i < g.v.size(); ++i) EXPECT_EQ(g.v[i], 0.0);
    if (norm == RowNorm::softmax1) EXPECT_EQ(g.null_logits[0], I.dlse[0] + I.dlse[1]);
  }
}

#if defined(OASIS_HAVE_MPFR)
TEST(AttentionBackward, Mp50AndMpfr50Agree) {
  // Two independent 50-digit arithmetics (Boost cpp_bin_float, MPFR) give the same gradients.
  Case c{"mpfr", 1, 2, 1, 3, 4, 3, 2};
  c.causal = c.sinks = c.dlse = c.dp_null = true;
  const Instance I = make_instance(c, base_seed() + 46);
  const AttentionGrads<R> a = library_backward<R>(I);
  const AttentionGrads<mpfr50> b = library_backward<mpfr50>(I);
  auto agree = [](const auto& x, const Tensor<R>& y) {
    for (index_t i = 0; i < y.size(); ++i) {
      const R xi(x[i].str(60, std::ios_base::scientific));  // exact enough: 60 decimal digits
      if (std::abs(static_cast<double>(xi - y[i])) > 1e-40 * (1 + std::abs(static_cast<double>(y[i])))) return false;
    }
    return true;
  };
  EXPECT_TRUE(agree(b.q, a.q));
  EXPECT_TRUE(agree(b.k, a.k));
  EXPECT_TRUE(agree(b.v, a.v));
  EXPECT_TRUE(agree(b.null_logits, a.null_logits));
}
#endif

TEST(AttentionBackward, RejectsBadInput) {
  Case c{"bad", 1, 2, 1, 3, 3, 2, 2};
  const Instance I = make_instance(c, 7);
  const Tensor<double> q = I.q, k = I.k, v = I.v;
  auto arg_of = [&](const AttentionCotangents<double>& d, const AttentionOptions& o) {
    try {
      token_attention_backward(q, k, v, d, o);
    } catch (const oasis::invalid_argument& e) {
      return e.argument();
    }
    return std::string("none");
  };
  EXPECT_EQ(arg_of({Tensor<double>({1, 2, 3, 3})}, {}), "dout");
  EXPECT_EQ(arg_of({I.dout, Tensor<double>({1, 2, 2})}, {}), "dlse");
  EXPECT_EQ(arg_of({I.dout, {}, Tensor<double>({2, 2, 3})}, {}), "dp_null");
  Tensor<double> bad = I.dout;
  bad[3] = std::nan("");
  EXPECT_EQ(arg_of({bad}, {}), "dout");
  AttentionOptions o;
  o.normalizer = RowNorm::sparsemax;
  EXPECT_EQ(arg_of({I.dout}, o), "normalizer");
  EXPECT_EQ(arg_of({I.dout}, {}), "none");
}

// ---- float and double within the derived backward bound ---------------------------------------

namespace {

template <class T>
void check_within_bound(const Case& c, std::uint64_t seed, double& worst) {
  const Instance I = make_instance(c, seed);
  AttentionOptions of = I.opt;
  of.return_probs = true;
  const Tensor<R> qr = to_layout(I.q.cast<R>(), of), kr = to_layout(I.k.cast<R>(), of), vr = to_layout(I.v.cast<R>(), of);
  const AttentionResult<R> fwd = token_attention(qr, kr, vr, of);
  const AttentionGrads<R> ref = token_attention_backward(qr, kr, vr, cotangents<R>(I), I.opt);
  const Tensor<T> q = to_layout(I.q.cast<T>(), of), k = to_layout(I.k.cast<T>(), of), v = to_layout(I.v.cast<T>(), of);
  const AttentionGrads<T> got = token_attention_backward(q, k, v, cotangents<T>(I), I.opt);
  const bounds::AttentionBackwardBounds b = bounds::attention_backward_bounds(q, k, v, cotangents<T>(I), of, fwd);
  auto use = [](const Tensor<double>& bt) { return [&bt](index_t i, double) { return bt[i]; }; };
  auto ratio = [&](const auto& g, const Tensor<R>& r, const Tensor<double>& bt) {
    for (index_t i = 0; i < g.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(R(g[i]) - r[i])) / bt[i]);
  };
  EXPECT_TRUE(oasis::test::within_bound("dq", got.q, ref.q, use(b.q)));
  EXPECT_TRUE(oasis::test::within_bound("dk", got.k, ref.k, use(b.k)));
  EXPECT_TRUE(oasis::test::within_bound("dv", got.v, ref.v, use(b.v)));
  ratio(got.q, ref.q, b.q);
  ratio(got.k, ref.k, b.k);
  ratio(got.v, ref.v, b.v);
  if (c.norm == RowNorm::softmax1) {
    EXPECT_TRUE(oasis::test::within_bound("dnull", got.null_logits, ref.null_logits, use(b.null_logits)));
    ratio(got.null_logits, ref.null_logits, b.null_logits);
  }
  if (c.bias) EXPECT_TRUE(oasis::test::within_bound("dbias", got.bias, ref.bias, use(b.bias)));
}

const std::vector<Case>& bound_cases() {
  static const std::vector<Case> cases = [] {
    std::vector<Case> c;
    Case x{"b_causal_gqa", 2, 4, 2, 12, 12, 16, 8};
    x.causal = x.sinks = x.dlse = x.dp_null = true;
    c.push_back(x);
    x = {"b_softmax_pad", 2, 2, 1, 9, 13, 8, 8};
    x.norm = RowNorm::softmax;
    x.padding = x.causal = x.dlse = true;
    c.push_back(x);
    x = {"b_window_bias_bthd", 1, 4, 4, 10, 10, 8, 4};
    x.window = 4;
    x.bias = x.sinks = true;
    x.layout = AttentionLayout::bthd;
    c.push_back(x);
    x = {"b_large_scores", 1, 2, 2, 8, 24, 32, 16};
    x.q_scale = 6.0;
    x.sinks = x.dlse = true;
    c.push_back(x);
    return c;
  }();
  return cases;
}

}  // namespace

template <class T>
class AttentionBackwardPrecision : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(AttentionBackwardPrecision, Scalars);

TYPED_TEST(AttentionBackwardPrecision, WithinDerivedBoundOfHighPrecision) {
  std::uint64_t seed = base_seed() + 100;
  double worst = 0;
  for (const Case& c : bound_cases()) {
    SCOPED_TRACE(c.name + " seed " + std::to_string(seed));
    check_within_bound<TypeParam>(c, seed++, worst);
  }
  std::printf("attention backward %s: worst |err| / bound = %.3g\n", sizeof(TypeParam) == 4 ? "float" : "double", worst);
  EXPECT_LE(worst, 1.0);
}
