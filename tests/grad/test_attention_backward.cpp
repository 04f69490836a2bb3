// Token attention backward (docs/spec.md §8): the mp50 gradients against mp50 central finite differences
// with a derived tolerance; the stated identities; float/double within the derived backward bound;
// a FlashAttention-2-style blockwise backward (correct zoo) and its mutants (wrong zoo) through the
// finite-difference check and through `oasis-verify compare` (op attention_backward).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "fd_support.hpp"
#include "oasis/grad/grad.hpp"
#include "oasis/io/dtype.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis_test.hpp"

using namespace oasis;
using R = mp50;
namespace fd = oasis::test::fd;

namespace {

/// Base seed of the random cases; OASIS_GRAD_SEED overrides it (printed on failure).
std::uint64_t base_seed() {
  const char* s = std::getenv("OASIS_GRAD_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 1500;
}

struct Case {
  std::string name;
  index_t B, H, H_kv, Tq, Tk, d_h, d_v;
  RowNorm norm = RowNorm::softmax1;
  bool causal = false, padding = false, sinks = false, bias = false, dlse = false, dp_null = false;
  index_t window = 0;
  AttentionLayout layout = AttentionLayout::bhtd;
  double q_scale = 1.0;
};

/// One instance: inputs in [B, H, T, d] order as doubles (exact in float), options, cotangents.
struct Instance {
  Tensor<double> q, k, v, dout, dlse, dpn;
  AttentionOptions opt;
};

Instance make_instance(const Case& c, std::uint64_t seed) {
  auto rng = oasis::test::make_rng(seed);
  Instance I;
  I.q = oasis::test::randn<float>({c.B, c.H, c.Tq, c.d_h}, rng, c.q_scale).cast<double>();
  I.k = oasis::test::randn<float>({c.B, c.H_kv, c.Tk, c.d_h}, rng).cast<double>();
  I.v = oasis::test::randn<float>({c.B, c.H_kv, c.Tk, c.d_v}, rng).cast<double>();
  I.dout = oasis::test::randn<float>({c.B, c.H, c.Tq, c.d_v}, rng).cast<double>();
  if (c.dlse) I.dlse = oasis::test::randn<float>({c.B, c.H, c.Tq}, rng).cast<double>();
  if (c.dp_null) I.dpn = oasis::test::randn<float>({c.B, c.H, c.Tq}, rng).cast<double>();
  I.opt.normalizer = c.norm;
  I.opt.causal = c.causal;
  I.opt.window = c.window;
  I.opt.layout = c.layout;
  if (c.padding) {
    for (index_t b = 0; b < c.B; ++b) I.opt.key_lengths.push_back(1 + static_cast<index_t>(rng() % c.Tk));
    if (c.norm == RowNorm::softmax1) I.opt.key_lengths[0] = 0;  // a fully padded sequence: p_null = 1
  }
  if (c.sinks)  // multiples of 2^-5: s +- 2^-40 stays exact in the double options
    for (index_t h = 0; h < c.H; ++h) I.opt.null_logits.push_back(std::ldexp(static_cast<double>(rng() % 129) - 64.0, -5));
  if (c.bias) {  // [1, H, Tq, Tk] multiples of 2^-5 with a few -inf (masked) entries
    I.opt.bias = Tensor<double>({1, c.H, c.Tq, c.Tk});
    for (index_t i = 0; i < I.opt.bias.size(); ++i)
      I.opt.bias[i] = rng() % 7 == 0 && c.norm == RowNorm::softmax1 ? neg_inf<double>()
                                                                     : std::ldexp(static_cast<double>(rng() % 65) - 32.0, -5);
  }
  return I;
}

/// The API takes the layout of the options; tests hold everything in [B, H, T, d].
template <class T>
Tensor<T> to_layout(const Tensor<T>& x, const AttentionOptions& o) {
  return o.layout == AttentionLayout::bthd ? swap_head_time(x) : x;
}

template <class T>
AttentionCotangents<T> cotangents(const Instance& I) {
  return {to_layout(I.dout.cast<T>(), I.opt), I.dlse.cast<T>(), I.dpn.cast<T>()};
}

/// The library's backward in T, gradients returned in [B, H, T, d].
template <class T>
AttentionGrads<T> library_backward(const Instance& I, bool return_scores = false) {
  AttentionOptions o = I.opt;
  o.return_probs = return_scores;
  AttentionGrads<T> g = token_attention_backward(to_layout(I.q.cast<T>(), o), to_layout(I.k.cast<T>(), o),
                                                 to_layout(I.v.cast<T>(), o), cotangents<T>(I), o);
  g.q = to_layout(g.q, o);
  g.k = to_layout(g.k, o);
  g.v = to_layout(g.v, o);
  return g;
}

/// The loss f = sum dO . out + sum dLSE lse + sum dP p_null in mp50 (rows of a fully masked plain
/// softmax have lse = -inf and no gradient: their lse term is left out).
R loss(const Tensor<R>& q, const Tensor<R>& k, const Tensor<R>& v, const AttentionOptions& opt, const Instance& I) {
  const AttentionResult<R> a = token_attention(to_layout(q, opt), to_layout(k, opt), to_layout(v, opt), opt);
  const Tensor<R> out = to_layout(a.out, opt);
  R f(0);
  for (index_t i = 0; i < out.size(); ++i) f += R(I.dout[i]) * out[i];
  for (index_t i = 0; i < a.lse.size(); ++i) {
    if (!I.dlse.empty() && is_finite(a.lse[i])) f += R(I.dlse[i]) * a.lse[i];
    if (!I.dpn.empty()) f += R(I.dpn[i]) * a.p_null[i];
  }
  return f;
}

/// Rows of the softmax functional: categories of row (b, h, t) with their incoming gradients
/// c_j = <dO_t, v_j> (keys) and dP_t (the null), for the M3 bound (fd_support.hpp).
struct RowInfo {
  std::vector<index_t> keys;  // visible (unmasked) keys
  std::vector<double> c;      // per key
  double c_null = 0, dlse = 0;
  bool has_null = false;
};

std::vector<RowInfo> row_infos(const Instance& I) {
  const AttentionShape s{I.q.dim(0), I.q.dim(1), I.k.dim(1), I.q.dim(2), I.k.dim(2), I.q.dim(3), I.v.dim(3)};
  AttentionOptions o = I.opt;
  o.layout = AttentionLayout::bhtd;
  std::vector<RowInfo> rows;
  const index_t group = s.H / s.H_kv;
  for (index_t b = 0; b < s.B; ++b)
    for (index_t h = 0; h < s.H; ++h)
      for (index_t t = 0; t < s.Tq; ++t) {
        RowInfo r;
        r.has_null = o.normalizer == RowNorm::softmax1;
        const KeyRange kr = visible_range(s, o, b, t);
        for (index_t j = kr.begin; j < kr.end; ++j) {
          if (std::isinf(attention_bias(o, b, h, t, j))) continue;
          double x = 0;
          for (index_t c = 0; c < s.d_v; ++c) x += I.dout(b, h, t, c) * I.v(b, h / group, j, c);
          r.keys.push_back(j);
          r.c.push_back(x);
        }
        r.c_null = I.dpn.empty() ? 0.0 : I.dpn(b, h, t);
        r.dlse = I.dlse.empty() ? 0.0 : I.dlse(b, h, t);
        rows.push_back(r);
      }
  return rows;
}

/// M3 of one row whose logit slopes are slope(j) for key j and slope_null for the null.
double row_m3(const RowInfo& r, const std::function<double(index_t)>& slope, double slope_null) {
  std::vector<fd::Category> cats;
  for (std::size_t i = 0; i < r.keys.size(); ++i) {
    fd::Category k;
    k.c = fd::around(r.c[i]);
    k.a = fd::around(slope(r.keys[i]));
    cats.push_back(k);
  }
  if (r.has_null) {
    fd::Category k;
    k.c = fd::around(r.c_null);
    k.a = fd::around(slope_null);
    cats.push_back(k);
  }
  return fd::row_third_derivative_bound(cats, r.dlse);
}

/// Every analytic gradient of `g` (mp50, [B, H, T, d]) against the central difference of the loss
/// (null logits and bias first, then k, v, q: the cheap coordinates where a wrong row backward shows).
fd::Summary fd_check(const Instance& I, const AttentionGrads<R>& g, long stop_after = 0) {
  const index_t B = I.q.dim(0), H = I.q.dim(1), Hkv = I.k.dim(1), Tq = I.q.dim(2), Tk = I.k.dim(2), dh = I.q.dim(3),
                dv = I.v.dim(3), group = H / Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  const Tensor<R> q = I.q.cast<R>(), k = I.k.cast<R>(), v = I.v.cast<R>();
  const std::vector<RowInfo> rows = row_infos(I);
  auto row = [&](index_t b, index_t h, index_t t) -> const RowInfo& { return rows[static_cast<std::size_t>((b * H + h) * Tq + t)]; };
  // rounding model: n_ops roundings, |logit| <= Z, F_abs >= sum |terms|, G_abs a derivative scale
  double Z = 0, F_abs = 0, amax = 0;
  for (index_t i = 0; i < q.size(); ++i) amax = std::max(amax, scale * std::abs(I.q[i]));
  for (index_t i = 0; i < k.size(); ++i) amax = std::max(amax, scale * std::abs(I.k[i]));
  for (const RowInfo& r : rows) {
    double cm = std::abs(r.c_null);
    for (double x : r.c) cm = std::max(cm, std::abs(x));
    F_abs += cm + std::abs(r.dlse) * 64;
  }
  Z = 64;  // |scores| <= |q| |k| sqrt(d_h) + |bias| + |s| stays far below 64 for the inputs here
  fd::Tolerance tol;
  tol.n_ops = 4.0 * static_cast<double>(B * H * Tq * Tk * (dh + dv + 16));
  tol.Z = Z;
  tol.F_abs = F_abs;
  tol.G_abs = F_abs * (1 + amax) * 8;
  fd::Summary sum;
  sum.stop_after = stop_after;
  auto check = [&](const std::string& name, const R& analytic, const std::function<R(const R&)>& f, double M3) {
    if (sum.done()) return;
    const R D = fd::central_difference(f);
    fd::Tolerance t = tol;
    t.M3 = M3;
    sum.add(name, analytic, D, t.value(static_cast<double>(D)));
  };
  AttentionOptions opt = I.opt;
  if (opt.normalizer == RowNorm::softmax1)
    for (index_t h = 0; h < H; ++h) {
      double M3 = 0;
      for (index_t b = 0; b < B; ++b)
        for (index_t t = 0; t < Tq; ++t) M3 += row_m3(row(b, h, t), [](index_t) { return 0.0; }, 1.0);
      const double s0 = opt.null_logits.empty() ? 0.0 : opt.null_logits[static_cast<std::size_t>(h)];
      check("dnull[" + std::to_string(h) + "]", g.null_logits[h],
            [&](const R& e) {
              AttentionOptions o = opt;
              o.null_logits.assign(static_cast<std::size_t>(H), 0.0);
              if (!opt.null_logits.empty()) o.null_logits = opt.null_logits;
              o.null_logits[static_cast<std::size_t>(h)] = s0 + static_cast<double>(e);  // exact: s0 = k 2^-5
              return loss(q, k, v, o, I);
            },
            M3);
    }
  if (!opt.bias.empty())
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < Tq; ++t)
        for (index_t j = 0; j < Tk; ++j) {
          if (std::isinf(opt.bias(0, h, t, j))) continue;
          double M3 = 0;
          for (index_t b = 0; b < B; ++b)
            M3 += row_m3(row(b, h, t), [&](index_t key) { return key == j ? 1.0 : 0.0; }, 0.0);
          check("dbias" + oasis::test::index_str(opt.bias.shape(), opt.bias.offset(0, h, t, j)),
                g.bias(0, h, t, j),
                [&](const R& e) {
                  AttentionOptions o = opt;
                  o.bias(0, h, t, j) += static_cast<double>(e);  // exact: multiples of 2^-5
                  return loss(q, k, v, o, I);
                },
                M3);
        }
  for (index_t b = 0; b < B; ++b)
    for (index_t hk = 0; hk < Hkv; ++hk)
      for (index_t j = 0; j < Tk; ++j) {
        for (index_t c = 0; c < dh; ++c) {
          double M3 = 0;
          for (index_t h = hk * group; h < (hk + 1) * group; ++h)
            for (index_t t = 0; t < Tq; ++t)
              M3 += row_m3(row(b, h, t), [&](index_t key) { return key == j ? scale * I.q(b, h, t, c) : 0.0; }, 0.0);
          check("dk" + oasis::test::index_str(k.shape(), k.offset(b, hk, j, c)), g.k(b, hk, j, c),
                [&](const R& e) { Tensor<R> x = k; x(b, hk, j, c) += e; return loss(q, x, v, opt, I); }, M3);
        }
        for (index_t c = 0; c < dv; ++c)  // the loss is linear in v: M3 = 0
          check("dv" + oasis::test::index_str(v.shape(), v.offset(b, hk, j, c)), g.v(b, hk, j, c),
                [&](const R& e) { Tensor<R> x = v; x(b, hk, j, c) += e; return loss(q, k, x, opt, I); }, 0.0);
      }
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < Tq; ++t)
        for (index_t c = 0; c < dh; ++c) {
          const double M3 = row_m3(row(b, h, t), [&](index_t j) { return scale * I.k(b, h / group, j, c); }, 0.0);
          check("dq" + oasis::test::index_str(q.shape(), q.offset(b, h, t, c)), g.q(b, h, t, c),
                [&](const R& e) { Tensor<R> x = q; x(b, h, t, c) += e; return loss(x, k, v, opt, I); }, M3);
        }
  return sum;
}

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

