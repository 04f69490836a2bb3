// src/verify/model_grad_sublayer_steps.cpp — the local backward steps of the model's attention and
// MLP sublayers (docs/verify-model.md, "Local backward steps"). A sublayer whose trace holds what it
// read (.input) and the cotangents it received (.grad_output; .grad_branch_psi for an attention
// sublayer whose psi some router reads) is judged on exactly those tensors: its .grad_input
// (through the sublayer only) and its parameters' gradients, against the oracle's sublayer backward
// (attention_sublayer_backward, mlp_sublayer_backward of oasis/grad/layers_backward.hpp) on the
// traced tensors, under the gradient parity rule per row (model_grad_parity.hpp) whose six replays
// are that sublayer's backward alone, in the tensor's precision. The reference is exact as the
// end-to-end rows' is (op_model_grad.cpp): the double sublayer backward within an error estimated
// from the float replays (fast oracle, float32 gradients), then mp50 for a step it leaves undecided
// (within --mp50-budget), or mp50 throughout. The composed bound of a
// whole sublayer's backward (projections, RoPE, norms around the attention core) is not derived:
// the rule is a parity rule, as the end-to-end rows'; but its replays see only the step's own
// rounding, so a wrong step is named where it is made.
#include <cfenv>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "matrix_products.hpp"
#include "model_grad_parity.hpp"
#include "op_model_grad.hpp"
#include "progress.hpp"
#include "oasis/grad/layers_backward.hpp"
#include "oasis/model/router.hpp"
#include "oasis/model/schedule.hpp"

