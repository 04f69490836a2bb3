// tests/verify/test_compare_model_checks.cpp — the model-level verdict: the fast oracle gives the
// mp50 oracle's verdicts (a mid-sized model, an undecided tensor recomputed in mp50, the end-to-end
// verdict at depth); traces that check nothing, misspelt names and traces that cannot be linked are
// input errors; a wrong shape fails the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "oasis/io/npy.hpp"
#include "oasis/io/safetensors.hpp"
#include "oasis/model/io.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis_test.hpp"
#include "model_checker.hpp"
#include "model_compare_support.hpp"

namespace io = oasis::io;
namespace om = oasis::model;
namespace verify = oasis::verify;
using oasis::index_t;
using oasis::Tensor;
using namespace oasis::verify_test;

namespace {

/// Input error: the message of the oasis::invalid_argument the comparison throws ("" if none).
std::string input_error(const std::string& dir, const om::Model<double>& weights, const io::TensorMap& trace) {
  try {
    compare(dir, weights, trace);
  } catch (const oasis::invalid_argument& e) {
    return e.what();
  }
  return "";
}

/// "k" of the report's oracle line "fast (...; k of n tensors recomputed in mp50)" (-1: not fast).
int recomputed_tensors(const verify::CompareReport& r) {
  const auto at = r.oracle.find("; ");
  if (r.oracle.rfind("fast", 0) != 0 || at == std::string::npos) return -1;
  return std::atoi(r.oracle.c_str() + at + 2);
}

}  // namespace

// ---- the fast oracle ------------------------------------------------------------------------------

// A mid-sized model (d = 64, 4 heads, 2 blocks, T = 32): the fast oracle decides every tensor of
// the float32 trace without mp50 and gives the mp50 oracle's verdicts, full trace and logits only,
// for the correct trace and for one with an MLP output element moved by 1e-3.
TEST(VerifyModel, FastOracleAgreesWithMp50OnAMidSizedModel) {
  om::ModelConfig cfg = kimi_full();
  cfg.vocab_size = 64;
  cfg.d_model = 64;
  cfg.n_heads = 4;
  cfg.d_ff = 128;
  const om::Model<double> m = test_model(cfg, 4310);
  const index_t T = 32;
  std::vector<index_t> ids;
  for (index_t i = 0; i < T; ++i) ids.push_back((11 * i + 5) % cfg.vocab_size);
  om::ForwardOptions fo;
  fo.trace = true;
  io::TensorMap full = om::trace_tensors(as_float(m).forward(ids, 1, T, fo), io::DType::f32);
  Tensor<double> idt({1, T});
  for (index_t i = 0; i < T; ++i) idt[i] = static_cast<double>(ids[static_cast<std::size_t>(i)]);
  full.emplace("ids", io::StoredTensor{io::DType::i32, idt});
  const std::string dir = tmp_dir("midsize");
  for (int moved = 0; moved < 2; ++moved) {
    io::TensorMap t = full;
    if (moved) t.at("layers.1.mlp.output").values[100] += 1e-3;
    const Outcome f = compare(dir, m, t);
    EXPECT_EQ(f.rep.passed, moved == 0) << verify::format_report(f.rep);
    EXPECT_EQ(recomputed_tensors(f.rep), 0) << f.rep.oracle;
    expect_same_verdicts(f.rep, compare(dir, m, t, io::DType::f32, verify::Oracle::mp50).rep, "mid-sized full");
    const io::TensorMap lo = only(t, {"logits"});
    const Outcome e = compare(dir, m, lo);
    EXPECT_TRUE(e.rep.passed) << verify::format_report(e.rep);
    expect_same_verdicts(e.rep, compare(dir, m, lo, io::DType::f32, verify::Oracle::mp50).rep, "mid-sized logits");
  }
}

