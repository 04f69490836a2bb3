// oasis/baselines.hpp — the paper's baseline attention mechanisms (SPEC §4, docs/baselines.md).
//
// Token normalisers (clipped softmax and its Softmax1 form, sparsemax, entmax-1.5) are RowNorm
// values of oasis/normalizer.hpp and run through oasis::token_attention; this header adds the
// mechanisms that change the attention function itself:
//
//   S1  learnable sink logit      softmax with a per-head null logit s_h (SPEC §1):
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

#include "oasis/attention.hpp"
#include "oasis/error.hpp"
#include "oasis/normalizer.hpp"
#include "oasis/tensor.hpp"

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
// S2: prefix sink token with a learned key and value.

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

// ------------------------------------------------------------------------------------------------
// Gated attention.

/// The form of the attention gate (see the header comment).
enum class AttentionGate {
  headwise,     ///< one gate per head from the full input, w [H, d] (Qiu et al. headwise)
  head_slice,   ///< one gate per head from its slice of the input, w [H, d/H] (Bondarenko et al.)
  elementwise,  ///< one gate per context channel, w [H d_v, d] (Qiu et al. elementwise)
};

inline std::string_view to_string(AttentionGate g) {
  switch (g) {
    case AttentionGate::headwise: return "headwise";
    case AttentionGate::head_slice: return "head_slice";
    case AttentionGate::elementwise: return "elementwise";
  }
  return "unknown";
}

namespace detail {
/// sigmoid(<x[b, t, off : off + n], w_row> + bias) for every (b, t): the common gate logit.
template <class T>
T gate_value(const Tensor<T>& x, index_t b, index_t t, index_t off, const T* w, index_t n, const T& bias) {
  T a = bias;
  const T* xt = x.ptr(b, t) + off;
  for (index_t c = 0; c < n; ++c) a += xt[c] * w[c];
  return sigmoid(a);
}
template <class T>
void check_gate_input(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, index_t rows,
                      index_t width, const char* w_shape) {
  require_rank(x, 3, "x", "[B, T, d]");
  require_rank(w, 2, "w_gate", w_shape);
  OASIS_REQUIRE(x.dim(0) > 0 && x.dim(1) > 0 && x.dim(2) > 0, "x", "empty dimension in shape ", shape_str(x.shape()));
  OASIS_REQUIRE(rows > 0, "w_gate", "needs at least one row, got shape ", shape_str(w.shape()));
  OASIS_REQUIRE(w.dim(1) == width, "w_gate", "shape ", shape_str(w.shape()), " expected ", w_shape, " with width ",
                width, " (x has width ", x.dim(2), ")");
  OASIS_REQUIRE(bias.empty() || (bias.rank() == 1 && bias.dim(0) == rows), "b_gate", "shape ",
                shape_str(bias.shape()), " expected [", rows, "] or empty");
  require_finite(x, "x");
  require_finite(w, "w_gate");
  require_finite(bias, "b_gate");
}
}  // namespace detail

/// Headwise gates G[b, h, t] = sigmoid(<x[b, t, :], w_gate[h, :]> + b_gate[h]).
/// x [B, T, d] is the block input; w_gate [H, d]; b_gate [H] or empty (no bias).
template <class T>
Tensor<T> head_gates(const Tensor<T>& x, const Tensor<T>& w_gate, const Tensor<T>& b_gate = {}) {
  require_rank(w_gate, 2, "w_gate", "[H, d]");
  require_rank(x, 3, "x", "[B, T, d]");
  detail::check_gate_input(x, w_gate, b_gate, w_gate.dim(0), x.dim(2), "[H, d]");
  const index_t B = x.dim(0), T_ = x.dim(1), d = x.dim(2), H = w_gate.dim(0);
  Tensor<T> g({B, H, T_});
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < T_; ++t)
        g(b, h, t) = detail::gate_value(x, b, t, 0, w_gate.ptr(h), d, b_gate.empty() ? T(0) : b_gate[h]);
  return g;
}

/// Head-slice gates (Bondarenko et al. 2023): G[b, h, t] = sigmoid(<x[b, t, h s : (h+1) s],
/// w_gate[h, :]> + b_gate[h]) with s = d / H. x [B, T, d] with d divisible by H; w_gate [H, d/H].
template <class T>
Tensor<T> head_slice_gates(const Tensor<T>& x, const Tensor<T>& w_gate, const Tensor<T>& b_gate = {}) {
  require_rank(w_gate, 2, "w_gate", "[H, d/H]");
  require_rank(x, 3, "x", "[B, T, d]");
  const index_t H = w_gate.dim(0), d = x.dim(2);
  OASIS_REQUIRE(H > 0 && d % H == 0, "w_gate", "x's width ", d, " is not divisible by the number of heads ", H);
  const index_t s = d / H;
  detail::check_gate_input(x, w_gate, b_gate, H, s, "[H, d/H]");
  const index_t B = x.dim(0), T_ = x.dim(1);
  Tensor<T> g({B, H, T_});
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < T_; ++t)
        g(b, h, t) = detail::gate_value(x, b, t, h * s, w_gate.ptr(h), s, b_gate.empty() ? T(0) : b_gate[h]);
  return g;
}

