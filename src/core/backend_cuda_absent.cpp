// The CUDA backend's entry points in a build without the CUDA toolkit (CMake compiles this file
// only when OASIS_HAVE_CUDA is off): the backend reports itself unavailable with the reason.
#include "oasis/backends/backend.hpp"

namespace oasis::detail {

bool cuda_available(std::string* why) {
  if (why) *why = "this build has no CUDA backend (configured without the CUDA toolkit)";
  return false;
}
AttentionResult<float> cuda_token_attention(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                            const AttentionOptions&) {
  throw invalid_argument("backend", "cuda is not available: built without the CUDA toolkit");
}
AttentionGrads<float> cuda_token_attention_backward(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                                    const AttentionCotangents<float>&, const AttentionOptions&) {
  throw invalid_argument("backend", "cuda is not available: built without the CUDA toolkit");
}
DepthRoute<float> cuda_attn_res_route(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                      const std::vector<SourceKind>&, const DepthOptions&) {
  throw invalid_argument("backend", "cuda is not available: built without the CUDA toolkit");
}

}  // namespace oasis::detail
