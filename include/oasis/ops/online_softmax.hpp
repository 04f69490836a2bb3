// oasis/ops/online_softmax.hpp — one row of token attention as a fused kernel streams it: the keys the
// row sees, and the online softmax with a null category (docs/spec.md §1, §2, §8). Host and device code:
// the reference's masks (oasis/ops/attention.hpp visible_range), the fast CPU kernels' per-row state
// (src/cpu_fast/kernels/forward.inc) and the CUDA kernels (src/cuda/attention.cu) call these
// functions; this header needs nothing but <cmath>, so nvcc and the CPU kernels' translation
// units include it as it is.
//
// Visible keys of query t (t' = t + (Tk - Tq), bottom-right alignment): the range [begin, end) with
//   end   = min(len, t' + 1) if causal or windowed, else len   (len: the batch element's key length)
//   begin = max(0, t' - W + 1) with a sliding window W >= 1, else 0.
// Both never decrease with t, so the rows of a query block see a band of keys and a kernel skips
// every key tile outside the band: a windowed row costs O(W), not O(Tk). begin >= end is a fully
// masked row. An additive bias can mask more keys (-inf); those are masked scores (below).
//
// The online softmax — the algorithm every fused kernel of the library runs, stated once:
//   state   (M, S) per row: M the running maximum of the logits seen *including the null logit s*,
//           S = e^{s - M} + sum_{seen j} e^{z_j - M}; beside it the unnormalised output
//           o = sum_{seen j} e^{z_j - M} v_j.
//   start   softmax1: (M, S) = (s, 1): e^{s - M} = 1, the null category is in the sum from the
//           start, exactly once per row. Plain softmax: (M, S) = (-inf, 0), the empty state.
//   tile    for a tile of keys with logits z_j (a masked key has z = -inf and weight 0):
//           M' = max(M, max_j z_j), c = e^{M - M'} (1 if M' = M; 0 from the empty state, never
//           e^{-inf - -inf}), S = S c + sum_j e^{z_j - M'}, o = o c + sum_j e^{z_j - M'} v_j, M = M'.
//   finish  out = o / S, LSE1 = M + log S, p_null = e^{s - M} / S (plain softmax: LSE, p_null = 0);
//           a probability, if wanted, is p_j = e^{z_j - M} / S = e^{z_j - LSE} with the final state.
//           A row that saw no visible key keeps its start state, so softmax1 gives out 0,
//           p_null 1, LSE1 = s exactly, and plain softmax (S = 0) the documented zero: out 0,
//           LSE -inf, p_null 0 (MaskedRow::zero; MaskedRow::error is the caller's to raise).
//   split   states of disjoint key ranges merge as M = max(M1, M2), S = S1 e^{M1 - M} + S2 e^{M2 - M}
//           (o likewise; merge below); the null category must be in exactly one of them (one
//           partial starts at (s, 1), the others at (-inf, 0)), or be added once, as e^{s - M}, at
//           the combine.
// A visible score that is NaN or +inf (q.k * scale overflowed float) is no logit: the reference
// rejects the row (argument "scores"); each kernel detects it in its own way before it reaches
// this state (attention.cu flags it, the CPU kernels let it poison S and test S at the end).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define OASIS_HD __host__ __device__ __forceinline__
#else
#define OASIS_HD inline
#endif

namespace oasis::online {

/// Keys [begin, end) of a row (begin >= end: none).
template <class I>
struct KeySpan {
  I begin, end;
};

/// The visible keys of query t (above): len in [0, Tk], window W >= 0 (0: none).
template <class I>
OASIS_HD KeySpan<I> key_span(I len, bool causal, I window, I t, I Tq, I Tk) {
  const I tp = t + (Tk - Tq);  // the query's own key position
  I end = len;
  if ((causal || window > 0) && tp + 1 < end) end = tp + 1;
  I begin = 0;
  if (window > 0 && tp - window + 1 > 0) begin = tp - window + 1;
  return {begin, end > begin ? end : begin};
}

/// The running state (M, S) of one row.
struct State {
  float m;  ///< running maximum M (includes the null logit for softmax1)
  float l;  ///< running sum S, in units of e^{M}
};

OASIS_HD State start(bool has_null, float s) { return has_null ? State{s, 1.0f} : State{-INFINITY, 0.0f}; }

/// Moves the state to M' = max(M, tile_max) (tile_max: the tile's largest logit, -inf when every
/// key of the tile is masked), rescales S, and returns c = e^{M - M'}, the factor the caller
/// applies to o. Then add the tile's weights e^{z_j - M'} to S and o.
OASIS_HD float rescale(State& r, float tile_max) {
  if (!(tile_max > r.m)) return 1.0f;  // also M = tile_max = -inf: nothing to rescale
  const float c = expf(r.m - tile_max);
  r.m = tile_max;
  r.l *= c;
  return c;
}

/// e^{z - M}, 0 for a masked key (z = -inf), also from the empty state (M = -inf).
OASIS_HD float weight(float z, float m) { return z == -INFINITY ? 0.0f : expf(z - m); }

struct Finish {
  float inv;     ///< 1 / S, 0 for plain softmax without a visible key: out = o * inv
  float lse;     ///< LSE1 (softmax1) or LSE (softmax; -inf when empty)
  float p_null;  ///< e^{s - M} / S (0 for softmax)
};

/// The row's results from its final state, in the reference's arithmetic (oasis::normalize_row:
/// one reciprocal 1 / S, then products).
OASIS_HD Finish finish(const State& r, bool has_null, float s) {
  if (!(r.l > 0.0f)) return Finish{0.0f, -INFINITY, 0.0f};
  const float inv = 1.0f / r.l;
  return Finish{inv, r.m + logf(r.l), has_null ? expf(s - r.m) * inv : 0.0f};
}

/// The factors of a merge for the outputs: o = o * self + o_p * part.
struct MergeFactors {
  float self;
  float part;
};

/// Merges the state `p` of a disjoint key range into `r` ("split" above): M = max(M, M_p),
/// S = S e^{M_old - M} + S_p e^{M_p - M} (one product, one fused multiply-add), and returns the
/// factors for the outputs. Never e^{-inf - -inf}: rescale leaves an empty state alone and weight
/// gives 0 for an empty partial. Split-K kernels (src/cuda/attention_split.cu) merge partials that
/// start from start(false, 0) and add the null category once, as the state they merge into.
OASIS_HD MergeFactors merge(State& r, const State& p) {
  const float self = rescale(r, p.m);  // r moves to max(M, M_p); S scaled by e^{M_old - M}
  const float part = weight(p.m, r.m);  // e^{M_p - M}; 0 when the partial saw no key
  r.l = fmaf(p.l, part, r.l);
  return MergeFactors{self, part};
}

/// o * self + o_p * part, as the merges evaluate it (one product, one fused multiply-add).
OASIS_HD float merge_output(float o, float o_p, const MergeFactors& f) { return fmaf(o_p, f.part, o * f.self); }

}  // namespace oasis::online
