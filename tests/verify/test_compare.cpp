// tests/verify/test_compare.cpp — `oasis-verify compare`: passes on tensors the library writes in
// every dtype and file format, fails naming tensor and index when one element is moved a few
// units of the dtype's precision beyond the policy, and rejects unusable configurations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <unistd.h>

#include "oasis/verify/compare.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/io/npy.hpp"
#include "oasis/io/safetensors.hpp"
#include "oasis/model/io.hpp"
#include "oasis/oasis.hpp"
#include "oasis_test.hpp"

namespace io = oasis::io;
namespace verify = oasis::verify;
using oasis::index_t;
using oasis::mp50;
using oasis::Tensor;

namespace {

std::string tmp_dir(const std::string& leaf) {
  const std::string d = ::testing::TempDir() + "oasis_cmp_" + std::to_string(::getpid()) + "_" + leaf;
  std::string cmd = "mkdir -p '" + d + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return d;
}

void write_text(const std::string& path, const std::string& s) {
  std::ofstream f(path);
  f << s;
}

const io::DType kAll[] = {io::DType::f16, io::DType::bf16, io::DType::f32, io::DType::f64};

/// What "the library" writes for an output in dtype D: the plain reference computed in float
/// (f16, bf16, f32: half and bfloat16 kernels accumulate in float) or double (f64), rounded
/// to D with round-to-nearest-even by the writer.
struct AttentionCase {
  Tensor<float> q, k, v;
  oasis::AttentionOptions opt;
};

AttentionCase attention_case() {
  auto rng = oasis::test::make_rng(606);
  AttentionCase c{oasis::test::randn<float>({2, 4, 6, 8}, rng), oasis::test::randn<float>({2, 2, 7, 8}, rng),
                  oasis::test::randn<float>({2, 2, 7, 8}, rng), {}};
  c.opt.causal = true;
  c.opt.key_lengths = {7, 3};
  c.opt.null_logits = {0.0, 0.5, -1.0, 2.0};
  return c;
}

std::string attention_config(const std::string& inputs, const std::string& outputs) {
  return R"({"op": "attention", "inputs": )" + inputs + R"(, "outputs": )" + outputs +
         R"(, "options": {"causal": true, "key_lengths": [7, 3], "null_logits": [0.0, 0.5, -1.0, 2.0]}})";
}

io::TensorMap attention_inputs(const AttentionCase& c) {
  io::TensorMap in;
  in.emplace("q", io::StoredTensor{io::DType::f32, c.q.cast<double>()});
  in.emplace("k", io::StoredTensor{io::DType::f32, c.k.cast<double>()});
  in.emplace("v", io::StoredTensor{io::DType::f32, c.v.cast<double>()});
  return in;
}

io::TensorMap attention_outputs(const AttentionCase& c, io::DType d) {
  oasis::AttentionOptions o = c.opt;
  o.return_probs = true;
  io::TensorMap out;
  auto put = [&](const auto& r) {
    out.emplace("out", io::StoredTensor{d, r.out.template cast<double>()});
    out.emplace("lse", io::StoredTensor{d, r.lse.template cast<double>()});
    out.emplace("p_null", io::StoredTensor{d, r.p_null.template cast<double>()});
    out.emplace("probs", io::StoredTensor{d, r.probs.template cast<double>()});
  };
  if (d == io::DType::f64) put(oasis::token_attention(c.q.cast<double>(), c.k.cast<double>(), c.v.cast<double>(), o));
  else put(oasis::token_attention(c.q, c.k, c.v, o));
  for (auto& kv : out)
    for (index_t i = 0; i < kv.second.values.size(); ++i) kv.second.values[i] = io::round_to_dtype(kv.second.values[i], d);
  return out;
}

verify::CompareReport run_config(const std::string& dir, const std::string& json) {
  write_text(dir + "/config.json", json);
  return verify::compare_config_file(dir + "/config.json");
}

const verify::TensorReport& find(const verify::CompareReport& r, const std::string& name) {
  for (const auto& t : r.tensors)
    if (t.name == name) return t;
  throw std::runtime_error("tensor " + name + " not in the report");
}

/// The policy bound of element i of an attention output in dtype d (same formula as compare).
double attention_policy_bound(const AttentionCase& c, const std::string& name, index_t i, io::DType d, double* ref_out) {
  oasis::AttentionOptions o = c.opt;
  o.return_probs = true;
  const auto ref = oasis::token_attention(c.q.cast<mp50>(), c.k.cast<mp50>(), c.v.cast<mp50>(), o);
  const Tensor<mp50>& rt = name == "out" ? ref.out : name == "lse" ? ref.lse : name == "p_null" ? ref.p_null : ref.probs;
  double plain;
  if (d == io::DType::f64) {
    const auto b = oasis::bounds::attention_bounds(c.q.cast<double>(), c.k.cast<double>(), c.v.cast<double>(), o, ref);
    plain = (name == "out" ? b.out : name == "lse" ? b.lse : name == "p_null" ? b.p_null : b.probs)[i];
  } else {
    const auto b = oasis::bounds::attention_bounds(c.q, c.k, c.v, o, ref);
    plain = (name == "out" ? b.out : name == "lse" ? b.lse : name == "p_null" ? b.p_null : b.probs)[i] *
            io::dtype_eps(d) / io::dtype_eps(io::DType::f32);
  }
  *ref_out = static_cast<double>(rt[i]);
  return 0.5 * io::dtype_ulp(d, *ref_out) + 2.0 * plain;
}

}  // namespace

