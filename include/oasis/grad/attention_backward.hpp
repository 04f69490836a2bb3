// oasis/grad/attention_backward.hpp — the backward of token attention (docs/spec.md §8).
//
// Per (batch b, query head h, query t), with the forward's scores z_{t,j} (scale and bias included),
// probabilities p_{t,j}, null probability p_null,t, output O_t and the incoming gradients dO_t of
// the output, dLSE_t of LSE1 and dP_t of p_null:
//   dp_{t,j} = <dO_t, v_j>                       (the null's value is 0: its dp is dP_t)
//   dz_{t,j}, ds_t                                normalize_row_backward (grad/normalizer_backward.hpp):
//                                                 dz_{t,j} = p_{t,j} (<dO_t, v_j> - D_t) + p_{t,j} dLSE_t - p_{t,j} p_null,t dP_t
//                                                 ds_t     = -p_null,t D_t + p_null,t dLSE_t + p_null,t (1 - p_null,t) dP_t
//                                                 D_t      = <dO_t, O_t> = sum_j p_{t,j} dp_{t,j}
//   dq_t     = scale sum_j dz_{t,j} k_j
//   dk_j     = scale sum_{h in group, t} dz_{t,j} q_t        (GQA: summed over the group's query heads)
//   dv_j     = sum_{h in group, t} p_{t,j} dO_t
//   ds_h     = sum_{b, t} ds_t                                (per query head: not summed over the group)
//   dbias    = dz summed over the dimensions the bias broadcasts over
// Masks (causal, padding with the Tk - Tq offset, window, -inf bias) are those of the forward
// (visible_range): a masked key has p = 0 and receives nothing. A fully masked Softmax1 row has
// p_null = 1, O = 0 and passes dLSE_t to its null logit; a fully masked plain-softmax row (the
// documented zero) passes nothing. The gradient of an infinite null logit (-inf: no null; +inf:
// all the mass on it, normalizer.hpp) is defined as 0: the logit is a constant of the head.
//
// This is the plain reference: the forward row is recomputed exactly as token_attention computes
// it, sums run left to right, and the scale multiplies the accumulated sums of dq and dk at the
// end (the error bounds of grad/backward_bounds.hpp model exactly this order).
#pragma once

#include <vector>

#include "oasis/ops/attention.hpp"
#include "oasis/grad/normalizer_backward.hpp"

