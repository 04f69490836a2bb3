// src/verify/attention_oracle.hpp — the references of op attention, row by row: the fast oracle
// (double, matrix products of oracle_kernels.hpp, OpenMP over blocks of rows) and the mp50 oracle.
//
// A row is one (b, h, t): its out[b, h, t, :], lse, p_null and probs[b, h, t, :]. For each row the
// oracle returns the reference and the u-free pieces of every bound (oasis/ops/error_bounds.hpp with
// u = 1 and no floor; oasis/ops/prob_bounds.hpp), which AttnRow::bounds() assembles for a precision:
//   probs_j   worst case u b1.p_j + floor,                 probabilistic 1.02 lambda u R(p_j) + floor
//   out_c     1.02 (u (G1_c + m V1_c) + floor absv_c) + underflow_floor(m),
//             probabilistic 1.02 lambda u R_c + floor absv_c + underflow_floor(m)
// with G1_c = sum_j b1.p_j |v_jc|, V1_c = sum_j p_j |v_jc|, absv_c = sum over the visible range of
// |v_jc|. The fast oracle's own error is the worst-case bound at own_precision() (every summation
// order is covered), so a row of the fast oracle carries its error, a row of the mp50 oracle none.
// The fast oracle's bound pieces carry a relative uncertainty (AttnRow::rho, rho_out): Q = |q| |K|^T,
// V1, G1, Z and the signed X1 are float sums where the values allow them (float_sums.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "oasis/ops/attention.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/core/multiprecision.hpp"
#include "oasis/ops/prob_bounds.hpp"
#include "lse_convention.hpp"

namespace oasis::verify::detail {

/// An upper bound on a sum of magnitudes over a range of keys from prefix sums `lo` <= `hi` over at
/// most n terms: each prefix is within n u of itself, so the difference is raised by 2 (n + 1) u hi
/// (a floor's factor: never below the range's sum, however much a large earlier term cancels).
inline double range_sum(double lo, double hi, index_t n) {
  return (hi - lo) + 2.0 * static_cast<double>(n + 1) * unit_roundoff<double>() * hi;
}

/// The fast oracle's own rounding model: the worst-case bounds at u = 2^-52, twice double's unit
/// roundoff, because its exponentials (oracle_exp.hpp) are within 4u where the bounds assume 2u; every
/// other term of the bounds only grows with u.
inline bounds::Precision own_precision() {
  return {2.0 * unit_roundoff<double>(), bounds::Precision::of<double>().p_floor};
}

/// One attention call as the engine holds it: inputs exact in double, in either layout.
struct AttnCall {
  const Tensor<double>& q;
  const Tensor<double>& k;
  const Tensor<double>& v;
  const AttentionOptions& opt;  ///< validated; bias already combined with a mask
  AttentionShape s;
  double scale;                 ///< opt.scale or 1/sqrt(d_h) in double
  bool probs_needed = true;     ///< the bounds of the individual probabilities are computed
  bool mix_R_needed = true;     ///< the fast oracle computes R of out (no policy but worst_case reads it)
  LseConvention lse;            ///< the convention of AttnRow::lse (lse_convention.hpp)

  AttnCall(const Tensor<double>& q_, const Tensor<double>& k_, const Tensor<double>& v_, const AttentionOptions& o);
  index_t rows() const { return s.B * s.H * s.Tq; }
  index_t group() const { return s.H / s.H_kv; }
  bool bthd() const { return opt.layout == AttentionLayout::bthd; }
  const double* qrow(index_t b, index_t h, index_t t) const { return bthd() ? q.ptr(b, t, h) : q.ptr(b, h, t); }
  const double* krow(index_t b, index_t hk, index_t j) const { return bthd() ? k.ptr(b, j, hk) : k.ptr(b, hk, j); }
  const double* vrow(index_t b, index_t hk, index_t j) const { return bthd() ? v.ptr(b, j, hk) : v.ptr(b, hk, j); }
  /// Flat index of out[b, h, t, 0] in the call's layout.
  index_t out_offset(index_t b, index_t h, index_t t) const {
    return bthd() ? ((b * s.Tq + t) * s.H + h) * s.d_v : ((b * s.H + h) * s.Tq + t) * s.d_v;
  }
  double null_logit(index_t h) const {
    return opt.null_logits.empty() ? 0.0 : opt.null_logits[static_cast<std::size_t>(h)];
  }
};

/// Bounds of one element at a precision: the worst case and the probabilistic E.
struct ElemBounds {
  double wc = 0, prob = 0;
};

/// The reference of one row and the u-free pieces of its bounds.
struct AttnRow {
  index_t b = 0, h = 0, t = 0;
  KeyRange kr;                           ///< visible keys
  bool exact = false;                    ///< computed in mp50
  bool fused = false;                    ///< computed by the fast oracle's fused path (its common case)
  bool has_null = false;
  // reference (double; the mp50 values too when exact)
  std::vector<double> out, p;            ///< out[d_v]; p over kr (m)
  double lse = 0, p_null = 0;           ///< lse in the call's convention (AttnCall::lse)
  std::vector<mp50> out_mp, p_mp;
  mp50 lse_mp, p_null_mp;
  // worst-case pieces (u = 1, no floor)
  std::vector<double> p_wc;              ///< b1.p_j (0 for masked keys)
  std::vector<char> masked;              ///< keys of kr masked by the bias
  double lse_wc = 0, p_null_wc = 0;
  std::vector<double> G1, V1, absv;      ///< per c
  // probabilistic pieces (R, units of u)
  std::vector<double> p_R, out_R;        ///< out_R: 0 where AttnCall::mix_R_needed is false
  double lse_R = 0, p_null_R = 0;
  double rho = 0;                        ///< relative uncertainty of the pieces (fast oracle)
  /// relative uncertainty of the own-error bounds: Q_j as a float sum within Q^_j (1 +- own_rel)
  /// (float_sums.hpp); each own bound is affine in the Q_j with nonnegative coefficients
  double own_rel = 0;
  std::vector<double> rho_out;           ///< per c, for out (R's cancellation term only with R)
  std::vector<double> err_out;           ///< per c: the fast oracle's own error bound on out (0 when exact)