namespace oasis::verify::detail {

namespace om = oasis::model;

namespace {

/// One sublayer's backward in T on the traced input h [N, d], cotangent dout [N, d] and, for an
/// attention sublayer, dpsi [B, Tn] (empty: 0): its gradients by report name.
template <class T>
std::map<std::string, Tensor<T>> sublayer_grads(const om::Model<T>& m, const om::WiredSublayer& S, index_t B, index_t Tn,
                                                const Tensor<T>& h, const Tensor<T>& dout, const Tensor<T>& dpsi) {
  const om::MatrixProducts* mp = std::is_same_v<T, mp50> ? nullptr : &matrix_products();
  const om::ModelConfig& cfg = m.config();
  const std::string L = "grad.layers." + std::to_string(S.block);
  std::map<std::string, Tensor<T>> g;
  const Shape btd{B, Tn, cfg.d_model};
  if (S.kind == om::SublayerKind::attention) {
    om::AttentionSublayerGrads<T> a = om::attention_sublayer_backward(h, B, Tn, m.attn_weights(S.block), cfg, dout, dpsi, nullptr, mp);
    g[S.name + ".grad_input"] = a.h.reshaped(btd);
    g[L + ".attn_norm.weight"] = std::move(a.norm);
    g[L + ".attn.q_proj.weight"] = std::move(a.wq);
    g[L + ".attn.k_proj.weight"] = std::move(a.wk);
    g[L + ".attn.v_proj.weight"] = std::move(a.wv);
    g[L + ".attn.o_proj.weight"] = std::move(a.wo);
    if (cfg.qk_norm) {
      g[L + ".attn.q_norm.weight"] = std::move(a.q_norm);
      g[L + ".attn.k_norm.weight"] = std::move(a.k_norm);
    }
  } else {
    om::MlpSublayerGrads<T> a = om::mlp_sublayer_backward(h, m.mlp_weights(S.block), cfg, dout, nullptr, mp);
    g[S.name + ".grad_input"] = a.h.reshaped(btd);
    g[L + ".mlp_norm.weight"] = std::move(a.norm);
    g[L + ".mlp.gate_proj.weight"] = std::move(a.gate);
    g[L + ".mlp.up_proj.weight"] = std::move(a.up);
    g[L + ".mlp.down_proj.weight"] = std::move(a.down);
  }
  return g;
}

/// The names of the gradients one sublayer's step gives (sublayer_grads' keys).
std::vector<std::string> step_gradient_names(const om::ModelConfig& cfg, const om::WiredSublayer& S) {
  const std::string L = "grad.layers." + std::to_string(S.block);
  std::vector<std::string> n{S.name + ".grad_input"};
  if (S.kind == om::SublayerKind::attention) {
    for (const char* p : {".attn_norm.weight", ".attn.q_proj.weight", ".attn.k_proj.weight", ".attn.v_proj.weight",
                          ".attn.o_proj.weight"})
      n.push_back(L + p);
    if (cfg.qk_norm)
      for (const char* p : {".attn.q_norm.weight", ".attn.k_norm.weight"}) n.push_back(L + p);
  } else {
    for (const char* p : {".mlp_norm.weight", ".mlp.gate_proj.weight", ".mlp.up_proj.weight", ".mlp.down_proj.weight"})
      n.push_back(L + p);
  }
  return n;
}

/// The six replays' largest row errors against `ref`, per gradient name, of one sublayer's backward
/// in T (model_grad_parity.hpp): each rounding direction, of the cotangents whole and split exactly
/// (the step is linear in (dout, dpsi)).
template <class T, class R>
std::map<std::string, std::vector<double>> sublayer_row_errors(const om::Model<T>& m, const om::WiredSublayer& S,
                                                               index_t B, index_t Tn, const Tensor<T>& h,
                                                               const Tensor<T>& dout, const Tensor<T>& dpsi,
                                                               const std::map<std::string, Tensor<R>>& ref) {
  const auto [hi, lo] = split_cotangent(dout);
  std::pair<Tensor<T>, Tensor<T>> phi{dpsi, dpsi};
  if (!dpsi.empty()) phi = split_cotangent(dpsi);
  std::map<std::string, std::vector<double>> dev;
  for (int mode : {FE_TONEAREST, FE_UPWARD, FE_DOWNWARD}) {
    const RoundingMode rm(mode);
    for (const auto& [n, t] : sublayer_grads(m, S, B, Tn, h, dout, dpsi)) add_row_deviation(dev[n], t, ref.at(n));
    std::map<std::string, Tensor<T>> a = sublayer_grads(m, S, B, Tn, h, hi, phi.first);
    const std::map<std::string, Tensor<T>> b = sublayer_grads(m, S, B, Tn, h, lo, phi.second);
    for (auto& [n, t] : a) {
      const Tensor<T>& x = b.at(n);
      for (index_t i = 0; i < t.size(); ++i) t[i] += x[i];
      add_row_deviation(dev[n], t, ref.at(n));
    }
  }
  return dev;
}

/// One sublayer step's rows against the mp50 reference (replays in each judged tensor's precision).
std::vector<TensorReport> mp50_step(const om::Model<double>& md, const om::Model<mp50>& m, const om::WiredSublayer& S,
                                    index_t B, index_t Tn, const Tensor<double>& h, const Tensor<double>& dy,
                                    const Tensor<double>& dp, const std::vector<std::string>& judged,
                                    const io::TensorMap& outputs, const CompareOptions& opt) {
  const std::map<std::string, Tensor<mp50>> ref = sublayer_grads(m, S, B, Tn, h.cast<mp50>(), dy.cast<mp50>(), dp.cast<mp50>());
  std::map<std::string, std::vector<double>> dev32, dev64;
  std::vector<TensorReport> rows;
  for (const std::string& n : judged) {
    const io::StoredTensor& got = outputs.at(n);
    const bool wide = got.dtype == io::DType::f64;
    std::map<std::string, std::vector<double>>& dev = wide ? dev64 : dev32;
    if (dev.empty())
      dev = wide ? sublayer_row_errors(md, S, B, Tn, h, dy, dp, ref)
                 : sublayer_row_errors(md.cast<float>(), S, B, Tn, h.cast<float>(), dy.cast<float>(), dp.cast<float>(), ref);
    rows.push_back(parity_rows(n, got, dev.at(n), ref.at(n), B * Tn, opt.show));
  }
  return rows;
}

/// Multiply-adds and bytes of one sublayer's mp50 backward (its forward recomputation included).
std::pair<double, double> step_cost(const om::ModelConfig& c, const om::WiredSublayer& S, index_t B, index_t Tn) {
  const double n = static_cast<double>(B * Tn), d = static_cast<double>(c.d_model), f = static_cast<double>(c.d_ff);
  const double per_token = S.kind == om::SublayerKind::attention ? 4 * d * d + 2 * static_cast<double>(Tn) * d : 3 * d * f;
  return {4.0 * per_token * n, static_cast<double>(sizeof(mp50)) * (20 * n * std::max(d, f) + 4 * per_token)};
}

}  // namespace

void check_sublayer_backward_steps(const om::Model<double>& md, const std::function<const om::Model<mp50>&()>& mp,
                                   index_t B, index_t Tn, const io::TensorMap& outputs, const CompareOptions& opt,
                                   CompareReport& rep, std::map<std::string, std::string>& step_of,
                                   std::vector<StepVerdict>& verdicts) {
  const om::ModelConfig& cfg = md.config();
  const om::ForwardSchedule sched = om::forward_schedule(cfg);
  const index_t N = B * Tn, d = cfg.d_model;
  // the branch psi is read when a router couples (attention candidates carry it)
  bool psi_read = false;
  for (const auto& r : sched.wiring.routers) psi_read = psi_read || om::router_depth_options(cfg, md.theta_of(r.params)).coupling;
  auto get = [&](const std::string& name) -> const io::StoredTensor* {
    const auto it = outputs.find(name);
    return it == outputs.end() ? nullptr : &it->second;
  };
  std::unique_ptr<om::Model<float>> m32;
  std::vector<std::string> skipped;
  for (std::size_t i = 0; i < sched.steps.size(); ++i) {
    const om::ScheduledStep& step = sched.steps[i];
    if (step.kind != om::ScheduledStep::Kind::sublayer) continue;
    const om::WiredSublayer& S = sched.wiring.sublayers[static_cast<std::size_t>(step.index)];
    const bool attn = S.kind == om::SublayerKind::attention;
    const io::StoredTensor *in = get(S.name + ".input"), *dout = get(S.name + ".grad_output"),
                           *dpsi = attn ? get(S.name + ".grad_branch_psi") : nullptr;
    std::vector<std::string> judged;  // the step's gradients the outputs hold
    bool all32 = true;
    for (const std::string& n : step_gradient_names(cfg, S))
      if (outputs.count(n)) {
        judged.push_back(n);
        all32 = all32 && outputs.at(n).dtype == io::DType::f32;
      }
    if (judged.empty()) continue;
    const bool complete = in && dout && in->values.size() == N * d && dout->values.size() == N * d &&
                          (!dpsi || dpsi->values.size() == N) && (!attn || !psi_read || dpsi);
    if (!complete) {
      if (dout) skipped.push_back(S.name);  // a backward trace of this step without all it reads
      continue;
    }
    progress_stage("gradients: step " + S.name);
    const Tensor<double> h = in->values.reshaped({N, d}), dy = dout->values.reshaped({N, d}),
                         dp = dpsi ? dpsi->values.reshaped({B, Tn}) : Tensor<double>();
    std::vector<TensorReport> rows;
    std::string oracle = "mp50";
    if (opt.oracle == Oracle::fast && fast_oracle_applies(cfg) && all32) {
      const std::map<std::string, Tensor<double>> ref = sublayer_grads(md, S, B, Tn, h, dy, dp);
      if (!m32) m32 = std::make_unique<om::Model<float>>(md.cast<float>());
      const auto dev = sublayer_row_errors(*m32, S, B, Tn, h.cast<float>(), dy.cast<float>(), dp.cast<float>(), ref);
      const bool need_mp50 = fast_parity_rows(
          judged, outputs, dev, [&](const std::string& n) -> const Tensor<double>& { return ref.at(n); }, N, opt.show, rows);
      oracle = "fast: double, its row error estimated from the float replays";
      const auto [work, bytes] = step_cost(cfg, S, B, Tn);
      if (need_mp50 && mp50_fits(rep, work, bytes, opt, "sublayer " + S.name + "'s backward step")) {
        rows.clear();
        oracle = "mp50 (rows the fast oracle left undecided)";
      }
    }
    if (rows.empty()) rows = mp50_step(md, mp(), S, B, Tn, h, dy, dp, judged, outputs, opt);
    const std::string how = "sublayer " + S.name + "'s backward on its traced input, grad_output" +
                            std::string(dpsi ? " and grad_branch_psi" : "") +
                            " (parity per row, six replays of the sublayer alone; oracle " + oracle + ")";
    bool passed = true;
    for (TensorReport& t : rows) {
      t.name += " (backward step)";
      step_of[t.name] = how;
      passed = passed && t.passed;
      rep.tensors.push_back(std::move(t));
    }
    verdicts.push_back({static_cast<index_t>(i), "sublayer " + S.name, passed});
  }
  if (!skipped.empty()) {
    std::string s;
    for (const auto& x : skipped) s += (s.empty() ? "" : ", ") + x;
    rep.notes.push_back("sublayer backward steps not checked locally (the trace lacks .input, or .grad_branch_psi of an "
                        "attention sublayer whose psi a router reads): " + s);
  }
}

}  // namespace oasis::verify::detail
