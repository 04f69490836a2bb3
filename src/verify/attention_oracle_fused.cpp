// src/verify/attention_oracle_fused.cpp — the forward fast oracle's rows in their common case
// (fused_row, attention_oracle_rows.hpp): the work of the general rows (attention_oracle.cpp:
// row_logits, the reference, row_bound_into and prob_row_into through row_pieces, the weights) in
// passes over the row's keys that vectorise. The same formulas (the bounds' own functions), the sums
// as vector reductions in another order, and oracle_exp for std::exp: both within the oracle's own
// bound (own_precision, attention_oracle.hpp). tests/verify/test_attention_oracle.cpp holds every
// piece of both paths to the mp50 rows'.
#include <algorithm>
#include <cmath>
#include <limits>

#include "attention_oracle_rows.hpp"
#include "oracle_exp.hpp"
#include "row_clones.hpp"

namespace oasis::verify::detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// e_j = oracle_exp(z_j - M) for j in [j0, j1), into e; their sum added to rest, their maximum
/// taken into emax.
__attribute__((always_inline)) inline void exp_pass(const double* z, index_t j0, index_t j1, double M, double* e,
                                                   double& rest, double& emax) {
  double sum = 0, mx = emax;
#pragma omp simd reduction(+ : sum) reduction(max : mx)
  for (index_t j = j0; j < j1; ++j) {
    const double x = oracle_exp(z[j] - M);
    e[j] = x;
    sum += x;
    mx = std::max(mx, x);
  }
  rest += sum;
  emax = mx;
}

}  // namespace

