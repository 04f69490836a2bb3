// The variant table of issue 8: for a small AttnRes model with identical weights under each
// variant of the SPEC §4 table (and the token-normaliser baselines the model supports), the
// outlier metrics of its trace and the output error under fake weight quantisation.
//
// Identical weights: one model of the superset configuration (OASIS: every router parameter,
// theta included) is initialised from a seed; every other variant copies each of its parameters
// by name. Pseudo-queries (zero-initialised in training) are drawn N(0, init_std^2) here so
// that the routers are not uniform.
//
// Tracked tensors (metrics.hpp): the hidden state h_l entering every sublayer and the readout
// state. Null mass: mean p_null of the token attentions; depth null mass: mean alpha_null.
// BOS mass, sink rate (epsilon 0.3) and attention entropy (null category included) need the
// attention probabilities, which the trace does not keep: attention_recompute() recomputes the
// sublayer from its traced input with the model's own layer functions (layers.hpp) and checks
// that the recomputed LSE, p_null and output equal the traced ones bitwise (mlp_recompute
// likewise), so a divergence from the model cannot go unnoticed. The same recomposition with
// every linear layer's weights and activations fake-quantised gives the sublayer-local W+A
// error (the model offers no activation hook for an end-to-end W+A forward).
// Quantised output error: relative RMS of the logits, ||logits_q - logits|| / ||logits||, with
// the linear-layer weights (q, k, v, o, gate, up, down) fake-quantised by the preset's weight
// scheme; embeddings, LM head, norms and router parameters stay in full precision (as in
// W8A8 studies). End-to-end activation quantisation needs a hook in the model's linear layers
// (include/oasis/model/layers.hpp), which the model does not offer: in that column activations
// stay in full precision (header "<preset>-W").
#pragma once

#include <cmath>
#include <cstdint>
#include <iomanip>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "oasis/metrics.hpp"
#include "oasis/model/model.hpp"
#include "oasis/quant.hpp"

