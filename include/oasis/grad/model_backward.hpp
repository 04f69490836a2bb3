// oasis/grad/model_backward.hpp — the backward of the whole AttnRes model (docs/spec.md §2–4, §8).
//
// model_backward(m, ids, B, T, dlogits[, dstate, options]) returns the gradient of a loss L with
// dL/dlogits = dlogits (and dL/dstate = dstate for the readout state, optional) with respect to
// every parameter of parameter_specs(cfg), to the input embeddings, and per sublayer the gradient
// tensors of SublayerGradTrace (docs/model.md, "Backward"). The forward it differentiates is
// Model::run itself: detail::record_forward runs it with a ForwardRecord (every sublayer's input,
// every router's RouteResult), so the recorded logits are Model::forward's bit for bit, and the
// graph is the model's schedule (oasis/model/schedule.hpp: the steps compiled from wiring.hpp, the
// one definition of which value feeds which step). detail::backward_from_tape walks the steps
// back:
//
//   head       logits = W_head RMSNorm(state)       linear_backward, rms_norm_backward (+ tied: W_head = E)
//   sublayer   attention_sublayer_backward / mlp_sublayer_backward (grad/layers_backward.hpp), with the
//              branch's dL/dpsi from every later router that reads its psi
//   router     kimi_route_backward / authors_route_backward (grad/router_backward.hpp): the candidates
//              (mix + keys + query), their psi, the router's parameters; theta through softplus
//   add        a + b passes its gradient to both terms (block sums and partial sums, the authors'
//              residual + sublayer_out, the original backbone's stream, the sum and last readouts)
//   psi        a candidate's psi is the mean of the branch psi of its attention sublayers
//              (WiredCandidate::psi_from): each gets dpsi / n; a head-less candidate that inherits
//              psi passes its dpsi to the attention sublayer it inherits from; the embedding has none
//   embedding  embed_tokens.weight[id] accumulates the embedding gradient of every position holding id
//
// A slot's gradient is complete when its producer is reached (the steps are in forward order).
// ForwardOptions::products (the matrix products) serves the backward's products as well.
// Options: every configuration option of the forward is covered (uneven blocks, float32 norms:
// the norms' backward runs in float32 as their forward, as pseudo_query_logits_backward treats
// KeyNormOptions::compute_in_float32) except gated attention, the S2 prefix sink and token
// normalisers other than softmax / softmax1, rejected by name (require_backward_support). Of
// ForwardOptions, storage rounding (`store`) is differentiated straight through — its derivative
// is taken as the identity, as training code does, and every step's backward is evaluated at the
// stored values the forward computed with; fake quantisation (`quant`) and `error_u` are rejected
// by name; `trace` and `trace_probs` change nothing.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "oasis/grad/instances.hpp"
#include "oasis/grad/layers_backward.hpp"
#include "oasis/grad/router_backward.hpp"
#include "oasis/model/model.hpp"

