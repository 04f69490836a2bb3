// oasis/grad/layers_backward.hpp — the backward of the layers of the AttnRes model (oasis/model/layers.hpp).
//
// Rows are [N, w] as in the forward (N = B * T, (batch, position) order). Every backward
// recomputes what it needs of its forward with the forward's own functions and chains the op
// backwards of oasis/grad (one definition per formula):
//
//   linear      y = W x                      dx = W^T dy,  dW = sum_r dy_r x_r^T
//   RMSNorm     y = x inv g                  rms_norm_row_backward (grad/pseudo_query_backward.hpp), per row
//   q/k norm    the same per head, the gain [d_h] shared by the heads (its gradient summed over them)
//   RoPE        y = R x (a rotation per pair) dx = R^T dy = S R S dy, S negating the second entry of
//                                            each pair (R^T is the rotation by the opposite angle)
//   SwiGLU      m = silu(a) b                da = dm b silu'(a), silu'(a) = sigmoid(a) + silu(a)(1 - sigmoid(a));
//                                            db = dm silu(a)
//   attention   Attn(h) = W_o concat_h token_attention(RoPE(qnorm(W_q x)), RoPE(knorm(W_k x)), W_v x),
//               x = RMSNorm(h); psi = null_statistic(p_null) (or the authors' mass deficit):
//               token_attention_backward with dO from W_o and dp_null from null_statistic_backward
//               (mass deficit: null_statistic_from_mass_backward; its gradient is uniform over the
//               keys of a row, c = -dpsi / H where the clamp passes, and since sum_j p_j = 1 - p_null
//               a uniform dp_j = c acts on the scores exactly as dp_null = -c)
//   MLP         W_down m(RMSNorm(h))
//
// Norms evaluated in float32 (ModelConfig::norm_float32, KeyNormOptions::compute_in_float32) have
// their backward evaluated in float32 too (rms_norm_row_backward), the casts taken as identity.
// Storage rounding (StoreFn `store`, layers.hpp) is straight through: the rounding's derivative
// is the identity, and every backward reads the stored values its forward step read (q, k, v
// after RoPE, the heads, the MLP hidden rows) — the sublayer backwards run the forward's own
// functions with the same `store` to get them.
// Gated attention, the S2 prefix sink and fake quantisation have no backward here: they are
// rejected by name. The token normaliser must be softmax or softmax1 (normalize_row_backward).
#pragma once

#include <string>
#include <vector>

#include "oasis/grad/attention_backward.hpp"
#include "oasis/grad/coupling_backward.hpp"
#include "oasis/grad/pseudo_query_backward.hpp"
#include "oasis/model/layers.hpp"

namespace oasis::model {

/// Gradients of linear(x, W).
template <class T>
struct LinearGrads {
  Tensor<T> x;  ///< [N, in]
  Tensor<T> W;  ///< [out, in]
};

/// Backward of linear(x, W) given dy [N, out]: dx_rc = sum_o dy_ro W_oc, dW_oc = sum_r dy_ro x_rc
/// (sums left to right; with `products`, float or double: dx = dy W and dW = dy^T x through them).
template <class T>
LinearGrads<T> linear_backward(const Tensor<T>& x, const Tensor<T>& W, const Tensor<T>& dy,
                               const MatrixProducts* products = nullptr) {
  require_rank(x, 2, "x", "[N, in]");
  require_rank(W, 2, "W", "[out, in]");
  const index_t N = x.dim(0), nin = x.dim(1), nout = W.dim(0);
  OASIS_REQUIRE(W.dim(1) == nin, "W", "shape ", shape_str(W.shape()), " does not take inputs of width ", nin);
  OASIS_REQUIRE(dy.shape() == (Shape{N, nout}), "dy", "shape ", shape_str(dy.shape()), " is not [N, out] = [", N, ", ",
                nout, "]");
  LinearGrads<T> g{Tensor<T>({N, nin}), Tensor<T>({nout, nin})};
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if (products) {
      matrix_product(*products, false, false, N, nin, nout, dy.data(), W.data(), g.x.data());
      matrix_product(*products, true, false, nout, nin, N, dy.data(), x.data(), g.W.data());
      return g;
    }
  }
  for (index_t r = 0; r < N; ++r) {
    const T* d = dy.ptr(r);
    const T* xr = x.ptr(r);
    T* dx = g.x.ptr(r);
    for (index_t o = 0; o < nout; ++o) {
      const T* wr = W.ptr(o);
      T* dw = g.W.ptr(o);
      for (index_t c = 0; c < nin; ++c) {
        dx[c] += d[o] * wr[c];
        dw[c] += d[o] * xr[c];
      }
    }
  }
  return g;
}

