// src/verify/attention_oracle.cpp — the fast (double) and mp50 oracles of op attention, row by row.
#include "attention_oracle.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "oasis/verify/policy.hpp"
#include "attention_oracle_rows.hpp"
#include "float_sums.hpp"
#include "oracle_kernels.hpp"

namespace oasis::verify::detail {

// row_rho and in_lse_convention: attention_oracle_rows.hpp
double row_rho(double rel_max) { return 4.0 * rel_max * own_precision().u + 1e-9; }

void in_lse_convention(const AttnCall& c, AttnRow& r, const Logits& L, const mp50* keys_mp) {
  if (c.lse.is_default()) return;
  LseRow lr{r.lse, r.lse_mp, r.exact, r.lse_wc, r.lse_R};
  to_convention(c.lse, RowLogits{c.opt.normalizer, L.z.data(), L.zc.data(), L.zeta2.data(), r.m(), c.null_logit(r.h),
                                 L.sigma, r.p.data(), r.p_null},
                keys_mp, lr);
  r.lse = lr.value;
  r.lse_mp = lr.value_mp;
  r.lse_wc = lr.wc;
  r.lse_R = lr.R;
}

namespace {

using kernels::kColumnQuantum;
using kernels::round_up;
constexpr double kInf = std::numeric_limits<double>::infinity();

void row_logits(const AttnCall& c, AttnRow& r, const double* dot, const double* Q, const double* bias, Logits& L) {
  const index_t m = r.m();
  L.z.resize(static_cast<std::size_t>(m));  // every entry of these four set below
  L.zc.resize(L.z.size());
  L.zeta2.resize(L.z.size());
  r.masked.resize(L.z.size());
  // locals: the char stores to masked may alias anything, so fields would be reloaded every step
  double *z = L.z.data(), *zc = L.zc.data(), *zeta2 = L.zeta2.data();
  char* masked = r.masked.data();
  const bool has_bias = !c.opt.bias.empty();
  double zmax = -kInf, maxQ = 0, maxz = 0;
  index_t arg = -1;
  for (index_t j = 0; j < m; ++j) {
    const double sd = c.scale * dot[j], b = bias[j], zj = sd + b;
    z[j] = zj;
    if (zj > zmax) {
      zmax = zj;
      arg = j;
    }
    masked[j] = std::isinf(b);
    if (masked[j]) {
      zc[j] = zeta2[j] = 0.0;
      continue;
    }
    zc[j] = bounds::score_error(c.s.d_h, c.scale, Q[j], sd, b, has_bias);
    zeta2[j] = bounds::score_zeta2(c.s.d_h, c.scale, Q[j], sd, b, zj);
    maxQ = std::max(maxQ, Q[j]);
    maxz = std::max(maxz, std::abs(zj));
  }
  L.zmax = zmax;
  L.arg = arg;
  L.sigma = c.scale * maxQ + maxz;
}

/// The pieces of a row whose logits L and reference p, lse, p_null are set: the worst-case row
/// bound at u = 1 and the probabilistic row model (r.p_wc, lse_wc, p_null_wc, p_R, lse_R, p_null_R,
/// rho; pr); last, the LSE turns into the call's convention (an exact row's keys-only LSE in mp50:
/// keys_mp).
void row_pieces(const AttnCall& c, AttnRow& r, const Logits& L, bounds::ProbRow& pr, const mp50* keys_mp = nullptr) {
  const index_t m = r.m();
  const double s = c.null_logit(r.h);
  thread_local bounds::RowBound b1;  // its storage and pr's circulate with the rows' (no allocation per row)
  bounds::row_bound_into(bounds::Precision{1.0, 0.0}, c.opt.normalizer, L.z.data(), L.zc.data(), m, s, std::abs(s),
                         r.p.data(), r.p_null, r.lse, b1);
  bounds::prob_row_into(c.opt.normalizer, L.z.data(), L.zeta2.data(), m, s, s * s, L.sigma, r.p.data(), r.p_null, r.lse,
                        c.probs_needed, pr);
  r.p_wc.swap(b1.p);
  r.lse_wc = b1.lse;
  r.p_null_wc = b1.p_null;
  r.p_R.swap(pr.p);
  r.lse_R = pr.lse;
  r.p_null_R = pr.p_null;
  in_lse_convention(c, r, L, keys_mp);
  r.rho = row_rho(b1.rel_max);
}

/// A row of fast_rows by the scalar functions of the bounds: row_logits, the reference, row_pieces,
/// the weights. Every row the fused path (fused_row) does not take.
void general_row(const AttnCall& c, AttnRow& row, const double* dot, const double* Q, const double* bias, bool mixR,
                 Logits& lg, bounds::ProbRow& prow, RowWeights& w) {
  const index_t m = row.m();
  const bool has_null = c.opt.normalizer == RowNorm::softmax1;
  const double s = c.null_logit(row.h);
  double *P = w.P, *G = w.G, *Zw = w.Zw, *Wr = w.Wr;
  row_logits(c, row, dot, Q, bias, lg);
  // the reference: M, e_j = exp(z_j - M), S = sum; LSE1 = M + log1p(sum of the terms other than
  // the maximal one, whose exponential is exactly 1)
  row.p.resize(static_cast<std::size_t>(m));  // set below on every path
  double M = has_null ? s : -kInf, pmax = 0;
  index_t arg = -1;  // -1: the null (or none)
  if (lg.zmax > M) {
    M = lg.zmax;
    arg = lg.arg;
  }
  double* p = row.p.data();
  if (std::isinf(M)) {  // a +inf null logit: all on the null; else no term at all: the documented zero
    std::fill(p, p + m, 0.0);
    std::fill(P, P + m, 0.0);
    row.lse = M;
    row.p_null = M > 0 ? 1.0 : 0.0;
  } else {
    const double* z = lg.z.data();
    double rest = 0, emax = 0;
    for (index_t j = 0; j < m; ++j) {
      const double e = std::isinf(z[j]) ? 0.0 : std::exp(z[j] - M);
      p[j] = e;
      emax = std::max(emax, e);
      if (j != arg) rest += e;
    }
    const double en = has_null ? std::exp(s - M) : 0.0;
    if (arg >= 0) rest += en;
    const double S = 1.0 + rest;
    // rounding is monotone: max_j fl(e_j / S) = fl(max_j e_j / S); the loop then has no
    // reduction and its divisions vectorise
    pmax = emax / S;
    for (index_t j = 0; j < m; ++j) {
      p[j] /= S;
      P[j] = p[j];
    }
    row.p_null = en / S;
    row.lse = M + std::log1p(rest);
  }
  row_pieces(c, row, lg, prow);
  // the squared weights scaled by f^2 where they would underflow (prob_mix_from_folded)
  const double f = bounds::prob_mix_scale(pmax);
  w.f = f;
  const double *gj = row.p_wc.data(), *k2 = prow.kappa2.data();
  double swr = 0, spr = 0;
  if (!mixR) {
    std::copy(gj, gj + m, G);
  } else {
    for (index_t j = 0; j < m; ++j) {
      G[j] = gj[j];
      const double fp = f * p[j], wj = fp * fp * k2[j];
      Wr[j] = wj;
      Zw[j] = wj + fp * fp;
      swr += wj;
      spr += p[j];
    }
    // Z's shared-event part, sigma^2 (f sp) (f p_j) (scaled as prob_mix_from_folded asks; f p_j
    // formed first: f alone may be near the top of the double range)
    const double cz = prow.sigma * prow.sigma * (f * spr);
    if (cz != 0.0)
      for (index_t j = 0; j < m; ++j) Zw[j] += cz * (f * p[j]);
  }
  w.sw = swr;
  w.sp = spr;
}

}  // namespace

AttnCall::AttnCall(const Tensor<double>& q_, const Tensor<double>& k_, const Tensor<double>& v_, const AttentionOptions& o)
    : q(q_), k(k_), v(v_), opt(o), s(check_attention_args(q_, k_, v_, o)),
      scale(o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(s.d_h))) {}

