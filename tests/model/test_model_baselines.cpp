// Model family: the paper's baselines inside the model — fake weight-activation quantisation
// (ForwardOptions::quant), gated attention and the S2 prefix sink (ModelConfig options).
//   * hook off: every traced sublayer equals the public layer functions without options bitwise;
//   * hook on: every traced MLP and (gated) attention sublayer equals the composition of
//     oasis::fake_quant_linear (the quant.hpp reference) with the reference attention functions
//     bitwise, and the logit error grows as the bit width shrinks;
//   * gated / sink: every traced attention sublayer equals oasis::gated_attention /
//     oasis::prefix_sink_attention applied to the traced q, k, v bitwise;
//   * the new parameters are off by default, save/load stays bit-exact, errors are named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "model_test_util.hpp"
#include "oasis/research/baselines.hpp"
#include "oasis/model/decode.hpp"
#include "oasis/model/io.hpp"
#include "oasis/ops/quantize.hpp"
#include "oasis/research/quant_presets.hpp"

namespace om = oasis::model;
using oasis::index_t;
using oasis::Tensor;
using oasis::Variant;
using oasis::model_test::random_model;
using oasis::model_test::tiny;
using oasis::model_test::tokens;
using oasis::test::exactly_equal;
using oasis::test::thrown_argument;

namespace {

constexpr index_t kB = 2, kT = 5;

/// [B, T, H * dh] trace rows -> [B, H, T, dh] heads.
Tensor<double> to_heads(const Tensor<double>& x, index_t H) {
  const index_t B = x.dim(0), Tn = x.dim(1), dh = x.dim(2) / H;
  Tensor<double> out({B, H, Tn, dh});
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < Tn; ++t)
        for (index_t c = 0; c < dh; ++c) out(b, h, t, c) = x(b, t, h * dh + c);
  return out;
}
/// [B, H, T, dh] heads -> [B, T, H * dh].
Tensor<double> from_heads(const Tensor<double>& x) {
  const index_t B = x.dim(0), H = x.dim(1), Tn = x.dim(2), dh = x.dim(3);
  Tensor<double> out({B, Tn, H * dh});
  for (index_t b = 0; b < B; ++b)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < Tn; ++t)
        for (index_t c = 0; c < dh; ++c) out(b, t, h * dh + c) = x(b, h, t, c);
  return out;
}

/// RMSNorm(input) of a traced sublayer with the model's pre-norm gain, as [B, T, d].
Tensor<double> normed_input(const om::Model<double>& m, const om::SublayerTrace<double>& tr, const std::string& gain) {
  const index_t B = tr.input.dim(0), Tn = tr.input.dim(1), d = tr.input.dim(2);
  const om::Rows<double> h{tr.input.reshaped({B * Tn, d}), {}};
  return om::rms_norm(h, m.param(gain), m.config().norm_options(), om::ErrorModel{})
      .x.reshaped({B, Tn, d});
}

oasis::AttentionOptions model_attention_options(const om::ModelConfig& cfg) {
  oasis::AttentionOptions o;
  o.normalizer = cfg.token_norm();
  o.causal = true;
  o.return_probs = true;
  return o;
}

std::vector<om::ModelConfig> configs() {
  std::vector<om::ModelConfig> c{tiny(Variant::original, om::RouterFamily::kimi_full),
                                 tiny(Variant::oasis, om::RouterFamily::kimi_full),
                                 tiny(Variant::oasis, om::RouterFamily::kimi_block, 3),
                                 tiny(Variant::aos, om::RouterFamily::authors_code)};
  c[2].block_size = 3;
  return c;
}

}  // namespace

TEST(ModelBaselines, HookOffEqualsThePlainLayerFunctionsBitwise) {
  for (om::ModelConfig cfg : configs()) {
    const auto m = random_model<double>(cfg, 31);
    const auto ids = tokens(kB * kT, 32, cfg.vocab_size);
    om::ForwardOptions fo;
    fo.trace = true;
    const auto plain = m.forward(ids, kB, kT, fo);
    fo.quant = nullptr;
    fo.trace_probs = true;
    const auto probs = m.forward(ids, kB, kT, fo);
    EXPECT_TRUE(exactly_equal("logits (trace_probs)", probs.logits, plain.logits));
    index_t ba = 0, bm = 0;
    for (const auto& tr : plain.trace) {
      if (tr.kind == om::SublayerKind::readout) continue;
      const index_t d = cfg.d_model;
      const om::Rows<double> h{tr.input.reshaped({kB * kT, d}), {}};
      Tensor<double> out;
      if (tr.kind == om::SublayerKind::attention) {
        om::KVCache<double> cache;
        out = om::attention_sublayer(h, kB, kT, 0, m.attn_weights(ba++), cfg, cache, om::ErrorModel{}).out.x;
      } else {
        out = om::mlp_sublayer(h, m.mlp_weights(bm++), cfg, om::ErrorModel{}).x;
      }
      EXPECT_TRUE(exactly_equal(tr.name + " output", out.reshaped(tr.output.shape()), tr.output));
    }
    for (std::size_t i = 0; i < plain.trace.size(); ++i) {
      EXPECT_TRUE(plain.trace[i].attn_probs.empty());
      if (plain.trace[i].kind == om::SublayerKind::attention) {
        ASSERT_EQ(probs.trace[i].attn_probs.shape(), (oasis::Shape{kB, cfg.n_heads, kT, kT}));
      }
    }
  }
}

