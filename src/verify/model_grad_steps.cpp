// src/verify/model_grad_steps.cpp — the local backward steps of the model's depth routers
// (docs/verify-model.md, "Local backward steps"). Each router whose trace holds its forward inputs
// (.sources, .g_old, and .psi when it couples) and the cotangent it received (.grad_routed) is
// judged as a step on exactly those tensors, under the gradient ops' policy:
//   .grad_g_old, .grad_psi,     op depth_backward (depth_backward_report);
//   grad.<router>.theta
//   .grad_sources (Kimi)        the mix alpha_i dh plus the keys' part, the pseudo-query backward of
//                               the traced .grad_g_old (the router's w and gain): the sum of the two
//                               ops' references and bounds;
//   grad.<router>.query,        that pseudo-query backward's grad_w and grad_gain.
//   grad.<router>.key_norm.weight
// Rows are named "<tensor> (backward step)"; note_first_wrong_step names the first wrong step
// (routers and sublayers, model_grad_sublayer_steps.cpp) in backward order and the last correct
// one before it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "attn_res_support.hpp"
#include "op_model_grad.hpp"
#include "ops.hpp"
#include "oasis/grad/grad.hpp"
#include "oasis/model/router.hpp"
#include "oasis/model/schedule.hpp"
#include "oasis/model/wiring.hpp"