TEST(VerifyCompare, AttentionPassesInEveryDtypeAndFormat) {
  const AttentionCase c = attention_case();
  for (io::DType d : kAll) {
    const std::string ds(io::to_string(d));
    // safetensors: inputs and outputs in two files
    const std::string dir = tmp_dir("att_st_" + ds);
    io::write_safetensors(dir + "/inputs.safetensors", attention_inputs(c));
    io::write_safetensors(dir + "/outputs.safetensors", attention_outputs(c, d));
    const verify::CompareReport r = run_config(dir, attention_config("\"inputs.safetensors\"", "\"outputs.safetensors\""));
    EXPECT_TRUE(r.passed) << ds << "\n" << verify::format_report(r);
    EXPECT_EQ(r.tensors.size(), 4u);
    // .npy: one file per tensor (bf16 as *.bf16.npy)
    const std::string dn = tmp_dir("att_npy_" + ds);
    std::string ins = "{", outs = "{";
    for (const auto& [name, t] : attention_inputs(c)) {
      io::write_npy(dn + "/" + name + ".npy", t);
      ins += (ins.size() > 1 ? ", " : "") + ("\"" + name + "\": \"" + name + ".npy\"");
    }
    for (const auto& [name, t] : attention_outputs(c, d)) {
      const std::string file = name + (d == io::DType::bf16 ? ".bf16.npy" : ".npy");
      io::write_npy(dn + "/" + file, t);
      outs += (outs.size() > 1 ? ", " : "") + ("\"" + name + "\": \"" + file + "\"");
    }
    const verify::CompareReport rn = run_config(dn, attention_config(ins + "}", outs + "}"));
    EXPECT_TRUE(rn.passed) << ds << "\n" << verify::format_report(rn);
    for (const auto& t : rn.tensors) EXPECT_EQ(t.dtype, d) << t.name;
  }
}

TEST(VerifyCompare, AttentionFailsOnOneElementBeyondThePolicyNamingTensorAndIndex) {
  const AttentionCase c = attention_case();
  // (tensor, flat index, multi-index string): out[1, 2, 5, 3], lse[0, 3, 4], p_null[1, 0, 2]
  const struct { const char* name; index_t flat; const char* where; } targets[] = {
      {"out", ((1 * 4 + 2) * 6 + 5) * 8 + 3, "out[1, 2, 5, 3]"},
      {"lse", (0 * 4 + 3) * 6 + 4, "lse[0, 3, 4]"},
      {"p_null", (1 * 4 + 0) * 6 + 2, "p_null[1, 0, 2]"}};
  for (io::DType d : kAll) {
    for (const auto& tg : targets) {
      const std::string ds(io::to_string(d));
      io::TensorMap out = attention_outputs(c, d);
      double ref;
      const double bound = attention_policy_bound(c, tg.name, tg.flat, d, &ref);
      // Move the element to 3 ulp of D beyond the policy bound (then rounded to D: >= 2.5 ulp beyond).
      const double moved = io::round_to_dtype(ref + bound + 3.0 * io::dtype_ulp(d, ref), d);
      ASSERT_GT(std::fabs(moved - ref), bound + 2.0 * io::dtype_ulp(d, ref));
      out.at(tg.name).values[tg.flat] = moved;
      const std::string dir = tmp_dir(std::string("att_bad_") + ds + "_" + tg.name);
      io::write_safetensors(dir + "/inputs.safetensors", attention_inputs(c));
      io::write_safetensors(dir + "/outputs.safetensors", out);
      const verify::CompareReport r = run_config(dir, attention_config("\"inputs.safetensors\"", "\"outputs.safetensors\""));
      EXPECT_FALSE(r.passed) << ds << " " << tg.name;
      const verify::TensorReport& t = find(r, tg.name);
      EXPECT_FALSE(t.passed);
      EXPECT_EQ(t.violations, 1) << verify::format_report(r);
      ASSERT_FALSE(t.first_mismatches.empty());
      EXPECT_EQ(t.first_mismatches[0].rfind(tg.where, 0), 0u) << t.first_mismatches[0];
      EXPECT_NE(verify::format_report(r).find(tg.where), std::string::npos);
      for (const auto& other : r.tensors)
        if (other.name != tg.name) EXPECT_TRUE(other.passed) << other.name;
      EXPECT_GE(t.max_ulps, 2.0);
    }
  }
}

