// Baseline token normalisers (docs/spec.md §4; docs/baselines.md): clipped softmax (over softmax and
// over Softmax1), sparsemax, entmax-1.5, and the S1 sink logit. Each is checked against its
// *definition* evaluated in oasis::mp50 — softmax directly from the quotient, the sparse maps by
// bisection on their threshold equation (an algorithm independent of the sort-based one) — in
// mp50, double and float within the bounds derived in docs/baselines.md; plus sums, supports,
// mask invariance (exact), permutation equivariance, closed forms and fully masked rows.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "oasis/core/multiprecision.hpp"
#include "oasis/ops/normalizer.hpp"
#include "oasis_mp.hpp"

using namespace oasis;
using R = mp50;
using oasis::test::mp_abs;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

/// A generated row: logits k/500 in [-8, 8] (not exact in float: rounded once to T, and the
/// reference is evaluated on the rounded values), about 1 in 5 masked; the null logit s.
struct Row {
  std::vector<double> z;
  double s = 0;
};

Row gen_row(int max_m, bool masked) {
  Row r;
  const int m = *rc::gen::inRange(1, max_m + 1);
  for (int j = 0; j < m; ++j) {
    const bool mask = masked && *rc::gen::inRange(0, 5) == 0;
    r.z.push_back(mask ? -kInf : *rc::gen::inRange(-4000, 4001) / 500.0);
  }
  r.s = *rc::gen::inRange(-4000, 4001) / 500.0;
  return r;
}

/// Clipped softmax parameters: gamma in [-0.2, 0], zeta in [1, 1.2] (Bondarenko et al. use
/// gamma = -0.025 .. -0.1, zeta = 1), as exact multiples of 1/256.
NormParams gen_params() {
  NormParams np;
  np.gamma = -*rc::gen::inRange(0, 52) / 256.0;
  np.zeta = 1.0 + *rc::gen::inRange(0, 52) / 256.0;
  return np;
}

/// The exact result of a normaliser on a row, from its definition, with what the bounds need.
struct Ref {
  std::vector<R> p;
  R p_null = 0;
  R tau = 0;           // sparse maps: threshold; softmax family: unused
  std::vector<R> q;    // clipped: the underlying (un-clipped) probabilities
  double M = -kInf;    // max over visible logits (and s for the null kinds)
  index_t k = 0;       // sparse maps: support size
  double A = 0;        // sparse maps: sum over the support of |x_j| (x = z - M, /2 for entmax)
};

/// Sparse maps by bisection: f(tau) = sum_j phi(y_j - tau) - 1 is continuous and decreasing,
/// f(-1) >= 0 > f(0) for y = x (sparsemax) or x / 2 (entmax15) with x = z - max z; 200 halvings
/// of a width-1 interval exceed mp50's 168 bits. The shift is exact in mp50 (the inputs are
/// float or double values) and keeps the reference's rounding relative to |x|, not |z|.
Ref sparse_reference(bool ent, const std::vector<R>& z) {
  Ref r;
  r.p.assign(z.size(), R(0));
  R M = R(-kInf);
  for (const R& x : z) if (!is_neg_inf(x) && x > M) M = x;
  if (is_neg_inf(M)) return r;  // fully masked (documented zero)
  r.M = static_cast<double>(M);
  auto y_of = [&](const R& x) { return ent ? R((x - M) / 2) : R(x - M); };
  auto f = [&](const R& tau) {
    R sum = 0;
    for (const R& x : z) {
      if (is_neg_inf(x)) continue;
      const R d = y_of(x) - tau;
      if (d > 0) sum += ent ? R(d * d) : d;
    }
    return sum - 1;
  };
  R lo = -1, hi = 0;
  for (int it = 0; it < 200; ++it) {
    const R mid = (lo + hi) / 2;
    (f(mid) >= 0 ? lo : hi) = mid;
  }
  const R tau = (lo + hi) / 2;
  r.tau = ent ? R(tau + M / 2) : R(tau + M);  // in z (sparsemax) or z/2 (entmax15) units
  for (std::size_t j = 0; j < z.size(); ++j) {
    if (is_neg_inf(z[j])) continue;
    const R d = y_of(z[j]) - tau;
    if (d > 0) {
      r.p[j] = ent ? R(d * d) : d;
      ++r.k;
      r.A += std::abs(static_cast<double>(y_of(z[j])));
    }
  }
  return r;
}

