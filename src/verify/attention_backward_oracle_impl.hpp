// src/verify/attention_backward_oracle_impl.hpp — the pieces of the blocked backward oracle
// (attention_backward_oracle.hpp) shared by its two translation units: attention_backward_oracle.cpp
// (packing, the tiles of query rows, dq), attention_backward_oracle_rows.cpp (a row's per-key passes)
// and attention_backward_oracle_keys.cpp (the stored forward's pieces, dk and dv).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_backward_oracle.hpp"
#include "attention_oracle.hpp"
#include "oracle_kernels.hpp"

namespace oasis::verify::detail::backward_oracle {

using kernels::kColumnQuantum;
using bounds::kSecondOrder;
using Vec = std::vector<double>;

inline constexpr index_t kRowTile = 64;  // query rows per tile (one head)

using kernels::round_up;
inline double sq(double x) { return x * x; }
inline std::size_t at(index_t i) { return static_cast<std::size_t>(i); }

/// One worst-case precision of attention_backward_bounds<T>(flush): the backward's u, floor and
/// flush, and the floor of the forward bound it reads (attention_bounds<T>: 2 denorm_min(T)).
struct Spec {
  double u, pfo, pfl, fz;
  template <class T>
  static Spec of(bool flush) {
    const bounds::Precision fw = bounds::Precision::of<T>();
    const bounds::Precision pr = flush ? bounds::Precision::flushing<T>() : fw;
    return {pr.u, fw.p_floor, pr.p_floor, pr.flush};
  }
};

/// The call (attention_oracle.hpp's, inputs in either layout, validated) with its cotangents.
struct Call : AttnCall {
  const AttentionCotangents<double>& d;
  bool has_null;
  index_t dhp, dvp;  ///< d_h, d_v rounded up to the column quantum of the products
  Call(const Tensor<double>& q_, const Tensor<double>& k_, const Tensor<double>& v_, const AttentionCotangents<double>& d_,
       const AttentionOptions& o)
      : AttnCall(q_, k_, v_, o), d(d_), has_null(o.normalizer == RowNorm::softmax1),
        dhp(round_up(s.d_h, kColumnQuantum)), dvp(round_up(s.d_v, kColumnQuantum)) {}
  /// The row (b, h, t) of a [B, H, T, d] tensor in the call's layout (h a kv head for k, v).
  template <class X>
  static auto* row(X& x, bool bthd, index_t b, index_t h, index_t t) { return bthd ? x.ptr(b, t, h) : x.ptr(b, h, t); }
  double dlse(index_t b, index_t h, index_t t) const { return d.lse.empty() ? 0.0 : d.lse(b, h, t); }
  double dpn(index_t b, index_t h, index_t t) const { return d.p_null.empty() ? 0.0 : d.p_null(b, h, t); }
};

/// The sums over rows of one (batch, kv head) pair, per key and feature ([Tk x dhp], [Tk x dvp]).
struct KeySums {
  Vec gk, SkZ1, Ak, R2k, gv, Sv1, Av, R2v, cnt;
  Vec cntp;                 ///< the count of the probabilistic bound: rows with a finite LSE only
  Vec Fk0, Fk1, Fv;         ///< the stored forward's sums: its Z^T |q| (u-free, times u) and eps P^T |dO|
  Vec absq, abso;           ///< sum over every row of |q_c|, |dO_c|
  double maxW = 0, maxPE = 0;  ///< max |w_tj| and max p_tj EDf_t (the floors' coefficients)
  /// Adds the sums of another part of the same pair (the maxima as maxima).
  void add(const KeySums& o) {
    for (Vec KeySums::*m : {&KeySums::gk, &KeySums::SkZ1, &KeySums::Ak, &KeySums::R2k, &KeySums::gv, &KeySums::Sv1,
                            &KeySums::Av, &KeySums::R2v, &KeySums::cnt, &KeySums::cntp, &KeySums::Fk0, &KeySums::Fk1,
                            &KeySums::Fv, &KeySums::absq, &KeySums::abso})
      for (std::size_t j = 0; j < (this->*m).size(); ++j) (this->*m)[j] += (o.*m)[j];
    maxW = std::max(maxW, o.maxW);
    maxPE = std::max(maxPE, o.maxPE);
  }
};

/// Per-row scalars kept until the tile's products are done.
struct RowInfo {
  KeyRange kr;
  double EDf = 0, maxW = 0, maxp = 0, RD2 = 0, RL = 0;
  double pn = 0, lse = 0, Dt = 0, absD = 0, dpn = 0, dl = 0;
  double eps = 0, dDx = 0, aD = 0;  ///< stored forward: dD = dDx + u d_v aD (stored_forward_bounds)
  bool prob = false;  ///< the row enters the probabilistic bound (finite LSE)
};

/// One thread's buffers.
struct Work {
  Vec kt, kta, vt, vta, kx, ka, k2, kpre;                     // packed keys and values
  Vec qb, qa, qB, qaB, q2B, ob, oa, oB, oaB, o2B;             // the tile's rows
  Vec S, AQ, dP, AX, CK, CA, C2;                              // row-major [rows x keys] and products
  Vec LK, LA, L2, LX;  // the products' weights, row-major [rows x keys] blocks (Oracle::tile)
  Vec z, zc, p, x, dz, zeta2, kap2, bias;
  bounds::RowBound rb;  // a row's bounds, their storage reused
  bounds::ProbRow pr;
  Vec vx, va, vpre, CO, CV1, CG1;                             // the stored forward's
  index_t part = 0;  ///< the part of the (batch, kv head) pair being computed (Oracle::parts)
};

/// A row's arrays over its m keys (attention_backward_oracle_rows.cpp): its scores S = <q, k_j>
/// and AQ = sum_c |q_c k_jc|, the bias (zeros without one), the logits z, the reference's
/// probabilities p and dz, the cotangents x = dP_j, the probabilities' worst-case bounds at u = 1
/// (p1), AX = sum_c |dO_c v_jc| and the probabilistic pieces zeta2 and kap2.
struct RowKeys {
  index_t m = 0;
  const double *S = nullptr, *AQ = nullptr, *bias = nullptr, *z = nullptr, *p = nullptr, *x = nullptr, *dz = nullptr;
  const double *p1 = nullptr, *AX = nullptr, *zeta2 = nullptr, *kap2 = nullptr;
};
/// A row's scalars: p_null, dp_null, dlse, lse, kappa_null^2, ED1 (ED at u = 1, its floors apart),
/// RL (R of the LSE) and the 16-bit rounding of P and dS (BackwardOracleRequest: r16 = (u16 / u)^2,
/// n16).
struct RowScalars {
  double pn = 0, dpn = 0, dl = 0, lse = 0, kap2n = 0, ED1 = 0, RL = 0, r16 = 0, n16 = 0;
};
/// Its sums over the keys (Dt and absD with the null's term; RD2 the probabilistic R(D)^2).
struct RowSums {
  double Dt = 0, absD = 0, sp1x = 0, spax = 0, sabsx = 0, sp1 = 0, RD2 = 0;
};
struct ScorePieces {
  double maxQ, maxz;  ///< over the unmasked keys: max_j AQ_j, max_j |z_j|
};
struct RowMaxima {
  double maxW, maxp;  ///< max_j |x_j - Dt + dlse|, max_j p_j
};
/// A row's weights in the tile's products (Oracle::tile's LK, LA, L2 and LX), at its keys' columns.
struct RowWeightsOut {
  double *dz, *p, *Z1, *adz, *p1, *a, *own2, *Xk, *Xv;
};

/// zc_j (bounds::score_error) and zeta2_j (bounds::score_zeta2) of every key, 0 for a masked one.
ScorePieces score_pieces(const RowKeys& k, index_t dh, double scale, bool has_bias, double* zc, double* zeta2);
/// The row's sums; with prob, kap2_j and RD2 (prob_attention_backward_bounds).
RowSums row_sums(const RowKeys& k, const RowScalars& s, index_t dv, bool has_bias, bool prob, double* kap2);
/// The weights of every key (attention_backward_bounds' Z1, prob_attention_backward_bounds' a, own2,
/// Xk, Xv; the last four 0 without prob) and the row's maxima.
RowMaxima row_weights(const RowKeys& k, const RowScalars& s, const RowSums& rs, index_t dv, bool prob,
                      const RowWeightsOut& o);

struct Oracle {
  const Call& c;
  const BackwardOracleRequest& req;
  std::vector<Spec> specs;  // own, then wc_float, wc_double as asked
  BackwardOracle& res;
  std::vector<bounds::AttentionBackwardBounds*> outs;  // per spec
  /// Parts per (batch, kv head) pair: with fewer pairs than kMinItems, each pair's tiles are split
  /// into this many parts (computed in parallel, their sums added in order). It depends on the
  /// shape alone, so the values do not depend on the number of threads.
  index_t parts = 1;
  // the null logits' partial sums per batch element, head and part ([B, H, parts] (x specs))
  Tensor<double> null_S, null_A, null_n, null_R2, gnull;
  Tensor<double> null_fixed;  // [B, H, parts, 2]: the stored forward's, float and double
  /// The bias's gradient and the u-free sums of its bounds (the bias's shape): dz, Z1, |dz|, the
  /// count of terms, Xk (probabilistic) and the stored forward's Z (u-free and times u). A bias
  /// shared by several (batch, kv head) pairs makes the pairs run in order (fast_attention_backward).
  struct BiasSums {
    Tensor<double> g, SZ1, A, cnt, cntp, R2, Zs0, Zs1;  // cntp: terms of rows with a finite LSE
  } bias_sums;
  std::vector<double> unit_maxW, unit_maxPE;  ///< per pair, for the bias's floors
  void stored_rows(index_t b, index_t h, index_t t0, index_t n, std::vector<RowInfo>& ri, index_t lo, index_t L,
                   index_t Lp, Work& w);

  void pack(index_t b, index_t hk, Work& w) const;
  void tile(index_t b, index_t hk, index_t h, index_t t0, index_t n, Work& w, KeySums& ks);
  void finish_keys(index_t b, index_t hk, const KeySums& ks);
  /// The unit's tiles [i0, i1) of its sequence (query head, tile of rows) into ks.
  void rows(index_t b, index_t hk, index_t i0, index_t i1, Work& w, KeySums& ks);
  void init(KeySums& ks) const;
};

}  // namespace oasis::verify::detail::backward_oracle
