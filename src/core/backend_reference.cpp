// Backend::reference's table: the scalar-generic reference (oasis/ops/attention.hpp,
// oasis/grad/attention_backward.hpp, oasis/ops/depth.hpp, oasis/ops/attn_res.hpp,
// oasis/grad/attn_res_backward.hpp) instantiated for float.
#include "backend_registry.hpp"
#include "oasis/core/instances.hpp"
#include "oasis/grad/instances.hpp"

namespace oasis::detail {
namespace {

bool available(std::string* why) {
  if (why) why->clear();
  return true;
}

AttentionResult<float> attention(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                 const AttentionOptions& opt) {
  return oasis::token_attention(q, k, v, opt);
}

AttentionGrads<float> attention_backward(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                         const AttentionCotangents<float>& d, const AttentionOptions& opt) {
  return oasis::token_attention_backward(q, k, v, d, opt);
}

DepthRoute<float> route(const Tensor<float>& sources, const Tensor<float>& g_old, const Tensor<float>& psi,
                        const std::vector<SourceKind>& kinds, const DepthOptions& opt) {
  return oasis::attn_res_route(sources, g_old, psi, kinds, opt);
}

DepthRoute<float> fused(const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain,
                        const Tensor<float>& psi, const std::vector<SourceKind>& kinds, const AttnResOptions& opt) {
  return oasis::attn_res(sources, w, gain, psi, kinds, opt);
}

AttnResGrads<float> fused_backward(const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain,
                                   const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                   const AttnResOptions& opt, const DepthCotangents<float>& d) {
  return oasis::attn_res_backward(sources, w, gain, psi, kinds, opt, d);
}

}  // namespace

const BackendOps& reference_backend() {
  static constexpr BackendOps ops{"reference", &available, &attention, &attention_backward, &route, &fused,
                                  &fused_backward};
  return ops;
}

}  // namespace oasis::detail
