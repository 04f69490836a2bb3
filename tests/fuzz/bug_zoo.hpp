// tests/fuzz/bug_zoo.hpp — kernels for the fuzzer's zoo (test_fuzz_zoo.cpp): three correct sink
// attention kernels written in float32 as real kernels are, and fifteen plausible sink bugs, each a
// flag on one of them. Every kernel is an oasis::verify::fuzz::Kernel: it reads the op's compare
// tensors by name (bhtd layout) and the options object, and returns the outputs it computes.
//
// Designs (docs/spec.md §1, §2, §8; one row = one (b, h, t), z_j = scale <q_t, k_j> + bias, s the
// head's null logit ("sink"), log2e = log2(e)):
//   tiled     FlashAttention-2 forward: key tiles of 64 (tiles outside the row's visible span are
//             skipped), weights e2^((z - m) log2e), the running state (m, l, o) started at the sink,
//             m = s, so that the running max includes it; at the end M = max(m, s),
//             l = l e2^((m-M) log2e) + e2^((s-M) log2e), out = o / l, LSE1 = M + ln 2 log2 l,
//             p_null = e2^((s-M) log2e) / l. (The max stays in nats: s log2e overflows float for a
//             finite sink above 2.4e38, as the huge_sink regime's s = +max is.)
//   split     split-KV decoding: splits of 64 keys, each reduced to (out_i, lse_i) with exp; merged in
//             log space with the sink added once: M = max(s, max_i lse_i), w_i = e^(lse_i - M),
//             L = e^(s-M) + sum_i w_i, out = sum_i w_i out_i / L, LSE1 = M + log L.
//   dispatch  tiled for Tq >= Tk, split for Tq < Tk (decoding and chunked prefill).
//   backward  FlashAttention-2 backward: P = e^(z - LSE1) from the stored LSE (recomputed by the
//             tiled forward when not given), D = rowsum(dO O), dp_j = <dO, v_j>,
//             dz_j = p_j (dp_j - D + dLSE1 - p_null dP_null), dq = scale sum_j dz_j k_j,
//             dk_j = scale sum dz_j q_t, dv_j = sum p_j dO_t, dbias = dz,
//             ds = p_null (dLSE1 - D + (1 - p_null) dP_null) with 1 - p_null = -expm1(s - LSE1),
//             summed over batch and rows per query head. grad_lse of an LSE in base 2 is
//             dLSE1 = log2e g; of the keys-only LSE (lse_null excluded) it adds g e^(z_j - LSE_keys)
//             to dz_j and nothing to ds.
// Conventions: lse_base "2" returns LSE / ln 2, lse_null "excluded" the LSE over the keys; a sink of
// -inf is a head without a null, +inf puts all the mass on the null (out 0, p_null 1, LSE1 +inf);
// a fully masked row has out 0, p_null 1, LSE1 = s (plain softmax: out 0, p_null 0, LSE -inf).
// Outputs: out and grad_q/k/v in the inputs' type (f32 for f64 inputs), the statistics, the null
// logits' gradient and grad_bias in f32.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "oasis/core/tensor.hpp"
#include "oasis/io/dtype.hpp"
#include "oasis/io/json.hpp"
#include "oasis/verify/fuzz.hpp"

