// tests/verify/test_compare_trace.cpp — `oasis-verify compare` on model traces: the logits from the
// readout state and end to end without it, every local step of a float trace, a mistake in one
// sublayer named at that step, and the trace checked sublayer by sublayer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <string>

#include "oasis/verify/compare.hpp"
#include "oasis/io/safetensors.hpp"
#include "oasis/model/io.hpp"
#include "oasis/oasis.hpp"
#include "oasis_test.hpp"
#include "compare_test_util.hpp"

namespace io = oasis::io;
namespace om = oasis::model;
namespace verify = oasis::verify;
using oasis::index_t;
using oasis::Tensor;
using namespace oasis::verify_test;

namespace {

/// The small test model: OASIS variant, Kimi full router, 2 blocks, d = 16, vocab 32; init_std
/// 0.3 gives logits of order 1 (the default 0.02 gives near-uniform logits).
om::ModelConfig small_model_config() {
  om::ModelConfig cfg;
  cfg.init_std = 0.3;
  cfg.theta_init = 0.5;
  return cfg;
}

std::vector<index_t> token_ids(index_t B, index_t Tn, index_t vocab, index_t mul, index_t add, Tensor<double>& idt) {
  std::vector<index_t> ids;
  idt = Tensor<double>({B, Tn});
  for (index_t i = 0; i < B * Tn; ++i) {
    ids.push_back((mul * i + add) % vocab);
    idt[i] = static_cast<double>(ids.back());
  }
  return ids;
}

/// Every trace tensor of a float forward as an implementation would dump it (f32), with the
/// readout state and logits; p_null is left out, so branch_psi is checked by the attention core.
/// dt: f32 for a float model, f64 for a double model.
template <class T>
io::TensorMap full_trace(const om::ForwardResult<T>& res, const Tensor<double>& idt, io::DType dt = io::DType::f32) {
  io::TensorMap out{{"ids", {io::DType::f32, idt}},
                    {"logits", {dt, res.logits.template cast<double>()}},
                    {"state", {dt, res.state.template cast<double>()}}};
  for (const auto& tr : res.trace) {
    auto put = [&](const std::string& f, const Tensor<T>& t) {
      if (t.size() > 0) out.emplace(tr.name + "." + f, io::StoredTensor{dt, t.template cast<double>()});
    };
    if (tr.has_route) {
      put("sources", tr.sources); put("g_old", tr.g_old); put("psi", tr.psi); put("alpha", tr.alpha);
      put("alpha_null", tr.alpha_null); put("g", tr.g); put("dpsi", tr.dpsi); put("routed", tr.routed);
    }
    if (tr.kind == om::SublayerKind::readout) continue;
    put("input", tr.input); put("output", tr.output);
    if (tr.kind == om::SublayerKind::attention) {
      put("attn_q", tr.attn_q); put("attn_k", tr.attn_k); put("attn_v", tr.attn_v);
      put("attn_heads", tr.attn_heads); put("branch_psi", tr.branch_psi);
    } else {
      put("mlp_hidden", tr.mlp_hidden);
    }
  }
  return out;
}

std::set<std::string> failing(const verify::CompareReport& r) {
  std::set<std::string> f;
  for (const auto& t : r.tensors)
    if (!t.informative && !t.passed) f.insert(t.name);
  return f;
}

}  // namespace