// ---- the zoo: a FlashAttention-2-style backward and its mutants --------------------------------

namespace {

enum class Mutant {
  none,              ///< correct
  sink_dropped,      ///< ds = 0
  d_without_null,    ///< D from probabilities that exclude the null: <dO, O> / (1 - p_null)
  d_unnormalised,    ///< D from the unnormalised accumulator: <dO, l O>
  gqa_not_summed,    ///< dk, dv of a kv head from its last query head only
  causal_missing,    ///< the backward recomputes the scores without the causal mask
  dp_without_complement,  ///< ds's dP term p_null dP instead of p_null (1 - p_null) dP
};

const char* name_of(Mutant m) {
  switch (m) {
    case Mutant::none: return "fa2_blockwise";
    case Mutant::sink_dropped: return "sink_gradient_dropped";
    case Mutant::d_without_null: return "D_from_probabilities_without_the_null";
    case Mutant::d_unnormalised: return "D_from_the_unnormalised_output";
    case Mutant::gqa_not_summed: return "gqa_gradients_not_summed";
    case Mutant::causal_missing: return "causal_mask_missing_in_backward";
    case Mutant::dp_without_complement: return "dp_term_without_1_minus_p_null";
  }
  return "?";
}

/// FlashAttention-2-style backward on [B, H, T, d] (bhtd, no window): the forward in key blocks
/// with the online softmax started at (max = s, sum = 1) for the null, O and LSE1 kept; then, per
/// key block and query block, P = exp(S - LSE1), dP = dO V^T, dS = P (dP - D + dLSE - p_null dP_null),
/// D = rowsum(dO O), accumulated blockwise into dq, dk, dv. `mu` injects one mistake.
template <class T>
AttentionGrads<T> fa2_backward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionCotangents<T>& d,
                               const AttentionOptions& opt, Mutant mu, index_t block = 2) {
  using std::exp;
  using std::log;
  using std::sqrt;
  const AttentionShape s = check_attention_args(q, k, v, opt);
  const T scale = T(1) / sqrt(T(s.d_h));
  const index_t group = s.H / s.H_kv;
  const bool null = opt.normalizer == RowNorm::softmax1;
  AttentionOptions back = opt;
  if (mu == Mutant::causal_missing) back.causal = false;
  auto score = [&](const AttentionOptions& o, index_t b, index_t h, index_t t, index_t j, bool& visible) {
    const KeyRange kr = visible_range(s, o, b, t);
    const double bias = attention_bias(o, b, h, t, j);
    visible = j >= kr.begin && j < kr.end && !std::isinf(bias);
    T dot(0);
    for (index_t c = 0; c < s.d_h; ++c) dot += q(b, h, t, c) * k(b, h / group, j, c);
    return scale * dot + T(bias);
  };
  Tensor<T> O({s.B, s.H, s.Tq, s.d_v}), lse({s.B, s.H, s.Tq}), pn({s.B, s.H, s.Tq}), D({s.B, s.H, s.Tq});
  for (index_t b = 0; b < s.B; ++b)
    for (index_t h = 0; h < s.H; ++h) {
      const T sl = opt.null_logits.empty() ? T(0) : T(opt.null_logits[static_cast<std::size_t>(h)]);
      for (index_t t = 0; t < s.Tq; ++t) {
        T m = null ? sl : neg_inf<T>(), l = null ? T(1) : T(0);
        std::vector<T> acc(static_cast<std::size_t>(s.d_v), T(0));
        for (index_t j0 = 0; j0 < s.Tk; j0 += block) {
          const index_t j1 = std::min(s.Tk, j0 + block);
          std::vector<T> z;
          std::vector<index_t> keys;
          T mb = m;
          for (index_t j = j0; j < j1; ++j) {
            bool vis;
            const T x = score(opt, b, h, t, j, vis);
            if (!vis) continue;
            z.push_back(x);
            keys.push_back(j);
            if (x > mb) mb = x;
          }
          if (keys.empty()) continue;
          const T corr = is_neg_inf(m) ? T(0) : exp(m - mb);
          l *= corr;
          for (auto& a : acc) a *= corr;
          for (std::size_t i = 0; i < keys.size(); ++i) {
            const T e = exp(z[i] - mb);
            l += e;
            for (index_t c = 0; c < s.d_v; ++c) acc[static_cast<std::size_t>(c)] += e * v(b, h / group, keys[i], c);
          }
          m = mb;
        }
        const bool empty = !null && l == T(0);
        lse(b, h, t) = empty ? neg_inf<T>() : m + log(l);
        pn(b, h, t) = null ? exp(sl - lse(b, h, t)) : T(0);
        T dd(0);
        for (index_t c = 0; c < s.d_v; ++c) {
          O(b, h, t, c) = empty ? T(0) : acc[static_cast<std::size_t>(c)] / l;
          dd += d.out(b, h, t, c) * (mu == Mutant::d_unnormalised ? acc[static_cast<std::size_t>(c)] : O(b, h, t, c));
        }
        if (mu == Mutant::d_without_null && null && pn(b, h, t) < T(1)) dd /= (T(1) - pn(b, h, t));
        D(b, h, t) = dd;
      }
    }
  AttentionGrads<T> g{Tensor<T>(q.shape()), Tensor<T>(k.shape()), Tensor<T>(v.shape()),
                      null ? Tensor<T>({s.H}) : Tensor<T>(), Tensor<T>(), Tensor<T>()};
  for (index_t b = 0; b < s.B; ++b)
    for (index_t hk = 0; hk < s.H_kv; ++hk)
      for (index_t j0 = 0; j0 < s.Tk; j0 += block) {  // key block: dk, dv accumulate in registers
        const index_t j1 = std::min(s.Tk, j0 + block);
        Tensor<T> dk({j1 - j0, s.d_h}), dv({j1 - j0, s.d_v});
        for (index_t h = hk * group; h < (hk + 1) * group; ++h) {
          if (mu == Mutant::gqa_not_summed) dk = Tensor<T>(dk.shape()), dv = Tensor<T>(dv.shape());
          for (index_t t0 = 0; t0 < s.Tq; t0 += block)
            for (index_t t = t0; t < std::min(s.Tq, t0 + block); ++t) {
              if (is_neg_inf(lse(b, h, t))) continue;
              const T dl = d.lse.empty() ? T(0) : d.lse(b, h, t), dP = d.p_null.empty() ? T(0) : d.p_null(b, h, t);
              for (index_t j = j0; j < j1; ++j) {
                bool vis;
                const T z = score(back, b, h, t, j, vis);
                if (!vis) continue;
                const T p = exp(z - lse(b, h, t));
                T dp(0);
                for (index_t c = 0; c < s.d_v; ++c) dp += d.out(b, h, t, c) * v(b, hk, j, c);
                const T dz = p * (dp - D(b, h, t) + dl - pn(b, h, t) * dP);
                for (index_t c = 0; c < s.d_v; ++c) dv(j - j0, c) += p * d.out(b, h, t, c);
                for (index_t c = 0; c < s.d_h; ++c) {
                  dk(j - j0, c) += scale * dz * q(b, h, t, c);
                  g.q(b, h, t, c) += scale * dz * k(b, hk, j, c);
                }
              }
            }
        }
        for (index_t j = j0; j < j1; ++j) {
          for (index_t c = 0; c < s.d_h; ++c) g.k(b, hk, j, c) = dk(j - j0, c);
          for (index_t c = 0; c < s.d_v; ++c) g.v(b, hk, j, c) = dv(j - j0, c);
        }
      }
  if (null && mu != Mutant::sink_dropped)
    for (index_t b = 0; b < s.B; ++b)
      for (index_t h = 0; h < s.H; ++h)
        for (index_t t = 0; t < s.Tq; ++t) {
          const T p = pn(b, h, t), dl = d.lse.empty() ? T(0) : d.lse(b, h, t), dP = d.p_null.empty() ? T(0) : d.p_null(b, h, t);
          const T comp = mu == Mutant::dp_without_complement ? T(1) : T(1) - p;
          g.null_logits[h] += p * (dl - D(b, h, t) + comp * dP);
        }
  return g;
}

