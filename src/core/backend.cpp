// Backend dispatch (include/oasis/backends/backend.hpp).
#include "oasis/backends/backend.hpp"

#include "oasis/grad/instances.hpp"
#include "oasis/core/instances.hpp"

namespace oasis {

std::string_view to_string(Backend b) {
  switch (b) {
    case Backend::reference: return "reference";
    case Backend::cpu_fast: return "cpu_fast";
    case Backend::cuda: return "cuda";
  }
  return "unknown";
}

Backend parse_backend(std::string_view name) {
  if (name == "reference") return Backend::reference;
  if (name == "cpu_fast") return Backend::cpu_fast;
  if (name == "cuda") return Backend::cuda;
  throw invalid_argument("backend", "unknown backend '" + std::string(name) +
                                        "' (expected reference, cpu_fast or cuda)");
}

std::string backend_unavailable_reason(Backend b) {
  std::string why;
  switch (b) {
    case Backend::reference: return "";
    case Backend::cpu_fast: return detail::cpu_fast_available(&why) ? "" : why;
    case Backend::cuda: return detail::cuda_available(&why) ? "" : why;
  }
  return "unknown backend";
}

bool backend_available(Backend b) { return backend_unavailable_reason(b).empty(); }

std::vector<Backend> available_backends() {
  std::vector<Backend> out;
  for (Backend b : {Backend::reference, Backend::cpu_fast, Backend::cuda})
    if (backend_available(b)) out.push_back(b);
  return out;
}

static void require_available(Backend b) {
  const std::string why = backend_unavailable_reason(b);
  OASIS_REQUIRE(why.empty(), "backend", to_string(b), " is not available: ", why);
}

AttentionResult<float> token_attention(Backend b, const Tensor<float>& q, const Tensor<float>& k,
                                       const Tensor<float>& v, const AttentionOptions& opt) {
  if (b == Backend::reference) return token_attention(q, k, v, opt);
  require_available(b);
  if (b == Backend::cpu_fast) {
    check_attention_shapes(q, k, v, opt);  // the fast path checks finiteness as it reads q, k and v
    return detail::cpu_fast_token_attention(q, k, v, opt);
  }
  check_attention_args(q, k, v, opt);
  return detail::cuda_token_attention(q, k, v, opt);
}

AttentionGrads<float> token_attention_backward(Backend b, const Tensor<float>& q, const Tensor<float>& k,
                                               const Tensor<float>& v, const AttentionCotangents<float>& d,
                                               const AttentionOptions& opt) {
  if (b == Backend::reference) return token_attention_backward(q, k, v, d, opt);
  require_available(b);
  if (b == Backend::cpu_fast) return detail::cpu_fast_token_attention_backward(q, k, v, d, opt);  // validates
  check_attention_cotangents(check_attention_args(q, k, v, opt), opt, d);
  return detail::cuda_token_attention_backward(q, k, v, d, opt);
}

DepthRoute<float> attn_res_route(Backend b, const Tensor<float>& sources, const Tensor<float>& g_old,
                                 const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                 const DepthOptions& opt) {
  if (b == Backend::reference) return attn_res_route(sources, g_old, psi, kinds, opt);
  require_available(b);
  check_route_shapes(sources, g_old, psi, kinds);
  return b == Backend::cpu_fast ? detail::cpu_fast_attn_res_route(sources, g_old, psi, kinds, opt)
                                : detail::cuda_attn_res_route(sources, g_old, psi, kinds, opt);
}

}  // namespace oasis
