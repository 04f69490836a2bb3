// tests/verify/test_compare_model.cpp — the model-level verdict certifies the whole model.
//
// A zoo of wrong models (each a realistic mistake of an AttnRes implementation, made by a
// separately written forward pass or by the library's model with a mistaken configuration and
// the same weights): every full trace FAILs and the first failing tensor in forward order is the
// step that makes the mistake; every logits-only trace FAILs through the end-to-end verdict.
// A zoo of correct implementations (f32, f64, bf16- and f16-stored, float accumulation and
// double accumulation, full, minimal and logits-only traces) PASSes. The command line exits 1 on
// a wrong model, 0 on a correct one and 2 on a trace that checks nothing. The fast oracle and the
// input errors: test_compare_model_checks.cpp; the test models: model_compare_support.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <sys/wait.h>
#include <vector>

#include "oasis/io/safetensors.hpp"
#include "oasis/model/io.hpp"
#include "oasis/model/wiring.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis_test.hpp"
#include "model_compare_support.hpp"

namespace io = oasis::io;
namespace om = oasis::model;
namespace verify = oasis::verify;
using oasis::index_t;
using oasis::RowNorm;
using oasis::SourceKind;
using oasis::Tensor;
using namespace oasis::verify_test;

namespace {

// ---- a separately written forward pass with switchable mistakes --------------------------------

struct Mistakes {
  bool running_state_sources = false;  ///< Kimi: candidate i is h_i + f(h_i), not f(h_i)
  bool mlp_psi_zero = false;           ///< head-less candidates carry psi 0 instead of the inherited psi
  bool depth_softmax = false;          ///< plain softmax over depth instead of Softmax1
  bool recency_over_n = false;         ///< authors: recency i / n instead of i / (n - 1)
  bool residual_missing = false;       ///< authors: the attention candidate is a instead of x + a
};

/// Kimi Full (block size 1) and the authors' router, written from the layer functions and the
/// core's routing, recording the documented trace in f32.
io::TensorMap zoo_trace(const om::Model<float>& m, const std::vector<index_t>& ids, const Mistakes& bug) {
  const om::ModelConfig& cfg = m.config();
  const index_t N = kB * kT, d = cfg.d_model;
  io::TensorMap out{{"ids", ids_tensor(ids)}};
  auto put = [&](const std::string& name, const Tensor<float>& t, oasis::Shape shape) {
    out[name] = io::StoredTensor{io::DType::f32, t.cast<double>().reshaped(shape)};
  };
  struct Src { Tensor<float> v; SourceKind kind; Tensor<float> psi; };
  const Tensor<float> emb = m.embed(ids, kB, kT).x;
  std::vector<om::KVCache<float>> kv(static_cast<std::size_t>(cfg.n_blocks));
  // one router: logits of the family, coupling and normaliser of the core, recorded under `trace`
  auto route = [&](const std::vector<Src>& src, const std::string& params, const std::string& trace) {
    const index_t n = static_cast<index_t>(src.size());
    Tensor<float> s({n, N, d}), psi({n, N});
    std::vector<SourceKind> kinds;
    for (index_t i = 0; i < n; ++i) {
      std::copy(src[static_cast<std::size_t>(i)].v.data(), src[static_cast<std::size_t>(i)].v.data() + N * d, s.ptr(i));
      std::copy(src[static_cast<std::size_t>(i)].psi.data(), src[static_cast<std::size_t>(i)].psi.data() + N, psi.ptr(i));
      kinds.push_back(src[static_cast<std::size_t>(i)].kind);
    }
    Tensor<float> g_old;
    if (cfg.router == om::RouterFamily::authors_code) {
      const om::Rows<float> q = om::linear(om::Rows<float>{src.back().v, {}}, m.param(params + ".q_proj.weight"), {});
      const index_t rk = q.w();
      const float scale = 1.0f / std::sqrt(static_cast<float>(rk)), rec = m.param(params + ".recency_bias")[0];
      g_old = Tensor<float>({n, N});
      for (index_t i = 0; i < n; ++i) {
        const om::Rows<float> k = om::linear(om::Rows<float>{src[static_cast<std::size_t>(i)].v, {}}, m.param(params + ".k_proj.weight"), {});
        const float r = rec * (static_cast<float>(i) / static_cast<float>(bug.recency_over_n ? n : n - 1));
        for (index_t t = 0; t < N; ++t) {
          float dot = 0;
          for (index_t a = 0; a < rk; ++a) dot += q.x(t, a) * k.x(t, a);
          g_old(i, t) = dot * scale + r;
        }
      }
    } else {
      g_old = oasis::pseudo_query_logits(s, m.param(params + ".query"), m.gain_of(params), cfg.key_norm);
    }
    oasis::DepthOptions dopt = om::router_depth_options(cfg, m.theta_of(params));
    if (bug.depth_softmax) dopt.normalizer = RowNorm::softmax;
    const oasis::DepthRoute<float> r = oasis::attn_res_route(s, g_old, psi, kinds, dopt);
    put(trace + ".sources", s, {n, kB, kT, d});
    put(trace + ".psi", psi, {n, kB, kT});
    put(trace + ".g_old", g_old, {n, kB, kT});
    put(trace + ".g", r.g, {n, kB, kT});
    put(trace + ".dpsi", r.dpsi, {n, kB, kT});
    put(trace + ".alpha", r.alpha, {n, kB, kT});
    put(trace + ".alpha_null", r.alpha_null, {kB, kT});
    put(trace + ".routed", r.h, {kB, kT, d});
    return r.h;
  };
  auto attention = [&](const Tensor<float>& h, index_t b, const std::string& P) {
    put(P + ".input", h, {kB, kT, d});
    const om::AttentionSublayer<float> a =
        om::attention_sublayer(om::Rows<float>{h, {}}, kB, kT, 0, m.attn_weights(b), cfg, kv[static_cast<std::size_t>(b)], om::ErrorModel{});
    put(P + ".attn_q", a.q.x, {kB, kT, a.q.w()});
    put(P + ".attn_k", a.k.x, {kB, kT, a.k.w()});
    put(P + ".attn_v", a.v.x, {kB, kT, a.v.w()});
    put(P + ".p_null", a.p_null, a.p_null.shape());
    put(P + ".lse", a.lse, a.lse.shape());
    put(P + ".attn_heads", a.heads.x, {kB, kT, a.heads.w()});
    put(P + ".branch_psi", a.psi, {kB, kT});
    put(P + ".output", a.out.x, {kB, kT, d});
    return a;
  };
  auto mlp = [&](const Tensor<float>& h, index_t b, const std::string& P) {
    put(P + ".input", h, {kB, kT, d});
    const om::Rows<float> hid = om::mlp_hidden(om::Rows<float>{h, {}}, m.mlp_weights(b), cfg, om::ErrorModel{});
    const om::Rows<float> o = om::linear(hid, *m.mlp_weights(b).down, {});
    put(P + ".mlp_hidden", hid.x, {kB, kT, cfg.d_ff});
    put(P + ".output", o.x, {kB, kT, d});
    return o.x;
  };
  auto plus = [](const Tensor<float>& a, const Tensor<float>& b) {
    Tensor<float> s(a.shape());
    for (index_t i = 0; i < s.size(); ++i) s[i] = a[i] + b[i];
    return s;
  };
  const Tensor<float> zero({N});
  Tensor<float> state;
  if (cfg.router == om::RouterFamily::authors_code) {
    std::vector<Src> hist{{emb, SourceKind::initial, zero}};
    Tensor<float> x = emb;
    for (index_t b = 0; b < cfg.n_blocks; ++b) {
      const std::string P = "layers." + std::to_string(b);
      const om::AttentionSublayer<float> a = attention(x, b, P + ".attn");
      const Tensor<float> apsi = a.psi.reshaped({N});
      std::vector<Src> c = hist;
      c.push_back({bug.residual_missing ? a.out.x : plus(x, a.out.x), SourceKind::attention, apsi});
      const Tensor<float> h1 = route(c, P + ".attn_res", P + ".attn");
      const Tensor<float> mo = mlp(h1, b, P + ".mlp");
      c.push_back({plus(h1, mo), SourceKind::headless, bug.mlp_psi_zero ? zero : apsi});
      x = route(c, P + ".mlp_res", P + ".mlp");
      hist.push_back({x, SourceKind::headless, bug.mlp_psi_zero ? zero : apsi});
    }
    state = x;
  } else {
    std::vector<Src> src{{emb, SourceKind::initial, zero}};
    Tensor<float> apsi;
    for (index_t l = 0; l < cfg.n_sublayers(); ++l) {
      const index_t b = l / 2;
      const bool is_attn = l % 2 == 0;
      const std::string P = "layers." + std::to_string(b) + (is_attn ? ".attn" : ".mlp");
      const Tensor<float> h = route(src, "layers." + std::to_string(b) + (is_attn ? ".attn_res" : ".mlp_res"), P);
      Tensor<float> o;
      if (is_attn) {
        const om::AttentionSublayer<float> a = attention(h, b, P);
        o = a.out.x;
        apsi = a.psi.reshaped({N});
      } else {
        o = mlp(h, b, P);
      }
      src.push_back({bug.running_state_sources ? plus(h, o) : o, is_attn ? SourceKind::attention : SourceKind::headless,
                     is_attn || !bug.mlp_psi_zero ? apsi : zero});
    }
    state = route(src, "final_res", "final_res");
  }
  put("state", state, {kB, kT, d});
  put("logits", m.head(om::Rows<float>{state, {}}, {}).x, {kB, kT, cfg.vocab_size});
  return out;
}

}  // namespace