/// Softmax family from the quotient definition (no max shift: |z|, |s| <= 8 cannot overflow).
Ref softmax_reference(RowNorm kind, const std::vector<R>& z, const R& s, const NormParams& np) {
  using std::exp;
  Ref r;
  r.p.assign(z.size(), R(0));
  const bool null = has_null_category(kind);
  R S = null ? exp(s) : R(0);
  if (null) r.M = static_cast<double>(s);
  for (const R& x : z)
    if (!is_neg_inf(x)) {
      S += exp(x);
      r.M = std::max(r.M, static_cast<double>(x));
    }
  r.q.assign(z.size(), R(0));
  if (S == 0) return r;  // plain softmax, fully masked: documented zero
  for (std::size_t j = 0; j < z.size(); ++j) r.q[j] = is_neg_inf(z[j]) ? R(0) : R(exp(z[j]) / S);
  r.p_null = null ? R(exp(s) / S) : R(0);
  const bool clipped = kind == RowNorm::clipped_softmax || kind == RowNorm::clipped_softmax1;
  for (std::size_t j = 0; j < z.size(); ++j) {
    if (is_neg_inf(z[j]) || !clipped) {
      r.p[j] = r.q[j];
      continue;
    }
    const R c = (R(np.zeta) - R(np.gamma)) * r.q[j] + R(np.gamma);
    r.p[j] = c < 0 ? R(0) : (c > 1 ? R(1) : c);
  }
  return r;
}

Ref reference(RowNorm kind, const std::vector<R>& z, const R& s, const NormParams& np) {
  if (kind == RowNorm::sparsemax || kind == RowNorm::entmax15) return sparse_reference(kind == RowNorm::entmax15, z);
  return softmax_reference(kind, z, s, np);
}

/// sigma = sum_k q_k a_k + (terms - 1) u over the real keys and the null term (relative error
/// of the normaliser sum S in T).
double softmax_sigma(RowNorm kind, const std::vector<R>& z, const R& s, const Ref& ref, double u) {
  const bool null = has_null_category(kind);
  auto a = [&](double x) { return u * (std::abs(x - ref.M) + 2.0); };
  double sigma = 0;
  index_t terms = 0;
  if (null) {
    sigma += static_cast<double>(ref.p_null) * a(static_cast<double>(s));
    ++terms;
  }
  for (std::size_t j = 0; j < z.size(); ++j)
    if (!is_neg_inf(z[j])) {
      sigma += static_cast<double>(ref.q[j]) * a(static_cast<double>(z[j]));
      ++terms;
    }
  return sigma + static_cast<double>(std::max<index_t>(terms - 1, 0)) * u;
}

