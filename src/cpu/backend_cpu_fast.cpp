// Fast CPU backend entry points. (Issue 7 replaces this with the fused, tiled OpenMP path.)
#include "oasis/backend.hpp"

namespace oasis::detail {

bool cpu_fast_available(std::string* why) {
  if (why) *why = "the fast CPU path is not part of this build yet";
  return false;
}
AttentionResult<float> cpu_fast_token_attention(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                                const AttentionOptions&) {
  throw invalid_argument("backend", "cpu_fast is not available in this build");
}
DepthRoute<float> cpu_fast_attn_res_route(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                          const std::vector<SourceKind>&, const DepthOptions&) {
  throw invalid_argument("backend", "cpu_fast is not available in this build");
}

}  // namespace oasis::detail
