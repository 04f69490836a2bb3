// src/verify/model_checker_impl.hpp — the producers of the trace tensors (model_checker.hpp),
// generic over the reference scalar R; instantiated for R (model_checker_R.cpp) and double
// (model_checker_double.cpp). Included by those two files only.
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

/// u of the error model of a checked tensor: f64, else f32 (scaled to f16/bf16 by the caller).
double model_u(bool wide) { return io::dtype_eps(wide ? DType::f64 : DType::f32) / 2; }

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

template <class Sc>
ResolvedOf<Sc> from_rows(const Rows<Sc>& r) {
  ResolvedOf<Sc> o{r.x, Tensor<double>(r.x.shape())};
  const index_t w = r.w();
  for (index_t i = 0; i < o.e.size(); ++i) o.e[i] = r.e.empty() ? 0.0 : r.e[static_cast<std::size_t>(i / w)];
  return o;
}

/// Rows with the per-row maximum of the element bounds (the layer rules take row bounds).
template <class Sc>
Rows<Sc> to_rows(const ResolvedOf<Sc>& r) {
  const index_t n = r.x.dim(0), w = r.x.dim(1);
  Rows<Sc> o{r.x, std::vector<double>(static_cast<std::size_t>(n), 0.0)};
  for (index_t i = 0; i < n * w; ++i) o.e[static_cast<std::size_t>(i / w)] = std::max(o.e[static_cast<std::size_t>(i / w)], r.e[i]);
  return o;
}

Tensor<double> rows_bound(const std::vector<double>& e, index_t n, index_t w) {
  Tensor<double> b({n, w});
  for (index_t i = 0; i < n * w; ++i) b[i] = e.empty() ? 0.0 : e[static_cast<std::size_t>(i / w)];
  return b;
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
  ErrorModel em(bool wide) const { return ErrorModel{model_u(wide)}; }

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
  /// .p_null (psi policy 1.02 H u psi; p_null estimator only); else the attention core on its q, k, v
  /// (the mass-deficit estimator reads the probabilities, which the trace does not hold).
  Resolved branch_psi(index_t a, bool wide, bool use_own) {
    const std::string P = sub(a).name + ".";
    if (use_own)
      if (auto r = read_rows(P + "branch_psi")) return *r;
    const Tensor<double>* pn = c.psi_estimator == om::PsiEstimator::p_null ? read(P + "p_null") : nullptr;
    if (pn) {
      const Tensor<Sc> psi = null_statistic(pn->cast<Sc>());
      Resolved r{psi.reshaped({N, 1}), Tensor<double>({N, 1})};
      for (index_t i = 0; i < N; ++i)
        r.e[i] = bounds::kSecondOrder * static_cast<double>(c.n_heads) * model_u(wide) * static_cast<double>(psi[i]);
      return r;
    }
    const om::AttentionSublayer<Sc>& k = core(a, wide);
    return from_rows(Rows<Sc>{k.psi.reshaped({N, 1}), k.e_psi});
  }

  /// The psi candidate i of router r carries [N, 1]: the mean of its attention sublayers' psi;
  /// error rule of the model (mean of k: sum of the errors / k + (k + 1) u psi).
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
      acc.e[t] = acc.e[t] / k + (k + 1) * model_u(wide) * static_cast<double>(acc.x[t]);
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
    const double theta = m.theta_of(R.params);
    om::RouteResult<Sc> res =
        c.router == om::RouterFamily::authors_code
            ? om::authors_route(ptr, m.param(R.params + ".q_proj.weight"), m.param(R.params + ".k_proj.weight"),
                                m.param(R.params + ".recency_bias")[0], theta, c, em(wide))
            : om::kimi_route(ptr, m.param(R.params + ".query"), m.gain_of(R.params), theta, c, em(wide));
    return memo.emplace(r, std::move(res)).first->second;
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
    OASIS_REQUIRE(!c.gated_attention && !c.prefix_sink, name,
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
      const Tensor<double>& x = *read(P + f);
      Tensor<double> r({B, Hx, Tn, dh});
      for (index_t bb = 0; bb < B; ++bb)
        for (index_t hh = 0; hh < Hx; ++hh)
          for (index_t t = 0; t < Tn; ++t)
            for (index_t cc = 0; cc < dh; ++cc) r(bb, hh, t, cc) = x[(bb * Tn + t) * Hx * dh + hh * dh + cc];
      return r;
    };
    const Tensor<double> qh = heads_of("attn_q", H), kh = heads_of("attn_k", Hkv), vh = heads_of("attn_v", Hkv);
    AttentionOptions ao;  // as oasis::model::attention_core: the variant's normaliser, causal, scale 1/sqrt(d_h)
    ao.normalizer = c.token_norm();
    ao.causal = true;
    ao.return_probs = true;
    const AttentionResult<Sc> ref = token_attention(qh.cast<Sc>(), kh.cast<Sc>(), vh.cast<Sc>(), ao);
    const bounds::AttentionBounds b = wide ? bounds::attention_bounds(qh, kh, vh, ao, ref)
                                           : bounds::attention_bounds(qh.cast<float>(), kh.cast<float>(), vh.cast<float>(), ao, ref);
    const std::string step = "token attention of " + sub(l).name + " on its own attn_q, attn_k, attn_v";
    return {Expected{ref.p_null, b.p_null, step}, Expected{ref.lse, b.lse, step}};
  }
};

// ---------------------------------------------------------------------------------------------------

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
