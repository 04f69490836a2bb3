// oasis/model/layers.hpp — the layers of the AttnRes transformer oracle (docs/spec.md §2, §4).
//
// Activations are row matrices: Rows<T>::x has shape [N, w] with N = B * T rows in (batch,
// position) order. Each row can carry a first-order forward error bound (Rows::e, one number per
// row: a bound on the infinity-norm of the row's error when the model runs in a precision of
// unit roundoff ErrorModel::u on inputs exact in that precision). The propagation rules are
// derived in docs/model.md ("Forward error bound"); every layer below states its rule.
//
//   RMSNorm     y = x / sqrt(mean(x^2) + eps) * g                   (core rms_norm_row)
//   linear      y = W x,  W [out, in] (PyTorch nn.Linear layout, no bias; oasis/model/linear.hpp)
//   RoPE        rotate_half: pairs (c, c + d_h/2); interleaved: pairs (2c, 2c + 1);
//               angle = pos * theta^(-2c/d_h); (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
//   attention   Attn(x) = W_o concat_h token_attention(q_h, k, v)   (core token_attention)
//   SwiGLU      MLP(x) = W_down (silu(W_gate x) * (W_up x)),  silu(a) = a sigmoid(a)
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "oasis/ops/attention.hpp"
#include "oasis/ops/gate.hpp"
#include "oasis/ops/prefix_sink.hpp"
#include "oasis/ops/coupling.hpp"
#include "oasis/ops/depth.hpp"
#include "oasis/model/config.hpp"
#include "oasis/model/linear.hpp"
#include "oasis/ops/quantize.hpp"
#include "oasis/core/tensor.hpp"

namespace oasis::model {


/// RMSNorm of every row with gain g [w] (empty: no gain).
/// Error rule: J = diag(g) inv (I - x x^T inv^2 / w), ||J||_inf <= g_max inv (1 + ||x||_inf ||x||_1 inv^2 / w);
/// rounding: inv = 1/sqrt(ss/w + eps) has relative error <= (w/2 + 4) u, two products 2u:
///   e_y = ||J||_inf e_x + (w/2 + 6) u_eff ||y||_inf  (u_eff = float's u when evaluated in float32, + 2u for the casts).
template <class T>
Rows<T> rms_norm(const Rows<T>& in, const Tensor<T>& gain, const KeyNormOptions& opt, const ErrorModel& em) {
  const index_t N = in.n(), w = in.w();
  Rows<T> out{Tensor<T>({N, w}), {}};
  for (index_t r = 0; r < N; ++r)
    rms_norm_row(in.x.ptr(r), w, gain.empty() ? nullptr : gain.data(), opt, out.x.ptr(r));
  if (em.on()) {
    double gmax = 1;
    if (!gain.empty()) { gmax = 0; for (index_t c = 0; c < w; ++c) gmax = std::max(gmax, std::abs(to_double(gain[c]))); }
    const bool f32 = opt.compute_in_float32 && !std::is_same_v<T, float>;
    const double ueff = f32 ? std::max(em.u, unit_roundoff<float>()) : em.u;
    out.e.resize(static_cast<std::size_t>(N));
    for (index_t r = 0; r < N; ++r) {
      const T* x = in.x.ptr(r);
      double ss = 0;
      for (index_t c = 0; c < w; ++c) ss += to_double(x[c]) * to_double(x[c]);
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(w) + opt.eps);
      const double J = gmax * inv * (1.0 + row_inf(x, w) * row_l1(x, w) * inv * inv / static_cast<double>(w));
      out.e[static_cast<std::size_t>(r)] = J * in.e[static_cast<std::size_t>(r)] +
          ((static_cast<double>(w) / 2.0 + 6.0) * ueff + (f32 ? 2.0 * em.u : 0.0)) * row_inf(out.x.ptr(r), w);
    }
  }
  return out;
}


/// linear() with optional fake weight-activation quantisation (oasis/ops/quantize.hpp):
/// y = linear(Q_A(x), Q_W(W)): Q_A = oasis::quantize_activation (dynamic ranges over the rows of
/// this call, or the next calibrated site), Q_W by the weight scheme's range rule. quant null:
/// exactly linear(in, W, em). No error bound is derived for the quantised form (em must be off).
template <class T>
Rows<T> qlinear(const Rows<T>& in, const Tensor<T>& W, const ErrorModel& em, const WAQuantConfig* quant) {
  if (!quant) return linear(in, W, em);
  OASIS_REQUIRE(!em.on(), "error_u", "no forward error bound is derived for fake-quantised linear layers");
  return linear(Rows<T>{quantize_activation(in.x, *quant), {}}, fake_quantize(W, quant->weights), em);
}