namespace oasis::fuzz_zoo {

enum class Design { tiled, split, dispatch, backward };

enum class Bug {
  none,
  sink_linear,          ///< 1: the null's weight is s itself, not e^(s - M)
  sink_outside_max,     ///< 2: the running max over the keys only; e^(s - m) overflows for a large s
  nan_masked_rows,      ///< 3: out = (o / l_keys) sigmoid(LSE_keys - s): 0/0 on a fully masked row
  merge_linear,         ///< 4: split-KV merge in linear space: L = sum_i e^lse_i + e^s
  bwd_p_without_sink,   ///< 5: the backward recomputes LSE over the keys only: P = e^(z - LSE_keys)
  dsink_without_dlse,   ///< 6: ds = p_null (-D + (1 - p_null) dP_null), the dLSE term left out
  sink_dropped_decode,  ///< 7: the split (Tq < Tk) path ignores the sinks
  dsink_bf16,           ///< 8: ds accumulated in bf16 (rounded after every add)
  sink_as_bias,         ///< 9: s added to every score, the null logit left at 0
  lse_log2,             ///< 10: LSE returned in log2 whatever lse_base says
  lse_without_sink,     ///< 11: the merged LSE over the keys only (lse_null says included)
  mask_sentinel,        ///< 12: masked keys scored -5e4 instead of -inf (every key scanned)
  bwd_padded_tile_zero, ///< 13: the backward's recompute scores the last tile's out-of-range keys 0
  sink_per_kv_head,     ///< 14: sinks[h / group] instead of sinks[h]
  causal_top_left,      ///< 15: causal j <= t instead of j <= t + Tk - Tq
};

/// One kernel of the zoo: its op, design, bug and the features it lacks (fuzz::feature_names()).
struct Spec {
  std::string name;
  std::string op;  ///< "attention" or "attention_backward"
  Design design = Design::tiled;
  Bug bug = Bug::none;
  std::set<std::string> without;
  std::string regime;  ///< where the bug shows (the test's message)
};

namespace detail {

constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.69314718055994531f;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr index_t kTile = 64;

inline float bf16(float x) { return static_cast<float>(io::round_to_dtype(x, io::DType::bf16)); }

/// One call: the tensors in float and the options, parsed as a kernel's launcher would.
struct Call {
  index_t B = 0, H = 0, Hkv = 0, Tq = 0, Tk = 0, dh = 0, dv = 0, group = 1;
  io::DType dtype = io::DType::f32;
  Tensor<float> q, k, v, bias, mask;  ///< bias additive; mask 1 visible / 0 masked
  bool softmax1 = true, causal = false, keys_only = false, base2 = false;
  index_t window = 0;
  std::vector<index_t> len;  ///< key_lengths (empty: all Tk)
  std::vector<float> sink;   ///< per query head; empty: 0
  float scale = 1;
  bool infinite_sink = false;

