// src/cuda/entry_points.hpp — Backend::cuda's entry points on host tensors that oasis/backends/cuda.hpp
// does not offer, ops of the backend's table (register.cpp): the attention backward
// (backward_cuda.cpp) and the depth routing (route.cpp). Private to oasis_cuda; each validates as
// the reference does.
#pragma once

#include <vector>

#include "oasis/grad/attention_backward.hpp"
#include "oasis/grad/attn_res_backward.hpp"
#include "oasis/ops/depth.hpp"

namespace oasis::detail {

AttentionGrads<float> cuda_token_attention_backward(const Tensor<float>& q, const Tensor<float>& k,
                                                    const Tensor<float>& v, const AttentionCotangents<float>& d,
                                                    const AttentionOptions& opt);
DepthRoute<float> cuda_attn_res_route(const Tensor<float>& sources, const Tensor<float>& g_old,
                                      const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                      const DepthOptions& opt);
DepthRoute<float> cuda_attn_res(const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain,
                                const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                const AttnResOptions& opt);
AttnResGrads<float> cuda_attn_res_backward(const Tensor<float>& sources, const Tensor<float>& w,
                                           const Tensor<float>& gain, const Tensor<float>& psi,
                                           const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                                           const DepthCotangents<float>& d);

}  // namespace oasis::detail
