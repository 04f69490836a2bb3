// The packed and paged layouts on every backend (oasis/backends/layouts.hpp): the reference's
// stitching (attention_varlen_with, attention_paged_with) around the backend's dense op.
#include "oasis/backends/layouts.hpp"

namespace oasis {
namespace {

/// The availability check of the dispatcher, before any argument is looked at.
const BackendOps& usable(const BackendOps& b) {
  const std::string why = backend_unavailable_reason(b);
  OASIS_REQUIRE(why.empty(), "backend", b.name, " is not available: ", why);
  return b;
}

}  // namespace

AttentionResult<float> token_attention_varlen(const BackendOps& b, const Tensor<float>& q, const Tensor<float>& k,
                                              const Tensor<float>& v, const std::vector<index_t>& cu_seqlens_q,
                                              const std::vector<index_t>& cu_seqlens_k, const AttentionOptions& opt) {
  const BackendOps& ops = usable(b);
  return attention_varlen_with(q, k, v, cu_seqlens_q, cu_seqlens_k, opt,
                               [&ops](const Tensor<float>& qi, const Tensor<float>& ki, const Tensor<float>& vi,
                                      const AttentionOptions& o) { return token_attention(ops, qi, ki, vi, o); });
}

AttentionResult<float> token_attention_varlen(Backend b, const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                                              const std::vector<index_t>& cu_seqlens_q,
                                              const std::vector<index_t>& cu_seqlens_k, const AttentionOptions& opt) {
  return token_attention_varlen(backend_ops(b), q, k, v, cu_seqlens_q, cu_seqlens_k, opt);
}

AttentionGrads<float> token_attention_varlen_backward(const BackendOps& b, const Tensor<float>& q, const Tensor<float>& k,
                                                      const Tensor<float>& v, const std::vector<index_t>& cu_seqlens_q,
                                                      const std::vector<index_t>& cu_seqlens_k,
                                                      const AttentionCotangents<float>& d, const AttentionOptions& opt) {
  const BackendOps& ops = usable(b);
  return attention_varlen_backward_with(
      q, k, v, cu_seqlens_q, cu_seqlens_k, d, opt,
      [&ops](const Tensor<float>& qi, const Tensor<float>& ki, const Tensor<float>& vi, const AttentionCotangents<float>& di,
             const AttentionOptions& o) { return token_attention_backward(ops, qi, ki, vi, di, o); });
}

AttentionGrads<float> token_attention_varlen_backward(Backend b, const Tensor<float>& q, const Tensor<float>& k,
                                                      const Tensor<float>& v, const std::vector<index_t>& cu_seqlens_q,
                                                      const std::vector<index_t>& cu_seqlens_k,
                                                      const AttentionCotangents<float>& d, const AttentionOptions& opt) {
  return token_attention_varlen_backward(backend_ops(b), q, k, v, cu_seqlens_q, cu_seqlens_k, d, opt);
}

AttentionResult<float> token_attention_paged(const BackendOps& b, const Tensor<float>& q, const Tensor<float>& k_cache,
                                             const Tensor<float>& v_cache, const Tensor<index_t>& block_table,
                                             const std::vector<index_t>& seq_lens, const AttentionOptions& opt) {
  const BackendOps& ops = usable(b);
  return attention_paged_with(q, k_cache, v_cache, block_table, seq_lens, opt,
                              [&ops](const Tensor<float>& qi, const Tensor<float>& ki, const Tensor<float>& vi,
                                     const AttentionOptions& o) { return token_attention(ops, qi, ki, vi, o); });
}

AttentionResult<float> token_attention_paged(Backend b, const Tensor<float>& q, const Tensor<float>& k_cache,
                                             const Tensor<float>& v_cache, const Tensor<index_t>& block_table,
                                             const std::vector<index_t>& seq_lens, const AttentionOptions& opt) {
  return token_attention_paged(backend_ops(b), q, k_cache, v_cache, block_table, seq_lens, opt);
}

DepthRoute<float> block_attn_res(const BackendOps& b, const Tensor<float>& blocks, const Tensor<float>& partial,
                                 const Tensor<float>& w, const Tensor<float>& gain, const Tensor<float>& psi,
                                 const std::vector<SourceKind>& kinds, const AttnResOptions& opt) {
  const BackendOps& ops = usable(b);
  return attn_res(ops, stack_block_sources(blocks, partial), w, gain, psi, kinds, opt);
}

DepthRoute<float> block_attn_res(Backend b, const Tensor<float>& blocks, const Tensor<float>& partial,
                                 const Tensor<float>& w, const Tensor<float>& gain, const Tensor<float>& psi,
                                 const std::vector<SourceKind>& kinds, const AttnResOptions& opt) {
  return block_attn_res(backend_ops(b), blocks, partial, w, gain, psi, kinds, opt);
}

BlockAttnResGrads<float> block_attn_res_backward(const BackendOps& b, const Tensor<float>& blocks,
                                                 const Tensor<float>& partial, const Tensor<float>& w,
                                                 const Tensor<float>& gain, const Tensor<float>& psi,
                                                 const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                                                 const DepthCotangents<float>& d) {
  const BackendOps& ops = usable(b);
  const Tensor<float> s = stack_block_sources(blocks, partial);  // validates blocks' rank before dim(0) is read
  return split_block_grads(attn_res_backward(ops, s, w, gain, psi, kinds, opt, d), blocks.dim(0), !partial.empty());
}

BlockAttnResGrads<float> block_attn_res_backward(Backend b, const Tensor<float>& blocks, const Tensor<float>& partial,
                                                 const Tensor<float>& w, const Tensor<float>& gain,
                                                 const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                                 const AttnResOptions& opt, const DepthCotangents<float>& d) {
  return block_attn_res_backward(backend_ops(b), blocks, partial, w, gain, psi, kinds, opt, d);
}

}  // namespace oasis