/// Storage rounding: a model that computes each step in T but stores the activations it hands to
/// the next step in a narrower format (e.g. bfloat16) rounds them with this function
/// (e.g. x -> oasis::io::round_to_dtype(x, bf16)); null: no rounding.
using StoreFn = double (*)(double);

/// Round every entry of x with the storage rounding f (nothing when f is null).
template <class T>
void store_values(Tensor<T>& x, StoreFn f) {
  if (f)
    for (index_t i = 0; i < x.size(); ++i) x[i] = T(f(to_double(x[i])));
}

/// Per-call options of the sublayers beyond the error model (defaults: the plain model).
struct SublayerOptions {
  const WAQuantConfig* quant = nullptr;  ///< fake quantisation of the linear layers (qlinear)
  bool keep_probs = false;               ///< keep the attention probabilities (AttentionSublayer::probs)
  /// Storage rounding of the step outputs (q, k, v after RoPE, heads, p_null, LSE, psi, output).
  StoreFn store = nullptr;
};

/// Partner index of channel c in a head of width dh, and whether c is the first of its pair.
inline index_t rope_pair(RopeLayout layout, index_t c, index_t dh, bool& first, index_t& freq_index) {
  if (layout == RopeLayout::rotate_half) {
    const index_t half = dh / 2;
    first = c < half;
    freq_index = first ? c : c - half;
    return first ? c + half : c - half;
  }
  first = c % 2 == 0;
  freq_index = c / 2;
  return first ? c + 1 : c - 1;
}

/// Rotary position embedding of rows [N, H * dh]; row r = b * Tn + t has position pos0 + t.
/// inv_freq_i = theta^(-2i/dh), angle = pos * inv_freq_i (both in T).
/// Error rule: rotation norm <= sqrt(2); cos/sin of the computed angle err <= 2u + (3 + ln theta) u angle;
///   e_y = sqrt(2) e_x + 2 ||x||_inf (dc + gamma_2).
template <class T>
Rows<T> rope(const Rows<T>& in, index_t H, index_t dh, index_t Tn, index_t pos0, RopeLayout layout,
             double theta, const ErrorModel& em) {
  using std::cos; using std::sin; using std::pow;
  const index_t N = in.n();
  OASIS_REQUIRE(in.w() == H * dh, "rope", "row width ", in.w(), " is not H * d_h = ", H * dh);
  Rows<T> out{Tensor<T>({N, H * dh}), {}};
  const index_t half = dh / 2;
  std::vector<T> inv_freq(static_cast<std::size_t>(half));
  for (index_t i = 0; i < half; ++i)
    inv_freq[static_cast<std::size_t>(i)] = pow(T(theta), T(-2 * i) / T(dh));
  double max_angle = 0;
  for (index_t r = 0; r < N; ++r) {
    const index_t pos = pos0 + r % Tn;
    max_angle = std::max(max_angle, static_cast<double>(pos) * to_double(inv_freq[0]));
    std::vector<T> cs(static_cast<std::size_t>(half)), sn(static_cast<std::size_t>(half));
    for (index_t i = 0; i < half; ++i) {
      const T a = T(pos) * inv_freq[static_cast<std::size_t>(i)];
      cs[static_cast<std::size_t>(i)] = cos(a);
      sn[static_cast<std::size_t>(i)] = sin(a);
    }
    for (index_t h = 0; h < H; ++h) {
      const T* x = in.x.ptr(r) + h * dh;
      T* y = out.x.ptr(r) + h * dh;
      for (index_t c = 0; c < dh; ++c) {
        bool first = false;
        index_t fi = 0;
        const index_t p = rope_pair(layout, c, dh, first, fi);
        const T cc = cs[static_cast<std::size_t>(fi)], ss = sn[static_cast<std::size_t>(fi)];
        y[c] = first ? x[c] * cc - x[p] * ss : x[c] * cc + x[p] * ss;
      }
    }
  }
  if (em.on()) {
    const double dc = 2.0 * em.u + (3.0 + std::log(theta)) * em.u * max_angle;
    out.e.resize(static_cast<std::size_t>(N));
    for (index_t r = 0; r < N; ++r)
      out.e[static_cast<std::size_t>(r)] = std::sqrt(2.0) * in.e[static_cast<std::size_t>(r)] +
                                           2.0 * row_inf(in.x.ptr(r), H * dh) * (dc + em.gamma(2));
  }
  return out;
}

