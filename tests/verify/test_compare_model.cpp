// tests/verify/test_compare_model.cpp — the model-level verdict certifies the whole model.
//
// A zoo of wrong models (each a realistic mistake of an AttnRes implementation, made by a
// separately written forward pass or by the library's model with a mistaken configuration and
// the same weights): every full trace FAILs and the first failing tensor in forward order is the
// step that makes the mistake; every logits-only trace FAILs through the end-to-end verdict.
// A zoo of correct implementations (f32, f64, bf16- and f16-stored, float accumulation and
// double accumulation, full, minimal and logits-only traces) PASSes. Traces that check nothing,
// misspelt names and traces that cannot be linked are input errors (exit 2).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include "oasis/io/npy.hpp"
#include "oasis/io/safetensors.hpp"
#include "oasis/model/io.hpp"
#include "oasis/model/wiring.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis_test.hpp"
#include "model_checker.hpp"

namespace io = oasis::io;
namespace om = oasis::model;
namespace verify = oasis::verify;
using oasis::index_t;
using oasis::RowNorm;
using oasis::SourceKind;
using oasis::Tensor;

namespace {

constexpr index_t kB = 2, kT = 5;

std::string tmp_dir(const std::string& leaf) {
  const std::string d = ::testing::TempDir() + "oasis_model_" + std::to_string(::getpid()) + "_" + leaf;
  EXPECT_EQ(std::system(("mkdir -p '" + d + "'").c_str()), 0);
  return d;
}

const char* kModelCfg =
    R"({"op": "model", "model": "model.safetensors", "inputs": "run.safetensors", "outputs": "run.safetensors"})";

// ---- the test models ----------------------------------------------------------------------------

/// Two transformer blocks, d = 16, H = 2, vocab 32, weights N(0, 0.3^2): logits of order 1.
/// theta = 0.5 (beta ~ 0.97) so that psi matters; a learned key-norm gain.
om::ModelConfig kimi_full() {
  om::ModelConfig c;
  c.init_std = 0.3;
  c.theta_init = 0.5;
  c.key_norm_gain = true;
  return c;
}
/// Block AttnRes with uneven blocks: 6 sublayers in blocks of 2, 2, 1, 1 (the last block starts
/// at an MLP sublayer).
om::ModelConfig kimi_block() {
  om::ModelConfig c = kimi_full();
  c.router = om::RouterFamily::kimi_block;
  c.n_blocks = 3;
  c.block_sizes = {2, 2, 1, 1};
  return c;
}
/// The authors' router, centring, clamps and mass-deficit psi; low-rank width 8.
om::ModelConfig authors() {
  om::ModelConfig c = om::ModelConfig::authors_profile(kimi_full());
  c.key_norm_gain = false;
  c.authors_rank = 8;
  return c;
}

/// The model of `cfg` with non-trivial routers (pseudo-queries N(0, 0.5^2), key gains 1 + N(0, 0.3^2),
/// recency +-1.2), every weight exact in float. `like`: take the weights of that model where the
/// names agree (a mistaken configuration with the same weights).
om::Model<double> test_model(const om::ModelConfig& cfg, std::uint64_t seed, const om::Model<double>* like = nullptr) {
  om::Model<double> m = om::Model<double>::initialized(cfg, seed);
  std::mt19937_64 rng(seed + 17);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (const auto& [name, t0] : m.parameters()) {
    Tensor<double> t = t0;
    auto ends = [&](const char* s) { return name.size() >= std::strlen(s) && name.compare(name.size() - std::strlen(s), std::strlen(s), s) == 0; };
    for (index_t i = 0; i < t.size(); ++i) {
      if (ends(".query")) t[i] = 0.5 * nd(rng);
      else if (ends(".key_norm.weight")) t[i] = 1.0 + 0.3 * nd(rng);
      else if (ends(".recency_bias")) t[i] = (name.find("mlp") == std::string::npos ? 1.2 : -1.2);
      t[i] = static_cast<double>(static_cast<float>(t[i]));
    }
    if (like && like->parameters().count(name)) t = like->param(name);
    m.set_param(name, t);
  }
  return m;
}

std::vector<index_t> token_ids(const om::ModelConfig& c) {
  std::vector<index_t> ids;
  for (index_t i = 0; i < kB * kT; ++i) ids.push_back((7 * i + 3) % c.vocab_size);
  return ids;
}
/// The ids as the implementation writes them: int32.
io::StoredTensor ids_tensor(const std::vector<index_t>& ids) {
  Tensor<double> t({kB, kT});
  for (index_t i = 0; i < kB * kT; ++i) t[i] = static_cast<double>(ids[static_cast<std::size_t>(i)]);
  return {io::DType::i32, t};
}

template <class T>
io::TensorMap library_trace(const om::Model<T>& m, const std::vector<index_t>& ids, io::DType dt, om::StoreFn store = nullptr) {
  om::ForwardOptions fo;
  fo.trace = true;
  fo.store = store;
  io::TensorMap t = om::trace_tensors(m.forward(ids, kB, kT, fo), dt);
  t.emplace("ids", ids_tensor(ids));
  return t;
}

double store_bf16(double x) { return io::round_to_dtype(x, io::DType::bf16); }
double store_f16(double x) { return io::round_to_dtype(x, io::DType::f16); }
double store_f32(double x) { return io::round_to_dtype(x, io::DType::f32); }

/// Keep only the named fields (by suffix) and ids.
io::TensorMap only(const io::TensorMap& t, const std::vector<std::string>& suffixes) {
  io::TensorMap o;
  for (const auto& [name, v] : t) {
    if (name == "ids") o.emplace(name, v);
    for (const auto& s : suffixes)
      if (name == s || (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
                        name[name.size() - s.size() - 1] == '.'))
        o.emplace(name, v);
  }
  return o;
}

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

// ---- running a comparison -----------------------------------------------------------------------

struct Outcome {
  verify::CompareReport rep;
  double seconds = 0;
};

Outcome compare(const std::string& dir, const om::Model<double>& weights, const io::TensorMap& trace,
            io::DType weights_dtype = io::DType::f32, verify::Oracle oracle = verify::Oracle::fast,
            verify::Policy policy = verify::Policy::probabilistic) {
  om::save_model(weights, dir + "/model.safetensors", weights_dtype);
  io::write_safetensors(dir + "/run.safetensors", trace);
  std::ofstream(dir + "/config.json") << kModelCfg;
  verify::CompareOptions opt;
  opt.oracle = oracle;
  opt.policy = policy;
  const auto t0 = std::chrono::steady_clock::now();
  Outcome r{verify::compare_config_file(dir + "/config.json", opt), 0};
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

/// The tensor named by the report's "first wrong step" note ("" when none).
std::string first_wrong(const verify::CompareReport& r) {
  const std::string tag = "first wrong step (forward order): ";
  for (const auto& n : r.notes)
    if (n.rfind(tag, 0) == 0) return n.substr(tag.size(), n.find(' ', tag.size()) - tag.size());
  return "";
}

const verify::TensorReport& find(const verify::CompareReport& r, const std::string& name) {
  for (const auto& t : r.tensors)
    if (t.name == name) return t;
  throw std::runtime_error("tensor " + name + " not in the report");
}

/// Input error: the message of the oasis::invalid_argument the comparison throws ("" if none).
std::string input_error(const std::string& dir, const om::Model<double>& weights, const io::TensorMap& trace) {
  try {
    compare(dir, weights, trace);
  } catch (const oasis::invalid_argument& e) {
    return e.what();
  }
  return "";
}

om::Model<float> as_float(const om::Model<double>& m) { return m.cast<float>(); }

/// The float32 trace of the library's model with the weights of `m` and a mistaken configuration.
io::TensorMap mistaken_trace(const om::Model<double>& m, const std::vector<index_t>& ids,
                             const std::function<void(om::ModelConfig&)>& change) {
  om::ModelConfig c = m.config();
  change(c);
  return library_trace(as_float(test_model(c, 1, &m)), ids, io::DType::f32);
}

/// The fast oracle's report gives the mp50 oracle's verdicts: the same tensors, verdicts and
/// violation counts, and for float32 and 16-bit tensors the worst ratios to a relative 1e-6 (the
/// fast ratios are taken at the double reference, within ~1e-9 of the allowance of the exact one;
/// for float64 tensors that error is of the order of the allowance).
void expect_same_verdicts(const verify::CompareReport& fast, const verify::CompareReport& mp, const std::string& what) {
  EXPECT_EQ(fast.passed, mp.passed) << what;
  ASSERT_EQ(fast.tensors.size(), mp.tensors.size()) << what;
  for (std::size_t i = 0; i < fast.tensors.size(); ++i) {
    const verify::TensorReport &f = fast.tensors[i], &m = mp.tensors[i];
    EXPECT_EQ(f.name, m.name) << what;
    EXPECT_EQ(f.passed, m.passed) << what << " " << f.name;
    EXPECT_EQ(f.violations, m.violations) << what << " " << f.name;
    if (std::isfinite(m.worst_ratio) && f.dtype != io::DType::f64)
      EXPECT_NEAR(f.worst_ratio, m.worst_ratio, 1e-6 * m.worst_ratio + 1e-12) << what << " " << f.name;
  }
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

// ---- the fast oracle ------------------------------------------------------------------------------

/// "k" of the report's oracle line "fast (...; k of n tensors recomputed in mp50)" (-1: not fast).
int recomputed_tensors(const verify::CompareReport& r) {
  const auto at = r.oracle.find("; ");
  if (r.oracle.rfind("fast", 0) != 0 || at == std::string::npos) return -1;
  return std::atoi(r.oracle.c_str() + at + 2);
}

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
