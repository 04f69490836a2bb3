// src/verify/model_checker_impl.hpp — the members of ModelCheckerOf<R> (model_checker.hpp): the
// trace names and shapes of a configuration, and which step produces each name (expected), on the
// steps of model_checker_steps.hpp. Generic over the reference scalar R; instantiated for mp50
// (model_checker_mp50.cpp) and double (model_checker_double.cpp). Included by those two files only.
#pragma once

#include "model_checker_steps.hpp"

namespace oasis::verify::detail {

template <class Sc>
ModelCheckerOf<Sc>::ModelCheckerOf(const om::Model<Sc>& m, const TensorMap& trace, const std::vector<index_t>& ids, index_t B,
                           index_t Tn) {
  p_ = std::make_unique<Impl>(m, trace, ids, B, Tn, shapes_);
  Impl& I = *p_;
  const om::ModelConfig& c = I.c;
  const index_t d = c.d_model, H = c.n_heads, wq = H * c.head_dim(), wkv = c.kv_heads() * c.head_dim();
  auto add = [&](const std::string& name, Shape s, index_t sub, index_t router, const std::string& field) {
    names_.emplace_back(name, s);
    shapes_[name] = s;
    I.slots[name] = typename Impl::Slot{sub, router, field};
  };
  auto add_router = [&](index_t r) {
    const om::WiredRouter& R = I.router(r);
    const index_t n = static_cast<index_t>(R.candidates.size());
    for (const std::string& f : om::router_trace_fields()) {
      Shape s = f == "sources" ? Shape{n, B, Tn, d} : f == "alpha_null" ? Shape{B, Tn} : f == "routed" ? Shape{B, Tn, d} : Shape{n, B, Tn};
      add(R.trace + "." + f, s, -1, r, f);
    }
  };
  const bool authors = c.attn_res() && c.router == om::RouterFamily::authors_code;
  for (index_t l = 0; l < static_cast<index_t>(I.w.sublayers.size()); ++l) {
    const om::WiredSublayer& s = I.sub(l);
    if (s.router >= 0 && !authors) add_router(s.router);
    if (s.kind == om::SublayerKind::attention) {
      for (const std::string& f : om::attention_trace_fields()) {
        Shape sh = f == "attn_q" || f == "attn_heads" ? Shape{B, Tn, wq}
                 : f == "attn_k" || f == "attn_v"     ? Shape{B, Tn, wkv}
                 : f == "p_null" || f == "lse"        ? Shape{B, H, Tn}
                 : f == "branch_psi"                  ? Shape{B, Tn}
                                                      : Shape{B, Tn, d};
        add(s.name + "." + f, sh, l, -1, f);
      }
    } else {
      for (const std::string& f : om::mlp_trace_fields())
        add(s.name + "." + f, f == "mlp_hidden" ? Shape{B, Tn, c.d_ff} : Shape{B, Tn, d}, l, -1, f);
    }
    if (s.router >= 0 && authors) add_router(s.router);
  }
  for (index_t r = 0; r < static_cast<index_t>(I.w.routers.size()); ++r)
    if (I.router(r).trace == "final_res") add_router(r);
  add("state", {B, Tn, d}, -1, -1, "state");
  add("logits", {B, Tn, c.vocab_size}, -1, -1, "logits");
}

template <class Sc>
ModelCheckerOf<Sc>::~ModelCheckerOf() = default;

template <class Sc>
const Shape* ModelCheckerOf<Sc>::shape_of(const std::string& name) const {
  const auto it = shapes_.find(name);
  return it == shapes_.end() ? nullptr : &it->second;
}

template <class Sc>
void ModelCheckerOf<Sc>::release() {
  Impl& I = *p_;
  for (int w = 0; w < 2; ++w) {
    I.values[w].clear();
    I.routes[w].clear();
    I.logit_routes[w].clear();
    I.projs[w].clear();
    I.cores[w].clear();
    I.tights[w].clear();
    I.stats[w].clear();
  }
}

template <class Sc>
bool ModelCheckerOf<Sc>::psi_used(const std::string& name) const {
  const auto it = p_->slots.find(name);
  return it != p_->slots.end() && it->second.router >= 0 && p_->coupled(it->second.router);
}

template <class Sc>
ResolvedOf<Sc> ModelCheckerOf<Sc>::readout_step(bool wide) {
  Impl& I = *p_;
  std::set<std::string> excl{"state"};
  for (const auto& a : I.aliases(I.w.state)) excl.insert(a);
  return I.value(I.w.state, wide, excl);
}

template <class Sc>
ExpectedOf<Sc> ModelCheckerOf<Sc>::expected(const std::string& name, const StoredTensor& got, bool wide) {
  using Resolved = ResolvedOf<Sc>;
  using Expected = ExpectedOf<Sc>;
  Impl& I = *p_;
  const typename Impl::Slot& s = I.slots.at(name);
  const Shape& shape = shapes_.at(name);
  const index_t N = I.N, d = I.d;
  auto shaped = [&](const Resolved& r, const std::string& step) {
    return Expected{r.x.reshaped(shape), r.e.reshaped(shape), step};
  };
  const ErrorModel em = I.em(wide);
  if (s.router >= 0) {
    const om::WiredRouter& R = I.router(s.router);
    const index_t n = static_cast<index_t>(R.candidates.size());
    std::string cands;
    for (const auto& k : R.candidates) cands += (cands.empty() ? "" : ", ") + k.name;
    if (s.field == "sources") {  // every candidate is the value the wiring names
      Expected x{Tensor<Sc>({n, N, d}), Tensor<double>({n, N, d}), "the candidates of router " + R.params + ": " + cands};
      for (index_t i = 0; i < n; ++i) {
        const Resolved v = I.value(R.candidates[static_cast<std::size_t>(i)].value, wide, {});
        std::copy(v.x.data(), v.x.data() + N * d, x.ref.ptr(i));
        std::copy(v.e.data(), v.e.data() + N * d, x.e.ptr(i));
      }
      x.ref = x.ref.reshaped(shape);
      x.e = x.e.reshaped(shape);
      return x;
    }
    if (s.field == "psi") {  // entries without null evidence are not read: taken as given
      Expected x{Tensor<Sc>({n, N}), Tensor<double>({n, N}), "the psi of the candidates of router " + R.params + ": " + cands};
      for (index_t i = 0; i < n; ++i) {
        const om::WiredCandidate& k = R.candidates[static_cast<std::size_t>(i)];
        if (I.evidence(k)) {
          const Resolved p = I.candidate_psi(s.router, static_cast<std::size_t>(i), wide);
          for (index_t t = 0; t < N; ++t) { x.ref(i, t) = p.x[t]; x.e(i, t) = p.e[t]; }
        } else {
          for (index_t t = 0; t < N; ++t) x.ref(i, t) = Sc(got.values[i * N + t]);
        }
      }
      x.ref = x.ref.reshaped(shape);
      x.e = x.e.reshaped(shape);
      return x;
    }
    if (s.field == "g_old") {
      const om::RouteResult<Sc>& r = I.route(s.router, wide, true);
      const std::string how = router_logits(I.c);
      return Expected{r.g_old.reshaped(shape), rows_bound(r.e_gold, n * N, 1).reshaped(shape),
                      "the logits of router " + R.params + " (" + how + ") on its sources"};
    }
    if (s.field == "routed") {
      if (const auto& t = I.tight(s.router, wide))
        return Expected{t->ref.h.reshaped(shape), t->b.h.reshaped(shape),
                        "router " + R.params + " on its own sources, g_old, psi (depth policy)"};
      return shaped(from_rows(I.route(s.router, wide).h), "router " + R.params + " (logits, coupling, normaliser, mix) on " + cands);
    }
    // g, dpsi, alpha, alpha_null: the depth policy on the router's own inputs
    const auto& t = I.tight(s.router, wide);
    if (!t) {
      for (const char* f : {"sources", "g_old", "psi"})
        if ((std::string(f) != "psi" || I.coupled(s.router)) && !I.read(R.trace + "." + f))  // read: Unusable when bad
          throw Missing{R.trace + "." + f, shapes_.at(R.trace + "." + f)};
    }
    const std::string step = "router " + R.params + " on its own sources, g_old, psi (depth policy)";
    if (s.field == "g") return Expected{t->ref.g.reshaped(shape), t->b.g.reshaped(shape), step};
    if (s.field == "dpsi") return Expected{t->ref.dpsi.reshaped(shape), t->b.dpsi.reshaped(shape), step};
    if (s.field == "alpha") return Expected{t->ref.alpha.reshaped(shape), t->b.alpha.reshaped(shape), step};
    return Expected{t->ref.alpha_null.reshaped(shape), t->b.alpha_null.reshaped(shape), step};
  }
  if (s.sub >= 0) {
    const index_t l = s.sub;
    const om::WiredSublayer& S = I.sub(l);
    if (s.field == "input") {
      const Resolved r = I.value(WiredValue::of(VK::input, l), wide, {name});
      return shaped(r, "what " + S.name + " reads: " + I.wired_name(S.input));
    }
    if (S.kind == om::SublayerKind::attention) {
      I.require_bounds(l, name);
      if (s.field == "attn_q" || s.field == "attn_k" || s.field == "attn_v") {
        const typename Impl::Proj& p = I.proj(l, wide);
        const Rows<Sc>& r = s.field == "attn_q" ? p.q : s.field == "attn_k" ? p.k : p.v;
        return shaped(from_rows(r), "projections of " + S.name + " (RMSNorm, W, q/k norm, RoPE) on its input");
      }
      if (s.field == "p_null" || s.field == "lse") {
        if (I.have_qkv(l)) {
          Expected x = I.core_stat(l, s.field, wide);
          return x;
        }
        if (s.field == "lse") throw Missing{S.name + ".attn_q", shapes_.at(S.name + ".attn_q")};
        const om::AttentionSublayer<Sc>& a = I.core(l, wide);
        return Expected{a.p_null, a.e_p_null, "attention core of " + S.name + " on its q, k, v"};
      }
      if (s.field == "attn_heads")
        return shaped(from_rows(I.core(l, wide).heads), "attention core of " + S.name + " on its q, k, v");
      if (s.field == "branch_psi") {
        const Resolved r = I.branch_psi(l, wide, false);
        return shaped(r, I.usable(S.name + ".p_null") && I.c.psi_estimator == om::PsiEstimator::p_null
                             ? "the mean over heads of " + S.name + ".p_null"
                                                     : "attention core of " + S.name + " on its q, k, v");
      }
      // output: W_o on the heads
      const Rows<Sc> o = om::linear(to_rows(I.heads(l, wide)), *I.m.attn_weights(S.block).wo, em);
      return shaped(from_rows(o), "output projection of " + S.name + " on its heads");
    }
    if (s.field == "mlp_hidden")
      return shaped(from_rows(om::mlp_hidden(I.input_rows(l, wide), I.m.mlp_weights(S.block), I.c, em)),
                    "MLP hidden rows of " + S.name + " (RMSNorm, silu(W_gate x) * W_up x) on its input");
    const Rows<Sc> o = om::linear(to_rows(I.hidden(l, wide)), *I.m.mlp_weights(S.block).down, em);
    return shaped(from_rows(o), "down projection of " + S.name + " on its hidden rows");
  }
  if (name == "state") {
    const Resolved r = I.value(I.w.state, wide, {"state"});
    return shaped(r, "the readout (" + std::string(om::to_string(I.c.readout_or_default())) + "): " + I.wired_name(I.w.state));
  }
  // logits: the head on the trace's readout state. Not on a recomputed one: the readout and the
  // head composed through recomputation bound less than the end-to-end verdict sees (Missing).
  const auto st = I.read_rows("state");
  if (!st) throw Missing{"state", shape_of("state") ? *shape_of("state") : Shape{}};
  return shaped(from_rows(I.m.head(to_rows(*st), em)), "the head (final RMSNorm, LM head) on the readout state");
}

}  // namespace oasis::verify::detail
