// oasis/ops/gate.hpp — gated attention: a sigmoid gate on each head's context, after the
// attention and before the output projection. It is an op of the model (ModelConfig::gated_attention)
// and one of the paper's baselines (oasis/research/baselines.hpp, docs/baselines.md), where the
// three forms are described:
//   headwise     G_{b,h,t}   = sigmoid(<x_{b,t}, w_h> + c_h),                       w [H, d]
//   head_slice   G_{b,h,t}   = sigmoid(<x_{b,t}[h d/H : (h+1) d/H], w_h> + c_h),   w [H, d/H]
//   elementwise  G_{b,h,t,c} = sigmoid(<x_{b,t}, w_{h d_v + c}> + c_{h d_v + c}),   w [H d_v, d]
//   out = G * A (broadcast over channels for the head forms).
#pragma once

#include <cmath>
#include <string_view>
#include <vector>

#include "oasis/core/error.hpp"
#include "oasis/core/tensor.hpp"
#include "oasis/ops/attention.hpp"

namespace oasis {

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

}  // namespace oasis