namespace oasis::model {

/// Gradient tensors of one sublayer (or of the final readout router), named as SublayerTrace.
/// Empty tensors: not defined for this sublayer (e.g. no router in the original backbone).
template <class T>
struct SublayerGradTrace {
  std::string name;           ///< "layers.{b}.attn", "layers.{b}.mlp", "final_res"
  Tensor<T> grad_input;       ///< [B, T, d] dL/d input through this sublayer's function only
  Tensor<T> grad_output;      ///< [B, T, d] total dL/d raw sublayer output
  Tensor<T> grad_routed;      ///< [B, T, d] total dL/d this router's output (SublayerTrace::routed)
  Tensor<T> grad_branch_psi;  ///< [B, T] attention sublayers: total dL/d the branch's psi
  Tensor<T> grad_sources;     ///< [n, B, T, d] dL/d the router's candidates (mix + keys + query)
  Tensor<T> grad_g_old;       ///< [n, B, T] dL/d the router's logits before coupling (before the uncoupled clamp)
  Tensor<T> grad_psi;         ///< [n, B, T] dL/d the candidates' psi as given to the coupling (0 where not read)
};

/// The gradient fields of a sublayer's trace by field name, in declaration order (a trace tensor is
/// "<sublayer>.<field>"; empty ones are not defined for that sublayer).
template <class T>
std::vector<std::pair<const char*, const Tensor<T>*>> grad_trace_fields(const SublayerGradTrace<T>& tr) {
  return {{"grad_input", &tr.grad_input},   {"grad_output", &tr.grad_output}, {"grad_routed", &tr.grad_routed},
          {"grad_branch_psi", &tr.grad_branch_psi}, {"grad_sources", &tr.grad_sources},
          {"grad_g_old", &tr.grad_g_old},   {"grad_psi", &tr.grad_psi}};
}

/// Result of model_backward.
template <class T>
struct ModelGrads {
  std::map<std::string, Tensor<T>> params;  ///< every parameter of parameter_specs(cfg), same shapes
  Tensor<T> embeddings;                     ///< [B, T, d] dL/d the input embeddings
  Tensor<T> state;                          ///< [B, T, d] total dL/d the readout state
  Tensor<T> logits;                         ///< [B, T, V] the recomputed forward logits
  std::vector<SublayerGradTrace<T>> trace;  ///< in the order of ForwardResult::trace
};

/// The configurations and forward options the model backward covers; throws naming the option otherwise.
inline void require_backward_support(const ModelConfig& cfg, const ForwardOptions& opt) {
  require_backward_support(cfg);
  OASIS_REQUIRE(!opt.quant, "quant", "the model backward does not cover fake quantisation (straight-through "
                "conventions for the quantiser differ between training recipes)");
  OASIS_REQUIRE(opt.error_u == 0, "error_u", "the model backward derives no error bound (got error_u = ", opt.error_u, ")");
}

namespace detail {

/// The recorded forward of Model::run on a full sequence: its schedule (a copy: the tests edit it
/// to inject known mistakes) and the values the backward reads.
template <class T>
struct ModelTape {
  index_t B = 0, Tn = 0;
  ForwardSchedule schedule;
  ForwardRecord<T> record;              ///< every sublayer's input, every router's RouteResult
  Tensor<T> state;                      ///< [N, d] the readout state as computed (stored)
  Tensor<T> logits;                     ///< [B, T, V] as Model::run returned them
  StoreFn store = nullptr;              ///< the forward's storage rounding (straight-through)
  const MatrixProducts* products = nullptr;  ///< ForwardOptions::products, for the backward's products too
  /// Called on every router's gradients before they are used (the tests inject known mistakes).
  std::function<void(RouteGrads<T>&, index_t router)> adjust_route;
  bool tied_head_into_embedding = true; ///< tied embeddings: the LM head's gradient is added to the table
};

template <class T> void add_to(Tensor<T>& acc, const Tensor<T>& x) {
  for (index_t i = 0; i < acc.size(); ++i) acc[i] += x[i];
}
template <class T> void add_slice(Tensor<T>& acc, const Tensor<T>& stacked, index_t i) {
  const T* s = stacked.ptr(i);
  for (index_t k = 0; k < acc.size(); ++k) acc[k] += s[k];
}

/// Runs Model::run (fresh state, full sequence) on the embedding rows x0, recording it.
template <class T>
ModelTape<T> record_forward(const Model<T>& m, Rows<T> x0, index_t B, index_t Tn, const ForwardOptions& opt) {
  require_backward_support(m.config(), opt);
  ModelTape<T> tp;
  tp.B = B;
  tp.Tn = Tn;
  tp.schedule = m.schedule();
  tp.store = opt.store;
  tp.products = opt.products;
  ForwardOptions fo;
  fo.store = opt.store;
  fo.products = opt.products;
  DecodeState<T> st = m.new_state(B);
  ForwardResult<T> f = m.run(st, std::move(x0), B, Tn, fo, &tp.record);
  tp.state = f.state.reshaped({B * Tn, m.config().d_model});
  tp.logits = std::move(f.logits);
  return tp;
}

/// The backward of a recorded forward (header comment).
template <class T>
ModelGrads<T> backward_from_tape(const Model<T>& m, const ModelTape<T>& tp, const Tensor<T>& dlogits, const Tensor<T>& dstate_in) {
  const ModelConfig& cfg = m.config();
  const ModelWiring& w = tp.schedule.wiring;
  const index_t B = tp.B, Tn = tp.Tn, N = B * Tn, d = cfg.d_model, V = cfg.vocab_size;
  OASIS_REQUIRE(dlogits.shape() == (Shape{B, Tn, V}), "dlogits", "shape ", shape_str(dlogits.shape()),
                " is not [B, T, vocab] = ", shape_str(Shape{B, Tn, V}));
  OASIS_REQUIRE(dstate_in.empty() || dstate_in.shape() == (Shape{B, Tn, d}), "dstate", "shape ",
                shape_str(dstate_in.shape()), " is not [B, T, d] = ", shape_str(Shape{B, Tn, d}));
  require_finite(dlogits, "dlogits");
  require_finite(dstate_in, "dstate");
  const ErrorModel em{0, tp.products};
  auto btd = [&](const Tensor<T>& rows) { return rows.reshaped({B, Tn, rows.dim(1)}); };
  ModelGrads<T> res;
  for (const ParamSpec& p : parameter_specs(cfg)) res.params.emplace(p.name, Tensor<T>(p.shape));
  std::map<std::string, Tensor<T>>& P = res.params;
  const bool coupled = variant_spec(cfg.variant).coupling;
  res.logits = tp.logits;

  // head: logits = W_head RMSNorm(state) (Model::head; the logits' storage rounding: straight through)
  const Tensor<T>& W_head = m.param(cfg.tie_embeddings ? "embed_tokens.weight" : "lm_head.weight");
  const Rows<T> xn = rms_norm(Rows<T>{tp.state, {}}, m.param("norm.weight"), cfg.norm_options(), em);
  const LinearGrads<T> gh = linear_backward(xn.x, W_head, dlogits.reshaped({N, V}), tp.products);
  if (!cfg.tie_embeddings) add_to(P.at("lm_head.weight"), gh.W);
  else if (tp.tied_head_into_embedding) add_to(P.at("embed_tokens.weight"), gh.W);
  NormGrads<T> gn = rms_norm_backward(tp.state, m.param("norm.weight"), cfg.norm_options(), gh.x);
  add_to(P.at("norm.weight"), gn.gain);
  Tensor<T> dstate = std::move(gn.x);
  if (!dstate_in.empty()) add_to(dstate, dstate_in.reshaped({N, d}));
  res.state = btd(dstate);

  const std::size_t L = w.sublayers.size();
  std::vector<Tensor<T>> dslot(static_cast<std::size_t>(tp.schedule.slots));
  auto grad_of = [&](index_t k) -> Tensor<T>& {
    Tensor<T>& g = dslot[static_cast<std::size_t>(k)];
    if (g.empty()) g = Tensor<T>({N, d});
    return g;
  };
  std::vector<Tensor<T>> dpsi(L, Tensor<T>({N}));  // of each attention branch
  grad_of(tp.schedule.state) = dstate;
  res.trace.resize(static_cast<std::size_t>(tp.schedule.trace_entries));
  for (std::size_t l = 0; l < L; ++l) res.trace[l].name = w.sublayers[l].name;
  for (std::size_t r = 0; r < w.routers.size(); ++r)
    res.trace[static_cast<std::size_t>(tp.schedule.router_trace[r])].name = w.routers[r].trace;
  for (auto it = tp.schedule.steps.rbegin(); it != tp.schedule.steps.rend(); ++it) {
    const ScheduledStep& s = *it;
    const Tensor<T> dout = grad_of(s.out);  // complete: every reader came later
    dslot[static_cast<std::size_t>(s.out)] = Tensor<T>();
    const std::size_t k = static_cast<std::size_t>(s.index);
    if (s.kind == ScheduledStep::Kind::add) {  // stored sums: straight through
      for (index_t j : s.in) add_to(grad_of(j), dout);
    } else if (s.kind == ScheduledStep::Kind::router) {
      SublayerGradTrace<T>& tr = res.trace[static_cast<std::size_t>(tp.schedule.router_trace[k])];
      const RouteResult<T>& r = tp.record.routes[k];
      const DepthCotangents<T> cot{dout, {}, {}};
      const std::string& R = w.routers[k].params;
      RouteGrads<T> g;
      if (cfg.router == RouterFamily::authors_code) {
        g = authors_route_backward(r.sources, m.param(R + ".q_proj.weight"), m.param(R + ".k_proj.weight"),
                                   m.param(R + ".recency_bias")[0], r.psi, r.kinds, r.options, cot);
      } else {
        g = kimi_route_backward(r.sources, m.param(R + ".query"), m.gain_of(R), cfg.key_norm, r.psi, r.kinds, r.options, cot);
      }
      if (tp.adjust_route) tp.adjust_route(g, s.index);
      if (cfg.router == RouterFamily::authors_code) {
        add_to(P.at(R + ".q_proj.weight"), g.authors.wq);
        add_to(P.at(R + ".k_proj.weight"), g.authors.wk);
        P.at(R + ".recency_bias")[0] += g.authors.recency;
      } else {
        add_to(P.at(R + ".query"), g.kimi.w);
        if (cfg.key_norm_gain) add_to(P.at(R + ".key_norm.weight"), g.kimi.gain);
      }
      if (coupled) P.at(R + ".theta")[0] += g.depth.theta;
      const index_t n = r.g_old.dim(0);
      tr.grad_routed = btd(dout);
      tr.grad_sources = g.sources.reshaped({n, B, Tn, d});
      tr.grad_g_old = g.g_old.reshaped({n, B, Tn});
      tr.grad_psi = g.depth.psi.reshaped({n, B, Tn});
      for (std::size_t i = 0; i < s.in.size(); ++i) {
        add_slice(grad_of(s.in[i]), g.sources, static_cast<index_t>(i));
        const std::vector<index_t>& from = w.routers[k].candidates[i].psi_from;
        for (index_t a : from)  // the mean's gradient (a mean of several stored: straight through)
          for (index_t t = 0; t < N; ++t)
            dpsi[static_cast<std::size_t>(a)][t] += g.depth.psi(static_cast<index_t>(i), t) / T(static_cast<double>(from.size()));
      }
    } else {
      SublayerGradTrace<T>& tr = res.trace[k];
      const WiredSublayer& S = w.sublayers[k];
      const std::string L0 = "layers." + std::to_string(S.block);
      const Tensor<T>& h = tp.record.inputs[k];
      Tensor<T> dh;
      if (S.kind == SublayerKind::attention) {
        const AttentionSublayerGrads<T> g = attention_sublayer_backward(h, B, Tn, m.attn_weights(S.block), cfg, dout,
                                                                        dpsi[k].reshaped({B, Tn}), tp.store,
                                                                        tp.products);
        add_to(P.at(L0 + ".attn_norm.weight"), g.norm);
        add_to(P.at(L0 + ".attn.q_proj.weight"), g.wq);
        add_to(P.at(L0 + ".attn.k_proj.weight"), g.wk);
        add_to(P.at(L0 + ".attn.v_proj.weight"), g.wv);
        add_to(P.at(L0 + ".attn.o_proj.weight"), g.wo);
        if (cfg.qk_norm) {
          add_to(P.at(L0 + ".attn.q_norm.weight"), g.q_norm);
          add_to(P.at(L0 + ".attn.k_norm.weight"), g.k_norm);
        }
        tr.grad_branch_psi = dpsi[k].reshaped({B, Tn});
        dh = g.h;
      } else {
        const MlpSublayerGrads<T> g = mlp_sublayer_backward(h, m.mlp_weights(S.block), cfg, dout, tp.store, tp.products);
        add_to(P.at(L0 + ".mlp_norm.weight"), g.norm);
        add_to(P.at(L0 + ".mlp.gate_proj.weight"), g.gate);
        add_to(P.at(L0 + ".mlp.up_proj.weight"), g.up);
        add_to(P.at(L0 + ".mlp.down_proj.weight"), g.down);
        dh = g.h;
      }
      tr.grad_output = btd(dout);
      tr.grad_input = btd(dh);
      add_to(grad_of(s.in[0]), dh);
    }
  }
  res.embeddings = btd(grad_of(0));  // the embedding rows' storage rounding: straight through
  return res;
}

/// embed_tokens.weight[id] += the embedding gradient of every position holding id (row order).
template <class T>
void accumulate_embedding_table(ModelGrads<T>& g, const std::vector<index_t>& ids) {
  Tensor<T>& E = g.params.at("embed_tokens.weight");
  const index_t d = E.dim(1);
  for (std::size_t r = 0; r < ids.size(); ++r) {
    T* e = E.ptr(ids[r]);
    const T* x = g.embeddings.data() + static_cast<index_t>(r) * d;
    for (index_t c = 0; c < d; ++c) e[c] += x[c];
  }
}

}  // namespace detail

/// Gradients of a loss with dL/dlogits = dlogits [B, T, vocab] (and dL/dstate = dstate [B, T, d]
/// of the readout state, empty: 0) for the forward of token ids [B * T] (row-major (b, t)) under
/// the forward options `opt` (header comment: storage rounding straight through).
template <class T>
ModelGrads<T> model_backward(const Model<T>& m, const std::vector<index_t>& ids, index_t B, index_t Tn,
                             const Tensor<T>& dlogits, const Tensor<T>& dstate = {}, const ForwardOptions& opt = {}) {
  ModelGrads<T> g = detail::backward_from_tape(m, detail::record_forward(m, m.embed(ids, B, Tn), B, Tn, opt), dlogits, dstate);
  detail::accumulate_embedding_table(g, ids);
  return g;
}

/// The same for the forward of input embeddings x [B, T, d] (Model::forward_embeddings): the
/// embedding table then receives only the tied LM head's gradient.
template <class T>
ModelGrads<T> model_backward_embeddings(const Model<T>& m, const Tensor<T>& x, const Tensor<T>& dlogits,
                                        const Tensor<T>& dstate = {}, const ForwardOptions& opt = {}) {
  require_rank(x, 3, "x", "[B, T, d]");
  return detail::backward_from_tape(m, detail::record_forward(m, m.embed_rows(x), x.dim(0), x.dim(1), opt), dlogits,
                                    dstate);
}

}  // namespace oasis::model