/// Gradients of an RMSNorm of rows.
template <class T>
struct NormGrads {
  Tensor<T> x;     ///< [N, w]
  Tensor<T> gain;  ///< [w]; empty without a gain
};

/// Backward of rms_norm(x, gain, opt) given dy [N, w] (rms_norm_row_backward per row; dgain summed).
template <class T>
NormGrads<T> rms_norm_backward(const Tensor<T>& x, const Tensor<T>& gain, const KeyNormOptions& opt, const Tensor<T>& dy) {
  require_rank(x, 2, "x", "[N, w]");
  const index_t N = x.dim(0), w = x.dim(1);
  OASIS_REQUIRE(dy.shape() == x.shape(), "dy", "shape ", shape_str(dy.shape()), " differs from x's ", shape_str(x.shape()));
  OASIS_REQUIRE(gain.empty() || gain.shape() == (Shape{w}), "gain", "shape ", shape_str(gain.shape()), " is not [", w, "]");
  NormGrads<T> g{Tensor<T>({N, w}), gain.empty() ? Tensor<T>() : Tensor<T>({w})};
  for (index_t r = 0; r < N; ++r)
    rms_norm_row_backward(x.ptr(r), w, gain.empty() ? nullptr : gain.data(), opt, dy.ptr(r), g.x.ptr(r),
                          gain.empty() ? nullptr : g.gain.data());
  return g;
}

/// Backward of head_rms_norm(x, H, dh, gain, opt) (the per-head q/k norm) given dy [N, H dh].
template <class T>
NormGrads<T> head_rms_norm_backward(const Tensor<T>& x, index_t H, index_t dh, const Tensor<T>& gain,
                                    const KeyNormOptions& opt, const Tensor<T>& dy) {
  require_rank(x, 2, "x", "[N, H d_h]");
  OASIS_REQUIRE(x.dim(1) == H * dh, "x", "row width ", x.dim(1), " is not H * d_h = ", H * dh);
  const index_t N = x.dim(0);
  NormGrads<T> g = rms_norm_backward(x.reshaped({N * H, dh}), gain, opt, dy.reshaped({N * H, dh}));
  g.x = g.x.reshaped({N, H * dh});
  return g;
}

/// Backward of rope(x, H, dh, Tn, pos0, layout, theta) given dy [N, H dh]: R^T dy = S R S dy,
/// evaluated by the forward rope() itself (the same angles, bit for bit).
template <class T>
Tensor<T> rope_backward(const Tensor<T>& dy, index_t H, index_t dh, index_t Tn, index_t pos0, RopeLayout layout,
                        double theta) {
  require_rank(dy, 2, "dy", "[N, H d_h]");
  OASIS_REQUIRE(dy.dim(1) == H * dh, "dy", "row width ", dy.dim(1), " is not H * d_h = ", H * dh);
  auto flip = [&](Tensor<T> t) {  // S: negate the second entry of every pair
    for (index_t r = 0; r < t.dim(0); ++r)
      for (index_t h = 0; h < H; ++h)
        for (index_t c = 0; c < dh; ++c) {
          bool first = false;
          index_t fi = 0;
          (void)rope_pair(layout, c, dh, first, fi);
          if (!first) t(r, h * dh + c) = -t(r, h * dh + c);
        }
    return t;
  };
  return flip(rope(Rows<T>{flip(dy), {}}, H, dh, Tn, pos0, layout, theta, ErrorModel{}).x);
}

/// Gradients of the SwiGLU product m = silu(a) b.
template <class T>
struct SwiGluGrads {
  Tensor<T> a, b;  ///< [N, d_ff]
};

/// Backward of m = silu(a) * b (as mlp_hidden) given dm.
template <class T>
SwiGluGrads<T> swiglu_backward(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& dm) {
  OASIS_REQUIRE(b.shape() == a.shape() && dm.shape() == a.shape(), "dm", "a, b and dm differ in shape (",
                shape_str(a.shape()), ", ", shape_str(b.shape()), ", ", shape_str(dm.shape()), ")");
  SwiGluGrads<T> g{Tensor<T>(a.shape()), Tensor<T>(a.shape())};
  for (index_t i = 0; i < a.size(); ++i) {
    const T sg = sigmoid(a[i]);
    const T s = a[i] * sg;  // silu(a), as the forward
    g.a[i] = (dm[i] * b[i]) * (sg + s * (T(1) - sg));
    g.b[i] = dm[i] * s;
  }
  return g;
}