/// Per-head RMSNorm (q/k norm, Qwen3) of rows [N, H * dh] with gain [dh].
template <class T>
Rows<T> head_rms_norm(const Rows<T>& in, index_t H, index_t dh, const Tensor<T>& gain, const KeyNormOptions& opt,
                      const ErrorModel& em) {
  Rows<T> flat{in.x.reshaped({in.n() * H, dh}), {}};
  if (em.on())
    for (index_t r = 0; r < in.n(); ++r)
      for (index_t h = 0; h < H; ++h) flat.e.push_back(in.e[static_cast<std::size_t>(r)]);
  Rows<T> y = rms_norm(flat, gain, opt, em);
  Rows<T> out{y.x.reshaped({in.n(), H * dh}), {}};
  if (em.on()) {
    out.e.assign(static_cast<std::size_t>(in.n()), 0.0);
    for (index_t r = 0; r < in.n(); ++r)
      for (index_t h = 0; h < H; ++h)
        out.e[static_cast<std::size_t>(r)] = std::max(out.e[static_cast<std::size_t>(r)], y.e[static_cast<std::size_t>(r * H + h)]);
  }
  return out;
}

/// Key/value cache of one attention sublayer: post-RoPE keys and values [B, H_kv, T_past, d_h]
/// and their per-(batch, position) error bounds [B, T_past].
template <class T>
struct KVCache {
  Tensor<T> k, v;
  Tensor<double> ek, ev;
  index_t length() const { return k.empty() ? 0 : k.dim(2); }
};

/// Append new rows [B*Tn, Hkv*dh] to a cache tensor [B, Hkv, Tp, dh] -> [B, Hkv, Tp+Tn, dh].
template <class T>
Tensor<T> append_heads(const Tensor<T>& cache, const Tensor<T>& rows, index_t B, index_t Tn, index_t Hkv, index_t dh) {
  const index_t Tp = cache.empty() ? 0 : cache.dim(2);
  Tensor<T> out({B, Hkv, Tp + Tn, dh});
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < Hkv; ++h) {
      for (index_t t = 0; t < Tp; ++t)
        for (index_t c = 0; c < dh; ++c) out(b, h, t, c) = cache(b, h, t, c);
      for (index_t t = 0; t < Tn; ++t)
        for (index_t c = 0; c < dh; ++c) out(b, h, Tp + t, c) = rows(b * Tn + t, h * dh + c);
    }
  return out;
}

inline Tensor<double> append_errors(const Tensor<double>& cache, const std::vector<double>& e, index_t B, index_t Tn) {
  const index_t Tp = cache.empty() ? 0 : cache.dim(1);
  Tensor<double> out({B, Tp + Tn});
  for (index_t b = 0; b < B; ++b) {
    for (index_t t = 0; t < Tp; ++t) out(b, t) = cache(b, t);
    for (index_t t = 0; t < Tn; ++t) out(b, Tp + t) = e.empty() ? 0.0 : e[static_cast<std::size_t>(b * Tn + t)];
  }
  return out;
}

/// Weights of one attention sublayer (views into the model's parameters).
template <class T>
struct AttentionWeights {
  const Tensor<T>* norm;    ///< pre-norm gain [d]
  const Tensor<T>* wq;      ///< [H dh, d]
  const Tensor<T>* wk;      ///< [Hkv dh, d]
  const Tensor<T>* wv;      ///< [Hkv dh, d]
  const Tensor<T>* wo;      ///< [d, H dh]
  const Tensor<T>* q_norm;  ///< [dh] or null
  const Tensor<T>* k_norm;  ///< [dh] or null
  const Tensor<T>* gate_w = nullptr;  ///< [H, d] gated attention (head_gates), or null
  const Tensor<T>* gate_b = nullptr;  ///< [H] gate bias, or null
  const Tensor<T>* sink_k = nullptr;  ///< [Hkv, dh] S2 prefix sink key, or null
  const Tensor<T>* sink_v = nullptr;  ///< [Hkv, dh] S2 prefix sink value, or null
};