/// Per-element bound on |computed in T - exact| (docs/baselines.md, "Normaliser bounds").
std::vector<double> bounds(RowNorm kind, const std::vector<R>& z, const R& s, const NormParams& np, const Ref& ref,
                           double u) {
  const std::size_t m = z.size();
  std::vector<double> b(m, 0.0);
  if (std::isinf(ref.M)) return b;  // fully masked: exact zeros
  if (kind == RowNorm::sparsemax) {
    const double tau = std::abs(static_cast<double>(ref.tau) - ref.M);
    const double e_tau = u * (2 * ref.A + 2 * tau + 2);
    for (std::size_t j = 0; j < m; ++j)
      if (!is_neg_inf(z[j]))
        b[j] = 1.02 * (u * (std::abs(static_cast<double>(z[j]) - ref.M) + static_cast<double>(ref.p[j])) + e_tau);
    return b;
  }
  if (kind == RowNorm::entmax15) {
    const double k = static_cast<double>(std::max<index_t>(ref.k, 1));
    const double e_mean = (k + 1) * u;
    const double e_ss = 2 * std::sqrt(k) * (e_mean + 2 * u) + (k + 1) * u;
    const double e_sqrt = (e_ss + u) / 2 + k * u / 2 + u;
    const double e_tau = e_mean + e_sqrt + u;
    for (std::size_t j = 0; j < m; ++j)
      if (!is_neg_inf(z[j])) b[j] = 1.02 * (2 * (u + e_tau) + 3 * u);
    return b;
  }
  // Softmax family (the derivation of docs/tolerances.md): a_k = u(|z_k - M| + 2) for the shift
  // and exp, sigma = sum_k q_k a_k + (terms - 1) u for the sum, rel(q_j) <= a_j + sigma + 2u;
  // clipped: the affine map and clip add |zeta - gamma| rel q + 4u (|zeta - gamma| q + |gamma|)
  // (rounding of zeta - gamma in T, the product and the sum; clip is 1-Lipschitz and exact).
  const double sig = softmax_sigma(kind, z, s, ref, u);
  const bool clipped = kind == RowNorm::clipped_softmax || kind == RowNorm::clipped_softmax1;
  const double scale = clipped ? np.zeta - np.gamma : 1.0;
  for (std::size_t j = 0; j < m; ++j) {
    if (is_neg_inf(z[j])) continue;
    const double q = static_cast<double>(ref.q[j]);
    const double rel = u * (std::abs(static_cast<double>(z[j]) - ref.M) + 2.0) + sig + 2 * u;
    b[j] = 1.02 * (scale * rel * q + (clipped ? 4 * u * (scale * q + std::abs(np.gamma)) : 0.0)) +
           2 * std::numeric_limits<double>::denorm_min();
  }
  return b;
}

/// p_null bound of the normalisers with a null category: (a(s) + sigma + 2u) p_null.
double p_null_bound(RowNorm kind, const std::vector<R>& z, const R& s, const Ref& ref, double u) {
  const double a_s = u * (std::abs(static_cast<double>(s) - ref.M) + 2.0);
  return 1.02 * (a_s + softmax_sigma(kind, z, s, ref, u) + 2 * u) * static_cast<double>(ref.p_null) +
         2 * std::numeric_limits<double>::denorm_min();
}

template <class T>
std::vector<T> rounded(const std::vector<double>& z) {
  std::vector<T> out;
  for (double x : z) out.push_back(static_cast<T>(x));
  return out;
}

