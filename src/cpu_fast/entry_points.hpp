// src/cpu_fast/entry_points.hpp — Backend::cpu_fast's entry points on host tensors, the ops of its
// table (register.cpp; oasis/backends/registry.hpp). Defined in entry_points.cpp; private to
// oasis_cpu_fast. The dispatcher has checked the shapes (check_attention_shapes, check_route_shapes);
// the entry points check the values as the reference does.
#pragma once

#include <string>
#include <vector>

#include "oasis/grad/attention_backward.hpp"
#include "oasis/grad/attn_res_backward.hpp"
#include "oasis/ops/attention.hpp"
#include "oasis/ops/depth.hpp"

namespace oasis::detail {

bool cpu_fast_available(std::string* why);
AttentionResult<float> cpu_fast_token_attention(const Tensor<float>& q, const Tensor<float>& k,
                                                const Tensor<float>& v, const AttentionOptions& opt);
AttentionGrads<float> cpu_fast_token_attention_backward(const Tensor<float>& q, const Tensor<float>& k,
                                                        const Tensor<float>& v, const AttentionCotangents<float>& d,
                                                        const AttentionOptions& opt);
DepthRoute<float> cpu_fast_attn_res_route(const Tensor<float>& sources, const Tensor<float>& g_old,
                                          const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                          const DepthOptions& opt);
DepthRoute<float> cpu_fast_attn_res(const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain,
                                    const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                    const AttnResOptions& opt);
AttnResGrads<float> cpu_fast_attn_res_backward(const Tensor<float>& sources, const Tensor<float>& w,
                                               const Tensor<float>& gain, const Tensor<float>& psi,
                                               const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                                               const DepthCotangents<float>& d);

}  // namespace oasis::detail
