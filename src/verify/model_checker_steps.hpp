// src/verify/model_checker_steps.hpp — the steps behind the model level's producers
// (model_checker.hpp): ModelCheckerOf<R>::Impl reads the trace's own tensors and recomputes what a
// step reads and the trace lacks (wired sums, router outputs, psi, projections, attention cores)
// under the model's own rules (oasis/model/layers.hpp, router.hpp, model.hpp), memoised per
// precision. Included by model_checker_impl.hpp only.
#pragma once

#include "model_checker.hpp"

#include <cmath>
#include <stdexcept>

#include "oasis/ops/error_bounds.hpp"
#include "oasis/model/router.hpp"

namespace oasis::verify::detail {

namespace om = oasis::model;
using om::ErrorModel;
using om::Rows;
using om::WiredValue;
using VK = WiredValue::Kind;

namespace {

bool same(const WiredValue& a, const WiredValue& b) {
  if (a.kind != b.kind || a.index != b.index || a.terms.size() != b.terms.size()) return false;
  for (std::size_t i = 0; i < a.terms.size(); ++i)
    if (!same(a.terms[i], b.terms[i])) return false;
  return true;
}

std::string key(const WiredValue& v) {
  switch (v.kind) {
    case VK::embedding: return "E";
    case VK::output: return "o" + std::to_string(v.index);
    case VK::input: return "i" + std::to_string(v.index);
    case VK::routed: return "r" + std::to_string(v.index);
    case VK::sum: {
      std::string s = "s(";
      for (const auto& t : v.terms) s += key(t) + ",";
      return s + ")";
    }
  }
  return "?";
}

/// Element bounds [n, w] from row bounds e (empty: none).
Tensor<double> rows_bound(const std::vector<double>& e, index_t n, index_t w) {
  Tensor<double> b({n, w});
  for (index_t i = 0; i < n * w; ++i) b[i] = e.empty() ? 0.0 : e[static_cast<std::size_t>(i / w)];
  return b;
}

/// Rows as a resolved value, each element bounded by its row's bound.
template <class Sc>
ResolvedOf<Sc> from_rows(const Rows<Sc>& r) {
  return {r.x, rows_bound(r.e, r.n(), r.w())};
}

/// Rows with the per-row maximum of the element bounds (the layer rules take row bounds).
template <class Sc>
Rows<Sc> to_rows(const ResolvedOf<Sc>& r) {
  const index_t n = r.x.dim(0), w = r.x.dim(1);
  Rows<Sc> o{r.x, std::vector<double>(static_cast<std::size_t>(n), 0.0)};
  for (index_t i = 0; i < n * w; ++i) o.e[static_cast<std::size_t>(i / w)] = std::max(o.e[static_cast<std::size_t>(i / w)], r.e[i]);
  return o;
}

/// How a router family forms its logits (for the report).
std::string router_logits(const om::ModelConfig& c) {
  if (c.router == om::RouterFamily::authors_code) return "(W_q c).(W_k s_i) / sqrt(r) + recency i / (n - 1)";
  return c.key_norm_gain ? "w^T RMSNorm(s_i) with the key-norm gain" : "w^T RMSNorm(s_i)";
}

}  // namespace

template <class Sc>
struct ModelCheckerOf<Sc>::Impl {
  using Resolved = ResolvedOf<Sc>;
  using Expected = ExpectedOf<Sc>;
  const om::Model<Sc>& m;
  const om::ModelConfig& c;
  om::ModelWiring w;
  const TensorMap& trace;
  std::vector<index_t> ids;
  index_t B, Tn, N, d;
  std::map<std::string, Shape>& shapes;
  /// name -> (sublayer index, router index, field); global tensors have both -1.
  struct Slot { index_t sub = -1, router = -1; std::string field; };
  std::map<std::string, Slot> slots;

  struct Proj { Rows<Sc> q, k, v; };
  std::map<std::string, Resolved> values[2];
  std::map<index_t, om::RouteResult<Sc>> routes[2], logit_routes[2];
  std::map<index_t, Proj> projs[2];
  std::map<index_t, om::AttentionSublayer<Sc>> cores[2];

  Impl(const om::Model<Sc>& model, const TensorMap& t, std::vector<index_t> i, index_t b, index_t tn,
       std::map<std::string, Shape>& sh)
      : m(model), c(model.config()), w(om::model_wiring(model.config())), trace(t), ids(std::move(i)), B(b), Tn(tn),
        N(b * tn), d(model.config().d_model), shapes(sh) {}