// ---- the zoo of wrong models ----------------------------------------------------------------------

TEST(VerifyModel, MutantZooFailsNamingTheFirstWrongStepAndEndToEnd) {
  struct Mutant {
    std::string name;
    om::ModelConfig config;                            ///< the configuration in the model file
    std::function<io::TensorMap(const om::Model<double>&, const std::vector<index_t>&)> trace;  ///< the implementation
    std::string first;                                 ///< expected first wrong step of the full trace
  };
  auto zoo = [](Mistakes bug) {
    return [bug](const om::Model<double>& m, const std::vector<index_t>& ids) { return zoo_trace(as_float(m), ids, bug); };
  };
  auto config_mistake = [](std::function<void(om::ModelConfig&)> change) {
    return [change](const om::Model<double>& m, const std::vector<index_t>& ids) { return mistaken_trace(m, ids, change); };
  };
  Mistakes running, psi0, soft, rec, resid;
  running.running_state_sources = true;
  psi0.mlp_psi_zero = true;
  soft.depth_softmax = true;
  rec.recency_over_n = true;
  resid.residual_missing = true;
  std::vector<Mutant> zoo_list = {
      {"sources = running state h + f(h)", kimi_full(), zoo(running), "layers.0.mlp.sources"},
      {"key-norm gain dropped", kimi_full(), config_mistake([](om::ModelConfig& c) { c.key_norm_gain = false; }), "layers.0.attn.g_old"},
      {"recency i/n instead of i/(n-1)", authors(), zoo(rec), "layers.0.attn.g_old"},
      {"MLP candidate psi 0 (Kimi)", kimi_full(), zoo(psi0), "layers.1.attn.psi"},
      {"MLP candidate psi 0 (authors)", authors(), zoo(psi0), "layers.0.mlp.psi"},
      {"attention candidate without the residual", authors(), zoo(resid), "layers.0.attn.sources"},
      {"block boundary off by one (3,1,1,1)", kimi_block(),
       config_mistake([](om::ModelConfig& c) { c.block_sizes = {3, 1, 1, 1}; }), "layers.1.mlp.sources"},
      {"readout last instead of final_attnres", kimi_full(),
       config_mistake([](om::ModelConfig& c) { c.readout = om::Readout::last; }), "state"},
      {"RoPE interleaved instead of rotate_half", kimi_full(),
       config_mistake([](om::ModelConfig& c) { c.rope = om::RopeLayout::interleaved; }), "layers.0.attn.attn_q"},
      {"softmax instead of Softmax1 at depth", kimi_full(), zoo(soft), "layers.0.attn.alpha"},
  };
  const std::string dir = tmp_dir("mutants");
  std::printf("  %-42s %-24s %-24s %-8s %12s %s\n", "mutant", "first wrong (full trace)", "(minimal trace)", "logits",
              "e2e err/allow", "seconds");
  for (const Mutant& mu : zoo_list) {
    const om::Model<double> m = test_model(mu.config, 4301);
    const std::vector<index_t> ids = token_ids(mu.config);
    const io::TensorMap full = mu.trace(m, ids);
    const Outcome r = compare(dir, m, full);
    EXPECT_FALSE(r.rep.passed) << mu.name << "\n" << verify::format_report(r.rep);
    EXPECT_EQ(first_wrong(r.rep), mu.first) << mu.name << "\n" << verify::format_report(r.rep);
    // minimal trace (sublayer outputs, branch psi, logits): fails at the first output the mistake changes
    const Outcome mn = compare(dir, m, only(full, {"output", "branch_psi", "logits"}));
    EXPECT_FALSE(mn.rep.passed) << mu.name << " (minimal)\n" << verify::format_report(mn.rep);
    if (mu.first != "state")  // a sublayer's mistake is named at a sublayer's row, not only at the logits
      EXPECT_NE(first_wrong(mn.rep), "logits") << mu.name << " (minimal)\n" << verify::format_report(mn.rep);
    const Outcome e = compare(dir, m, only(full, {"logits"}));
    EXPECT_FALSE(e.rep.passed) << mu.name << " (logits only)\n" << verify::format_report(e.rep);
    EXPECT_EQ(first_wrong(e.rep), "logits") << mu.name;
    // the default fast oracle gives the mp50 oracle's verdicts
    expect_same_verdicts(r.rep, compare(dir, m, full, io::DType::f32, verify::Oracle::mp50).rep, mu.name + " (full)");
    expect_same_verdicts(e.rep, compare(dir, m, only(full, {"logits"}), io::DType::f32, verify::Oracle::mp50).rep,
                         mu.name + " (logits only)");
    std::printf("  %-42s %-24s %-24s %-8s %12.3g %.2f %.2f %.2f\n", mu.name.c_str(), first_wrong(r.rep).c_str(),
                first_wrong(mn.rep).c_str(), e.rep.passed ? "PASS" : "FAIL", find(e.rep, "logits").worst_ratio, r.seconds,
                mn.seconds, e.seconds);
  }
}