/// The configurations the layer backward covers; throws naming the option otherwise.
inline void require_backward_support(const ModelConfig& cfg) {
  OASIS_REQUIRE(!cfg.gated_attention, "gated_attention", "the model backward does not cover gated attention");
  OASIS_REQUIRE(!cfg.prefix_sink, "prefix_sink", "the model backward does not cover the S2 prefix sink");
  const RowNorm tn = cfg.token_norm();
  OASIS_REQUIRE(tn == RowNorm::softmax || tn == RowNorm::softmax1, "token_normalizer", "no backward for ", to_string(tn),
                " (the backward covers softmax and softmax1)");
}

/// Gradients of one attention sublayer (attention_sublayer over the whole sequence, no cache).
template <class T>
struct AttentionSublayerGrads {
  Tensor<T> h;                           ///< [N, d] through this sublayer
  Tensor<T> norm, wq, wk, wv, wo;        ///< the weights' gradients (shapes of AttentionWeights)
  Tensor<T> q_norm, k_norm;              ///< [d_h] with the q/k norm, else empty
};

/// Backward of attention_sublayer(h, B, Tn, 0, W, cfg, ., ., {store}) given dL/dout [N, d] and
/// dL/dpsi [B, Tn] of the branch's null statistic (empty: 0). `products`: the matrix products of
/// its linear layers, forward recomputation included (MatrixProducts; null: sequential sums).
template <class T>
AttentionSublayerGrads<T> attention_sublayer_backward(const Tensor<T>& h, index_t B, index_t Tn, const AttentionWeights<T>& W,
                                                      const ModelConfig& cfg, const Tensor<T>& dout, const Tensor<T>& dpsi,
                                                      StoreFn store = nullptr, const MatrixProducts* products = nullptr) {
  require_backward_support(cfg);
  OASIS_REQUIRE(!W.gate_w && !W.sink_k, "weights", "gated attention and the prefix sink have no backward here");
  const index_t H = cfg.n_heads, Hkv = cfg.kv_heads(), dh = cfg.head_dim(), N = B * Tn, d = cfg.d_model;
  OASIS_REQUIRE(h.shape() == (Shape{N, d}), "h", "shape ", shape_str(h.shape()), " is not [B T, d] = [", N, ", ", d, "]");
  OASIS_REQUIRE(dout.shape() == (Shape{N, d}), "dout", "shape ", shape_str(dout.shape()), " is not [B T, d] = [", N, ", ", d, "]");
  OASIS_REQUIRE(dpsi.empty() || dpsi.shape() == (Shape{B, Tn}), "dpsi", "shape ", shape_str(dpsi.shape()), " is not [B, T]");
  const ErrorModel em{0, products};
  const KeyNormOptions no = cfg.norm_options();
  const bool mass = cfg.psi_estimator == PsiEstimator::mass_deficit;
  // The forward itself: q, k, v after RoPE and the heads as it stored them, the probabilities
  // (mass deficit); then what it does not keep: RMSNorm(h) and the projections before the q/k norm.
  const Rows<T> hr{h, {}};
  KVCache<T> kv;
  SublayerOptions so;
  so.keep_probs = mass;
  so.store = store;
  const AttentionSublayer<T> fwd = attention_sublayer(hr, B, Tn, 0, W, cfg, kv, em, so);
  const Rows<T> xn = rms_norm(hr, *W.norm, no, em);
  Rows<T> q0, k0;
  if (cfg.qk_norm) {
    q0 = linear(xn, *W.wq, em);
    k0 = linear(xn, *W.wk, em);
  }
  auto to_heads = [&](const Tensor<T>& rows, index_t Hx) {  // [N, Hx dh] -> [B, Hx, Tn, dh]
    Tensor<T> o({B, Hx, Tn, dh});
    for (index_t b = 0; b < B; ++b)
      for (index_t hh = 0; hh < Hx; ++hh)
        for (index_t t = 0; t < Tn; ++t)
          for (index_t c = 0; c < dh; ++c) o(b, hh, t, c) = rows(b * Tn + t, hh * dh + c);
    return o;
  };
  auto to_rows = [&](const Tensor<T>& heads, index_t Hx) {  // the inverse
    Tensor<T> o({N, Hx * dh});
    for (index_t b = 0; b < B; ++b)
      for (index_t hh = 0; hh < Hx; ++hh)
        for (index_t t = 0; t < Tn; ++t)
          for (index_t c = 0; c < dh; ++c) o(b * Tn + t, hh * dh + c) = heads(b, hh, t, c);
    return o;
  };
  const Tensor<T> qh = to_heads(fwd.q.x, H), kh = to_heads(fwd.k.x, Hkv), vh = to_heads(fwd.v.x, Hkv);
  AttentionOptions opt;  // as attention_core
  opt.normalizer = cfg.token_norm();
  opt.causal = true;

  AttentionSublayerGrads<T> g;
  const LinearGrads<T> go = linear_backward(fwd.heads.x, *W.wo, dout, products);
  g.wo = go.W;
  AttentionCotangents<T> cot{to_heads(go.x, H), {}, {}};
  if (!dpsi.empty()) {
    if (cfg.psi_estimator == PsiEstimator::p_null) {
      cot.p_null = null_statistic_backward(dpsi, H);
    } else {
      const Tensor<T> dprobs = null_statistic_from_mass_backward(fwd.probs, dpsi);
      cot.p_null = Tensor<T>({B, H, Tn});  // a uniform dp_j = c acts as dp_null = -c (header)
      for (index_t b = 0; b < B; ++b)
        for (index_t hh = 0; hh < H; ++hh)
          for (index_t t = 0; t < Tn; ++t) cot.p_null(b, hh, t) = -dprobs(b, hh, t, 0);
    }
  }
  const AttentionGrads<T> ga = token_attention_backward(qh, kh, vh, cot, opt);
  Tensor<T> dq = rope_backward(to_rows(ga.q, H), H, dh, Tn, 0, cfg.rope, cfg.rope_theta);
  Tensor<T> dk = rope_backward(to_rows(ga.k, Hkv), Hkv, dh, Tn, 0, cfg.rope, cfg.rope_theta);
  const Tensor<T> dv = to_rows(ga.v, Hkv);
  if (cfg.qk_norm) {
    NormGrads<T> nq = head_rms_norm_backward(q0.x, H, dh, *W.q_norm, no, dq);
    NormGrads<T> nk = head_rms_norm_backward(k0.x, Hkv, dh, *W.k_norm, no, dk);
    dq = std::move(nq.x);
    dk = std::move(nk.x);
    g.q_norm = std::move(nq.gain);
    g.k_norm = std::move(nk.gain);
  }
  const LinearGrads<T> lq = linear_backward(xn.x, *W.wq, dq, products), lk = linear_backward(xn.x, *W.wk, dk, products),
                       lv = linear_backward(xn.x, *W.wv, dv, products);
  g.wq = lq.W;
  g.wk = lk.W;
  g.wv = lv.W;
  Tensor<T> dxn = lq.x;
  for (index_t i = 0; i < dxn.size(); ++i) dxn[i] = (dxn[i] + lk.x[i]) + lv.x[i];
  NormGrads<T> gn = rms_norm_backward(h, *W.norm, no, dxn);
  g.h = std::move(gn.x);
  g.norm = std::move(gn.gain);
  return g;
}

