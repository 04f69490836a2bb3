// src/verify/attention_backward_oracle_rows.cpp — the per-key passes of a row of the blocked
// backward oracle (Oracle::tile, attention_backward_oracle.cpp) that need no reference function:
// the scores' error pieces, the row's sums and the products' weights. On a row without a bias each
// is a few loops over the row's keys without branches, their sums vector reductions, compiled per
// instruction set (row_clones.hpp); a bias's masked keys take two scalar loops. The sums run in
// another order than one key after the other and the clones may fuse a multiply-add: the bounds'
// evaluation moves by about m u relative to their sums of magnitudes, inside the margins the oracle
// gives its bounds (docs/tolerances.md, "The fast oracle"). The reference's own functions
// (normalize_row, normalize_row_backward) and the forward's bounds (row_bound_into, prob_row_into)
// stay in tile.
#include <algorithm>
#include <cmath>

#include "attention_backward_oracle_impl.hpp"
#include "oasis/grad/backward_prob_bounds.hpp"
#include "row_clones.hpp"

namespace oasis::verify::detail::backward_oracle {

OASIS_ROW_CLONES ScorePieces score_pieces(const RowKeys& k, index_t dh, double scale, bool has_bias, double* zc,
                                          double* zeta2) {
  double maxQ = 0, maxz = 0;
  const double *S = k.S, *AQ = k.AQ, *bias = k.bias, *z = k.z;
  if (!has_bias) {  // no key masked (the loop with the mask below stays scalar: GCC moves the formulas under it)
#pragma omp simd
    for (index_t j = 0; j < k.m; ++j) {
      const double sd = scale * S[j];
      zc[j] = bounds::score_error(dh, scale, AQ[j], sd, 0.0, false);
      zeta2[j] = bounds::score_zeta2(dh, scale, AQ[j], sd, 0.0, z[j]);
    }
    // (the maxima in a loop of their own: with the stores in the same loop, only the AVX-512
    // version vectorised)
#pragma omp simd reduction(max : maxQ, maxz)
    for (index_t j = 0; j < k.m; ++j) {
      const double az = std::abs(z[j]);
      maxQ = AQ[j] > maxQ ? AQ[j] : maxQ;
      maxz = az > maxz ? az : maxz;
    }
    return {maxQ, maxz};
  }
  for (index_t j = 0; j < k.m; ++j) {
    const double bj = bias[j], sd = scale * S[j];
    if (std::isinf(bj)) {  // a -inf bias masks the key: zc and zeta2 0, outside the maxima
      zc[j] = zeta2[j] = 0.0;
      continue;
    }
    zc[j] = bounds::score_error(dh, scale, AQ[j], sd, bj, true);
    zeta2[j] = bounds::score_zeta2(dh, scale, AQ[j], sd, bj, z[j]);
    maxQ = std::max(maxQ, AQ[j]);
    maxz = std::max(maxz, std::abs(z[j]));
  }
  return {maxQ, maxz};
}

OASIS_ROW_CLONES RowSums row_sums(const RowKeys& k, const RowScalars& s, index_t dv, bool has_bias, bool prob,
                                  double* kap2) {
  const double *p = k.p, *x = k.x, *p1 = k.p1, *AX = k.AX;
  const double adpn = std::abs(s.dpn);
  double Dt = 0, absD = 0, sp1x = 0, spax = 0, sabsx = 0, sp1 = 0;
#pragma omp simd reduction(+ : Dt, absD, sp1x, spax, sabsx, sp1)
  for (index_t j = 0; j < k.m; ++j) {
    const double pj = p[j], ax = std::abs(x[j]);
    Dt += pj * x[j];
    absD += pj * ax;
    sp1x += p1[j] * ax;
    spax += pj * AX[j];
    sabsx += ax;
    sp1 += p1[j];
  }
  RowSums r;
  r.Dt = s.pn * s.dpn + Dt;
  r.absD = s.pn * adpn + absD;
  r.sp1x = sp1x, r.spax = spax, r.sabsx = sabsx, r.sp1 = sp1;
  if (!prob) return r;
  // RD2 of prob_attention_backward_bounds: kappa_j^2 = zeta2_j + (z_j - lse)^2 + 5 (0 for a masked
  // key: without a bias every z_j is finite, inputs exact in float), R(dp_j) = sqrt(d_v + 1) sum_c
  // |dO_c v_jc|
  const double *zeta2 = k.zeta2, *z = k.z, rd = bounds::r_dp_scale(dv), lse = s.lse;
  if (!has_bias) {
#pragma omp simd
    for (index_t j = 0; j < k.m; ++j) {
      const double zl = z[j] - lse;
      kap2[j] = zeta2[j] + zl * zl + 5.0;
    }
  } else {
    for (index_t j = 0; j < k.m; ++j) {
      const double zl = z[j] - lse;
      kap2[j] = std::isinf(z[j]) ? 0.0 : zeta2[j] + zl * zl + 5.0;
    }
  }
  double RD2 = 0;
#pragma omp simd reduction(+ : RD2)
  for (index_t j = 0; j < k.m; ++j) {
    const double pj = p[j], a = pj * (std::abs(x[j]) + adpn), pr = pj * (rd * AX[j]);
    RD2 += a * a * kap2[j] + pr * pr + a * a;
  }
  r.RD2 = sq(s.pn * s.dpn) * s.kap2n + RD2 + static_cast<double>(k.m + 1) * sq(r.absD + std::max(0.0, 1.0 - s.pn) * adpn);
  return r;
}

namespace {

/// row_weights' loop, with or without the probabilistic terms.
template <bool Prob>
__attribute__((always_inline)) inline RowMaxima weights_loop(const RowKeys& k, const RowScalars& s, const RowSums& rs,
                                                             index_t dv_, const RowWeightsOut& o) {
  const double *p = k.p, *x = k.x, *dz = k.dz, *p1 = k.p1, *AX = k.AX, *kap2 = k.kap2;
  const double Dt = rs.Dt, dl = s.dl, adpn = std::abs(s.dpn), ED1 = s.ED1, dv = static_cast<double>(dv_);
  const double rd = bounds::r_dp_scale(dv_), RD2 = rs.RD2, RL = s.RL, r16 = s.r16, n16 = s.n16;
  double *oZ1 = o.Z1, *odz = o.dz, *op = o.p, *oadz = o.adz, *op1 = o.p1, *oa = o.a, *oown2 = o.own2, *oXk = o.Xk, *oXv = o.Xv;
  double maxW = 0, maxp = 0;
#pragma omp simd reduction(max : maxW, maxp)
  for (index_t j = 0; j < k.m; ++j) {
    const double pj = p[j], xj = x[j], wj = (xj - Dt) + dl, aw = std::abs(wj), dzj = dz[j];
    oZ1[j] = p1[j] * aw + pj * (dv * AX[j] + ED1 + std::abs(xj - Dt) + 2.0 * aw + adpn);
    maxW = aw > maxW ? aw : maxW;
    maxp = pj > maxp ? pj : maxp;
    odz[j] = dzj, op[j] = pj, oadz[j] = std::abs(dzj), op1[j] = p1[j];
    if constexpr (Prob) {
      // prob_attention_backward_bounds' terms of the key: its own R^2, the dk and dv sides' weights
      const double a = pj * (std::abs(wj - Dt) + adpn), pr = pj * (rd * AX[j]), m16 = std::max(std::abs(dzj), n16);
      const double own2 = sq(wj * pj) * kap2[j] + pr * pr + sq(pj * (xj - Dt)) + sq(pj * wj) + dzj * dzj +
                          r16 * (m16 * m16) + sq(pj * (std::abs(xj) + adpn));
      const double mp16 = std::max(pj, n16);
      oa[j] = a, oown2[j] = own2;
      oXk[j] = 2.0 * own2 + 2.0 * (pj * pj) * RD2 + sq(a * RL);
      oXv[j] = (pj * pj) * (kap2[j] + RL * RL + 1.0) + r16 * (mp16 * mp16);
    } else {
      oa[j] = 0.0, oown2[j] = 0.0, oXk[j] = 0.0, oXv[j] = 0.0;
    }
  }
  return {maxW, maxp};
}

}  // namespace

OASIS_ROW_CLONES RowMaxima row_weights(const RowKeys& k, const RowScalars& s, const RowSums& rs, index_t dv, bool prob,
                                       const RowWeightsOut& o) {
  return prob ? weights_loop<true>(k, s, rs, dv, o) : weights_loop<false>(k, s, rs, dv, o);
}

}  // namespace oasis::verify::detail::backward_oracle
