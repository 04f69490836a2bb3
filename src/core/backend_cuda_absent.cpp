// Backend::cuda's table in a build without the CUDA toolkit (CMake compiles this file only when
// OASIS_HAVE_CUDA is off): the backend reports itself unavailable with the reason, so the
// dispatcher never calls its ops; they throw the same reason if called directly.
#include "backend_registry.hpp"

namespace oasis::detail {
namespace {

bool available(std::string* why) {
  if (why) *why = "this build has no CUDA backend (configured without the CUDA toolkit)";
  return false;
}

[[noreturn]] void absent() {
  throw invalid_argument("backend", "cuda is not available: built without the CUDA toolkit");
}

AttentionResult<float> attention(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                 const AttentionOptions&) {
  absent();
}

AttentionGrads<float> attention_backward(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                         const AttentionCotangents<float>&, const AttentionOptions&) {
  absent();
}

DepthRoute<float> route(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                        const std::vector<SourceKind>&, const DepthOptions&) {
  absent();
}

DepthRoute<float> fused(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                        const std::vector<SourceKind>&, const AttnResOptions&) {
  absent();
}

AttnResGrads<float> fused_backward(const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,
                                   const Tensor<float>&, const std::vector<SourceKind>&, const AttnResOptions&,
                                   const DepthCotangents<float>&) {
  absent();
}

}  // namespace

const BackendOps& cuda_backend() {
  static constexpr BackendOps ops{"cuda", &available, &attention, &attention_backward, &route, &fused,
                                  &fused_backward};
  return ops;
}

}  // namespace oasis::detail