// The separately written forward pass without mistakes is the library's model, bit for bit, and
// passes (so the zoo's failures come from the mistakes alone).
TEST(VerifyModel, SeparateForwardWithoutMistakesIsTheLibraryModel) {
  for (const om::ModelConfig& cfg : {kimi_full(), authors()}) {
    const om::Model<double> m = test_model(cfg, 4302);
    const std::vector<index_t> ids = token_ids(cfg);
    const io::TensorMap zoo = zoo_trace(as_float(m), ids, {});
    const io::TensorMap lib = library_trace(as_float(m), ids, io::DType::f32);
    EXPECT_EQ(zoo.size(), lib.size());
    for (const auto& [name, t] : lib) {
      ASSERT_TRUE(zoo.count(name)) << name;
      ASSERT_EQ(zoo.at(name).values.shape(), t.values.shape()) << name;
      for (index_t i = 0; i < t.values.size(); ++i) ASSERT_EQ(zoo.at(name).values[i], t.values[i]) << name << "[" << i << "]";
    }
    const Outcome r = compare(tmp_dir("separate"), m, zoo);
    EXPECT_TRUE(r.rep.passed) << verify::format_report(r.rep);
  }
}

// ---- the zoo of correct implementations ----------------------------------------------------------

TEST(VerifyModel, CorrectTracesPassInEveryPrecisionAndLayout) {
  struct Case {
    std::string name;
    om::ModelConfig config;
    std::function<io::TensorMap(const om::Model<double>&, const std::vector<index_t>&)> trace;
  };
  auto f32 = [](const om::Model<double>& m, const std::vector<index_t>& ids) { return library_trace(as_float(m), ids, io::DType::f32); };
  auto f64 = [](const om::Model<double>& m, const std::vector<index_t>& ids) { return library_trace(m, ids, io::DType::f64); };
  // float accumulation, bf16 storage; double accumulation, bf16 storage; double accumulation, f32 storage
  auto bf16 = [](const om::Model<double>& m, const std::vector<index_t>& ids) {
    return library_trace(as_float(m), ids, io::DType::bf16, store_bf16);
  };
  auto bf16d = [](const om::Model<double>& m, const std::vector<index_t>& ids) {
    return library_trace(m, ids, io::DType::bf16, store_bf16);
  };
  auto f16d = [](const om::Model<double>& m, const std::vector<index_t>& ids) { return library_trace(m, ids, io::DType::f16, store_f16); };
  auto f32d = [](const om::Model<double>& m, const std::vector<index_t>& ids) { return library_trace(m, ids, io::DType::f32, store_f32); };
  om::ModelConfig f32norms = kimi_full();
  f32norms.norm_float32 = true;
  f32norms.key_norm.compute_in_float32 = true;
  om::ModelConfig original = kimi_full();
  original.variant = oasis::Variant::original;
  original.key_norm_gain = false;
  om::ModelConfig aos = kimi_full();  // no coupling: the routers' psi is not read (noted, not checked)
  aos.variant = oasis::Variant::aos;
  const std::vector<Case> cases = {
      {"kimi_full f32", kimi_full(), f32},         {"kimi_full f64", kimi_full(), f64},
      {"kimi_full bf16 (float)", kimi_full(), bf16}, {"kimi_full bf16 (double)", kimi_full(), bf16d},
      {"kimi_full f16 (double)", kimi_full(), f16d}, {"kimi_full f32 (double)", kimi_full(), f32d},
      {"kimi_block 2,2,1,1 f32", kimi_block(), f32}, {"kimi_block 2,2,1,1 bf16 (double)", kimi_block(), bf16d},
      {"authors f32", authors(), f32},             {"authors bf16 (double)", authors(), bf16d},
      {"float32 norms f64", f32norms, f64},        {"original f32", original, f32},
      {"aos f32", aos, f32},
  };
  const std::string dir = tmp_dir("correct");
  std::printf("  %-34s %9s %9s %9s %13s %s\n", "correct implementation", "full", "minimal", "logits", "e2e err/allow",
              "seconds");
  for (const Case& c : cases) {
    const om::Model<double> m = test_model(c.config, 4303);
    const std::vector<index_t> ids = token_ids(c.config);
    const io::TensorMap full = c.trace(m, ids);
    const Outcome r = compare(dir, m, full);
    EXPECT_TRUE(r.rep.passed) << c.name << "\n" << verify::format_report(r.rep);
    if (c.name == "aos f32") {  // an uncoupled router does not read psi: said, not checked
      bool noted = false;
      for (const auto& n : r.rep.notes) noted = noted || n.find("'layers.0.attn.psi' is not read") != std::string::npos;
      EXPECT_TRUE(noted) << verify::format_report(r.rep);
    }
    // minimal: what a recorder gets from hooks on the sublayers: their outputs, the branch psi, logits
    const Outcome mn = compare(dir, m, only(full, {"output", "branch_psi", "logits"}));
    EXPECT_TRUE(mn.rep.passed) << c.name << " (minimal)\n" << verify::format_report(mn.rep);
    const Outcome e = compare(dir, m, only(full, {"logits"}));
    EXPECT_TRUE(e.rep.passed) << c.name << " (logits only)\n" << verify::format_report(e.rep);
    ASSERT_EQ(e.rep.tensors.size(), 1u);
    EXPECT_LT(find(e.rep, "logits").worst_ratio, 1.0);
    expect_same_verdicts(r.rep, compare(dir, m, full, io::DType::f32, verify::Oracle::mp50).rep, c.name + " (full)");
    std::printf("  %-34s %9s %9s %9s %13.3g %.2f %.2f %.2f\n", c.name.c_str(), r.rep.passed ? "PASS" : "FAIL",
                mn.rep.passed ? "PASS" : "FAIL", e.rep.passed ? "PASS" : "FAIL", find(e.rep, "logits").worst_ratio,
                r.seconds, mn.seconds, e.seconds);
  }
}