/// Result of one attention sublayer.
template <class T>
struct AttentionSublayer {
  Rows<T> out;            ///< [N, d] raw sublayer output f_i(h_i)
  Tensor<T> p_null, lse;  ///< [B, H, Tn] per head (lse = LSE1 for softmax1, LSE for softmax)
  Tensor<T> psi;          ///< [B, Tn] null statistic of the branch
  std::vector<double> e_psi;  ///< [N] error bounds of psi (error model on)
  Tensor<double> e_p_null;    ///< [B, H, Tn] error bounds of p_null (error model on)
  Rows<T> q, k, v;        ///< [N, H dh], [N, Hkv dh], [N, Hkv dh]: projections (q, k after q/k norm and RoPE)
  Rows<T> heads;          ///< [N, H dh] attention output of every head, before W_o (gated when gating is on)
  Tensor<T> probs;        ///< [B, H, Tn, T_keys] (SublayerOptions::keep_probs; sink: column 0)
  Tensor<T> gates;        ///< [B, H, Tn] gated attention
  Tensor<T> p_sink;       ///< [B, H, Tn] prefix sink
};

/// q, k, v rows of RMSNorm(h): projections, optional per-head q/k norm, RoPE at positions pos0 + t.
/// quant: the projections run through qlinear; xn (if not null) receives RMSNorm(h).
template <class T>
void attention_projections(const Rows<T>& h, index_t Tn, index_t pos0, const AttentionWeights<T>& W,
                           const ModelConfig& cfg, const ErrorModel& em, Rows<T>& q, Rows<T>& k, Rows<T>& v,
                           const WAQuantConfig* quant, Rows<T>* xn_out) {
  const index_t H = cfg.n_heads, Hkv = cfg.kv_heads(), dh = cfg.head_dim();
  const Rows<T> xn = rms_norm(h, *W.norm, cfg.norm_options(), em);
  q = qlinear(xn, *W.wq, em, quant);
  k = qlinear(xn, *W.wk, em, quant);
  v = qlinear(xn, *W.wv, em, quant);
  if (xn_out) *xn_out = xn;
  if (cfg.qk_norm) {
    q = head_rms_norm(q, H, dh, *W.q_norm, cfg.norm_options(), em);
    k = head_rms_norm(k, Hkv, dh, *W.k_norm, cfg.norm_options(), em);
  }
  q = rope(q, H, dh, Tn, pos0, cfg.rope, cfg.rope_theta, em);
  k = rope(k, Hkv, dh, Tn, pos0, cfg.rope, cfg.rope_theta, em);
}
template <class T>
void attention_projections(const Rows<T>& h, index_t Tn, index_t pos0, const AttentionWeights<T>& W,
                           const ModelConfig& cfg, const ErrorModel& em, Rows<T>& q, Rows<T>& k, Rows<T>& v) {
  attention_projections(h, Tn, pos0, W, cfg, em, q, k, v, nullptr, static_cast<Rows<T>*>(nullptr));
}

/// The token attention of attention_core: the configuration's token normaliser, causal, scale 1/sqrt(d_h).
inline AttentionOptions core_attention_options(const ModelConfig& cfg) {
  AttentionOptions opt;
  opt.normalizer = cfg.token_norm();
  opt.causal = true;
  return opt;
}