// The compiled library instantiates model_backward for float, double, long double
// (src/core/model_grad_builtin.cpp) and oasis::mp50 (src/core/model_grad_mp50.cpp).
#define OASIS_MODEL_GRAD_INSTANCES(EXT, T)                                                                      \
  EXT template ::oasis::model::ModelGrads<T> oasis::model::model_backward<T>(                                   \
      const ::oasis::model::Model<T>&, const std::vector<::oasis::index_t>&, ::oasis::index_t, ::oasis::index_t, \
      const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&, const ::oasis::model::ForwardOptions&);              \
  EXT template ::oasis::model::ModelGrads<T> oasis::model::model_backward_embeddings<T>(                         \
      const ::oasis::model::Model<T>&, const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&, \
      const ::oasis::model::ForwardOptions&);                                                                   \
  EXT template ::oasis::model::detail::ModelTape<T> oasis::model::detail::record_forward<T>(                    \
      const ::oasis::model::Model<T>&, ::oasis::model::Rows<T>, ::oasis::index_t, ::oasis::index_t,             \
      const ::oasis::model::ForwardOptions&);                                                                   \
  EXT template ::oasis::model::ModelGrads<T> oasis::model::detail::backward_from_tape<T>(                      \
      const ::oasis::model::Model<T>&, const ::oasis::model::detail::ModelTape<T>&, const ::oasis::Tensor<T>&,  \
      const ::oasis::Tensor<T>&);
#if defined(OASIS_COMPILED_INSTANCES) && !defined(OASIS_MODEL_GRAD_INSTANTIATING)
OASIS_MODEL_GRAD_INSTANCES(extern, float)
OASIS_MODEL_GRAD_INSTANCES(extern, double)
OASIS_MODEL_GRAD_INSTANCES(extern, long double)
OASIS_MODEL_GRAD_INSTANCES(extern, ::oasis::mp50)
#endif