  float sink_of(index_t h) const { return sink.empty() ? 0.0f : sink[static_cast<std::size_t>(h)]; }
  /// Offset of (b, h, t, j) in a bias or mask of shape [Tq, Tk] or [B|1, H|1, Tq, Tk].
  static index_t at(const Tensor<float>& x, index_t b, index_t h, index_t t, index_t j) {
    return x.rank() == 2 ? x.offset(t, j) : x.offset(x.dim(0) == 1 ? 0 : b, x.dim(1) == 1 ? 0 : h, t, j);
  }
  float bias_at(index_t b, index_t h, index_t t, index_t j) const { return bias.empty() ? 0.0f : bias[at(bias, b, h, t, j)]; }
  bool mask_at(index_t b, index_t h, index_t t, index_t j) const { return mask.empty() || mask[at(mask, b, h, t, j)] != 0; }
  /// Visible keys [begin, end) of row t: padding, causal (bottom-right, or top-left for bug 15), window.
  void span(index_t b, index_t t, bool top_left, index_t& begin, index_t& end) const {
    const index_t tp = top_left ? t : t + Tk - Tq;
    end = len.empty() ? Tk : len[static_cast<std::size_t>(b)];
    if ((causal || window > 0) && tp + 1 < end) end = tp + 1;
    begin = window > 0 ? std::max<index_t>(0, tp - window + 1) : 0;
    end = std::max(end, begin);
  }
  /// z = scale <q_t, k_j> + bias (products summed in column order).
  float score(index_t b, index_t h, index_t t, index_t j) const {
    const float *qt = q.ptr(b, h, t), *kj = k.ptr(b, h / group, j);
    float dot = 0;
    for (index_t c = 0; c < dh; ++c) dot += qt[c] * kj[c];
    return scale * dot + bias_at(b, h, t, j);
  }
};

inline Tensor<float> as_float(const io::StoredTensor& t) { return t.values.cast<float>(); }

inline const io::StoredTensor* find(const io::TensorMap& in, const std::string& n) {
  auto it = in.find(n);
  return it == in.end() ? nullptr : &it->second;
}

inline Call parse(const Spec& sp, const io::TensorMap& in, const io::json::Value& opt) {
  Call c;
  const io::StoredTensor *q = find(in, "q"), *k = find(in, "k"), *v = find(in, "v");
  if (!q || !k || !v) throw std::invalid_argument(sp.name + ": q, k and v are required");
  c.dtype = q->dtype;
  c.q = as_float(*q), c.k = as_float(*k), c.v = as_float(*v);
  c.B = c.q.dim(0), c.H = c.q.dim(1), c.Tq = c.q.dim(2), c.dh = c.q.dim(3);
  c.Hkv = c.k.dim(1), c.Tk = c.k.dim(2), c.dv = c.v.dim(3);
  c.group = c.H / c.Hkv;
  bool has_scale = false;
  std::vector<float> sink_opt;
  for (const auto& [key, x] : opt.members) {
    if (key == "causal") c.causal = x.b;
    else if (key == "window") c.window = static_cast<index_t>(x.as_double());
    else if (key == "key_lengths") for (const auto& e : x.items) c.len.push_back(static_cast<index_t>(e.as_double()));
    else if (key == "scale") has_scale = true, c.scale = static_cast<float>(x.as_double());
    else if (key == "null_logits") for (const auto& e : x.items) sink_opt.push_back(static_cast<float>(e.as_double()));
    else if (key == "normalizer") c.softmax1 = x.text != "softmax";
    else if (key == "lse_null") c.keys_only = x.text == "excluded";
    else if (key == "lse_base") c.base2 = x.text == "2";
    else if (key == "layout") { if (x.text != "bhtd") throw std::invalid_argument(sp.name + ": bhtd layout only"); }
    else throw std::invalid_argument(sp.name + ": unknown option " + key);
  }
  if (!has_scale) c.scale = 1.0f / std::sqrt(static_cast<float>(c.dh));
  if (const io::StoredTensor* s = find(in, "null_logits")) c.sink = as_float(*s).storage();
  else c.sink = sink_opt;
  if (!c.softmax1) c.sink.clear();
  if (const io::StoredTensor* b = find(in, "bias")) c.bias = as_float(*b);
  if (const io::StoredTensor* m = find(in, "mask")) c.mask = as_float(*m);
  for (float s : c.sink) c.infinite_sink = c.infinite_sink || std::isinf(s);
  // a kernel refuses what it does not implement (the fuzzer must not send it: FuzzOptions::without)
  auto lacks = [&](const char* f, bool used) {
    if (used && sp.without.count(f)) throw std::invalid_argument(sp.name + ": feature " + f + " not supported");
  };
  lacks("causal", c.causal);
  lacks("noncausal", !c.causal);
  lacks("window", c.window > 0);
  lacks("key_lengths", !c.len.empty());
  lacks("bias", !c.bias.empty());
  lacks("mask", !c.mask.empty());
  lacks("gqa", c.H > c.Hkv);
  lacks("decode", c.Tq < c.Tk);
  lacks("tq_gt_tk", c.Tq > c.Tk && c.causal);
  lacks("batch", c.B > 1);
  lacks("null_logits", find(in, "null_logits") != nullptr);
  lacks("infinite_null", c.infinite_sink);
  lacks("grad_lse", find(in, "grad_lse") != nullptr);
  lacks("grad_p_null", find(in, "grad_p_null") != nullptr);
  return c;
}

/// One row's statistics, in nats: LSE1 (with the null), LSE over the keys, p_null.
struct Row {
  float lse1 = -kInf, lse_keys = -kInf, p_null = 0;
};

/// The tiled forward of one row (Design::tiled); out receives dv values. `drop_sink`: the row as
/// plain softmax (bug 5's recompute); `pad_zero`: the last tile's keys past Tk scored 0 with v = 0 when
/// no mask bounds the row (bug 13: the bounds check lives in the causal/window/padding masks).
inline Row tiled_row(const Call& c, Bug bug, index_t b, index_t h, index_t t, float* out, bool drop_sink = false,
                     bool pad_zero = false) {
  const index_t hk = h / c.group;
  float s = c.sink_of(bug == Bug::sink_per_kv_head ? hk : h), sbias = 0;
  if (bug == Bug::sink_as_bias) sbias = s, s = 0;  // the sink as a score bias; the null stays at logit 0
  const bool null = c.softmax1 && !drop_sink && s > -kInf, pinf = null && s == kInf;
  // the running max starts at the sink unless the kernel keeps the keys apart (keys-only LSE asked; bugs 2, 3)
  const bool in_state = null && !pinf && !c.keys_only && bug != Bug::sink_outside_max && bug != Bug::nan_masked_rows;
  auto e2 = [](float a) { return std::exp2(a * kLog2e); };  // e^a
  index_t begin, end;
  c.span(b, t, bug == Bug::causal_top_left, begin, end);
  const bool sentinel = bug == Bug::mask_sentinel;  // scores every key, masked ones at -5e4
  const bool pad = pad_zero && !c.causal && c.window == 0 && c.len.empty();
  index_t j0 = sentinel || pad ? 0 : begin / kTile * kTile;
  const index_t jend = pad ? (c.Tk + kTile - 1) / kTile * kTile : sentinel ? c.Tk : end;
  float m = in_state ? s : -kInf, lk = 0;
  std::fill(out, out + c.dv, 0.0f);
  std::vector<float> x(static_cast<std::size_t>(kTile));
  for (; j0 < jend; j0 += kTile) {
    const index_t j1 = std::min(jend, j0 + kTile);
    float mt = -kInf;
    for (index_t j = j0; j < j1; ++j) {
      float& xj = x[static_cast<std::size_t>(j - j0)];
      const bool vis = j >= begin && j < end && c.mask_at(b, h, t, j);
      if (j >= c.Tk) xj = 0;  // bug 13: a zero-filled key past Tk, not masked
      else if (vis) xj = c.score(b, h, t, j) + sbias;
      else xj = sentinel ? -5e4f : -kInf;
      mt = std::max(mt, xj);
    }
    if (mt > m) {  // rescale by e^(m - m'), 0 when m = -inf
      const float cf = e2(m - mt);
      lk *= cf;
      for (index_t e = 0; e < c.dv; ++e) out[e] *= cf;
      m = mt;
    }
    for (index_t j = j0; j < j1; ++j) {
      const float xj = x[static_cast<std::size_t>(j - j0)];
      if (xj == -kInf || j >= c.Tk) {  // a padded key adds e^(0 - m) to l and nothing to o (v = 0)
        if (j >= c.Tk) lk += e2(xj - m);
        continue;
      }
      const float p = e2(xj - m);
      lk += p;
      const float* vj = c.v.ptr(b, hk, j);
      for (index_t e = 0; e < c.dv; ++e) out[e] += p * vj[e];
    }
  }
  Row r;
  if (!in_state) r.lse_keys = lk > 0 ? m + std::log2(lk) * kLn2 : -kInf;
  if (!null || pinf) {  // plain softmax over the keys; a +inf sink takes all the mass
    if (pinf || lk == 0) {
      std::fill(out, out + c.dv, 0.0f);
      r.lse1 = pinf ? kInf : -kInf;
      r.p_null = pinf ? 1.0f : 0.0f;
      return r;
    }
    for (index_t e = 0; e < c.dv; ++e) out[e] /= lk;
    r.lse1 = r.lse_keys = m + std::log2(lk) * kLn2;
    if (bug == Bug::lse_log2) r.lse1 = m * kLog2e + std::log2(lk);
    return r;
  }
  if (bug == Bug::nan_masked_rows) {  // post-hoc sink: keys normalised first, then scaled by 1 - p_null
    const float lke = m + std::log2(lk) * kLn2, d = s - lke;
    for (index_t e = 0; e < c.dv; ++e) out[e] = out[e] / lk / (1.0f + std::exp(d));
    r.lse1 = std::max(s, lke) + std::log1p(std::exp(-std::abs(d)));
    r.p_null = 1.0f / (1.0f + std::exp(-d));
    return r;
  }
  float M = std::max(m, s);
  if (bug == Bug::sink_outside_max) M = m;  // the null's weight e^(s - m) overflows for s far above the keys
  const float cf = m == -kInf ? 0.0f : e2(m - M);
  const float n = bug == Bug::sink_linear ? s : e2(s - M);
  const float l = lk * cf + n;
  for (index_t e = 0; e < c.dv; ++e) out[e] = out[e] * cf / l;
  r.lse1 = M + std::log2(l) * kLn2;
  if (bug == Bug::lse_log2) r.lse1 = M * kLog2e + std::log2(l);
  r.p_null = n / l;
  return r;
}

/// The split-KV forward of one row (Design::split).
inline Row split_row(const Call& c, Bug bug, index_t b, index_t h, index_t t, float* out) {
  const index_t hk = h / c.group;
  const float s = c.sink_of(bug == Bug::sink_per_kv_head ? hk : h);
  const bool null = c.softmax1 && s > -kInf && bug != Bug::sink_dropped_decode;
  index_t begin, end;
  c.span(b, t, bug == Bug::causal_top_left, begin, end);
  std::vector<float> lse_i, o_i;  // per split: its LSE and normalised output
  std::vector<float> z(static_cast<std::size_t>(kTile));
  for (index_t j0 = 0; j0 < c.Tk; j0 += kTile) {
    const index_t j1 = std::min(c.Tk, j0 + kTile);
    float m = -kInf, l = 0;
    for (index_t j = j0; j < j1; ++j) {
      const bool vis = j >= begin && j < end && c.mask_at(b, h, t, j);
      z[static_cast<std::size_t>(j - j0)] = vis ? c.score(b, h, t, j) : -kInf;
      m = std::max(m, z[static_cast<std::size_t>(j - j0)]);
    }
    if (m == -kInf) continue;  // no visible key in this split
    std::vector<float> o(static_cast<std::size_t>(c.dv), 0.0f);
    for (index_t j = j0; j < j1; ++j) {
      const float zj = z[static_cast<std::size_t>(j - j0)];
      if (zj == -kInf) continue;
      const float p = std::exp(zj - m);
      l += p;
      const float* vj = c.v.ptr(b, hk, j);
      for (index_t e = 0; e < c.dv; ++e) o[static_cast<std::size_t>(e)] += p * vj[e];
    }
    lse_i.push_back(m + std::log(l));
    for (float x : o) o_i.push_back(x / l);
  }
  std::fill(out, out + c.dv, 0.0f);
  Row r;
  float Mk = -kInf;
  for (float x : lse_i) Mk = std::max(Mk, x);
  if (Mk > -kInf) {
    float sk = 0;
    for (float x : lse_i) sk += std::exp(x - Mk);
    r.lse_keys = Mk + std::log(sk);
  }
  const std::size_t n_i = lse_i.size();
  if (null && s == kInf) {
    r.lse1 = kInf, r.p_null = 1;
    return r;
  }
  if (bug == Bug::merge_linear) {  // L = e^s + sum_i e^lse_i in float: overflows (or underflows) with the logits
    float L = null ? std::exp(s) : 0.0f;
    for (std::size_t i = 0; i < n_i; ++i) L += std::exp(lse_i[i]);
    for (std::size_t i = 0; i < n_i; ++i)
      for (index_t e = 0; e < c.dv; ++e) out[e] += std::exp(lse_i[i]) * o_i[i * static_cast<std::size_t>(c.dv) + e] / L;
    r.lse1 = std::log(L);
    r.p_null = null ? std::exp(s) / L : 0.0f;
    return r;
  }
  const float M = std::max(null ? s : -kInf, Mk);
  if (M == -kInf) return r;  // plain softmax, nothing visible: the documented zero
  const float n = null ? std::exp(s - M) : 0.0f;
  float L = n;
  for (std::size_t i = 0; i < n_i; ++i) {
    const float w = std::exp(lse_i[i] - M);
    L += w;
    for (index_t e = 0; e < c.dv; ++e) out[e] += w * o_i[i * static_cast<std::size_t>(c.dv) + e];
  }
  for (index_t e = 0; e < c.dv; ++e) out[e] /= L;
  r.lse1 = bug == Bug::lse_without_sink ? r.lse_keys : M + std::log(L);
  r.p_null = n / L;
  return r;
}

inline io::StoredTensor stored(const Tensor<float>& t, io::DType d) {
  io::StoredTensor s{d, t.cast<double>()};
  if (d != io::DType::f32)
    for (index_t i = 0; i < s.values.size(); ++i) s.values[i] = io::round_to_dtype(s.values[i], d);
  return s;
}

inline io::DType out_type(const Call& c) { return c.dtype == io::DType::f64 ? io::DType::f32 : c.dtype; }

/// The row's LSE as the kernel returns it (convention of lse_null and lse_base).
inline float lse_out(const Call& c, const Row& r) {
  const float x = c.keys_only && c.softmax1 ? r.lse_keys : r.lse1;
  return c.base2 ? x * kLog2e : x;
}

inline io::TensorMap forward(const Spec& sp, const io::TensorMap& in, const io::json::Value& opt) {
  const Call c = parse(sp, in, opt);
  Tensor<float> out({c.B, c.H, c.Tq, c.dv}), lse({c.B, c.H, c.Tq}), pn({c.B, c.H, c.Tq});
  const bool split = sp.design == Design::split || (sp.design == Design::dispatch && c.Tq < c.Tk);
  for (index_t b = 0; b < c.B; ++b)
    for (index_t h = 0; h < c.H; ++h)
      for (index_t t = 0; t < c.Tq; ++t) {
        // bug 7 lives on the split (decode) path only
        const Row r = split ? split_row(c, sp.bug, b, h, t, out.ptr(b, h, t))
                            : tiled_row(c, sp.bug == Bug::sink_dropped_decode ? Bug::none : sp.bug, b, h, t, out.ptr(b, h, t));
        lse(b, h, t) = sp.bug == Bug::lse_log2 ? r.lse1 : lse_out(c, r);
        pn(b, h, t) = r.p_null;
      }
  return {{"out", stored(out, out_type(c))}, {"lse", stored(lse, io::DType::f32)}, {"p_null", stored(pn, io::DType::f32)}};
}

inline io::TensorMap backward(const Spec& sp, const io::TensorMap& in, const io::json::Value& opt) {
  const Call c = parse(sp, in, opt);
  const io::StoredTensor* go = find(in, "grad_out");
  if (!go) throw std::invalid_argument(sp.name + ": grad_out is required");
  const Tensor<float> dO = as_float(*go);
  const io::StoredTensor *gl = find(in, "grad_lse"), *gp = find(in, "grad_p_null"), *so = find(in, "out"),
                         *sl = find(in, "lse");
  const Tensor<float> dlse = gl ? as_float(*gl) : Tensor<float>(), dpn = gp ? as_float(*gp) : Tensor<float>();
  // bugs 5 and 13 recompute the statistics whatever the forward stored
  const bool recompute = sp.bug == Bug::bwd_p_without_sink || sp.bug == Bug::bwd_padded_tile_zero;
  const index_t rows = c.B * c.H * c.Tq;
  std::vector<Row> st(static_cast<std::size_t>(rows));
  std::vector<float> D(static_cast<std::size_t>(rows)), dl1(st.size()), dlk(st.size()), dp(st.size());
  std::vector<float> o(static_cast<std::size_t>(c.dv));
  for (index_t b = 0; b < c.B; ++b)
    for (index_t h = 0; h < c.H; ++h)
      for (index_t t = 0; t < c.Tq; ++t) {
        const auto r = static_cast<std::size_t>((b * c.H + h) * c.Tq + t);
        Row& w = st[r];
        w = tiled_row(c, Bug::none, b, h, t, o.data(), sp.bug == Bug::bwd_p_without_sink,
                      sp.bug == Bug::bwd_padded_tile_zero);
        const float s = c.sink_of(h);
        const bool null = c.softmax1 && std::isfinite(s);
        if (sl && !recompute) {  // the stored LSE, in its convention, as LSE1 in nats
          float x = static_cast<float>(sl->values[static_cast<index_t>(r)]);
          if (c.base2) x *= kLn2;
          if (!(c.keys_only && c.softmax1)) w.lse1 = x;
          else if (w.lse_keys = x; null) w.lse1 = std::max(s, x) + std::log1p(std::exp(-std::abs(s - x)));  // logaddexp(s, x)
          else if (s == -kInf) w.lse1 = x;  // no null: the keys' LSE is LSE1 (a +inf sink keeps LSE1 = +inf)
        }
        if (null && w.lse1 > -kInf) w.p_null = std::exp(s - w.lse1);
        if (so) for (index_t e = 0; e < c.dv; ++e) o[static_cast<std::size_t>(e)] = static_cast<float>(so->values(b, h, t, e));
        float d = 0;
        for (index_t e = 0; e < c.dv; ++e) d += dO(b, h, t, e) * o[static_cast<std::size_t>(e)];
        D[r] = d;
        const float g = dlse.empty() ? 0.0f : dlse(b, h, t) * (c.base2 ? kLog2e : 1.0f);
        const bool keys = c.keys_only && c.softmax1;
        dl1[r] = keys ? 0.0f : g;
        dlk[r] = keys && w.lse_keys > -kInf ? g : 0.0f;
        dp[r] = dpn.empty() ? 0.0f : dpn(b, h, t);
      }
  Tensor<float> gq(c.q.shape()), gk(c.k.shape()), gv(c.v.shape()), gs({c.H}), gb;
  if (!c.bias.empty()) gb = Tensor<float>(c.bias.shape());
  for (index_t b = 0; b < c.B; ++b)
    for (index_t hk = 0; hk < c.Hkv; ++hk)
      for (index_t j0 = 0; j0 < c.Tk; j0 += kTile) {  // a key tile: dk, dv accumulate over the group's rows
        const index_t j1 = std::min(c.Tk, j0 + kTile);
        for (index_t h = hk * c.group; h < (hk + 1) * c.group; ++h)
          for (index_t t = 0; t < c.Tq; ++t) {
            const auto r = static_cast<std::size_t>((b * c.H + h) * c.Tq + t);
            const Row& w = st[r];
            if (!(w.lse1 > -kInf) || w.lse1 == kInf) continue;  // nothing visible (plain) or a +inf sink: no gradient
            index_t begin, end;
            c.span(b, t, false, begin, end);
            for (index_t j = std::max(j0, begin); j < std::min(j1, end); ++j) {
              if (!c.mask_at(b, h, t, j)) continue;
              const float z = c.score(b, h, t, j);
              if (z == -kInf) continue;  // masked by the bias
              const float p = std::exp(z - w.lse1);
              float dpj = 0;
              for (index_t e = 0; e < c.dv; ++e) dpj += dO(b, h, t, e) * c.v(b, hk, j, e);
              float dz = p * (dpj - D[r] + dl1[r] - w.p_null * dp[r]);
              if (dlk[r] != 0) dz += dlk[r] * std::exp(z - w.lse_keys);
              for (index_t e = 0; e < c.dv; ++e) gv(b, hk, j, e) += p * dO(b, h, t, e);
              for (index_t e = 0; e < c.dh; ++e) {
                gk(b, hk, j, e) += c.scale * dz * c.q(b, h, t, e);
                gq(b, h, t, e) += c.scale * dz * c.k(b, hk, j, e);
              }
              if (!gb.empty()) gb[Call::at(gb, b, h, t, j)] += dz;
            }
          }
      }
  for (index_t b = 0; b < c.B; ++b)
    for (index_t h = 0; h < c.H; ++h)
      for (index_t t = 0; t < c.Tq; ++t) {
        const auto r = static_cast<std::size_t>((b * c.H + h) * c.Tq + t);
        const float s = c.sink_of(h);
        if (!c.softmax1 || !std::isfinite(s)) continue;  // an infinite sink is a constant: gradient 0
        const float pn = st[r].p_null, comp = -std::expm1(s - st[r].lse1);
        const float dl = sp.bug == Bug::dsink_without_dlse ? 0.0f : dl1[r];
        gs[h] += pn * (dl - D[r] + comp * dp[r]);
        if (sp.bug == Bug::dsink_bf16) gs[h] = bf16(gs[h]);
      }
  const io::DType d = out_type(c);
  io::TensorMap res{{"grad_q", stored(gq, d)}, {"grad_k", stored(gk, d)}, {"grad_v", stored(gv, d)}};
  if (c.softmax1) res.emplace("grad_null_logits", stored(gs, io::DType::f32));
  if (!gb.empty()) res.emplace("grad_bias", stored(gb, io::DType::f32));
  return res;
}

}  // namespace detail

/// The kernel of `sp` as the fuzzer calls it.
inline verify::fuzz::Kernel kernel(const Spec& sp) {
  return [sp](const io::TensorMap& in, const io::json::Value& opt) {
    return sp.op == "attention" ? detail::forward(sp, in, opt) : detail::backward(sp, in, opt);
  };
}

/// The correct kernels: they support every feature.
inline std::vector<Spec> correct_kernels() {
  return {{"tiled", "attention", Design::tiled, Bug::none, {}, ""},
          {"split_kv", "attention", Design::split, Bug::none, {}, ""},
          {"fa2_backward", "attention_backward", Design::backward, Bug::none, {}, ""}};
}

/// The fifteen bugs, with the features such a kernel typically lacks.
inline std::vector<Spec> bug_kernels() {
  const std::string A = "attention", G = "attention_backward";
  return {
      {"01_sink_linear", A, Design::tiled, Bug::sink_linear, {"infinite_null", "bias", "mask"}, "any nonzero-size case"},
      {"02_sink_outside_max", A, Design::tiled, Bug::sink_outside_max, {"infinite_null", "key_lengths"},
       "sinks far above the logits (e^(s - m) overflows)"},
      {"03_nan_masked_rows", A, Design::tiled, Bug::nan_masked_rows, {"infinite_null", "bias", "mask", "window"},
       "fully masked rows (key_length 0, Tq > Tk causal)"},
      {"04_merge_linear", A, Design::split, Bug::merge_linear, {"infinite_null", "bias", "mask", "window", "tq_gt_tk"},
       "huge sinks, large logits or an LSE below -88.7"},
      {"05_bwd_p_without_sink", G, Design::backward, Bug::bwd_p_without_sink, {"infinite_null", "bias", "mask", "window"},
       "any case with p_null not negligible"},
      {"06_dsink_without_dlse", G, Design::backward, Bug::dsink_without_dlse, {"infinite_null", "bias", "mask"},
       "a grad_lse cotangent"},
      {"07_sink_dropped_decode", A, Design::dispatch, Bug::sink_dropped_decode, {"infinite_null", "bias", "mask"},
       "Tq < Tk (decode, chunked prefill)"},
      {"08_dsink_bf16", G, Design::backward, Bug::dsink_bf16, {"infinite_null", "bias", "mask", "window", "key_lengths"},
       "any case: the null logits' gradient in f32"},
      {"09_sink_as_bias", A, Design::tiled, Bug::sink_as_bias, {"infinite_null", "window"}, "a nonzero sink"},
      {"10_lse_log2", A, Design::tiled, Bug::lse_log2, {"bias", "mask", "key_lengths"}, "any LSE != 0"},
      {"11_lse_without_sink", A, Design::split, Bug::lse_without_sink, {"infinite_null", "bias", "mask", "window"},
       "p_null not negligible, fully masked rows"},
      {"12_mask_sentinel", A, Design::tiled, Bug::mask_sentinel, {"infinite_null"},
       "logits below -5e4 with masked keys"},
      {"13_bwd_padded_tile_zero", G, Design::backward, Bug::bwd_padded_tile_zero,
       {"infinite_null", "bias", "mask", "key_lengths"}, "non-causal, Tk not a multiple of 64"},
      {"14_sink_per_kv_head", A, Design::split, Bug::sink_per_kv_head, {"infinite_null", "bias", "mask", "window"},
       "GQA with different sinks in one group"},
      {"15_causal_top_left", A, Design::tiled, Bug::causal_top_left, {"infinite_null", "key_lengths"},
       "causal with Tq != Tk"},
  };
}

}  // namespace oasis::fuzz_zoo
