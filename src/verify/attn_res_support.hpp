// src/verify/attn_res_support.hpp — what the fused AttnRes ops (attn_res in op_depth.cpp,
// attn_res_backward in op_attn_res_backward.cpp) and the model level's Kimi router steps
// (model_grad_steps.cpp) share: a fused call's inputs, its logits g = scale w^T RMSNorm(s) and
// their error, and the keys' part of grad_sources with its bounds (docs/tolerances.md, "Fused
// AttnRes routing").
#pragma once

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "oasis/grad/backward_prob_bounds.hpp"
#include "oasis/grad/grad.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "op_support.hpp"

namespace oasis::verify::detail {

/// A fused AttnRes call: sources [n, N, d], the pseudo-query w [d], the RMSNorm gain [d] (empty:
/// none), psi [n, N] (zeros without coupling), the options.
struct AttnResCall {
  const StoredTensor* sources = nullptr;
  const StoredTensor* w = nullptr;
  Tensor<double> gain, psi;
  KeyNormOptions key_norm;
  double scale = 1.0;
  DepthOptions depth;
  std::vector<SourceKind> kinds;
  index_t n = 0, N = 0, d = 0;
  DType in16 = DType::f32;  ///< the 16-bit type of sources, w or gain, else f32
  /// The library's options of the same call (oasis/ops/attn_res.hpp).
  AttnResOptions options() const { return AttnResOptions{key_norm, scale, depth}; }
};

/// The inputs and options of op `op` (attn_res, attn_res_backward), every inconsistency a named
/// error before anything is allocated. Defaults: fla's AttnRes (normalizer softmax, eps 1e-6,
/// scale 1); coupling defaults to whether psi is given. `what`: how messages name the sources
/// (block_attn_res stacks its blocks and partial into them).
AttnResCall attn_res_call(const OpCall& c, const std::string& op, const std::string& what = "sources");

/// Block AttnRes's names for the stacked sources [b_0 .. b_{m-1}, b_n^{i-1}] (Kimi's Eq. 5-6;
/// op_block_attn_res.cpp): rows [0, blocks) of grad_sources are grad_blocks [blocks, N, d], row
/// `blocks`, with a partial, is grad_partial [N, d]. blocks < 0: grad_sources kept whole.
struct SourcesSplit {
  index_t blocks = -1;
  bool partial = false;
};

/// `m` with its "grad_sources" replaced by the parts `s` names (each element keeps its value and
/// its bound, so the parts' verdicts are those of the stacked tensor's rows).
template <class T>
void split_sources(std::map<std::string, Tensor<T>>& m, const SourcesSplit& s) {
  const auto it = m.find("grad_sources");
  if (s.blocks < 0 || it == m.end()) return;
  const Tensor<T> g = std::move(it->second);
  m.erase(it);
  const index_t N = g.dim(1), d = g.dim(2), row = N * d;
  Tensor<T> b(Shape{s.blocks, N, d});
  std::copy(g.data(), g.data() + s.blocks * row, b.data());
  m.emplace("grad_blocks", std::move(b));
  if (!s.partial) return;
  Tensor<T> p(Shape{N, d});
  std::copy(g.data() + s.blocks * row, g.data() + (s.blocks + 1) * row, p.data());
  m.emplace("grad_partial", std::move(p));
}

/// Op attn_res's check of `call` (its inputs named as attn_res's), reported as op `op`
/// (op_depth.cpp); `what` as for attn_res_call.
CompareReport attn_res_report(const OpCall& call, const std::string& op, const std::string& what = "sources");

/// Op attn_res_backward's check of `call` (its inputs named as attn_res_backward's), reported as
/// op `op`, grad_sources's reference and bounds split as `split` says (op_attn_res_backward.cpp).
CompareReport attn_res_backward_report(const OpCall& call, const std::string& op, const SourcesSplit& split = {},
                                       const std::string& what = "sources");

/// The logits scale w^T RMSNorm(s_i) computed in T ([n, N]).
template <class T>
Tensor<T> attn_res_logits(const AttnResCall& a) {
  return oasis::attn_res_logits(a.sources->values.cast<T>(), a.w->values.cast<T>(),
                                a.gain.empty() ? Tensor<T>() : a.gain.cast<T>(), a.options());
}

/// Token t's logits in T ([n, 1]).
template <class T>
Tensor<T> attn_res_token_logits(const AttnResCall& a, index_t t) {
  Tensor<T> s({a.n, 1, a.d});
  for (index_t i = 0; i < a.n; ++i)
    for (index_t c = 0; c < a.d; ++c) s(i, 0, c) = T(a.sources->values(i, t, c));
  return oasis::attn_res_logits(s, a.w->values.cast<T>(), a.gain.empty() ? Tensor<T>() : a.gain.cast<T>(), a.options());
}

/// The bound of the logits' error per unit roundoff ([n, N]): |scale| times the pseudo-query
/// logits' bound, plus the scale's product. That bound holds the dot product's (d + 3) u sum_c
/// |w_c y_c| alone, so 1/(d + 3) of it bounds u |scale| sum_c |w_c y_c| >= u |g|: the rounding of
/// scale times the logit, or of scale folded into w (fla) or into the normalised keys.
Tensor<double> attn_res_logit_err1(const AttnResCall& a);

/// The bounds of pseudo_query_logits_backward<T> with an incoming dg whose error is bounded by
/// `dg_err` (optional): lambda = 0 the worst-case line; lambda > 0 the probabilistic bound of the
/// backward's own events plus dg's error as a deterministic term (the map is linear in dg: the
/// worst-case propagation at dg = 0). `r16` > 1: every intermediate stored in a 16-bit input type
/// of unit roundoff r16 u_T, each event of the probabilistic part r16 times larger (values below
/// that type's smallest normal, off by an absolute u16 n16, are not modelled).
template <class T>
bounds::PseudoQueryBackwardBounds keys_backward_bounds(const Tensor<T>& src, const Tensor<T>& w, const Tensor<T>& gain,
                                                       const Tensor<T>& dg, const KeyNormOptions& k, double lambda,
                                                       const Tensor<double>* dg_err, double r16 = 1.0) {
  if (lambda <= 0) return bounds::pseudo_query_logits_backward_bounds(src, w, gain, dg, k, dg_err);
  bounds::PseudoQueryBackwardBounds b = bounds::prob_pseudo_query_logits_backward_bounds(src, w, gain, dg, k, lambda);
  if (r16 > 1)
    for (Tensor<double>* x : {&b.sources, &b.w, &b.gain})
      for (index_t i = 0; i < x->size(); ++i) (*x)[i] *= r16;
  if (dg_err) {
    const bounds::PseudoQueryBackwardBounds e =
        bounds::pseudo_query_logits_backward_bounds(src, w, gain, Tensor<T>(dg.shape()), k, dg_err);
    for (index_t i = 0; i < b.sources.size(); ++i) b.sources[i] += e.sources[i];
    for (index_t i = 0; i < b.w.size(); ++i) b.w[i] += e.w[i];
    for (index_t i = 0; i < b.gain.size(); ++i) b.gain[i] += e.gain[i];
  }
  return b;
}

}  // namespace oasis::verify::detail
