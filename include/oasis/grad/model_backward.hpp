// oasis/grad/model_backward.hpp — the backward of the whole AttnRes model (SPEC §2–4, §8).
//
// model_backward(m, ids, B, T, dlogits[, dstate]) returns the gradient of a loss L with
// dL/dlogits = dlogits (and dL/dstate = dstate for the readout state, optional) with respect to
// every parameter of parameter_specs(cfg), to the input embeddings, and per sublayer the gradient
// tensors of SublayerGradTrace (docs/model.md, "Backward"). It first records the forward exactly
// as Model::run computes it for a full sequence (detail::record_forward: the same layer and router
// functions, so the recomputed logits equal Model::forward's bit for bit, a tested property) as a
// graph: nodes are the embedding, every sublayer output and every router output; a sublayer input,
// a router candidate and the readout state are sums of nodes (the wiring of Model::run written
// down once), then walks the steps back (detail::backward_from_tape):
//
//   head       logits = W_head RMSNorm(state)       linear_backward, rms_norm_backward (+ tied: W_head = E)
//   readout    final_attnres: kimi_route_backward; sum: every source gets dstate; last: h_L and v_L get it
//   sublayer   attention_sublayer_backward / mlp_sublayer_backward (grad/layers_backward.hpp), with the
//              branch's dL/dpsi from every later router that reads its psi
//   router     kimi_route_backward / authors_route_backward (grad/router_backward.hpp): the candidates
//              (mix + keys + query), their psi, the router's parameters; theta through softplus
//   wiring     a candidate that is a sum (Block AttnRes b_n, partial sums; the authors' residual +
//              sublayer_out) passes its gradient to every term; a block's psi (mean over its attention
//              sublayers) passes dpsi / n_attn to each; a head-less candidate that inherits psi passes
//              its dpsi to the attention sublayer it inherits from; the embedding's psi is never read
//   embedding  embed_tokens.weight[id] accumulates the embedding gradient of every position holding id
//
// Every node's gradient is complete when its producer is reached (the steps are in forward order).
// Gated attention and the S2 prefix sink are rejected by name (require_backward_support); fake
// quantisation is not part of the backward (it takes no ForwardOptions).
#pragma once

#include <functional>
#include <map>
#include <string>
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

/// Result of model_backward.
template <class T>
struct ModelGrads {
  std::map<std::string, Tensor<T>> params;  ///< every parameter of parameter_specs(cfg), same shapes
  Tensor<T> embeddings;                     ///< [B, T, d] dL/d the input embeddings
  Tensor<T> state;                          ///< [B, T, d] total dL/d the readout state
  Tensor<T> logits;                         ///< [B, T, V] the recomputed forward logits
  std::vector<SublayerGradTrace<T>> trace;  ///< in the order of ForwardResult::trace
};