// A minimal trace (sublayer outputs, branch psi, logits), as forward hooks record it. A wiring
// mistake that scales a sublayer's output by 1.01 passes the local check (err/bound 0.45),
// whose bound composes the router and the sublayer; the output's end-to-end row (the logits' rule on
// that sublayer) fails (err/bound 1.8e3) and is the first wrong row, before the logits. The correct trace passes every
// row, local and end to end, and the fast oracle gives the mp50 oracle's verdicts.
TEST(VerifyModel, MinimalTraceNamesTheFirstWrongSublayerOutputEndToEnd) {
  const om::ModelConfig cfg = kimi_full();
  const om::Model<double> m = test_model(cfg, 4313);
  const std::vector<index_t> ids = token_ids(cfg);
  const io::TensorMap full = library_trace(as_float(m), ids, io::DType::f32);
  const io::TensorMap minimal = only(full, {"output", "branch_psi", "logits"});
  const std::string dir = tmp_dir("minimal_e2e");
  const Outcome ok = compare(dir, m, minimal);
  EXPECT_TRUE(ok.rep.passed) << verify::format_report(ok.rep);
  index_t e2e = 0;
  for (const auto& t : ok.rep.tensors) e2e += t.name.find(" (end to end)") != std::string::npos ? 1 : 0;
  EXPECT_EQ(e2e, 2 * cfg.n_blocks);  // every attention and MLP output
  // layers.0.mlp.output scaled by 1.01 (a mis-scaled residual branch): the composed bound holds it
  io::TensorMap bad = minimal;
  for (double& x : bad.at("layers.0.mlp.output").values.storage()) x = static_cast<float>(1.01 * x);
  const Outcome r = compare(dir, m, bad);
  EXPECT_FALSE(r.rep.passed);
  const verify::TensorReport* local = nullptr;
  const verify::TensorReport* end = nullptr;
  for (const auto& t : r.rep.tensors) {
    if (t.name == "layers.0.mlp.output") local = &t;
    if (t.name == "layers.0.mlp.output (end to end)") end = &t;
  }
  ASSERT_TRUE(local && end) << verify::format_report(r.rep);
  EXPECT_TRUE(local->passed) << "the composed local bound is loose: " << local->worst_ratio;
  EXPECT_FALSE(end->passed) << verify::format_report(r.rep);
  ASSERT_FALSE(r.rep.notes.empty());
  EXPECT_NE(r.rep.notes[0].find("first wrong step (forward order): layers.0.mlp.output (end to end)"), std::string::npos)
      << r.rep.notes[0];
  expect_same_verdicts(r.rep, compare(dir, m, bad, io::DType::f32, verify::Oracle::mp50).rep, "minimal, mis-scaled");
}

// An element placed on the certain line of its tensor (x = ref + 0.5 ulp + 2 e in float64) is left
// undecided by the double reference (its own error is about e): that tensor, and only that one
// more, is recomputed in mp50, and the verdicts are the mp50 oracle's.
TEST(VerifyModel, FastOracleRecomputesAnUndecidedTensorInMp50) {
  const om::ModelConfig cfg = kimi_full();
  const om::Model<double> m = test_model(cfg, 4311);
  const std::vector<index_t> ids = token_ids(cfg);
  const io::TensorMap full = library_trace(m, ids, io::DType::f64);
  const std::string dir = tmp_dir("undecided");
  const Outcome base = compare(dir, m, full);
  ASSERT_TRUE(base.rep.passed) << verify::format_report(base.rep);
  const int k0 = recomputed_tensors(base.rep);
  ASSERT_GE(k0, 0) << base.rep.oracle;
  const std::string name = "layers.0.mlp.output";
  const om::Model<oasis::mp50> hp = m.cast<oasis::mp50>();
  oasis::verify::detail::ModelChecker ck(hp, full, ids, kB, kT);
  const auto x = ck.expected(name, full.at(name), true);
  io::TensorMap t = full;
  const index_t i = 3;
  const double ref = static_cast<double>(x.ref[i]);
  t.at(name).values[i] = ref + 0.5 * io::dtype_ulp(io::DType::f64, ref) + 2.0 * x.e[i];
  const Outcome f = compare(dir, m, t);
  EXPECT_EQ(recomputed_tensors(f.rep), k0 + 1) << f.rep.oracle << "\n" << base.rep.oracle;
  expect_same_verdicts(f.rep, compare(dir, m, t, io::DType::f32, verify::Oracle::mp50).rep, "on the certain line");
}

