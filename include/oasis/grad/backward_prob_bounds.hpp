// oasis/grad/backward_prob_bounds.hpp — the probabilistic bound of the token-attention backward
// (the default policy of oasis-verify compare for attention_backward; docs/tolerances.md,
// "The probabilistic bound of the backward").
//
// Model as oasis/ops/prob_bounds.hpp (Higham & Mary 2019): to first order an element's error is
// sum_i c_i delta_i over its rounding events, |delta_i| <= u, independent and mean zero; then
// |error| <= lambda u R, R = sqrt(sum_i c_i^2), with probability >= 1 - 2 exp(-lambda^2 / 2).
// Events shared by several terms are coherent (their coefficients add before squaring). Per row t
// (exact p_j, p_null, D, w_j = dp_j - D + dLSE, dz_j = p_j w_j, dp_j = <dO_t, v_j>), with P
// recomputed from the LSE as a FlashAttention-2 backward does:
//   p_j    own events   kappa_j^2 = zeta_j^2 + (z_j - LSE)^2 + 5    (score, subtraction, exp)
//          shared       the LSE's error eps_L: R_L = sqrt(R(LSE)^2 + LSE^2) + 2 sigma (the forward
//                       row's, one more event in an exp2 of log2(e)-scaled form, a pre-scaled q)
//   dp_j   R^2 = (d_v + 1) A_j^2,  A_j = sum_c |dO_c v_jc|          (products and partial sums)
//   D      own R_D^2 = sum_j [(dp_j p_j kappa_j)^2 + (p_j R(dp_j))^2 + (p_j dp_j)^2]
//                      + (p_null kappa_0 dP)^2 + (m + 1) absD^2,  absD = p_null |dP| + sum_j p_j |dp_j|
//                      (+ sum_j (p_j kappa_j dP)^2 + (m + 1) ((1 - p_null) dP)^2: dP through the
//                      probabilities, backward_bounds.hpp); shared: D eps_L
//   dz_j   own R^2 = (w_j p_j kappa_j)^2 + (p_j R(dp_j))^2 + (p_j (dp_j - D))^2 + (p_j w_j)^2
//                    + dz_j^2 + r16 max(|dz_j|, n16)^2 + (p_j (|dp_j| + |dP|))^2     (r16 = (u16/u)^2: dS rounded to a
//                    16-bit input type before the dq, dk GEMMs, as FlashAttention-2 does)
//          coherent in the row: -p_j delta_D (R_D) and p_j (|w_j - D| + |dP|) eps_L (R_L; the |dP|:
//          dP through the probabilities)
//   dq_tc  = scale sum_j dz_j k_jc:  scale^2 [2 sum_j k_jc^2 R_own(dz_j)^2 + 2 (sum_j p_j k_jc)^2 R_D^2
//            + (sum_j a_j |k_jc|)^2 R_L^2 + (m + 1) (sum_j |dz_j k_jc|)^2] + 3 dq^2   (an event of p_j or
//            dp_j reaches dq through dz_j and through D: (a + b)^2 <= 2 a^2 + 2 b^2)
//   dk_jc, dbias: the same terms summed over the rows that see key j (independent rows), with
//            q_tc for k_jc (1 for the bias) and (n + 1) (sum |dz q|)^2 for the sums over n rows
//   dv_jc  = sum_t p_tj dO_tc:  sum_t (dO_tc p_tj)^2 (kappa_tj^2 + R_L,t^2 + 1) + r16 (dO_tc max(p_tj, n16))^2
//            + (n + 1) (sum_t |p_tj dO_tc|)^2 (r16: P rounded to the 16-bit input type before the dv GEMM;
//            n16 its smallest normal: below it the rounding is absolute, at most u16 n16 — f16's
//            subnormals start at 6.1e-5, where the probabilities of a row over 4096 keys lie)
//   ds_h   = sum_t p_null (dP - D + dLSE): the null's own events, its R_D and R_L terms per row,
//            (cnt + 1) (sum |ds_t|)^2 for the sum over the rows
// (partial sums of a recursive or blocked sum are bounded by the sum of magnitudes, as the worst case
// does; the gain over the worst case is the square root of the number of terms). The bound is
// 1.02 lambda u R plus the worst-case floors of a kernel that may flush subnormals (Precision::flushing).
// Not covered: a kernel that pre-scales K (events shared by every row that sees a key; the rows are
// taken as independent) — judge such a kernel with policy worst_case.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "oasis/grad/backward_bounds.hpp"
#include "oasis/ops/prob_bounds.hpp"