// ---- the end-to-end verdict -----------------------------------------------------------------------

// Logits (and state) without the tensors that produce them: the row parity rule against the
// replays. Its power: a logit moved by 2 x the float replay's row error plus the floor fails; one
// moved by less than the float replay's own error passes (a limit of the rule, documented).
TEST(VerifyModel, EndToEndVerdictCatchesWhatExceedsTwiceThePlainReplaysError) {
  const om::ModelConfig cfg = kimi_full();
  const om::Model<double> m = test_model(cfg, 4304);
  const std::vector<index_t> ids = token_ids(cfg);
  const std::string dir = tmp_dir("e2e");
  io::TensorMap t = only(library_trace(m, ids, io::DType::f32, store_f32), {"logits", "state"});
  Outcome r = compare(dir, m, t);
  ASSERT_TRUE(r.rep.passed) << verify::format_report(r.rep);
  EXPECT_EQ(r.rep.tensors.size(), 2u);  // state end to end, logits from the state (local head step)
  // the float replay's error on row (1, 3) and the allowance
  const auto hp = m.cast<oasis::mp50>().forward(ids, kB, kT);
  const auto fl = as_float(m).forward(ids, kB, kT);
  const index_t V = cfg.vocab_size, row = 1 * kT + 3;
  double e_ref = 0;
  for (index_t v = 0; v < V; ++v)
    e_ref = std::max(e_ref, std::abs(static_cast<double>(fl.logits[row * V + v]) - static_cast<double>(hp.logits[row * V + v])));
  ASSERT_GT(e_ref, 0.0);
  io::TensorMap lo = only(t, {"logits"});
  // within the float replay's own error: not seen
  lo.at("logits").values[row * V + 7] = io::round_to_dtype(static_cast<double>(hp.logits[row * V + 7]) + 0.5 * e_ref, io::DType::f32);
  r = compare(dir, m, lo);
  EXPECT_TRUE(r.rep.passed) << verify::format_report(r.rep);
  // far beyond it (1e3 x the row error): FAIL, naming logits[1, 3, 7]
  lo.at("logits").values[row * V + 7] = io::round_to_dtype(static_cast<double>(hp.logits[row * V + 7]) + 1e3 * e_ref, io::DType::f32);
  r = compare(dir, m, lo);
  EXPECT_FALSE(r.rep.passed);
  EXPECT_EQ(find(r.rep, "logits").violations, 1);
  EXPECT_EQ(find(r.rep, "logits").first_mismatches.at(0).rfind("logits[1, 3, 7]", 0), 0u) << verify::format_report(r.rep);
  bool noted = false;
  for (const auto& n : r.rep.notes) noted = noted || n.find("end-to-end verdict") != std::string::npos;
  EXPECT_TRUE(noted) << verify::format_report(r.rep);
}