// A model deep enough (4 blocks) that the composed worst-case forward bound decides no row of the
// logits: the fast end-to-end verdict on logits-only traces takes the double replay's error as
// estimated by a long double replay, and gives the mp50 oracle's verdicts on correct traces, on
// configuration mistakes, and on a logit placed one float above and one float below the allowance.
// Under the worst_case policy, and for float64 logits, the verdict is the mp50 replay's.
TEST(VerifyModel, FastEndToEndVerdictAtDepthEstimatesTheDoubleReplaysError) {
  om::ModelConfig cfg = kimi_full();
  cfg.n_blocks = 4;
  const om::Model<double> m = test_model(cfg, 4312);
  const std::vector<index_t> ids = token_ids(cfg);
  const std::string dir = tmp_dir("deep");
  const std::string estimate = "logits: double replay, error estimated by a long double replay";
  {  // the worst-case bound is far above the float replay's error: it cannot decide
    om::ForwardOptions fh;
    fh.error_u = 0x1p-53;
    const auto hd = m.forward(ids, kB, kT, fh);
    const double E = *std::max_element(hd.logit_error.begin(), hd.logit_error.end());
    std::printf("  worst-case bound on the double replay's logits: %.3g\n", E);
    ASSERT_GT(E, 1e-3);
  }
  struct Case {
    std::string name;
    io::TensorMap trace;
    bool passes;
  };
  const std::vector<Case> cases = {
      {"float", library_trace(as_float(m), ids, io::DType::f32), true},
      {"double accumulation, stored f32", library_trace(m, ids, io::DType::f32), true},
      {"bf16-stored", library_trace(as_float(m), ids, io::DType::bf16, store_bf16), true},
      {"key-norm gain dropped", mistaken_trace(m, ids, [](om::ModelConfig& c) { c.key_norm_gain = false; }), false},
      {"readout last", mistaken_trace(m, ids, [](om::ModelConfig& c) { c.readout = om::Readout::last; }), false},
      {"RoPE interleaved", mistaken_trace(m, ids, [](om::ModelConfig& c) { c.rope = om::RopeLayout::interleaved; }), false},
  };
  for (const Case& c : cases) {
    const io::TensorMap lo = only(c.trace, {"logits"});
    const Outcome f = compare(dir, m, lo);
    EXPECT_EQ(f.rep.passed, c.passes) << c.name << "\n" << verify::format_report(f.rep);
    EXPECT_NE(f.rep.oracle.find(estimate), std::string::npos) << c.name << ": " << f.rep.oracle;
    expect_same_verdicts(f.rep, compare(dir, m, lo, io::DType::f32, verify::Oracle::mp50).rep, c.name);
  }
  // a logit one float beyond, and one float within, the allowance of its row
  const io::TensorMap lo = only(cases[0].trace, {"logits"});
  const auto hp = m.cast<oasis::mp50>().forward(ids, kB, kT);
  const index_t V = cfg.vocab_size, i = (1 * kT + 2) * V + 5;
  const double h = static_cast<double>(hp.logits[i]);
  io::TensorMap probe = lo;
  probe.at("logits").values[i] = io::round_to_dtype(h + 1e-2, io::DType::f32);
  const verify::CompareReport pr = compare(dir, m, probe, io::DType::f32, verify::Oracle::mp50).rep;
  ASSERT_FALSE(pr.passed);
  const double allowed = static_cast<double>(abs(oasis::mp50(probe.at("logits").values[i]) - hp.logits[i])) /
                         find(pr, "logits").worst_ratio;  // the moved element's row holds the worst ratio
  float beyond = static_cast<float>(h + allowed);
  if (static_cast<double>(beyond) - h <= allowed) beyond = std::nextafter(beyond, INFINITY);
  const float within = std::nextafter(beyond, -INFINITY);
  ASSERT_LE(static_cast<double>(within) - h, allowed);
  for (const float x : {beyond, within}) {
    io::TensorMap t = lo;
    t.at("logits").values[i] = x;
    const Outcome f = compare(dir, m, t);
    EXPECT_EQ(f.rep.passed, x == within) << (x == within ? "within\n" : "beyond\n") << verify::format_report(f.rep);
    EXPECT_NE(f.rep.oracle.find(estimate), std::string::npos) << f.rep.oracle;
    expect_same_verdicts(f.rep, compare(dir, m, t, io::DType::f32, verify::Oracle::mp50).rep,
                         x == within ? "one float within" : "one float beyond");
  }
  // worst_case: no estimate, the mp50 replay
  const Outcome wc = compare(dir, m, lo, io::DType::f32, verify::Oracle::fast, verify::Policy::worst_case);
  EXPECT_TRUE(wc.rep.passed) << verify::format_report(wc.rep);
  EXPECT_NE(wc.rep.oracle.find("logits: mp50 replay"), std::string::npos) << wc.rep.oracle;
  // float64 logits: the plain replay is a double replay; the mp50 replay decides
  const Outcome w64 = compare(dir, m, only(library_trace(m, ids, io::DType::f64), {"logits"}));
  EXPECT_TRUE(w64.rep.passed) << verify::format_report(w64.rep);
  EXPECT_NE(w64.rep.oracle.find("logits: mp50 replay"), std::string::npos) << w64.rep.oracle;
}

