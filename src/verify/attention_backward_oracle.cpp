// src/verify/attention_backward_oracle.cpp — the blocked double oracle of attention_backward
// (attention_backward_oracle.hpp; the bounds' derivation: docs/tolerances.md, "Backward").
#include <exception>
#include <limits>

#include "attention_backward_oracle_impl.hpp"
#include "oasis/grad/backward_prob_bounds.hpp"

namespace oasis::verify::detail {
namespace backward_oracle {

void Oracle::pack(index_t b, index_t hk, Work& w) const {
  const index_t Tk = c.s.Tk, dh = c.s.d_h, dv = c.s.d_v, tkp = round_up(Tk, kColumnQuantum) + kColumnQuantum;
  w.kt.assign(at(dh * tkp), 0.0);
  w.kta.assign(w.kt.size(), 0.0);
  w.vt.assign(at(dv * tkp), 0.0);
  w.vta.assign(w.vt.size(), 0.0);
  w.kx.assign(at(Tk * c.dhp), 0.0);
  w.ka.assign(w.kx.size(), 0.0);
  w.k2.assign(w.kx.size(), 0.0);
  w.kpre.assign(at((Tk + 1) * dh), 0.0);
  for (index_t j = 0; j < Tk; ++j) {
    const double* kj = Call::row(c.k, c.bthd(), b, hk, j);
    const double* vj = Call::row(c.v, c.bthd(), b, hk, j);
    for (index_t x = 0; x < dh; ++x) {
      w.kt[at(x * tkp + j)] = kj[x];
      w.kta[at(x * tkp + j)] = std::abs(kj[x]);
      w.kx[at(j * c.dhp + x)] = kj[x];
      w.ka[at(j * c.dhp + x)] = std::abs(kj[x]);
      w.k2[at(j * c.dhp + x)] = kj[x] * kj[x];
      w.kpre[at((j + 1) * dh + x)] = w.kpre[at(j * dh + x)] + std::abs(kj[x]);
    }
    for (index_t x = 0; x < dv; ++x) {
      w.vt[at(x * tkp + j)] = vj[x];
      w.vta[at(x * tkp + j)] = std::abs(vj[x]);
    }
  }
  if (!req.stored) return;
  w.vx.assign(at(Tk * c.dvp), 0.0);
  w.va.assign(w.vx.size(), 0.0);
  w.vpre.assign(at((Tk + 1) * dv), 0.0);
  for (index_t j = 0; j < Tk; ++j) {
    const double* vj = Call::row(c.v, c.bthd(), b, hk, j);
    for (index_t x = 0; x < dv; ++x) {
      w.vx[at(j * c.dvp + x)] = vj[x];
      w.va[at(j * c.dvp + x)] = std::abs(vj[x]);
      w.vpre[at((j + 1) * dv + x)] = w.vpre[at(j * dv + x)] + std::abs(vj[x]);
    }
  }
}

void Oracle::tile(index_t b, index_t hk, index_t h, index_t t0, index_t n, Work& w, KeySums& ks) {
  const kernels::Gemm& g = kernels::oracle_gemm();
  const index_t Tk = c.s.Tk, dh = c.s.d_h, dv = c.s.d_v, dhp = c.dhp, dvp = c.dvp;
  const index_t tkp = round_up(Tk, kColumnQuantum) + kColumnQuantum;
  const double sl = c.null_logit(h), scale = c.scale;
  const bool has_bias = !c.opt.bias.empty();
  const double u16r = req.u16 / bounds::Precision::flushing<float>().u, r16 = u16r * u16r;
  std::vector<RowInfo> ri(at(n));
  index_t lo = Tk, hi = 0;
  for (index_t r = 0; r < n; ++r) {
    ri[at(r)].kr = visible_range(c.s, c.opt, b, t0 + r);
    if (ri[at(r)].kr.count() > 0) lo = std::min(lo, ri[at(r)].kr.begin), hi = std::max(hi, ri[at(r)].kr.end);
  }
  if (hi <= lo) lo = hi = 0;
  const index_t L = hi - lo, Lp = round_up(std::max<index_t>(L, 1), kColumnQuantum);
  // the tile's rows: q, |q|, q^2 and dO, |dO|, dO^2
  w.qb.assign(at(n * dh), 0.0), w.qa.assign(w.qb.size(), 0.0);
  w.ob.assign(at(n * dv), 0.0), w.oa.assign(w.ob.size(), 0.0);
  w.qB.assign(at(n * dhp), 0.0), w.qaB.assign(w.qB.size(), 0.0), w.q2B.assign(w.qB.size(), 0.0);
  w.oB.assign(at(n * dvp), 0.0), w.oaB.assign(w.oB.size(), 0.0), w.o2B.assign(w.oB.size(), 0.0);
  for (index_t r = 0; r < n; ++r) {
    const double* qr = Call::row(c.q, c.bthd(), b, h, t0 + r);
    const double* orow = Call::row(c.d.out, c.bthd(), b, h, t0 + r);
    for (index_t x = 0; x < dh; ++x) {
      w.qb[at(r * dh + x)] = w.qB[at(r * dhp + x)] = qr[x];
      w.qa[at(r * dh + x)] = w.qaB[at(r * dhp + x)] = std::abs(qr[x]);
      w.q2B[at(r * dhp + x)] = qr[x] * qr[x];
      ks.absq[at(x)] += std::abs(qr[x]);
    }
    for (index_t x = 0; x < dv; ++x) {
      w.ob[at(r * dv + x)] = w.oB[at(r * dvp + x)] = orow[x];
      w.oa[at(r * dv + x)] = w.oaB[at(r * dvp + x)] = std::abs(orow[x]);
      w.o2B[at(r * dvp + x)] = orow[x] * orow[x];
      ks.abso[at(x)] += std::abs(orow[x]);
    }
  }
  const std::size_t nL = at(n * Lp);
  for (Vec* m : {&w.S, &w.AQ, &w.dP, &w.AX}) m->resize(nL);
  // the weights, row-major: LK = [dz; p] (times K), LA = [Z1; |dz|; a (; p stored)] (|K|), L2 = own2
  // (K^2), LX = [p1; Xk; Xv (; Zs0; Zs1; eps p stored)] (transposed only); each row is zero outside
  // its keys
  const index_t la = req.stored ? 4 : 3, lx = req.stored ? 6 : 3;
  w.LK.resize(2 * nL), w.LA.resize(at(la) * nL), w.L2.resize(nL), w.LX.resize(at(lx) * nL);
  if (L > 0) {
    g.gemm(w.qb.data(), dh, w.kt.data() + lo, tkp, w.S.data(), Lp, n, Lp, dh, false);
    g.gemm(w.qa.data(), dh, w.kta.data() + lo, tkp, w.AQ.data(), Lp, n, Lp, dh, false);
    g.gemm(w.ob.data(), dv, w.vt.data() + lo, tkp, w.dP.data(), Lp, n, Lp, dv, false);
    g.gemm(w.oa.data(), dv, w.vta.data() + lo, tkp, w.AX.data(), Lp, n, Lp, dv, false);
  }
  const std::size_t ns = specs.size();
  if (!has_bias && w.bias.size() < at(Tk)) w.bias.assign(at(Tk), 0.0);  // the rows' bias: 0 everywhere
  for (index_t r = 0; r < n; ++r) {
    const index_t t = t0 + r;
    RowInfo& info = ri[at(r)];
    // a row without a key (a window past the padding) may start anywhere: its weights are all zero
    const index_t m = info.kr.count(), off = m > 0 ? info.kr.begin - lo : 0;
    // set below (kap2 on probabilistic rows only, read only there)
    for (Vec* x : {&w.z, &w.zc, &w.p, &w.x, &w.dz, &w.zeta2, &w.kap2}) x->resize(at(m));
    if (has_bias) w.bias.resize(at(m));
    const double *S = w.S.data() + r * Lp + off, *AQ = w.AQ.data() + r * Lp + off;
    const double *dP = w.dP.data() + r * Lp + off, *AX = w.AX.data() + r * Lp + off;
    if (has_bias)
      for (index_t j = 0; j < m; ++j) w.bias[at(j)] = attention_bias(c.opt, b, h, t, info.kr.begin + j);
    const double* bias = w.bias.data();
#pragma omp simd
    for (index_t j = 0; j < m; ++j) {
      w.z[at(j)] = scale * S[j] + bias[j];  // score_row's z (a -inf bias masks the key)
      w.x[at(j)] = dP[j];
    }
    // the reference row: the forward's normaliser and its backward, as token_attention_backward
    const RowStats<double> st = normalize_row(c.opt.normalizer, w.z.data(), m, sl, w.p.data(), c.opt.norm_params,
                                              c.opt.masked_row, "scores");
    const double pn = st.p_null, lse = st.lse, dpn = c.dpn(b, h, t), dl = c.dlse(b, h, t);
    info.pn = pn, info.lse = lse, info.dpn = dpn, info.dl = dl;
    res.fwd.lse(b, h, t) = lse;
    res.fwd.p_null(b, h, t) = pn;
    const double ds = normalize_row_backward(c.opt.normalizer, w.p.data(), pn, m, w.x.data(), dpn, dl, w.dz.data());
    const std::size_t bh = at((b * c.s.H + h) * parts + w.part);  // this part's null partials
    if (c.has_null) gnull[bh] += ds;
    RowKeys k;
    k.m = m, k.S = S, k.AQ = AQ, k.bias = bias, k.z = w.z.data(), k.p = w.p.data(), k.x = w.x.data(), k.dz = w.dz.data();
    k.AX = AX, k.zeta2 = w.zeta2.data(), k.kap2 = w.kap2.data();
    // the forward's probability bounds at u = 1 (attention_bounds: P_j = u p1_j + 2 denorm_min)
    const ScorePieces sc = score_pieces(k, dh, scale, has_bias, w.zc.data(), w.zeta2.data());
    bounds::row_bound_into(bounds::Precision{1.0, 0.0}, c.opt.normalizer, w.z.data(), w.zc.data(), m, sl, std::abs(sl),
                           w.p.data(), pn, lse, w.rb);
    const bounds::RowBound& b1 = w.rb;
    k.p1 = b1.p.data();
    const double Pn1 = c.has_null ? b1.p_null : 0.0;
    if (req.stored) {
      res.fwd_float.lse(b, h, t) = bounds::Precision::of<float>().u * b1.lse;
      res.fwd_double.lse(b, h, t) = bounds::Precision::of<double>().u * b1.lse;
    }
    // the probabilistic row model (prob_attention_backward_bounds), for rows with a finite LSE
    info.prob = req.prob && std::isfinite(lse);
    const bool null_grad = c.has_null;  // finite null logits only (fast_backward_applies)
    RowScalars rs{pn, dpn, dl, lse, null_grad ? sl * sl + sq(sl - lse) + 5.0 : 0.0, 0.0, 0.0, r16, req.n16};
    const RowSums sums = row_sums(k, rs, dv, has_bias, info.prob, w.kap2.data());
    const double Dt = sums.Dt, absD = sums.absD;
    info.Dt = Dt, info.absD = absD;
    // ED = u ED1 + 2 denorm_min EDf (attention_backward_bounds' ED, its floors apart)
    const double ED1 = Pn1 * std::abs(dpn) + sums.sp1x + static_cast<double>(dv) * sums.spax +
                       static_cast<double>(m + 1) * absD + (sums.sp1 + static_cast<double>(m + 1) * std::max(0.0, 1.0 - pn)) * std::abs(dpn);
    info.EDf = (c.has_null ? std::abs(dpn) : 0.0) + sums.sabsx + static_cast<double>(m) * std::abs(dpn);
    rs.ED1 = ED1;
    for (std::size_t x = 0; x < ns; ++x) {  // the null logit's worst-case terms
      if (!c.has_null) break;
      const Spec& sp = specs[x];
      const double wn = dpn - Dt + dl, Pn = sp.u * Pn1 + sp.pfo, ED = sp.u * ED1 + sp.pfo * info.EDf;
      null_S[bh * ns + x] += Pn * std::abs(wn) + pn * (ED + sp.u * std::abs(dpn - Dt) + 2.0 * sp.u * std::abs(wn)) +
                             sp.fz * (std::abs(wn) + 3.0);
    }
    if (c.has_null) null_A[bh] += std::abs(pn * (dpn - Dt + dl)), null_n[bh] += 1;
    if (info.prob) {
      bounds::prob_row_into(c.opt.normalizer, w.z.data(), w.zeta2.data(), m, sl, sl * sl, scale * sc.maxQ + sc.maxz,
                            w.p.data(), pn, lse, false, w.pr);
      info.RL = rs.RL = std::sqrt(sq(w.pr.lse) + sq(lse)) + 2.0 * w.pr.sigma;
      info.RD2 = sums.RD2;
      if (null_grad) {
        const double wn = dpn - Dt + dl, dsn = pn * wn;
        null_R2[bh] += 2.0 * sq(pn * wn) * rs.kap2n + 2.0 * sq(pn) * info.RD2 +
                       sq(pn * (std::abs(wn - Dt) + std::abs(dpn)) * info.RL) + sq(pn * (dpn - Dt)) + 2.0 * sq(dsn);
      }
    }
    // the per-(row, key) weights of the products (dq side: against K, |K|, K^2; their transposes
    // against q, |q|, q^2 and dO, |dO|, dO^2 on the dk and dv sides), zero outside the row's keys
    const RowWeightsOut o{w.LK.data() + r * Lp,      w.LK.data() + nL + r * Lp, w.LA.data() + r * Lp,
                          w.LA.data() + nL + r * Lp, w.LX.data() + r * Lp,      w.LA.data() + 2 * nL + r * Lp,
                          w.L2.data() + r * Lp,      w.LX.data() + nL + r * Lp, w.LX.data() + 2 * nL + r * Lp};
    for (double* base : {o.dz, o.p, o.Z1, o.adz, o.p1, o.a, o.own2, o.Xk, o.Xv}) {
      std::fill(base, base + off, 0.0);
      std::fill(base + off + m, base + Lp, 0.0);
    }
    const RowWeightsOut at_keys{o.dz + off, o.p + off, o.Z1 + off, o.adz + off, o.p1 + off,
                                o.a + off,  o.own2 + off, o.Xk + off, o.Xv + off};
    const RowMaxima mx = row_weights(k, rs, sums, dv, info.prob, at_keys);
    info.maxW = mx.maxW, info.maxp = mx.maxp;
    ks.maxPE = std::max(ks.maxPE, mx.maxp * info.EDf);  // max_j p_j EDf (rounding is monotone)
    if (req.stored) {
      double* ps = w.LA.data() + 3 * nL + r * Lp;
      std::fill_n(ps, Lp, 0.0);
      std::copy(w.p.data(), w.p.data() + m, ps + off);
      for (index_t y = 3; y < 6; ++y) std::fill_n(w.LX.data() + at(y) * nL + r * Lp, Lp, 0.0);
    }
    if (has_bias)  // dbias: dz summed over the dimensions the bias broadcasts over
      for (index_t j = 0; j < m; ++j) {
        const index_t ob = attention_bias_offset(c.opt, b, h, t, info.kr.begin + j);
        bias_sums.g[ob] += w.dz[at(j)], bias_sums.SZ1[ob] += at_keys.Z1[j], bias_sums.A[ob] += std::abs(w.dz[at(j)]);
        bias_sums.cnt[ob] += 1;
        if (info.prob) bias_sums.R2[ob] += at_keys.Xk[j], bias_sums.cntp[ob] += 1;
      }
    ks.maxW = std::max(ks.maxW, info.maxW);
    // (a row with keys but no finite LSE, all of them masked by a bias, is outside the probabilistic
    // bound's count, as prob_attention_backward_bounds skips it)
    const double cp = info.prob ? 1.0 : 0.0;
#pragma omp simd
    for (index_t j = info.kr.begin; j < info.kr.end; ++j) ks.cnt[at(j)] += 1.0, ks.cntp[at(j)] += cp;
  }
  w.CK.resize(at(2 * n * dhp)), w.CA.resize(at(la * n * dhp)), w.C2.resize(at(n * dhp));
  if (req.stored) stored_rows(b, h, t0, n, ri, lo, L, Lp, w);
  if (L > 0) {
    g.gemm(w.LK.data(), Lp, w.kx.data() + lo * dhp, dhp, w.CK.data(), dhp, 2 * n, dhp, L, false);
    g.gemm(w.LA.data(), Lp, w.ka.data() + lo * dhp, dhp, w.CA.data(), dhp, la * n, dhp, L, false);
    g.gemm(w.L2.data(), Lp, w.k2.data() + lo * dhp, dhp, w.C2.data(), dhp, n, dhp, L, false);
    // the dk and dv sides: sums over the tile's rows, C[lo + j] += W^T B for a weight block W
    auto acc = [&](const double* W, const Vec& B, Vec& C, index_t ld) {
      g.gemm_at(W, Lp, B.data(), ld, C.data() + lo * ld, ld, L, ld, n, true);
    };
    acc(w.LK.data(), w.qB, ks.gk, dhp), acc(w.LA.data(), w.qaB, ks.SkZ1, dhp), acc(w.LA.data() + nL, w.qaB, ks.Ak, dhp);
    acc(w.LK.data() + nL, w.oB, ks.gv, dvp), acc(w.LK.data() + nL, w.oaB, ks.Av, dvp), acc(w.LX.data(), w.oaB, ks.Sv1, dvp);
    if (req.prob) acc(w.LX.data() + nL, w.q2B, ks.R2k, dhp), acc(w.LX.data() + 2 * nL, w.o2B, ks.R2v, dvp);
    if (req.stored) {
      acc(w.LX.data() + 3 * nL, w.qaB, ks.Fk0, dhp), acc(w.LX.data() + 4 * nL, w.qaB, ks.Fk1, dhp);
      if (req.stored->lse) acc(w.LX.data() + 5 * nL, w.oaB, ks.Fv, dvp);
    }
  } else {
    w.CK.assign(at(2 * n * dhp), 0.0), w.CA.assign(at(la * n * dhp), 0.0), w.C2.assign(at(n * dhp), 0.0);
  }
  // dq and its bounds, row by row
  const bounds::Precision pf = bounds::Precision::flushing<float>();
  const double Kp = kSecondOrder * req.lambda * pf.u;
  for (index_t r = 0; r < n; ++r) {
    const RowInfo& info = ri[at(r)];
    const index_t m = info.kr.count();
    const double mm = static_cast<double>(m);
    double* gq = Call::row(res.ref.q, c.bthd(), b, h, t0 + r);
    const double* pb = w.kpre.data() + (m > 0 ? info.kr.begin : 0) * dh;
    const double* pe = w.kpre.data() + (m > 0 ? info.kr.end : 0) * dh;
    for (index_t x = 0; x < dh; ++x) {
      const double dq = w.CK[at(r * dhp + x)], cD = w.CK[at((n + r) * dhp + x)];
      const double SZ1 = w.CA[at(r * dhp + x)], A = w.CA[at((n + r) * dhp + x)], cL = w.CA[at((2 * n + r) * dhp + x)];
      const double absk = m > 0 ? range_sum(pb[x], pe[x], c.s.Tk) : 0.0;
      gq[x] = scale * dq;
      for (std::size_t y = 0; y < specs.size(); ++y) {
        const Spec& sp = specs[y];
        const double Fq = m > 0 ? ((sp.pfo + sp.fz) * info.maxW + sp.pfo * info.EDf * info.maxp + 2.0 * sp.fz) * absk : 0.0;
        Call::row(outs[y]->q, c.bthd(), b, h, t0 + r)[x] =
            kSecondOrder * (scale * (sp.u * SZ1 + Fq + (mm + 3.0) * sp.u * A) + (mm + 3.0) * sp.fz) + sp.pfl;
      }
      if (req.stored) {  // the stored forward's error: scale sum_j (eps |dz_j| + (1 + eps) p_j dD) |k_jc|
        const double pk = w.CA[at((3 * n + r) * dhp + x)];
        for (auto [u, out] : {std::pair{bounds::Precision::of<float>().u, &res.fixed_float},
                              std::pair{bounds::Precision::of<double>().u, &res.fixed_double}}) {
          if (out->q.empty()) continue;
          const double dD = info.dDx + u * static_cast<double>(dv) * info.aD;
          Call::row(out->q, c.bthd(), b, h, t0 + r)[x] = kSecondOrder * scale * (info.eps * A + (1.0 + info.eps) * dD * pk);
        }
      }
      if (info.prob) {
        const double own = w.C2[at(r * dhp + x)], fl = pf.flush * (info.maxW + 2.0) * absk;
        const double R2 =
            sq(scale) * (2.0 * own + 2.0 * sq(cD) * info.RD2 + sq(cL * info.RL) + (mm + 1.0) * sq(A)) + 3.0 * sq(scale * dq);
        Call::row(res.prob.q, c.bthd(), b, h, t0 + r)[x] =
            Kp * std::sqrt(R2) + kSecondOrder * (scale * fl + (mm + 3.0) * pf.flush) + pf.p_floor;
      }
    }
  }
}

void Oracle::init(KeySums& ks) const {
  const std::size_t kh = at(c.s.Tk * c.dhp), kv = at(c.s.Tk * c.dvp);
  for (Vec* x : {&ks.gk, &ks.SkZ1, &ks.Ak}) x->assign(kh, 0.0);
  for (Vec* x : {&ks.gv, &ks.Sv1, &ks.Av}) x->assign(kv, 0.0);
  if (req.prob) ks.R2k.assign(kh, 0.0), ks.R2v.assign(kv, 0.0);
  if (req.stored) ks.Fk0.assign(kh, 0.0), ks.Fk1.assign(kh, 0.0), ks.Fv.assign(kv, 0.0);
  ks.cnt.assign(at(c.s.Tk), 0.0);
  ks.cntp.assign(at(c.s.Tk), 0.0);
  ks.absq.assign(at(c.s.d_h), 0.0);
  ks.abso.assign(at(c.s.d_v), 0.0);
}

void Oracle::rows(index_t b, index_t hk, index_t i0, index_t i1, Work& w, KeySums& ks) {
  const index_t tph = (c.s.Tq + kRowTile - 1) / kRowTile;  // tiles per query head
  pack(b, hk, w);
  for (index_t i = i0; i < i1; ++i) {
    const index_t h = hk * c.group() + i / tph, t0 = (i % tph) * kRowTile;
    tile(b, hk, h, t0, std::min(kRowTile, c.s.Tq - t0), w, ks);
  }
}

}  // namespace backward_oracle

using namespace backward_oracle;

namespace {

/// The bias's gradient and bounds from its sums (attention_backward_bounds: 1.02 (S + n u A) + floor
/// with S = u SZ1 + sum of the terms' floors; prob_attention_backward_bounds: K sqrt(R2 + (n + 1) A^2)
/// + floors; stored_forward_bounds: 1.02 sum Z), the floors through the pairs' maxima.
void finish_bias(Oracle& o) {
  const auto& bs = o.bias_sums;
  double maxW = 0, maxPE = 0;
  for (std::size_t u = 0; u < o.unit_maxW.size(); ++u) maxW = std::max(maxW, o.unit_maxW[u]), maxPE = std::max(maxPE, o.unit_maxPE[u]);
  const bounds::Precision pf = bounds::Precision::flushing<float>();
  const double Kp = kSecondOrder * o.req.lambda * pf.u;
  o.res.ref.bias = bs.g;
  for (index_t i = 0; i < bs.g.size(); ++i) {
    const double n = bs.cnt[i];
    for (std::size_t y = 0; y < o.specs.size(); ++y) {
      const Spec& sp = o.specs[y];
      const double F = (sp.pfo + sp.fz) * maxW + sp.pfo * maxPE + 2.0 * sp.fz + sp.fz;  // a term's floors
      o.outs[y]->bias[i] = kSecondOrder * (sp.u * bs.SZ1[i] + n * F + n * sp.u * bs.A[i]) + sp.pfl;
    }
    if (o.req.prob) {
      const double np = bs.cntp[i];
      o.res.prob.bias[i] = Kp * std::sqrt(bs.R2[i] + (np + 1.0) * sq(bs.A[i])) +
                           kSecondOrder * (np * pf.flush * (maxW + 3.0) + (np + 1.0) * pf.flush) + pf.p_floor;
    }
    if (o.req.stored)
      for (auto [u, out] : {std::pair{bounds::Precision::of<float>().u, &o.res.fixed_float},
                            std::pair{bounds::Precision::of<double>().u, &o.res.fixed_double}})
        if (!out->bias.empty()) out->bias[i] = kSecondOrder * (bs.Zs0[i] + u * bs.Zs1[i]);
  }
}

}  // namespace

bool fast_backward_applies(const AttentionOptions& opt) {
  if (opt.normalizer != RowNorm::softmax && opt.normalizer != RowNorm::softmax1) return false;
  for (double s : opt.null_logits)
    if (!std::isfinite(s)) return false;
  return true;
}

BackwardOracle fast_attention_backward(const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                                       const AttentionCotangents<double>& d, const AttentionOptions& opt,
                                       const BackwardOracleRequest& req) {
  OASIS_REQUIRE(fast_backward_applies(opt), "options", "the blocked backward oracle takes softmax or softmax1 with finite null logits");
  const Call c(q, k, v, d, opt);
  check_attention_cotangents(c.s, opt, d);
  BackwardOracle res;
  auto shaped = [&](bounds::AttentionBackwardBounds& x) {
    x.q = Tensor<double>(q.shape()), x.k = Tensor<double>(k.shape()), x.v = Tensor<double>(v.shape());
    if (c.has_null) x.null_logits = Tensor<double>({c.s.H});
    if (!opt.bias.empty()) x.bias = Tensor<double>(opt.bias.shape());
  };
  res.ref.q = Tensor<double>(q.shape()), res.ref.k = Tensor<double>(k.shape()), res.ref.v = Tensor<double>(v.shape());
  if (c.has_null) res.ref.null_logits = Tensor<double>({c.s.H});
  const bool has_bias = !opt.bias.empty();
  res.fwd.lse = Tensor<double>({c.s.B, c.s.H, c.s.Tq});
  res.fwd.p_null = Tensor<double>({c.s.B, c.s.H, c.s.Tq});
  Oracle o{c, req, {Spec::of<double>(false)}, res, {&res.own}};  // the rest: their default initialisers
  shaped(res.own);
  if (req.wc_float) o.specs.push_back(Spec::of<float>(true)), o.outs.push_back(&res.wc_float), shaped(res.wc_float);
  if (req.wc_double) o.specs.push_back(Spec::of<double>(true)), o.outs.push_back(&res.wc_double), shaped(res.wc_double);
  if (req.prob) shaped(res.prob);
  if (req.stored) {
    shaped(res.fixed_float);
    if (req.wc_double) shaped(res.fixed_double);
    for (Tensor<double>* x : {&res.fwd.out, &res.fwd_float.out, &res.fwd_double.out}) *x = Tensor<double>(d.out.shape());
    for (Tensor<double>* x : {&res.fwd_float.lse, &res.fwd_double.lse}) *x = Tensor<double>({c.s.B, c.s.H, c.s.Tq});
    if (req.stored->out) OASIS_REQUIRE(req.stored->out->shape() == d.out.shape(), "out", "has shape ",
                                       shape_str(req.stored->out->shape()), ", expected ", shape_str(d.out.shape()));
    if (req.stored->lse) OASIS_REQUIRE(req.stored->lse->shape() == Shape({c.s.B, c.s.H, c.s.Tq}), "lse", "has shape ",
                                       shape_str(req.stored->lse->shape()), ", expected [B, H, Tq]");
  }
  const index_t ns = static_cast<index_t>(o.specs.size());
  // work items: (batch, kv head) pairs, each split into `parts` runs of its tiles when the pairs
  // are fewer than kMinItems (a pair's key sums of every part held at once: at most about 1 GB)
  const index_t units = c.s.B * c.s.H_kv, nt = c.group() * ((c.s.Tq + kRowTile - 1) / kRowTile);
  constexpr index_t kMinItems = 16;
  const double ks_bytes = 8.0 * static_cast<double>(c.s.Tk) * static_cast<double>(12 * c.dhp + 12 * c.dvp);
  // a bias row shared by two (batch, head) rows of different pairs, or of two heads of one pair,
  // gathers their dz: the pairs then run in order, unsplit (the sums' order fixed, no races)
  const Tensor<double>& bi = opt.bias;
  const bool in_order = has_bias && (bi.rank() == 2 ? c.s.B * c.s.H > 1
                                                    : (bi.dim(0) == 1 && c.s.B > 1) || (bi.dim(1) == 1 && c.s.H > 1));
  o.unit_maxW.assign(at(units), 0.0), o.unit_maxPE.assign(at(units), 0.0);
  if (has_bias) {
    auto& bs = o.bias_sums;
    for (Tensor<double>* x : {&bs.g, &bs.SZ1, &bs.A, &bs.cnt}) *x = Tensor<double>(bi.shape());
    if (req.prob) bs.R2 = Tensor<double>(bi.shape()), bs.cntp = Tensor<double>(bi.shape());
    if (req.stored) bs.Zs0 = Tensor<double>(bi.shape()), bs.Zs1 = Tensor<double>(bi.shape());
  }
  if (units < kMinItems && !in_order) {
    const index_t by_memory = static_cast<index_t>(1e9 / (ks_bytes * static_cast<double>(units)));
    o.parts = std::max<index_t>(1, std::min({(kMinItems + units - 1) / units, nt, by_memory}));
  }
  const index_t P = o.parts;
  o.null_S = Tensor<double>({c.s.B, c.s.H, P, ns});
  o.null_fixed = Tensor<double>({c.s.B, c.s.H, P, 2});
  for (Tensor<double>* x : {&o.null_A, &o.null_n, &o.null_R2, &o.gnull}) *x = Tensor<double>({c.s.B, c.s.H, P});
  std::vector<KeySums> sums(P > 1 ? at(units * P) : 0);
  std::exception_ptr err;
  auto guarded = [&err](auto&& f) {
    try {
      f();
    } catch (...) {
#pragma omp critical(oasis_backward_oracle)
      if (!err) err = std::current_exception();
    }
  };
#pragma omp parallel if (!in_order)
  {
    Work w;
#pragma omp for schedule(dynamic)
    for (index_t item = 0; item < units * P; ++item)
      guarded([&] {
        const index_t unit = item / P, b = unit / c.s.H_kv, hk = unit % c.s.H_kv;
        w.part = item % P;
        KeySums local;
        KeySums& ks = P > 1 ? sums[at(item)] : local;
        o.init(ks);
        o.rows(b, hk, w.part * nt / P, (w.part + 1) * nt / P, w, ks);
        if (P == 1) o.finish_keys(b, hk, ks);
      });
    if (P > 1) {  // each pair's parts added in order, then its keys finished
#pragma omp for schedule(dynamic)
      for (index_t unit = 0; unit < units; ++unit)
        guarded([&] {
          KeySums& ks = sums[at(unit * P)];
          for (index_t x = 1; x < P; ++x) ks.add(sums[at(unit * P + x)]), sums[at(unit * P + x)] = KeySums{};
          o.finish_keys(unit / c.s.H_kv, unit % c.s.H_kv, ks);
          ks = KeySums{};
        });
    }
  }
  if (err) std::rethrow_exception(err);
  if (has_bias) finish_bias(o);
  // the null logits: per query head, the batch elements' partial sums in order
  if (c.has_null) {
    const bounds::Precision pf = bounds::Precision::flushing<float>();
    for (index_t h = 0; h < c.s.H; ++h) {
      double A = 0, n = 0, R2 = 0, gsum = 0;
      std::vector<double> S(at(ns), 0.0);
      for (index_t b = 0; b < c.s.B; ++b)
        for (index_t x = 0; x < P; ++x) {
          A += o.null_A(b, h, x), n += o.null_n(b, h, x), R2 += o.null_R2(b, h, x), gsum += o.gnull(b, h, x);
          for (index_t y = 0; y < ns; ++y) S[at(y)] += o.null_S(b, h, x, y);
        }
      res.ref.null_logits[h] = gsum;
      for (auto [y, out] : {std::pair{0, &res.fixed_float}, std::pair{1, &res.fixed_double}}) {
        if (out->null_logits.empty()) continue;
        double f = 0;
        for (index_t b = 0; b < c.s.B; ++b)
          for (index_t x = 0; x < P; ++x) f += o.null_fixed(b, h, x, y);
        out->null_logits[h] = f;
      }
      for (index_t y = 0; y < ns; ++y) {
        const Spec& sp = o.specs[at(y)];
        o.outs[at(y)]->null_logits[h] = kSecondOrder * (S[at(y)] + n * sp.u * A) + sp.pfl;
      }
      if (req.prob)
        res.prob.null_logits[h] = kSecondOrder * req.lambda * pf.u * std::sqrt(R2 + (n + 1.0) * sq(A)) +
                                  kSecondOrder * (n + 1.0) * 3.0 * pf.flush + pf.p_floor;
    }
  }
  return res;
}

}  // namespace oasis::verify::detail
