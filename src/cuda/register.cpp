// Backend::cuda's table (oasis/backends/registry.hpp), listed in src/core/backend.cpp: availability
// and float32 attention from oasis/backends/cuda.hpp (the kernel chosen automatically), the
// backward and the routing from entry_points.hpp.
#include "core/backend_registry.hpp"
#include "entry_points.hpp"
#include "oasis/backends/cuda.hpp"

namespace oasis::detail {
namespace {

AttentionResult<float> attention(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                 const AttentionOptions& opt) {
  return cuda::token_attention(q, k, v, opt, cuda::KernelOptions{});
}

}  // namespace

const BackendOps& cuda_backend() {
  static constexpr BackendOps ops{"cuda", &cuda::available, &attention, &cuda_token_attention_backward,
                                  &cuda_attn_res_route, &cuda_attn_res, &cuda_attn_res_backward};
  return ops;
}

}  // namespace oasis::detail