TEST(VerifyCompare, ModelLogitsAreCheckedFromTheReadoutStateAndEndToEndWithoutIt) {
  const om::ModelConfig cfg = small_model_config();
  const auto mf = om::Model<float>::initialized(cfg, 4242);
  const std::string dir = tmp_dir("model");
  om::save_model(mf, dir + "/model.safetensors");
  const index_t B = 2, Tn = 5;
  Tensor<double> idt;
  const std::vector<index_t> ids = token_ids(B, Tn, cfg.vocab_size, 7, 3, idt);
  const om::ForwardResult<float> res = mf.forward(ids, B, Tn);
  io::TensorMap out{{"ids", {io::DType::f32, idt}}, {"logits", {io::DType::f32, res.logits.cast<double>()}}};

  // logits alone: the end-to-end verdict (row parity against the float and mp50 replays)
  io::write_safetensors(dir + "/run.safetensors", out);
  verify::CompareReport r = run_config(dir, kModelCfg);
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  EXPECT_FALSE(find(r, "logits").informative);
  EXPECT_GT(find(r, "logits").max_ulps, 0.0);  // the float model does not round the exact logits
  EXPECT_LT(find(r, "logits").worst_ratio, 1.0);
  EXPECT_NE(verify::format_report(r).find("logits: end-to-end verdict"), std::string::npos) << verify::format_report(r);

  // with the readout state: the head step (final RMSNorm + LM head) from it, the state end to end
  out.emplace("state", io::StoredTensor{io::DType::f32, res.state.cast<double>()});
  io::write_safetensors(dir + "/run.safetensors", out);
  r = run_config(dir, kModelCfg);
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  EXPECT_EQ(r.tensors.size(), 2u);
  EXPECT_LT(find(r, "logits").worst_ratio, 1.0);

  // The bound of logit [1, 3, 7]: 0.5 ulp + 2 e_head(row) with u = u_f32, e_head from the head
  // step of the double model on the same state (double stands in for mp50: its own error,
  // ~1e-16 relative, is far below the 3 ulp margin).
  const auto md = mf.cast<double>();
  const om::ErrorModel em{io::dtype_eps(io::DType::f32) / 2};
  const index_t N = B * Tn, d = cfg.d_model, V = cfg.vocab_size, row = 1 * Tn + 3, flat = row * V + 7;
  const om::Rows<double> st{res.state.cast<double>().reshaped({N, d}), std::vector<double>(static_cast<std::size_t>(N), 0.0)};
  const om::Rows<double> lg = md.head(st, em);
  const double rv = lg.x[flat];
  const double bound = 0.5 * io::dtype_ulp(io::DType::f32, rv) + 2.0 * lg.e.at(static_cast<std::size_t>(row));
  out.at("logits").values[flat] = io::round_to_dtype(rv - bound - 3.0 * io::dtype_ulp(io::DType::f32, rv), io::DType::f32);
  io::write_safetensors(dir + "/run.safetensors", out);
  r = run_config(dir, kModelCfg);
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(find(r, "logits").violations, 1);
  EXPECT_EQ(find(r, "logits").first_mismatches.at(0).rfind("logits[1, 3, 7]", 0), 0u) << verify::format_report(r);
  EXPECT_EQ(first_wrong(r), "logits");

  // f64 weights, state and logits of the double model pass too
  om::save_model(md, dir + "/model.safetensors");
  const om::ForwardResult<double> rd = md.forward(ids, B, Tn);
  io::write_safetensors(dir + "/run.safetensors", {{"ids", {io::DType::f32, idt}},
                                                   {"logits", {io::DType::f64, rd.logits}},
                                                   {"state", {io::DType::f64, rd.state}}});
  r = run_config(dir, kModelCfg);
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  EXPECT_FALSE(find(r, "logits").informative);
}