/// The zoo's instance: GQA, causal, padding (one sequence fully padded, one with 3 of 4 keys, so
/// that the causal mask matters), sinks, dLSE and dP: every mutant's mistake shows here.
Instance zoo_instance() {
  Case c{"zoo", 2, 4, 2, 4, 4, 2, 2};
  c.causal = c.sinks = c.dlse = c.dp_null = true;
  Instance I = make_instance(c, base_seed() + 200);
  I.opt.key_lengths = {0, 3};
  return I;
}

io::TensorMap as_map(std::initializer_list<std::pair<const char*, Tensor<double>>> l) {
  io::TensorMap m;
  for (const auto& [name, t] : l)
    if (!t.empty()) m.emplace(name, io::StoredTensor{io::DType::f32, t});
  return m;
}

/// `oasis-verify compare` on the float gradients `g` of instance I (op attention_backward).
verify::CompareReport compare_float(const Instance& I, const AttentionGrads<float>& g) {
  std::string o = "{\"causal\": " + std::string(I.opt.causal ? "true" : "false");
  if (!I.opt.key_lengths.empty()) {
    o += ", \"key_lengths\": [";
    for (std::size_t i = 0; i < I.opt.key_lengths.size(); ++i) o += (i ? ", " : "") + std::to_string(I.opt.key_lengths[i]);
    o += "]";
  }
  o += ", \"normalizer\": \"" + std::string(to_string(I.opt.normalizer)) + "\"}";
  const io::json::Value opt = io::json::parse(o);
  Tensor<double> nl;
  if (!I.opt.null_logits.empty()) nl = Tensor<double>({static_cast<index_t>(I.opt.null_logits.size())}, I.opt.null_logits);
  const io::TensorMap in = as_map({{"q", I.q}, {"k", I.k}, {"v", I.v}, {"grad_out", I.dout}, {"grad_lse", I.dlse},
                                   {"grad_p_null", I.dpn}, {"null_logits", nl}});
  const io::TensorMap out = as_map({{"grad_q", g.q.cast<double>()}, {"grad_k", g.k.cast<double>()},
                                    {"grad_v", g.v.cast<double>()}, {"grad_null_logits", g.null_logits.cast<double>()}});
  return verify::check("attention_backward", in, out, opt);
}

}  // namespace

