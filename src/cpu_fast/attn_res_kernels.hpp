// src/cpu_fast/attn_res_kernels.hpp — the fused AttnRes routing's row passes (kernels/attn_res.inc),
// compiled per instruction set in attn_res_kernels.cpp and chosen to match the fast path's active
// variant (fast::active_kernels(), so cpu_fast::set_isa selects them too).
#pragma once

#include "fast_kernels.hpp"

namespace oasis::fast {

/// The scalars of one row's gradient (AttnResRows::grad).
struct AttnResRowGrad {
  float alpha;  ///< the row's weight alpha_i (the mix's part alpha_i dh)
  float inv;    ///< 1 / sqrt(mean(x^2) + eps)
  float dg;     ///< dL/d(w^T RMSNorm(x)): scale times dL/dg
  float k;      ///< inv m, m = mean_c dxhat_c xhat_c = dg inv dot / d
  float r;      ///< dg inv: the row's weight in dL/dw = gain P, dL/dgain = w P
};

struct AttnResRows {
  const char* isa;
  int lanes;
  /// out[0] = sum_c x_c^2, out[1] = sum_c wg_c x_c (out[2] = 0) over a row of d floats.
  void (*sums)(const float* x, const float* wg, idx d, float* out);
  /// As sums, with out[2] = sum_c dh_c x_c, in the same read of x.
  void (*sums_dh)(const float* x, const float* wg, const float* dh, idx d, float* out);
  /// ds_c = alpha dh_c + inv (dg wg_c - k x_c) and P_c += r x_c for c < d.
  void (*grad)(const float* x, const float* wg, const float* dh, idx d, const AttnResRowGrad& a, float* ds, float* P);
  /// As grad, ds written with non-temporal stores (not read into the cache first): for results larger
  /// than the caches; the caller runs stream_fence() before another thread reads ds.
  void (*grad_stream)(const float* x, const float* wg, const float* dh, idx d, const AttnResRowGrad& a, float* ds,
                      float* P);
};

/// Orders the calling thread's non-temporal stores before its later stores (sfence on x86).
void stream_fence();

/// The variant of the same instruction set as fast::active_kernels().
const AttnResRows& attn_res_rows();

}  // namespace oasis::fast