namespace oasis::baselines_table {

using namespace oasis::model;

struct VariantCase {
  std::string name;
  Variant variant;
  std::optional<RowNorm> token;  ///< token-normaliser override (baselines)
};

inline std::vector<VariantCase> variant_cases() {
  std::vector<VariantCase> c;
  for (const VariantSpec& s : kVariants) c.push_back({std::string(s.name), s.variant, std::nullopt});
  c.push_back({"clipped_softmax", Variant::vanilla_attnres, RowNorm::clipped_softmax});
  c.push_back({"clipped_outeffhop", Variant::token_only, RowNorm::clipped_softmax1});
  c.push_back({"clipped_aos", Variant::aos, RowNorm::clipped_softmax1});
  c.push_back({"sparsemax", Variant::vanilla_attnres, RowNorm::sparsemax});
  c.push_back({"entmax15", Variant::vanilla_attnres, RowNorm::entmax15});
  return c;
}

struct VariantRow {
  std::string name;
  std::string token, depth;
  OutlierSummary outliers;
  double null_mass = 0;        ///< mean token p_null over attention sublayers
  double depth_null_mass = 0;  ///< mean alpha_null over routers (0 without routing)
  double bos_mass = 0;         ///< mean over attention layers of bos_mass
  double sink_rate = 0;        ///< fraction of (layer, head) with first-key importance > 0.3
  double entropy = 0;          ///< mean attention entropy (nats), null category included
  std::vector<double> quant_error;  ///< per preset: relative RMS logit error (weights only, end to end)
  std::vector<double> sublayer_wa_error;  ///< per preset: mean over sublayers of the relative RMS
                                          ///< error of f(h) with weights and activations quantised
};

struct TableOptions {
  ModelConfig base;  ///< sizes and conventions; variant/token_normalizer are set per row
  std::uint64_t seed = 8;
  index_t batch = 2, seq = 16;
  std::vector<std::string> presets{"W8A8", "W6A6", "W4A4"};
};

inline TableOptions default_table_options() {
  TableOptions o;
  o.base.vocab_size = 64;
  o.base.d_model = 32;
  o.base.n_blocks = 3;
  o.base.n_heads = 4;
  o.base.d_ff = 64;
  o.base.init_std = 0.25;  // large enough for non-uniform attention in an untrained model
  return o;
}

inline bool is_quantised_linear(const std::string& name) {
  for (const char* s : {".q_proj.weight", ".k_proj.weight", ".v_proj.weight", ".o_proj.weight",
                        ".gate_proj.weight", ".up_proj.weight", ".down_proj.weight"})
    if (name.size() > std::string(s).size() && name.compare(name.size() - std::string(s).size(), std::string::npos, s) == 0 &&
        name.rfind("_res.", std::string::npos) == std::string::npos)
      return true;
  return false;
}

/// Fake quantisation of one linear layer's operands (identity when cfg is null): the model's
/// own linear() on Q_A(x) and Q_W(W), so that without quantisation the result is bitwise the
/// model's.
inline Rows<double> qlinear(const Rows<double>& x, const Tensor<double>& W, const WAQuantConfig* cfg) {
  const ErrorModel em{};
  if (!cfg) return linear(x, W, em);
  return linear(Rows<double>{fake_quantize(x.x, cfg->activations), {}}, fake_quantize(W, cfg->weights), em);
}

struct AttentionRecompute {
  Tensor<double> probs;  ///< [B, H, T, T]
  Tensor<double> out;    ///< [B, T, d] sublayer output f(h)
};

/// The attention sublayer `tr` (block `blk`) of model m recomputed from tr.input exactly as
/// layers.hpp attention_sublayer computes it (pre-norm, q/k/v projections, optional q/k norm,
/// RoPE from position 0, causal token attention, o projection), optionally with every linear
/// layer fake-quantised (weights and activations). Without quantisation the recomputed LSE,
/// p_null and output must equal the traced ones bitwise (else it throws).
inline AttentionRecompute attention_recompute(const Model<double>& m, const SublayerTrace<double>& tr, index_t blk,
                                              const WAQuantConfig* quant = nullptr) {
  const ModelConfig& cfg = m.config();
  const std::string L = "layers." + std::to_string(blk);
  const index_t B = tr.input.dim(0), Tn = tr.input.dim(1), H = cfg.n_heads, Hkv = cfg.kv_heads(),
                dh = cfg.head_dim();
  const ErrorModel em{};
  const Rows<double> h{tr.input.reshaped({B * Tn, cfg.d_model}), {}};
  const Rows<double> xn = rms_norm(h, m.param(L + ".attn_norm.weight"), KeyNormOptions{cfg.norm_eps, false}, em);
  Rows<double> q = qlinear(xn, m.param(L + ".attn.q_proj.weight"), quant);
  Rows<double> k = qlinear(xn, m.param(L + ".attn.k_proj.weight"), quant);
  const Rows<double> v = qlinear(xn, m.param(L + ".attn.v_proj.weight"), quant);
  if (cfg.qk_norm) {
    q = head_rms_norm(q, H, dh, m.param(L + ".attn.q_norm.weight"), cfg.norm_eps, em);
    k = head_rms_norm(k, Hkv, dh, m.param(L + ".attn.k_norm.weight"), cfg.norm_eps, em);
  }
  q = rope(q, H, dh, Tn, 0, cfg.rope, cfg.rope_theta, em);
  k = rope(k, Hkv, dh, Tn, 0, cfg.rope, cfg.rope_theta, em);
  const Tensor<double> kh = append_heads(Tensor<double>(), k.x, B, Tn, Hkv, dh);
  const Tensor<double> vh = append_heads(Tensor<double>(), v.x, B, Tn, Hkv, dh);
  Tensor<double> qh({B, H, Tn, dh});
  for (index_t b = 0; b < B; ++b)
    for (index_t hh = 0; hh < H; ++hh)
      for (index_t t = 0; t < Tn; ++t)
        for (index_t c = 0; c < dh; ++c) qh(b, hh, t, c) = q.x(b * Tn + t, hh * dh + c);
  AttentionOptions o;
  o.normalizer = cfg.token_norm();
  o.causal = true;
  o.return_probs = true;
  const AttentionResult<double> a = token_attention(qh, kh, vh, o);
  Rows<double> merged{Tensor<double>({B * Tn, H * dh}), {}};
  for (index_t b = 0; b < B; ++b)
    for (index_t hh = 0; hh < H; ++hh)
      for (index_t t = 0; t < Tn; ++t)
        for (index_t c = 0; c < dh; ++c) merged.x(b * Tn + t, hh * dh + c) = a.out(b, hh, t, c);
  AttentionRecompute r;
  r.out = qlinear(merged, m.param(L + ".attn.o_proj.weight"), quant).x.reshaped({B, Tn, cfg.d_model});
  r.probs = a.probs;
  if (!quant) {
    for (index_t i = 0; i < a.lse.size(); ++i) {
      const bool same_lse = a.lse[i] == tr.lse[i] || (std::isinf(a.lse[i]) && std::isinf(tr.lse[i]));
      OASIS_REQUIRE(same_lse && a.p_null[i] == tr.p_null[i], tr.name,
                    "recomputed attention differs from the traced one at flat index ", i,
                    " (the model's attention sublayer changed; update attention_recompute)");
    }
    for (index_t i = 0; i < r.out.size(); ++i)
      OASIS_REQUIRE(r.out[i] == tr.output[i], tr.name, "recomputed output differs from the traced one at ", i);
  }
  return r;
}

/// The SwiGLU MLP sublayer `tr` (block `blk`) recomputed from tr.input as layers.hpp
/// mlp_sublayer computes it, optionally fake-quantised; bitwise equal to the trace without.
inline Tensor<double> mlp_recompute(const Model<double>& m, const SublayerTrace<double>& tr, index_t blk,
                                    const WAQuantConfig* quant = nullptr) {
  const ModelConfig& cfg = m.config();
  const std::string L = "layers." + std::to_string(blk);
  const index_t B = tr.input.dim(0), Tn = tr.input.dim(1);
  const ErrorModel em{};
  const Rows<double> h{tr.input.reshaped({B * Tn, cfg.d_model}), {}};
  const Rows<double> xn = rms_norm(h, m.param(L + ".mlp_norm.weight"), KeyNormOptions{cfg.norm_eps, false}, em);
  const Rows<double> a = qlinear(xn, m.param(L + ".mlp.gate_proj.weight"), quant);
  const Rows<double> b = qlinear(xn, m.param(L + ".mlp.up_proj.weight"), quant);
  Rows<double> hid{Tensor<double>(a.x.shape()), {}};
  for (index_t i = 0; i < a.x.size(); ++i) hid.x[i] = a.x[i] * sigmoid(a.x[i]) * b.x[i];
  const Tensor<double> out = qlinear(hid, m.param(L + ".mlp.down_proj.weight"), quant).x.reshaped({B, Tn, cfg.d_model});
  if (!quant)
    for (index_t i = 0; i < out.size(); ++i)
      OASIS_REQUIRE(out[i] == tr.output[i], tr.name, "recomputed MLP output differs from the traced one at ", i,
                    " (the model's MLP sublayer changed; update mlp_recompute)");
  return out;
}

inline double rel_rms(const Tensor<double>& a, const Tensor<double>& ref) {
  double num = 0, den = 0;
  for (index_t i = 0; i < ref.size(); ++i) {
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline std::vector<VariantRow> variant_table(const TableOptions& opt) {
  // The superset model: OASIS has every parameter of the Kimi-router variants.
  ModelConfig sup = opt.base;
  sup.variant = Variant::oasis;
  sup.token_normalizer.reset();
  Model<double> ref = Model<double>::initialized(sup, opt.seed);
  {
    std::mt19937_64 rng(opt.seed + 1);
    std::normal_distribution<double> nd(0.0, sup.init_std);
    for (const ParamSpec& p : parameter_specs(sup))
      if (p.name.size() > 6 && p.name.compare(p.name.size() - 6, 6, ".query") == 0) {
        Tensor<double> q(p.shape);
        for (index_t i = 0; i < q.size(); ++i) q[i] = nd(rng);
        ref.set_param(p.name, q);
      }
  }
  std::mt19937_64 rng(opt.seed + 2);
  std::uniform_int_distribution<index_t> tok(0, sup.vocab_size - 1);
  std::vector<index_t> ids(static_cast<std::size_t>(opt.batch * opt.seq));
  for (auto& t : ids) t = tok(rng);
  ForwardOptions fo;
  fo.trace = true;

  std::vector<VariantRow> rows;
  for (const VariantCase& vc : variant_cases()) {
    ModelConfig cfg = opt.base;
    cfg.variant = vc.variant;
    cfg.token_normalizer = vc.token;
    Model<double> m(cfg);
    for (const ParamSpec& p : parameter_specs(cfg)) m.set_param(p.name, ref.param(p.name));
    const ForwardResult<double> fp = m.forward(ids, opt.batch, opt.seq, fo);

    VariantRow r;
    r.name = vc.name;
    r.token = std::string(to_string(cfg.token_norm()));
    r.depth = cfg.attn_res() ? std::string(to_string(variant_spec(cfg.variant).depth)) : "residual";
    std::vector<Tensor<double>> tracked, probs;
    double pn = 0, an = 0;
    index_t n_att = 0, n_route = 0;
    for (const SublayerTrace<double>& tr : fp.trace) {
      if (tr.kind != SublayerKind::readout && !tr.input.empty()) tracked.push_back(tr.input);
      if (tr.kind == SublayerKind::attention && !tr.p_null.empty()) {
        pn += null_mass(tr.p_null);
        const Tensor<double> p = attention_recompute(m, tr, n_att).probs;
        r.bos_mass += bos_mass(p);
        r.entropy += attention_entropy(p, tr.p_null);
        probs.push_back(p);
        ++n_att;
      }
      if (tr.has_route && !tr.alpha_null.empty()) {
        double s = 0;
        for (index_t i = 0; i < tr.alpha_null.size(); ++i) s += tr.alpha_null[i];
        an += s / static_cast<double>(tr.alpha_null.size());
        ++n_route;
      }
    }
    tracked.push_back(fp.state);
    // Sublayer-local W+A fake quantisation: every sublayer recomputed from its traced input with
    // its linear layers' weights and activations quantised, against the traced output.
    r.sublayer_wa_error.assign(opt.presets.size(), 0.0);
    index_t n_sub = 0, n_mlp = 0, n_att2 = 0;
    for (const SublayerTrace<double>& tr : fp.trace) {
      if (tr.kind == SublayerKind::readout) continue;
      const bool att = tr.kind == SublayerKind::attention;
      const index_t blk = att ? n_att2++ : n_mlp++;
      if (!att) mlp_recompute(m, tr, blk);  // bitwise check of the recomposition
      for (std::size_t pi = 0; pi < opt.presets.size(); ++pi) {
        const WAQuantConfig qc = wa_preset(opt.presets[pi]);
        const Tensor<double> out = att ? attention_recompute(m, tr, blk, &qc).out : mlp_recompute(m, tr, blk, &qc);
        r.sublayer_wa_error[pi] += rel_rms(out, tr.output);
      }
      ++n_sub;
    }
    for (double& e : r.sublayer_wa_error) e /= static_cast<double>(n_sub);
    r.outliers = outlier_summary(tracked);
    r.null_mass = n_att ? pn / static_cast<double>(n_att) : 0.0;
    r.bos_mass /= static_cast<double>(n_att);
    r.entropy /= static_cast<double>(n_att);
    r.sink_rate = sink_rate(probs);
    r.depth_null_mass = n_route ? an / static_cast<double>(n_route) : 0.0;

    for (const std::string& preset : opt.presets) {
      const WAQuantConfig qc = wa_preset(preset);
      Model<double> mq = m;
      for (const auto& [name, w] : m.parameters())
        if (is_quantised_linear(name)) mq.set_param(name, fake_quantize(w, qc.weights));
      const ForwardResult<double> q = mq.forward(ids, opt.batch, opt.seq);
      r.quant_error.push_back(rel_rms(q.logits, fp.logits));
    }
    rows.push_back(r);
  }
  return rows;
}

inline void print_table(std::ostream& os, const TableOptions& opt, const std::vector<VariantRow>& rows) {
  os << "# variant table: d_model " << opt.base.d_model << ", blocks " << opt.base.n_blocks << ", heads "
     << opt.base.n_heads << ", B " << opt.batch << ", T " << opt.seq << ", seed " << opt.seed
     << ", init_std " << opt.base.init_std << "\n";
  os << "# <preset>-W: relative RMS logit error, end to end, linear weights fake-quantised (activations full\n"
     << "#   precision: the model has no activation hook); <preset>-sub: mean over sublayers of the relative RMS\n"
     << "#   error of f(h) recomputed from the traced input with weights AND activations fake-quantised\n";
  os << "# null: token p_null, d_null: depth alpha_null, bos: first-key mass, sink: sink rate (eps 0.3),\n"
     << "# entropy: attention entropy in nats with the null category\n";
  os << std::left << std::setw(20) << "variant" << std::setw(18) << "token" << std::setw(10) << "depth" << std::right
     << std::setw(10) << "avg_kurt" << std::setw(10) << "max_kurt" << std::setw(10) << "max_inf" << std::setw(10)
     << "null" << std::setw(10) << "d_null" << std::setw(10) << "bos" << std::setw(10) << "sink" << std::setw(10)
     << "entropy";
  for (const std::string& p : opt.presets) os << std::setw(12) << (p + "-W");
  for (const std::string& p : opt.presets) os << std::setw(12) << (p + "-sub");
  os << "\n";
  os << std::fixed;
  for (const VariantRow& r : rows) {
    os << std::left << std::setw(20) << r.name << std::setw(18) << r.token << std::setw(10) << r.depth << std::right
       << std::setprecision(3) << std::setw(10) << r.outliers.avg_kurtosis << std::setw(10) << r.outliers.max_kurtosis
       << std::setw(10) << r.outliers.max_inf_norm << std::setw(10) << r.null_mass << std::setw(10)
       << r.depth_null_mass << std::setw(10) << r.bos_mass << std::setw(10) << r.sink_rate << std::setw(10)
       << r.entropy;
    os << std::setprecision(6);
    for (double e : r.quant_error) os << std::setw(12) << e;
    for (double e : r.sublayer_wa_error) os << std::setw(12) << e;
    os << "\n";
  }
}

}  // namespace oasis::baselines_table
