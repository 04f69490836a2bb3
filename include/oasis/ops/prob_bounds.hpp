// oasis/ops/prob_bounds.hpp — probabilistic rounding-error bounds of the plain reference (the
// default tolerance policy of oasis-verify compare; derivation in docs/tolerances.md).
//
// Model (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019): to first order the error of a result is
// sum_i c_i delta_i over its rounding events, |delta_i| <= u. The worst-case bounds of
// oasis/ops/error_bounds.hpp bound it by u sum_i |c_i|. If the delta_i are independent and mean zero
// (mean-independent suffices), Hoeffding's inequality gives
//     |sum_i c_i delta_i| <= lambda u R,   R = sqrt(sum_i c_i^2),
// with probability at least 1 - 2 exp(-lambda^2 / 2) per element. Events with one coefficient
// for several terms (a common normaliser, a pre-scaled query) are coherent: their coefficient is
// the sum over the terms, not a sum in quadrature.
//
// The functions below return R in units of u (lambda- and u-free), bounding sum c_i^2 over the
// evaluation orders a kernel may use (sequential, pairwise, blocked online softmax with rescaling,
// split-K with a final combine, exp or exp2 of log2(e)-scaled scores, pre-scaled q): per row with
// exact probabilities p_j (null p_0), logits z_j, x_j = z_j - M, S = sum e^{x}, m' terms:
//   kappa_j^2 = zeta_j^2 + 2 x_j^2 + 5   (zeta_j^2: the logit's own events; x_j: subtraction and
//                                          a log2(e) product; 5: exp within 1 ulp and a product)
//   Sk        = sum_j p_j^2 kappa_j^2 + p_0^2 kappa_0^2
//   Lambda    = 3 m' + 4 log(S)^2 + LSE^2   (sums with rescaling, log within 1 ulp, M + log S)
//   sigma     = sum of |coefficients| of the events shared by every logit of the row
//   R(LSE)^2    = Sk + Lambda + sigma^2
//   R(p_j)^2    = p_j^2 (kappa_j^2 (1 - 2 p_j) + Sk + Lambda + (z_j - LSE)^2 + 4 + 4 sigma^2)
//   R(p_0)^2    = p_0^2 (kappa_0^2 (1 - 2 p_0) + Sk + Lambda + (s - LSE)^2 + 4 + sigma^2)
//   R(A_c)^2    = sum_j p_j^2 kappa_j^2 (v_jc - A_c)^2 + p_0^2 kappa_0^2 A_c^2 + (3 m' + 4) A_c^2
//                 + sum_j p_j^2 v_jc^2 + 3 m V1_c^2 + sigma^2 (sum_j p_j) sum_j p_j (v_jc - A_c)^2,
//                 V1_c = sum_j p_j |v_jc|
// (the derivative of p_j in its own logit is p_j (1 - p_j), of A_c in z_j is p_j (v_jc - A_c):
// kappa_j^2 ((1 - p_j)^2 - p_j^2) + Sk is the exact sum of squares of the per-term events, and the
// shared events' coefficient on A_c is at most sigma sum_j p_j |v_jc - A_c|, bounded by
// Cauchy-Schwarz),
// and the bound is 1.02 lambda u R plus the worst-case underflow floors of error_bounds.hpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "oasis/ops/error_bounds.hpp"