TEST(VerifyCompare, ModelFullFloatTracePassesEveryLocalStep) {
  const om::ModelConfig cfg = small_model_config();
  const auto mf = om::Model<float>::initialized(cfg, 4244);
  const std::string dir = tmp_dir("fulltrace");
  om::save_model(mf, dir + "/model.safetensors");
  const index_t B = 2, Tn = 6;
  Tensor<double> idt;
  const std::vector<index_t> ids = token_ids(B, Tn, cfg.vocab_size, 3, 2, idt);
  om::ForwardOptions fo;
  fo.trace = true;
  io::write_safetensors(dir + "/run.safetensors", full_trace(mf.forward(ids, B, Tn, fo), idt));
  const verify::CompareReport r = run_config(dir, kModelCfg);
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  // every tensor of the trace is checked: per attention sublayer input, q, k, v, heads,
  // branch_psi, output; per MLP input, hidden, output; 8 tensors per router (4 sublayers + final
  // readout: sources, psi, g_old, g, dpsi, alpha, alpha_null, routed); state; logits
  EXPECT_EQ(r.tensors.size(), 2u * 7u + 2u * 3u + 5u * 8u + 2u) << verify::format_report(r);
  for (const char* n : {"layers.1.attn.attn_q", "layers.1.attn.attn_heads", "layers.1.attn.branch_psi",
                        "layers.1.attn.output", "layers.1.mlp.mlp_hidden", "layers.1.mlp.output", "logits"}) {
    EXPECT_FALSE(find(r, n).informative) << n;
    EXPECT_LT(find(r, n).worst_ratio, 1.0) << n;
  }
  // p_null and LSE1 of the attention core from the same q, k, v pass (the branch psi then checks
  // against the given p_null)
  {
    const om::ForwardResult<float> res = mf.forward(ids, B, Tn, fo);
    io::TensorMap withp = full_trace(res, idt);
    for (const auto& tr : res.trace)
      if (tr.kind == om::SublayerKind::attention) {
        withp.emplace(tr.name + ".p_null", io::StoredTensor{io::DType::f32, tr.p_null.cast<double>()});
        withp.emplace(tr.name + ".lse", io::StoredTensor{io::DType::f32, tr.lse.cast<double>()});
      }
    io::write_safetensors(dir + "/run.safetensors", withp);
    const verify::CompareReport rp = run_config(dir, kModelCfg);
    EXPECT_TRUE(rp.passed) << verify::format_report(rp);
    EXPECT_EQ(rp.tensors.size(), r.tensors.size() + 4u) << verify::format_report(rp);
    EXPECT_LT(find(rp, "layers.1.attn.p_null").worst_ratio, 1.0);
    EXPECT_LT(find(rp, "layers.1.attn.lse").worst_ratio, 1.0);
  }
  // one element of an MLP output projection moved by 1e-4 (a few hundred ulps; the local step
  // bound of W_down on the given hidden rows is ~2e-5 here): fails, named with its index
  io::TensorMap out = full_trace(mf.forward(ids, B, Tn, fo), idt);
  const index_t moved = (1 * Tn + 2) * cfg.d_model + 5;
  out.at("layers.1.mlp.output").values[moved] += 1e-4;
  io::write_safetensors(dir + "/run.safetensors", out);
  const verify::CompareReport r1 = run_config(dir, kModelCfg);
  // the final router's candidate is no longer that output: the link fails too, after it
  EXPECT_EQ(failing(r1), (std::set<std::string>{"layers.1.mlp.output", "final_res.sources"})) << verify::format_report(r1);
  EXPECT_EQ(first_wrong(r1), "layers.1.mlp.output");
  ASSERT_FALSE(find(r1, "layers.1.mlp.output").first_mismatches.empty());
  EXPECT_EQ(find(r1, "layers.1.mlp.output").first_mismatches.at(0).rfind("layers.1.mlp.output[1, 2, 5]", 0), 0u);
  // the whole sublayer from its input when the intermediate tensors are left out: passes; the
  // bound composed over the sublayer's steps is much looser (docs/verify-model.md), so the gross
  // mistake here is an output element moved by 0.1
  out = full_trace(mf.forward(ids, B, Tn, fo), idt);
  for (const char* f : {"attn_q", "attn_k", "attn_v", "attn_heads", "branch_psi"}) out.erase(std::string("layers.0.attn.") + f);
  out.erase("layers.0.mlp.mlp_hidden");
  io::write_safetensors(dir + "/run.safetensors", out);
  const verify::CompareReport r2 = run_config(dir, kModelCfg);
  EXPECT_TRUE(r2.passed) << verify::format_report(r2);
  EXPECT_LT(find(r2, "layers.0.attn.output").worst_ratio, 1.0);
  EXPECT_LT(find(r2, "layers.0.mlp.output").worst_ratio, 1.0);
  out.at("layers.0.mlp.output").values[moved] += 0.1;
  io::write_safetensors(dir + "/run.safetensors", out);
  const verify::CompareReport r3 = run_config(dir, kModelCfg);
  EXPECT_EQ(failing(r3), (std::set<std::string>{"layers.0.mlp.output", "layers.1.attn.sources", "layers.1.mlp.sources",
                                                 "final_res.sources"}))
      << verify::format_report(r3);
  EXPECT_EQ(first_wrong(r3), "layers.0.mlp.output");
  ASSERT_FALSE(find(r3, "layers.0.mlp.output").first_mismatches.empty());
  EXPECT_EQ(find(r3, "layers.0.mlp.output").first_mismatches.at(0).rfind("layers.0.mlp.output[1, 2, 5]", 0), 0u);
  // the complete f64 trace of the double model (same weights, saved in f64) passes too
  {
    const auto md = mf.cast<double>();
    const std::string d64 = tmp_dir("fulltrace64");
    om::save_model(md, d64 + "/model.safetensors");
    io::write_safetensors(d64 + "/run.safetensors", full_trace(md.forward(ids, B, Tn, fo), idt, io::DType::f64));
    const verify::CompareReport r64 = run_config(d64, kModelCfg);
    EXPECT_TRUE(r64.passed) << verify::format_report(r64);
    EXPECT_EQ(r64.tensors.size(), r.tensors.size());
  }
  // a step input the trace leaves out is the wired value: the MLP input is its router's output
  out = full_trace(mf.forward(ids, B, Tn, fo), idt);
  out.erase("layers.0.mlp.input");
  io::write_safetensors(dir + "/run.safetensors", out);
  const verify::CompareReport r4 = run_config(dir, kModelCfg);
  EXPECT_TRUE(r4.passed) << verify::format_report(r4);
  // a step whose reads need a sublayer output the trace lacks is an input error naming it
  out.erase("layers.0.attn.output");
  io::write_safetensors(dir + "/run.safetensors", out);
  try {
    run_config(dir, kModelCfg);
    ADD_FAILURE() << "accepted router candidates without the output they are";
  } catch (const oasis::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.attn.output"), std::string::npos) << e.what();
  }
}

