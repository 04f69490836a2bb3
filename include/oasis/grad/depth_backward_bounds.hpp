// oasis/grad/depth_backward_bounds.hpp — per-element error bounds of the depth-routing backward
// (attn_res_route_backward in T, grad/depth_backward.hpp): the worst-case line and the
// probabilistic bound of the default policy (derivation: docs/tolerances.md, "Depth backward").
//
// Per token, with the exact weights alpha_i, alpha_null and D = alpha_null dalpha_null + sum_i alpha_i dalpha_i:
//   dalpha_i = <dh, s_i> (+ given)   d products and d - 1 additions, each partial sum <= A_i = sum_c |dh_c s_ic|
//   D                                 n + 1 products and additions, each <= absD = sum of the |terms|
//   dg_i = alpha_i (dalpha_i - D)     the weights' forward error W_i (ops/error_bounds.hpp) times |w_i| and
//                                     through D; dalpha's events (coefficient alpha_i (1 - alpha_i) on its own
//                                     candidate, alpha_i alpha_r through D); D's events; the subtraction and
//                                     the product (3 events of alpha_i |w_i|)
//   the coupling: dx = dg where the clamp passes (kinks: backward_bounds.hpp), dDpsi = -beta dx, the
//   centring mean over c values and dpsi_r = dDpsi_r - mean, dbeta = -sum_{t,i} dx Dpsi (n N terms).
// Every quantity's error is held as det + lambda u R. det is kept worst-case: the forward's errors of
// the weights and of Dpsi, and beta's error (one event shared by every token). R = sqrt(sum c^2) over
// the backward's own rounding events at u = 1 (Higham & Mary's model, ops/prob_bounds.hpp). Worst case
// (lambda = 0): `count` events of magnitude <= A add count u A to det. Probabilistic: sqrt(count) A to R
// (every partial sum bounded by the total magnitude, as grad/backward_prob_bounds.hpp). Events one
// token shares among its quantities combine linearly (R_a + R_b); tokens are independent, so the
// R of dbeta is the root of the sum over tokens of their R^2. With 16-bit inputs (u16 > 0) the
// probabilistic bound admits each intermediate stored in that type, as torch eager code stores it:
// the weights, dalpha, D and the result of every single operation are one more event each at u16
// (coefficient |value| u16 / u in R), while the long sums (over d, the n candidates, the n N terms of
// dbeta) stay float32 accumulations. The bound is 1.02 (det + lambda u R) + 2 denorm_min(T).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "oasis/grad/depth_backward.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/ops/prob_bounds.hpp"