ElemBounds AttnRow::out_bounds(index_t c, const bounds::Precision& pr) const {
  const auto cu = static_cast<std::size_t>(c);
  const double fl = pr.p_floor * absv[cu] + bounds::underflow_floor(pr, m());
  return {bounds::kSecondOrder * (pr.u * (G1[cu] + static_cast<double>(m()) * V1[cu]) + pr.p_floor * absv[cu]) +
              bounds::underflow_floor(pr, m()),
          bounds::kSecondOrder * kLambda * pr.u * out_R[cu] + fl};
}
ElemBounds AttnRow::p_bounds(index_t j, const bounds::Precision& pr) const {
  const auto ju = static_cast<std::size_t>(j);
  if (masked[ju]) return {0.0, 0.0};
  return {pr.u * p_wc[ju] + pr.p_floor, bounds::kSecondOrder * kLambda * pr.u * p_R[ju] + pr.p_floor};
}
ElemBounds AttnRow::lse_bounds(const bounds::Precision& pr) const {
  return {pr.u * lse_wc, bounds::kSecondOrder * kLambda * pr.u * lse_R};
}
ElemBounds AttnRow::p_null_bounds(const bounds::Precision& pr) const {
  if (!has_null) return {0.0, 0.0};
  return {pr.u * p_null_wc + pr.p_floor, bounds::kSecondOrder * kLambda * pr.u * p_null_R + pr.p_floor};
}