TEST(ModelBaselines, QuantisedMlpEqualsFakeQuantLinearCompositionBitwise) {
  for (om::ModelConfig cfg : configs()) {
    const auto m = random_model<double>(cfg, 41);
    const auto ids = tokens(kB * kT, 42, cfg.vocab_size);
    const oasis::WAQuantConfig qc = oasis::wa_preset("W6A6-dynamic");
    om::ForwardOptions fo;
    fo.trace = true;
    fo.quant = &qc;
    const auto q = m.forward(ids, kB, kT, fo);
    index_t blk = 0;
    for (const auto& tr : q.trace) {
      if (tr.kind != om::SublayerKind::mlp) continue;
      const std::string L = "layers." + std::to_string(blk++);
      const Tensor<double> xn = normed_input(m, tr, L + ".mlp_norm.weight").reshaped({kB * kT, cfg.d_model});
      const Tensor<double> a = oasis::fake_quant_linear(xn, m.param(L + ".mlp.gate_proj.weight"), qc);
      const Tensor<double> b = oasis::fake_quant_linear(xn, m.param(L + ".mlp.up_proj.weight"), qc);
      Tensor<double> hid(a.shape());
      for (index_t i = 0; i < a.size(); ++i) {
        const double s = a[i] * oasis::sigmoid(a[i]);  // silu, then the product (mlp_hidden's order)
        hid[i] = s * b[i];
      }
      const Tensor<double> out = oasis::fake_quant_linear(hid, m.param(L + ".mlp.down_proj.weight"), qc);
      EXPECT_TRUE(exactly_equal(tr.name + " hidden", hid.reshaped(tr.mlp_hidden.shape()), tr.mlp_hidden));
      EXPECT_TRUE(exactly_equal(tr.name + " output", out.reshaped(tr.output.shape()), tr.output));
    }
    EXPECT_EQ(blk, cfg.n_blocks);
  }
}

TEST(ModelBaselines, QuantisedGatedAttentionEqualsFakeQuantLinearCompositionBitwise) {
  for (om::ModelConfig cfg : configs()) {
    cfg.gated_attention = true;
    const auto m = random_model<double>(cfg, 45);
    const auto ids = tokens(kB * kT, 46, cfg.vocab_size);
    const oasis::WAQuantConfig qc = oasis::wa_preset("W4A4-dynamic");
    om::ForwardOptions fo;
    fo.trace = true;
    fo.quant = &qc;
    const auto r = m.forward(ids, kB, kT, fo);
    const index_t H = cfg.n_heads, Hkv = cfg.kv_heads(), dh = cfg.head_dim(), d = cfg.d_model;
    index_t blk = 0;
    for (const auto& tr : r.trace) {
      if (tr.kind != om::SublayerKind::attention) continue;
      const std::string L = "layers." + std::to_string(blk++);
      const Tensor<double> xn = normed_input(m, tr, L + ".attn_norm.weight");
      const Tensor<double> xr = xn.reshaped({kB * kT, d});
      // Reference: Q_A / Q_W around every linear map (quant.hpp), RoPE from position 0,
      // causal token attention, gates from the quantised normalised input and gate weights.
      auto proj = [&](const std::string& w, index_t heads) {
        const om::Rows<double> y{oasis::fake_quant_linear(xr, m.param(L + ".attn." + w), qc), {}};
        return om::rope(y, heads, dh, kT, 0, cfg.rope, cfg.rope_theta, om::ErrorModel{}).x.reshaped({kB, kT, heads * dh});
      };
      const Tensor<double> q = proj("q_proj.weight", H), k = proj("k_proj.weight", Hkv);
      const Tensor<double> v =
          oasis::fake_quant_linear(xr, m.param(L + ".attn.v_proj.weight"), qc).reshaped({kB, kT, Hkv * dh});
      EXPECT_TRUE(exactly_equal(tr.name + " q", q, tr.attn_q));
      EXPECT_TRUE(exactly_equal(tr.name + " v", v, tr.attn_v));
      const auto g = oasis::gated_attention(to_heads(q, H), to_heads(k, Hkv), to_heads(v, Hkv),
                                            oasis::fake_quantize(xn, qc.activations),
                                            oasis::fake_quantize(m.param(L + ".attn.head_gate.weight"), qc.weights),
                                            m.param(L + ".attn.head_gate.bias"), model_attention_options(cfg));
      const Tensor<double> heads = from_heads(g.attn.out);
      EXPECT_TRUE(exactly_equal(tr.name + " gated heads", heads, tr.attn_heads));
      const Tensor<double> out =
          oasis::fake_quant_linear(heads.reshaped({kB * kT, H * dh}), m.param(L + ".attn.o_proj.weight"), qc);
      EXPECT_TRUE(exactly_equal(tr.name + " output", out.reshaped(tr.output.shape()), tr.output));
    }
    EXPECT_EQ(blk, cfg.n_blocks);
  }
}