  index_t m() const { return kr.count(); }
  ElemBounds out_bounds(index_t c, const bounds::Precision& pr) const;
  ElemBounds p_bounds(index_t j, const bounds::Precision& pr) const;     ///< j relative to kr.begin
  ElemBounds lse_bounds(const bounds::Precision& pr) const;
  ElemBounds p_null_bounds(const bounds::Precision& pr) const;
};

/// Reusable buffers of one thread of the fast oracle.
struct AttnWorkspace {
  std::vector<double> qb, qa, S, AQ, P3, G, out0, out1, out2;
  std::vector<float> qaf, AQf;           ///< |q| of the block's rows and Q = |q| |K|^T in float
  std::vector<float> wf, of1, of2;       ///< the float sums' weights [P; G; Zw; W] and results (float_sums.hpp)
  std::vector<int> ef;                   ///< the scale 2^e of each row of wf
  std::vector<double> sw, sp, fs, bias;  ///< per row of a block; one row's bias
  std::vector<KeyRange> kr;
  std::vector<bounds::ProbRow> prs;
};

/// The three blocks of a packed value row (AttnPacked::vx in double, vf in float), each dvp wide.
enum class VCol { v = 0, abs = 1, squares = 2 };

/// Packed keys and values of one (b, kv head) for the fast oracle.
struct AttnPacked {
  index_t b = -1, hk = -1, tkp = 0, dvp = 0;
  std::vector<double> kt, kta;   ///< K^T and |K|^T: [d_h][tkp]
  /// Q = |q| |K|^T by a float sum (float_sums.hpp): every k in range and d_h <= kMaxTerms
  bool k_float = false;
  std::vector<float> ktaf;       ///< |K|^T in float (k_float only)
  std::vector<double> vx;        ///< rows [V | |V| | V^2] (VCol), each block dvp wide
  std::vector<double> vabs_prefix;  ///< [(Tk + 1) x d_v] prefix sums of |v|
  /// V1, G1, Z and X1 by float sums (float_sums.hpp): every v in range and Tk <= kMaxTerms
  bool float_sums = false;
  std::vector<float> vf;            ///< vx in float (float_sums only)
  std::vector<std::int32_t> vnz_prefix;  ///< [(Tk + 1) x d_v] prefix counts of nonzero v (float_sums only)
  std::vector<double> vmax;         ///< [d_v] the largest |v| of each column (float_sums only)
  /// The length of a packed value row (of vx and of vf), and the offset of block `c` within it.
  index_t row_len() const { return 3 * dvp; }
  index_t at(VCol c) const { return static_cast<index_t>(c) * dvp; }
};
void pack_kv(const AttnCall& c, index_t b, index_t hk, AttnPacked& pk);

/// The fast oracle on the rows t[0..n) of query head h (kv head packed in pk): out[0..n), reusing the
/// storage of the rows `out` already holds.
void fast_rows(const AttnCall& c, const AttnPacked& pk, index_t h, const index_t* t, index_t n, AttnWorkspace& ws,
               std::vector<AttnRow>& out);

/// The mp50 oracle on row (b, h, t).
AttnRow mp50_row(const AttnCall& c, index_t b, index_t h, index_t t);

}  // namespace oasis::verify::detail