// The common case: no bias (so no masked key), softmax or softmax1 with a finite null logit, finite
// logits, and every exponent's argument z_j - M at least kOracleExpMin.
OASIS_ROW_CLONES bool fused_row(const AttnCall& c, AttnRow& row, const double* dot, const double* Q, bool mixR,
                                Logits& L, bounds::ProbRow& pr, RowWeights& w) {
  const index_t m = row.m(), dh = c.s.d_h;
  const RowNorm kind = c.opt.normalizer;
  const bool has_null = kind == RowNorm::softmax1;
  const double s = c.null_logit(row.h), scale = c.scale;
  if (m == 0 || !c.opt.bias.empty() || (kind != RowNorm::softmax && !has_null) || (has_null && !std::isfinite(s)))
    return false;
  const auto mu = static_cast<std::size_t>(m);
  L.z.resize(mu);  // every entry of these three set below
  L.zc.resize(mu);
  L.zeta2.resize(mu);
  double *z = L.z.data(), *zc = L.zc.data(), *zeta2 = L.zeta2.data();
  // pass 1: the logits and their error pieces (row_logits without a bias)
#pragma omp simd
  for (index_t j = 0; j < m; ++j) {
    const double zj = scale * dot[j];
    z[j] = zj;
    zc[j] = bounds::score_error(dh, scale, Q[j], zj, 0.0, false);
    zeta2[j] = bounds::score_zeta2(dh, scale, Q[j], zj, 0.0, zj);
  }
  double zmax = -kInf, zmin = kInf, maxQ = 0, maxz = 0, nonfinite = 0;
#pragma omp simd reduction(max : zmax, maxQ, maxz) reduction(min : zmin) reduction(+ : nonfinite)
  for (index_t j = 0; j < m; ++j) {
    const double zj = z[j];
    zmax = zj > zmax ? zj : zmax;
    zmin = zj < zmin ? zj : zmin;
    maxQ = Q[j] > maxQ ? Q[j] : maxQ;
    maxz = std::abs(zj) > maxz ? std::abs(zj) : maxz;
    nonfinite += zj * 0.0;  // NaN once a logit is not finite
  }
  if (nonfinite != 0.0 || !std::isfinite(maxQ)) return false;
  L.zmax = zmax;
  L.arg = std::find(z, z + m, zmax) - z;
  double M = has_null ? s : -kInf;
  index_t arg = -1;  // the first largest logit, when it is above the null's (its exponential is exactly 1)
  if (zmax > M) {
    M = zmax;
    arg = L.arg;
  }
  if (zmin - M < kOracleExpMin) return false;
  L.sigma = scale * maxQ + maxz;
  row.masked.assign(mu, 0);
  // pass 2: the exponentials (the reference as general_row)
  row.p.resize(mu);
  double* p = row.p.data();
  double rest = 0, emax = 0;
  if (arg >= 0) {
    exp_pass(z, 0, arg, M, p, rest, emax);
    p[arg] = 1.0;
    emax = std::max(emax, 1.0);
    exp_pass(z, arg + 1, m, M, p, rest, emax);
  } else {
    exp_pass(z, 0, m, M, p, rest, emax);
  }
  const double en = has_null ? std::exp(s - M) : 0.0;
  if (arg >= 0) rest += en;
  const double S = 1.0 + rest, pmax = emax / S;
  row.p_null = en / S;
  row.lse = M + std::log1p(rest);
  // pass 3: the probabilities, the worst-case row's sigma (row_bound_into at u = 1) and sum_j p_j
  double sig = 0, spr = 0;
  double* P = w.P;
#pragma omp simd reduction(+ : sig, spr)
  for (index_t j = 0; j < m; ++j) {
    const double pj = p[j] / S;
    p[j] = pj;
    P[j] = pj;
    sig += pj * (bounds::exp_term_error(z[j], M, 1.0) + zc[j]);
    spr += pj;
  }
  const index_t terms = m + (has_null ? 1 : 0);
  const double sigma_wc = (has_null ? row.p_null * (bounds::exp_term_error(s, M, 1.0) + std::abs(s)) : 0.0) + sig +
                          static_cast<double>(terms - 1);
  // pass 4: the probabilities' worst-case bounds, kappa_j^2 (prob_row_into) and the weights
  const double f = bounds::prob_mix_scale(pmax), sigma = L.sigma;
  const double cz = mixR ? sigma * sigma * (f * spr) : 0.0;  // as general_row
  row.p_wc.resize(mu);
  pr.kappa2.resize(mu);
  double *pwc = row.p_wc.data(), *k2 = pr.kappa2.data(), *G = w.G, *Wr = w.Wr, *Zw = w.Zw;
  double relmax = 0, sk = 0, swr = 0;
  // (Wr and Zw also without R: their rows of the weights' matrix are then not read)
#pragma omp simd reduction(max : relmax) reduction(+ : sk, swr)
  for (index_t j = 0; j < m; ++j) {
    const double pj = p[j];
    const double rel = bounds::term_rel_bound(bounds::exp_term_error(z[j], M, 1.0), zc[j], sigma_wc, 1.0);
    relmax = std::max(relmax, rel);
    pwc[j] = G[j] = rel * pj;
    const double kk = bounds::prob_kappa2(zeta2[j], z[j], M);
    k2[j] = kk;
    sk += pj * pj * kk;
    const double fp = f * pj, wj = fp * fp * kk;
    Wr[j] = wj;
    Zw[j] = (wj + fp * fp) + cz * (f * pj);
    swr += wj;
  }
  w.f = f;
  w.sw = mixR ? swr : 0.0;
  w.sp = mixR ? spr : 0.0;
  // the row's worst-case pieces (row_bound_into) and its probabilistic model (prob_row_into)
  row.p_null_wc =
      has_null ? bounds::term_rel_bound(bounds::exp_term_error(s, M, 1.0), std::abs(s), sigma_wc, 1.0) * row.p_null : 0.0;
  row.lse_wc = bounds::lse_bound(sigma_wc, row.lse, M, 1.0);
  pr.sigma = sigma;
  pr.keys = m;
  pr.terms = terms;
  pr.kappa2_null = has_null ? bounds::prob_kappa2(s * s, s, M) : 0.0;
  pr.sk = sk + (has_null ? row.p_null * row.p_null * pr.kappa2_null : 0.0);
  const double common = bounds::prob_row_finish(M, row.lse, has_null ? s : 0.0, row.p_null, pr);
  row.p_R.resize(c.probs_needed ? mu : 0);
  if (c.probs_needed) {
    double* pR = row.p_R.data();
    const double lse = row.lse;
    for (index_t j = 0; j < m; ++j) pR[j] = bounds::prob_term_R(p[j], k2[j], z[j], lse, common, sigma);
  }
  row.lse_R = pr.lse;
  row.p_null_R = pr.p_null;
  in_lse_convention(c, row, L, nullptr);
  row.rho = row_rho(relmax);
  return true;
}

}  // namespace oasis::verify::detail
