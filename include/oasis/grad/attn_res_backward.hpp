// oasis/grad/attn_res_backward.hpp — the backward of the fused AttnRes routing (oasis/ops/attn_res.hpp):
//
//   dg  = scale dL/dg_old                          (attn_res_route_backward's dL/dg_old, times scale)
//   dL/ds_i = alpha_i dL/dh + RMSNorm-backward(s_i; dg_i w)      (through the mix and the keys)
//   dL/dw   = sum_{i,t} dg_{i,t} RMSNorm(s_i)_t,   dL/dgain from the keys (pseudo_query_logits_backward)
//
// grad sources is the total of both paths: what a fused kernel's autograd gives.
#pragma once

#include <algorithm>
#include <vector>

#include "oasis/grad/depth_backward.hpp"
#include "oasis/grad/pseudo_query_backward.hpp"
#include "oasis/ops/attn_res.hpp"

namespace oasis {

/// Gradients of attn_res(sources, w, gain, psi, kinds, opt).
template <class T>
struct AttnResGrads {
  Tensor<T> sources;  ///< [n, N, d], the total: through the mix and through the keys
  Tensor<T> w;        ///< [d]
  Tensor<T> gain;     ///< [d]; empty without a gain
  Tensor<T> psi;      ///< [n, N]; 0 for candidates whose psi is not read (and without coupling)
  Tensor<T> logits;   ///< [n, N], dL/dg of the scaled logits g = scale w^T RMSNorm(s_i) (the keys' cotangent)
  T beta = T(0);      ///< as DepthGrads::beta
  T theta = T(0);     ///< as DepthGrads::theta
};

/// The backward of attn_res given its logits g = attn_res_logits(sources, w, gain, opt) (the
/// forward's, not recomputed).
template <class T>
AttnResGrads<T> attn_res_backward_from_logits(const Tensor<T>& sources, const Tensor<T>& w, const Tensor<T>& gain,
                                              const Tensor<T>& psi, const std::vector<SourceKind>& kinds,
                                              const AttnResOptions& opt, const DepthCotangents<T>& d, const Tensor<T>& g) {
  DepthGrads<T> dr = attn_res_route_backward(sources, g, psi, kinds, opt.depth, d);
  AttnResGrads<T> r;
  r.logits = std::move(dr.g_old);
  Tensor<T> dg_raw = r.logits;  // dL/d(w^T RMSNorm(s_i)) = scale dL/dg
  const T s(opt.scale);
  for (index_t i = 0; i < dg_raw.size(); ++i) dg_raw[i] = dg_raw[i] * s;
  PseudoQueryGrads<T> k = pseudo_query_logits_backward(sources, w, gain, dg_raw, opt.key_norm);
  r.sources = std::move(dr.sources);
  for (index_t i = 0; i < r.sources.size(); ++i) r.sources[i] = r.sources[i] + k.sources[i];
  r.w = std::move(k.w);
  r.gain = std::move(k.gain);
  r.psi = std::move(dr.psi);
  r.beta = dr.beta;
  r.theta = dr.theta;
  return r;
}

/// The reference backward of attn_res from the cotangents of h, alpha, alpha_null.
template <class T>
AttnResGrads<T> attn_res_backward(const Tensor<T>& sources, const Tensor<T>& w, const Tensor<T>& gain,
                                  const Tensor<T>& psi, const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                                  const DepthCotangents<T>& d) {
  return attn_res_backward_from_logits(sources, w, gain, psi, kinds, opt, d, attn_res_logits(sources, w, gain, opt));
}

/// Gradients of block_attn_res: the stacked sources' total split into the blocks and the partial sum.
template <class T>
struct BlockAttnResGrads {
  Tensor<T> blocks;   ///< [m, N, d]
  Tensor<T> partial;  ///< [N, d]; empty when no partial sum was given
  AttnResGrads<T> fused;  ///< w, gain, psi, logits, beta, theta (fused.sources is left empty)
};

/// Splits attn_res_backward's grad sources [m (+ 1), N, d] into the blocks' and the partial sum's.
template <class T>
BlockAttnResGrads<T> split_block_grads(AttnResGrads<T> g, index_t m, bool has_partial) {
  BlockAttnResGrads<T> r;
  const index_t N = g.sources.dim(1), d = g.sources.dim(2);
  r.blocks = Tensor<T>({m, N, d});
  std::copy(g.sources.data(), g.sources.data() + r.blocks.size(), r.blocks.data());
  if (has_partial) {
    r.partial = Tensor<T>({N, d});
    std::copy(g.sources.ptr(m), g.sources.ptr(m) + r.partial.size(), r.partial.data());
  }
  g.sources = Tensor<T>();
  r.fused = std::move(g);
  return r;
}

/// The reference backward of block_attn_res.
template <class T>
BlockAttnResGrads<T> block_attn_res_backward(const Tensor<T>& blocks, const Tensor<T>& partial, const Tensor<T>& w,
                                             const Tensor<T>& gain, const Tensor<T>& psi,
                                             const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                                             const DepthCotangents<T>& d) {
  const Tensor<T> s = stack_block_sources(blocks, partial);
  return split_block_grads(attn_res_backward(s, w, gain, psi, kinds, opt, d), blocks.dim(0), !partial.empty());
}

}  // namespace oasis