// The user-visible contract of `oasis-verify compare`: a wrong model exits 1, a correct one 0, a
// trace that checks nothing 2.
TEST(VerifyModel, CommandLineExitStatus) {
  const om::ModelConfig cfg = kimi_full();
  const om::Model<double> m = test_model(cfg, 4307);
  const std::vector<index_t> ids = token_ids(cfg);
  const std::string dir = tmp_dir("cli");
  auto status = [&](const io::TensorMap& t) {
    om::save_model(m, dir + "/model.safetensors", io::DType::f32);
    io::write_safetensors(dir + "/run.safetensors", t);
    std::ofstream(dir + "/config.json") << kModelCfg;
    const int s = std::system((std::string(OASIS_VERIFY_CLI) + " compare '" + dir + "/config.json' > '" + dir + "/out.txt' 2>&1").c_str());
    return WIFEXITED(s) ? WEXITSTATUS(s) : -1;
  };
  EXPECT_EQ(status(library_trace(as_float(m), ids, io::DType::f32)), 0);
  Mistakes soft;
  soft.depth_softmax = true;
  EXPECT_EQ(status(zoo_trace(as_float(m), ids, soft)), 1);
  std::ifstream f(dir + "/out.txt");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("first wrong step (forward order): layers.0.attn.alpha"), std::string::npos) << text;
  EXPECT_EQ(status(only(library_trace(as_float(m), ids, io::DType::f32), {})), 2);
}