TEST(AttentionBackwardZoo, CorrectImplementationsPass) {
  const Instance I = zoo_instance();
  const fd::Summary s = fd_check(I, fa2_backward(I.q.cast<R>(), I.k.cast<R>(), I.v.cast<R>(), cotangents<R>(I), I.opt,
                                                 Mutant::none));
  EXPECT_TRUE(s.ok()) << "fa2 in mp50 against finite differences:\n" << s.first;
  // float: the plain reference and the blockwise kernel (block 2 and 3); double: the reference
  for (index_t block : {2, 3}) {
    const verify::CompareReport r =
        compare_float(I, fa2_backward(I.q.cast<float>(), I.k.cast<float>(), I.v.cast<float>(), cotangents<float>(I),
                                      I.opt, Mutant::none, block));
    EXPECT_TRUE(r.passed) << verify::format_report(r);
  }
  const verify::CompareReport r = compare_float(I, library_backward<float>(I));
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  std::printf("%s", verify::format_report(r).c_str());
}

TEST(AttentionBackwardZoo, EveryMutantFailsBothChecks) {
  const Instance I = zoo_instance();
  for (Mutant mu : {Mutant::sink_dropped, Mutant::d_without_null, Mutant::d_unnormalised, Mutant::gqa_not_summed,
                    Mutant::causal_missing, Mutant::dp_without_complement}) {
    SCOPED_TRACE(name_of(mu));
    const fd::Summary s =
        fd_check(I, fa2_backward(I.q.cast<R>(), I.k.cast<R>(), I.v.cast<R>(), cotangents<R>(I), I.opt, mu), 1);
    EXPECT_FALSE(s.ok()) << "the finite-difference check missed " << name_of(mu);
    const verify::CompareReport r =
        compare_float(I, fa2_backward(I.q.cast<float>(), I.k.cast<float>(), I.v.cast<float>(), cotangents<float>(I),
                                      I.opt, mu));
    EXPECT_FALSE(r.passed) << "compare missed " << name_of(mu) << "\n" << verify::format_report(r);
    std::string failed;
    for (const auto& t : r.tensors)
      if (!t.passed) failed += " " + t.name + " (err/bound " + std::to_string(t.worst_ratio) + ")";
    std::printf("mutant %-40s FD: first failure after %ld gradients (%.3g x tol); compare FAIL:%s\n", name_of(mu),
                s.checked, s.worst_ratio, failed.c_str());
  }
}