namespace detail {

/// A sum of graph nodes (a router candidate, a sublayer input, the readout state) and, for a
/// candidate, where its psi comes from: the mean of the branch psi of the attention sublayers
/// psi_from, divided by psi_div (0: no psi, e.g. the embedding).
struct NodeSum {
  std::vector<index_t> nodes;
  std::vector<index_t> psi_from;
  index_t psi_div = 0;
};

/// One step of the recorded forward: a sublayer (attention or MLP) or a depth router.
template <class T>
struct TapeStep {
  bool is_router = false;
  index_t sublayer = 0;        ///< sublayer index l (router: the trace entry it belongs to; L: final_res)
  std::string name;            ///< sublayer: "layers.{b}.attn"; router: its parameter prefix "layers.{b}.attn_res"
  NodeSum input;               ///< sublayer: the nodes its input is the sum of
  Tensor<T> input_value;       ///< sublayer: the input as computed [N, d]
  index_t out = 0;             ///< the node this step produces
  RouteResult<T> route;        ///< router: the forward's routing (stacked candidates, psi, kinds, options)
  std::vector<NodeSum> candidates;  ///< router: each candidate as a sum of nodes
};

/// The recorded forward of Model::run on a full sequence: nodes are the embedding (node 0), every
/// sublayer output and every router output; steps in forward order (a topological order).
template <class T>
struct ModelTape {
  index_t B = 0, Tn = 0;
  index_t n_nodes = 1;
  std::vector<TapeStep<T>> steps;
  NodeSum state;                        ///< the readout state as a sum of nodes
  Tensor<T> state_value;                ///< [N, d] as computed
  Tensor<T> embeddings;                 ///< [N, d] node 0
  /// Called on every router's gradients before they are used (the tests inject known mistakes).
  std::function<void(RouteGrads<T>&, const TapeStep<T>&)> adjust_route;
  bool tied_head_into_embedding = true; ///< tied embeddings: the LM head's gradient is added to the table
};

template <class T> void add_to(Tensor<T>& acc, const Tensor<T>& x) {
  for (index_t i = 0; i < acc.size(); ++i) acc[i] += x[i];
}
template <class T> void add_slice(Tensor<T>& acc, const Tensor<T>& stacked, index_t i) {
  const T* s = stacked.ptr(i);
  for (index_t k = 0; k < acc.size(); ++k) acc[k] += s[k];
}

/// Records the forward of Model::run (fresh state, full sequence) from the embedding rows x0.
template <class T>
ModelTape<T> record_forward(const Model<T>& m, const Rows<T>& x0, index_t B, index_t Tn) {
  const ModelConfig& cfg = m.config();
  require_backward_support(cfg);
  const index_t N = B * Tn, L = cfg.n_sublayers();
  const ErrorModel em{};
  ModelTape<T> tp;
  tp.B = B;
  tp.Tn = Tn;
  tp.embeddings = x0.x;
  auto lname = [](index_t b) { return "layers." + std::to_string(b); };
  auto new_node = [&] { return tp.n_nodes++; };
  // a sublayer step on input h (= the sum `in` of nodes); returns its output and, for attention, psi
  auto sublayer = [&](index_t l, const Rows<T>& h, NodeSum in, Tensor<T>* psi) {
    TapeStep<T> s;
    s.sublayer = l;
    s.name = lname(l / 2) + (l % 2 == 0 ? ".attn" : ".mlp");
    s.input = std::move(in);
    s.input_value = h.x;
    s.out = new_node();
    Rows<T> out;
    if (l % 2 == 0) {
      KVCache<T> kv;
      const AttentionSublayer<T> a = attention_sublayer(h, B, Tn, 0, m.attn_weights(l / 2), cfg, kv, em);
      *psi = flat_psi(a.psi);
      out = a.out;
    } else {
      out = mlp_sublayer(h, m.mlp_weights(l / 2), cfg, em);
    }
    tp.steps.push_back(std::move(s));
    return std::make_pair(out, tp.steps.back().out);
  };
  auto router = [&](index_t l, const std::string& R, RouteResult<T> r, std::vector<NodeSum> cands) {
    TapeStep<T> s;
    s.is_router = true;
    s.sublayer = l;
    s.name = R;
    s.route = std::move(r);
    s.candidates = std::move(cands);
    s.out = new_node();
    tp.steps.push_back(std::move(s));
    return tp.steps.back().out;
  };
  auto authors = [&](const std::vector<const DepthSource<T>*>& c, const std::string& R) {
    return authors_route(c, m.param(R + ".q_proj.weight"), m.param(R + ".k_proj.weight"), m.param(R + ".recency_bias")[0],
                         m.theta_of(R), cfg, em);
  };
  Tensor<T> psi;
  if (!cfg.attn_res()) {
    // x <- x + f(RMSNorm(x)): every sublayer input is the sum of the embedding and the earlier outputs
    Rows<T> x = x0;
    NodeSum xs{{0}, {}, 0};
    for (index_t l = 0; l < L; ++l) {
      const auto [out, node] = sublayer(l, x, xs, &psi);
      x = add_rows(x, out, em);
      xs.nodes.push_back(node);
    }
    tp.state = xs;
    tp.state_value = x.x;
  } else if (cfg.router == RouterFamily::authors_code) {
    // candidates [embedding, earlier block outputs, residual + sublayer_out] (Model::run)
    std::vector<DepthSource<T>> hist;
    std::vector<NodeSum> hist_w;
    hist.push_back({x0, SourceKind::initial, Tensor<T>({N}), {}, "embedding"});
    hist_w.push_back({{0}, {}, 0});
    for (index_t b = 0; b < cfg.n_blocks; ++b) {
      const index_t la = 2 * b;
      const Rows<T> x = hist.back().v;
      const index_t x_node = hist_w.back().nodes[0];
      const auto [a_out, a_node] = sublayer(la, x, NodeSum{{x_node}, {}, 0}, &psi);
      const Tensor<T> psi_b = psi;
      const DepthSource<T> c_sa{add_rows(x, a_out, em), SourceKind::attention, psi_b, {}, ""};
      std::vector<const DepthSource<T>*> cands;
      std::vector<NodeSum> cw = hist_w;
      for (const auto& s : hist) cands.push_back(&s);
      cands.push_back(&c_sa);
      cw.push_back({{x_node, a_node}, {la}, 1});
      RouteResult<T> r1 = authors(cands, lname(b) + ".attn_res");
      const Rows<T> r1h = r1.h;
      const index_t r1_node = router(la, lname(b) + ".attn_res", std::move(r1), cw);
      const auto [m_out, m_node] = sublayer(la + 1, r1h, NodeSum{{r1_node}, {}, 0}, &psi);
      const DepthSource<T> c_mlp{add_rows(r1h, m_out, em), SourceKind::headless, psi_b, {}, ""};
      cands.push_back(&c_mlp);
      cw.push_back({{r1_node, m_node}, {la}, 1});
      RouteResult<T> r2 = authors(cands, lname(b) + ".mlp_res");
      const Rows<T> x2 = r2.h;
      const index_t r2_node = router(la + 1, lname(b) + ".mlp_res", std::move(r2), cw);
      hist.push_back({x2, SourceKind::headless, psi_b, {}, ""});
      hist_w.push_back({{r2_node}, {la}, 1});
    }
    tp.state = NodeSum{{hist_w.back().nodes[0]}, {}, 0};
    tp.state_value = hist.back().v.x;
  } else {
    // Kimi Full (S = 1) and Block AttnRes: completed sources and the partial sum of the current block
    const index_t S = cfg.router == RouterFamily::kimi_full ? 1 : cfg.block_size;
    std::vector<DepthSource<T>> done;
    std::vector<NodeSum> done_w;
    done.push_back({x0, SourceKind::initial, Tensor<T>({N}), {}, "embedding"});
    done_w.push_back({{0}, {}, 0});
    DepthSource<T> partial;
    NodeSum partial_w;
    Tensor<T> psi_sum, last_psi;
    index_t n_attn = 0, last_attn = -1;
    std::vector<index_t> attn_in_block;
    Rows<T> last_h, last_out;
    index_t last_h_node = 0, last_out_node = 0;
    for (index_t l = 0; l < L; ++l) {
      const index_t b = l / 2, i = l % S;
      const bool is_attn = l % 2 == 0;
      const std::string R = lname(b) + (is_attn ? ".attn_res" : ".mlp_res");
      std::vector<const DepthSource<T>*> cands;
      std::vector<NodeSum> cw = done_w;
      for (const auto& s : done) cands.push_back(&s);
      if (i > 0) {
        cands.push_back(&partial);
        cw.push_back(partial_w);
      }
      RouteResult<T> r = kimi_route(cands, m.param(R + ".query"), m.gain_of(R), m.theta_of(R), cfg, em);
      const Rows<T> h = r.h;
      const index_t h_node = router(l, R, std::move(r), cw);
      const auto [out, out_node] = sublayer(l, h, NodeSum{{h_node}, {}, 0}, &psi);
      if (is_attn) {
        last_psi = psi;
        last_attn = l;
      }
      // block bookkeeping, as Model::run
      if (i == 0) {
        partial = DepthSource<T>{out, SourceKind::headless, Tensor<T>({N}), {}, ""};
        partial_w = NodeSum{{out_node}, {}, 0};
        psi_sum = Tensor<T>({N});
        n_attn = 0;
        attn_in_block.clear();
      } else {
        partial.v = add_rows(partial.v, out, em);
        partial_w.nodes.push_back(out_node);
      }
      if (is_attn) {
        for (index_t t = 0; t < N; ++t) psi_sum[t] += last_psi[t];
        ++n_attn;
        attn_in_block.push_back(l);
      }
      if (n_attn > 0) {
        partial.kind = SourceKind::attention;
        partial.psi = Tensor<T>({N});
        for (index_t t = 0; t < N; ++t) partial.psi[t] = psi_sum[t] / T(n_attn);
        partial_w.psi_from = attn_in_block;
        partial_w.psi_div = n_attn;
      } else {  // a block without attention inherits the psi of the last attention sublayer
        partial.kind = SourceKind::headless;
        partial.psi = last_psi;
        partial_w.psi_from = {last_attn};
        partial_w.psi_div = 1;
      }
      if (i == S - 1 || l == L - 1) {
        done.push_back(partial);
        done_w.push_back(partial_w);
      }
      last_h = h;
      last_out = out;
      last_h_node = h_node;
      last_out_node = out_node;
    }
    const Readout ro = cfg.readout_or_default();
    if (ro == Readout::final_attnres) {
      std::vector<const DepthSource<T>*> cands;
      for (const auto& s : done) cands.push_back(&s);
      RouteResult<T> r = kimi_route(cands, m.param("final_res.query"), m.gain_of("final_res"), m.theta_of("final_res"), cfg, em);
      tp.state_value = r.h.x;
      tp.state = NodeSum{{router(L, "final_res", std::move(r), done_w)}, {}, 0};
    } else if (ro == Readout::sum) {
      Rows<T> st = done[0].v;
      for (std::size_t k = 1; k < done.size(); ++k) st = add_rows(st, done[k].v, em);
      tp.state_value = st.x;
      for (const NodeSum& w : done_w) tp.state.nodes.insert(tp.state.nodes.end(), w.nodes.begin(), w.nodes.end());
    } else {  // the last routed state handed on: h_L + v_L
      tp.state_value = add_rows(last_h, last_out, em).x;
      tp.state = NodeSum{{last_h_node, last_out_node}, {}, 0};
    }
  }
  return tp;
}

/// The backward of a recorded forward (header comment).
template <class T>
ModelGrads<T> backward_from_tape(const Model<T>& m, const ModelTape<T>& tp, const Tensor<T>& dlogits, const Tensor<T>& dstate_in) {
  const ModelConfig& cfg = m.config();
  const index_t B = tp.B, Tn = tp.Tn, N = B * Tn, d = cfg.d_model, V = cfg.vocab_size, L = cfg.n_sublayers();
  OASIS_REQUIRE(dlogits.shape() == (Shape{B, Tn, V}), "dlogits", "shape ", shape_str(dlogits.shape()),
                " is not [B, T, vocab] = ", shape_str(Shape{B, Tn, V}));
  OASIS_REQUIRE(dstate_in.empty() || dstate_in.shape() == (Shape{B, Tn, d}), "dstate", "shape ",
                shape_str(dstate_in.shape()), " is not [B, T, d] = ", shape_str(Shape{B, Tn, d}));
  require_finite(dlogits, "dlogits");
  require_finite(dstate_in, "dstate");
  const ErrorModel em{};
  const KeyNormOptions pre{cfg.norm_eps, false};
  auto btd = [&](const Tensor<T>& rows) { return rows.reshaped({B, Tn, rows.dim(1)}); };
  ModelGrads<T> res;
  for (const ParamSpec& p : parameter_specs(cfg)) res.params.emplace(p.name, Tensor<T>(p.shape));
  std::map<std::string, Tensor<T>>& P = res.params;
  const bool coupled = variant_spec(cfg.variant).coupling;

  // head: logits = W_head RMSNorm(state)
  const Tensor<T>& W_head = m.param(cfg.tie_embeddings ? "embed_tokens.weight" : "lm_head.weight");
  const Rows<T> xn = rms_norm(Rows<T>{tp.state_value, {}}, m.param("norm.weight"), pre, em);
  res.logits = btd(linear(xn, W_head, em).x);
  const LinearGrads<T> gh = linear_backward(xn.x, W_head, dlogits.reshaped({N, V}));
  if (!cfg.tie_embeddings) add_to(P.at("lm_head.weight"), gh.W);
  else if (tp.tied_head_into_embedding) add_to(P.at("embed_tokens.weight"), gh.W);
  NormGrads<T> gn = rms_norm_backward(tp.state_value, m.param("norm.weight"), pre, gh.x);
  add_to(P.at("norm.weight"), gn.gain);
  Tensor<T> dstate = std::move(gn.x);
  if (!dstate_in.empty()) add_to(dstate, dstate_in.reshaped({N, d}));
  res.state = btd(dstate);

  std::vector<Tensor<T>> dnode(static_cast<std::size_t>(tp.n_nodes), Tensor<T>({N, d}));
  std::vector<Tensor<T>> dpsi(static_cast<std::size_t>(L), Tensor<T>({N}));  // of each attention branch
  for (index_t node : tp.state.nodes) add_to(dnode[static_cast<std::size_t>(node)], dstate);
  res.trace.resize(static_cast<std::size_t>(L));
  for (index_t l = 0; l < L; ++l)
    res.trace[static_cast<std::size_t>(l)].name = "layers." + std::to_string(l / 2) + (l % 2 == 0 ? ".attn" : ".mlp");
  bool final_res = false;
  for (auto it = tp.steps.rbegin(); it != tp.steps.rend(); ++it) {
    const TapeStep<T>& s = *it;
    const Tensor<T>& dout = dnode[static_cast<std::size_t>(s.out)];  // complete: every consumer came later
    if (s.is_router) {
      if (s.sublayer == L && !final_res) {
        res.trace.push_back(SublayerGradTrace<T>{});
        res.trace.back().name = "final_res";
        final_res = true;
      }
      SublayerGradTrace<T>& tr = res.trace[static_cast<std::size_t>(s.sublayer)];
      const RouteResult<T>& r = s.route;
      const DepthCotangents<T> cot{dout, {}, {}};
      const std::string& R = s.name;
      RouteGrads<T> g;
      if (cfg.router == RouterFamily::authors_code) {
        g = authors_route_backward(r.sources, m.param(R + ".q_proj.weight"), m.param(R + ".k_proj.weight"),
                                   m.param(R + ".recency_bias")[0], r.psi, r.kinds, r.options, cot);
      } else {
        g = kimi_route_backward(r.sources, m.param(R + ".query"), m.gain_of(R), cfg.key_norm, r.psi, r.kinds, r.options, cot);
      }
      if (tp.adjust_route) tp.adjust_route(g, s);
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
      for (std::size_t k = 0; k < s.candidates.size(); ++k) {
        const NodeSum& c = s.candidates[k];
        for (index_t node : c.nodes) add_slice(dnode[static_cast<std::size_t>(node)], g.sources, static_cast<index_t>(k));
        for (index_t a : c.psi_from)
          for (index_t t = 0; t < N; ++t)
            dpsi[static_cast<std::size_t>(a)][t] += g.depth.psi(static_cast<index_t>(k), t) / T(c.psi_div);
      }
    } else {
      SublayerGradTrace<T>& tr = res.trace[static_cast<std::size_t>(s.sublayer)];
      const index_t l = s.sublayer, b = l / 2;
      const std::string L0 = "layers." + std::to_string(b);
      Tensor<T> dh;
      if (l % 2 == 0) {
        const AttentionSublayerGrads<T> g = attention_sublayer_backward(s.input_value, B, Tn, m.attn_weights(b), cfg, dout,
                                                                        dpsi[static_cast<std::size_t>(l)].reshaped({B, Tn}));
        add_to(P.at(L0 + ".attn_norm.weight"), g.norm);
        add_to(P.at(L0 + ".attn.q_proj.weight"), g.wq);
        add_to(P.at(L0 + ".attn.k_proj.weight"), g.wk);
        add_to(P.at(L0 + ".attn.v_proj.weight"), g.wv);
        add_to(P.at(L0 + ".attn.o_proj.weight"), g.wo);
        if (cfg.qk_norm) {
          add_to(P.at(L0 + ".attn.q_norm.weight"), g.q_norm);
          add_to(P.at(L0 + ".attn.k_norm.weight"), g.k_norm);
        }
        tr.grad_branch_psi = dpsi[static_cast<std::size_t>(l)].reshaped({B, Tn});
        dh = g.h;
      } else {
        const MlpSublayerGrads<T> g = mlp_sublayer_backward(s.input_value, m.mlp_weights(b), cfg, dout);
        add_to(P.at(L0 + ".mlp_norm.weight"), g.norm);
        add_to(P.at(L0 + ".mlp.gate_proj.weight"), g.gate);
        add_to(P.at(L0 + ".mlp.up_proj.weight"), g.up);
        add_to(P.at(L0 + ".mlp.down_proj.weight"), g.down);
        dh = g.h;
      }
      tr.grad_output = btd(dout);
      tr.grad_input = btd(dh);
      for (index_t node : s.input.nodes) add_to(dnode[static_cast<std::size_t>(node)], dh);
    }
  }
  res.embeddings = btd(dnode[0]);
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
/// of the readout state, empty: 0) for the forward of token ids [B * T] (row-major (b, t)).
template <class T>
ModelGrads<T> model_backward(const Model<T>& m, const std::vector<index_t>& ids, index_t B, index_t Tn,
                             const Tensor<T>& dlogits, const Tensor<T>& dstate = {}) {
  ModelGrads<T> g = detail::backward_from_tape(m, detail::record_forward(m, m.embed(ids, B, Tn), B, Tn), dlogits, dstate);
  detail::accumulate_embedding_table(g, ids);
  return g;
}

/// The same for the forward of input embeddings x [B, T, d] (Model::forward_embeddings): the
/// embedding table then receives only the tied LM head's gradient.
template <class T>
ModelGrads<T> model_backward_embeddings(const Model<T>& m, const Tensor<T>& x, const Tensor<T>& dlogits,
                                        const Tensor<T>& dstate = {}) {
  require_rank(x, 3, "x", "[B, T, d]");
  return detail::backward_from_tape(m, detail::record_forward(m, m.embed_rows(x), x.dim(0), x.dim(1)), dlogits, dstate);
}

}  // namespace oasis::model

// The compiled library instantiates model_backward for float, double, long double
// (src/core/model_grad_builtin.cpp) and oasis::mp50 (src/core/model_grad_mp50.cpp).
#define OASIS_MODEL_GRAD_INSTANCES(EXT, T)                                                                      \
  EXT template ::oasis::model::ModelGrads<T> oasis::model::model_backward<T>(                                   \
      const ::oasis::model::Model<T>&, const std::vector<::oasis::index_t>&, ::oasis::index_t, ::oasis::index_t, \
      const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&);                                                    \
  EXT template ::oasis::model::ModelGrads<T> oasis::model::model_backward_embeddings<T>(                         \
      const ::oasis::model::Model<T>&, const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&, const ::oasis::Tensor<T>&); \
  EXT template ::oasis::model::detail::ModelTape<T> oasis::model::detail::record_forward<T>(                    \
      const ::oasis::model::Model<T>&, const ::oasis::model::Rows<T>&, ::oasis::index_t, ::oasis::index_t);     \
  EXT template ::oasis::model::ModelGrads<T> oasis::model::detail::backward_from_tape<T>(                      \
      const ::oasis::model::Model<T>&, const ::oasis::model::detail::ModelTape<T>&, const ::oasis::Tensor<T>&,  \
      const ::oasis::Tensor<T>&);
#if defined(OASIS_COMPILED_INSTANCES) && !defined(OASIS_MODEL_GRAD_INSTANTIATING)
OASIS_MODEL_GRAD_INSTANCES(extern, float)
OASIS_MODEL_GRAD_INSTANCES(extern, double)
OASIS_MODEL_GRAD_INSTANCES(extern, long double)
OASIS_MODEL_GRAD_INSTANCES(extern, ::oasis::mp50)
#endif
