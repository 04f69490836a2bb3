// oasis/research/baselines.hpp — the paper's baseline attention mechanisms (docs/spec.md §4, docs/baselines.md).
//
// Token normalisers (clipped softmax and its Softmax1 form, sparsemax, entmax-1.5) are RowNorm
// values of oasis/ops/normalizer.hpp and run through oasis::token_attention; this header adds the
// mechanisms that change the attention function itself:
//
//   S1  learnable sink logit      softmax with a per-head null logit s_h (docs/spec.md §1):
//                                 p_j = e^{z_j} / (e^{s_h} + sum_k e^{z_k}), null value 0.
//                                 It is AttentionOptions{normalizer = softmax1, null_logits = s};
//                                 sink_logit_options() builds those options.
//   S2  prefix sink token         one learned key k^s_g and value v^s_g per kv head g, prepended
//                                 at key position 0 and visible to every query (Son et al. 2024):
//                                 z_{t,0} = scale <q_t, k^s_g>, A_t = sum_{j=0..Tk} p_{t,j} v'_j.
//   gated attention               a sigmoid gate on each head's context A_{b,h,t} (after the
//                                 attention, before the output projection), computed from the
//                                 block input x [B, T, d] (the normalised input that produces
//                                 q, k, v). Three forms (AttentionGate):
//     headwise                    G_{b,h,t} = sigmoid(<x_{b,t}, w_h> + c_h), w [H, d]: one scalar
//                                 per head from the full input (Qiu et al. 2025's headwise gate;
//                                 Bondarenko et al.'s "linear_all_features" option).
//     head_slice                  G_{b,h,t} = sigmoid(<x_{b,t}[h d/H : (h+1) d/H], w_h> + c_h),
//                                 w [H, d/H]: a Linear(d/H, 1) per head on that head's slice of x
//                                 (Bondarenko et al. 2023's default conditional per-token gate).
//     elementwise                 G_{b,h,t,c} = sigmoid(<x_{b,t}, w_{h d_v + c}> + c_{h d_v + c}),
//                                 w [H d_v, d]: one gate per channel of the context (Qiu et al.
//                                 2025, "Gated Attention for LLMs", their best: elementwise
//                                 sigmoid gate after SDPA, Y' = Y * sigmoid(X W)).
//                                 out = G * A (broadcast over channels for the head forms).
//   clipped softmax, OPT setting  gamma = -alpha / T (T the sequence length the model is trained
//                                 at, zeta = 1; Bondarenko et al. use alpha = 12 for OPT):
//                                 clipped_softmax_params(alpha, T).
//   StreamingLLM cache policy     incremental decoding keeps the first n_sink keys and the most
//                                 recent `window` keys of the visible prefix (Xiao et al. 2024).
//
// Combinations of the paper ("Clipped/Gated OutEffHop/AoS") are options of these functions:
// e.g. gated attention with AttentionOptions::normalizer = softmax1 is Gated OutEffHop/AoS.
#pragma once

#include <algorithm>
#include <cmath>
#include <string_view>
#include <vector>

#include "oasis/ops/attention.hpp"
#include "oasis/ops/gate.hpp"
#include "oasis/ops/prefix_sink.hpp"
#include "oasis/core/error.hpp"
#include "oasis/ops/normalizer.hpp"
#include "oasis/core/tensor.hpp"