namespace oasis {

/// Incoming gradients (cotangents) of token_attention's outputs.
template <class T>
struct AttentionCotangents {
  Tensor<T> out;     ///< dL/dout, required, the shape and layout of out
  Tensor<T> lse;     ///< dL/dLSE1 [B, H, Tq]; empty: 0
  Tensor<T> p_null;  ///< dL/dp_null [B, H, Tq]; empty: 0
};

/// Gradients of a loss with respect to token_attention's inputs.
template <class T>
struct AttentionGrads {
  Tensor<T> q, k, v;      ///< shapes and layout of q, k, v (k, v summed over each GQA group)
  Tensor<T> null_logits;  ///< [H], one per query head (softmax1; empty for softmax)
  Tensor<T> bias;         ///< the shape of AttentionOptions::bias (empty without a bias)
  Tensor<T> scores;       ///< [B, H, Tq, Tk] dL/dz when return_probs is set (zeros at masked keys)
};

/// Validates the cotangents against the forward's shapes; throws naming the argument.
template <class T>
void check_attention_cotangents(const AttentionShape& s, const AttentionOptions& opt, const AttentionCotangents<T>& d) {
  const bool bthd = opt.layout == AttentionLayout::bthd;
  const Shape out = bthd ? Shape{s.B, s.Tq, s.H, s.d_v} : Shape{s.B, s.H, s.Tq, s.d_v};
  OASIS_REQUIRE(d.out.shape() == out, "dout", "shape ", shape_str(d.out.shape()), " is not the output's ", shape_str(out));
  const Shape rows{s.B, s.H, s.Tq};
  OASIS_REQUIRE(d.lse.empty() || d.lse.shape() == rows, "dlse", "shape ", shape_str(d.lse.shape()), " is not [B, H, Tq] = ",
                shape_str(rows));
  OASIS_REQUIRE(d.p_null.empty() || d.p_null.shape() == rows, "dp_null", "shape ", shape_str(d.p_null.shape()),
                " is not [B, H, Tq] = ", shape_str(rows));
  OASIS_REQUIRE(opt.normalizer == RowNorm::softmax || opt.normalizer == RowNorm::softmax1, "normalizer",
                "no backward for ", to_string(opt.normalizer), " (the backward covers softmax and softmax1)");
  require_finite(d.out, "dout");
  require_finite(d.lse, "dlse");
  require_finite(d.p_null, "dp_null");
}

/// The reference backward of token_attention(q, k, v, opt).
template <class T>
AttentionGrads<T> token_attention_backward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                           const AttentionCotangents<T>& d, const AttentionOptions& opt = {}) {
  const AttentionShape s = check_attention_args(q, k, v, opt);
  check_attention_cotangents(s, opt, d);
  if (opt.layout == AttentionLayout::bthd) {  // the same computation on [B, H, T, d] views
    AttentionOptions o = opt;
    o.layout = AttentionLayout::bhtd;
    AttentionGrads<T> g = token_attention_backward(swap_head_time(q), swap_head_time(k), swap_head_time(v),
                                                   AttentionCotangents<T>{swap_head_time(d.out), d.lse, d.p_null}, o);
    g.q = swap_head_time(g.q);
    g.k = swap_head_time(g.k);
    g.v = swap_head_time(g.v);
    return g;
  }
  const T scale = score_scale<T>(s, opt);
  const index_t group = s.H / s.H_kv;
  const bool has_null = opt.normalizer == RowNorm::softmax1;

  AttentionGrads<T> g;
  g.q = Tensor<T>(q.shape());
  g.k = Tensor<T>(k.shape());
  g.v = Tensor<T>(v.shape());
  if (has_null) g.null_logits = Tensor<T>({s.H});
  if (!opt.bias.empty()) g.bias = Tensor<T>(opt.bias.shape());
  if (opt.return_probs) g.scores = Tensor<T>({s.B, s.H, s.Tq, s.Tk});

  const std::size_t Tk = static_cast<std::size_t>(s.Tk);
  std::vector<T> z(Tk), p(Tk), dp(Tk), dz(Tk);
  for (index_t b = 0; b < s.B; ++b)
    for (index_t h = 0; h < s.H; ++h) {
      const index_t hk = h / group;
      const T null_logit = opt.null_logits.empty() ? T(0) : T(opt.null_logits[static_cast<std::size_t>(h)]);
      for (index_t t = 0; t < s.Tq; ++t) {
        // the forward row, exactly as token_attention computes it
        const KeyRange kr = visible_range(s, opt, b, t);
        const index_t m = kr.count();
        score_row(q, k, s, opt, scale, b, h, hk, t, kr, z.data());
        const T* qt = q.ptr(b, h, t);
        const RowStats<T> st = normalize_row(opt.normalizer, z.data(), m, null_logit, p.data(), opt.norm_params,
                                             opt.masked_row, "scores");
        // dp_j = <dO_t, v_j>, then the row backward
        const T* dot_ = d.out.ptr(b, h, t);
        for (index_t j = 0; j < m; ++j) {
          const T* vj = v.ptr(b, hk, kr.begin + j);
          T acc(0);
          for (index_t c = 0; c < s.d_v; ++c) acc += dot_[c] * vj[c];
          dp[static_cast<std::size_t>(j)] = acc;
        }
        const T dlse = d.lse.empty() ? T(0) : d.lse(b, h, t);
        const T dpn = d.p_null.empty() ? T(0) : d.p_null(b, h, t);
        const T ds = normalize_row_backward(opt.normalizer, p.data(), st.p_null, m, dp.data(), dpn, dlse, dz.data());
        if (has_null && is_finite(null_logit)) g.null_logits[h] += ds;  // an infinite null logit: 0
        // dq_t (unscaled sum), dk_j (unscaled, accumulated), dv_j
        T* gq = g.q.ptr(b, h, t);
        for (index_t j = 0; j < m; ++j) {
          const T dzj = dz[static_cast<std::size_t>(j)], pj = p[static_cast<std::size_t>(j)];
          const T* kj = k.ptr(b, hk, kr.begin + j);
          T* gk = g.k.ptr(b, hk, kr.begin + j);
          T* gv = g.v.ptr(b, hk, kr.begin + j);
          for (index_t c = 0; c < s.d_h; ++c) {
            gq[c] += dzj * kj[c];
            gk[c] += dzj * qt[c];
          }
          for (index_t c = 0; c < s.d_v; ++c) gv[c] += pj * dot_[c];
        }
        if (!g.bias.empty()) {
          for (index_t j = 0; j < m; ++j) g.bias[attention_bias_offset(opt, b, h, t, kr.begin + j)] += dz[static_cast<std::size_t>(j)];
        }
        if (opt.return_probs)
          for (index_t j = 0; j < m; ++j) g.scores(b, h, t, kr.begin + j) = dz[static_cast<std::size_t>(j)];
      }
    }
  for (index_t i = 0; i < g.q.size(); ++i) g.q[i] *= scale;
  for (index_t i = 0; i < g.k.size(); ++i) g.k[i] *= scale;
  return g;
}

}  // namespace oasis