TEST(VerifyCompare, SafetensorsWithEmbeddedConfig) {
  const AttentionCase c = attention_case();
  io::TensorMap all = attention_inputs(c);
  for (auto& kv : attention_outputs(c, io::DType::f32)) all.emplace(kv);
  const std::string dir = tmp_dir("embedded");
  const std::string cfg = R"({"op": "attention", "options": {"causal": true, "key_lengths": [7, 3], "null_logits": [0.0, 0.5, -1.0, 2.0]}})";
  io::write_safetensors(dir + "/run.safetensors", all, {{"oasis_config", cfg}});
  const verify::CompareReport r = verify::compare_config_file(dir + "/run.safetensors");
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  // q, k, v are in the same file: noted as not outputs, not compared
  EXPECT_EQ(r.tensors.size(), 4u);
  EXPECT_EQ(r.notes.size(), 3u);
}

TEST(VerifyCompare, NormalizerPsiCouplingDepthPseudoQueryPassAndFail) {
  auto rng = oasis::test::make_rng(607);
  const std::string dir = tmp_dir("ops");
  // normalizer: rows of logits with a masked entry, per-row null logits
  Tensor<float> z = oasis::test::randn<float>({3, 5}, rng, 3.0);
  z(1, 2) = -std::numeric_limits<float>::infinity();
  Tensor<float> s = oasis::test::randn<float>({3}, rng);
  io::TensorMap nin{{"z", {io::DType::f32, z.cast<double>()}}, {"s", {io::DType::f32, s.cast<double>()}}};
  Tensor<double> p({3, 5}), pn({3}), lse({3});
  for (index_t r = 0; r < 3; ++r) {
    oasis::Vec<float> zr(5);
    for (index_t j = 0; j < 5; ++j) zr[j] = z(r, j);
    const auto rp = oasis::softmax_null(zr, s[r]);
    for (index_t j = 0; j < 5; ++j) p(r, j) = rp.p[j];
    pn[r] = rp.p_null;
    lse[r] = rp.lse;
  }
  io::TensorMap nout{{"p", {io::DType::f32, p}}, {"p_null", {io::DType::f32, pn}}, {"lse", {io::DType::f32, lse}}};
  io::write_safetensors(dir + "/n_in.safetensors", nin);
  io::write_safetensors(dir + "/n_out.safetensors", nout);
  const std::string ncfg = R"({"op": "normalizer", "inputs": "n_in.safetensors", "outputs": "n_out.safetensors"})";
  verify::CompareReport r = run_config(dir, ncfg);
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  // the classic mistake: LSE without the null logit
  for (index_t i = 0; i < 3; ++i) {
    oasis::Vec<float> zr(5);
    for (index_t j = 0; j < 5; ++j) zr[j] = z(i, j);
    nout.at("lse").values[i] = oasis::logsumexp(zr);
  }
  io::write_safetensors(dir + "/n_out.safetensors", nout);
  r = run_config(dir, ncfg);
  EXPECT_FALSE(r.passed);
  EXPECT_FALSE(find(r, "lse").passed);
  EXPECT_EQ(find(r, "lse").first_mismatches.at(0).rfind("lse[0]", 0), 0u);

  // psi: mean over heads of p_null; the mistake "summed instead of averaged" fails
  Tensor<float> pnull = oasis::test::uniform<float>({2, 4, 6}, rng, 0.0, 1.0);
  const Tensor<float> psi = oasis::null_statistic(pnull);
  io::write_npy(dir + "/p_null.npy", {io::DType::f32, pnull.cast<double>()});
  io::write_npy(dir + "/psi.npy", {io::DType::f32, psi.cast<double>()});
  const std::string pcfg = R"({"op": "psi", "inputs": {"p_null": "p_null.npy"}, "outputs": {"psi": "psi.npy"}})";
  EXPECT_TRUE(run_config(dir, pcfg).passed);
  Tensor<double> summed = psi.cast<double>();
  for (index_t i = 0; i < summed.size(); ++i) summed[i] *= 4;
  io::write_npy(dir + "/psi.npy", {io::DType::f32, summed});
  r = run_config(dir, pcfg);
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(find(r, "psi").violations, 12);

  // depth routing with coupling (paper_v2, headless inherit), f64 outputs from the double reference
  using K = oasis::SourceKind;
  const std::vector<K> kinds = {K::initial, K::attention, K::headless, K::attention};
  const Tensor<double> src = oasis::test::randn<double>({4, 5, 6}, rng), g_old = oasis::test::randn<double>({4, 5}, rng);
  const Tensor<double> ps = oasis::test::uniform<double>({4, 5}, rng, 0.0, 1.0);
  oasis::DepthOptions dopt;
  dopt.theta = 0.7;
  const auto route = oasis::attn_res_route(src, g_old, ps, kinds, dopt);
  io::write_safetensors(dir + "/d_in.safetensors", {{"sources", {io::DType::f64, src}}, {"g_old", {io::DType::f64, g_old}},
                                                    {"psi", {io::DType::f64, ps}}});
  io::TensorMap dout{{"h", {io::DType::f64, route.h}}, {"alpha", {io::DType::f64, route.alpha}},
                     {"alpha_null", {io::DType::f64, route.alpha_null}}, {"g", {io::DType::f64, route.g}},
                     {"dpsi", {io::DType::f64, route.dpsi}}};
  io::write_safetensors(dir + "/d_out.safetensors", dout);
  const std::string dcfg = R"({"op": "depth", "inputs": "d_in.safetensors", "outputs": "d_out.safetensors",
      "options": {"kinds": ["initial", "attention", "headless", "attention"], "theta": 0.7}})";
  r = run_config(dir, dcfg);
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  EXPECT_EQ(r.tensors.size(), 5u);
  // coupling op on the same files, naming its tensors (it takes g_old, psi and gives g, dpsi only)
  const std::string ccfg = R"({"op": "coupling", "inputs": {"g_old": "d_in.safetensors", "psi": "d_in.safetensors"},
      "outputs": {"g": "d_out.safetensors", "dpsi": "d_out.safetensors"},
      "options": {"kinds": ["initial", "attention", "headless", "attention"], "theta": 0.7}})";
  r = run_config(dir, ccfg);
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  EXPECT_EQ(r.tensors.size(), 2u);
  // the authors' centring convention gives other logits: the paper_v2 outputs must fail
  const std::string acfg = R"({"op": "coupling", "inputs": {"g_old": "d_in.safetensors", "psi": "d_in.safetensors"},
      "outputs": {"g": "d_out.safetensors", "dpsi": "d_out.safetensors"},
      "options": {"kinds": ["initial", "attention", "headless", "attention"], "theta": 0.7, "profile": "authors_code"}})";
  EXPECT_FALSE(run_config(dir, acfg).passed);

  // pseudo-query logits
  const Tensor<double> w = oasis::test::randn<double>({6}, rng);
  const Tensor<double> g = oasis::pseudo_query_logits(src, w);
  io::write_safetensors(dir + "/q_in.safetensors", {{"sources", {io::DType::f64, src}}, {"w", {io::DType::f64, w}}});
  io::write_safetensors(dir + "/q_out.safetensors", {{"g", {io::DType::f64, g}}});
  const std::string qcfg = R"({"op": "pseudo_query", "inputs": "q_in.safetensors", "outputs": "q_out.safetensors"})";
  EXPECT_TRUE(run_config(dir, qcfg).passed);
}