namespace oasis {

// ------------------------------------------------------------------------------------------------
// S1: learnable sink logit.

/// Options of the S1 baseline: softmax with a learned per-query-head null logit (size H).
/// Equivalent to softmax over [z_1..z_m, s_h] with the last (null, value 0) entry dropped.
inline AttentionOptions sink_logit_options(std::vector<double> sink_logits, AttentionOptions base = {}) {
  OASIS_REQUIRE(!sink_logits.empty(), "sink_logits", "needs one logit per query head, got none");
  base.normalizer = RowNorm::softmax1;
  base.null_logits = std::move(sink_logits);
  return base;
}

// ------------------------------------------------------------------------------------------------
// Clipped softmax in the length-dependent parametrisation.

/// NormParams of clipped softmax with gamma = -alpha / seq_length and zeta = 1 (Bondarenko et al.
/// 2023's OPT setting, alpha = 12; seq_length is the sequence length the model runs at).
inline NormParams clipped_softmax_params(double alpha, index_t seq_length) {
  OASIS_REQUIRE(std::isfinite(alpha) && alpha >= 0.0, "alpha", "must be finite and >= 0, got ", alpha);
  OASIS_REQUIRE(seq_length > 0, "seq_length", "must be > 0, got ", seq_length);
  NormParams p;
  p.gamma = -alpha / static_cast<double>(seq_length);
  p.zeta = 1.0;
  return p;
}

// ------------------------------------------------------------------------------------------------
// StreamingLLM-style cache policy.

/// The cache policy: keep the first n_sink keys and the `window` most recent keys.
struct StreamingPolicy {
  index_t n_sink = 4;    ///< attention-sink tokens kept from the start (StreamingLLM uses 4)
  index_t window = 1020; ///< most recent keys kept (the current token included)
};

/// Key indices, ascending, that the policy keeps visible when `n_visible` keys (positions
/// 0..n_visible-1) are in the past of the query: [0, min(n_sink, n)) union [max(n_sink, n - window), n).
/// All n keys are kept when n <= n_sink + window.
inline std::vector<index_t> streaming_kept_keys(index_t n_visible, const StreamingPolicy& pol) {
  OASIS_REQUIRE(n_visible >= 0, "n_visible", "must be >= 0, got ", n_visible);
  OASIS_REQUIRE(pol.n_sink >= 0, "n_sink", "must be >= 0, got ", pol.n_sink);
  OASIS_REQUIRE(pol.window >= 0, "window", "must be >= 0, got ", pol.window);
  OASIS_REQUIRE(pol.n_sink + pol.window > 0, "window", "n_sink + window must keep at least one key");
  std::vector<index_t> keep;
  const index_t head = std::min(pol.n_sink, n_visible);
  for (index_t j = 0; j < head; ++j) keep.push_back(j);
  for (index_t j = std::max(head, n_visible - pol.window); j < n_visible; ++j) keep.push_back(j);
  return keep;
}

/// Attention of queries under the streaming cache policy: query t of batch b first gets its
/// visible prefix from `opt` (padding, causal bottom-right alignment — incremental decoding is
/// Tq = 1 at the end of Tk keys), then only the policy's kept keys of that prefix. Evaluated as
/// oasis::token_attention on the gathered keys (evicted keys are removed, not -inf-masked, which
/// is the same). probs (if requested) are [B, H, Tq, Tk] with zeros at evicted keys. Scores use
/// the keys as given: StreamingLLM's re-assignment of positions inside the cache is the caller's
/// positional encoding of q and k.
template <class T>
AttentionResult<T> streaming_attention(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                       const StreamingPolicy& pol, const AttentionOptions& opt = {}) {
  const AttentionShape s = check_attention_args(q, k, v, opt);
  require_basic_masking(opt, "streaming_attention");
  streaming_kept_keys(0, pol);  // validates the policy
  AttentionResult<T> r;
  r.out = Tensor<T>({s.B, s.H, s.Tq, s.d_v});
  r.lse = Tensor<T>({s.B, s.H, s.Tq});
  r.p_null = Tensor<T>({s.B, s.H, s.Tq});
  if (opt.return_probs) r.probs = Tensor<T>({s.B, s.H, s.Tq, s.Tk});

  AttentionOptions o = opt;
  o.causal = false;
  o.key_lengths.clear();
  o.return_probs = true;
  Tensor<T> q1({1, s.H, 1, s.d_h});
  for (index_t b = 0; b < s.B; ++b)
    for (index_t t = 0; t < s.Tq; ++t) {
      const std::vector<index_t> keep = streaming_kept_keys(visible_keys(s, opt, b, t), pol);
      const index_t n = static_cast<index_t>(keep.size());
      for (index_t h = 0; h < s.H; ++h) std::copy(q.ptr(b, h, t), q.ptr(b, h, t) + s.d_h, q1.ptr(0, h, 0));
      // A row with no visible key keeps one (dummy) key masked by key_lengths = 0, so the
      // normaliser's fully-masked-row rule applies exactly as in token_attention.
      const index_t nk = std::max<index_t>(n, 1);
      Tensor<T> k1({1, s.H_kv, nk, s.d_h}), v1({1, s.H_kv, nk, s.d_v});
      for (index_t g = 0; g < s.H_kv; ++g)
        for (index_t i = 0; i < n; ++i) {
          const index_t j = keep[static_cast<std::size_t>(i)];
          std::copy(k.ptr(b, g, j), k.ptr(b, g, j) + s.d_h, k1.ptr(0, g, i));
          std::copy(v.ptr(b, g, j), v.ptr(b, g, j) + s.d_v, v1.ptr(0, g, i));
        }
      o.key_lengths.assign(1, n);
      const AttentionResult<T> a = token_attention(q1, k1, v1, o);
      for (index_t h = 0; h < s.H; ++h) {
        std::copy(a.out.ptr(0, h, 0), a.out.ptr(0, h, 0) + s.d_v, r.out.ptr(b, h, t));
        r.lse(b, h, t) = a.lse(0, h, 0);
        r.p_null(b, h, t) = a.p_null(0, h, 0);
        if (opt.return_probs)
          for (index_t i = 0; i < n; ++i) r.probs(b, h, t, keep[static_cast<std::size_t>(i)]) = a.probs(0, h, 0, i);
      }
    }
  return r;
}

}  // namespace oasis