namespace oasis::bounds {

/// R(dp_j) = r_dp_scale(d_v) A_j (the header's dp_j line): sqrt(d_v + 1).
inline double r_dp_scale(index_t d_v) { return std::sqrt(static_cast<double>(d_v + 1)); }

/// The probabilistic bound (1.02 lambda u R + floors) of every gradient of token_attention_backward<T>
/// (shapes as AttentionBackwardBounds; scores left empty). `ref` is the exact forward with probs.
/// `u16`, `n16`: P and dS rounded to a 16-bit input type of that unit roundoff and smallest normal.
template <class T, class R>
AttentionBackwardBounds prob_attention_backward_bounds(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                                       const AttentionCotangents<T>& d, const AttentionOptions& opt,
                                                       const AttentionResult<R>& ref, double lambda, double u16 = 0,
                                                       double n16 = 0) {
  const AttentionShape s = check_attention_args(q, k, v, opt);
  check_attention_cotangents(s, opt, d);
  OASIS_REQUIRE(!ref.probs.empty(), "ref", "the reference must be computed with return_probs = true");
  if (opt.layout == AttentionLayout::bthd)
    return backward_bounds_bhtd(q, k, v, d, opt, ref, [lambda, u16, n16](const auto&... a) {
      return prob_attention_backward_bounds(a..., lambda, u16, n16);
    });
  const Precision pr = Precision::flushing<T>();
  const double u = pr.u, fz = pr.flush, K = kSecondOrder * lambda * u;
  const double r16 = (u16 / u) * (u16 / u);  // P and dS rounded to a 16-bit input type before the GEMMs
  const double scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(s.d_h));
  const index_t group = s.H / s.H_kv;
  const bool has_null = opt.normalizer == RowNorm::softmax1;
  auto D_ = [](const auto& x) { return static_cast<double>(x); };
  auto sq = [](double x) { return x * x; };
  AttentionBackwardBounds b{Tensor<double>(q.shape()), Tensor<double>(k.shape()), Tensor<double>(v.shape()),
                            has_null ? Tensor<double>({s.H}) : Tensor<double>(),
                            opt.bias.empty() ? Tensor<double>() : Tensor<double>(opt.bias.shape()), Tensor<double>()};
  // per key (and bias entry, and head): the sums of squares over rows (R2), the sums of |terms| (A)
  // and the terms' count
  Tensor<double> R2k(k.shape()), Ak(k.shape()), R2v(v.shape()), Av(v.shape()), cnt({s.B, s.H_kv, s.Tk});
  Tensor<double> Fk(k.shape()), Fv(v.shape()), Fb(opt.bias.empty() ? Shape{0} : opt.bias.shape());  // flush floors
  Tensor<double> R2b(b.bias.shape()), Ab(b.bias.shape()), cntb(b.bias.shape());
  Tensor<double> R2n({s.B, s.H}), An({s.B, s.H}), cntn({s.B, s.H});  // per batch element, summed below
  const std::size_t Tk = static_cast<std::size_t>(s.Tk);
  OASIS_REQUIRE(opt.normalizer == RowNorm::softmax || opt.normalizer == RowNorm::softmax1, "normalizer",
                "no derived error bound for ", to_string(opt.normalizer), " (bounds cover softmax and softmax1)");
  // (batch, kv head) pairs in parallel, as attention_backward_bounds (nothing below throws)
#pragma omp parallel for schedule(dynamic) if (opt.bias.empty())
  for (index_t unit = 0; unit < s.B * s.H_kv; ++unit) {
    std::vector<double> z(Tk), zeta2(Tk), p(Tk), dp(Tk), Rdp(Tk), kap2(Tk), own2(Tk), dz(Tk), a(Tk), w(Tk);
    const index_t bb = unit / s.H_kv, hk = unit % s.H_kv;
    for (index_t h = hk * group; h < (hk + 1) * group; ++h) {
      const double sl = opt.null_logits.empty() ? 0.0 : opt.null_logits[static_cast<std::size_t>(h)];
      const bool null_grad = has_null && std::isfinite(sl);
      for (index_t t = 0; t < s.Tq; ++t) {
        const KeyRange kr = visible_range(s, opt, bb, t);
        const index_t m = kr.count();
        const double lse = D_(ref.lse(bb, h, t));
        if (!std::isfinite(lse)) continue;  // no visible key and no null, or all mass on the null: exact
        double maxQ = 0, maxz = 0;
        for (index_t j = 0; j < m; ++j) {
          const std::size_t jj = static_cast<std::size_t>(j);
          const index_t key = kr.begin + j;
          double dot = 0, Q = 0;
          for (index_t c = 0; c < s.d_h; ++c) {
            const double x = D_(q(bb, h, t, c)) * D_(k(bb, hk, key, c));
            dot += x;
            Q += std::abs(x);
          }
          const double bias = attention_bias(opt, bb, h, t, key);
          z[jj] = scale * dot + bias;
          zeta2[jj] = std::isinf(bias) ? 0.0 : score_zeta2(s.d_h, scale, Q, scale * dot, bias, z[jj]);
          p[jj] = D_(ref.probs(bb, h, t, key));
          if (!std::isinf(bias)) {
            maxQ = std::max(maxQ, Q);
            maxz = std::max(maxz, std::abs(z[jj]));
          }
        }
        const double pn = has_null ? D_(ref.p_null(bb, h, t)) : 0.0;
        const ProbRow row = prob_row(opt.normalizer, z.data(), zeta2.data(), m, sl, sl * sl, scale * maxQ + maxz, p.data(),
                                     pn, lse, false);
        // the LSE's error, shared by the row: the forward row's, one more event of size LSE when P is
        // formed as exp2 of log2(e)-scaled scores, and the events a pre-scaled q shares (sigma, at most
        // 2 sigma on a probability)
        const double RL = std::sqrt(sq(row.lse) + sq(lse)) + 2.0 * row.sigma;
        const double dpn = d.p_null.empty() ? 0.0 : D_(d.p_null(bb, h, t)), dl = d.lse.empty() ? 0.0 : D_(d.lse(bb, h, t));
        const double kap2n = null_grad ? sl * sl + sq(sl - lse) + 5.0 : 0.0;
        double Dt = pn * dpn, absD = pn * std::abs(dpn), RD2 = sq(pn * dpn) * kap2n;
        for (index_t j = 0; j < m; ++j) {
          const std::size_t jj = static_cast<std::size_t>(j);
          double x = 0, ax = 0;
          for (index_t c = 0; c < s.d_v; ++c) {
            const double y = D_(d.out(bb, h, t, c)) * D_(v(bb, hk, kr.begin + j, c));
            x += y;
            ax += std::abs(y);
          }
          dp[jj] = x;
          Rdp[jj] = r_dp_scale(s.d_v) * ax;
          kap2[jj] = std::isinf(z[jj]) ? 0.0 : zeta2[jj] + sq(z[jj] - lse) + 5.0;
          Dt += p[jj] * x;
          absD += p[jj] * std::abs(x);
          // p_j's own event reaches D through dp_j, and through dp_j - dP (autograd of psi): one coefficient
          RD2 += sq(p[jj] * (std::abs(x) + std::abs(dpn))) * kap2[jj] + sq(p[jj] * Rdp[jj]) + sq(p[jj] * (std::abs(x) + std::abs(dpn)));
        }
        RD2 += static_cast<double>(m + 1) * sq(absD + std::max(0.0, 1.0 - pn) * std::abs(dpn));
        for (index_t j = 0; j < m; ++j) {
          const std::size_t jj = static_cast<std::size_t>(j);
          w[jj] = dp[jj] - Dt + dl;
          dz[jj] = p[jj] * w[jj];
          // the LSE's coefficient on dz_j: p_j (w_j - D), and p_j dP more when dP comes through the probabilities
          a[jj] = p[jj] * (std::abs(w[jj] - Dt) + std::abs(dpn));
          own2[jj] = sq(w[jj] * p[jj]) * kap2[jj] + sq(p[jj] * Rdp[jj]) + sq(p[jj] * (dp[jj] - Dt)) + sq(p[jj] * w[jj]) +
                     sq(dz[jj]) + r16 * sq(std::max(std::abs(dz[jj]), n16)) + sq(p[jj] * (std::abs(dp[jj]) + std::abs(dpn)));
        }
        if (null_grad) {
          const double wn = dpn - Dt + dl, ds = pn * wn;
          // the null's own event reaches ds_t directly and through D: (a + b)^2 <= 2 a^2 + 2 b^2
          R2n(bb, h) += 2.0 * sq(pn * wn) * kap2n + 2.0 * sq(pn) * RD2 + sq(pn * (std::abs(wn - Dt) + std::abs(dpn)) * RL) +
                        sq(pn * (dpn - Dt)) + 2.0 * sq(ds);
          An(bb, h) += std::abs(ds);
          cntn(bb, h) += 1;
        }
        // dq_tc: the row's keys
        for (index_t c = 0; c < s.d_h; ++c) {
          double own = 0, cD = 0, cL = 0, A = 0, dq = 0, fl = 0;
          for (index_t j = 0; j < m; ++j) {
            const std::size_t jj = static_cast<std::size_t>(j);
            const double kc = D_(k(bb, hk, kr.begin + j, c));
            own += sq(kc) * own2[jj];
            cD += p[jj] * kc;
            cL += a[jj] * std::abs(kc);
            A += std::abs(dz[jj] * kc);
            dq += dz[jj] * kc;
            fl += fz * (std::abs(w[jj]) + 2.0) * std::abs(kc);
          }
          // an event of p_j or dp_j reaches dq through dz_j and through D: (a + b)^2 <= 2 a^2 + 2 b^2
          const double R2 =
              sq(scale) * (2.0 * own + 2.0 * sq(cD) * RD2 + sq(cL * RL) + static_cast<double>(m + 1) * sq(A)) + 3.0 * sq(scale * dq);
          b.q(bb, h, t, c) = K * std::sqrt(R2) + kSecondOrder * (scale * fl + static_cast<double>(m + 3) * fz) + pr.p_floor;
        }
        // dk, dv, dbias: this row's terms of every key it sees
        for (index_t j = 0; j < m; ++j) {
          const std::size_t jj = static_cast<std::size_t>(j);
          const index_t key = kr.begin + j;
          cnt(bb, hk, key) += 1;
          for (index_t c = 0; c < s.d_h; ++c) {
            const double qc = D_(q(bb, h, t, c));
            R2k(bb, hk, key, c) += sq(qc) * (2.0 * own2[jj] + 2.0 * sq(p[jj]) * RD2 + sq(a[jj] * RL));
            Ak(bb, hk, key, c) += std::abs(dz[jj] * qc);
            Fk(bb, hk, key, c) += fz * (std::abs(w[jj]) + 2.0) * std::abs(qc);
          }
          for (index_t c = 0; c < s.d_v; ++c) {
            const double oc = D_(d.out(bb, h, t, c));
            R2v(bb, hk, key, c) += sq(oc * p[jj]) * (kap2[jj] + sq(RL) + 1.0) + r16 * sq(oc * std::max(p[jj], n16));
            Av(bb, hk, key, c) += std::abs(p[jj] * oc);
            Fv(bb, hk, key, c) += fz * (std::abs(oc) + 1.0);
          }
          if (!opt.bias.empty()) {
            const index_t off = attention_bias_offset(opt, bb, h, t, key);
            R2b[off] += 2.0 * own2[jj] + 2.0 * sq(p[jj]) * RD2 + sq(a[jj] * RL);
            Ab[off] += std::abs(dz[jj]);
            Fb[off] += fz * (std::abs(w[jj]) + 3.0);
            cntb[off] += 1;
          }
        }
      }
    }
  }
  for (index_t bb = 0; bb < s.B; ++bb)
    for (index_t hk = 0; hk < s.H_kv; ++hk)
      for (index_t j = 0; j < s.Tk; ++j) {
        const double n = cnt(bb, hk, j);
        for (index_t c = 0; c < s.d_h; ++c)
          b.k(bb, hk, j, c) = K * scale * std::sqrt(R2k(bb, hk, j, c) + (n + 1.0) * sq(Ak(bb, hk, j, c)) + 3.0 * sq(Ak(bb, hk, j, c))) +
                              kSecondOrder * (scale * Fk(bb, hk, j, c) + (n + 3.0) * fz) + pr.p_floor;
        for (index_t c = 0; c < s.d_v; ++c)
          b.v(bb, hk, j, c) = K * std::sqrt(R2v(bb, hk, j, c) + (n + 1.0) * sq(Av(bb, hk, j, c))) +
                              kSecondOrder * (Fv(bb, hk, j, c) + (n + 1.0) * fz) + pr.p_floor;
      }
  for (index_t h = 0; h < b.null_logits.size(); ++h) {
    double R2 = 0, A = 0, n = 0;
    for (index_t bb = 0; bb < s.B; ++bb) R2 += R2n(bb, h), A += An(bb, h), n += cntn(bb, h);
    b.null_logits[h] = K * std::sqrt(R2 + (n + 1.0) * sq(A)) + kSecondOrder * (n + 1.0) * 3.0 * fz + pr.p_floor;
  }
  for (index_t i = 0; i < b.bias.size(); ++i)
    b.bias[i] = K * std::sqrt(R2b[i] + (cntb[i] + 1.0) * sq(Ab[i])) + kSecondOrder * (Fb[i] + (cntb[i] + 1.0) * fz) + pr.p_floor;
  return b;
}

