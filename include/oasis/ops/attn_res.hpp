// oasis/ops/attn_res.hpp — the fused AttnRes routing of one layer, as fla's `naive_attnres` and its
// kernels compute it (docs/spec.md §4, "Fused AttnRes routing"):
//
//   g_i = scale w^T RMSNorm(s_i)        (pseudo_query_logits times scale; gain optional)
//   (h, alpha, alpha_null) = attn_res_route(sources, g, psi, kinds, depth)
//
// The logits are never an input: a fused kernel computes them from the sources it also mixes.
// Block AttnRes (Kimi Eq. 5–6) routes over the stacked sources [b_0, ..., b_{m-1}, b_n^{i-1}]:
// stack_block_sources builds them, the partial sum last.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "oasis/ops/depth.hpp"

namespace oasis {

/// The options of the fused routing. Defaults: fla's AttnRes — plain softmax, no coupling,
/// eps 1e-6, scale 1.
struct AttnResOptions {
  KeyNormOptions key_norm{};
  double scale = 1.0;
  DepthOptions depth = [] {
    DepthOptions d;
    d.normalizer = RowNorm::softmax;
    d.coupling = false;
    return d;
  }();
};

/// The shape checks of a fused call, in the reference's order and words (the backends' dispatcher
/// runs them before it calls an op): sources [n, N, d], w [d], gain [d] or empty, psi [n, N], n kinds.
template <class T>
RouteShape check_attn_res_shapes(const Tensor<T>& sources, const Tensor<T>& w, const Tensor<T>& gain,
                                 const Tensor<T>& psi, const std::vector<SourceKind>& kinds) {
  require_rank(sources, 3, "sources", "[n, N, d]");
  require_rank(psi, 2, "psi", "[n, N]");
  const RouteShape s{sources.dim(0), sources.dim(1), sources.dim(2)};
  OASIS_REQUIRE(s.n > 0 && s.N > 0 && s.d > 0, "sources", "empty dimension in ", shape_str(sources.shape()));
  OASIS_REQUIRE(psi.dim(0) == s.n && psi.dim(1) == s.N, "psi", "shape ", shape_str(psi.shape()),
                " does not match sources [n, N] = [", s.n, ", ", s.N, "]");
  OASIS_REQUIRE(static_cast<index_t>(kinds.size()) == s.n, "kinds", "has ", kinds.size(), " entries but there are ",
                s.n, " sources");
  require_rank(w, 1, "w", "[d]");
  OASIS_REQUIRE(w.dim(0) == s.d, "w", "has ", w.dim(0), " entries, sources have width d = ", s.d);
  OASIS_REQUIRE(gain.empty() || (gain.rank() == 1 && gain.dim(0) == s.d), "gain", "shape ", shape_str(gain.shape()),
                " is not [d] = [", s.d, "]");
  return s;
}

/// The fused logits g = scale w^T RMSNorm(s_i), [n, N]; the checks of pseudo_query_logits plus a
/// finite scale.
template <class T>
Tensor<T> attn_res_logits(const Tensor<T>& sources, const Tensor<T>& w, const Tensor<T>& gain,
                          const AttnResOptions& opt) {
  OASIS_REQUIRE(std::isfinite(opt.scale), "scale", "must be finite, got ", opt.scale);
  Tensor<T> g = pseudo_query_logits(sources, w, gain, opt.key_norm);
  const T s(opt.scale);
  for (index_t i = 0; i < g.size(); ++i) g[i] = g[i] * s;
  return g;
}

/// The reference fused routing: sources [n, N, d], w [d], gain [d] or empty, psi [n, N] (read with
/// coupling; any values without), kinds of the n candidates. DepthRoute::g holds the routed logits
/// (coupled when coupling is on, else scale w^T RMSNorm(s_i)).
template <class T>
DepthRoute<T> attn_res(const Tensor<T>& sources, const Tensor<T>& w, const Tensor<T>& gain, const Tensor<T>& psi,
                       const std::vector<SourceKind>& kinds, const AttnResOptions& opt) {
  const Tensor<T> g = attn_res_logits(sources, w, gain, opt);
  return attn_res_route(sources, g, psi, kinds, opt.depth);
}

/// Block AttnRes's sources: blocks [m, N, d] (b_0 .. b_{m-1}, m >= 1) then, when given, the
/// partial sum [N, d] of the current block; [m (+ 1), N, d].
template <class T>
Tensor<T> stack_block_sources(const Tensor<T>& blocks, const Tensor<T>& partial) {
  require_rank(blocks, 3, "blocks", "[m, N, d]");
  const index_t m = blocks.dim(0), N = blocks.dim(1), d = blocks.dim(2);
  OASIS_REQUIRE(m >= 1, "blocks", "needs at least b_0 (the embedding), got m = 0");
  OASIS_REQUIRE(partial.empty() || partial.shape() == (Shape{N, d}), "partial", "shape ", shape_str(partial.shape()),
                " is not [N, d] = [", N, ", ", d, "]");
  Tensor<T> s({m + (partial.empty() ? 0 : 1), N, d});
  std::copy(blocks.data(), blocks.data() + blocks.size(), s.data());
  if (!partial.empty()) std::copy(partial.data(), partial.data() + partial.size(), s.ptr(m));
  return s;
}

/// Block AttnRes's routing: attn_res over stack_block_sources(blocks, partial); alpha's last row
/// is the partial sum's weight when it is given. psi and kinds describe the stacked sources.
template <class T>
DepthRoute<T> block_attn_res(const Tensor<T>& blocks, const Tensor<T>& partial, const Tensor<T>& w,
                             const Tensor<T>& gain, const Tensor<T>& psi, const std::vector<SourceKind>& kinds,
                             const AttnResOptions& opt) {
  return attn_res(stack_block_sources(blocks, partial), w, gain, psi, kinds, opt);
}

}  // namespace oasis