TEST(VerifyCompare, UnusableConfigurationsAreClearErrors) {
  const AttentionCase c = attention_case();
  const std::string dir = tmp_dir("usage");
  io::write_safetensors(dir + "/inputs.safetensors", attention_inputs(c));
  io::write_safetensors(dir + "/outputs.safetensors", attention_outputs(c, io::DType::f32));
  auto expect_error = [&](const std::string& json, const std::string& needle) {
    try {
      run_config(dir, json);
      ADD_FAILURE() << "accepted: " << json;
    } catch (const oasis::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("{\"op\": \"attention\", ", "not valid JSON");
  expect_error(R"({"op": "flash"})", "unknown op 'flash'");
  expect_error(R"({"op": "attention", "inputs": "inputs.safetensors", "outputs": "outputs.safetensors", "options": {"casual": true}})",
               "unknown option 'casual'");
  expect_error(R"({"op": "attention", "inputs": "missing.safetensors", "outputs": "outputs.safetensors"})", "missing.safetensors");
  expect_error(R"({"op": "attention", "inputs": "outputs.safetensors", "outputs": "outputs.safetensors"})",
               "needs input tensor 'q'");
  expect_error(R"({"op": "attention", "inputs": "inputs.safetensors", "outputs": "inputs.safetensors"})", "none of the outputs of op attention");
  // a misspelt output or input name is an error listing the known names, never silently ignored
  io::TensorMap misspelt = attention_outputs(c, io::DType::f32);
  misspelt.emplace("pnull", misspelt.at("p_null"));
  io::write_safetensors(dir + "/misspelt.safetensors", misspelt);
  expect_error(R"({"op": "attention", "inputs": "inputs.safetensors", "outputs": "misspelt.safetensors"})",
               "unknown output tensor 'pnull' for op attention (outputs: out, lse, p_null, probs)");
  io::TensorMap sinks = attention_inputs(c);
  sinks.emplace("sinks", io::StoredTensor{io::DType::f32, Tensor<double>({4})});
  io::write_safetensors(dir + "/sinks.safetensors", sinks);
  expect_error(R"({"op": "attention", "inputs": "sinks.safetensors", "outputs": "outputs.safetensors"})",
               "unknown input tensor 'sinks' for op attention (inputs: q, k, v, null_logits, bias, mask)");
  // key_lengths of the wrong size: the oracle's own argument check names it
  expect_error(R"({"op": "attention", "inputs": "inputs.safetensors", "outputs": "outputs.safetensors", "options": {"key_lengths": [1]}})",
               "key_lengths");
  // a truncated outputs file: the loader's error names the file
  std::string bytes = io::detail::read_file_bytes(dir + "/outputs.safetensors");
  io::detail::write_file_bytes(dir + "/trunc.safetensors", bytes.substr(0, bytes.size() / 2));
  expect_error(R"({"op": "attention", "inputs": "inputs.safetensors", "outputs": "trunc.safetensors"})", "trunc.safetensors");
  // wrong output shape: a failed comparison (not an input error) that says so
  io::TensorMap out = attention_outputs(c, io::DType::f32);
  out.at("lse").values = out.at("lse").values.reshaped({2, 24});
  io::write_safetensors(dir + "/shape.safetensors", out);
  const verify::CompareReport r =
      run_config(dir, R"({"op": "attention", "inputs": "inputs.safetensors", "outputs": "shape.safetensors", "options": {"causal": true, "key_lengths": [7, 3], "null_logits": [0.0, 0.5, -1.0, 2.0]}})");
  EXPECT_FALSE(r.passed);
  EXPECT_NE(find(r, "lse").problem.find("shape [2, 24]"), std::string::npos);
}

namespace om = oasis::model;

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

const char* kModelCfg = R"({"op": "model", "model": "model.safetensors", "inputs": "run.safetensors", "outputs": "run.safetensors"})";

/// The report's "first wrong step" note names this tensor.
std::string first_wrong(const verify::CompareReport& r) {
  const std::string tag = "first wrong step (forward order): ";
  for (const auto& n : r.notes)
    if (n.rfind(tag, 0) == 0) return n.substr(tag.size(), n.find(' ', tag.size()) - tag.size());
  return "";
}

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
  EXPECT_EQ(r.tensors.size(), 4u + 2u + 8u + 8u + 1u) << verify::format_report(r);  // outputs, psi, 2 routers x 8, logits
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
