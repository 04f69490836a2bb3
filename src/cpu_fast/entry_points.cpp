// src/cpu_fast/entry_points.cpp — the fast path's public entry points: cpu_fast::token_attention,
// token_attention_backward, attn_res_route and vector_exp (oasis/backends/cpu_fast.hpp), and the
// Backend::cpu_fast entry points of the dispatcher (oasis::detail::cpu_fast_*, entry_points.hpp).
// Each validates as the reference does, then calls the op (ops.hpp).
#include <string>
#include <vector>

#include "entry_points.hpp"
#include "fast_kernels.hpp"
#include "oasis/backends/cpu_fast.hpp"
#include "oasis/core/instances.hpp"
#include "ops.hpp"

namespace oasis {
namespace cpu_fast {

void vector_exp(const float* x, float* y, index_t n) {
  OASIS_REQUIRE(n >= 0, "n", "negative length ", n);
  OASIS_REQUIRE(n == 0 || (x && y), "x", "null pointer");
  fast::active_kernels().exp(x, y, n);
}

void token_attention_into(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                          const AttentionOptions& opt, AttentionResult<float>& r) {
  check_attention_shapes(q, k, v, opt);  // finiteness: attention_impl
  fast::attention_impl(q, k, v, opt, r);
}

AttentionResult<float> token_attention(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                       const AttentionOptions& opt) {
  AttentionResult<float> r;
  token_attention_into(q, k, v, opt, r);
  return r;
}

void token_attention_into(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                          const AttentionOptions& opt, AttentionResult<float>& r, AttentionRowState& state) {
  check_attention_shapes(q, k, v, opt);  // finiteness: attention_impl, or the reference's check below
  if (opt.normalizer != RowNorm::softmax && opt.normalizer != RowNorm::softmax1)
    check_attention_args(q, k, v, opt);  // a non-finite input is reported before the normaliser
  OASIS_REQUIRE(opt.normalizer == RowNorm::softmax || opt.normalizer == RowNorm::softmax1, "normalizer",
                "the row state is the online softmax's (softmax and softmax1), got ", to_string(opt.normalizer));
  fast::attention_impl(q, k, v, opt, r, &state);
}

void token_attention_backward_into(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                   const AttentionResult<float>& forward, const AttentionRowState& state,
                                   const AttentionCotangents<float>& d, const AttentionOptions& opt,
                                   AttentionGrads<float>& g) {
  const AttentionShape s = fast::check_and_pack_backward_inputs(q, k, v, opt);
  check_attention_cotangents(s, opt, d);
  fast::check_forward(s, opt, forward, state);
  fast::backward_impl(q, k, v, forward, state, d, opt, g);
}

AttentionGrads<float> token_attention_backward(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                               const AttentionCotangents<float>& d, const AttentionOptions& opt) {
  const AttentionShape s = fast::check_and_pack_backward_inputs(q, k, v, opt);
  check_attention_cotangents(s, opt, d);
  return fast::forward_and_backward(q, k, v, d, opt);
}

void attn_res_route_into(const Tensor<float>& sources, const Tensor<float>& g_old, const Tensor<float>& psi,
                         const std::vector<SourceKind>& kinds, const DepthOptions& opt, DepthRoute<float>& r) {
  fast::route_impl(sources, g_old, psi, kinds, opt, r);
}

DepthRoute<float> attn_res_route(const Tensor<float>& sources, const Tensor<float>& g_old, const Tensor<float>& psi,
                                 const std::vector<SourceKind>& kinds, const DepthOptions& opt) {
  DepthRoute<float> r;
  fast::route_impl(sources, g_old, psi, kinds, opt, r);
  return r;
}

}  // namespace cpu_fast

namespace detail {

bool cpu_fast_available(std::string* why) {
  if (why) why->clear();
  return true;
}

AttentionResult<float> cpu_fast_token_attention(const Tensor<float>& q, const Tensor<float>& k,
                                                const Tensor<float>& v, const AttentionOptions& opt) {
  AttentionResult<float> r;
  fast::attention_impl(q, k, v, opt, r);  // shapes and options validated by the dispatcher
  return r;
}

AttentionGrads<float> cpu_fast_token_attention_backward(const Tensor<float>& q, const Tensor<float>& k,
                                                        const Tensor<float>& v, const AttentionCotangents<float>& d,
                                                        const AttentionOptions& opt) {
  return cpu_fast::token_attention_backward(q, k, v, d, opt);  // validates as the reference (in parallel)
}

DepthRoute<float> cpu_fast_attn_res_route(const Tensor<float>& sources, const Tensor<float>& g_old,
                                          const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                          const DepthOptions& opt) {
  return cpu_fast::attn_res_route(sources, g_old, psi, kinds, opt);
}

}  // namespace detail
}  // namespace oasis
