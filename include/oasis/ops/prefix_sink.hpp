// oasis/ops/prefix_sink.hpp — the prefix sink token (the paper's S2 baseline, Son et al. 2024):
// one learned key k^s_g and value v^s_g per kv head g, prepended at key position 0 and visible to
// every query: z_{t,0} = scale <q_t, k^s_g>, A_t = sum_{j=0..Tk} p_{t,j} v'_j. It is an op of the
// model (ModelConfig::prefix_sink) and a baseline (oasis/research/baselines.hpp, docs/baselines.md).
#pragma once

#include <vector>

#include "oasis/core/error.hpp"
#include "oasis/core/tensor.hpp"
#include "oasis/ops/attention.hpp"

namespace oasis {

template <class T>
struct PrefixSinkResult {
  AttentionResult<T> attn;  ///< over Tk + 1 keys; probs (if requested) [B, H, Tq, Tk + 1], column 0 = sink
  Tensor<T> p_sink;         ///< [B, H, Tq] probability of the sink key
};

/// Attention with a learned sink token prepended to every sequence (baseline S2).
/// sink_k [H_kv, d_h], sink_v [H_kv, d_v]. Key lengths of `opt` count real keys only; the sink
/// is always visible (also to causal queries and to rows whose real keys are all padding), so no
/// row is ever fully masked. The sink is not rotated by any positional encoding (q, k are
/// taken as given).
template <class T>
PrefixSinkResult<T> prefix_sink_attention(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                          const Tensor<T>& sink_k, const Tensor<T>& sink_v,
                                          const AttentionOptions& opt = {}) {
  const AttentionShape s = check_attention_args(q, k, v, opt);
  require_basic_masking(opt, "prefix_sink_attention");
  require_rank(sink_k, 2, "sink_k", "[H_kv, d_h]");
  require_rank(sink_v, 2, "sink_v", "[H_kv, d_v]");
  OASIS_REQUIRE(sink_k.dim(0) == s.H_kv && sink_k.dim(1) == s.d_h, "sink_k", "shape ",
                shape_str(sink_k.shape()), " expected [", s.H_kv, ", ", s.d_h, "]");
  OASIS_REQUIRE(sink_v.dim(0) == s.H_kv && sink_v.dim(1) == s.d_v, "sink_v", "shape ",
                shape_str(sink_v.shape()), " expected [", s.H_kv, ", ", s.d_v, "]");
  require_finite(sink_k, "sink_k");
  require_finite(sink_v, "sink_v");

  // k' = [sink; k], v' = [sink; v] along the key axis.
  Tensor<T> k2({s.B, s.H_kv, s.Tk + 1, s.d_h}), v2({s.B, s.H_kv, s.Tk + 1, s.d_v});
  for (index_t b = 0; b < s.B; ++b)
    for (index_t g = 0; g < s.H_kv; ++g) {
      std::copy(sink_k.ptr(g), sink_k.ptr(g) + s.d_h, k2.ptr(b, g, 0));
      std::copy(sink_v.ptr(g), sink_v.ptr(g) + s.d_v, v2.ptr(b, g, 0));
      std::copy(k.ptr(b, g), k.ptr(b, g) + s.Tk * s.d_h, k2.ptr(b, g, 1));
      std::copy(v.ptr(b, g), v.ptr(b, g) + s.Tk * s.d_v, v2.ptr(b, g, 1));
    }
  AttentionOptions o = opt;
  for (index_t& n : o.key_lengths) n += 1;  // the sink is a real, always visible key
  // Causal visibility is bottom-right aligned (j <= t + Tk' - Tq), so prepending one key keeps
  // each query's real keys and adds the sink.
  o.return_probs = true;
  PrefixSinkResult<T> r;
  r.attn = token_attention(q, k2, v2, o);
  r.p_sink = Tensor<T>({s.B, s.H, s.Tq});
  for (index_t b = 0; b < s.B; ++b)
    for (index_t h = 0; h < s.H; ++h)
      for (index_t t = 0; t < s.Tq; ++t) r.p_sink(b, h, t) = r.attn.probs(b, h, t, 0);
  if (!opt.return_probs) r.attn.probs = Tensor<T>();
  return r;
}

}  // namespace oasis