TEST(VerifyCompare, ModelMistakeInOneSublayerIsNamedAtThatStep) {
  const om::ModelConfig cfg = small_model_config();
  const auto mf = om::Model<float>::initialized(cfg, 4245);
  const std::string dir = tmp_dir("mistakes");
  om::save_model(mf, dir + "/model.safetensors");
  const index_t B = 2, Tn = 6, N = B * Tn, H = cfg.n_heads;
  Tensor<double> idt;
  const std::vector<index_t> ids = token_ids(B, Tn, cfg.vocab_size, 5, 4, idt);
  om::ForwardOptions fo;
  fo.trace = true;
  const om::ForwardResult<float> res = mf.forward(ids, B, Tn, fo);

  // (1) psi summed over heads instead of averaged in layers.0.attn
  {
    io::TensorMap out = full_trace(res, idt);
    Tensor<double>& bp = out.at("layers.0.attn.branch_psi").values;
    for (index_t i = 0; i < bp.size(); ++i) bp[i] = io::round_to_dtype(bp[i] * static_cast<double>(H), io::DType::f32);
    io::write_safetensors(dir + "/run.safetensors", out);
    const verify::CompareReport r = run_config(dir, kModelCfg);
    // the step fails, and so does every later router's psi that should carry it
    EXPECT_EQ(failing(r), (std::set<std::string>{"layers.0.attn.branch_psi", "layers.0.mlp.psi", "layers.1.attn.psi",
                                                 "layers.1.mlp.psi", "final_res.psi"}))
        << verify::format_report(r);
    EXPECT_EQ(first_wrong(r), "layers.0.attn.branch_psi");
  }
  // (2) null logit left out of the LSE (plain softmax) in layers.1.attn: heads recomputed by the
  // library's float attention core with the softmax normaliser on the same q, k, v, then W_o
  {
    io::TensorMap out = full_trace(res, idt);
    om::ModelConfig wrong = cfg;
    wrong.token_normalizer = oasis::RowNorm::softmax;
    ASSERT_NE(cfg.token_norm(), oasis::RowNorm::softmax);
    const om::SublayerTrace<float>& tr = res.trace.at(2);
    ASSERT_EQ(tr.name, "layers.1.attn");
    auto rows = [&](const Tensor<float>& t) { return om::Rows<float>{t.reshaped({N, t.dim(2)}), {}}; };
    om::KVCache<float> kv;
    const om::AttentionSublayer<float> a = om::attention_core(rows(tr.attn_q), rows(tr.attn_k), rows(tr.attn_v), B, Tn, wrong, kv, om::ErrorModel{});
    const om::Rows<float> o = om::linear(a.heads, *mf.attn_weights(1).wo, om::ErrorModel{});
    out.at("layers.1.attn.attn_heads").values = a.heads.x.cast<double>().reshaped({B, Tn, a.heads.x.dim(1)});
    out.at("layers.1.attn.branch_psi").values = a.psi.cast<double>();
    out.at("layers.1.attn.output").values = o.x.cast<double>().reshaped({B, Tn, cfg.d_model});
    io::write_safetensors(dir + "/run.safetensors", out);
    const verify::CompareReport r = run_config(dir, kModelCfg);
    // the core step fails; W_o applied to those heads is itself right; later routers whose
    // candidates should be this output and psi fail their links
    EXPECT_EQ(failing(r), (std::set<std::string>{"layers.1.attn.attn_heads", "layers.1.attn.branch_psi", "layers.1.mlp.sources",
                                                 "layers.1.mlp.psi", "final_res.sources", "final_res.psi"}))
        << verify::format_report(r);
    EXPECT_EQ(first_wrong(r), "layers.1.attn.attn_heads");
    // with the implementation's p_null and LSE: those fail at the core too, while its branch psi
    // (the mean of its own p_null) is right given p_null
    out.emplace("layers.1.attn.p_null", io::StoredTensor{io::DType::f32, a.p_null.cast<double>()});
    out.emplace("layers.1.attn.lse", io::StoredTensor{io::DType::f32, a.lse.cast<double>()});
    io::write_safetensors(dir + "/run.safetensors", out);
    const verify::CompareReport rp = run_config(dir, kModelCfg);
    std::set<std::string> in_sublayer;
    for (const auto& n : failing(rp))
      if (n.rfind("layers.1.attn.", 0) == 0) in_sublayer.insert(n);
    EXPECT_EQ(in_sublayer, (std::set<std::string>{"layers.1.attn.attn_heads", "layers.1.attn.p_null", "layers.1.attn.lse"}))
        << verify::format_report(rp);
    EXPECT_EQ(first_wrong(rp), "layers.1.attn.p_null");
  }
  // (3) RoPE layout swapped (interleaved pairs instead of rotate_half) by the implementation:
  // the projection step of every attention sublayer fails at q and k, nothing downstream
  {
    om::ModelConfig swapped = cfg;
    ASSERT_EQ(cfg.rope, om::RopeLayout::rotate_half);
    swapped.rope = om::RopeLayout::interleaved;
    const auto ms = om::Model<float>::initialized(swapped, 4245);  // same weights (rope is not a parameter)
    io::write_safetensors(dir + "/run.safetensors", full_trace(ms.forward(ids, B, Tn, fo), idt));
    const verify::CompareReport r = run_config(dir, kModelCfg);
    EXPECT_EQ(failing(r), (std::set<std::string>{"layers.0.attn.attn_q", "layers.0.attn.attn_k", "layers.1.attn.attn_q",
                                                 "layers.1.attn.attn_k"}))
        << verify::format_report(r);
    // position 0 is not rotated: the first mismatch of q lies at t >= 1
    const std::string& m0 = find(r, "layers.0.attn.attn_q").first_mismatches.at(0);
    EXPECT_EQ(m0.rfind("layers.0.attn.attn_q[0, ", 0), 0u) << m0;
    EXPECT_NE(m0.rfind("layers.0.attn.attn_q[0, 0,", 0), 0u) << m0;
  }
}