namespace oasis::bounds {

/// One normalised row in the probabilistic model (R values in units of u).
struct ProbRow {
  std::vector<double> kappa2;  ///< per real term; 0 for masked terms
  double kappa2_null = 0;
  double sk = 0;               ///< sum_j p_j^2 kappa_j^2 + p_0^2 kappa_0^2
  double lambda_terms = 0;     ///< Lambda = 3 m' + 4 log(S)^2 + LSE^2
  double sigma = 0;            ///< shared-event coefficient sum
  index_t terms = 0;           ///< m' (real visible terms plus the null)
  index_t keys = 0;            ///< m (real visible terms)
  double lse = 0, p_null = 0;  ///< R of LSE and p_0
  std::vector<double> p;       ///< R of each p_j
};

/// kappa^2 of a term with logit z (own-event coefficient sum of squares zeta2) and maximum M.
inline double prob_kappa2(double zeta2, double z, double M) { return zeta2 + 2.0 * (z - M) * (z - M) + 5.0; }

/// The header's R(p_j) of a real term (logit z, exact p) of a row with common = Sk + Lambda and sigma.
inline double prob_term_R(double p, double kappa2, double z, double lse_ref, double common, double sigma) {
  const double d = z - lse_ref;
  return p * std::sqrt(std::max(0.0, kappa2 * (1.0 - 2.0 * p) + common + d * d + 4.0 + 4.0 * sigma * sigma));
}

/// The row-level part of the model once r.sk (every term, the null's included), r.terms, r.sigma and
/// r.kappa2_null are set: Lambda, R(LSE), R(p_0) (the null logit s with exact p_0; 0 without a null).
/// Returns Sk + Lambda, the part every R(p_j) shares (prob_term_R).
inline double prob_row_finish(double M, double lse_ref, double s, double p_null_ref, ProbRow& r) {
  const double logS = std::max(0.0, lse_ref - M);
  r.lambda_terms = 3.0 * static_cast<double>(r.terms) + 4.0 * logS * logS + lse_ref * lse_ref;
  const double common = r.sk + r.lambda_terms, sigma = r.sigma;
  r.lse = std::sqrt(common + sigma * sigma);
  r.p_null = r.terms > r.keys ? p_null_ref * std::sqrt(std::max(0.0, r.kappa2_null * (1.0 - 2.0 * p_null_ref) + common +
                                                                         (s - lse_ref) * (s - lse_ref) + 4.0 + sigma * sigma))
                              : 0.0;
  return common;
}

/// The row model, written into `r` (its storage reused: hot loops call it once per row): z (exact
/// logits, -inf masked), zeta2 (per logit, may be null = 0), m terms; the null logit s with zeta2_s
/// (softmax1); sigma; exact p, p_null, LSE. per_term = false leaves ProbRow::p empty (the bounds of
/// the individual p_j are not needed).
inline void prob_row_into(RowNorm kind, const double* z, const double* zeta2, index_t m, double s, double zeta2_s,
                          double sigma, const double* p_ref, double p_null_ref, double lse_ref, bool per_term, ProbRow& r) {
  OASIS_REQUIRE(kind == RowNorm::softmax || kind == RowNorm::softmax1, "normalizer", "no derived error bound for ",
                to_string(kind), " (bounds cover softmax and softmax1)");
  r.kappa2.resize(static_cast<std::size_t>(m));  // every entry set below (0 where exact)
  r.p.resize(per_term ? r.kappa2.size() : 0);
  auto exact = [&] {
    std::fill(r.kappa2.begin(), r.kappa2.end(), 0.0);
    std::fill(r.p.begin(), r.p.end(), 0.0);
  };
  r.kappa2_null = r.sk = r.lambda_terms = r.lse = r.p_null = 0;
  r.terms = r.keys = 0;
  r.sigma = sigma;
  // an infinite null logit (as row_bound): -inf is no null term; +inf makes every result exact
  if (kind == RowNorm::softmax1 && std::isinf(s) && s > 0) return exact();
  const bool has_null = kind == RowNorm::softmax1 && !std::isinf(s);
  double M = has_null ? s : -std::numeric_limits<double>::infinity();
  index_t keys = 0;  // locals in the loops: a field of r could alias the arrays, and its store each step serialises
  for (index_t j = 0; j < m; ++j)
    if (!std::isinf(z[j])) {
      M = std::max(M, z[j]);
      ++keys;
    }
  r.keys = keys;
  r.terms = r.keys + (has_null ? 1 : 0);
  if (std::isinf(M)) return exact();  // plain softmax, fully masked: the documented zero, exact
  double sk = 0;
  for (index_t j = 0; j < m; ++j) {
    const bool masked = std::isinf(z[j]);
    const double k2 = masked ? 0.0 : prob_kappa2(zeta2 ? zeta2[j] : 0.0, z[j], M);
    r.kappa2[static_cast<std::size_t>(j)] = k2;
    if (!masked) sk += p_ref[j] * p_ref[j] * k2;
  }
  r.sk = sk;
  if (has_null) {
    r.kappa2_null = prob_kappa2(zeta2_s, s, M);
    r.sk += p_null_ref * p_null_ref * r.kappa2_null;
  }
  const double common = prob_row_finish(M, lse_ref, has_null ? s : 0.0, p_null_ref, r);
  for (index_t j = 0; j < m && per_term; ++j)
    r.p[static_cast<std::size_t>(j)] =
        std::isinf(z[j]) ? 0.0 : prob_term_R(p_ref[j], r.kappa2[static_cast<std::size_t>(j)], z[j], lse_ref, common, sigma);
}
/// prob_row_into on a fresh ProbRow.
inline ProbRow prob_row(RowNorm kind, const double* z, const double* zeta2, index_t m, double s, double zeta2_s,
                        double sigma, const double* p_ref, double p_null_ref, double lse_ref, bool per_term = true) {
  ProbRow r;
  prob_row_into(kind, z, zeta2, m, s, zeta2_s, sigma, p_ref, p_null_ref, lse_ref, per_term, r);
  return r;
}

/// R(A) of one mixture element A = sum_j p_j v_j of a row from its sums, with the shared events'
/// square sum folded into one sum of squares: Z = sum_j (w_j + p_j^2 + sigma^2 sp p_j) v_j^2, so
/// that the last term of R(A_c)^2 above is sigma^2 sp (Y2 - 2 A^2 + A^2 sp) with its Y2 inside Z
/// (a product with one weight per key: the fast oracle forms Z in one matrix product). X1 =
/// sum_j w_j v_j, sw = sum_j w_j with w_j = p_j^2 kappa_j^2; sp = sum_j p_j; V1 = sum_j p_j |v_j|;
/// A exact. `f` (a power of 2): Z, X1 and sw are given times f^2 (Z's sigma^2 part as sigma^2 (f sp)
/// f p_j), the weights scaled so that their squares do not underflow (a row whose probabilities are
/// all below ~1e-154: huge sinks); R is returned unscaled. Every term of R^2 is quadratic in the
/// probabilities' scale, so R f is formed first.
inline double prob_mix_from_folded(const ProbRow& r, double p_null, double A, double V1, double X1, double Z, double sw,
                                   double sp, double f = 1.0) {
  const double fA = f * A, a2 = A * A;
  const double fV1 = f * V1;
  const double R2 = (Z - 2.0 * A * X1 + A * (A * sw)) + p_null * p_null * r.kappa2_null * fA * fA +
                    (3.0 * static_cast<double>(r.terms) + 4.0) * fA * fA + 3.0 * static_cast<double>(r.keys) * fV1 * fV1 +
                    r.sigma * r.sigma * (f * sp) * (f * (a2 * sp - 2.0 * a2));
  return std::sqrt(std::max(R2, 0.0)) / f;
}

/// The relative error, against the magnitude of its expanded terms, with which R(A)^2 of a mixture
/// of m terms is evaluated in double from its sums (first order): each sum over the m terms, at
/// most 9 roundings in a term's weight and product, at most 10 in the assembly of R^2. The fast
/// oracles widen their decisions by it times (that magnitude) / R^2.
inline double mix_cancellation(index_t m) { return static_cast<double>(m + 20) * unit_roundoff<double>(); }

/// prob_mix_from_folded from the sums apart: X2 = sum_j (w_j + p_j^2) v_j^2 (times f^2, as X1 and
/// sw) and Y2 = sum_j p_j v_j^2 (unscaled).
inline double prob_mix_from_sums(const ProbRow& r, double p_null, double A, double V1, double X1, double X2, double sw,
                                 double Y2, double sp, double f = 1.0) {
  return prob_mix_from_folded(r, p_null, A, V1, X1, X2 + r.sigma * r.sigma * (f * sp) * (f * Y2), sw, sp, f);
}

/// The power of 2 that prob_mix_from_folded's sums of squared weights need for probabilities of at
/// most `pmax` (1 unless their squares could leave the normal range).
inline double prob_mix_scale(double pmax) {
  if (!(pmax > 0.0) || pmax >= 0x1p-400) return 1.0;
  return std::ldexp(1.0, std::min(1022, -std::ilogb(pmax)));  // f finite; (f p)^2 >= 2^-104
}

/// R(A) of one mixture element of a row: v[j * stride] for the m terms of the row, A exact.
inline double prob_mix(const ProbRow& r, const double* p, const double* v, index_t stride, index_t m, double p_null,
                       double A) {
  double pmax = 0;
  for (index_t j = 0; j < m; ++j) pmax = std::max(pmax, p[j]);
  const double f = prob_mix_scale(pmax);
  double X2 = 0, X1 = 0, sw = 0, Y2 = 0, sp = 0, V1 = 0;
  for (index_t j = 0; j < m; ++j) {
    const double pj = p[j];
    if (pj == 0.0) continue;
    const double vj = v[j * stride], fp = f * pj;
    const double w = fp * fp * r.kappa2[static_cast<std::size_t>(j)];
    X2 += (w + fp * fp) * vj * vj;
    X1 += w * vj;
    sw += w;
    Y2 += pj * vj * vj;
    sp += pj;
    V1 += pj * std::abs(vj);
  }
  return prob_mix_from_sums(r, p_null, A, V1, X1, X2, sw, Y2, sp, f);
}

/// zeta^2 of a score z = scale <q, k_j> + b (units of u): the dot product's d_h products and
/// d_h - 1 partial sums (each at most scale sum_c |q_c k_jc| = scale Q), the product by the scale,
/// the bias rounded to T and added.
inline double score_zeta2(index_t d_h, double scale, double Q, double scaled_dot, double bias, double z) {
  const double sQ = scale * Q;
  return static_cast<double>(d_h + 1) * sQ * sQ + scaled_dot * scaled_dot + bias * bias + 2.0 * z * z;
}

/// R of every token-attention output (shapes as AttentionResult; probs [B, H, Tq, Tk]), in units
/// of u; `ref` is the exact result with return_probs. Shared events of a row: a pre-scaled query
/// (coefficients scale q_c k_jc, summed over c at most scale max_j Q_j) and the rounding of the
/// scale itself (at most max_j |z_j|), so sigma = scale max_j Q_j + max_j |z_j|.
template <class T, class R>
AttentionBounds prob_attention_bounds(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                      const AttentionOptions& opt, const AttentionResult<R>& ref) {
  const AttentionShape s = check_attention_args(q, k, v, opt);
  OASIS_REQUIRE(!ref.probs.empty(), "ref", "the reference must be computed with return_probs = true");
  if (opt.layout == AttentionLayout::bthd) {
    AttentionOptions o = opt;
    o.layout = AttentionLayout::bhtd;
    AttentionResult<R> rr = ref;
    rr.out = swap_head_time(ref.out);
    AttentionBounds b = prob_attention_bounds(swap_head_time(q), swap_head_time(k), swap_head_time(v), o, rr);
    b.out = swap_head_time(b.out);
    return b;
  }
  const double scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(s.d_h));
  const index_t group = s.H / s.H_kv;
  AttentionBounds b{Tensor<double>({s.B, s.H, s.Tq, s.d_v}), Tensor<double>({s.B, s.H, s.Tq}),
                    Tensor<double>({s.B, s.H, s.Tq}), Tensor<double>({s.B, s.H, s.Tq, s.Tk})};
  std::vector<double> z(static_cast<std::size_t>(s.Tk)), zeta2(z.size()), p(z.size()), vc(z.size());
  for (index_t bb = 0; bb < s.B; ++bb)
    for (index_t h = 0; h < s.H; ++h) {
      const index_t hk = h / group;
      const double sl = opt.null_logits.empty() ? 0.0 : opt.null_logits[static_cast<std::size_t>(h)];
      for (index_t t = 0; t < s.Tq; ++t) {
        const KeyRange kr = visible_range(s, opt, bb, t);
        const index_t m = kr.count();
        double maxQ = 0, maxz = 0;
        for (index_t j = 0; j < m; ++j) {
          const index_t key = kr.begin + j;
          double dot = 0, Q = 0;
          for (index_t c = 0; c < s.d_h; ++c) {
            const double x = static_cast<double>(q(bb, h, t, c)) * static_cast<double>(k(bb, hk, key, c));
            dot += x;
            Q += std::abs(x);
          }
          const double bias = attention_bias(opt, bb, h, t, key);
          const auto ju = static_cast<std::size_t>(j);
          z[ju] = scale * dot + bias;
          zeta2[ju] = std::isinf(bias) ? 0.0 : score_zeta2(s.d_h, scale, Q, scale * dot, bias, z[ju]);
          p[ju] = static_cast<double>(ref.probs(bb, h, t, key));
          if (!std::isinf(bias)) {
            maxQ = std::max(maxQ, Q);
            maxz = std::max(maxz, std::abs(z[ju]));
          }
        }
        const double pn = static_cast<double>(ref.p_null(bb, h, t));
        const ProbRow r = prob_row(opt.normalizer, z.data(), zeta2.data(), m, sl, sl * sl, scale * maxQ + maxz, p.data(),
                                   pn, static_cast<double>(ref.lse(bb, h, t)));
        b.lse(bb, h, t) = r.lse;
        b.p_null(bb, h, t) = r.p_null;
        for (index_t j = 0; j < m; ++j) b.probs(bb, h, t, kr.begin + j) = r.p[static_cast<std::size_t>(j)];
        for (index_t c = 0; c < s.d_v; ++c) {
          for (index_t j = 0; j < m; ++j) vc[static_cast<std::size_t>(j)] = static_cast<double>(v(bb, hk, kr.begin + j, c));
          b.out(bb, h, t, c) = prob_mix(r, p.data(), vc.data(), 1, m, pn, static_cast<double>(ref.out(bb, h, t, c)));
        }
      }
    }
  return b;
}