namespace oasis::verify::detail {

namespace om = oasis::model;

namespace {

/// One Kimi router's traced tensors as the ops take them ([n, N, d], [n, N], [N, d]).
struct RouterStep {
  Tensor<double> sources, g_old, psi, dh, dg;  ///< dg: the traced grad_g_old (the keys' cotangent)
  Tensor<double> w, gain;
  std::vector<SourceKind> kinds;
  DepthOptions opt;
  KeyNormOptions key_norm;
};

/// The step's gradients from the forward `f` on the traced inputs: grad_sources, alpha_i dh_c (the
/// mix) plus the keys' part; grad_w and grad_gain, the keys' (the pseudo-query backward of the
/// traced grad_g_old).
template <class T>
struct KimiStepGrads {
  Tensor<T> sources, w, gain;
};

template <class T>
KimiStepGrads<T> kimi_step_gradients(const RouterStep& s, const DepthRoute<T>& f) {
  const index_t n = s.sources.dim(0), N = s.sources.dim(1), d = s.sources.dim(2);
  PseudoQueryGrads<T> k = pseudo_query_logits_backward(s.sources.cast<T>(), s.w.cast<T>(), s.gain.cast<T>(),
                                                       s.dg.cast<T>(), s.key_norm);
  for (index_t i = 0; i < n; ++i)
    for (index_t t = 0; t < N; ++t)
      for (index_t c = 0; c < d; ++c) k.sources(i, t, c) += f.alpha(i, t) * T(s.dh(t, c));
  return {std::move(k.sources), std::move(k.w), std::move(k.gain)};
}

/// The bounds of kimi_step_gradients in T: grad_sources the depth backward's mix part plus the
/// pseudo-query backward's keys part, grad_w and grad_gain the keys' alone (lambda = 0: worst case;
/// > 0: probabilistic); `f` as in depth_route_backward_bounds (exact, or double with ref_u).
template <class T, class R>
BoundMap kimi_step_bounds(const RouterStep& s, const DepthRoute<R>& f, double lambda, double ref_u) {
  const Tensor<T> src = s.sources.cast<T>();
  Tensor<double> b = bounds::depth_route_backward_bounds(src, s.g_old.cast<T>(), s.psi.cast<T>(), s.kinds, s.opt,
                                                         DepthCotangents<T>{s.dh.cast<T>(), {}, {}}, f, nullptr, lambda, ref_u)
                         .sources;
  bounds::PseudoQueryBackwardBounds k =
      keys_backward_bounds<T>(src, s.w.cast<T>(), s.gain.cast<T>(), s.dg.cast<T>(), s.key_norm, lambda, nullptr);
  for (index_t i = 0; i < b.size(); ++i) b[i] += k.sources[i];
  return {{"grad_sources", std::move(b)}, {"grad_w", std::move(k.w)}, {"grad_gain", std::move(k.gain)}};
}

/// The grad_sources, grad_w and grad_gain (those in `out`) of a Kimi router's step: the fast double
/// oracle (its own bounds folded in), then mp50 within the budget for what it leaves undecided (a
/// norm evaluated in float32: mp50 only).
CompareReport kimi_step(const RouterStep& s, const io::TensorMap& out, const CompareOptions& opt) {
  const bool use_prob = opt.policy != Policy::worst_case;
  auto bounds_from = [&](const auto& f, double ref_u, double lambda) {
    return [&s, &f, ref_u, lambda](bool wide) {
      BoundMap m = wide ? kimi_step_bounds<double>(s, f, lambda, ref_u) : kimi_step_bounds<float>(s, f, lambda, ref_u);
      if (wide && lambda > 0) keep_worst_case_line(m);
      return m;
    };
  };
  CompareReport rep;
  if (opt.oracle == Oracle::fast && !s.key_norm.compute_in_float32) {
    const DepthRoute<double> fd = attn_res_route(s.sources, s.g_old, s.psi, s.kinds, s.opt);
    const double ud = oasis::unit_roundoff<double>();
    const KimiStepGrads<double> rd = kimi_step_gradients(s, fd);
    const BoundMap own = kimi_step_bounds<double>(s, fd, 0.0, ud);
    PlainBounds pb(bounds_from(fd, ud, 0.0)), pp(bounds_from(fd, ud, kLambda));
    if (compare_outputs(rep, out,
                        {{"grad_sources", {&rd.sources, &own.at("grad_sources"), 1.0}},
                         {"grad_w", {&rd.w, &own.at("grad_w"), 1.0}},
                         {"grad_gain", {&rd.gain, &own.at("grad_gain"), 1.0}}},
                        pb, opt, 1e-7, use_prob ? &pp : nullptr) == 0) {
      rep.oracle = "fast (double, its own error bound folded in)";
      return rep;
    }
    const double work = 30.0 * static_cast<double>(s.sources.size());
    if (!mp50_fits(rep, work, 4.0 * sizeof(mp50) * static_cast<double>(s.sources.size()), opt, "the router's step"))
      return rep;
    rep = CompareReport{};
  }
  const DepthRoute<mp50> fm = attn_res_route(s.sources.cast<mp50>(), s.g_old.cast<mp50>(), s.psi.cast<mp50>(), s.kinds, s.opt);
  const KimiStepGrads<mp50> ref = kimi_step_gradients(s, fm);
  PlainBounds pb(bounds_from(fm, 0.0, 0.0)), pp(bounds_from(fm, 0.0, kLambda));
  compare_outputs(rep, out, {{"grad_sources", &ref.sources}, {"grad_w", &ref.w}, {"grad_gain", &ref.gain}}, pb, opt,
                  use_prob ? &pp : nullptr);
  rep.oracle = "mp50";
  return rep;
}

}  // namespace

void check_router_backward_steps(const om::Model<double>& m, index_t N, const io::TensorMap& outputs,
                                 const CompareOptions& opt, CompareReport& rep, std::map<std::string, std::string>& step_of,
                                 std::vector<StepVerdict>& verdicts) {
  const om::ModelConfig& cfg = m.config();
  if (!cfg.attn_res()) return;
  const bool kimi = cfg.router != om::RouterFamily::authors_code;
  const om::ForwardSchedule sched = om::forward_schedule(cfg);
  const om::ModelWiring& w = sched.wiring;
  std::map<index_t, index_t> position;  // router -> its step in the schedule
  for (std::size_t i = 0; i < sched.steps.size(); ++i)
    if (sched.steps[i].kind == om::ScheduledStep::Kind::router) position[sched.steps[i].index] = static_cast<index_t>(i);
  auto get = [&](const std::string& name) -> const io::StoredTensor* {
    const auto it = outputs.find(name);
    return it == outputs.end() ? nullptr : &it->second;
  };
  std::vector<std::string> skipped;
  bool no_sources = false;
  for (auto r = w.routers.rbegin(); r != w.routers.rend(); ++r) {  // backward order
    const std::string& S = r->trace;
    const std::string P = "grad." + r->params;  // the router's parameters' gradients
    const DepthOptions d = om::router_depth_options(cfg, m.theta_of(r->params));
    const io::StoredTensor *dgo = get(S + ".grad_g_old"), *dps = get(S + ".grad_psi"), *dsrc = get(S + ".grad_sources"),
                           *dth = d.coupling && !d.beta ? get(P + ".theta") : nullptr,
                           *dw = kimi ? get(P + ".query") : nullptr, *dgn = kimi ? get(P + ".key_norm.weight") : nullptr;
    if (!dgo && !dps && !dsrc) continue;
    const io::StoredTensor *src = get(S + ".sources"), *g = get(S + ".g_old"), *psi = get(S + ".psi"), *dh = get(S + ".grad_routed");
    if (!src || !g || !dh || (d.coupling && !psi) || om::clamps_uncoupled_logits(d)) {
      skipped.push_back(S);
      continue;
    }
    const index_t n = static_cast<index_t>(r->candidates.size()), dm = cfg.d_model;
    if (src->values.size() != n * N * dm || g->values.size() != n * N || dh->values.size() != N * dm ||
        (psi && psi->values.size() != n * N))
      continue;  // a shape the trace check has already reported
    std::vector<SourceKind> kinds;
    for (const auto& c : r->candidates) kinds.push_back(c.kind);
    io::TensorMap in, out;
    in["sources"] = {src->dtype, src->values.reshaped({n, N, dm})};
    in["g_old"] = {g->dtype, g->values.reshaped({n, N})};
    if (d.coupling) in["psi"] = {psi->dtype, psi->values.reshaped({n, N})};
    in["grad_h"] = {dh->dtype, dh->values.reshaped({N, dm})};
    if (dgo) out["grad_g_old"] = {dgo->dtype, dgo->values.reshaped({n, N})};
    if (dps) out["grad_psi"] = {dps->dtype, dps->values.reshaped({n, N})};
    if (dth && dth->values.size() == 1) out["grad_theta"] = {dth->dtype, dth->values.reshaped({1})};
    const std::map<std::string, std::string> param_rows{
        {"grad_theta", P + ".theta"}, {"grad_w", P + ".query"}, {"grad_gain", P + ".key_norm.weight"}};
    bool passed = true;
    auto add = [&](const CompareReport& local, const std::string& how) {
      const std::string step = "router " + r->params + "'s backward on its traced sources, g_old, psi and grad_routed (" +
                               how + ", oracle " + local.oracle + ")";
      for (TensorReport t : local.tensors) {
        const auto pr = param_rows.find(t.name);
        t.name = (pr != param_rows.end() ? pr->second : S + "." + t.name) + " (backward step)";
        step_of[t.name] = step;
        passed = passed && t.passed;
        rep.tensors.push_back(t);
      }
      rep.notes.insert(rep.notes.end(), local.notes.begin(), local.notes.end());
    };
    if (dgo || dps) add(depth_backward_report(in, out, d, kinds, opt), "op depth_backward");
    if (dsrc && !kimi) no_sources = true;
    io::TensorMap kout;  // the Kimi step's gradients: the mix and keys of grad_sources, the query's and the key gain's
    if (dsrc && dsrc->values.size() == n * N * dm) kout["grad_sources"] = {dsrc->dtype, dsrc->values.reshaped({n, N, dm})};
    if (dw && dw->values.size() == dm) kout["grad_w"] = {dw->dtype, dw->values.reshaped({dm})};
    if (dgn && dgn->values.size() == dm) kout["grad_gain"] = {dgn->dtype, dgn->values.reshaped({dm})};
    if (dgo && kimi && !kout.empty()) {
      RouterStep st{in.at("sources").values, in.at("g_old").values, d.coupling ? in.at("psi").values : Tensor<double>({n, N}),
                    in.at("grad_h").values, dgo->values.reshaped({n, N}), m.param(r->params + ".query").cast<double>(),
                    m.gain_of(r->params).cast<double>(), kinds, d, cfg.key_norm};
      add(kimi_step(st, kout, opt), "the mix and the pseudo-query backward of its traced grad_g_old");
    }
    verdicts.push_back({position.at(static_cast<index_t>(w.routers.rend() - r - 1)), "router " + r->params, passed});
  }
  if (no_sources)
    rep.notes.push_back("the authors' routers' grad_sources (the mix, the keys and the query projections) have no local "
                        "backward step: the end-to-end verdict only");
  if (!skipped.empty()) {
    std::string s;
    for (const auto& x : skipped) s += (s.empty() ? "" : ", ") + x;
    rep.notes.push_back("backward steps not checked locally (the trace lacks .sources, .g_old, .psi or .grad_routed, or "
                        "the logits pass an uncoupled clamp whose input the trace does not hold): " + s);
  }
}

void note_first_wrong_step(std::vector<StepVerdict> verdicts, CompareReport& rep) {
  std::stable_sort(verdicts.begin(), verdicts.end(),
                   [](const StepVerdict& a, const StepVerdict& b) { return a.position > b.position; });  // backward order
  std::string last_correct;
  for (const StepVerdict& v : verdicts) {
    if (v.passed) {
      last_correct = v.label;
      continue;
    }
    rep.notes.insert(rep.notes.begin(), "first wrong backward step (backward order): " + v.label + "'s backward" +
                                            (last_correct.empty() ? "" : "; the last correct one before it: " + last_correct + "'s"));
    return;
  }
}

}  // namespace oasis::verify::detail