  const om::WiredSublayer& sub(index_t l) const { return w.sublayers[static_cast<std::size_t>(l)]; }
  const om::WiredRouter& router(index_t r) const { return w.routers[static_cast<std::size_t>(r)]; }
  bool coupled(index_t r) const { return om::router_depth_options(c, m.theta_of(router(r).params)).coupling; }
  bool evidence(const om::WiredCandidate& k) const {
    return has_null_evidence(k.kind, c.coupling_or_default().headless);
  }
  /// The error model of a checked tensor: f64, else f32 (scaled to f16/bf16 by the caller).
  static ErrorModel em(bool wide) { return ErrorModel{unit_roundoff(wide ? DType::f64 : DType::f32)}; }

  // ---- the trace's own tensors ----------------------------------------------------------------

  const StoredTensor* find(const std::string& n) const {
    const auto it = trace.find(n);
    return it == trace.end() ? nullptr : &it->second;
  }
  /// The trace tensor n if present; Unusable when its shape or values cannot be read.
  const Tensor<double>* read(const std::string& n) const {
    const StoredTensor* t = find(n);
    if (!t) return nullptr;
    const Shape& want = shapes.at(n);
    if (t->values.shape() != want)
      throw Unusable{n, "has shape " + shape_str(t->values.shape()) + ", not " + shape_str(want)};
    for (index_t i = 0; i < t->values.size(); ++i)
      if (!std::isfinite(t->values[i])) throw Unusable{n, "holds a non-finite value at flat index " + std::to_string(i)};
    return &t->values;
  }
  /// The trace tensor n as exact rows [N, w] (error 0), or nothing.
  std::optional<Resolved> read_rows(const std::string& n) const {
    const Tensor<double>* t = read(n);
    if (!t) return std::nullopt;
    const index_t w = t->size() / N;
    return Resolved{t->reshaped({N, w}).cast<Sc>(), Tensor<double>({N, w})};
  }
  Resolved need_rows(const std::string& n) const {
    if (auto r = read_rows(n)) return *r;
    throw Missing{n, shapes.at(n)};
  }
  /// Present and usable (a bad tensor fails its own check; here it only counts as absent).
  bool usable(const std::string& n) const {
    try {
      return read(n) != nullptr;
    } catch (const Unusable&) {
      return false;
    }
  }

  // ---- values handed between steps (wiring) ----------------------------------------------------

  Resolved embedding() const {
    const Tensor<Sc>& E = m.param("embed_tokens.weight");
    Resolved r{Tensor<Sc>({N, d}), Tensor<double>({N, d})};
    for (index_t i = 0; i < N; ++i)
      for (index_t k = 0; k < d; ++k) r.x(i, k) = E(ids[static_cast<std::size_t>(i)], k);
    return r;
  }

  /// Trace names that hold exactly the value v (router outputs, sublayer inputs, the state).
  std::vector<std::string> aliases(const WiredValue& v) const {
    std::vector<std::string> a;
    if (v.kind == VK::routed) a.push_back(router(v.index).trace + ".routed");
    for (const auto& s : w.sublayers)
      if (same(s.input, v)) a.push_back(s.name + ".input");
    if (same(w.state, v)) a.push_back("state");
    return a;
  }

  Resolved value(const WiredValue& v, bool wide, const std::set<std::string>& excl) {
    switch (v.kind) {
      case VK::embedding: return embedding();
      case VK::output: return need_rows(sub(v.index).name + ".output");
      case VK::input: {
        const std::string n = sub(v.index).name + ".input";
        if (!excl.count(n))
          if (auto r = read_rows(n)) return *r;
        return value(sub(v.index).input, wide, excl);
      }
      case VK::routed:
      case VK::sum:
        for (const std::string& a : aliases(v))
          if (!excl.count(a))
            if (auto r = read_rows(a)) return *r;
        return v.kind == VK::routed ? router_output(v.index, wide) : sum(v, wide, excl);
    }
    throw std::logic_error("unknown wired value");
  }