/// Elementwise gates (Qiu et al. 2025): G[b, h, t, c] = sigmoid(<x[b, t, :], w_gate[h d_v + c, :]>
/// + b_gate[h d_v + c]). x [B, T, d]; w_gate [H d_v, d] (nn.Linear layout, output channel h d_v + c
/// is channel c of head h); b_gate [H d_v] or empty. Returns [B, H, T, d_v].
template <class T>
Tensor<T> elementwise_gates(const Tensor<T>& x, const Tensor<T>& w_gate, index_t H, const Tensor<T>& b_gate = {}) {
  require_rank(w_gate, 2, "w_gate", "[H d_v, d]");
  require_rank(x, 3, "x", "[B, T, d]");
  OASIS_REQUIRE(H > 0 && w_gate.dim(0) % H == 0 && w_gate.dim(0) > 0, "w_gate", "rows ", w_gate.dim(0),
                " are not a positive multiple of the number of heads ", H);
  detail::check_gate_input(x, w_gate, b_gate, w_gate.dim(0), x.dim(2), "[H d_v, d]");
  const index_t B = x.dim(0), T_ = x.dim(1), d = x.dim(2), dv = w_gate.dim(0) / H;
  Tensor<T> g({B, H, T_, dv});
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < T_; ++t)
        for (index_t c = 0; c < dv; ++c) {
          const index_t r = h * dv + c;
          g(b, h, t, c) = detail::gate_value(x, b, t, 0, w_gate.ptr(r), d, b_gate.empty() ? T(0) : b_gate[r]);
        }
  return g;
}

template <class T>
struct GatedAttentionResult {
  AttentionResult<T> attn;  ///< attn.out is the gated context G * A; lse/p_null/probs are ungated
  Tensor<T> gates;          ///< [B, H, Tq] (headwise, head_slice) or [B, H, Tq, d_v] (elementwise)
};

/// Gated attention (reference): token attention with any normaliser (softmax: "Gated
/// Attention"; softmax1: "Gated OutEffHop/AoS"), then each head's context multiplied by its
/// gate of form `kind`, before the output projection. x [B, Tq, d] is the block input of the
/// queries; w_gate / b_gate have the shapes of head_gates, head_slice_gates or elementwise_gates.
template <class T>
GatedAttentionResult<T> gated_attention(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                        const Tensor<T>& x, const Tensor<T>& w_gate,
                                        const Tensor<T>& b_gate = {}, const AttentionOptions& opt = {},
                                        AttentionGate kind = AttentionGate::headwise) {
  const AttentionShape s = check_attention_args(q, k, v, opt);
  require_basic_masking(opt, "gated_attention");
  require_rank(x, 3, "x", "[B, Tq, d]");
  OASIS_REQUIRE(x.dim(0) == s.B && x.dim(1) == s.Tq, "x", "shape ", shape_str(x.shape()),
                " does not match q's [B, Tq] = [", s.B, ", ", s.Tq, "]");
  const index_t rows = kind == AttentionGate::elementwise ? s.H * s.d_v : s.H;
  OASIS_REQUIRE(w_gate.rank() == 2 && w_gate.dim(0) == rows, "w_gate", "shape ", shape_str(w_gate.shape()),
                " expected ", rows, " rows for the ", to_string(kind), " gate (H = ", s.H, ", d_v = ", s.d_v, ")");
  GatedAttentionResult<T> r;
  switch (kind) {
    case AttentionGate::headwise: r.gates = head_gates(x, w_gate, b_gate); break;
    case AttentionGate::head_slice: r.gates = head_slice_gates(x, w_gate, b_gate); break;
    case AttentionGate::elementwise: r.gates = elementwise_gates(x, w_gate, s.H, b_gate); break;
  }
  r.attn = token_attention(q, k, v, opt);
  const bool per_channel = kind == AttentionGate::elementwise;
  for (index_t b = 0; b < s.B; ++b)
    for (index_t h = 0; h < s.H; ++h)
      for (index_t t = 0; t < s.Tq; ++t) {
        T* o = r.attn.out.ptr(b, h, t);
        for (index_t c = 0; c < s.d_v; ++c) o[c] *= per_channel ? r.gates(b, h, t, c) : r.gates(b, h, t);
      }
  return r;
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
