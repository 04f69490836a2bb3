// src/verify/attention_oracle_rows.hpp — the per-row pieces shared by the forward fast oracle's two
// paths (attention_oracle.cpp: fast_rows, the general rows; attention_oracle_fused.cpp: the fused
// rows of the common case).
#pragma once

#include <limits>
#include <vector>

#include "attention_oracle.hpp"

namespace oasis::verify::detail {

/// A row's logits and the u-free pieces of their errors, from its scores (dot = <q, k_j>,
/// Q = sum_c |q_c k_jc|, the bias): z_j = scale dot_j + bias_j, the worst-case coefficient zc_j,
/// zeta2_j (prob_bounds.hpp), the shared-event sigma = scale max_j Q_j + max_j |z_j|, and the first
/// largest logit (zmax at arg). Keys the bias masks (AttnRow::masked) are exactly 0 in every
/// implementation.
struct Logits {
  std::vector<double> z, zc, zeta2;
  double sigma = 0, zmax = -std::numeric_limits<double>::infinity();
  index_t arg = -1;
};

/// A row's weights in the mixing products (columns of its keys): Zw, P, Wr and G of fast_rows, and
/// the row's scale f (bounds::prob_mix_scale) and sums sw = sum_j Wr_j, sp = sum_j p_j (0 without R).
struct RowWeights {
  double *Zw, *P, *Wr, *G;
  double f = 1, sw = 0, sp = 0;
};

/// The relative uncertainty of a fast row's pieces (AttnRow::rho) from the largest relative bound of
/// its probabilities at u = 1.
double row_rho(double rel_max);

/// The row's LSE turned into the call's convention (an exact row's keys-only LSE in mp50: keys_mp).
void in_lse_convention(const AttnCall& c, AttnRow& r, const Logits& L, const mp50* keys_mp);

/// A row of fast_rows on the common case (attention_oracle_fused.cpp): with its scores dot and Q,
/// sets the row's reference and pieces, L, pr and w as the general path does, and returns true; on
/// any other row returns false with nothing of the row's results set (L perhaps written: the general
/// path's row_logits sets it again).
bool fused_row(const AttnCall& c, AttnRow& row, const double* dot, const double* Q, bool mixR, Logits& L,
               bounds::ProbRow& pr, RowWeights& w);

}  // namespace oasis::verify::detail