  /// Terms summed left to right; error rule of add_rows per addition.
  Resolved sum(const WiredValue& v, bool wide, const std::set<std::string>& excl) {
    std::string k = key(v);
    for (const auto& x : excl) k += "|" + x;
    auto it = values[wide].find(k);
    if (it != values[wide].end()) return it->second;
    Rows<Sc> acc = to_rows(value(v.terms[0], wide, excl));
    for (std::size_t i = 1; i < v.terms.size(); ++i) acc = om::add_rows(acc, to_rows(value(v.terms[i], wide, excl)), em(wide));
    return values[wide].emplace(k, from_rows(acc)).first->second;
  }

  // ---- psi -------------------------------------------------------------------------------------

  /// Branch psi of attention sublayer a [N, 1]: its trace tensor; else the mean over heads of its
  /// .p_null (under op psi's bound; p_null estimator only); else the attention core on its q, k, v
  /// (the mass-deficit estimator reads the probabilities, which the trace does not hold).
  Resolved branch_psi(index_t a, bool wide, bool use_own) {
    const std::string P = sub(a).name + ".";
    if (use_own)
      if (auto r = read_rows(P + "branch_psi")) return *r;
    const Tensor<double>* pn = c.psi_estimator == om::PsiEstimator::p_null ? read(P + "p_null") : nullptr;
    if (pn) {
      const Tensor<Sc> psi = null_statistic(pn->cast<Sc>());
      Resolved r{psi.reshaped({N, 1}), Tensor<double>({N, 1})};
      for (index_t i = 0; i < N; ++i) r.e[i] = psi_bound(em(wide).u, c.n_heads, 0, static_cast<double>(psi[i]));
      return r;
    }
    const om::AttentionSublayer<Sc>& k = core(a, wide);
    return from_rows(Rows<Sc>{k.psi.reshaped({N, 1}), k.e_psi});
  }

  /// The psi candidate i of router r carries [N, 1]: the mean of its attention sublayers' psi
  /// under the model's rule (ErrorModel::mean_error).
  Resolved candidate_psi(index_t r, std::size_t i, bool wide) {
    const auto& from = router(r).candidates[i].psi_from;
    if (from.size() == 1) return branch_psi(from[0], wide, true);
    Resolved acc{Tensor<Sc>({N, 1}), Tensor<double>({N, 1})};
    for (index_t a : from) {
      const Resolved p = branch_psi(a, wide, true);
      for (index_t t = 0; t < N; ++t) { acc.x[t] += p.x[t]; acc.e[t] += p.e[t]; }
    }
    const double k = static_cast<double>(from.size());
    for (index_t t = 0; t < N; ++t) {
      acc.x[t] /= Sc(k);
      acc.e[t] = em(wide).mean_error(acc.e[t], k, static_cast<double>(acc.x[t]));
    }
    return acc;
  }

  // ---- routers -----------------------------------------------------------------------------------

  /// The router step on its candidates (the trace's .sources and .psi when usable, else the
  /// wired values): kimi_route or authors_route with the error model of the checked precision.
  /// logits_only: the psi are left at 0 (g_old and its bound do not read them).
  const om::RouteResult<Sc>& route(index_t r, bool wide, bool logits_only = false) {
    auto& memo = logits_only ? logit_routes[wide] : routes[wide];
    auto it = memo.find(r);
    if (it != memo.end()) return it->second;
    const om::WiredRouter& R = router(r);
    const index_t n = static_cast<index_t>(R.candidates.size());
    const bool cp = coupled(r) && !logits_only;
    const Tensor<double>* src = usable(R.trace + ".sources") ? read(R.trace + ".sources") : nullptr;
    const Tensor<double>* psi = cp && usable(R.trace + ".psi") ? read(R.trace + ".psi") : nullptr;
    std::vector<om::DepthSource<Sc>> cand(static_cast<std::size_t>(n));
    std::vector<const om::DepthSource<Sc>*> ptr;
    for (index_t i = 0; i < n; ++i) {
      const om::WiredCandidate& k = R.candidates[static_cast<std::size_t>(i)];
      om::DepthSource<Sc>& s = cand[static_cast<std::size_t>(i)];
      if (src) {
        s.v = Rows<Sc>{Tensor<double>({N, d}, std::vector<double>(src->ptr(i), src->ptr(i) + N * d)).cast<Sc>(),
                         std::vector<double>(static_cast<std::size_t>(N), 0.0)};
      } else {
        s.v = to_rows(value(k.value, wide, {}));
      }
      s.kind = k.kind;
      s.psi = Tensor<Sc>({N});
      s.e_psi.assign(static_cast<std::size_t>(N), 0.0);
      s.name = k.name;
      if (cp && evidence(k)) {
        std::string from = psi ? R.trace + ".psi" : "the psi of " + k.name;
        if (psi) {
          for (index_t t = 0; t < N; ++t) s.psi[t] = Sc(psi->ptr(i)[t]);
        } else {
          const Resolved p = candidate_psi(r, static_cast<std::size_t>(i), wide);
          for (index_t t = 0; t < N; ++t) { s.psi[t] = p.x[t]; s.e_psi[static_cast<std::size_t>(t)] = p.e[t]; }
          from = sub(k.psi_from[0]).name + ".branch_psi";
        }
        for (index_t t = 0; t < N; ++t)
          if (!(s.psi[t] >= 0 && s.psi[t] <= 1))
            throw Unusable{from, "is not a probability in [0, 1] (candidate " + std::to_string(i) + ", token " +
                                     std::to_string(t) + ": " + std::to_string(static_cast<double>(s.psi[t])) + ")"};
      }
      ptr.push_back(&s);
    }
    return memo.emplace(r, m.route(R.params, ptr, em(wide))).first->second;
  }

