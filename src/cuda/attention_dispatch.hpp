// src/cuda/attention_dispatch.hpp — choosing and launching one of the attention kernels
// (attention.cu fused, attention_split.cu split-K, attention_tc.cu tensor cores) for a validated
// call (internal to oasis_cuda; oasis/backends/cuda.hpp, KernelOptions and kernel_choice, is the public
// face).
#pragma once

#include "launch.hpp"
#include "oasis/ops/attention.hpp"
#include "oasis/backends/cuda.hpp"

namespace oasis::cuda::detail {

/// What a call asks of the masks beyond padding and causality (split_keys and tensor_cores
/// implement neither).
struct MaskFeatures {
  index_t window = 0;
  bool bias = false;
};
inline MaskFeatures features_of(const AttentionOptions& o) { return {o.window, !o.bias.empty()}; }

/// Validates a kernel choice for a call (invalid_argument naming "kernel", "key_splits", or the
/// option a kernel does not implement: "window", "bias") and resolves `automatic`.
KernelChoice resolve_kernel(const AttentionShape& s, io::DType type, const MaskFeatures& f, const KernelOptions& k);

/// The split launch of `splits` blocks per row group: keys_per_warp covers Tk, workspace
/// pointers left null.
SplitLaunch split_plan(const AttentionLaunch& a, int splits);
/// Floats of the split workspace: B H Tq splits (2 + d_v).
std::size_t split_workspace_floats(const AttentionLaunch& a, const SplitLaunch& s);

/// Launches the chosen kernel(s) on a filled launch, asynchronously on `stream`; split_keys
/// allocates its workspace stream-ordered and frees it after the combine. Throws runtime_error on
/// a CUDA failure.
void launch_chosen(const AttentionLaunch& a, const KernelChoice& c, CUstream_st* stream);

}  // namespace oasis::cuda::detail