/// Causal token attention of the q rows over the cache plus the Tn new k, v rows (appended to the
/// cache); per-head outputs merged to rows [N, H dh] (before W_o), p_null, LSE, psi.
/// Error rule per (b, h, t), keys j visible:
///   dz_j = s (e_q ||k_j||_1 + ||q||_1 e_k(j)) + (gamma_dh + 3u) s sum_c |q_c k_jc|      (s = 1/sqrt(d_h))
///   Dz = max_j dz_j; a_j = u (|z_j - M| + 2); rho = 2 max a + (m' + 2) u   (m' = keys + null)
///   e_A = sum_j p_j e_v(j) + (2 Dz + rho + gamma_m) sum_j p_j ||v_j||_inf
///   e_pnull = p_null (Dz + rho); mass deficit: p_null Dz + (rho + gamma_m)(1 - p_null) + u;
///   e_psi = mean_h e_pnull + (H + 1) u psi.
/// With sink_k/sink_v (S2) the attention is oasis::prefix_sink_attention over [sink; cache; new]
/// (the error model must be off); keep_probs keeps the probabilities.
template <class T>
AttentionSublayer<T> attention_core(Rows<T> q, Rows<T> k, Rows<T> v, index_t B, index_t Tn, const ModelConfig& cfg,
                                    KVCache<T>& cache, const ErrorModel& em, const Tensor<T>* sink_k,
                                    const Tensor<T>* sink_v, bool keep_probs) {
  const index_t H = cfg.n_heads, Hkv = cfg.kv_heads(), dh = cfg.head_dim(), N = B * Tn;
  cache.k = append_heads(cache.k, k.x, B, Tn, Hkv, dh);
  cache.v = append_heads(cache.v, v.x, B, Tn, Hkv, dh);
  cache.ek = append_errors(cache.ek, k.e, B, Tn);
  cache.ev = append_errors(cache.ev, v.e, B, Tn);

  Tensor<T> qh({B, H, Tn, dh});
  for (index_t b = 0; b < B; ++b)
    for (index_t hh = 0; hh < H; ++hh)
      for (index_t t = 0; t < Tn; ++t)
        for (index_t c = 0; c < dh; ++c) qh(b, hh, t, c) = q.x(b * Tn + t, hh * dh + c);

  AttentionOptions opt = core_attention_options(cfg);
  opt.return_probs = cfg.psi_estimator == PsiEstimator::mass_deficit || em.on() || keep_probs;
  OASIS_REQUIRE((sink_k == nullptr) == (sink_v == nullptr), "sink_v", "the prefix sink needs both key and value");
  OASIS_REQUIRE(!sink_k || !em.on(), "error_u", "no forward error bound is derived for the prefix sink");
  AttentionSublayer<T> r;
  AttentionResult<T> att;
  if (sink_k) {
    PrefixSinkResult<T> ps = prefix_sink_attention(qh, cache.k, cache.v, *sink_k, *sink_v, opt);
    att = std::move(ps.attn);
    r.p_sink = std::move(ps.p_sink);
  } else {
    att = token_attention(qh, cache.k, cache.v, opt);
  }
  if (keep_probs) r.probs = att.probs;

  r.p_null = att.p_null;
  r.lse = att.lse;
  r.psi = cfg.psi_estimator == PsiEstimator::mass_deficit ? null_statistic_from_mass(att.probs)
                                                          : null_statistic(att.p_null);
  Rows<T> merged{Tensor<T>({N, H * dh}), {}};
  for (index_t b = 0; b < B; ++b)
    for (index_t hh = 0; hh < H; ++hh)
      for (index_t t = 0; t < Tn; ++t)
        for (index_t c = 0; c < dh; ++c) merged.x(b * Tn + t, hh * dh + c) = att.out(b, hh, t, c);

  if (em.on()) {
    OASIS_REQUIRE(opt.normalizer == RowNorm::softmax || opt.normalizer == RowNorm::softmax1, "error_bound",
                  "no derived forward error bound for the token normaliser ", to_string(opt.normalizer));
    const index_t Tk = cache.k.dim(2), group = H / Hkv;
    const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
    const bool has_null = opt.normalizer == RowNorm::softmax1;
    merged.e.assign(static_cast<std::size_t>(N), 0.0);
    r.e_psi.assign(static_cast<std::size_t>(N), 0.0);
    r.e_p_null = Tensor<double>({B, H, Tn});
    for (index_t b = 0; b < B; ++b)
      for (index_t t = 0; t < Tn; ++t) {
        const index_t row = b * Tn + t;
        const double eq = q.e[static_cast<std::size_t>(row)];
        double psi_err = 0;
        for (index_t hh = 0; hh < H; ++hh) {
          const index_t hk = hh / group, m = std::min(Tk, t + (Tk - Tn) + 1);
          const T* qt = qh.ptr(b, hh, t);
          const double q1 = row_l1(qt, dh);
          double Dz = 0, M = has_null ? 0.0 : -std::numeric_limits<double>::infinity();
          std::vector<double> z(static_cast<std::size_t>(m));
          for (index_t j = 0; j < m; ++j) {
            const T* kj = cache.k.ptr(b, hk, j);
            double dot = 0, absdot = 0;
            for (index_t c = 0; c < dh; ++c) {
              dot += to_double(qt[c]) * to_double(kj[c]);
              absdot += std::abs(to_double(qt[c]) * to_double(kj[c]));
            }
            z[static_cast<std::size_t>(j)] = scale * dot;
            M = std::max(M, scale * dot);
            Dz = std::max(Dz, scale * (eq * row_l1(kj, dh) + q1 * cache.ek(b, j)) +
                                  (em.gamma(static_cast<double>(dh)) + 3.0 * em.u) * scale * absdot);
          }
          double amax = has_null ? em.u * (std::abs(M) + 2.0) : 0.0;
          for (index_t j = 0; j < m; ++j) amax = std::max(amax, em.u * (std::abs(z[static_cast<std::size_t>(j)] - M) + 2.0));
          const double rho = 2.0 * amax + (static_cast<double>(m + (has_null ? 1 : 0)) + 2.0) * em.u;
          double pe = 0, pv = 0;
          for (index_t j = 0; j < m; ++j) {
            const double pj = to_double(att.probs(b, hh, t, j));
            pe += pj * cache.ev(b, j);
            pv += pj * row_inf(cache.v.ptr(b, hk, j), dh);
          }
          const double eA = pe + (2.0 * Dz + rho + em.gamma(static_cast<double>(m))) * pv;
          merged.e[static_cast<std::size_t>(row)] = std::max(merged.e[static_cast<std::size_t>(row)], eA);
          const double pn = to_double(att.p_null(b, hh, t));
          r.e_p_null(b, hh, t) = pn * (Dz + rho);
          psi_err += cfg.psi_estimator == PsiEstimator::mass_deficit
                         ? pn * Dz + (rho + em.gamma(static_cast<double>(m))) * (1.0 - pn) + em.u
                         : pn * (Dz + rho);
        }
        r.e_psi[static_cast<std::size_t>(row)] = em.mean_error(psi_err, static_cast<double>(H), to_double(r.psi(b, t)));
      }
  }
  r.heads = std::move(merged);
  r.q = std::move(q);
  r.k = std::move(k);
  r.v = std::move(v);
  return r;
}

