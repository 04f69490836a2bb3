// oasis/backends/layouts.hpp — the packed (THD, varlen) and paged-cache layouts of token attention,
// and Block AttnRes's blocks plus partial sum, on every backend (docs/spec.md §8, "Packed and paged
// layouts"; the references: oasis/ops/varlen.hpp, oasis/ops/paged.hpp, oasis/ops/attn_res.hpp).
//
// An adaptor, not a kernel: each call validates the packed or paged arguments once, then runs the
// chosen backend's dense op (token_attention, token_attention_backward of oasis/backends/backend.hpp)
// on each sequence's dense copy and stitches the results. So cpu_fast and cuda inherit both
// layouts with their dense kernels' accuracy; no native packed or paged kernel is written, and the
// copies cost one pass over q, k, v per call. Block AttnRes stacks its sources once and runs the
// backend's fused attn_res.
#pragma once

#include <vector>

#include "oasis/backends/backend.hpp"
#include "oasis/ops/paged.hpp"
#include "oasis/ops/varlen.hpp"

namespace oasis {

/// Packed attention: q [total_q, H, d_h], k [total_k, H_kv, d_h], v [total_k, H_kv, d_v],
/// cu_seqlens_q / cu_seqlens_k of B + 1 offsets; out [total_q, H, d_v], lse and p_null [H, total_q].
AttentionResult<float> token_attention_varlen(const BackendOps& b, const Tensor<float>& q, const Tensor<float>& k,
                                              const Tensor<float>& v, const std::vector<index_t>& cu_seqlens_q,
                                              const std::vector<index_t>& cu_seqlens_k, const AttentionOptions& opt = {});
AttentionResult<float> token_attention_varlen(Backend b, const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                              const std::vector<index_t>& cu_seqlens_q,
                                              const std::vector<index_t>& cu_seqlens_k, const AttentionOptions& opt = {});

/// Its backward: d.out [total_q, H, d_v], d.lse and d.p_null [H, total_q] (empty: 0); the gradients
/// of q, k, v packed, null_logits [H] summed over the sequences in order (softmax1).
AttentionGrads<float> token_attention_varlen_backward(const BackendOps& b, const Tensor<float>& q, const Tensor<float>& k,
                                                      const Tensor<float>& v, const std::vector<index_t>& cu_seqlens_q,
                                                      const std::vector<index_t>& cu_seqlens_k,
                                                      const AttentionCotangents<float>& d, const AttentionOptions& opt = {});
AttentionGrads<float> token_attention_varlen_backward(Backend b, const Tensor<float>& q, const Tensor<float>& k,
                                                      const Tensor<float>& v, const std::vector<index_t>& cu_seqlens_q,
                                                      const std::vector<index_t>& cu_seqlens_k,
                                                      const AttentionCotangents<float>& d, const AttentionOptions& opt = {});

/// Attention over a paged cache: q [B, H, Tq, d_h] (layout of the options), k_cache / v_cache
/// [num_blocks, block_size, H_kv, d], block_table [B, max_blocks], seq_lens [B]; out in q's layout,
/// lse and p_null [B, H, Tq].
AttentionResult<float> token_attention_paged(const BackendOps& b, const Tensor<float>& q, const Tensor<float>& k_cache,
                                             const Tensor<float>& v_cache, const Tensor<index_t>& block_table,
                                             const std::vector<index_t>& seq_lens, const AttentionOptions& opt = {});
AttentionResult<float> token_attention_paged(Backend b, const Tensor<float>& q, const Tensor<float>& k_cache,
                                             const Tensor<float>& v_cache, const Tensor<index_t>& block_table,
                                             const std::vector<index_t>& seq_lens, const AttentionOptions& opt = {});

/// Block AttnRes (oasis/ops/attn_res.hpp block_attn_res): blocks [m, N, d], partial [N, d] or empty;
/// the backend's fused attn_res on the stacked sources (one copy of the blocks per call).
DepthRoute<float> block_attn_res(const BackendOps& b, const Tensor<float>& blocks, const Tensor<float>& partial,
                                 const Tensor<float>& w, const Tensor<float>& gain, const Tensor<float>& psi,
                                 const std::vector<SourceKind>& kinds, const AttnResOptions& opt = {});
DepthRoute<float> block_attn_res(Backend b, const Tensor<float>& blocks, const Tensor<float>& partial,
                                 const Tensor<float>& w, const Tensor<float>& gain, const Tensor<float>& psi,
                                 const std::vector<SourceKind>& kinds, const AttnResOptions& opt = {});
/// Its backward: the backend's attn_res_backward on the stacked sources, split by split_block_grads.
BlockAttnResGrads<float> block_attn_res_backward(const BackendOps& b, const Tensor<float>& blocks,
                                                 const Tensor<float>& partial, const Tensor<float>& w,
                                                 const Tensor<float>& gain, const Tensor<float>& psi,
                                                 const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                                                 const DepthCotangents<float>& d);
BlockAttnResGrads<float> block_attn_res_backward(Backend b, const Tensor<float>& blocks, const Tensor<float>& partial,
                                                 const Tensor<float>& w, const Tensor<float>& gain,
                                                 const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                                 const AttnResOptions& opt, const DepthCotangents<float>& d);

}  // namespace oasis