/// The probabilistic row of one token's depth weights (exact g, dpsi, alpha, alpha_null; tb and
/// beta from depth_token_bound and beta_bound at u = 1). Per candidate, the events of its
/// coupled logit: the centring subtraction (times beta), the product beta Dpsi_i and the
/// subtraction from g_old, zeta_i^2 = 2 (beta Dpsi_i)^2 + g_i^2; shared by every candidate: the
/// centring mean (coefficients summing to beta (c + 1) mean|psi|) and beta's own error
/// (|dbeta| max_i |Dpsi_i|). Without coupling the logits are exact inputs (zeta = sigma = 0).
inline ProbRow prob_depth_row(const DepthTokenBound& tb, const BetaBound& beta, const DepthOptions& opt, const double* g,
                              const double* dpsi, const double* alpha, double alpha_null) {
  const index_t n = static_cast<index_t>(tb.g.size());
  std::vector<double> zeta2(static_cast<std::size_t>(n), 0.0);
  double sigma = 0, max_dp = 0;
  if (tb.coupled) {
    for (index_t i = 0; i < n; ++i) {
      const double bd = beta.beta * dpsi[i];
      zeta2[static_cast<std::size_t>(i)] = 2.0 * bd * bd + g[i] * g[i];
      max_dp = std::max(max_dp, std::abs(dpsi[i]));
    }
    sigma = beta.beta * (static_cast<double>(tb.mean_count) + 1.0) * tb.mean_abs + beta.err * max_dp;
  }
  double mx = opt.normalizer == RowNorm::softmax1 ? 0.0 : -std::numeric_limits<double>::infinity();
  for (index_t i = 0; i < n; ++i) mx = std::max(mx, g[i]);
  double S = opt.normalizer == RowNorm::softmax1 ? std::exp(-mx) : 0.0;
  for (index_t i = 0; i < n; ++i) S += std::exp(g[i] - mx);
  return prob_row(opt.normalizer, g, zeta2.data(), n, 0.0, 0.0, sigma, alpha, alpha_null, mx + std::log(S));
}

}  // namespace oasis::bounds