TEST(ModelBaselines, QuantisationErrorGrowsAsBitsShrink) {
  for (om::ModelConfig cfg : configs()) {
    const auto m = random_model<double>(cfg, 51);
    const auto ids = tokens(kB * kT, 52, cfg.vocab_size);
    const auto ref = m.forward(ids, kB, kT);
    std::vector<double> err;
    for (const char* p : {"W8A8-dynamic", "W6A6-dynamic", "W4A4-dynamic"}) {
      const oasis::WAQuantConfig qc = oasis::wa_preset(p);
      om::ForwardOptions fo;
      fo.quant = &qc;
      const auto q = m.forward(ids, kB, kT, fo);
      double num = 0, den = 0;
      for (index_t i = 0; i < ref.logits.size(); ++i) {
        num += (q.logits[i] - ref.logits[i]) * (q.logits[i] - ref.logits[i]);
        den += ref.logits[i] * ref.logits[i];
      }
      err.push_back(std::sqrt(num / den));
    }
    // Quantisation steps shrink by 4x per 2 bits; the error must be positive and ordered.
    EXPECT_GT(err[0], 0.0) << om::to_string(cfg.router);
    EXPECT_LT(err[0], err[1]) << om::to_string(cfg.router);
    EXPECT_LT(err[1], err[2]) << om::to_string(cfg.router);
  }
}

TEST(ModelBaselines, GatedAttentionEqualsTheReferenceBitwise) {
  for (om::ModelConfig cfg : configs()) {
    cfg.gated_attention = true;
    const auto m = random_model<double>(cfg, 61);
    const auto ids = tokens(kB * kT, 62, cfg.vocab_size);
    om::ForwardOptions fo;
    fo.trace = true;
    fo.trace_probs = true;
    const auto r = m.forward(ids, kB, kT, fo);
    index_t blk = 0;
    for (const auto& tr : r.trace) {
      if (tr.kind != om::SublayerKind::attention) continue;
      const std::string L = "layers." + std::to_string(blk++);
      const Tensor<double> x = normed_input(m, tr, L + ".attn_norm.weight");
      const auto g = oasis::gated_attention(to_heads(tr.attn_q, cfg.n_heads), to_heads(tr.attn_k, cfg.kv_heads()),
                                            to_heads(tr.attn_v, cfg.kv_heads()), x,
                                            m.param(L + ".attn.head_gate.weight"), m.param(L + ".attn.head_gate.bias"),
                                            model_attention_options(cfg));
      EXPECT_TRUE(exactly_equal(tr.name + " gates", g.gates, tr.attn_gates));
      EXPECT_TRUE(exactly_equal(tr.name + " gated heads", from_heads(g.attn.out), tr.attn_heads));
      EXPECT_TRUE(exactly_equal(tr.name + " probs", g.attn.probs, tr.attn_probs));
      EXPECT_TRUE(exactly_equal(tr.name + " p_null", g.attn.p_null, tr.p_null));
    }
    EXPECT_EQ(blk, cfg.n_blocks);
    // The gates matter: the same other weights without gating give different logits.
    om::ModelConfig plain_cfg = cfg;
    plain_cfg.gated_attention = false;
    om::Model<double> plain(plain_cfg);
    for (const auto& p : om::parameter_specs(plain_cfg)) plain.set_param(p.name, m.param(p.name));
    const auto ungated = plain.forward(ids, kB, kT);
    double diff = 0;
    for (index_t i = 0; i < ungated.logits.size(); ++i) diff = std::max(diff, std::abs(ungated.logits[i] - r.logits[i]));
    EXPECT_GT(diff, 0.0);
  }
}