namespace oasis::bounds {

/// Bounds of attn_res_route_backward's results.
struct DepthBackwardBounds {
  Tensor<double> sources, g_old, psi;  ///< shapes as DepthGrads
  double beta = 0, theta = 0;
  /// Per token, 1 where a coupled logit lies so near the edge of its kink zone that a bound made
  /// from a forward of unit roundoff `ref_u` cannot tell on which side the exact one lies (only
  /// with ref_u > 0; the fast oracle then leaves the token, and dbeta, to mp50).
  std::vector<unsigned char> kink_edge;
  bool any_kink_edge() const { return std::find(kink_edge.begin(), kink_edge.end(), 1) != kink_edge.end(); }
};

/// Bound on |attn_res_route_backward<T>(...) - exact| per element. `ref` is the forward
/// (attn_res_route) on the same inputs, exact (mp50) or computed with unit roundoff `ref_u`: the
/// kink zones then widen by the error of the coupled logit that ref gives (and kink_edge is set).
/// `g_old_err` as in depth_route_bounds (given, the weights' forward error is the worst case's in
/// both modes: the probabilistic row does not hold it). `lambda` = 0: the worst-case line; lambda > 0: the
/// probabilistic bound at that lambda, with intermediates stored at unit roundoff `u16` when > 0
/// (`n16`: that type's smallest normal; below it the rounding is absolute, at most u16 n16).
template <class T, class R>
DepthBackwardBounds depth_route_backward_bounds(const Tensor<T>& sources, const Tensor<T>& g_old, const Tensor<T>& psi,
                                                const std::vector<SourceKind>& kinds, const DepthOptions& opt,
                                                const DepthCotangents<T>& d, const DepthRoute<R>& ref,
                                                const Tensor<double>* g_old_err = nullptr, double lambda = 0,
                                                double ref_u = 0, double u16 = 0, double n16 = 0) {
  struct Err {
    double det = 0, r = 0;
  };
  const RouteShape rs = check_route_shapes(sources, g_old, psi, kinds);
  check_depth_cotangents(rs, d);
  const index_t n = rs.n, N = rs.N, dim = rs.d;
  DepthRouteBounds fw = depth_route_bounds(sources, psi, kinds, opt, ref, g_old_err);
  const Precision pr = Precision::of<T>();
  const double u = pr.u;
  const bool prob = lambda > 0;
  const double lu = prob ? lambda * u : 0.0;
  // `count` rounding events of magnitude <= mag each: count u mag (worst case) or sqrt(count) mag into R
  auto events = [&](double count, double mag) { return prob ? Err{0, std::sqrt(count) * mag} : Err{count * u * mag, 0}; };
  // the result of one operation, stored in the 16-bit input type when there is one
  const double r16 = prob && u16 > u ? u16 / u : 1.0;
  const bool st16 = r16 > 1.0;  // intermediates (weights, dalpha, D) stored in 16 bits: one event each
  auto m16 = [&](double x) { return st16 ? std::max(std::abs(x), n16) : std::abs(x); };  // a stored value's event scale
  auto op1 = [&](double mag) { return events(1, r16 * m16(mag)); };
  // with 16-bit inputs, a value stored in that type below its smallest normal n16 is off by up to
  // u16 n16 whatever the policy: per event, in det (in T's u for the worst case, which the certain
  // line scales to u16)
  const double sub16 = u16 > 0 && n16 > 0 ? n16 * (prob ? u16 : u) : 0.0;
  // likewise in T: a weight below T's smallest normal (e^x of a very negative coupled logit) is off
  // by up to p_floor (the exp's ulp and the division's half ulp of denorm_min) whatever its size,
  // a relative error the u-model does not hold; it reaches dg_i through |w_i| and dh_c
  const double subT = pr.p_floor;
  auto plus_own = [](Err e, Err own) { return Err{e.det + own.det, std::hypot(e.r, own.r)}; };  // independent events
  auto fin = [&](const Err& e) { return kSecondOrder * (e.det + lu * e.r) + pr.p_floor; };
  if (st16)  // the forward in 16 bits too: its worst-case errors (and the kink zones) at u16
    for (Tensor<double>* x : {&fw.alpha, &fw.alpha_null, &fw.g, &fw.dpsi})
      for (index_t e = 0; e < x->size(); ++e) (*x)[e] *= r16;
  const CouplingOptions& co = opt.coupling_options;
  const BetaBound bb = beta_bound(opt, st16 ? u16 : u);
  const R beta_exact = opt.coupling ? depth_beta<R>(opt) : R(0);
  const double L = co.score_clamp;
  auto D = [](const auto& x) { return static_cast<double>(x); };
  auto ev = [&](index_t i) { return has_null_evidence(kinds[static_cast<std::size_t>(i)], co.headless); };
  index_t count = 0;
  for (index_t i = 0; i < n; ++i) count += ev(i) ? 1 : 0;
  const bool paper = co.centring == Centring::paper_v2;
  const bool centred = paper ? count >= 2 : true;
  const double c_set = paper ? static_cast<double>(count) : static_cast<double>(n);

  DepthBackwardBounds b{Tensor<double>({n, N, dim}), Tensor<double>({n, N}), Tensor<double>({n, N})};
  b.kink_edge.assign(static_cast<std::size_t>(N), 0);
  Err S_beta;  // dbeta's det and, over tokens, the sum of R^2 (rooted below)
  double A_beta = 0, dbeta = 0;
  const std::size_t nn = static_cast<std::size_t>(n);
  std::vector<double> da(nn), dx(nn), dD(nn);
  std::vector<Err> E(nn), X(nn), DD(nn);
  const BetaBound beta1 = beta_bound(opt, 1.0);
  std::vector<double> g_t(nn), dpsi_t(nn), alpha_t(nn), psi_t(nn), AR(nn);
  double shared_beta = 0;  // probabilistic: beta's error reaching dbeta through every token's weights
  for (index_t t = 0; t < N; ++t) {
    const double an = D(ref.alpha_null[t]);
    const double dan = d.alpha_null.empty() ? 0.0 : D(d.alpha_null[t]);
    // The weights' own forward error: worst case (fw.alpha, det) and, probabilistic, also the R of
    // each weight (AR, ops/prob_bounds.hpp prob_depth_row; at u16 with 16-bit inputs): each
    // element takes the smaller of the two (both bound it; over n <= ~30 weights lambda = 5 can
    // exceed the worst case)
    double ARn = 0;
    if (prob) {
      for (index_t i = 0; i < n; ++i) {
        const std::size_t ii = static_cast<std::size_t>(i);
        g_t[ii] = D(ref.g(i, t));
        dpsi_t[ii] = D(ref.dpsi(i, t));
        alpha_t[ii] = D(ref.alpha(i, t));
        psi_t[ii] = D(psi(i, t));
      }
      const DepthTokenBound tb = depth_token_bound(Precision{1.0, 0.0}, beta1, psi_t.data(), kinds, opt, g_t.data(),
                                                   dpsi_t.data(), alpha_t.data(), an);
      const ProbRow row = prob_depth_row(tb, beta1, opt, g_t.data(), dpsi_t.data(), alpha_t.data(), an);
      for (std::size_t ii = 0; ii < nn; ++ii) AR[ii] = r16 * row.p[ii];
      ARn = r16 * row.p_null;
    }
    auto A_of = [&](index_t i) { return fw.alpha(i, t); };
    const double An = fw.alpha_null[t];
    double Dt = an * dan, absD = an * std::abs(dan);
    double W = An * std::abs(dan), EaD = 0, R2aD = 0;  // through D: the weights' error, sum a_r E_r (det, R^2)
    double WR = ARn * std::abs(dan);                    // the weights' R through D (coherent: summed)
    for (index_t i = 0; i < n; ++i) {
      const std::size_t ii = static_cast<std::size_t>(i);
      double x = 0, ax = 0;
      for (index_t c = 0; c < dim; ++c) {
        const double y = D(d.h(t, c)) * D(sources(i, t, c));
        x += y;
        ax += std::abs(y);
      }
      const double extra = d.alpha.empty() ? 0.0 : D(d.alpha(i, t));
      da[ii] = x + extra;
      E[ii] = events(static_cast<double>(dim), ax);
      if (!d.alpha.empty() || st16) E[ii] = plus_own(E[ii], op1(std::abs(da[ii])));
      const double a = D(ref.alpha(i, t));
      Dt += a * da[ii];
      absD += a * std::abs(da[ii]);
      W += A_of(i) * std::abs(da[ii]);
      if (prob) WR += AR[ii] * std::abs(da[ii]);
      EaD += a * E[ii].det;
      R2aD += a * a * E[ii].r * E[ii].r;
    }
    Err eD = events(static_cast<double>(n + 1), absD);
    if (st16) eD = plus_own(eD, op1(std::abs(Dt)));
    double R2w16 = 0;  // the weights stored in 16 bits, through D: sum_r (a_r |da_r|)^2 (times r16^2)
    if (st16) {
      R2w16 = std::pow(m16(an) * dan, 2);
      for (index_t i = 0; i < n; ++i) R2w16 += std::pow(m16(D(ref.alpha(i, t))) * da[static_cast<std::size_t>(i)], 2);
      R2w16 *= r16 * r16;
    }
    double Sbt_det = 0, Sbt_r = 0, Sbt_kink = 0;
    // probabilistic: d(dg_i)/d(beta) <= alpha_i (q_i |w_i| + dD), q_i = |Dpsi_i| + Q, Q = sum_r alpha_r |Dpsi_r|
    double Q = 0, dDb = 0;
    if (prob && opt.coupling) {
      for (index_t i = 0; i < n; ++i) Q += D(ref.alpha(i, t)) * std::abs(D(ref.dpsi(i, t)));
      dDb = an * Q * std::abs(dan);
      for (index_t i = 0; i < n; ++i)
        dDb += D(ref.alpha(i, t)) * (std::abs(D(ref.dpsi(i, t))) + Q) * std::abs(da[static_cast<std::size_t>(i)]);
    }
    for (index_t i = 0; i < n; ++i) {
      const std::size_t ii = static_cast<std::size_t>(i);
      const double a = D(ref.alpha(i, t)), A = A_of(i);
      const double w = da[ii] - Dt;
      const double dg = a * w;
      const Err own3 = events(3, r16 * m16(a * w));  // w stored (coefficient a <= 1), the product a w stored
      // alpha_i stored in 16 bits: directly (|w_i|) and through D (R2w16), (x + y)^2 <= 2 x^2 + 2 y^2
      const double R2a16 = st16 ? 2.0 * (r16 * r16 * w * w * m16(a) * m16(a) + R2w16 * a * a) : 0.0;
      const double R2own = a * a * (E[ii].r * E[ii].r + R2aD + eD.r * eD.r) + R2a16 + own3.r * own3.r;
      // the stored values' subnormal events: alpha_i (|w_i|), the weights through D, dalpha, D, w, dg
      double sumda = std::abs(dan) + 5.0;
      if (sub16 > 0)
        for (std::size_t r = 0; r < nn; ++r) sumda += std::abs(da[r]);
      double sumdaT = std::abs(dan);
      for (std::size_t r = 0; r < nn; ++r) sumdaT += std::abs(da[r]);
      const double det_own =
          a * (E[ii].det + EaD + eD.det) + own3.det + sub16 * (std::abs(w) + sumda) + subT * (std::abs(w) + a * sumdaT);
      Err G{A * std::abs(w) + a * W + det_own, std::sqrt(R2own)};  // the weights' error worst case
      if (prob && !g_old_err) {  // (the probabilistic row knows no error already in g_old: the worst case holds it)
        const double wR = AR[ii] * std::abs(w) + a * WR;  // the weights' events (coherent), probabilistic
        const Err Gp{det_own, std::sqrt(R2own + wR * wR)};
        if (fin(Gp) < fin(G)) G = Gp;
      }
      for (index_t c = 0; c < dim; ++c) {  // alpha_i dh_c: the product (and alpha_i stored in 16 bits)
        const double hc = std::abs(D(d.h(t, c)));
        const double own = st16 ? u16 * (m16(a) * hc + m16(a * hc)) : u * a * hc;
        b.sources(i, t, c) =
            kSecondOrder * ((prob && !g_old_err ? std::min(A, lu * AR[ii]) : A) * hc + own + sub16 * (hc + 1.0) + subT * hc) +
            pr.p_floor;
      }
      if (!opt.coupling) {
        dx[ii] = dg;
        X[ii] = G;
        b.g_old(i, t) = fin(G);
        continue;
      }
      // the clamp of the coupled logit x = g_old - beta Dpsi, decided in T on a rounded x; with a
      // forward of unit roundoff ref_u, x itself is known within `margin`
      const double xi = D(R(g_old(i, t)) - beta_exact * ref.dpsi(i, t));
      const double margin =
          4.0 * ref_u * (std::abs(xi) + std::abs(D(g_old(i, t))) + D(beta_exact) * (std::abs(D(ref.dpsi(i, t))) + D(n) + 2.0));
      const bool pass = clamp_passes(xi, -L, L);
      // a kernel computing in a 16-bit input type decides its clamps on logits off by u16, whatever the policy
      const double dist = std::abs(std::abs(xi) - L), zone = fw.g(i, t) * (!st16 && u16 > u ? u16 / u : 1.0);
      const bool ambiguous = std::isfinite(L) && dist <= zone + margin;
      if (ref_u > 0 && std::isfinite(L) && std::abs(dist - zone) <= 2.0 * margin + 1e-9 * zone)
        b.kink_edge[static_cast<std::size_t>(t)] = 1;
      dx[ii] = pass ? dg : 0.0;
      X[ii] = ambiguous ? Err{G.det + std::abs(dg), G.r} : (pass ? G : Err{});
      b.g_old(i, t) = fin(X[ii]);
      const double dpsi_c = D(ref.dpsi(i, t));  // Dpsi
      Sbt_det += X[ii].det * std::abs(dpsi_c) + std::abs(dx[ii]) * fw.dpsi(i, t);
      Sbt_r += X[ii].r * std::abs(dpsi_c);
      if (ambiguous) Sbt_kink += std::abs(dg * dpsi_c);
      if (prob && (pass || ambiguous)) shared_beta += std::abs(dpsi_c) * a * ((std::abs(dpsi_c) + Q) * std::abs(w) + dDb);
      A_beta += std::abs(dx[ii] * dpsi_c);
      dbeta -= dx[ii] * dpsi_c;
      dD[ii] = -bb.beta * dx[ii];  // dL/dDpsi, and its error
      DD[ii] = plus_own(Err{bb.err * std::abs(dx[ii]) + bb.beta * X[ii].det + sub16, bb.beta * X[ii].r}, op1(std::abs(dD[ii])));
    }
    if (prob) {  // events local to the token, over tokens in quadrature (sum |c| >= sqrt(sum c^2)); kinks linear
      const double local = Sbt_r + (Sbt_det - Sbt_kink) / u;
      S_beta.det += Sbt_kink;
      S_beta.r += local * local;
    } else {
      S_beta.det += Sbt_det;
      S_beta.r += Sbt_r * Sbt_r;
    }
    if (!opt.coupling || !centred) continue;  // psi gets exactly 0
    Err mean;
    double mean_abs = 0;
    for (index_t i = 0; i < n; ++i)
      if (!paper || ev(i)) {
        const std::size_t ii = static_cast<std::size_t>(i);
        mean_abs += std::abs(dD[ii]);
        mean.det += DD[ii].det;
        mean.r += DD[ii].r;
      }
    mean_abs /= c_set;
    mean = plus_own(Err{mean.det / c_set, mean.r / c_set}, events(c_set, mean_abs));  // c - 1 additions, a division
    if (st16) mean = plus_own(mean, op1(mean_abs));
    mean.det += sub16;
    const double mean_v = [&] {
      double m = 0;
      for (index_t i = 0; i < n; ++i)
        if (!paper || ev(i)) m += dD[static_cast<std::size_t>(i)];
      return m / c_set;
    }();
    for (index_t i = 0; i < n; ++i)
      if (ev(i)) {
        const std::size_t ii = static_cast<std::size_t>(i);
        const double g = dD[ii] - mean_v;
        b.psi(i, t) = fin(plus_own(Err{DD[ii].det + mean.det + sub16, DD[ii].r + mean.r}, op1(std::abs(g))));
      }
  }
  if (opt.coupling) {
    // dbeta: n N products and additions; the cap decided on beta_raw in T
    const Err Sdb = plus_own(Err{S_beta.det + bb.err * shared_beta, std::sqrt(S_beta.r)},
                             events(static_cast<double>(n * N), A_beta));
    const bool pass = clamp_passes(bb.raw, -std::numeric_limits<double>::infinity(), co.beta_max);
    const bool ambiguous = std::isfinite(co.beta_max) && std::abs(bb.raw - co.beta_max) <= beta_bound(opt, std::max(u, u16)).raw_err;
    const double draw = pass ? dbeta : 0.0;
    const Err Braw = ambiguous ? Err{Sdb.det + std::abs(dbeta), Sdb.r} : (pass ? Sdb : Err{});
    b.beta = fin(Braw);
    if (!opt.beta) {  // dtheta = dbeta_raw sigmoid(theta): sigmoid in T (exp, add, divide: 4u; theta rounded)
      const double sig = 1.0 / (1.0 + std::exp(-opt.theta));
      b.theta = fin(plus_own(
          Err{Braw.det * sig + std::abs(draw) * sig * (4.0 * u + u * std::abs(opt.theta) * (1.0 - sig)), Braw.r * sig},
          op1(std::abs(draw * sig))));
    }
  }
  return b;
}

}  // namespace oasis::bounds
