// Model backward (docs/spec.md §8): the whole AttnRes model to every parameter and to the embeddings.
// The recorded forward is Model::forward bit for bit; mp50 gradients against mp50 central
// finite differences of L = sum(logits * R) on tiny models of every router family, readout,
// variant, psi estimator and uneven blocks; norms evaluated in float32 run their backward in
// float32 (their arithmetic is checked against its derived bound in test_layers_backward.cpp);
// storage rounding is straight through; input errors and unsupported options named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <stdexcept>
#include <cstdio>
#include <string>

#include "fd_support.hpp"
#include "model_grad_support.hpp"
#include "oasis/research/quant_presets.hpp"
#include "oasis/io/dtype.hpp"

using namespace oasis;
using namespace oasis::model_grad_test;
using R = mp50;
namespace fd = oasis::test::fd;

namespace {

R loss(const Tensor<R>& logits, const Tensor<double>& w) {
  R f(0);
  for (index_t i = 0; i < logits.size(); ++i) f += logits[i] * R(w[i]);
  return f;
}

TEST(ModelBackward, RecordedForwardIsTheForward) {
  for (const ModelCase& mc : model_cases()) {
    SCOPED_TRACE(mc.name);
    const om::Model<double> m = random_model<double>(mc.cfg, base_seed());
    const LossInputs li = loss_inputs(mc, base_seed());
    om::ForwardOptions fo;
    fo.trace = true;
    const om::ForwardResult<double> f = m.forward(li.ids, mc.B, mc.T, fo);
    const om::ModelGrads<double> g = om::model_backward(m, li.ids, mc.B, mc.T, li.R);
    ASSERT_EQ(g.logits.shape(), f.logits.shape());
    for (index_t i = 0; i < f.logits.size(); ++i) ASSERT_EQ(g.logits[i], f.logits[i]) << "logit " << i;
    ASSERT_EQ(g.trace.size(), f.trace.size());
    for (std::size_t l = 0; l < f.trace.size(); ++l) EXPECT_EQ(g.trace[l].name, f.trace[l].name);
    for (const auto& spec : om::parameter_specs(mc.cfg)) EXPECT_EQ(g.params.at(spec.name).shape(), spec.shape) << spec.name;
  }
}

/// dL/dstate enters where the head's gradient does: the backward from dlogits = R equals, bit for
/// bit, the backward from dlogits = 0 and dstate = the state gradient the first one reports, in
/// every gradient but the head's own (norm.weight, lm_head.weight; the tied table). The head's
/// backward itself is checked by the finite differences.
TEST(ModelBackward, ReadoutStateGradientEntersAsTheHeads) {
  for (const ModelCase& mc : model_cases()) {
    SCOPED_TRACE(mc.name);
    const om::Model<double> m = random_model<double>(mc.cfg, base_seed());
    const LossInputs li = loss_inputs(mc, base_seed());
    const om::ModelGrads<double> g = om::model_backward(m, li.ids, mc.B, mc.T, li.R);
    const om::ModelGrads<double> h = om::model_backward(m, li.ids, mc.B, mc.T, Tensor<double>(li.R.shape()), g.state);
    for (const auto& [n, t] : g.params) {
      if (n == "norm.weight" || n == "lm_head.weight" || (mc.cfg.tie_embeddings && n == "embed_tokens.weight")) continue;
      for (index_t i = 0; i < t.size(); ++i) ASSERT_EQ(t[i], h.params.at(n)[i]) << n << "[" << i << "]";
    }
    for (index_t i = 0; i < g.embeddings.size(); ++i) ASSERT_EQ(g.embeddings[i], h.embeddings[i]);
    for (index_t i = 0; i < g.state.size(); ++i) ASSERT_EQ(g.state[i], h.state[i]);
  }
}

/// Bad input is named.
TEST(ModelBackward, BadInputIsNamed) {
  const ModelCase mc = model_cases()[0];
  const om::Model<double> m = random_model<double>(mc.cfg, base_seed());
  const LossInputs li = loss_inputs(mc, base_seed());
  auto throws_naming = [](const std::function<void()>& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "no error; expected one naming " << what;
    } catch (const oasis::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  throws_naming([&] { (void)om::model_backward(m, li.ids, mc.B, mc.T, Tensor<double>({mc.B, mc.T})); }, "dlogits");
  Tensor<double> nan = li.R;
  nan[3] = std::nan("");
  throws_naming([&] { (void)om::model_backward(m, li.ids, mc.B, mc.T, nan); }, "dlogits");
  throws_naming([&] { (void)om::model_backward(m, li.ids, mc.B, mc.T, li.R, Tensor<double>({mc.B, mc.T, 3})); }, "dstate");
  om::ModelConfig gated = mc.cfg;
  gated.gated_attention = true;
  throws_naming([&] { (void)om::model_backward(om::Model<double>::initialized(gated, 1), li.ids, mc.B, mc.T, li.R); },
                "gated_attention");
  om::ModelConfig sink = mc.cfg;
  sink.prefix_sink = true;
  throws_naming([&] { (void)om::model_backward(om::Model<double>::initialized(sink, 1), li.ids, mc.B, mc.T, li.R); },
                "prefix_sink");
  om::ModelConfig clipped = mc.cfg;
  clipped.token_normalizer = RowNorm::clipped_softmax;
  throws_naming([&] { (void)om::model_backward(om::Model<double>::initialized(clipped, 1), li.ids, mc.B, mc.T, li.R); },
                "token_normalizer");
  const oasis::WAQuantConfig w8 = oasis::wa_preset("W8A8-dynamic");
  om::ForwardOptions quant;
  quant.quant = &w8;
  throws_naming([&] { (void)om::model_backward(m, li.ids, mc.B, mc.T, li.R, {}, quant); }, "quant");
  om::ForwardOptions bound;
  bound.error_u = oasis::unit_roundoff<double>();
  throws_naming([&] { (void)om::model_backward_embeddings(m, li.x, li.R, {}, bound); }, "error_u");
}

/// Every norm evaluated in float32 (norm_float32): the backward of those norms runs in float32
/// too (the casts taken as identity), so in a double model dL/d a sublayer's input through its own
/// function — the backward of its pre-norm, grad_input — is a float32 value everywhere; with the
/// flag off it is not. (The float32 evaluation is not smooth at mp50's resolution: no finite
/// differences; its arithmetic is checked against its derived bound in test_layers_backward.cpp.)
TEST(ModelBackward, Float32NormsRunTheirBackwardInFloat32) {
  const ModelCase mc = case_named("kimi_full_norm_float32");
  const LossInputs li = loss_inputs(mc, base_seed());
  const om::Model<double> m = random_model<double>(mc.cfg, base_seed());
  om::ModelConfig plain_cfg = mc.cfg;
  plain_cfg.norm_float32 = false;
  om::Model<double> plain(plain_cfg);
  for (const auto& [n, t] : m.parameters()) plain.set_param(n, t);
  auto float_values = [](const om::ModelGrads<double>& g) {
    long total = 0, fl = 0;
    for (const auto& tr : g.trace)
      for (index_t i = 0; i < tr.grad_input.size(); ++i) {
        ++total;
        fl += static_cast<double>(static_cast<float>(tr.grad_input[i])) == tr.grad_input[i];
      }
    return std::make_pair(fl, total);
  };
  const auto [f32, n32] = float_values(om::model_backward(m, li.ids, mc.B, mc.T, li.R));
  const auto [f64, n64] = float_values(om::model_backward(plain, li.ids, mc.B, mc.T, li.R));
  EXPECT_GT(n32, 0);
  EXPECT_EQ(f32, n32) << "grad_input entries that are not float32 values with norm_float32";
  EXPECT_LT(f64, n64 / 2) << "without norm_float32 the pre-norm backward is not evaluated in float32";
}

/// Storage rounding (ForwardOptions::store) is differentiated straight through: the identity
/// rounding changes no gradient (bitwise); with bfloat16 storage the backward is taken at the
/// stored forward — its logits are Model::forward's under the same rounding, bit for bit — and
/// its gradients differ from the plain backward's. (That each step's backward reads the stored
/// values: test_layers_backward.cpp.)
TEST(ModelBackward, StorageRoundingIsStraightThrough) {
  for (const char* name : {"kimi_full_oasis_final", "kimi_blocks_2211", "kimi_block2_oasis_sum_mass", "authors_oasis",
                           "original"}) {
    SCOPED_TRACE(name);
    const ModelCase mc = case_named(name);
    const om::Model<float> m = random_model<float>(mc.cfg, base_seed());
    const LossInputs li = loss_inputs(mc, base_seed());
    const Tensor<float> dl = li.R.cast<float>();
    const om::ModelGrads<float> plain = om::model_backward(m, li.ids, mc.B, mc.T, dl);
    om::ForwardOptions same;
    same.store = [](double x) { return x; };
    const om::ModelGrads<float> id = om::model_backward(m, li.ids, mc.B, mc.T, dl, {}, same);
    for (const auto& [n, t] : plain.params)
      for (index_t i = 0; i < t.size(); ++i) ASSERT_EQ(t[i], id.params.at(n)[i]) << n << "[" << i << "]";
    for (index_t i = 0; i < plain.embeddings.size(); ++i) ASSERT_EQ(plain.embeddings[i], id.embeddings[i]);
    om::ForwardOptions bf;
    bf.store = [](double x) { return oasis::io::round_to_dtype(x, oasis::io::DType::bf16); };
    const om::ModelGrads<float> g = om::model_backward(m, li.ids, mc.B, mc.T, dl, {}, bf);
    const Tensor<float> fwd = m.forward(li.ids, mc.B, mc.T, bf).logits;
    for (index_t i = 0; i < fwd.size(); ++i) ASSERT_EQ(g.logits[i], fwd[i]) << "logit " << i;
    double changed = 0;
    for (const auto& [n, t] : plain.params)
      for (index_t i = 0; i < t.size(); ++i) changed = std::max(changed, std::abs(static_cast<double>(g.params.at(n)[i] - t[i])));
    EXPECT_GT(changed, 0.0);
  }
}

// ---- finite differences ---------------------------------------------------------------------------
//
// For a coordinate x of a parameter (or of the input embeddings) the central difference
// D(h) = (L(x + h) - L(x - h)) / 2h in mp50 satisfies |D(h) - dL/dx| <= h^2/6 M3 + delta_f / h
// + 2 u50 |D| + delta_g (docs/tolerances.md, "Finite differences"), where
//   h       per case, the power of two nearest to (3 delta_f / M3)^(1/3), which minimises
//             h^2/6 M3 + delta_f / h, within [2^-64, 2^-24] (x +- h exact in mp50: the parameters
//             and embeddings are doubles below 2^3); theta, which the model holds in double,
//             uses at least 2^-40 (theta is a multiple of 2^-5). delta_f grows with depth (the
//             forward bound composes over the sublayers), so a fixed tiny h would leave deeper
//             models a vacuous delta_f / h;
//   delta_f the rounding error of one evaluation of L in mp50, derived: the model's first-order
//             forward error bound of the logits (ForwardOptions::error_u, docs/model.md) with
//             u = 4 u50 (it assumes exp, log, sin, cos within 2u: 4 u50 allows Boost's functions
//             8 ulp), times sum_v |R|, plus the loss's own sum (N V u50 sum |logit R|);
//   delta_g the analytic gradient's own mp50 rounding, taken as 1e4 delta_f (the backward is a
//             few times longer than the forward; it is ~1e-45, far below every other term);
//   M3      a bound on the third derivative of L on [x - h, x + h]. The model is a long
//             composition and no closed form is derived: the test takes M3 = 1e8 and checks this
//             assumption at every coordinate with the estimate 3 (L(x + k) - L(x - k) - 2k D(h)) / k^3,
//             k = 2^-10, requiring it to be at most 1e-3 M3 (the estimates stay below 1e5: the
//             assumption has three orders of margin where the truncation term is as large as
//             delta_f / h, and more where h is smaller).
// A test point lies away from every kink: the authors' clamps (|g| < 50, beta < 10) and the mass
// deficit's max(0, .) (p_null > 0) are inactive at these scales (asserted).

constexpr double kM3 = 1e8;

/// The finite-difference step of a case with rounding bound delta_f (theta: the coordinate held in double).
double fd_step(double delta_f, bool theta) {
  const double best = std::cbrt(3 * delta_f / kM3);
  const double h = std::clamp(std::exp2(std::round(std::log2(best))), 0x1p-64, 0x1p-24);
  return theta ? std::max(h, 0x1p-40) : h;
}

/// Which parameter tensors a case checks: every router and head tensor, the q/k norm of one block,
/// and three of the nine per-block weight kinds, rotating with the case index (every kind is
/// checked by several cases).
std::vector<std::string> fd_tensors(const om::ModelConfig& cfg, std::size_t case_index, std::mt19937_64& rng) {
  static const char* kBlockKinds[] = {"attn_norm.weight", "attn.q_proj.weight", "attn.k_proj.weight",
                                      "attn.v_proj.weight", "attn.o_proj.weight", "mlp_norm.weight",
                                      "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
  std::vector<std::string> names;
  const index_t b = static_cast<index_t>(rng() % static_cast<std::uint64_t>(cfg.n_blocks));
  const std::string L = "layers." + std::to_string(b) + ".";
  for (int k = 0; k < 3; ++k) names.push_back(L + kBlockKinds[(3 * case_index + static_cast<std::size_t>(k)) % 9]);
  for (const auto& spec : om::parameter_specs(cfg)) {
    const std::string& n = spec.name;
    const bool in_block = n.rfind("layers.", 0) == 0, router = n.find("_res.") != std::string::npos;
    const bool qk = n.find("q_norm") != std::string::npos || n.find("k_norm") != std::string::npos;
    if (in_block && !router && !(qk && n.rfind(L, 0) == 0)) continue;
    names.push_back(n);  // routers of every block, the q/k norm of block b, embedding, final router, norm, head
  }
  return names;
}

struct FdPoint {
  R D, third;
  double tol;
};

/// D(h), the third-derivative estimate and the tolerance along one coordinate, eval(tau) = L(x + tau).
FdPoint fd_point(const std::function<R(const R&)>& eval, double h, double delta_f) {
  const R hh(h), k(0x1p-10);
  const R D = (eval(hh) - eval(-hh)) / (2 * hh);
  const R third = 3 * (eval(k) - eval(-k) - 2 * k * D) / (k * k * k);
  const double u = fd::u50();
  const double tol = h * h / 6 * kM3 + delta_f / h + 2 * u * std::abs(static_cast<double>(D)) + 1e4 * delta_f;
  return {D, third, tol};
}

/// delta_f: the derived rounding bound of one mp50 evaluation of L at the model's point.
double loss_rounding(const om::Model<R>& m, const std::function<om::ForwardResult<R>(const om::ForwardOptions&)>& fwd,
                     const Tensor<double>& w) {
  om::ForwardOptions fo;
  fo.error_u = 4 * fd::u50();
  const om::ForwardResult<R> f = fwd(fo);
  const index_t V = m.config().vocab_size, N = w.size() / V;
  double df = 0, abs_sum = 0;
  for (index_t r = 0; r < N; ++r) {
    double rs = 0;
    for (index_t v = 0; v < V; ++v) {
      rs += std::abs(w[r * V + v]);
      abs_sum += std::abs(static_cast<double>(f.logits[r * V + v]) * w[r * V + v]);
    }
    df += f.logit_error[static_cast<std::size_t>(r)] * rs;
  }
  return df + static_cast<double>(N * V) * fd::u50() * abs_sum;
}

/// The points of the tests lie away from the kinks (authors' clamps; the mass deficit at 0).
void expect_away_from_kinks(const om::Model<R>& m, const std::vector<index_t>& ids, index_t B, index_t T) {
  om::ForwardOptions fo;
  fo.trace = true;
  const om::ForwardResult<R> f = m.forward(ids, B, T, fo);
  for (const auto& tr : f.trace) {
    for (index_t i = 0; i < tr.g.size(); ++i) EXPECT_LT(std::abs(static_cast<double>(tr.g[i])), 49.0) << tr.name;
    for (index_t i = 0; i < tr.g_old.size(); ++i) EXPECT_LT(std::abs(static_cast<double>(tr.g_old[i])), 49.0) << tr.name;
    EXPECT_LT(tr.beta, 9.0) << tr.name;
    if (m.config().token_norm() == RowNorm::softmax1)
      for (index_t i = 0; i < tr.p_null.size(); ++i) EXPECT_GT(static_cast<double>(tr.p_null[i]), 1e-6) << tr.name;
  }
}

TEST(ModelBackward, FiniteDifferencesEveryFamily) {
  const std::vector<ModelCase> cases = model_cases();
  double worst = 0, worst_third = 0, h_min = 1, h_max = 0;
  long checked = 0;
  for (std::size_t ci = 0; ci < cases.size(); ++ci) {
    const ModelCase& mc = cases[ci];
    if (!mc.smooth) continue;
    SCOPED_TRACE(mc.name + " (seed " + std::to_string(base_seed()) + ", OASIS_GRAD_SEED)");
    om::Model<R> m = random_model<R>(mc.cfg, base_seed() + ci);
    const LossInputs li = loss_inputs(mc, base_seed() + ci);
    expect_away_from_kinks(m, li.ids, mc.B, mc.T);
    const om::ModelGrads<R> g = om::model_backward(m, li.ids, mc.B, mc.T, li.R.cast<R>());
    const double delta_f =
        loss_rounding(m, [&](const om::ForwardOptions& o) { return m.forward(li.ids, mc.B, mc.T, o); }, li.R);
    auto rng = oasis::test::make_rng(base_seed() + 100 + ci);
    h_min = std::min(h_min, fd_step(delta_f, false));
    h_max = std::max(h_max, fd_step(delta_f, false));
    fd::Summary s;
    auto check = [&](const std::string& label, const R& analytic, const FdPoint& p) {
      s.add(label, analytic, p.D, p.tol);
      const double t3 = std::abs(static_cast<double>(p.third));
      worst_third = std::max(worst_third, t3);
      EXPECT_LE(t3, 1e-3 * kM3) << label << ": the smoothness assumption M3 = " << kM3 << " fails at this point";
    };
    for (const std::string& name : fd_tensors(mc.cfg, ci, rng)) {
      const Tensor<R> x0 = m.param(name);
      const index_t i = static_cast<index_t>(rng() % static_cast<std::uint64_t>(x0.size()));
      const bool theta = name.size() > 6 && name.compare(name.size() - 6, 6, ".theta") == 0;
      const FdPoint p = fd_point(
          [&](const R& tau) {
            Tensor<R> x = x0;
            x[i] += tau;
            m.set_param(name, x);
            const R f = loss(m.forward(li.ids, mc.B, mc.T).logits, li.R);
            m.set_param(name, x0);
            return f;
          },
          fd_step(delta_f, theta), delta_f);
      check(name + "[" + std::to_string(i) + "]", g.params.at(name)[i], p);
    }
    {  // one coordinate of the input embeddings (Model::forward_embeddings)
      const Tensor<R> x0 = li.x.cast<R>();
      const om::ModelGrads<R> ge = om::model_backward_embeddings(m, x0, li.R.cast<R>());
      const double df_x = loss_rounding(m, [&](const om::ForwardOptions& o) { return m.forward_embeddings(x0, o); }, li.R);
      const index_t i = static_cast<index_t>(rng() % static_cast<std::uint64_t>(x0.size()));
      const FdPoint p = fd_point(
          [&](const R& tau) {
            Tensor<R> x = x0;
            x[i] += tau;
            return loss(m.forward_embeddings(x).logits, li.R);
          },
          fd_step(df_x, false), df_x);
      check("embeddings[" + std::to_string(i) + "]", ge.embeddings[i], p);
    }
    EXPECT_TRUE(s.ok()) << s.failed << " of " << s.checked << " gradients off:\n" << s.first;
    worst = std::max(worst, s.worst_ratio);
    checked += s.checked;
  }
  std::printf("model backward vs mp50 finite differences: %ld gradients, worst |analytic - FD| / tol = %.3g, "
              "worst third-derivative estimate %.3g (assumed M3 = %.0e), steps h in [2^%.0f, 2^%.0f]\n",
              checked, worst, worst_third, kM3, std::log2(h_min), std::log2(h_max));
}

// ---- the zoo ------------------------------------------------------------------------------------

std::size_t case_index(const std::string& name) {
  const std::vector<ModelCase> cases = model_cases();
  for (std::size_t i = 0; i < cases.size(); ++i)
    if (cases[i].name == name) return i;
  throw std::runtime_error("no model case " + name);
}

TEST(ModelBackwardZoo, WithoutMistakeTheSeamsChangeNothing) {
  for (const ModelCase& mc : model_cases()) {
    const om::Model<double> m = random_model<double>(mc.cfg, base_seed());
    const LossInputs li = loss_inputs(mc, base_seed());
    const om::ModelGrads<double> a = om::model_backward(m, li.ids, mc.B, mc.T, li.R);
    const om::ModelGrads<double> b = mutant_backward(m, li.ids, mc.B, mc.T, li.R, ModelMutant::none);
    for (const auto& [n, t] : a.params)
      for (index_t i = 0; i < t.size(); ++i) ASSERT_EQ(t[i], b.params.at(n)[i]) << mc.name << " " << n << "[" << i << "]";
  }
}

/// Every mutant differs from the oracle somewhere; at the coordinate where it differs most
/// relative to the finite difference's tolerance there (fd_point's, with |D| taken as the
/// oracle's gradient) the mp50 finite difference agrees with the oracle within its tolerance and
/// rejects the mutant.
TEST(ModelBackwardZoo, FiniteDifferencesRejectEveryMutant) {
  for (const auto& [mu, cname] : mutant_cases()) {
    const ModelCase mc = case_named(cname);
    const std::size_t ci = case_index(cname);
    SCOPED_TRACE(std::string(name_of(mu)) + " on " + cname);
    om::Model<R> m = random_model<R>(mc.cfg, base_seed() + ci);
    const LossInputs li = loss_inputs(mc, base_seed() + ci);
    const om::ModelGrads<R> g = om::model_backward(m, li.ids, mc.B, mc.T, li.R.cast<R>());
    const om::ModelGrads<R> gm = mutant_backward(m, li.ids, mc.B, mc.T, li.R.cast<R>(), mu);
    const double delta_f =
        loss_rounding(m, [&](const om::ForwardOptions& o) { return m.forward(li.ids, mc.B, mc.T, o); }, li.R);
    auto is_theta = [](const std::string& n) { return n.size() > 6 && n.compare(n.size() - 6, 6, ".theta") == 0; };
    std::string name;
    index_t at = 0;
    double worst = 0;
    for (const auto& [n, t] : g.params) {
      const double h = fd_step(delta_f, is_theta(n));
      for (index_t i = 0; i < t.size(); ++i) {
        const double tol = h * h / 6 * kM3 + delta_f / h + 2 * fd::u50() * std::abs(static_cast<double>(t[i])) + 1e4 * delta_f;
        const double rel = std::abs(static_cast<double>(gm.params.at(n)[i] - t[i])) / tol;
        if (rel > worst) { worst = rel; name = n; at = i; }
      }
    }
    ASSERT_GT(worst, 10.0) << "the mistake changes no parameter gradient beyond the finite differences' resolution";
    const Tensor<R> x0 = m.param(name);
    const bool theta = is_theta(name);
    const FdPoint p = fd_point(
        [&](const R& tau) {
          Tensor<R> x = x0;
          x[at] += tau;
          m.set_param(name, x);
          const R f = loss(m.forward(li.ids, mc.B, mc.T).logits, li.R);
          m.set_param(name, x0);
          return f;
        },
        fd_step(delta_f, theta), delta_f);
    fd::Summary ok, bad;
    const std::string label = name + "[" + std::to_string(at) + "]";
    ok.add(label, g.params.at(name)[at], p.D, p.tol);
    bad.add(label, gm.params.at(name)[at], p.D, p.tol);
    EXPECT_TRUE(ok.ok()) << ok.first;
    EXPECT_FALSE(bad.ok()) << "the finite difference does not see the mistake at " << label;
    std::printf("  %-44s %-30s at %-34s |mutant - FD| / tol = %.3g\n", name_of(mu), cname.c_str(), label.c_str(),
                bad.worst_ratio);
  }
}

}  // namespace