TEST(ModelBaselines, PrefixSinkEqualsTheReferenceBitwise) {
  for (om::ModelConfig cfg : configs()) {
    cfg.prefix_sink = true;
    const auto m = random_model<double>(cfg, 71);
    const auto ids = tokens(kB * kT, 72, cfg.vocab_size);
    om::ForwardOptions fo;
    fo.trace = true;
    fo.trace_probs = true;
    const auto r = m.forward(ids, kB, kT, fo);
    index_t blk = 0;
    for (const auto& tr : r.trace) {
      if (tr.kind != om::SublayerKind::attention) continue;
      const std::string L = "layers." + std::to_string(blk++);
      const auto s = oasis::prefix_sink_attention(to_heads(tr.attn_q, cfg.n_heads), to_heads(tr.attn_k, cfg.kv_heads()),
                                                  to_heads(tr.attn_v, cfg.kv_heads()), m.param(L + ".attn.sink_key"),
                                                  m.param(L + ".attn.sink_value"), model_attention_options(cfg));
      EXPECT_TRUE(exactly_equal(tr.name + " heads", from_heads(s.attn.out), tr.attn_heads));
      EXPECT_TRUE(exactly_equal(tr.name + " p_sink", s.p_sink, tr.p_sink));
      EXPECT_TRUE(exactly_equal(tr.name + " probs", s.attn.probs, tr.attn_probs));
      ASSERT_EQ(tr.attn_probs.dim(3), kT + 1);
      // Every query sees the sink: p_sink > 0 everywhere.
      for (index_t i = 0; i < tr.p_sink.size(); ++i) EXPECT_GT(tr.p_sink[i], 0.0);
    }
    EXPECT_EQ(blk, cfg.n_blocks);
  }
}

TEST(ModelBaselines, BothOptionsTogetherAndIncrementalDecoding) {
  om::ModelConfig cfg = tiny(Variant::oasis, om::RouterFamily::kimi_full);
  cfg.gated_attention = true;
  cfg.prefix_sink = true;
  const auto m = random_model<double>(cfg, 81);
  const auto ids = tokens(kB * kT, 82, cfg.vocab_size);
  const auto full = m.forward(ids, kB, kT);
  // One position at a time through the cache: the same operations on the same values as the
  // full forward (docs/model.md, "Incremental decoding"), so the logits agree bit for bit; the
  // sink key is prepended to the cache at every step and the gates are per token.
  om::Decoder<double> dec(m, kB);
  Tensor<double> stepped({kB, kT, cfg.vocab_size});
  for (index_t t = 0; t < kT; ++t) {
    std::vector<index_t> step;
    for (index_t b = 0; b < kB; ++b) step.push_back(ids[static_cast<std::size_t>(b * kT + t)]);
    const auto r = dec.step(step, 1);
    for (index_t b = 0; b < kB; ++b)
      for (index_t v = 0; v < cfg.vocab_size; ++v) stepped(b, t, v) = r.logits(b, 0, v);
  }
  EXPECT_TRUE(exactly_equal("decoded logits", stepped, full.logits));
}

TEST(ModelBaselines, DefaultsOffInitUnchangedSaveLoadBitExact) {
  const om::ModelConfig base = tiny(Variant::oasis, om::RouterFamily::kimi_full);
  for (const auto& p : om::parameter_specs(base)) {
    EXPECT_EQ(p.name.find("head_gate"), std::string::npos) << p.name;
    EXPECT_EQ(p.name.find("sink_"), std::string::npos) << p.name;
  }
  om::ModelConfig cfg = base;
  cfg.gated_attention = true;
  cfg.prefix_sink = true;
  const auto a = om::Model<double>::initialized(base, 91), b = om::Model<double>::initialized(cfg, 91);
  for (const auto& [name, t] : a.parameters()) EXPECT_TRUE(exactly_equal(name + " init", b.param(name), t));
  EXPECT_EQ(b.param("layers.1.attn.head_gate.weight").shape(), (oasis::Shape{cfg.n_heads, cfg.d_model}));
  EXPECT_EQ(b.param("layers.1.attn.sink_key").shape(), (oasis::Shape{cfg.kv_heads(), cfg.head_dim()}));

  const auto m = random_model<double>(cfg, 92);
  const std::string path = ::testing::TempDir() + "oasis_model_baselines.safetensors";
  om::save_model(m, path);
  const auto back = om::load_model<double>(path);
  EXPECT_TRUE(back.config().gated_attention);
  EXPECT_TRUE(back.config().prefix_sink);
  ASSERT_EQ(back.parameters().size(), m.parameters().size());
  for (const auto& [name, t] : m.parameters()) EXPECT_TRUE(exactly_equal(name, back.param(name), t));
  const auto ids = tokens(kB * kT, 93, cfg.vocab_size);
  EXPECT_TRUE(exactly_equal("logits", back.forward(ids, kB, kT).logits, m.forward(ids, kB, kT).logits));
  std::remove(path.c_str());
  // A file written without the keys (before the baseline options existed) loads with both options off.
  auto meta = om::config_metadata(base);
  meta.erase("oasis.gated_attention");
  meta.erase("oasis.prefix_sink");
  const om::ModelConfig old = om::config_from_metadata(meta);
  EXPECT_FALSE(old.gated_attention);
  EXPECT_FALSE(old.prefix_sink);
  meta["oasis.prefix_sink"] = "yes";
  try {
    om::config_from_metadata(meta);
    ADD_FAILURE() << "malformed oasis.prefix_sink accepted";
  } catch (const oasis::invalid_argument& e) {
    EXPECT_EQ(e.argument(), "oasis.prefix_sink");
  }
}

