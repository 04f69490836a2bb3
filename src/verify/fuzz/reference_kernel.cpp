// src/verify/fuzz/reference_kernel.cpp — reference_kernel(): the library's plain reference of an
// op evaluated in float32 on the case's inputs, outputs stored as f32 (what it is a correct kernel
// of: oasis/verify/fuzz.hpp): the fuzzer's own no-false-alarm baseline (tests/fuzz) and the example
// of docs/fuzz.md.
#include <algorithm>
#include <cmath>

#include "oasis/grad/attention_backward.hpp"
#include "oasis/grad/attn_res_backward.hpp"
#include "oasis/grad/coupling_backward.hpp"
#include "oasis/grad/depth_backward.hpp"
#include "oasis/grad/pseudo_query_backward.hpp"
#include "oasis/ops/attention.hpp"
#include "oasis/ops/coupling.hpp"
#include "oasis/ops/depth.hpp"
#include "oasis/ops/normalizer.hpp"
#include "oasis/verify/fuzz.hpp"
#include "../lse_convention.hpp"
#include "../op_options.hpp"
#include "regimes.hpp"

namespace oasis::verify::fuzz {
namespace {

namespace vd = ::oasis::verify::detail;
using vd::Options;
using TF = Tensor<float>;

TF in_f(const io::TensorMap& in, const std::string& name) { return in.at(name).values.cast<float>(); }
TF opt_f(const io::TensorMap& in, const std::string& name) {
  auto it = in.find(name);
  return it == in.end() ? TF() : it->second.values.cast<float>();
}
io::StoredTensor f32(const TF& t) { return {io::DType::f32, t.cast<double>()}; }

io::TensorMap attention(const io::TensorMap& in, const Options& o, bool backward) {
  OASIS_REQUIRE(vd::lse_convention(o).is_default(), "lse_null",
                "reference_kernel stores the LSE in the default convention (null included, base e)");
  const AttentionOptions a = vd::attention_call_options(o, in);
  const TF q = in_f(in, "q"), k = in_f(in, "k"), v = in_f(in, "v");
  io::TensorMap out;
  if (!backward) {
    const AttentionResult<float> r = token_attention<float>(q, k, v, a);
    out["out"] = f32(r.out), out["lse"] = f32(r.lse), out["p_null"] = f32(r.p_null);
    return out;
  }
  const AttentionGrads<float> g =
      token_attention_backward<float>(q, k, v, {in_f(in, "grad_out"), opt_f(in, "grad_lse"), opt_f(in, "grad_p_null")}, a);
  out["grad_q"] = f32(g.q), out["grad_k"] = f32(g.k), out["grad_v"] = f32(g.v);
  if (!g.null_logits.empty() && in.count("null_logits")) out["grad_null_logits"] = f32(g.null_logits);
  if (!g.bias.empty() && in.count("bias")) out["grad_bias"] = f32(g.bias);
  return out;
}

io::TensorMap depth(const std::string& op, const io::TensorMap& in, const Options& o) {
  const DepthOptions d = vd::parse_depth_options(o, op == "coupling" || in.count("psi"));
  const TF g_old = in_f(in, "g_old");
  const index_t n = g_old.dim(0), N = g_old.dim(1);
  const std::vector<SourceKind> kinds = vd::parse_kinds(o, n);
  const TF psi = in.count("psi") ? in_f(in, "psi") : TF({n, N});
  io::TensorMap out;
  if (op == "coupling") {
    TF g({n, N}), dpsi({n, N});
    for (index_t t = 0; t < N; ++t) {
      Vec<float> gv(n), pv(n);
      for (index_t i = 0; i < n; ++i) gv[i] = g_old(i, t), pv[i] = psi(i, t);
      const DepthWeights<float> w = depth_weights(gv, pv, kinds, d);
      for (index_t i = 0; i < n; ++i) g(i, t) = w.g[i], dpsi(i, t) = w.dpsi[i];
    }
    out["g"] = f32(g), out["dpsi"] = f32(dpsi);
    return out;
  }
  const TF src = in_f(in, "sources");
  if (op == "depth") {
    const DepthRoute<float> r = attn_res_route(src, g_old, psi, kinds, d);
    out["h"] = f32(r.h), out["alpha"] = f32(r.alpha), out["alpha_null"] = f32(r.alpha_null), out["g"] = f32(r.g),
    out["dpsi"] = f32(r.dpsi);
    return out;
  }
  const DepthGrads<float> g = attn_res_route_backward(
      src, g_old, psi, kinds, d, DepthCotangents<float>{in_f(in, "grad_h"), opt_f(in, "grad_alpha"), opt_f(in, "grad_alpha_null")});
  out["grad_sources"] = f32(g.sources), out["grad_g_old"] = f32(g.g_old);
  if (d.coupling) out["grad_psi"] = f32(g.psi);
  return out;
}

io::TensorMap pseudo_query(const std::string& op, const io::TensorMap& in, const Options& o) {
  KeyNormOptions k;
  k.eps = o.number("eps", k.eps);
  k.compute_in_float32 = o.boolean("compute_in_float32", false);
  const TF src = in_f(in, "sources"), w = in_f(in, "w"), gain = opt_f(in, "gain");
  io::TensorMap out;
  if (op == "pseudo_query") {
    out["g"] = f32(pseudo_query_logits(src, w, gain, k));
    return out;
  }
  const PseudoQueryGrads<float> g = pseudo_query_logits_backward(src, w, gain, in_f(in, "grad_g"), k);
  out["grad_sources"] = f32(g.sources), out["grad_w"] = f32(g.w);
  if (!gain.empty()) out["grad_gain"] = f32(g.gain);
  return out;
}

/// The fused AttnRes routing of the library (oasis/ops/attn_res.hpp, oasis/grad/attn_res_backward.hpp)
/// in float. Block AttnRes routes over Kimi's torch.stack(blocks + [partial_block])
/// (stack_block_sources); its gradient is split into grad_blocks and grad_partial.
io::TensorMap attn_res(const std::string& op, const io::TensorMap& in, const Options& o) {
  const bool block = op == "block_attn_res" || op == "block_attn_res_backward";
  AttnResOptions a;
  a.key_norm.eps = o.number("eps", a.key_norm.eps);
  a.scale = o.number("scale", 1.0);
  a.depth = vd::parse_depth_options(o, in.count("psi") > 0);
  if (!o.has("normalizer")) a.depth.normalizer = RowNorm::softmax;  // the op's default, fla's
  const TF blocks = block ? in_f(in, "blocks") : TF(), partial = block ? opt_f(in, "partial") : TF();
  const TF src = block ? stack_block_sources(blocks, partial) : in_f(in, "sources"), w = in_f(in, "w"),
           gain = opt_f(in, "gain");
  const index_t n = src.dim(0), N = src.dim(1);
  const std::vector<SourceKind> kinds = vd::parse_kinds(o, n);
  const TF psi = in.count("psi") ? in_f(in, "psi") : TF({n, N});
  io::TensorMap out;
  if (op == "attn_res" || op == "block_attn_res") {
    const DepthRoute<float> r = oasis::attn_res(src, w, gain, psi, kinds, a);
    out["h"] = f32(r.h), out["alpha"] = f32(r.alpha), out["alpha_null"] = f32(r.alpha_null);
    return out;
  }
  AttnResGrads<float> g = attn_res_backward(
      src, w, gain, psi, kinds, a,
      DepthCotangents<float>{in_f(in, "grad_h"), opt_f(in, "grad_alpha"), opt_f(in, "grad_alpha_null")});
  if (block) {
    const BlockAttnResGrads<float> b = split_block_grads(g, blocks.dim(0), !partial.empty());
    out["grad_blocks"] = f32(b.blocks);
    if (!partial.empty()) out["grad_partial"] = f32(b.partial);
  } else {
    out["grad_sources"] = f32(g.sources);
  }
  out["grad_w"] = f32(g.w);
  if (!gain.empty()) out["grad_gain"] = f32(g.gain);
  if (a.depth.coupling) out["grad_psi"] = f32(g.psi);
  return out;
}

io::TensorMap psi(const std::string& op, const io::TensorMap& in, const Options& o) {
  const bool mass = o.string("estimator", "p_null") == "mass";
  io::TensorMap out;
  if (op == "psi") {
    out["psi"] = f32(mass ? null_statistic_from_mass(in_f(in, "probs")) : null_statistic(in_f(in, "p_null")));
    return out;
  }
  const TF dpsi = in_f(in, "grad_psi");
  if (mass) out["grad_probs"] = f32(null_statistic_from_mass_backward(in_f(in, "probs"), dpsi));
  else out["grad_p_null"] = f32(null_statistic_backward(dpsi, in.at("p_null").values.dim(1)));
  return out;
}

io::TensorMap normalizer(const io::TensorMap& in, const Options& o) {
  OASIS_REQUIRE(vd::lse_convention(o).is_default(), "lse_null",
                "reference_kernel stores the LSE in the default convention (null included, base e)");
  const RowNorm kind = vd::token_normalizer(o, "normalizer");
  const TF z = in_f(in, "z");
  const index_t m = z.dim(z.rank() - 1), R = m > 0 ? z.size() / m : 0;
  const TF s = opt_f(in, "s");
  Shape lead(z.shape().begin(), z.shape().end() - 1);
  TF p(z.shape()), p_null(lead), lse(lead);
  for (index_t r = 0; r < R; ++r) {
    const float sr = s.empty() ? static_cast<float>(o.number("null_logit", 0.0)) : s[s.size() == 1 ? 0 : r];
    const RowStats<float> st = normalize_row(kind, z.data() + r * m, m, sr, p.data() + r * m);
    p_null[r] = st.p_null, lse[r] = st.lse;
  }
  io::TensorMap out;
  out["p"] = f32(p), out["p_null"] = f32(p_null), out["lse"] = f32(lse);
  return out;
}

/// attention_merge, form A: the log-space merge in float (docs/spec.md §1): the partials' LSEs in
/// nats (base-2 ones times the rounded ln 2), M = max(s, lse_i), w_i = e^{lse_i - M}, L = M + log(sum),
/// out = sum_i (w_i / sum) out_i over the splits with a visible key (an empty split's out is never
/// read), p_null = e^{s - M} / sum.
io::TensorMap merge(const io::TensorMap& in, const Options& o) {
  OASIS_REQUIRE(vd::lse_convention(o).is_default(), "lse_null",
                "reference_kernel stores the LSE in the default convention (null included, base e)");
  OASIS_REQUIRE(in.count("out_parts") && in.count("lse_parts"), "out_parts",
                "reference_kernel merges given partials (attention_merge's form A)");
  const std::string mode = o.string("sink_in", "merge");
  const bool base2 = o.string("parts_lse_base", "e") == "2";
  const TF op = in_f(in, "out_parts"), lp = in_f(in, "lse_parts");
  const index_t S = op.dim(0), B = op.dim(1), H = op.dim(2), Tq = op.dim(3), dv = op.dim(4), R = B * H * Tq;
  std::vector<double> sd = o.numbers("null_logits");
  if (in.count("null_logits")) sd = in.at("null_logits").values.storage();
  if (sd.empty()) sd.assign(static_cast<std::size_t>(H), mode == "none" ? -INFINITY : 0.0);
  TF out({B, H, Tq, dv}), lse({B, H, Tq}), pn({B, H, Tq});
  std::vector<float> z(static_cast<std::size_t>(S)), w(z.size());
  for (index_t r = 0; r < R; ++r) {
    const float s = static_cast<float>(sd[static_cast<std::size_t>((r / Tq) % H)]);
    float M = mode == "merge" ? s : -INFINITY;
    for (index_t i = 0; i < S; ++i) {
      const float zi = lp[i * R + r];
      z[static_cast<std::size_t>(i)] = base2 && !std::isinf(zi) ? zi * 0.693147181f : zi;
      M = std::max(M, z[static_cast<std::size_t>(i)]);
    }
    if (std::isinf(M)) {  // no term (the documented zero) or a +inf null logit (all on the null)
      lse[r] = M, pn[r] = M > 0 ? 1.0f : 0.0f;
      continue;
    }
    float sum = 0;
    for (index_t i = 0; i < S; ++i) {
      const float zi = z[static_cast<std::size_t>(i)];
      sum += w[static_cast<std::size_t>(i)] = std::isinf(zi) ? 0.0f : std::exp(zi - M);
    }
    const float w0 = mode == "merge" && s > -INFINITY ? std::exp(s - M) : 0.0f;
    sum += w0;
    lse[r] = M + std::log(sum);
    pn[r] = mode == "merge" ? w0 / sum : mode == "split0" && s > -INFINITY ? std::exp(s - M) / sum : 0.0f;
    for (index_t i = 0; i < S; ++i) {
      const float wi = w[static_cast<std::size_t>(i)];
      if (wi == 0.0f) continue;
      const float p = wi / sum;
      for (index_t x = 0; x < dv; ++x) out[r * dv + x] += p * op[(i * R + r) * dv + x];
    }
  }
  io::TensorMap res;
  res["out"] = f32(out), res["lse"] = f32(lse), res["p_null"] = f32(pn);
  return res;
}

}  // namespace

Kernel reference_kernel(const std::string& op) {
  const std::string fam = detail::family(op);
  return [op, fam](const io::TensorMap& in, const io::json::Value& options) {
    const Options o(&options);
    if (fam == "attention") return attention(in, o, op == "attention_backward");
    if (fam == "depth") return depth(op, in, o);
    if (fam == "pseudo_query") return pseudo_query(op, in, o);
    if (fam == "psi") return psi(op, in, o);
    if (fam == "merge") return merge(in, o);
    if (fam == "attn_res") return attn_res(op, in, o);
    return normalizer(in, o);
  };
}

}  // namespace oasis::verify::fuzz
