// src/cuda/launch_backward.hpp — raw-pointer launchers of the attention backward kernels
// (attention_backward.cu; internal to oasis_cuda, shared by nvcc and the host wrappers as
// launch.hpp is). Every launcher returns the cudaError_t of the launch as an int (0 = success).
#pragma once

#include "launch.hpp"

namespace oasis::cuda::detail {

/// The backward's own buffers; the forward's inputs, masks and strides are the AttentionLaunch it
/// runs with (which must carry row_max and row_sum, the forward's final state of each row).
/// Row arrays are [B, H, Tq] contiguous; dout has the strides of out (o_*), dq those of q (q_*),
/// dk of k, dv of v.
struct AttentionBackwardLaunch {
  const float* dout = nullptr;     ///< dL/dout
  const float* dlse = nullptr;     ///< dL/dLSE, or null for 0
  const float* dp_null = nullptr;  ///< dL/dp_null, or null for 0
  float* row_inv = nullptr;        ///< written by the rows kernel: 1 / S (0 without a visible key)
  float* row_D = nullptr;          ///< written by the rows kernel: D = <dO, O> + p_null dP
  float* row_ds = nullptr;         ///< written by the rows kernel: the null logit's gradient of the row
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  float* dz = nullptr;             ///< optional [B, H, Tq, Tk]: dL/dz at visible keys (others untouched)
};

/// Per row: 1/S, D and ds (needs the forward's out, p_null, row_max, row_sum).
int launch_attention_backward_rows(const AttentionLaunch& a, const AttentionBackwardLaunch& g, CUstream_st* stream);
/// dk and dv (and dz when requested): one block per (batch, kv head, tile of keys).
int launch_attention_backward_dkdv(const AttentionLaunch& a, const AttentionBackwardLaunch& g, CUstream_st* stream);
/// dq: one block per (batch, query head, tile of queries).
int launch_attention_backward_dq(const AttentionLaunch& a, const AttentionBackwardLaunch& g, CUstream_st* stream);

}  // namespace oasis::cuda::detail