  /// The depth-routing step on the trace's own .sources, .g_old, .psi (the op-level depth policy).
  struct Tight { DepthRoute<Sc> ref; bounds::DepthRouteBounds b; };
  std::map<index_t, std::optional<Tight>> tights[2];
  const std::optional<Tight>& tight(index_t r, bool wide) {
    auto it = tights[wide].find(r);
    if (it == tights[wide].end()) it = tights[wide].emplace(r, compute_tight(r, wide)).first;
    return it->second;
  }
  std::optional<Tight> compute_tight(index_t r, bool wide) const {
    const om::WiredRouter& R = router(r);
    const bool cp = coupled(r);
    if (!usable(R.trace + ".sources") || !usable(R.trace + ".g_old") || (cp && !usable(R.trace + ".psi"))) return std::nullopt;
    const index_t n = static_cast<index_t>(R.candidates.size());
    const Tensor<double> s3 = read(R.trace + ".sources")->reshaped({n, N, d});
    const Tensor<double> g2 = read(R.trace + ".g_old")->reshaped({n, N});
    Tensor<double> ps({n, N});
    std::vector<SourceKind> kinds;
    for (const auto& k : R.candidates) kinds.push_back(k.kind);
    if (cp) {
      ps = read(R.trace + ".psi")->reshaped({n, N});
      for (index_t i = 0; i < n; ++i)
        if (evidence(R.candidates[static_cast<std::size_t>(i)]))
          for (index_t t = 0; t < N; ++t)
            if (!(ps(i, t) >= 0 && ps(i, t) <= 1))
              throw Unusable{R.trace + ".psi", "is not a probability in [0, 1] at [" + std::to_string(i) + ", " +
                                                   std::to_string(t) + "]"};
    }
    const DepthOptions dopt = om::router_depth_options(c, m.theta_of(R.params));
    Tight x{attn_res_route(s3.cast<Sc>(), g2.cast<Sc>(), ps.cast<Sc>(), kinds, dopt), {}};
    x.b = wide ? bounds::depth_route_bounds(s3, ps, kinds, dopt, x.ref)
               : bounds::depth_route_bounds(s3.cast<float>(), ps.cast<float>(), kinds, dopt, x.ref);
    return x;
  }

  /// The router's output h: the tight depth policy when the trace has the router's inputs, else
  /// the whole router step on its candidates.
  Resolved router_output(index_t r, bool wide) {
    if (const auto& t = tight(r, wide)) return Resolved{t->ref.h, t->b.h};
    return from_rows(route(r, wide).h);
  }

  // ---- sublayer internals ------------------------------------------------------------------------

  Rows<Sc> input_rows(index_t l, bool wide) { return to_rows(value(WiredValue::of(VK::input, l), wide, {})); }

  void require_bounds(index_t l, const std::string& name) const {
    OASIS_REQUIRE(c.forward_bound_derived(), name,
                  "no per-step error bound is derived for gated attention or the prefix sink; the attention steps of this "
                  "configuration cannot be checked (leave out ", sub(l).name,
                  ".attn_q/attn_k/attn_v/p_null/lse/attn_heads/branch_psi/output; the logits get the end-to-end verdict)");
  }