// pack_kv: attention_oracle_pack.cpp

namespace {
/// sum_j w_j y_jx over a row's keys kr in double, y from the packed values (column `col`): a float
/// sum's replacement where its uncertainty exceeds fsum::kRedo.
double double_sum(const AttnPacked& pk, KeyRange kr, const double* w, index_t x, VCol col) {
  const index_t ld = pk.row_len();
  const double* y = pk.vx.data() + kr.begin * ld + pk.at(col) + x;
  double s = 0;
  for (index_t j = 0; j < kr.count(); ++j) s += w[j] * y[j * ld];
  return s;
}
}  // namespace

void fast_rows(const AttnCall& c, const AttnPacked& pk, index_t h, const index_t* ts, index_t n, AttnWorkspace& ws,
               std::vector<AttnRow>& out) {
  if (n == 0) {
    out.clear();
    return;
  }
  const kernels::Gemm& g = kernels::oracle_gemm();
  const index_t b = pk.b, hk = pk.hk, dh = c.s.d_h, dv = c.s.d_v, dvp = pk.dvp;
  const bool has_null = c.opt.normalizer == RowNorm::softmax1, mixR = c.mix_R_needed;
  const double s = c.null_logit(h);
  // the union of the rows' visible ranges
  std::vector<KeyRange>& kr = ws.kr;
  kr.resize(static_cast<std::size_t>(n));
  index_t lo = c.s.Tk, hi = 0;
  for (index_t r = 0; r < n; ++r) {
    kr[static_cast<std::size_t>(r)] = visible_range(c.s, c.opt, b, ts[r]);
    if (kr[static_cast<std::size_t>(r)].count() > 0) {
      lo = std::min(lo, kr[static_cast<std::size_t>(r)].begin);
      hi = std::max(hi, kr[static_cast<std::size_t>(r)].end);
    }
  }
  if (hi <= lo) lo = hi = 0;
  const index_t L = hi - lo, Lp = round_up(std::max<index_t>(L, 1), kColumnQuantum);
  const std::size_t nL = static_cast<std::size_t>(n * Lp);
  ws.qb.assign(static_cast<std::size_t>(n * dh), 0.0);
  ws.qa.assign(ws.qb.size(), 0.0);
  for (index_t r = 0; r < n; ++r) {
    const double* qr = c.qrow(b, h, ts[r]);
    for (index_t x = 0; x < dh; ++x) {
      ws.qb[static_cast<std::size_t>(r * dh + x)] = qr[x];
      ws.qa[static_cast<std::size_t>(r * dh + x)] = std::abs(qr[x]);
    }
  }
  ws.S.resize(nL);
  ws.AQ.resize(nL);
  // Q = |q| |K|^T: a float sum of d_h terms where every q and k is in range (float_sums.hpp: no
  // product leaves float's normal range, so no E), each Q_j within Q^_j (1 +- relQ)
  bool qf = pk.k_float;
  for (std::size_t i = 0; i < ws.qa.size() && qf; ++i) qf = fsum::in_range(ws.qa[i]);
  const double relQ = qf ? fsum::gamma(dh + 2) : 0.0;
  if (L > 0) {
    g.gemm(ws.qb.data(), dh, pk.kt.data() + lo, pk.tkp, ws.S.data(), Lp, n, Lp, dh, false);
    if (qf) {
      ws.qaf.assign(ws.qa.begin(), ws.qa.end());
      ws.AQf.resize(nL);
      g.gemm_f32(ws.qaf.data(), dh, pk.ktaf.data() + lo, pk.tkp, ws.AQf.data(), Lp, n, Lp, dh, false);
      std::copy(ws.AQf.begin(), ws.AQf.end(), ws.AQ.begin());
    } else {
      g.gemm(ws.qa.data(), dh, pk.kta.data() + lo, pk.tkp, ws.AQ.data(), Lp, n, Lp, dh, false);
    }
  }
  // the weights of the mixing sums, stacked so that each product reads adjacent rows:
  // [Z; P; W] (3n x Lp: Z the folded squares' weights, prob_mix_from_folded) and G (n x Lp)
  ws.P3.resize(3 * nL);  // each row zeroes the columns outside its keys below
  ws.G.resize(nL);
  std::vector<bounds::ProbRow>& prs = ws.prs;
  if (prs.size() < static_cast<std::size_t>(n)) prs.resize(static_cast<std::size_t>(n));
  for (auto* x : {&ws.sw, &ws.sp, &ws.fs}) x->resize(static_cast<std::size_t>(n));  // set by every row below
  std::vector<double>& bias = ws.bias;
  thread_local Logits lg;
  if (c.opt.bias.empty()) bias.assign(static_cast<std::size_t>(c.s.Tk), 0.0);  // the rows' bias: 0 everywhere
  out.resize(static_cast<std::size_t>(n));
  for (index_t r = 0; r < n; ++r) {
    AttnRow& row = out[static_cast<std::size_t>(r)];
    row.b = b;
    row.h = h;
    row.t = ts[r];
    row.kr = kr[static_cast<std::size_t>(r)];
    row.exact = false;
    row.has_null = has_null;
    const index_t m = row.m(), off = m > 0 ? row.kr.begin - lo : 0;  // a row without keys may start anywhere
    const double* dot = ws.S.data() + r * Lp + off;
    const double* Q = ws.AQ.data() + r * Lp + off;
    if (!c.opt.bias.empty()) {
      bias.resize(static_cast<std::size_t>(m));
      for (index_t j = 0; j < m; ++j) bias[static_cast<std::size_t>(j)] = attention_bias(c.opt, b, h, ts[r], row.kr.begin + j);
    }
    auto clear_outside = [&](double* base) {  // the columns outside the row's keys
      std::fill(base, base + off, 0.0);
      std::fill(base + off + m, base + Lp, 0.0);
    };
    clear_outside(ws.P3.data() + nL + r * Lp);
    clear_outside(ws.G.data() + r * Lp);
    if (mixR) {  // R's weights
      clear_outside(ws.P3.data() + r * Lp);
      clear_outside(ws.P3.data() + 2 * nL + r * Lp);
    }
    double* Zw = ws.P3.data() + r * Lp + off;
    double* P = ws.P3.data() + nL + r * Lp + off;
    double* Wr = ws.P3.data() + 2 * nL + r * Lp + off;
    double* G = ws.G.data() + r * Lp + off;
    RowWeights w{Zw, P, Wr, G};
    row.fused = fused_row(c, row, dot, Q, mixR, lg, prs[static_cast<std::size_t>(r)], w);
    if (!row.fused)
      general_row(c, row, dot, Q, bias.data(), mixR, lg, prs[static_cast<std::size_t>(r)], w);
    // every bound piece is affine in the Q_j with nonnegative coefficients (the worst-case pieces,
    // the own errors) or the square root of a polynomial of degree at most 2 in them and their
    // maximum with nonnegative coefficients (R): within relQ of itself, composed with the rest
    row.rho += relQ * (1.0 + row.rho);
    row.own_rel = relQ;
    ws.fs[static_cast<std::size_t>(r)] = w.f;
    ws.sw[static_cast<std::size_t>(r)] = w.sw;
    ws.sp[static_cast<std::size_t>(r)] = w.sp;
  }
  // mixing sums: [A; X1] = [P; W] V, Z = Zw V^2, V1 = P |V|, G1 = G |V| (without R: A = P V, V1
  // and G1)
  ws.out0.resize(static_cast<std::size_t>(2 * n * dvp));
  const index_t ldv = pk.row_len();  // (vx and vf)
  const double* vx = pk.vx.data() + lo * ldv;
  // the sums V1, G1, Z and X1 in float where the block's weights scale (float_sums.hpp): [P; G] |V|,
  // Zw V^2 and W V, each row of weights scaled by its own 2^e
  bool fs = pk.float_sums && fsum::subnormals_kept();
  if (fs) {
    ws.wf.resize(4 * nL);
    ws.ef.resize(static_cast<std::size_t>(4 * n));
    for (index_t r = 0; r < n && fs; ++r) {
      const auto ru = static_cast<std::size_t>(r);
      fs = fsum::scale_to_float(ws.P3.data() + nL + r * Lp, Lp, ws.wf.data() + r * Lp, ws.ef[ru]) &&
           fsum::scale_to_float(ws.G.data() + r * Lp, Lp, ws.wf.data() + nL + r * Lp, ws.ef[ru + n]) &&
           (!mixR || (fsum::scale_to_float(ws.P3.data() + r * Lp, Lp, ws.wf.data() + 2 * nL + r * Lp, ws.ef[ru + 2 * n]) &&
                      fsum::scale_to_float(ws.P3.data() + 2 * nL + r * Lp, Lp, ws.wf.data() + 3 * nL + r * Lp,
                                           ws.ef[ru + 3 * n])));
    }
  }
  // the rows of a block's window past hi hold zero weights; the products stop at L. A = P V in
  // double (and X1 = W V, [P; W] V, without the float sums; with them X1 is a float sum below)
  g.gemm(ws.P3.data() + nL, Lp, vx + pk.at(VCol::v), ldv, ws.out0.data(), dvp, mixR && !fs ? 2 * n : n, dvp, L, false);
  if (fs) {
    ws.of1.resize(static_cast<std::size_t>(2 * n * dvp));
    ws.of2.resize(static_cast<std::size_t>(2 * n * dvp));
    const float* vf = pk.vf.data() + lo * ldv;
    g.gemm_f32(ws.wf.data(), Lp, vf + pk.at(VCol::abs), ldv, ws.of1.data(), dvp, 2 * n, dvp, L, false);
    if (mixR) {
      g.gemm_f32(ws.wf.data() + 2 * nL, Lp, vf + pk.at(VCol::squares), ldv, ws.of2.data(), dvp, n, dvp, L, false);
      g.gemm_f32(ws.wf.data() + 3 * nL, Lp, vf + pk.at(VCol::v), ldv, ws.of2.data() + n * dvp, dvp, n, dvp, L, false);
    }
  } else {
    ws.out1.resize(static_cast<std::size_t>(2 * n * dvp));
    ws.out2.resize(static_cast<std::size_t>(n * dvp));
    if (mixR) g.gemm(ws.P3.data(), Lp, vx + pk.at(VCol::squares), ldv, ws.out2.data(), dvp, n, dvp, L, false);
    g.gemm(ws.P3.data() + nL, Lp, vx + pk.at(VCol::abs), ldv, ws.out1.data(), dvp, n, dvp, L, false);
    g.gemm(ws.G.data(), Lp, vx + pk.at(VCol::abs), ldv, ws.out1.data() + n * dvp, dvp, n, dvp, L, false);
  }
  const bounds::Precision dp = own_precision();
  for (index_t r = 0; r < n; ++r) {
    AttnRow& row = out[static_cast<std::size_t>(r)];
    const bounds::ProbRow& pr = prs[static_cast<std::size_t>(r)];
    for (auto* x : {&row.out, &row.G1, &row.V1, &row.absv, &row.out_R, &row.rho_out, &row.err_out})
      x->resize(static_cast<std::size_t>(dv));  // every entry set below
    const double* pe = pk.vabs_prefix.data() + row.kr.end * dv;
    const double* pb = pk.vabs_prefix.data() + row.kr.begin * dv;
    const auto ru = static_cast<std::size_t>(r);
    const index_t m = row.m(), off = m > 0 ? row.kr.begin - lo : 0;
    const std::int32_t* ne = fs ? pk.vnz_prefix.data() + row.kr.end * dv : nullptr;
    const std::int32_t* nb = fs ? pk.vnz_prefix.data() + row.kr.begin * dv : nullptr;
    // the row's weights (as the row loop placed them), the float sums' gamma_{m+3} and their rows' 2^-e
    const double *Zw = ws.P3.data() + r * Lp + off, *Pw = Zw + nL, *Gw = ws.G.data() + r * Lp + off;
    const double g = fsum::gamma(m + 3);
    const double sP = fs ? std::ldexp(1.0, -ws.ef[ru]) : 0.0, sG = fs ? std::ldexp(1.0, -ws.ef[ru + n]) : 0.0,
                 sZ = fs && mixR ? std::ldexp(1.0, -ws.ef[ru + 2 * n]) : 0.0,
                 sW = fs && mixR ? std::ldexp(1.0, -ws.ef[ru + 3 * n]) : 0.0;
    const double* Ww = Zw + 2 * nL;
    for (index_t x = 0; x < dv; ++x) {
      const auto xu = static_cast<std::size_t>(x);
      const double A = ws.out0[static_cast<std::size_t>(r * dvp + x)];
      row.absv[xu] = m > 0 ? range_sum(pb[x], pe[x], c.s.Tk) : 0.0;
      double V1, G1, Z = 0, X1 = 0, relV1 = 0, relG1 = 0, relZ = 0, EW = 0;
      if (fs) {  // the float sums unscaled, and their uncertainty (float_sums.hpp)
        const index_t nz = m > 0 ? ne[x] - nb[x] : 0;
        const double y1 = row.absv[xu], y2 = pk.vmax[xu] * row.absv[xu];
        const double v1 = ws.of1[static_cast<std::size_t>(r * dvp + x)], g1 = ws.of1[static_cast<std::size_t>((n + r) * dvp + x)];
        const double E1 = fsum::abs_part(y1, nz);  // in the scaled rows' units, as v1 and g1
        V1 = v1 * sP;
        G1 = g1 * sG;
        relV1 = fsum::rel(v1, g, E1);
        relG1 = fsum::rel(g1, g, E1);
        // a sum whose float value is too uncertain (most of it below float's normal range): in double
        auto settle = [&](double& X, double& rel, const double* w, VCol col) {
          if (rel <= fsum::kRedo) return;
          X = double_sum(pk, row.kr, w, x, col);
          rel = 0;
        };
        settle(V1, relV1, Pw, VCol::abs);
        settle(G1, relG1, Gw, VCol::abs);
        if (mixR) {
          const double z = ws.of2[static_cast<std::size_t>(r * dvp + x)];
          Z = z * sZ;
          relZ = fsum::rel(z, g, fsum::abs_part(y2, nz));
          settle(Z, relZ, Zw, VCol::squares);
          X1 = ws.of2[static_cast<std::size_t>((n + r) * dvp + x)] * sW;
          EW = E1 * sW;  // X1's absolute part, unscaled (fsum::signed_error)
        }
      } else {
        V1 = ws.out1[static_cast<std::size_t>(r * dvp + x)];
        G1 = ws.out1[static_cast<std::size_t>((n + r) * dvp + x)];
        if (mixR) {
          Z = ws.out2[static_cast<std::size_t>(r * dvp + x)];
          X1 = ws.out0[static_cast<std::size_t>((n + r) * dvp + x)];
        }
      }
      row.out[xu] = A;
      row.G1[xu] = G1;
      row.V1[xu] = V1;
      // the pieces at the double reference: p within its relative error, A within eA, the float sums
      // within theirs (the worst-case line's u (G1 + m V1): the larger), and the cancellation in the
      // expanded sums of squares (bounds::mix_cancellation)
      row.out_R[xu] = 0.0;  // set below with R (out_bounds' probabilistic part, unused here, reads it)
      // (with the float sums' upper ends: V1 and G1 within relV1 and relG1, at most kRedo; every term
      // at most affine in the Q_j: within relQ)
      const double eA = (1.0 + relQ) * (row.out_bounds(x, dp).wc + bounds::kSecondOrder * dp.u *
                                                                      (relG1 * G1 + static_cast<double>(m) * relV1 * V1));
      row.err_out[xu] = eA;
      const double V1lo = relV1 < 1.0 ? V1 * (1.0 - relV1) : 0.0;
      row.rho_out[xu] = row.rho + 4.0 * eA / std::max(V1lo + std::abs(A), std::numeric_limits<double>::min()) +
                        std::max(relV1, relG1) * (1.0 + relQ);
      if (!mixR) continue;
      const double f = ws.fs[ru], sw = ws.sw[ru], sp = ws.sp[ru];
      // (scaled rows: every term times f^2, R f against it, each product ordered so that f, near
      // the top of the double range, never stands alone; Z holds the shared events' sum of
      // squares, sigma^2 (f sp) (f Y2))
      const double fA = f * A, fV1 = f * V1;
      double R2 = 0, U2 = 0;  // (f R)^2 as evaluated, and its uncertainty
      bool x1_float = fs;
      double eX1 = 0;  // -2 A X1's share of U2: 2 |A| times X1's float uncertainty (0 once X1 is in double)
      auto x1_error = [&] { eX1 = x1_float ? 2.0 * std::abs(A) * fsum::signed_error(g, sw, Z * (1.0 + relZ), EW) : 0.0; };
      auto assemble = [&] {
        row.out_R[xu] = bounds::prob_mix_from_folded(pr, row.p_null, A, V1, X1, Z, sw, sp, f);
        const double mag = Z + 2.0 * std::abs(A * X1) + std::abs(A * (A * sw)) + fA * fA * (2.0 + sp) +
                           pr.sigma * pr.sigma * (f * sp) * (fA * A) * (2.0 + sp);
        R2 = (f * row.out_R[xu]) * (f * row.out_R[xu]);
        // R^2 = Z + ... + 3 m (f V1)^2 + ...: Z within relZ, (f V1)^2 within relV1 (2 + relV1)
        // and -2 A X1 within eX1
        U2 = bounds::mix_cancellation(m) * mag + relZ * Z +
             relV1 * (2.0 + relV1) * 3.0 * static_cast<double>(pr.keys) * fV1 * fV1 + eX1;
      };
      x1_error();
      assemble();
      // where R^2 cancels (one key with nearly all the weight, a large sigma), X1's and Z's float
      // errors can pass R^2 itself: those sums in double (X1 first, since its error reads Z; then
      // Z, against the R^2 without X1's error; then X1 again against the new R^2)
      auto settle_x1 = [&] {
        if (!x1_float || eX1 <= fsum::kRedo * R2) return;
        X1 = double_sum(pk, row.kr, Ww, x, VCol::v);
        x1_float = false;
        x1_error();
        assemble();
      };
      settle_x1();
      if (relZ > 0 && !(relZ * Z <= fsum::kRedo * R2)) {
        Z = double_sum(pk, row.kr, Zw, x, VCol::squares);
        relZ = 0;
        x1_error();
        assemble();
        settle_x1();
      }
      // an R^2 that cancelled to 0 or below is known only to lie within [0, U2]
      row.rho_out[xu] += R2 > 0 ? U2 / R2 : (U2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);
    }
  }
}