TEST(ModelBaselines, ErrorBoundWithBaselinesOrQuantisationIsRejected) {
  om::ModelConfig cfg = tiny(Variant::oasis, om::RouterFamily::kimi_full);
  const auto ids = tokens(kB * kT, 94, cfg.vocab_size);
  const oasis::WAQuantConfig qc = oasis::wa_preset("W8A8-dynamic");
  auto arg = [&](const om::ModelConfig& c, const oasis::WAQuantConfig* q) -> std::string {
    om::ForwardOptions fo;
    fo.error_u = oasis::unit_roundoff<float>();
    fo.quant = q;
    return thrown_argument([&] { om::Model<double>::initialized(c, 1).forward(ids, kB, kT, fo); });
  };
  EXPECT_EQ(arg(cfg, &qc), "error_u");
  om::ModelConfig g = cfg;
  g.gated_attention = true;
  EXPECT_EQ(arg(g, nullptr), "error_u");
  om::ModelConfig s = cfg;
  s.prefix_sink = true;
  EXPECT_EQ(arg(s, nullptr), "error_u");
  EXPECT_EQ(arg(cfg, nullptr), "(no error)");
}

TEST(ModelBaselines, CalibratedPresetNeedsCalibrationAndFixesItsRanges) {
  // bondarenko-W8A8 (docs/baselines.md): static activation ranges from calibration forwards.
  om::ModelConfig cfg = tiny(Variant::oasis, om::RouterFamily::kimi_full);
  const auto m = random_model<double>(cfg, 61);
  const auto calib = tokens(kB * kT, 62, cfg.vocab_size), ids = tokens(kB * kT, 63, cfg.vocab_size);
  oasis::WAQuantConfig qc = oasis::wa_preset("bondarenko-W8A8");
  om::ForwardOptions fo;
  fo.quant = &qc;
  EXPECT_EQ(thrown_argument([&] { m.forward(ids, kB, kT, fo); }), "calibration");  // none attached
  oasis::ActivationCalibration cal;
  qc.calibration = &cal;
  m.forward(calib, kB, kT, fo);
  const std::size_t sites = cal.sites.size();
  EXPECT_GT(sites, 0u);
  m.forward(calib, kB, kT, fo);
  EXPECT_EQ(cal.sites.size(), sites);  // one site per activation quantiser, reused every pass
  EXPECT_EQ(cal.sites[0].batches, 2);
  cal.frozen = true;
  const auto a = m.forward(ids, kB, kT, fo), b = m.forward(ids, kB, kT, fo);
  const auto ref = m.forward(ids, kB, kT);
  double diff = 0;
  for (index_t i = 0; i < ref.logits.size(); ++i) {
    EXPECT_EQ(a.logits[i], b.logits[i]);  // frozen ranges: the evaluation does not move them
    diff = std::max(diff, std::abs(a.logits[i] - ref.logits[i]));
  }
  EXPECT_EQ(cal.sites[0].batches, 2);
  EXPECT_GT(diff, 0.0);
  // A frozen pass of a model with more linear layers than were calibrated is refused by name.
  om::ModelConfig bigger = cfg;
  bigger.n_blocks += 1;
  const auto m2 = random_model<double>(bigger, 64);
  EXPECT_EQ(thrown_argument([&] { m2.forward(ids, kB, kT, fo); }), "calibration");
}