template <class T>
AttentionSublayer<T> attention_core(Rows<T> q, Rows<T> k, Rows<T> v, index_t B, index_t Tn, const ModelConfig& cfg,
                                    KVCache<T>& cache, const ErrorModel& em) {
  return attention_core(std::move(q), std::move(k), std::move(v), B, Tn, cfg, cache, em, static_cast<const Tensor<T>*>(nullptr),
                        static_cast<const Tensor<T>*>(nullptr), false);
}

/// Attn(RMSNorm(h)) = W_o attention_core(attention_projections(h)); with W.gate_w, each head's
/// context is multiplied by its gate oasis::head_gates(RMSNorm(h), w, c) before W_o (under
/// quantisation the gate is a linear layer too: head_gates(Q_A(xn), Q_W(w), c)); with W.sink_k
/// the attention has the S2 prefix sink.
template <class T>
AttentionSublayer<T> attention_sublayer(const Rows<T>& h, index_t B, index_t Tn, index_t pos0,
                                        const AttentionWeights<T>& W, const ModelConfig& cfg,
                                        KVCache<T>& cache, const ErrorModel& em, const SublayerOptions& so) {
  Rows<T> q, k, v, xn;
  attention_projections(h, Tn, pos0, W, cfg, em, q, k, v, so.quant, W.gate_w ? &xn : nullptr);
  store_values(q.x, so.store);
  store_values(k.x, so.store);
  store_values(v.x, so.store);
  AttentionSublayer<T> r = attention_core(std::move(q), std::move(k), std::move(v), B, Tn, cfg, cache, em, W.sink_k,
                                          W.sink_v, so.keep_probs);
  if (W.gate_w) {
    OASIS_REQUIRE(!em.on(), "error_u", "no forward error bound is derived for gated attention");
    const index_t H = cfg.n_heads, dh = cfg.head_dim();
    const Tensor<T> x = so.quant ? quantize_activation(xn.x, *so.quant) : xn.x;
    const Tensor<T> w = so.quant ? fake_quantize(*W.gate_w, so.quant->weights) : *W.gate_w;
    r.gates = head_gates(x.reshaped({B, Tn, xn.w()}), w, W.gate_b ? *W.gate_b : Tensor<T>());
    // out_{b,h,t} = G_{b,h,t} A_{b,h,t} (one product per entry, as oasis::gated_attention).
    for (index_t b = 0; b < B; ++b)
      for (index_t hh = 0; hh < H; ++hh)
        for (index_t t = 0; t < Tn; ++t) {
          T* o = r.heads.x.ptr(b * Tn + t) + hh * dh;
          const T g = r.gates(b, hh, t);
          for (index_t c = 0; c < dh; ++c) o[c] *= g;
        }
  }
  for (Tensor<T>* t : {&r.heads.x, &r.p_null, &r.lse, &r.psi}) store_values(*t, so.store);
  r.out = qlinear(r.heads, *W.wo, em, so.quant);
  store_values(r.out.x, so.store);
  return r;
}
template <class T>
AttentionSublayer<T> attention_sublayer(const Rows<T>& h, index_t B, index_t Tn, index_t pos0,
                                        const AttentionWeights<T>& W, const ModelConfig& cfg,
                                        KVCache<T>& cache, const ErrorModel& em) {
  return attention_sublayer(h, B, Tn, pos0, W, cfg, cache, em, SublayerOptions{});
}

