// src/cuda/online_softmax.hpp — the per-row state machine of the fused attention kernel, shared by
// the device code (attention.cu) and host tests (tests/cuda), so the logic that folds the null
// category in, skips masked keys and finishes a row runs, and is tested, without a GPU.
//
//   start   softmax1: (M, S) = (s, 1)   -- e^{s - M} = 1: the null category, folded in once per row
//           softmax:  (M, S) = (-inf, 0)
//   tile    M' = max(M, max_j z_j) (z of the visible keys only), c = e^{M - M'},
//           S = S c + sum_j e^{z_j - M'},  o = o c + sum_j e^{z_j - M'} v_j
//   finish  out = o / S, LSE1 = M + log S, p_null = e^{s - M} / S  (softmax: p_null = 0);
//           plain softmax with S = 0 (no visible key): out 0, LSE -inf, p_null 0 (documented zero).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define OASIS_HD __host__ __device__ __forceinline__
#else
#define OASIS_HD inline
#endif

namespace oasis::cuda::detail {

/// Keys visible to query t (oasis::visible_keys): j < len (padding) and, if causal,
/// j <= t + (Tk - Tq) (bottom-right alignment). Masked keys form a suffix of the row.
OASIS_HD int row_visible_keys(int len, bool causal, int t, int Tq, int Tk) {
  long long n = len;
  if (causal) {
    const long long c = static_cast<long long>(t) + Tk - Tq + 1;
    n = c < n ? c : n;
  }
  return n < 0 ? 0 : static_cast<int>(n);
}

struct OnlineRow {
  float m;  ///< running maximum M (includes the null logit for softmax1)
  float l;  ///< running normaliser sum S, relative to M
};

OASIS_HD OnlineRow online_start(bool softmax1, float s) {
  return softmax1 ? OnlineRow{s, 1.0f} : OnlineRow{-INFINITY, 0.0f};
}

/// Moves the row to the new maximum max(M, tile_max) (tile_max: maximum logit of a tile, -inf when
/// every key of the tile is masked) and returns the factor c = e^{M - M'} by which S and o must be
/// rescaled (0 when M was -inf; 1 when the tile changes nothing).
OASIS_HD float online_rescale(OnlineRow& r, float tile_max) {
  if (!(tile_max > r.m)) return 1.0f;  // also covers M = tile_max = -inf (no -inf - -inf)
  const float m_new = tile_max;
  const float corr = expf(r.m - m_new);
  r.m = m_new;
  r.l *= corr;
  return corr;
}

struct RowFinish {
  float inv;     ///< 1 / S (0 for an empty plain-softmax row): out = o * inv
  float lse;     ///< LSE1 (softmax1) or LSE (softmax)
  float p_null;  ///< null probability (0 for softmax)
};

/// e^{z - M} of a key's score, 0 for a masked (-inf) score (never -inf - -inf).
OASIS_HD float online_weight(float z, float m) { return z == -INFINITY ? 0.0f : expf(z - m); }

OASIS_HD RowFinish online_finish(const OnlineRow& r, bool softmax1, float s) {
  if (!(r.l > 0.0f)) return RowFinish{0.0f, -INFINITY, 0.0f};  // plain softmax, no visible key
  const float inv = 1.0f / r.l;
  return RowFinish{inv, r.m + logf(r.l), softmax1 ? expf(s - r.m) * inv : 0.0f};
}

}  // namespace oasis::cuda::detail