/// The probabilistic bound (1.02 lambda u R + floors) of pseudo_query_logits_backward<T> (shapes as
/// PseudoQueryBackwardBounds). Per row (i, t), events in units of u (of the norm's arithmetic, at
/// most u_T): ss = sum_c x_c^2 (products, partial sums <= ss: R^2 = sum x^4 + (d - 1) ss^2), then
/// mean, + eps, sqrt, reciprocal: inv's relative rho2 = (R(ss)/ss)^2 / 4 + 3.5 (shared by the row);
/// xhat_c = x_c inv, y_c = xhat_c gain_c, dy_c = dg w_c, dxhat_c = dy_c gain_c (one event each, and
/// one per input rounded to float32 under compute_in_float32); tau_c = dxhat_c xhat_c,
/// m = (1/d) sum_c tau_c (own R_m^2 = (sum tau^2 (4 + 2 in) + (sum tau)^2 + d (sum |tau|)^2) / d^2;
/// its inv part m eps_inv is coherent with the others); ds_c = inv r_c, r_c = dxhat_c - xhat_c m:
///   R^2 = inv^2 (dxhat^2 (2 + in) + (xhat m)^2 (2 + in) + xhat^2 R_m^2 + r^2) + (inv r)^2 + (inv (r - 2 xhat m))^2 rho2
/// dw_c, dgain_c sum one term per row (rows independent) plus (n N + 1) (sum |terms|)^2 for the sum.
template <class T>
PseudoQueryBackwardBounds prob_pseudo_query_logits_backward_bounds(const Tensor<T>& sources, const Tensor<T>& w,
                                                                  const Tensor<T>& gain, const Tensor<T>& dg,
                                                                  const KeyNormOptions& opt, double lambda) {
  require_rank(sources, 3, "sources", "[n, N, d]");
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2);
  const Precision pr = Precision::flushing<T>();
  const bool f32 = opt.compute_in_float32 && !std::is_same_v<T, float>;
  const double u = std::max(pr.u, f32 ? Precision::of<float>().u : 0.0), K = kSecondOrder * lambda * u;
  const double in = f32 ? 1.0 : 0.0, dd = static_cast<double>(d);
  auto D_ = [](const auto& x) { return static_cast<double>(x); };
  auto sq = [](double x) { return x * x; };
  PseudoQueryBackwardBounds b{Tensor<double>({n, N, d}), Tensor<double>({d}), gain.empty() ? Tensor<double>() : Tensor<double>({d})};
  std::vector<double> R2w(static_cast<std::size_t>(d)), Aw(R2w.size()), R2g(R2w.size()), Ag(R2w.size()), xh(R2w.size()),
      dxh(R2w.size());
  for (index_t i = 0; i < n; ++i)
    for (index_t t = 0; t < N; ++t) {
      double ss = 0, x4 = 0;
      for (index_t c = 0; c < d; ++c) {
        const double x2 = sq(D_(sources(i, t, c)));
        ss += x2;
        x4 += sq(x2);
      }
      const double inv = 1.0 / std::sqrt(ss / dd + opt.eps);
      const double rss2 = ss > 0 ? (x4 * (1.0 + 4.0 * in) + (dd - 1.0) * sq(ss)) / sq(ss) : 0.0;
      const double rho2 = rss2 / 4.0 + 3.5;
      const double g = D_(dg(i, t));
      double msum = 0, tau2 = 0, tabs = 0;
      for (index_t c = 0; c < d; ++c) {
        const std::size_t cc = static_cast<std::size_t>(c);
        const double ga = gain.empty() ? 1.0 : D_(gain[c]), wc = D_(w[c]);
        xh[cc] = D_(sources(i, t, c)) * inv;
        const double y = xh[cc] * ga, ty = g * y;
        R2w[cc] += sq(ty) * (rho2 + 3.0 + 2.0 * in);
        Aw[cc] += std::abs(ty);
        const double tg = g * wc * xh[cc];
        R2g[cc] += sq(tg) * (rho2 + 3.0 + 2.0 * in);
        Ag[cc] += std::abs(tg);
        dxh[cc] = g * wc * ga;
        const double tau = dxh[cc] * xh[cc];
        msum += tau;
        tau2 += sq(tau);
        tabs += std::abs(tau);
      }
      const double m = msum / dd;
      const double Rm2 = (tau2 * (4.0 + 2.0 * in) + sq(msum) + dd * sq(tabs)) / sq(dd);
      for (index_t c = 0; c < d; ++c) {
        const std::size_t cc = static_cast<std::size_t>(c);
        const double r = dxh[cc] - xh[cc] * m;
        // xhat_c's own rounding is in r_c directly and through m: (a + b)^2 <= 2 a^2 + 2 b^2
        const double R2 = sq(inv) * (sq(dxh[cc]) * (2.0 + in) + 2.0 * sq(xh[cc] * m) * (2.0 + in) + 2.0 * sq(xh[cc]) * Rm2 + sq(r)) +
                          sq(inv * r) + sq(inv * (r - 2.0 * xh[cc] * m)) * rho2;
        b.sources(i, t, c) = K * std::sqrt(R2) + pr.p_floor;
      }
    }
  const double cnt = static_cast<double>(n * N);
  for (index_t c = 0; c < d; ++c) {
    const std::size_t cc = static_cast<std::size_t>(c);
    b.w[c] = K * std::sqrt(R2w[cc] + (cnt + 1.0) * sq(Aw[cc])) + pr.p_floor;
    if (!gain.empty()) b.gain[c] = K * std::sqrt(R2g[cc] + (cnt + 1.0) * sq(Ag[cc])) + pr.p_floor;
  }
  return b;
}

}  // namespace oasis::bounds
