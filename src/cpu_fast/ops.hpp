// src/cpu_fast/ops.hpp — the fast path's ops on validated arguments, called by the public entry
// points (entry_points.cpp). Each function's contract is stated at its definition.
#pragma once

#include <vector>

#include "oasis/backends/cpu_fast.hpp"

namespace oasis::fast {

// attention.cpp: token attention into r; `state`, when given, receives each row's final (M, S).
void attention_impl(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                    const AttentionOptions& opt, AttentionResult<float>& r,
                    cpu_fast::AttentionRowState* state = nullptr);

// attention_backward.cpp: the backward's validation, the backward from a given forward, and the
// one-call backward (forward, then backward).
void check_forward(const AttentionShape& s, const AttentionOptions& opt, const AttentionResult<float>& fwd,
                   const cpu_fast::AttentionRowState& st);
AttentionShape check_and_pack_backward_inputs(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                              const AttentionOptions& opt);
void backward_impl(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                   const AttentionResult<float>& fwd, const cpu_fast::AttentionRowState& st,
                   const AttentionCotangents<float>& d, const AttentionOptions& opt, AttentionGrads<float>& g);
AttentionGrads<float> forward_and_backward(const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                           const AttentionCotangents<float>& d, const AttentionOptions& opt);

// route.cpp: depth routing into r, validated as the reference validates it.
void route_impl(const Tensor<float>& sources, const Tensor<float>& g_old, const Tensor<float>& psi,
                const std::vector<SourceKind>& kinds, const DepthOptions& opt, DepthRoute<float>& r);

}  // namespace oasis::fast