/// Weights of one SwiGLU MLP sublayer.
template <class T>
struct MlpWeights {
  const Tensor<T>* norm;  ///< pre-norm gain [d]
  const Tensor<T>* gate;  ///< [d_ff, d]
  const Tensor<T>* up;    ///< [d_ff, d]
  const Tensor<T>* down;  ///< [d, d_ff]
};

/// Hidden rows silu(W_gate x) * (W_up x) of x = RMSNorm(h), [N, d_ff].
/// Error rule: m = silu(a) b, |silu'| <= 1.1, silu rounding <= 4u (+u product):
///   e_m = 1.1 e_a ||b||_inf + ||silu(a)||_inf e_b + 5u max_c |silu(a_c) b_c|, then the linear rule.
/// quant: the gate and up projections run through qlinear.
template <class T>
Rows<T> mlp_hidden(const Rows<T>& h, const MlpWeights<T>& W, const ModelConfig& cfg, const ErrorModel& em,
                   const WAQuantConfig* quant) {
  const Rows<T> xn = rms_norm(h, *W.norm, cfg.norm_options(), em);
  const Rows<T> a = qlinear(xn, *W.gate, em, quant), b = qlinear(xn, *W.up, em, quant);
  const index_t N = a.n(), f = a.w();
  Rows<T> m{Tensor<T>({N, f}), {}};
  if (em.on()) m.e.resize(static_cast<std::size_t>(N));
  for (index_t r = 0; r < N; ++r) {
    double smax = 0, prod = 0;
    for (index_t c = 0; c < f; ++c) {
      const T s = a.x(r, c) * sigmoid(a.x(r, c));
      m.x(r, c) = s * b.x(r, c);
      smax = std::max(smax, std::abs(to_double(s)));
      prod = std::max(prod, std::abs(to_double(s) * to_double(b.x(r, c))));
    }
    if (em.on())
      m.e[static_cast<std::size_t>(r)] = 1.1 * a.e[static_cast<std::size_t>(r)] * row_inf(b.x.ptr(r), f) +
                                         smax * b.e[static_cast<std::size_t>(r)] + 5.0 * em.u * prod;
  }
  return m;
}
template <class T>
Rows<T> mlp_hidden(const Rows<T>& h, const MlpWeights<T>& W, const ModelConfig& cfg, const ErrorModel& em) {
  return mlp_hidden(h, W, cfg, em, nullptr);
}

/// MLP(RMSNorm(h)) = W_down mlp_hidden(h).
template <class T>
Rows<T> mlp_sublayer(const Rows<T>& h, const MlpWeights<T>& W, const ModelConfig& cfg, const ErrorModel& em) {
  return linear(mlp_hidden(h, W, cfg, em), *W.down, em);
}

/// Element-wise sum of two row sets. Error rule: e = e_a + e_b + u ||a + b||_inf.
template <class T>
Rows<T> add_rows(const Rows<T>& a, const Rows<T>& b, const ErrorModel& em) {
  Rows<T> out{Tensor<T>(a.x.shape()), {}};
  for (index_t i = 0; i < a.x.size(); ++i) out.x[i] = a.x[i] + b.x[i];
  if (em.on()) {
    out.e.resize(a.e.size());
    for (index_t r = 0; r < a.n(); ++r)
      out.e[static_cast<std::size_t>(r)] = a.e[static_cast<std::size_t>(r)] + b.e[static_cast<std::size_t>(r)] +
                                           em.u * row_inf(out.x.ptr(r), out.w());
  }
  return out;
}

}  // namespace oasis::model
