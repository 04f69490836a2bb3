// tests/verify/test_compare.cpp — `oasis-verify compare`: passes on tensors the library writes in
// every dtype and file format, fails naming tensor and index when one element is moved a few
// units of the dtype's precision beyond the policy, and rejects unusable configurations.
// The model traces: test_compare_trace.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "oasis/verify/compare.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/io/npy.hpp"
#include "oasis/io/safetensors.hpp"
#include "oasis/oasis.hpp"
#include "oasis_test.hpp"
#include "compare_test_util.hpp"

namespace io = oasis::io;
namespace verify = oasis::verify;
using oasis::index_t;
using oasis::mp50;
using oasis::Tensor;
using namespace oasis::verify_test;

namespace {

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
               "unknown input tensor 'sinks' for op attention (inputs: q, k, v, null_logits, bias, mask, cu_seqlens_q, "
               "cu_seqlens_k, k_cache, v_cache, block_table, seq_lens)");
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