  /// A wired value by its trace names, e.g. "layers.0.attn.input + layers.0.attn.output".
  std::string wired_name(const WiredValue& v) const {
    switch (v.kind) {
      case VK::embedding: return "the embedding";
      case VK::output: return sub(v.index).name + ".output";
      case VK::input: return sub(v.index).name + ".input";
      case VK::routed: return router(v.index).trace + ".routed";
      case VK::sum: {
        std::string s;
        for (const auto& t : v.terms) s += (s.empty() ? "" : " + ") + wired_name(t);
        return s;
      }
    }
    return "?";
  }

  const Proj& proj(index_t l, bool wide) {
    auto it = projs[wide].find(l);
    if (it != projs[wide].end()) return it->second;
    Proj p;
    om::attention_projections(input_rows(l, wide), Tn, 0, m.attn_weights(sub(l).block), c, em(wide), p.q, p.k, p.v);
    return projs[wide].emplace(l, std::move(p)).first->second;
  }
  Resolved qkv(index_t l, const char* f, bool wide) {
    if (auto r = read_rows(sub(l).name + "." + f)) return *r;
    const Proj& p = proj(l, wide);
    return from_rows(f[5] == 'q' ? p.q : f[5] == 'k' ? p.k : p.v);
  }
  const om::AttentionSublayer<Sc>& core(index_t l, bool wide) {
    auto it = cores[wide].find(l);
    if (it != cores[wide].end()) return it->second;
    om::KVCache<Sc> kv;
    om::AttentionSublayer<Sc> a = om::attention_core(to_rows(qkv(l, "attn_q", wide)), to_rows(qkv(l, "attn_k", wide)),
                                                       to_rows(qkv(l, "attn_v", wide)), B, Tn, c, kv, em(wide));
    return cores[wide].emplace(l, std::move(a)).first->second;
  }
  Resolved heads(index_t l, bool wide) {
    if (auto r = read_rows(sub(l).name + ".attn_heads")) return *r;
    return from_rows(core(l, wide).heads);
  }
  Resolved hidden(index_t l, bool wide) {
    if (auto r = read_rows(sub(l).name + ".mlp_hidden")) return *r;
    return from_rows(om::mlp_hidden(input_rows(l, wide), m.mlp_weights(sub(l).block), c, em(wide)));
  }
  bool have_qkv(index_t l) const {
    const std::string P = sub(l).name + ".";
    return usable(P + "attn_q") && usable(P + "attn_k") && usable(P + "attn_v");
  }

  /// p_null and LSE of attention sublayer l from its own q, k, v: the op-level token attention on
  /// the heads, under the op-level attention bounds.
  std::map<index_t, std::pair<Expected, Expected>> stats[2];  ///< (p_null, lse) per sublayer
  Expected core_stat(index_t l, const std::string& field, bool wide) {
    auto it = stats[wide].find(l);
    if (it == stats[wide].end()) it = stats[wide].emplace(l, compute_core_stat(l, wide)).first;
    return field == "p_null" ? it->second.first : it->second.second;
  }
  std::pair<Expected, Expected> compute_core_stat(index_t l, bool wide) const {
    const index_t H = c.n_heads, Hkv = c.kv_heads(), dh = c.head_dim();
    const std::string P = sub(l).name + ".";
    auto heads_of = [&](const char* f, index_t Hx) {  // [B, T, Hx dh] -> [B, Hx, T, dh]
      return om::append_heads(Tensor<double>(), read(P + f)->reshaped({N, Hx * dh}), B, Tn, Hx, dh);
    };
    const Tensor<double> qh = heads_of("attn_q", H), kh = heads_of("attn_k", Hkv), vh = heads_of("attn_v", Hkv);
    AttentionOptions ao = om::core_attention_options(c);
    ao.return_probs = true;
    const AttentionResult<Sc> ref = token_attention(qh.cast<Sc>(), kh.cast<Sc>(), vh.cast<Sc>(), ao);
    const bounds::AttentionBounds b = wide ? bounds::attention_bounds(qh, kh, vh, ao, ref)
                                           : bounds::attention_bounds(qh.cast<float>(), kh.cast<float>(), vh.cast<float>(), ao, ref);
    const std::string step = "token attention of " + sub(l).name + " on its own attn_q, attn_k, attn_v";
    return {Expected{ref.p_null, b.p_null, step}, Expected{ref.lse, b.lse, step}};
  }
};

}  // namespace oasis::verify::detail