/// Runs normaliser `kind` in T on the row (rounded to T) and compares with the mp50 definition.
template <class T>
std::string check_against_definition(RowNorm kind, const Row& row, const NormParams& np) {
  const std::vector<T> zt = rounded<T>(row.z);
  const T st = static_cast<T>(row.s);
  std::vector<T> p(zt.size());
  const RowStats<T> got = normalize_row(kind, zt.data(), static_cast<index_t>(zt.size()), st, p.data(), np);
  std::vector<R> zr;
  for (const T& x : zt) zr.push_back(R(x));
  const Ref ref = reference(kind, zr, R(st), np);
  // Unit roundoff of T. For T = mp50 the reference (same precision) has an error of the same
  // form as the implementation's, so the bound uses 2u = eps(mp50) to cover both; for float and
  // double the reference's own error is ~1e-49 and negligible.
  const double u = std::is_same<T, R>::value ? static_cast<double>(std::numeric_limits<R>::epsilon())
                                             : static_cast<double>(std::numeric_limits<T>::epsilon()) / 2;
  const std::vector<double> b = bounds(kind, zr, R(st), np, ref, u);
  std::ostringstream os;
  R sum = 0;
  for (std::size_t j = 0; j < p.size(); ++j) {
    const double err = std::abs(static_cast<double>(R(p[j]) - ref.p[j]));
    if (!(err <= b[j]))
      os << to_string(kind) << " p[" << j << "] = " << static_cast<double>(p[j]) << " ref "
         << static_cast<double>(ref.p[j]) << " |err| " << err << " bound " << b[j] << "; ";
    if (is_neg_inf(zt[j]) && p[j] != T(0)) os << "masked key " << j << " has mass; ";
    sum += R(p[j]);
  }
  if (has_null_category(kind)) {
    const double err = std::abs(static_cast<double>(R(got.p_null) - ref.p_null));
    if (!(err <= p_null_bound(kind, zr, R(st), ref, u)))
      os << "p_null " << static_cast<double>(got.p_null) << " ref " << static_cast<double>(ref.p_null) << "; ";
  }
  // Sums: softmax family sum_j p_j + p_null = 1, sparse maps sum_j p_j = 1 (up to the bounds).
  const bool clipped = kind == RowNorm::clipped_softmax || kind == RowNorm::clipped_softmax1;
  if (!clipped && !std::isinf(ref.M)) {
    const double total = static_cast<double>(sum + R(got.p_null));
    const double tol = std::accumulate(b.begin(), b.end(), 0.0) + 64 * u;
    if (!(std::abs(total - 1) <= tol)) os << "mass " << total << " != 1 (tol " << tol << "); ";
  }
  if (std::isinf(ref.M) && (sum != 0 || (has_null_category(kind) && got.p_null != T(1))))
    os << "fully masked row is not the documented zero; ";
  return os.str();
}

const RowNorm kAll[] = {RowNorm::softmax, RowNorm::softmax1, RowNorm::clipped_softmax, RowNorm::clipped_softmax1,
                        RowNorm::sparsemax, RowNorm::entmax15};

}  // namespace

// ------------------------------------------------------------------------------------------------
// Against the definitions in high precision.

RC_GTEST_PROP(BaselineNormalizerProperty, MatchesDefinitionInMp50, ()) {
  const Row row = gen_row(24, true);
  const NormParams np = gen_params();
  for (RowNorm kind : kAll) {
    const std::string msg = check_against_definition<R>(kind, row, np);
    if (!msg.empty()) RC_FAIL(msg);
  }
}

RC_GTEST_PROP(BaselineNormalizerProperty, DoubleWithinDerivedBound, ()) {
  const Row row = gen_row(24, true);
  const NormParams np = gen_params();
  for (RowNorm kind : kAll) {
    const std::string msg = check_against_definition<double>(kind, row, np);
    if (!msg.empty()) RC_FAIL(msg);
  }
}

RC_GTEST_PROP(BaselineNormalizerProperty, FloatWithinDerivedBound, ()) {
  const Row row = gen_row(64, true);
  const NormParams np = gen_params();
  for (RowNorm kind : kAll) {
    const std::string msg = check_against_definition<float>(kind, row, np);
    if (!msg.empty()) RC_FAIL(msg);
  }
}

// ------------------------------------------------------------------------------------------------
// Structure: supports, mask invariance, permutation equivariance.