/// Gradients of one SwiGLU MLP sublayer.
template <class T>
struct MlpSublayerGrads {
  Tensor<T> h;                        ///< [N, d]
  Tensor<T> norm, gate, up, down;     ///< the weights' gradients (shapes of MlpWeights)
};

/// Backward of the MLP sublayer, down(stored(mlp_hidden(h))) (Model::run), given dL/dout [N, d];
/// `products` as for attention_sublayer_backward.
template <class T>
MlpSublayerGrads<T> mlp_sublayer_backward(const Tensor<T>& h, const MlpWeights<T>& W, const ModelConfig& cfg,
                                          const Tensor<T>& dout, StoreFn store = nullptr,
                                          const MatrixProducts* products = nullptr) {
  const ErrorModel em{0, products};
  const KeyNormOptions no = cfg.norm_options();
  const Rows<T> xn = rms_norm(Rows<T>{h, {}}, *W.norm, no, em);  // the steps of mlp_hidden
  const Rows<T> a = linear(xn, *W.gate, em), b = linear(xn, *W.up, em);
  Rows<T> m = mlp_hidden(Rows<T>{h, {}}, W, cfg, em);
  store_values(m.x, store);
  MlpSublayerGrads<T> g;
  const LinearGrads<T> gd = linear_backward(m.x, *W.down, dout, products);
  g.down = gd.W;
  const SwiGluGrads<T> gs = swiglu_backward(a.x, b.x, gd.x);
  const LinearGrads<T> ga = linear_backward(xn.x, *W.gate, gs.a, products), gb = linear_backward(xn.x, *W.up, gs.b, products);
  g.gate = ga.W;
  g.up = gb.W;
  Tensor<T> dxn = ga.x;
  for (index_t i = 0; i < dxn.size(); ++i) dxn[i] += gb.x[i];
  NormGrads<T> gn = rms_norm_backward(h, *W.norm, no, dxn);
  g.h = std::move(gn.x);
  g.norm = std::move(gn.gain);
  return g;
}

}  // namespace oasis::model
