// src/verify/attention_backward_oracle_keys.cpp — the blocked backward oracle's stored forward
// and its per-key results: dk, dv and their bounds (attention_backward_oracle.hpp).
#include "attention_backward_oracle_impl.hpp"

namespace oasis::verify::detail::backward_oracle {

/// The stored forward's pieces of a tile (stored_forward_bounds; attention_bounds' out):
/// O = P V, [V1, G1] = [P, P1] |V| as products, then per row eps, dD and the weights of
/// Z^T |q| (Z_j = eps |dz_j| + (1 + eps) p_j dD, dD = dDx + u d_v aD) and eps P^T |dO|.
void Oracle::stored_rows(index_t b, index_t h, index_t t0, index_t n, std::vector<RowInfo>& ri, index_t lo, index_t L,
                         index_t Lp, Work& w) {
  const kernels::Gemm& g = kernels::oracle_gemm();
  const index_t dv = c.s.d_v, dvp = c.dvp;
  const std::size_t nL = at(n * Lp);
  const bounds::StoredForward& sf = *req.stored;
  w.CO.assign(at(n * dvp), 0.0), w.CV1.assign(w.CO.size(), 0.0), w.CG1.assign(w.CO.size(), 0.0);
  const double* P = w.LK.data() + nL;  // the rows' probabilities, [n x Lp]
  if (L > 0) {
    g.gemm(P, Lp, w.vx.data() + lo * dvp, dvp, w.CO.data(), dvp, n, dvp, L, false);
    g.gemm(P, Lp, w.va.data() + lo * dvp, dvp, w.CV1.data(), dvp, n, dvp, L, false);
    g.gemm(w.LX.data(), Lp, w.va.data() + lo * dvp, dvp, w.CG1.data(), dvp, n, dvp, L, false);
  }
  const bounds::Precision pf = bounds::Precision::of<float>(), pd = bounds::Precision::of<double>();
  for (index_t r = 0; r < n; ++r) {
    RowInfo& info = ri[at(r)];
    const index_t t = t0 + r, m = info.kr.count(), off = m > 0 ? info.kr.begin - lo : 0;
    const double mm = static_cast<double>(m);
    double* O = Call::row(res.fwd.out, c.bthd(), b, h, t);
    double* Bf = Call::row(res.fwd_float.out, c.bthd(), b, h, t);
    double* Bd = Call::row(res.fwd_double.out, c.bthd(), b, h, t);
    const double* orow = Call::row(c.d.out, c.bthd(), b, h, t);
    const double* so = sf.out ? Call::row(*sf.out, c.bthd(), b, h, t) : nullptr;
    const double *vb = w.vpre.data() + (m > 0 ? info.kr.begin : 0) * dv, *ve = w.vpre.data() + (m > 0 ? info.kr.end : 0) * dv;
    double eD = 0, aD = 0;
    for (index_t x = 0; x < dv; ++x) {
      const double o = w.CO[at(r * dvp + x)], V1 = w.CV1[at(r * dvp + x)], G1 = w.CG1[at(r * dvp + x)];
      const double absv = m > 0 ? range_sum(vb[x], ve[x], c.s.Tk) : 0.0;
      O[x] = o;
      Bf[x] = kSecondOrder * (pf.u * (G1 + mm * V1) + pf.p_floor * absv) + bounds::underflow_floor(pf, m);
      Bd[x] = kSecondOrder * (pd.u * (G1 + mm * V1) + pd.p_floor * absv) + bounds::underflow_floor(pd, m);
      const double ga = std::abs(orow[x]), dev = so ? std::abs(so[x] - o) : sf.out_u * std::max(std::abs(o), sf.out_min);
      eD += ga * dev;
      aD += ga * (std::abs(o) + dev);
    }
    if (!std::isfinite(info.lse)) continue;  // no visible key and no null: exact
    info.eps = sf.lse ? std::expm1(std::abs((*sf.lse)(b, h, t) - info.lse)) : 0.0;
    info.dDx = eD + info.eps * info.absD;
    info.aD = aD;
    const double *Pr = P + r * Lp, *dz = w.LK.data() + r * Lp;
    double* Zs0 = w.LX.data() + 3 * nL + r * Lp;  // zero outside the row's keys (tile)
    double* Zs1 = w.LX.data() + 4 * nL + r * Lp;
    double* ep = w.LX.data() + 5 * nL + r * Lp;
    for (index_t j = 0; j < m; ++j) {
      const index_t col = off + j;
      Zs0[col] = info.eps * std::abs(dz[col]) + (1.0 + info.eps) * Pr[col] * info.dDx;
      Zs1[col] = (1.0 + info.eps) * Pr[col] * static_cast<double>(dv) * aD;
      ep[col] = info.eps * Pr[col];
      if (!c.opt.bias.empty()) {
        const index_t ob = attention_bias_offset(c.opt, b, h, t, info.kr.begin + j);
        bias_sums.Zs0[ob] += Zs0[col], bias_sums.Zs1[ob] += Zs1[col];
      }
    }
    if (c.has_null) {
      const double wn = std::abs(info.pn * (info.dpn - info.Dt + info.dl));
      const std::size_t bh = at((b * c.s.H + h) * parts + w.part);
      for (std::size_t y = 0; y < 2; ++y) {
        const double u = y ? pd.u : pf.u;
        null_fixed[bh * 2 + y] +=
            kSecondOrder * (info.eps * wn + (1.0 + info.eps) * info.pn * (info.dDx + u * static_cast<double>(dv) * aD));
      }
    }
  }
}

void Oracle::finish_keys(index_t b, index_t hk, const KeySums& ks) {
  unit_maxW[at(b * c.s.H_kv + hk)] = ks.maxW, unit_maxPE[at(b * c.s.H_kv + hk)] = ks.maxPE;
  const index_t dh = c.s.d_h, dv = c.s.d_v, dhp = c.dhp, dvp = c.dvp;
  const bounds::Precision pf = bounds::Precision::flushing<float>();
  const double Kp = kSecondOrder * req.lambda * pf.u, scale = c.scale;
  const std::size_t ns = specs.size();
  std::vector<double*> wk(ns), wv(ns);
  const std::pair<double, bounds::AttentionBackwardBounds*> fixed[] = {
      {bounds::Precision::of<float>().u, &res.fixed_float}, {bounds::Precision::of<double>().u, &res.fixed_double}};
  for (index_t j = 0; j < c.s.Tk; ++j) {
    const double n = ks.cnt[at(j)];
    const double *gk = ks.gk.data() + j * dhp, *SkZ1 = ks.SkZ1.data() + j * dhp, *Ak = ks.Ak.data() + j * dhp;
    const double *gv = ks.gv.data() + j * dvp, *Sv1 = ks.Sv1.data() + j * dvp, *Av = ks.Av.data() + j * dvp;
    double* rk = Call::row(res.ref.k, c.bthd(), b, hk, j);
    double* rv = Call::row(res.ref.v, c.bthd(), b, hk, j);
    for (std::size_t y = 0; y < ns; ++y)
      wk[y] = Call::row(outs[y]->k, c.bthd(), b, hk, j), wv[y] = Call::row(outs[y]->v, c.bthd(), b, hk, j);
    for (index_t x = 0; x < dh; ++x) {
      rk[x] = scale * gk[x];
      for (std::size_t y = 0; y < ns; ++y) {
        const Spec& sp = specs[y];
        const double Fk = n > 0 ? ((sp.pfo + sp.fz) * ks.maxW + sp.pfo * ks.maxPE + 2.0 * sp.fz) * ks.absq[at(x)] : 0.0;
        wk[y][x] = kSecondOrder * (scale * (sp.u * SkZ1[x] + Fk + (n + 3.0) * sp.u * Ak[x]) + (n + 3.0) * sp.fz) + sp.pfl;
      }
    }
    for (index_t x = 0; x < dv; ++x) {
      rv[x] = gv[x];
      for (std::size_t y = 0; y < ns; ++y) {
        const Spec& sp = specs[y];
        const double Sv = sp.u * Sv1[x] + (n > 0 ? (sp.pfo + sp.fz) * ks.abso[at(x)] + sp.fz * n : 0.0);
        wv[y][x] = kSecondOrder * (Sv + n * sp.u * Av[x]) + sp.pfl;
      }
    }
    if (req.prob) {
      const double np = ks.cntp[at(j)];  // rows with a finite LSE (prob_attention_backward_bounds)
      double* pk = Call::row(res.prob.k, c.bthd(), b, hk, j);
      double* pv = Call::row(res.prob.v, c.bthd(), b, hk, j);
      const double *R2k = ks.R2k.data() + j * dhp, *R2v = ks.R2v.data() + j * dvp;
      for (index_t x = 0; x < dh; ++x) {
        const double Fk = np > 0 ? pf.flush * (ks.maxW + 2.0) * ks.absq[at(x)] : 0.0;
        pk[x] = Kp * scale * std::sqrt(R2k[x] + (np + 4.0) * sq(Ak[x])) + kSecondOrder * (scale * Fk + (np + 3.0) * pf.flush) +
                pf.p_floor;
      }
      for (index_t x = 0; x < dv; ++x) {
        const double Fv = np > 0 ? pf.flush * (ks.abso[at(x)] + np) : 0.0;
        pv[x] = Kp * std::sqrt(R2v[x] + (np + 1.0) * sq(Av[x])) + kSecondOrder * (Fv + (np + 1.0) * pf.flush) + pf.p_floor;
      }
    }
    if (req.stored)
      for (const auto& [u, out] : fixed) {
        if (out->k.empty()) continue;
        double* fk = Call::row(out->k, c.bthd(), b, hk, j);
        double* fv = Call::row(out->v, c.bthd(), b, hk, j);
        for (index_t x = 0; x < dh; ++x) fk[x] = kSecondOrder * scale * (ks.Fk0[at(j * dhp + x)] + u * ks.Fk1[at(j * dhp + x)]);
        for (index_t x = 0; x < dv; ++x) fv[x] = req.stored->lse ? kSecondOrder * ks.Fv[at(j * dvp + x)] : 0.0;
      }
  }
}

}  // namespace oasis::verify::detail::backward_oracle