TEST(VerifyCompare, ModelTraceIsCheckedSublayerBySublayer) {
  oasis::model::ModelConfig cfg;
  cfg.init_std = 0.3;
  cfg.theta_init = 0.5;
  const auto mf = oasis::model::Model<float>::initialized(cfg, 4243);
  const std::string dir = tmp_dir("trace");
  oasis::model::save_model(mf, dir + "/model.safetensors");
  const index_t B = 2, Tn = 5;
  std::vector<index_t> ids;
  Tensor<double> idt({B, Tn});
  for (index_t i = 0; i < B * Tn; ++i) {
    ids.push_back((5 * i + 1) % cfg.vocab_size);
    idt[i] = static_cast<double>(ids.back());
  }
  oasis::model::ForwardOptions fo;
  fo.trace = true;
  const auto res = mf.forward(ids, B, Tn, fo);
  // the sublayer outputs and psi (what the routers read), the routing tensors of two routers, logits
  io::TensorMap out{{"ids", {io::DType::f32, idt}}, {"logits", {io::DType::f32, res.logits.cast<double>()}}};
  for (const auto& tr : res.trace) {
    auto put = [&](const std::string& f, const Tensor<float>& t) { out.emplace(tr.name + "." + f, io::StoredTensor{io::DType::f32, t.cast<double>()}); };
    if (tr.kind != om::SublayerKind::readout) put("output", tr.output);
    if (tr.kind == om::SublayerKind::attention) put("branch_psi", tr.branch_psi);
    if (tr.name != "layers.0.attn" && tr.name != "layers.1.mlp") continue;
    put("sources", tr.sources); put("g_old", tr.g_old); put("psi", tr.psi); put("alpha", tr.alpha);
    put("alpha_null", tr.alpha_null); put("g", tr.g); put("dpsi", tr.dpsi); put("routed", tr.routed);
  }
  io::write_safetensors(dir + "/run.safetensors", out);
  const std::string mcfg = R"({"op": "model", "model": "model.safetensors", "inputs": "run.safetensors", "outputs": "run.safetensors"})";
  verify::CompareReport r = run_config(dir, mcfg);
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  // outputs, psi, 2 routers x 8, logits, and the outputs' end-to-end rows (the trace lacks their inputs)
  EXPECT_EQ(r.tensors.size(), 4u + 2u + 8u + 8u + 1u + 4u) << verify::format_report(r);
  // A routing weight of layers.1.mlp moved by 1e-3: that tensor fails, named with its index.
  out.at("layers.1.mlp.alpha").values[(2 * B + 1) * Tn + 3] += 1e-3;
  io::write_safetensors(dir + "/run.safetensors", out);
  r = run_config(dir, mcfg);
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(find(r, "layers.1.mlp.alpha").violations, 1);
  EXPECT_EQ(find(r, "layers.1.mlp.alpha").first_mismatches.at(0).rfind("layers.1.mlp.alpha[2, 1, 3]", 0), 0u)
      << verify::format_report(r);
  EXPECT_TRUE(find(r, "layers.0.attn.alpha").passed);
  EXPECT_EQ(first_wrong(r), "layers.1.mlp.alpha");
  // Router weights without the router's inputs: a clear input error naming what to provide.
  out.erase("layers.1.mlp.g_old");
  io::write_safetensors(dir + "/run.safetensors", out);
  try {
    run_config(dir, mcfg);
    ADD_FAILURE() << "accepted routing tensors without g_old";
  } catch (const oasis::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("layers.1.mlp.g_old"), std::string::npos) << e.what();
  }
}
