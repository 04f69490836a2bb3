// oasis/backends/backend.hpp — one API, several backends (float32 data).
//
//   Backend::reference  the scalar-generic reference (oasis/ops/attention.hpp, oasis/ops/depth.hpp) in float
//   Backend::cpu_fast   fused, tiled, OpenMP CPU path (src/cpu_fast/)
//   Backend::cuda       CUDA kernels (src/cuda/), when built with the toolkit and a device is present
// A user switches backends by changing one argument. Each backend is one table of its ops
// (oasis/backends/registry.hpp); the functions below dispatch on Backend's table, and the parity
// tests run once over every registered table. Every backend validates its arguments with the same
// checks as the reference (check_attention_args) and returns the same structures.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "oasis/backends/registry.hpp"

namespace oasis {

enum class Backend { reference, cpu_fast, cuda };

std::string_view to_string(Backend b);
Backend parse_backend(std::string_view name);  // "reference" | "cpu_fast" | "cuda"

/// True if the backend is compiled in and usable now (cuda: a device is present).
bool backend_available(Backend b);
/// Why backend_available(b) is false ("" when it is available).
std::string backend_unavailable_reason(Backend b);
/// Every backend usable in this process, reference first.
std::vector<Backend> available_backends();
/// The table of a backend (oasis/backends/registry.hpp).
const BackendOps& backend_ops(Backend b);

/// Token attention (docs/spec.md §2) on the chosen backend; throws oasis::invalid_argument when the
/// backend is unavailable or the arguments are invalid.
AttentionResult<float> token_attention(Backend b, const Tensor<float>& q, const Tensor<float>& k,
                                       const Tensor<float>& v, const AttentionOptions& opt = {});

/// The backward of token attention (oasis/grad/attention_backward.hpp, docs/spec.md §8) on the chosen
/// backend: the gradients with respect to q, k, v, the null logits and the bias from the
/// cotangents of token_attention's outputs. The reference backend runs the float reference;
/// cpu_fast and cuda run their own fused forward (which keeps each row's softmax state) and then
/// FlashAttention-2's backward with the null category (probabilities recomputed, D = <dO, O> +
/// p_null dP). Every backend fills every field of AttentionGrads as the reference does: q, k, v,
/// null_logits (softmax1), bias (with a bias), scores (dL/dz, with opt.return_probs); the fast
/// paths form bias and scores from a [B, H, Tq, Tk] buffer of dL/dz, only when asked for.
/// Softmax and softmax1 only (another normaliser throws naming "normalizer", as the reference).
AttentionGrads<float> token_attention_backward(Backend b, const Tensor<float>& q, const Tensor<float>& k,
                                               const Tensor<float>& v, const AttentionCotangents<float>& d,
                                               const AttentionOptions& opt = {});

/// Depth routing of one layer over N tokens (oasis/ops/depth.hpp attn_res_route) on the chosen backend.
DepthRoute<float> attn_res_route(Backend b, const Tensor<float>& sources, const Tensor<float>& g_old,
                                 const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                 const DepthOptions& opt = {});

/// The fused AttnRes routing (oasis/ops/attn_res.hpp: logits scale w^T RMSNorm(s_i) computed from the
/// sources, then attn_res_route) on the chosen backend; psi [n, N] is read with coupling only.
DepthRoute<float> attn_res(Backend b, const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain,
                           const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                           const AttnResOptions& opt = {});
/// Its backward (oasis/grad/attn_res_backward.hpp): grad sources is the total, through the mix and the keys.
AttnResGrads<float> attn_res_backward(Backend b, const Tensor<float>& sources, const Tensor<float>& w,
                                      const Tensor<float>& gain, const Tensor<float>& psi,
                                      const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                                      const DepthCotangents<float>& d);

}  // namespace oasis
