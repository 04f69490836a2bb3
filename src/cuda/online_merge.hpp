// src/cuda/online_merge.hpp — merging the online-softmax states of disjoint key ranges (split-K
// attention, attention_split.cu), host and device. It extends the per-row state machine of
// online_softmax.hpp, whose start / rescale / weight / finish it uses:
//
//   partial  (M_p, S_p, o_p) of a key range, from the empty state (-inf, 0, 0): no null category
//   merge    M = max(M, M_p), c = e^{M_old - M}, c_p = e^{M_p - M} (0 for an empty partial),
//            S = S c + S_p c_p,  o = o c + o_p c_p
//   combine  start from online_start(softmax1, s) — the null category, added exactly once —
//            merge the partials in key order, then online_finish.
//
// Merging never forms -inf - -inf: online_rescale leaves an empty state alone and online_weight
// gives 0 for an empty partial.
#pragma once

#include "online_softmax.hpp"

namespace oasis::cuda::detail {

/// The factors by which o and o_p are scaled in a merge: o = o * self + o_p * part.
struct MergeFactors {
  float self;
  float part;
};

/// Merges the state `p` of a disjoint key range into `r` (S = S c + S_p c_p: one product, one
/// fused multiply-add) and returns the factors for the outputs.
OASIS_HD MergeFactors online_merge(OnlineRow& r, const OnlineRow& p) {
  const float self = online_rescale(r, p.m);  // r moves to max(M, M_p); S scaled by e^{M_old - M}
  const float part = online_weight(p.m, r.m);  // e^{M_p - M}; 0 when the partial saw no key
  r.l = fmaf(p.l, part, r.l);
  return MergeFactors{self, part};
}

/// o * self + o_p * part, as the combine kernel evaluates it (one product, one fused multiply-add).
OASIS_HD float merge_output(float o, float o_p, const MergeFactors& f) { return fmaf(o_p, f.part, o * f.self); }

}  // namespace oasis::cuda::detail