AttnRow mp50_row(const AttnCall& c, index_t b, index_t h, index_t t) {
  AttnRow row;
  row.b = b;
  row.h = h;
  row.t = t;
  row.kr = visible_range(c.s, c.opt, b, t);
  row.exact = true;
  row.has_null = c.opt.normalizer == RowNorm::softmax1;
  const index_t m = row.m(), dh = c.s.d_h, dv = c.s.d_v, hk = h / c.group();
  const double s = c.null_logit(h);
  row.out_mp.assign(static_cast<std::size_t>(dv), mp50(0));
  row.p_mp.assign(static_cast<std::size_t>(m), mp50(0));
  mp50 keys_mp(-kInf);  // the keys-only LSE (lse_convention.hpp)
  if (m == 0) {  // no visible key: Softmax1 puts everything on the null, plain softmax is the documented zero
    row.lse_mp = row.has_null ? mp50(s) : mp50(-kInf);
    row.p_null_mp = row.has_null && s > -kInf ? mp50(1) : mp50(0);
  } else {
    Tensor<mp50> q1({1, 1, 1, dh}), k1({1, 1, m, dh}), v1({1, 1, m, dv});
    const double* qr = c.qrow(b, h, t);
    for (index_t x = 0; x < dh; ++x) q1[x] = mp50(qr[x]);
    for (index_t j = 0; j < m; ++j) {
      const double* kj = c.krow(b, hk, row.kr.begin + j);
      const double* vj = c.vrow(b, hk, row.kr.begin + j);
      for (index_t x = 0; x < dh; ++x) k1(0, 0, j, x) = mp50(kj[x]);
      for (index_t x = 0; x < dv; ++x) v1(0, 0, j, x) = mp50(vj[x]);
    }
    AttentionOptions o;
    o.normalizer = c.opt.normalizer;
    if (row.has_null) o.null_logits = {s};
    o.scale = c.opt.scale;  // unset: 1/sqrt(d_h) in mp50, as the whole-tensor reference
    o.return_probs = true;
    if (!c.opt.bias.empty()) {
      o.bias = Tensor<double>({1, m});
      for (index_t j = 0; j < m; ++j) o.bias(0, j) = attention_bias(c.opt, b, h, t, row.kr.begin + j);
    }
    const AttentionResult<mp50> r = token_attention(q1, k1, v1, o);
    for (index_t x = 0; x < dv; ++x) row.out_mp[static_cast<std::size_t>(x)] = r.out[x];
    for (index_t j = 0; j < m; ++j) row.p_mp[static_cast<std::size_t>(j)] = r.probs[j];
    row.lse_mp = r.lse[0];
    row.p_null_mp = r.p_null[0];
    if (c.lse.keys_only && !keys_lse_from_probs(row.lse_mp, row.p_mp, keys_mp)) {  // a +inf null logit
      o.normalizer = RowNorm::softmax;
      o.null_logits.clear();
      keys_mp = token_attention(q1, k1, v1, o).lse[0];
    }
  }
  // double copies and the bound pieces
  row.out.resize(static_cast<std::size_t>(dv));
  row.p.resize(static_cast<std::size_t>(m));
  for (index_t x = 0; x < dv; ++x) row.out[static_cast<std::size_t>(x)] = static_cast<double>(row.out_mp[static_cast<std::size_t>(x)]);
  for (index_t j = 0; j < m; ++j) row.p[static_cast<std::size_t>(j)] = static_cast<double>(row.p_mp[static_cast<std::size_t>(j)]);
  row.lse = static_cast<double>(row.lse_mp);
  row.p_null = static_cast<double>(row.p_null_mp);
  std::vector<double> dot(static_cast<std::size_t>(m)), Q(dot.size()), bias(dot.size());
  const double* qr = c.qrow(b, h, t);
  for (index_t j = 0; j < m; ++j) {
    const double* kj = c.krow(b, hk, row.kr.begin + j);
    double d = 0, a = 0;
    for (index_t x = 0; x < dh; ++x) {
      d += qr[x] * kj[x];
      a += std::abs(qr[x] * kj[x]);
    }
    dot[static_cast<std::size_t>(j)] = d;
    Q[static_cast<std::size_t>(j)] = a;
    bias[static_cast<std::size_t>(j)] = attention_bias(c.opt, b, h, t, row.kr.begin + j);
  }
  bounds::ProbRow pr;
  Logits lg;
  row_logits(c, row, dot.data(), Q.data(), bias.data(), lg);
  row_pieces(c, row, lg, pr, &keys_mp);
  row.rho = 0;
  row.G1.assign(static_cast<std::size_t>(dv), 0.0);
  row.V1 = row.absv = row.out_R = row.rho_out = row.err_out = row.G1;
  for (index_t x = 0; x < dv; ++x) {
    double V1 = 0, G1 = 0, absv = 0;
    std::vector<double> vc(static_cast<std::size_t>(m));
    for (index_t j = 0; j < m; ++j) {
      const auto ju = static_cast<std::size_t>(j);
      vc[ju] = c.vrow(b, hk, row.kr.begin + j)[x];
      const double av = std::abs(vc[ju]);
      V1 += row.p[ju] * av;
      G1 += row.p_wc[ju] * av;
      absv += av;
    }
    const auto xu = static_cast<std::size_t>(x);
    row.V1[xu] = V1;
    row.G1[xu] = G1;
    row.absv[xu] = absv;
    row.out_R[xu] = bounds::prob_mix(pr, row.p.data(), vc.data(), 1, m, row.p_null, row.out[xu]);
  }
  return row;
}

}  // namespace oasis::verify::detail