RC_GTEST_PROP(BaselineNormalizerProperty, MaskingWithNegInfEqualsRemovalExactly, ()) {
  // Masked keys are skipped (softmax adds +0 to its sum, the sparse maps never see them), so the
  // visible probabilities are bitwise those of the row with the masked keys removed.
  const Row row = gen_row(24, true);
  const NormParams np = gen_params();
  std::vector<double> kept;
  for (double x : row.z) if (!std::isinf(x)) kept.push_back(x);
  for (RowNorm kind : kAll) {
    std::vector<double> p(row.z.size()), pk(kept.size());
    const RowStats<double> a = normalize_row(kind, row.z.data(), static_cast<index_t>(row.z.size()), row.s,
                                             p.data(), np);
    const RowStats<double> b = normalize_row(kind, kept.data(), static_cast<index_t>(kept.size()), row.s,
                                             pk.data(), np);
    std::size_t i = 0;
    for (std::size_t j = 0; j < row.z.size(); ++j) {
      if (std::isinf(row.z[j])) {
        RC_ASSERT(p[j] == 0.0);
      } else {
        RC_ASSERT(p[j] == pk[i]);
        ++i;
      }
    }
    RC_ASSERT(a.p_null == b.p_null);
    RC_ASSERT((a.lse == b.lse) || (std::isinf(a.lse) && std::isinf(b.lse)));
  }
}

RC_GTEST_PROP(BaselineNormalizerProperty, PermutationEquivariance, ()) {
  // Sparse maps sort first, so a permutation gives bitwise the permuted result; the softmax
  // family sums in another order: equal within the reordering bound 2 (m + 1) u p_j.
  const Row row = gen_row(24, true);
  const NormParams np = gen_params();
  const auto m = row.z.size();
  std::vector<std::size_t> perm(m);
  std::iota(perm.begin(), perm.end(), 0);
  for (std::size_t i = m; i-- > 1;) std::swap(perm[i], perm[static_cast<std::size_t>(*rc::gen::inRange<int>(0, static_cast<int>(i) + 1))]);
  std::vector<double> zp(m);
  for (std::size_t j = 0; j < m; ++j) zp[j] = row.z[perm[j]];
  const double u = std::numeric_limits<double>::epsilon() / 2;
  for (RowNorm kind : kAll) {
    std::vector<double> p(m), pp(m);
    normalize_row(kind, row.z.data(), static_cast<index_t>(m), row.s, p.data(), np);
    normalize_row(kind, zp.data(), static_cast<index_t>(m), row.s, pp.data(), np);
    const bool sparse = kind == RowNorm::sparsemax || kind == RowNorm::entmax15;
    const double scale = (kind == RowNorm::clipped_softmax || kind == RowNorm::clipped_softmax1) ? np.zeta - np.gamma : 1;
    for (std::size_t j = 0; j < m; ++j) {
      if (sparse) RC_ASSERT(pp[j] == p[perm[j]]);
      else RC_ASSERT(std::abs(pp[j] - p[perm[j]]) <= 2.0 * (m + 3) * u * scale * std::max(p[perm[j]], 1.0));
    }
  }
}

RC_GTEST_PROP(BaselineNormalizerProperty, SparseSupportIsAboveThreshold, ()) {
  // p_j > 0 exactly when z_j exceeds the threshold (z_j > tau, or z_j / 2 > tau for entmax15),
  // where tau is RowStats::lse; entries far from the threshold are decided the same way in mp50.
  const Row row = gen_row(24, true);
  std::vector<R> z;
  for (double x : row.z) z.push_back(R(x));
  for (RowNorm kind : {RowNorm::sparsemax, RowNorm::entmax15}) {
    std::vector<R> p(z.size());
    const RowStats<R> st = normalize_row(kind, z.data(), static_cast<index_t>(z.size()), R(0), p.data(), NormParams{});
    for (std::size_t j = 0; j < z.size(); ++j) {
      if (is_neg_inf(z[j])) { RC_ASSERT(p[j] == 0); continue; }
      const R y = kind == RowNorm::entmax15 ? R(z[j] / 2) : z[j];
      if (y - st.lse > R(1e-40)) RC_ASSERT(p[j] > 0);
      if (y - st.lse < R(-1e-40)) RC_ASSERT(p[j] == 0);
    }
  }
}

