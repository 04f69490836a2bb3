// src/cuda/attn_res_launch.hpp — raw-pointer launchers of the fused AttnRes kernels (attn_res.cu;
// internal to oasis_cuda, shared by nvcc and the C++ compiler as launch.hpp is). Each returns the
// cudaError_t of its launch as an int (0 = success).
//
// Rows r = i N + t of the sources [n, N, d] (candidate i, token t), R = n N rows of width d.
#pragma once

struct CUstream_st;

namespace oasis::cuda::detail {

/// g[r] = g[r] * scale (one rounding after the dot product, as oasis::attn_res_logits), and
/// first_bad[0] = the smallest token t with a non-finite logit at some candidate, or N when none
/// (bad_token [N] is scratch). Deterministic: a minimum, no atomics.
int launch_attn_res_scale_logits(float* g, int n, int N, float scale, int* bad_token, int* first_bad,
                                 CUstream_st* stream);

/// da[r] = <dh_t, s_r> (+ dalpha[r] when dalpha is not null), one warp per row: the mix's part of
/// dL/dalpha (oasis::attn_res_route_backward).
int launch_attn_res_dalpha(const float* sources, const float* dh, const float* dalpha, int n, int N, int d, float* da,
                           CUstream_st* stream);

/// The total grad of the sources, one warp per row (oasis::attn_res_backward):
///   ds_rc = alpha_r dh_tc + inv_r (dxhat_c - xhat_c m),  xhat_c = x_c inv_r,  dxhat_c = (dg_r w_c) gain_c,
///   m = (1/d) sum_c dxhat_c xhat_c,  inv_r = 1 / sqrt(mean(x^2) + eps);
/// inv[r] receives inv_r for launch_attn_res_param_grads.
int launch_attn_res_grad_sources(const float* sources, const float* dh, const float* alpha, const float* dg,
                                 const float* w, const float* gain, int n, int N, int d, float eps, float* ds,
                                 float* inv, CUstream_st* stream);

/// The row chunks of launch_attn_res_param_grads: chunks * rows_per_chunk >= rows.
struct ParamGradChunks {
  int rows_per_chunk = 1, chunks = 1;
};
ParamGradChunks attn_res_param_grad_chunks(int rows);

/// dw_c = sum_r dg_r y_rc and (gain not null) dgain_c = sum_r (dg_r w_c) xhat_rc, y = xhat gain:
/// each (chunk, c) sums its rows in order into part_w / part_g [chunks, d], then a second kernel
/// sums the chunks of each column in order. Deterministic: fixed orders, no atomics.
int launch_attn_res_param_grads(const float* sources, const float* inv, const float* dg, const float* w,
                                const float* gain, int rows, int d, const ParamGradChunks& ch, float* part_w,
                                float* part_g, float* dw, float* dgain, CUstream_st* stream);

}  // namespace oasis::cuda::detail
