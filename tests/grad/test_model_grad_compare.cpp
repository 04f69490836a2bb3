// Model-level gradient tensors in the compare engine (check_model, op "model"; docs/verify-model.md,
// "Model gradients"): correct implementations in float32 and float64 (the oracle's own replay,
// micro-batch accumulation, a double computation rounded to float) pass the end-to-end parity
// rule, every mutant of the zoo fails it, and bad input is named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "model_grad_support.hpp"
#include "oasis/grad/layers_backward.hpp"
#include "oasis/model/io.hpp"
#include "oasis/model/router.hpp"
#include "oasis/model/wiring.hpp"
#include "oasis/verify/compare.hpp"

using namespace oasis;
using namespace oasis::model_grad_test;
namespace io = oasis::io;

namespace {

template <class T>
io::StoredTensor stored(const Tensor<T>& t, io::DType d) {
  return {d, t.template cast<double>()};
}

struct GradCase {
  ModelCase mc;
  om::Model<float> m;
  LossInputs li;
  io::TensorMap weights, inputs;
};

GradCase make_case(const std::string& case_name, std::uint64_t seed) {
  GradCase s{case_named(case_name), random_model<float>(case_named(case_name).cfg, seed), {}, {}, {}};
  s.li = loss_inputs(s.mc, seed);
  s.li.R = s.li.R.cast<float>().cast<double>();  // dL/dlogits exact in float
  for (const auto& [n, t] : s.m.parameters()) s.weights[n] = stored(t, io::DType::f32);
  Tensor<double> ids({s.mc.B, s.mc.T});
  for (index_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<double>(s.li.ids[static_cast<std::size_t>(i)]);
  s.inputs["ids"] = {io::DType::f32, ids};
  s.inputs["grad_logits"] = {io::DType::f32, s.li.R};
  return s;
}

/// The gradient tensors an implementation writes: every parameter, the embeddings and a few trace tensors.
template <class T>
io::TensorMap gradient_outputs(const om::ModelGrads<T>& g, io::DType d, bool with_trace = true) {
  io::TensorMap out;
  for (const auto& [n, t] : g.params) out["grad." + n] = stored(t, d);
  out["grad_embeddings"] = stored(g.embeddings, d);
  if (with_trace) {
    out["grad_state"] = stored(g.state, d);
    for (const auto& tr : g.trace) {
      if (!tr.grad_output.empty()) out[tr.name + ".grad_output"] = stored(tr.grad_output, d);
      if (!tr.grad_sources.empty()) out[tr.name + ".grad_sources"] = stored(tr.grad_sources, d);
      if (!tr.grad_psi.empty()) out[tr.name + ".grad_psi"] = stored(tr.grad_psi, d);
      if (!tr.grad_branch_psi.empty()) out[tr.name + ".grad_branch_psi"] = stored(tr.grad_branch_psi, d);
    }
  }
  return out;
}

verify::CompareReport run(const GradCase& s, const io::TensorMap& out) {
  return verify::check_model(s.mc.cfg, s.weights, s.inputs, out);
}

double worst_ratio(const verify::CompareReport& r) {
  double w = 0;
  for (const auto& t : r.tensors) w = std::max(w, t.worst_ratio);
  return w;
}

/// Per-sequence backward passes summed in float (gradient accumulation over micro-batches): a
/// correct implementation whose sums run in another order than the oracle's.
om::ModelGrads<float> micro_batches(const GradCase& s) {
  const index_t B = s.mc.B, T = s.mc.T, V = s.mc.cfg.vocab_size, d = s.mc.cfg.d_model;
  om::ModelGrads<float> total;
  total.embeddings = Tensor<float>({B, T, d});
  for (index_t b = 0; b < B; ++b) {
    const std::vector<index_t> ids(s.li.ids.begin() + b * T, s.li.ids.begin() + (b + 1) * T);
    Tensor<float> dl({1, T, V});
    for (index_t i = 0; i < T * V; ++i) dl[i] = static_cast<float>(s.li.R[b * T * V + i]);
    const om::ModelGrads<float> g = om::model_backward(s.m, ids, 1, T, dl);
    for (const auto& [n, t] : g.params) {
      auto it = total.params.find(n);
      if (it == total.params.end()) total.params.emplace(n, t);
      else for (index_t i = 0; i < t.size(); ++i) it->second[i] += t[i];
    }
    for (index_t i = 0; i < T * d; ++i) total.embeddings[b * T * d + i] = g.embeddings[i];
  }
  return total;
}

const char* kCases[] = {"kimi_full_oasis_final", "kimi_block2_oasis_sum_mass", "kimi_block3_oasis_tied", "kimi_blocks_2211",
                        "kimi_full_norm_float32", "authors_oasis", "authors_aos_tied", "original"};

TEST(ModelGradCompare, CorrectImplementationsPass) {
  double worst32 = 0, worst64 = 0;
  for (const char* c : kCases) {
    SCOPED_TRACE(c);
    const GradCase s = make_case(c, base_seed());
    const Tensor<float> dl = s.li.R.cast<float>();
    const om::ModelGrads<float> g32 = om::model_backward(s.m, s.li.ids, s.mc.B, s.mc.T, dl);
    const om::ModelGrads<double> g64 = om::model_backward(s.m.cast<double>(), s.li.ids, s.mc.B, s.mc.T, s.li.R);
    const std::pair<const char*, io::TensorMap> impls[] = {
        {"oracle float32", gradient_outputs(g32, io::DType::f32)},
        {"micro-batch accumulation float32", gradient_outputs(micro_batches(s), io::DType::f32, false)},
        {"double rounded to float32", gradient_outputs(g64, io::DType::f32)},
        {"oracle float64", gradient_outputs(g64, io::DType::f64)}};
    for (const auto& [what, out] : impls) {
      const verify::CompareReport r = run(s, out);
      EXPECT_TRUE(r.passed) << what << "\n" << verify::format_report(r);
      EXPECT_GE(r.tensors.size(), out.size()) << what;
      (out.begin()->second.dtype == io::DType::f64 ? worst64 : worst32) =
          std::max(out.begin()->second.dtype == io::DType::f64 ? worst64 : worst32, worst_ratio(r));
    }
  }
  std::printf("correct implementations: worst err / allowed = %.3g (float32), %.3g (float64)\n", worst32, worst64);
}

TEST(ModelGradCompare, EveryMutantFails) {
  for (const auto& [mu, cname] : mutant_cases()) {
    SCOPED_TRACE(std::string(name_of(mu)) + " on " + cname);
    const GradCase s = make_case(cname, base_seed());
    const om::ModelGrads<float> g = mutant_backward(s.m, s.li.ids, s.mc.B, s.mc.T, s.li.R.cast<float>(), mu);
    const verify::CompareReport r = run(s, gradient_outputs(g, io::DType::f32));
    EXPECT_FALSE(r.passed) << verify::format_report(r);
    std::string first;
    for (const auto& t : r.tensors)
      if (!t.passed && first.empty()) first = t.name;
    std::printf("  %-44s %-30s fails: worst err / allowed %.3g, first failing tensor %s\n", name_of(mu), cname.c_str(),
                worst_ratio(r), first.c_str());
  }
}

/// The forward trace (a router's local backward step reads its .sources, .g_old, .psi; the forward
/// check needs their producers) and the router gradients (.grad_routed, .grad_g_old, .grad_psi), in
/// float32.
io::TensorMap router_step_tensors(const GradCase& s, const om::ModelGrads<float>& g) {
  om::ForwardOptions fo;
  fo.trace = true;
  const om::ForwardResult<float> f = s.m.forward(s.li.ids, s.mc.B, s.mc.T, fo);
  io::TensorMap out = gradient_outputs(g, io::DType::f32, false);
  for (auto& [name, t] : om::trace_tensors(f, io::DType::f32)) out[name] = t;  // the whole forward trace
  for (const auto& tr : g.trace)
    if (!tr.grad_g_old.empty()) {
      out[tr.name + ".grad_routed"] = stored(tr.grad_routed, io::DType::f32);
      out[tr.name + ".grad_g_old"] = stored(tr.grad_g_old, io::DType::f32);
      out[tr.name + ".grad_psi"] = stored(tr.grad_psi, io::DType::f32);
      out[tr.name + ".grad_sources"] = stored(tr.grad_sources, io::DType::f32);
    }
  return out;
}

/// The report's note naming the first wrong backward step ("" when none).
std::string first_wrong_step_note(const verify::CompareReport& r) {
  for (const auto& n : r.notes)
    if (n.find("first wrong backward step") != std::string::npos) return n;
  return "";
}

/// Whether the report's row `name` exists and fails.
bool row_failed(const verify::CompareReport& r, const std::string& name) {
  for (const auto& t : r.tensors)
    if (t.name == name) return !t.passed;
  return false;
}

// The routers' local backward steps: each router's grad_g_old and grad_psi judged by op
// depth_backward on its traced sources, g_old, psi and grad_routed, and (Kimi) its grad_sources as
// the mix plus the pseudo-query backward of its traced grad_g_old, on every Kimi and coupled
// authors' configuration of the model zoo (full, blocks, uneven blocks, tied, norms in float32).
// The oracle's float backward passes every step; a router whose psi gradient leaves out the centring mean, or whose sources'
// gradients are swapped between two candidates (the rest of the backward correct), fails its own
// step, which the report names as the first wrong backward step, with the last correct one before it.
TEST(ModelGradCompare, RouterBackwardStepsAreJudgedLocally) {
  for (const char* c : {"kimi_full_oasis_final", "kimi_block2_oasis_sum_mass", "authors_oasis", "kimi_block3_oasis_tied",
                        "kimi_blocks_2211", "kimi_full_norm_float32"}) {
    SCOPED_TRACE(c);
    const GradCase s = make_case(c, base_seed());
    const om::ModelGrads<float> g = om::model_backward(s.m, s.li.ids, s.mc.B, s.mc.T, s.li.R.cast<float>());
    io::TensorMap out = router_step_tensors(s, g);
    const verify::CompareReport r = run(s, out);
    EXPECT_TRUE(r.passed) << verify::format_report(r);
    std::vector<std::string> routers;
    for (const auto& t : r.tensors)
      if (t.name.find("(backward step)") != std::string::npos) {
        routers.push_back(t.name);
        const bool keys = t.name.find(".grad_sources") != std::string::npos || t.name.find(".query ") != std::string::npos ||
                          t.name.find(".key_norm.weight ") != std::string::npos;
        EXPECT_NE(t.step.find(keys ? "pseudo-query backward" : "depth_backward"), std::string::npos) << t.name << ": " << t.step;
      }
    const bool kimi = std::string(c).rfind("kimi", 0) == 0;
    EXPECT_GE(routers.size(), (kimi ? 3u : 2u) * 4u) << "every router's grad_g_old, grad_psi (and, Kimi, grad_sources)";
    if (kimi) {  // a gradient accumulated into the wrong source: candidates 0 and 1 of the last router swapped
      io::TensorMap sw = out;
      const std::string L = g.trace.back().name;
      Tensor<double>& gs = sw.at(L + ".grad_sources").values;
      const index_t per = gs.size() / gs.dim(0);
      for (index_t x = 0; x < per; ++x) std::swap(gs[x], gs[per + x]);
      const verify::CompareReport r2 = run(s, sw);
      EXPECT_FALSE(r2.passed);
      const std::string note = first_wrong_step_note(r2);
      EXPECT_TRUE(row_failed(r2, L + ".grad_sources (backward step)")) << verify::format_report(r2);
      EXPECT_FALSE(note.empty()) << verify::format_report(r2);
      std::printf("%-28s grad_sources of candidates 0 and 1 swapped in %s: %s\n", c, L.c_str(), note.c_str());
    }
    // the centring mean left out of one router's psi gradient: dpsi_r = dDpsi_r = -beta dx_r
    std::string S;  // the first router whose psi gradient is not all 0 (a centring set of two or more)
    for (const auto& tr : g.trace)
      for (index_t i = 0; i < tr.grad_psi.size() && S.empty(); ++i)
        if (tr.grad_psi[i] != 0) S = tr.name;
    ASSERT_FALSE(S.empty());
    const om::ModelConfig& cfg = s.mc.cfg;
    const om::ModelWiring w = om::model_wiring(cfg);
    const om::WiredRouter* R = nullptr;
    for (const auto& x : w.routers)
      if (x.trace == S) R = &x;
    ASSERT_NE(R, nullptr);
    const DepthOptions d = om::router_depth_options(cfg, s.m.theta_of(R->params));
    const double beta = depth_beta<double>(d);
    Tensor<double>& gp = out[S + ".grad_psi"].values;
    const Tensor<double>& gx = out[S + ".grad_g_old"].values;
    for (index_t i = 0; i < gp.size(); ++i)
      if (gp[i] != 0) gp[i] = static_cast<float>(-beta * gx[i]);
    const verify::CompareReport m = run(s, out);
    EXPECT_FALSE(m.passed);
    const std::string note = first_wrong_step_note(m);
    EXPECT_TRUE(row_failed(m, S + ".grad_psi (backward step)")) << verify::format_report(m);
    EXPECT_NE(note.find(R->params), std::string::npos) << verify::format_report(m);
    std::printf("%-28s %zu local backward rows PASS; centring mean dropped in %s: %s\n", c, routers.size(), S.c_str(),
                note.c_str());
  }
}

// The routers' own parameters at their local step: a stop-gradient on a pseudo-query (its gradient
// 0) and a theta whose gradient is doubled each fail their router's step (grad.<router>.query,
// grad.<router>.theta judged on the traced grad_g_old and cotangents), named as the first wrong step.
TEST(ModelGradCompare, RouterParametersAreJudgedAtTheirStep) {
  const GradCase s = make_case("kimi_full_oasis_final", base_seed());
  const om::ModelGrads<float> g = om::model_backward(s.m, s.li.ids, s.mc.B, s.mc.T, s.li.R.cast<float>());
  const io::TensorMap out = router_step_tensors(s, g);
  for (const auto& [param, how] : {std::pair<std::string, double>{"grad.layers.1.mlp_res.query", 0.0},
                                   {"grad.layers.1.mlp_res.theta", 2.0}}) {
    SCOPED_TRACE(param);
    io::TensorMap bad = out;
    Tensor<double>& x = bad.at(param).values;
    bool nonzero = false;
    for (index_t i = 0; i < x.size(); ++i) {
      nonzero = nonzero || x[i] != 0;
      x[i] *= how;
    }
    ASSERT_TRUE(nonzero) << "the mutant must change the gradient";
    const verify::CompareReport r = run(s, bad);
    EXPECT_TRUE(row_failed(r, param + " (backward step)")) << verify::format_report(r);
    EXPECT_NE(first_wrong_step_note(r).find("router layers.1.mlp_res's backward"), std::string::npos)
        << verify::format_report(r);
  }
}

// Routers whose logits pass an uncoupled score clamp (the authors' profile without coupling): the
// trace does not hold the clamp's input, so their steps are not judged locally, and a note says so.
TEST(ModelGradCompare, UncoupledClampedRoutersAreNotedNotJudged) {
  const GradCase s = make_case("authors_aos_tied", base_seed());
  const om::ModelGrads<float> g = om::model_backward(s.m, s.li.ids, s.mc.B, s.mc.T, s.li.R.cast<float>());
  const verify::CompareReport r = run(s, router_step_tensors(s, g));
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  bool noted = false;
  for (const auto& n : r.notes) noted = noted || n.find("not checked locally") != std::string::npos;
  EXPECT_TRUE(noted) << verify::format_report(r);
  for (const auto& t : r.tensors) EXPECT_EQ(t.name.find("(backward step)"), std::string::npos) << t.name;
}

// The zoo's router mutant whose candidates get gradient through the mix only (not their keys): the
// first local step in backward order, the readout router's, fails on its grad_sources and is named.
TEST(ModelGradCompare, RouterKeysMissingIsNamedAtTheFirstRouterStep) {
  const GradCase s = make_case("kimi_full_oasis_final", base_seed());
  const om::ModelGrads<float> g =
      mutant_backward(s.m, s.li.ids, s.mc.B, s.mc.T, s.li.R.cast<float>(), ModelMutant::router_keys_missing);
  const verify::CompareReport r = run(s, router_step_tensors(s, g));
  EXPECT_FALSE(r.passed);
  const std::string note = first_wrong_step_note(r);
  EXPECT_NE(note.find("router final_res's backward"), std::string::npos) << verify::format_report(r);
  EXPECT_TRUE(row_failed(r, "final_res.grad_sources (backward step)")) << verify::format_report(r);
  std::printf("router keys missing: %s\n", note.c_str());
}

/// A backward trace of every step: the forward trace, the parameters' gradients and every
/// sublayer's grad_output, grad_input, grad_branch_psi besides the routers' step tensors.
io::TensorMap step_tensors(const GradCase& s, const om::ModelGrads<float>& g) {
  io::TensorMap out = router_step_tensors(s, g);
  for (const auto& tr : g.trace)
    for (const auto& [f, t] : {std::pair<const char*, const Tensor<float>*>{"grad_output", &tr.grad_output},
                               {"grad_input", &tr.grad_input}, {"grad_branch_psi", &tr.grad_branch_psi}})
      if (!t->empty()) out[tr.name + "." + f] = stored(*t, io::DType::f32);
  return out;
}

/// An MLP sublayer's backward that takes its pre-norm's gradient without the RMSNorm's projection
/// term: dh = dxn gain / rms(h) (the rest of the step correct).
Tensor<float> mlp_input_grad_without_projection(const GradCase& s, index_t block, const Tensor<float>& h,
                                                const Tensor<float>& dout) {
  const om::ModelConfig& cfg = s.mc.cfg;
  const om::MlpWeights<float> W = s.m.mlp_weights(block);
  const om::ErrorModel em{};
  const om::Rows<float> xn = om::rms_norm(om::Rows<float>{h, {}}, *W.norm, cfg.norm_options(), em);
  const om::Rows<float> a = om::linear(xn, *W.gate, em), b = om::linear(xn, *W.up, em);
  const om::Rows<float> mh = om::mlp_hidden(om::Rows<float>{h, {}}, W, cfg, em);
  const om::LinearGrads<float> gd = om::linear_backward(mh.x, *W.down, dout);
  const om::SwiGluGrads<float> gs = om::swiglu_backward(a.x, b.x, gd.x);
  const om::LinearGrads<float> ga = om::linear_backward(xn.x, *W.gate, gs.a), gb = om::linear_backward(xn.x, *W.up, gs.b);
  const index_t N = h.dim(0), d = h.dim(1);
  Tensor<float> dh({N, d});
  for (index_t t = 0; t < N; ++t) {
    float ss = 0;
    for (index_t c = 0; c < d; ++c) ss += h(t, c) * h(t, c);
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + static_cast<float>(cfg.norm_eps));
    for (index_t c = 0; c < d; ++c) dh(t, c) = (ga.x(t, c) + gb.x(t, c)) * (*W.norm)[c] * inv;
  }
  return dh;
}

// The attention and MLP sublayers' local backward steps: with a trace of every step, the oracle's
// float backward passes every sublayer's grad_input and parameter gradients judged on its traced
// input and cotangents; a detached branch psi (the attention step's gradients without the psi
// path) and an MLP whose pre-norm drops the RMSNorm's projection term each fail their own step,
// named as the first wrong backward step, while the end-to-end rows they feed are left as given.
TEST(ModelGradCompare, SublayerBackwardStepsAreJudgedLocally) {
  for (const char* c : {"kimi_full_oasis_final", "kimi_block2_oasis_sum_mass", "kimi_full_norm_float32", "authors_oasis",
                        "original"}) {
    SCOPED_TRACE(c);
    const GradCase s = make_case(c, base_seed());
    const om::ModelConfig& cfg = s.mc.cfg;
    const index_t B = s.mc.B, T = s.mc.T, N = B * T, d = cfg.d_model;
    const om::ModelGrads<float> g = om::model_backward(s.m, s.li.ids, B, T, s.li.R.cast<float>());
    const io::TensorMap out = step_tensors(s, g);
    const verify::CompareReport r = run(s, out);
    EXPECT_TRUE(r.passed) << verify::format_report(r);
    std::size_t rows = 0;
    double worst = 0;
    for (const auto& t : r.tensors)
      if (t.step.rfind("sublayer ", 0) == 0) {
        ++rows;
        worst = std::max(worst, t.worst_ratio);
      }
    EXPECT_GE(rows, static_cast<std::size_t>(2 * cfg.n_blocks * 5)) << "every sublayer's grad_input and weights";
    auto input_of = [&](const std::string& S) { return out.at(S + ".input").values.reshaped({N, d}).cast<float>(); };
    auto grad_output_of = [&](const std::string& S) { return out.at(S + ".grad_output").values.reshaped({N, d}).cast<float>(); };
    // an MLP in the middle of the backward: block 0's, whose pre-norm drops the projection term
    {
      io::TensorMap bad = out;
      const std::string S = "layers.0.mlp";
      bad[S + ".grad_input"] =
          stored(mlp_input_grad_without_projection(s, 0, input_of(S), grad_output_of(S)).reshaped({B, T, d}), io::DType::f32);
      const verify::CompareReport m = run(s, bad);
      const std::string note = first_wrong_step_note(m);
      EXPECT_TRUE(row_failed(m, S + ".grad_input (backward step)")) << verify::format_report(m);
      EXPECT_NE(note.find("first wrong backward step (backward order): sublayer layers.0.mlp's backward"), std::string::npos)
          << verify::format_report(m);
      EXPECT_NE(note.find("the last correct one before it:"), std::string::npos) << note;
      std::printf("%-28s %zu sublayer step rows PASS (worst err/allowed %.3g); MLP pre-norm projection dropped: %s\n", c,
                  rows, worst, note.c_str());
    }
    // a detached branch psi: block 1's attention step without the psi cotangent (coupled models)
    const std::string A = "layers.1.attn";
    const Tensor<double>& dpsi = out.count(A + ".grad_branch_psi") ? out.at(A + ".grad_branch_psi").values : Tensor<double>();
    bool psi_flows = false;
    for (index_t i = 0; i < dpsi.size(); ++i) psi_flows = psi_flows || dpsi[i] != 0;
    if (!psi_flows) continue;
    const om::AttentionSublayerGrads<float> det =
        om::attention_sublayer_backward(input_of(A), B, T, s.m.attn_weights(1), cfg, grad_output_of(A), Tensor<float>());
    io::TensorMap bad = out;
    bad[A + ".grad_input"] = stored(det.h.reshaped({B, T, d}), io::DType::f32);
    bad["grad.layers.1.attn.q_proj.weight"] = stored(det.wq, io::DType::f32);
    bad["grad.layers.1.attn.k_proj.weight"] = stored(det.wk, io::DType::f32);
    const verify::CompareReport m = run(s, bad);
    const std::string note = first_wrong_step_note(m);
    EXPECT_TRUE(row_failed(m, A + ".grad_input (backward step)") ||
                row_failed(m, "grad.layers.1.attn.q_proj.weight (backward step)"))
        << verify::format_report(m);
    EXPECT_NE(note.find("sublayer layers.1.attn's backward"), std::string::npos) << verify::format_report(m);
    std::printf("%-28s branch psi detached in %s: %s\n", c, A.c_str(), note.c_str());
  }
}

// A backward trace of a sublayer without what it read (.input) is noted, not judged.
TEST(ModelGradCompare, SublayerStepsWithoutTheirInputAreNoted) {
  const GradCase s = make_case("kimi_full_oasis_final", base_seed());
  const om::ModelGrads<float> g = om::model_backward(s.m, s.li.ids, s.mc.B, s.mc.T, s.li.R.cast<float>());
  io::TensorMap out = step_tensors(s, g);
  out.erase("layers.0.mlp.input");
  const verify::CompareReport r = run(s, out);
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  bool noted = false;
  for (const auto& n : r.notes)
    noted = noted || (n.find("sublayer backward steps not checked locally") != std::string::npos &&
                      n.find("layers.0.mlp") != std::string::npos);
  EXPECT_TRUE(noted) << verify::format_report(r);
  for (const auto& t : r.tensors) EXPECT_NE(t.name, "layers.0.mlp.grad_input (backward step)");
}

TEST(ModelGradCompare, BadInputIsNamed) {
  const GradCase s = make_case("kimi_full_oasis_final", base_seed());
  const om::ModelGrads<float> g = om::model_backward(s.m, s.li.ids, s.mc.B, s.mc.T, s.li.R.cast<float>());
  const io::TensorMap good = gradient_outputs(g, io::DType::f32, false);
  auto throws_naming = [&](const io::TensorMap& in, const io::TensorMap& out, const std::string& what) {
    try {
      (void)verify::check_model(s.mc.cfg, s.weights, in, out);
      ADD_FAILURE() << "no error; expected one naming " << what;
    } catch (const oasis::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  io::TensorMap no_dl = s.inputs;
  no_dl.erase("grad_logits");
  throws_naming(no_dl, good, "grad_logits");
  io::TensorMap bad_dl = s.inputs;
  bad_dl["grad_logits"].values = Tensor<double>({s.mc.B, s.mc.T});
  throws_naming(bad_dl, good, "grad_logits");
  io::TensorMap unknown = good;
  unknown["grad.layers.0.attn.no_such.weight"] = good.begin()->second;
  throws_naming(s.inputs, unknown, "grad.layers.0.attn.no_such.weight");
  io::TensorMap unknown_field = good;
  unknown_field["layers.0.attn.grad_nothing"] = good.at("grad_embeddings");
  throws_naming(s.inputs, unknown_field, "layers.0.attn.grad_nothing");
  io::TensorMap bf16 = good;
  bf16.begin()->second.dtype = io::DType::bf16;
  throws_naming(s.inputs, bf16, "F32 or F64");
  // a gradient tensor whose shape is not the model's: an input error naming it and both shapes
  io::TensorMap shape = good;
  shape["grad.norm.weight"].values = Tensor<double>({3});
  throws_naming(s.inputs, shape, "'grad.norm.weight': shape [3] but the configured model's grad.norm.weight has shape");
  // grad_logits without gradient tensors: a note, the forward's checks run as before
  io::TensorMap logits_only;
  logits_only["logits"] = stored(s.m.forward(s.li.ids, s.mc.B, s.mc.T).logits, io::DType::f32);
  const verify::CompareReport rl = run(s, logits_only);
  bool noted = false;
  for (const auto& n : rl.notes) noted = noted || n.find("no gradient was checked") != std::string::npos;
  EXPECT_TRUE(noted);
  // gated attention has no backward: named
  GradCase gs = make_case("kimi_full_token_only", base_seed());
  gs.mc.cfg.gated_attention = true;
  const om::Model<float> gm = om::Model<float>::initialized(gs.mc.cfg, 3);
  gs.weights.clear();
  for (const auto& [n, t] : gm.parameters()) gs.weights[n] = stored(t, io::DType::f32);
  io::TensorMap one;
  one["grad.norm.weight"] = {io::DType::f32, Tensor<double>({gs.mc.cfg.d_model})};
  try {
    (void)verify::check_model(gs.mc.cfg, gs.weights, gs.inputs, one);
    ADD_FAILURE() << "gated attention accepted";
  } catch (const oasis::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("gated_attention"), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(ModelGradCompare, BackwardTraceWithoutForwardTraceSaysWhatWasChecked) {
  const GradCase s = make_case("kimi_full_oasis_final", base_seed());
  const om::ModelGrads<float> g = om::model_backward(s.m, s.li.ids, s.mc.B, s.mc.T, s.li.R.cast<float>());
  auto noted = [](const verify::CompareReport& r, const std::string& what) {
    for (const auto& n : r.notes)
      if (n.find(what) != std::string::npos) return true;
    return false;
  };
  const verify::CompareReport grads_only = run(s, gradient_outputs(g, io::DType::f32));
  EXPECT_TRUE(grads_only.passed) << verify::format_report(grads_only);
  EXPECT_TRUE(noted(grads_only, "a backward trace without its forward trace: no local backward step was checked"))
      << verify::format_report(grads_only);
  const verify::CompareReport every_step = run(s, step_tensors(s, g));
  EXPECT_FALSE(noted(every_step, "no local backward step was checked")) << verify::format_report(every_step);
}

// ---- The fast oracle of model gradients (docs/verify-model.md, "Model gradients: the fast oracle")

verify::CompareReport run_with(const GradCase& s, const io::TensorMap& out, verify::Oracle oracle,
                               double budget = verify::CompareOptions{}.mp50_budget) {
  verify::CompareOptions co;
  co.oracle = oracle;
  co.mp50_budget = budget;
  return verify::check_model(s.mc.cfg, s.weights, s.inputs, out, {}, co);
}

/// name -> passed of every row of a report.
std::map<std::string, bool> verdicts(const verify::CompareReport& r) {
  std::map<std::string, bool> v;
  for (const auto& t : r.tensors) v[t.name] = t.passed;
  return v;
}

TEST(ModelGradFastOracle, AgreesWithMp50OnEveryVerdict) {
  // correct float32 gradients with every step's tensors, and every mutant of the zoo
  std::vector<std::pair<std::string, std::pair<std::string, io::TensorMap>>> impls;
  for (const char* c : {"kimi_full_oasis_final", "kimi_block2_oasis_sum_mass", "authors_oasis", "original"}) {
    const GradCase s = make_case(c, base_seed());
    const om::ModelGrads<float> g = om::model_backward(s.m, s.li.ids, s.mc.B, s.mc.T, s.li.R.cast<float>());
    impls.push_back({c, {"correct, every step traced", step_tensors(s, g)}});
  }
  for (const auto& [mu, cname] : mutant_cases()) {
    const GradCase s = make_case(cname, base_seed());
    const om::ModelGrads<float> g = mutant_backward(s.m, s.li.ids, s.mc.B, s.mc.T, s.li.R.cast<float>(), mu);
    impls.push_back({cname, {name_of(mu), step_tensors(s, g)}});
  }
  for (const auto& [cname, impl] : impls) {
    SCOPED_TRACE(cname + ": " + impl.first);
    const GradCase s = make_case(cname, base_seed());
    const verify::CompareReport fast = run_with(s, impl.second, verify::Oracle::fast);
    const verify::CompareReport exact = run_with(s, impl.second, verify::Oracle::mp50);
    EXPECT_EQ(fast.passed, exact.passed) << verify::format_report(fast);
    EXPECT_EQ(verdicts(fast), verdicts(exact));
    bool fast_note = false;
    for (const auto& n : fast.notes) fast_note = fast_note || n.find("gradients (fast") != std::string::npos;
    const bool applies = !s.mc.cfg.norm_float32 && !s.mc.cfg.key_norm.compute_in_float32;
    EXPECT_EQ(fast_note, applies) << verify::format_report(fast);
    for (const auto& t : fast.tensors) EXPECT_EQ(t.undecided, 0) << t.name;
  }
}

TEST(ModelGradFastOracle, RowOnTheLineIsUndecidedThenSettledByMp50) {
  // grad.norm.weight (one row) moved by t times the fast verdict's allowance direction until the
  // fast oracle can no longer decide it: bisection between a passing and a failing offset.
  const GradCase s = make_case("kimi_full_oasis_final", base_seed());
  const om::ModelGrads<float> g = om::model_backward(s.m, s.li.ids, s.mc.B, s.mc.T, s.li.R.cast<float>());
  io::TensorMap out{{"grad.norm.weight", stored(g.params.at("norm.weight"), io::DType::f32)}};
  const io::StoredTensor base = out.at("grad.norm.weight");
  auto at = [&](double t, double budget) {
    io::TensorMap o = out;
    o.at("grad.norm.weight").values[0] = base.values[0] + t;  // a double offset: not rounded to float
    return run_with(s, o, verify::Oracle::fast, budget).tensors.front();
  };
  double lo = 0, hi = 1;
  ASSERT_TRUE(at(lo, 0).passed);
  ASSERT_GT(at(hi, 0).violations, 0);
  verify::TensorReport und;
  for (int k = 0; k < 200 && und.undecided == 0; ++k) {
    const double mid = 0.5 * (lo + hi);
    const verify::TensorReport r = at(mid, 0);
    if (r.undecided > 0) und = r;
    else (r.passed ? lo : hi) = mid;
  }
  ASSERT_GT(und.undecided, 0) << "no offset left the row undecided";
  EXPECT_FALSE(und.passed);  // past the mp50 budget (0): named, never PASS
  ASSERT_FALSE(und.first_undecided.empty());
  EXPECT_EQ(und.first_undecided.front(), "grad.norm.weight row 0");
  // within the budget mp50 settles it
  const double t = 0.5 * (lo + hi);
  io::TensorMap o = out;
  o.at("grad.norm.weight").values[0] = base.values[0] + t;
  const verify::CompareReport r = run_with(s, o, verify::Oracle::fast);
  EXPECT_EQ(r.tensors.front().undecided, 0);
  bool mp50_note = false;
  for (const auto& n : r.notes) mp50_note = mp50_note || n.find("gradients (mp50 (rows the fast oracle left undecided))") != std::string::npos;
  EXPECT_TRUE(mp50_note) << verify::format_report(r);
  EXPECT_EQ(r.tensors.front().passed, run_with(s, o, verify::Oracle::mp50).tensors.front().passed);
}
