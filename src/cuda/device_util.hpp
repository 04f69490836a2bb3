// src/cuda/device_util.hpp — host-side helpers of the CUDA backend: error checks, device buffers,
// availability and argument checks shared by the host wrappers (internal to oasis_cuda).
//
// Names of the backend's functions, by layer:
//   oasis::detail::cuda_<op>         Backend::cuda's entry point on host tensors (entry_points.hpp)
//   oasis::cuda::<op>                a CUDA-only entry point on host tensors (oasis/backends/cuda.hpp)
//   oasis::cuda::<op>_device         a public entry point on device buffers (oasis/backends/cuda.hpp)
//   oasis::cuda::detail::launch_<x>  launches kernels on validated raw pointers, asynchronously
//                                    (one kernel each in launch.hpp; composites here)
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "launch.hpp"
#include "oasis/core/error.hpp"
#include "oasis/ops/normalizer.hpp"
#include "oasis/core/tensor.hpp"

namespace oasis::cuda::detail {

/// A CUDA runtime failure after validation (out of memory, launch failure): a runtime error, not
/// a bad argument.
[[noreturn]] inline void fail(const char* what, int code) {
  throw std::runtime_error(std::string("oasis cuda: ") + what + " failed: " +
                           cudaGetErrorString(static_cast<cudaError_t>(code)));
}
inline void check(int code, const char* what) {
  if (code != 0) fail(what, code);
}

/// Owning device allocation of n elements of T.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    if (n) check(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), "cudaMalloc");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  ~DeviceBuffer() { if (p_) cudaFree(p_); }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  void upload(const T* host) { if (n_) check(cudaMemcpy(p_, host, n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D"); }
  void download(T* host) const { if (n_) check(cudaMemcpy(host, p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H"); }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

template <class T>
DeviceBuffer<T> to_device(const T* host, std::size_t n) {
  DeviceBuffer<T> d(n);
  d.upload(host);
  return d;
}
template <class T>
DeviceBuffer<T> to_device(const std::vector<T>& host) { return to_device(host.data(), host.size()); }
template <class T>
DeviceBuffer<T> to_device(const Tensor<T>& host) { return to_device(host.data(), static_cast<std::size_t>(host.size())); }

/// The CUDA kernels implement the exponential normalisers only (softmax, softmax1); the others
/// (clipped, sparse) are rejected naming the argument.
inline void require_cuda_normalizer(RowNorm n, const char* arg) {
  OASIS_REQUIRE(n == RowNorm::softmax || n == RowNorm::softmax1, arg, "the CUDA backend implements softmax and ",
                "softmax1, got ", to_string(n), " (use Backend::reference)");
}

/// Throws oasis::invalid_argument("backend", reason) when no usable device is present.
void require_device();

/// A size that the kernels index with int (and grid dimensions with at most 65535 for B and H).
inline void require_int(index_t x, const char* arg, const char* what, index_t limit = std::numeric_limits<int>::max()) {
  OASIS_REQUIRE(x <= limit, arg, what, " = ", x, " exceeds the CUDA backend's limit ", limit);
}

}  // namespace oasis::cuda::detail

#include "oasis/ops/attention.hpp"

namespace oasis::cuda::detail {

// Attention calls (backend_cuda.cpp), shared by the forward and the backward's host wrappers.

/// The CUDA backend's limits on top of check_attention_args (head sizes, int ranges).
void check_cuda_attention_limits(const AttentionShape& s, RowNorm normalizer);
/// Plain softmax with MaskedRow::error throws on a row without visible keys ("scores").
void check_masked_rows(const AttentionShape& s, const AttentionOptions& opt);
/// After the forward: plain softmax with MaskedRow::error throws on a row whose visible scores
/// were all -inf (LSE = -inf), as normalize_row does ("scores").
void check_masked_lse(const AttentionShape& s, const AttentionOptions& opt, const Tensor<float>& lse);
/// A launch on contiguous q, k, v and out in `layout` ([B, H, T, d] or [B, T, H, d]), by strides.
AttentionLaunch layout_launch(io::DType type, const void* q, const void* k, const void* v, const AttentionShape& s,
                              AttentionLayout layout);
/// The device copies of an attention call's options (float32: T(x) with T = float, as the
/// reference); they must outlive the launches that use them.
struct DeviceAttentionOptions {
  DeviceBuffer<float> null_logits, bias;
  DeviceBuffer<int> key_lengths;
};
/// Sets the launch's normaliser, null logits, masks, bias and scale from `opt`.
DeviceAttentionOptions set_attention_options(AttentionLaunch& a, const AttentionShape& s, const AttentionOptions& opt);
/// The device outputs of one forward: out, LSE, p_null and, when kept, each row's final online
/// state (M, S) from which the probabilities and the backward are recomputed.
struct DeviceAttentionOutputs {
  DeviceBuffer<float> out, lse, p_null, row_max, row_sum;
};
/// Points the filled launch `a` at fresh output buffers (the row state when `keep_row_state`),
/// runs `launch` on it and rejects a NaN or +inf score as normalize_row does ("scores").
DeviceAttentionOutputs run_forward(AttentionLaunch& a, const AttentionShape& s, const AttentionOptions& opt,
                                   bool keep_row_state, const std::function<void(const AttentionLaunch&)>& launch);

}  // namespace oasis::cuda::detail

#include "oasis/ops/depth.hpp"

namespace oasis::cuda::detail {

/// Validates a depth-routing call exactly as oasis::attn_res_route (and depth_weights) would, and
/// returns beta in float (0 without coupling) and the evidence flags of the candidates.
struct RouteSetup {
  float beta = 0.0f;
  std::vector<unsigned char> evidence;
  bool clamp_uncoupled = false;  ///< clamp g_old without coupling (oasis::model::clamps_uncoupled_logits)
};
RouteSetup check_route_args(const Tensor<float>& sources, const Tensor<float>& g_old, const Tensor<float>& psi,
                            const std::vector<SourceKind>& kinds, const DepthOptions& opt);

/// Device outputs of one routing: g, dpsi, alpha [n, N], alpha_null [N], h [N, d].
struct DeviceRoute {
  DeviceRoute(index_t n, index_t N, index_t d);
  index_t n, N, d;
  DeviceBuffer<float> g, dpsi, alpha, alpha_null, h;
  DepthRoute<float> download() const;
};

/// Launches the routing kernels (depth weights, then the mixing h = sum_i alpha_i s_i) on
/// validated arguments into caller-owned device outputs, asynchronously on `stream`.
void launch_attn_res_route(const float* sources, const float* g_old, const float* psi, index_t n, index_t N, index_t d,
                           const RouteSetup& setup, const DepthOptions& opt, float* h, float* alpha, float* alpha_null,
                           float* g, float* dpsi, CUstream_st* stream);

}  // namespace oasis::cuda::detail