// ---- no empty verdicts, no silent names, no unlinked steps ------------------------------------------

TEST(VerifyModel, TracesThatCheckNothingOrCannotBeLinkedAreInputErrors) {
  const om::ModelConfig cfg = kimi_full();
  const om::Model<double> m = test_model(cfg, 4305);
  const std::vector<index_t> ids = token_ids(cfg);
  const std::string dir = tmp_dir("errors");
  const io::TensorMap full = library_trace(as_float(m), ids, io::DType::f32);
  // nothing but the ids
  EXPECT_NE(input_error(dir, m, only(full, {})).find("checked no tensor"), std::string::npos);
  // a misspelt name, and the name other projects use: errors listing the known names
  io::TensorMap t = full;
  t["layers.0.attn.pnull"] = t.at("layers.0.attn.p_null");
  std::string e = input_error(dir, m, t);
  EXPECT_NE(e.find("'layers.0.attn.pnull'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'layers.0.attn.p_null'"), std::string::npos) << e;
  EXPECT_NE(e.find("layers.{b}.mlp.{"), std::string::npos) << e;
  t = full;
  t["layers.0.attn.sinks"] = t.at("layers.0.attn.p_null");
  EXPECT_NE(input_error(dir, m, t).find("unknown trace tensor 'layers.0.attn.sinks'"), std::string::npos);
  // a step whose reads need a sublayer output the trace lacks: the error names that output
  t = full;
  t.erase("layers.0.mlp.output");
  e = input_error(dir, m, t);
  EXPECT_NE(e.find("layers.0.mlp.output"), std::string::npos) << e;
  EXPECT_NE(e.find("the trace lacks it"), std::string::npos) << e;
  // an integer tensor other than the ids
  t = full;
  t.at("layers.0.attn.output").dtype = io::DType::i32;
  for (index_t i = 0; i < t.at("layers.0.attn.output").values.size(); ++i) t.at("layers.0.attn.output").values[i] = 0;
  EXPECT_NE(input_error(dir, m, t).find("integer tensor"), std::string::npos);
  // lse is checked from the sublayer's own q, k, v only
  t = only(full, {"output", "branch_psi", "lse", "logits"});
  EXPECT_NE(input_error(dir, m, t).find("layers.0.attn.attn_q"), std::string::npos);
}

// A wrong shape is a wiring mistake, not an input error: it fails the tensor, naming both shapes,
// and the checks that read it fail naming it; ids as int64 .npy work.
TEST(VerifyModel, WrongShapesFailAndIntegerIdsFromNpyWork) {
  const om::ModelConfig cfg = kimi_full();
  const om::Model<double> m = test_model(cfg, 4306);
  const std::vector<index_t> ids = token_ids(cfg);
  const std::string dir = tmp_dir("shapes");
  io::TensorMap t = library_trace(as_float(m), ids, io::DType::f32);
  t.at("layers.0.attn.output").values = t.at("layers.0.attn.output").values.reshaped({kB * kT, cfg.d_model});
  const Outcome r = compare(dir, m, t);
  EXPECT_FALSE(r.rep.passed);
  EXPECT_EQ(first_wrong(r.rep), "layers.0.attn.output") << verify::format_report(r.rep);
  EXPECT_NE(find(r.rep, "layers.0.attn.output").problem.find("shape [10, 16]"), std::string::npos);
  EXPECT_NE(find(r.rep, "layers.0.mlp.sources").problem.find("reads layers.0.attn.output"), std::string::npos)
      << verify::format_report(r.rep);
  // int64 ids in a .npy file next to an f32 trace
  io::TensorMap good = library_trace(as_float(m), ids, io::DType::f32);
  io::StoredTensor id64 = good.at("ids");
  id64.dtype = io::DType::i64;
  good.erase("ids");
  om::save_model(m, dir + "/model.safetensors", io::DType::f32);
  io::write_safetensors(dir + "/run.safetensors", good);
  io::write_npy(dir + "/ids.npy", id64);
  std::ofstream(dir + "/npy.json")
      << R"({"op": "model", "model": "model.safetensors", "inputs": {"ids": "ids.npy"}, "outputs": "run.safetensors"})";
  const verify::CompareReport rn = verify::compare_config_file(dir + "/npy.json");
  EXPECT_TRUE(rn.passed) << verify::format_report(rn);
}