RC_GTEST_PROP(BaselineNormalizerProperty, ClippedIsClipOfUnderlyingAndReachesExactZeroAndOne, ()) {
  // clipped_softmax(1) = clip((zeta - gamma) softmax(1) + gamma, 0, 1) computed from the same
  // underlying row in the same precision: bitwise. RowStats (LSE, p_null) are the underlying ones.
  const Row row = gen_row(24, true);
  const NormParams np = gen_params();
  for (auto [clip, base] : {std::pair{RowNorm::clipped_softmax, RowNorm::softmax},
                            std::pair{RowNorm::clipped_softmax1, RowNorm::softmax1}}) {
    std::vector<double> p(row.z.size()), q(row.z.size());
    const RowStats<double> a = normalize_row(clip, row.z.data(), static_cast<index_t>(row.z.size()), row.s, p.data(), np);
    const RowStats<double> b = normalize_row(base, row.z.data(), static_cast<index_t>(row.z.size()), row.s, q.data(), np);
    RC_ASSERT(a.p_null == b.p_null);
    RC_ASSERT((a.lse == b.lse) || (std::isinf(a.lse) && std::isinf(b.lse)));
    const double sc = np.zeta - np.gamma;
    for (std::size_t j = 0; j < p.size(); ++j) {
      if (std::isinf(row.z[j])) { RC_ASSERT(p[j] == 0.0); continue; }
      const double c = sc * q[j] + np.gamma;
      RC_ASSERT(p[j] == std::min(1.0, std::max(0.0, c)));
      RC_ASSERT(p[j] >= 0.0 && p[j] <= 1.0);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Closed forms.

TEST(BaselineNormalizer, SparsemaxClosedForm) {
  // z = [-2, 0, 0.5]: support {0, 0.5}, tau = (0.5 + 0 - 1)/2 = -0.25, p = [0, 0.25, 0.75], exact.
  for (int shift : {0, 3, -7}) {
    Vec<double> z(3);
    z << -2 + shift, 0 + shift, 0.5 + shift;
    const RowProbs<double> r = sparsemax(z);
    EXPECT_EQ(r.p[0], 0.0);
    EXPECT_EQ(r.p[1], 0.25);
    EXPECT_EQ(r.p[2], 0.75);
    EXPECT_EQ(r.lse, -0.25 + shift);
    EXPECT_EQ(r.p_null, 0.0);
  }
  // A dominant logit takes all the mass: z = [3, 0] -> tau = 2, p = [1, 0].
  Vec<double> z(2);
  z << 3, 0;
  const RowProbs<double> r = sparsemax(z);
  EXPECT_EQ(r.p[0], 1.0);
  EXPECT_EQ(r.p[1], 0.0);
}

TEST(BaselineNormalizer, Entmax15ClosedForm) {
  // z = [1, 0, -5]: y = z/2 - 1/2 = [0, -1/2, -3]. Support {1, 2}: (0 - tau)^2 + (-1/2 - tau)^2 = 1
  // -> 2 tau^2 + tau - 3/4 = 0 -> tau = (-1 - sqrt 7)/4 (shifted), and -3 < tau, so
  // p = [(4 + sqrt 7)/8, (4 - sqrt 7)/8, 0].
  using std::sqrt;
  Vec<R> z(3);
  z << R(1), R(0), R(-5);
  const RowProbs<R> r = entmax15(z);
  const R s7 = sqrt(R(7));
  EXPECT_LE(mp_abs(r.p[0] - (4 + s7) / 8), R(1e-45));
  EXPECT_LE(mp_abs(r.p[1] - (4 - s7) / 8), R(1e-45));
  EXPECT_EQ(r.p[2], R(0));
  EXPECT_LE(mp_abs(r.lse - ((-1 - s7) / 4 + R(0.5))), R(1e-45));  // tau in z/2 units
  Vec<double> zd(3);
  zd << 1, 0, -5;
  const RowProbs<double> rd = entmax15(zd);
  EXPECT_NEAR(rd.p[0], (4 + std::sqrt(7.0)) / 8, 8 * std::numeric_limits<double>::epsilon());
  EXPECT_NEAR(rd.p[1], (4 - std::sqrt(7.0)) / 8, 8 * std::numeric_limits<double>::epsilon());
  EXPECT_EQ(rd.p[2], 0.0);
  // Equal logits: uniform. z = [0, 0]: (0 - tau)^2 * 2 = 1 -> p = [1/2, 1/2].
  Vec<double> e(2);
  e << 0, 0;
  const RowProbs<double> u = entmax15(e);
  EXPECT_NEAR(u.p[0], 0.5, 4 * std::numeric_limits<double>::epsilon());
  EXPECT_NEAR(u.p[1], 0.5, 4 * std::numeric_limits<double>::epsilon());
  // Gap of exactly 2 in z (1 in y): support {1} at its boundary, p = [1, 0].
  e << 2, 0;
  const RowProbs<double> w = entmax15(e);
  EXPECT_EQ(w.p[0], 1.0);
  EXPECT_EQ(w.p[1], 0.0);
}

TEST(BaselineNormalizer, ClippedSoftmaxClosedForm) {
  // softmax([0, 0]) = [1/2, 1/2] -> clip(1.025 / 2 - 0.025) = 0.4875 each (default gamma, zeta).
  Vec<double> z(2);
  z << 0, 0;
  const RowProbs<double> r = normalize(RowNorm::clipped_softmax, z);
  EXPECT_NEAR(r.p[0], 0.4875, 2 * std::numeric_limits<double>::epsilon());
  EXPECT_NEAR(r.p[1], 0.4875, 2 * std::numeric_limits<double>::epsilon());
  // A dominant key: softmax([20, 0]) = [1 - 2.06e-9, 2.06e-9]. gamma < 0 clips the small one to
  // exactly 0 (a no-op with finite logits); with zeta = 1 the large one stays below 1
  // (1.025 (1 - 2.06e-9) - 0.025 = 1 - 2.1e-9), with zeta = 1.1 it is clipped to exactly 1.
  z << 20, 0;
  const RowProbs<double> d = normalize(RowNorm::clipped_softmax, z);
  EXPECT_LT(d.p[0], 1.0);
  EXPECT_NEAR(d.p[0], 1.0 - 1.025 / (1 + std::exp(20.0)), 4 * std::numeric_limits<double>::epsilon());
  EXPECT_EQ(d.p[1], 0.0);
  const RowProbs<double> d1 = normalize(RowNorm::clipped_softmax, z, 0.0, NormParams{-0.025, 1.1});
  EXPECT_EQ(d1.p[0], 1.0);
  EXPECT_EQ(d1.p[1], 0.0);
  // Over Softmax1: [0, 0] with s = 0 -> 1/3 each -> 1.025/3 - 0.025.
  z << 0, 0;
  const RowProbs<double> c1 = normalize(RowNorm::clipped_softmax1, z, 0.0);
  EXPECT_NEAR(c1.p[0], 1.025 / 3 - 0.025, 2 * std::numeric_limits<double>::epsilon());
  EXPECT_NEAR(c1.p_null, 1.0 / 3, 2 * std::numeric_limits<double>::epsilon());
  // Custom parameters: gamma = -0.5, zeta = 1.5 on [0, 0]: 2 * 0.5 - 0.5 = 0.5.
  const RowProbs<double> cp = normalize(RowNorm::clipped_softmax, z, 0.0, NormParams{-0.5, 1.5});
  EXPECT_EQ(cp.p[0], 0.5);
}

TEST(BaselineNormalizer, SinkLogitS1IsSoftmaxOverLogitsAndSink) {
  // S1: softmax with a learned null logit s = softmax over [z, s] with the last entry dropped.
  Vec<R> z(3), ext(4);
  z << R(0.5), R(-1), R(2);
  const R s = R(1.25);
  ext << z, s;
  const RowProbs<R> a = normalize(RowNorm::softmax1, z, s);
  const RowProbs<R> b = softmax(ext);
  for (index_t j = 0; j < 3; ++j) EXPECT_LE(mp_abs(a.p[j] - b.p[j]), R(1e-45));
  EXPECT_LE(mp_abs(a.p_null - b.p[3]), R(1e-45));
}

// ------------------------------------------------------------------------------------------------
// Fully masked rows, names, bad input.

TEST(BaselineNormalizer, FullyMaskedRowsAreDocumented) {
  const double z[3] = {-kInf, -kInf, -kInf};
  double p[3] = {7, 7, 7};
  for (RowNorm kind : {RowNorm::clipped_softmax, RowNorm::sparsemax, RowNorm::entmax15}) {
    const RowStats<double> st = normalize_row(kind, z, 3, 0.0, p, NormParams{});
    EXPECT_EQ(p[0], 0.0);
    EXPECT_EQ(p[2], 0.0);
    EXPECT_TRUE(std::isinf(st.lse) && st.lse < 0) << to_string(kind);
    EXPECT_EQ(st.p_null, 0.0);
    EXPECT_THROW(normalize_row(kind, z, 3, 0.0, p, NormParams{}, MaskedRow::error), oasis::invalid_argument);
    EXPECT_NO_THROW(normalize_row(kind, z, 0, 0.0, p, NormParams{}));  // m = 0 is fully masked too
  }
  const RowStats<double> st = normalize_row(RowNorm::clipped_softmax1, z, 3, 0.5, p, NormParams{}, MaskedRow::error);
  EXPECT_EQ(p[1], 0.0);
  EXPECT_EQ(st.p_null, 1.0);
  EXPECT_EQ(st.lse, 0.5);
}

TEST(BaselineNormalizer, NamesRoundTripAndBadInputIsRejected) {
  for (RowNorm kind : kAll) EXPECT_EQ(parse_row_norm(to_string(kind)), kind);
  EXPECT_THROW(parse_row_norm("entmax"), oasis::invalid_argument);
  const double z[2] = {0, 1};
  double p[2];
  try {
    normalize_row(RowNorm::clipped_softmax, z, 2, 0.0, p, NormParams{0.1, 1.0});
    ADD_FAILURE() << "gamma > 0 accepted";
  } catch (const oasis::invalid_argument& e) {
    EXPECT_EQ(e.argument(), "gamma");
  }
  try {
    normalize_row(RowNorm::clipped_softmax1, z, 2, 0.0, p, NormParams{-0.1, 0.9});
    ADD_FAILURE() << "zeta < 1 accepted";
  } catch (const oasis::invalid_argument& e) {
    EXPECT_EQ(e.argument(), "zeta");
  }
  const double bad[2] = {0, std::numeric_limits<double>::quiet_NaN()};
  EXPECT_THROW(normalize_row(RowNorm::sparsemax, bad, 2, 0.0, p), oasis::invalid_argument);
  EXPECT_THROW(normalize_row(RowNorm::entmax15, bad, 2, 0.0, p), oasis::invalid_argument);
  // the null logit: NaN is refused by name; +inf is the limit with all the mass on the null
  // (docs/spec.md §1), which clipping leaves at 0 for every key
  try {
    normalize_row(RowNorm::clipped_softmax1, z, 2, std::numeric_limits<double>::quiet_NaN(), p);
    ADD_FAILURE() << "a NaN null logit accepted";
  } catch (const oasis::invalid_argument& e) {
    EXPECT_EQ(e.argument(), "null_logit");
  }
  const auto st = normalize_row(RowNorm::clipped_softmax1, z, 2, kInf, p);
  EXPECT_EQ(st.p_null, 1.0);
  EXPECT_EQ(p[0], 0.0);
  EXPECT_EQ(p[1], 0.0);
}
