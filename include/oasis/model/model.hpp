// oasis/model/model.hpp — the Attention-Residual transformer oracle Model<T> (docs/spec.md §2–4).
//
// Scalar-generic (float, double, long double, oasis::mp50). Layers: embedding, n_blocks blocks of
// [attention sublayer, SwiGLU MLP sublayer] each with its own pre-norm, final RMSNorm, LM head.
// The residual stream is one of (ModelConfig::variant, ::router):
//
//   original backbone     x <- x + Attn(RMSNorm(x));  x <- x + MLP(RMSNorm(x))
//   kimi_full             h_l = sum_{i<l} alpha_{i->l} v_i,  v_0 = embedding, v_i = f_i(h_i) (raw)
//   kimi_block (S)        sources b_0 = embedding, completed block sums b_n, partial sum b_n^{i-1}
//   authors_code          cumulative states: candidates [embedding, earlier layer outputs,
//                         residual + sublayer_out], low-rank query/key router after each sublayer
//
// and every depth router couples the psi of earlier attention sublayers (docs/spec.md §3) when the
// variant has coupling. Which value feeds which step is stated once, in wiring.hpp; Model::run
// executes it as the steps of schedule.hpp. Tensor names and shapes: parameter_specs() and
// docs/model.md.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "oasis/model/config.hpp"
#include "oasis/model/layers.hpp"
#include "oasis/model/router.hpp"
#include "oasis/model/schedule.hpp"
#include "oasis/core/multiprecision.hpp"

namespace oasis::model {

/// How a parameter is initialised (deterministic, seeded; docs/spec.md §4 and the peers' init).
enum class Init { normal, ones, zeros, theta };

struct ParamSpec {
  std::string name;
  Shape shape;
  Init init;
};

/// Every parameter of a configuration, in the canonical order (init order, save order).
inline std::vector<ParamSpec> parameter_specs(const ModelConfig& cfg) {
  cfg.validate();
  const index_t d = cfg.d_model, H = cfg.n_heads, Hkv = cfg.kv_heads(), dh = cfg.head_dim(), f = cfg.d_ff;
  const bool coupled = variant_spec(cfg.variant).coupling, res = cfg.attn_res();
  std::vector<ParamSpec> s;
  s.push_back({"embed_tokens.weight", {cfg.vocab_size, d}, Init::normal});
  auto router = [&](const std::string& p) {
    if (cfg.router == RouterFamily::authors_code) {
      const index_t r = cfg.authors_width();
      s.push_back({p + ".q_proj.weight", {r, d}, Init::normal});
      s.push_back({p + ".k_proj.weight", {r, d}, Init::normal});
      s.push_back({p + ".recency_bias", {1}, Init::zeros});
    } else {
      s.push_back({p + ".query", {d}, Init::zeros});
      if (cfg.key_norm_gain) s.push_back({p + ".key_norm.weight", {d}, Init::ones});
    }
    if (coupled) s.push_back({p + ".theta", {1}, Init::theta});
  };
  for (index_t b = 0; b < cfg.n_blocks; ++b) {
    const std::string L = "layers." + std::to_string(b);
    if (res && cfg.router != RouterFamily::authors_code) router(L + ".attn_res");
    s.push_back({L + ".attn_norm.weight", {d}, Init::ones});
    s.push_back({L + ".attn.q_proj.weight", {H * dh, d}, Init::normal});
    s.push_back({L + ".attn.k_proj.weight", {Hkv * dh, d}, Init::normal});
    s.push_back({L + ".attn.v_proj.weight", {Hkv * dh, d}, Init::normal});
    s.push_back({L + ".attn.o_proj.weight", {d, H * dh}, Init::normal});
    if (cfg.qk_norm) {
      s.push_back({L + ".attn.q_norm.weight", {dh}, Init::ones});
      s.push_back({L + ".attn.k_norm.weight", {dh}, Init::ones});
    }
    if (res && cfg.router == RouterFamily::authors_code) router(L + ".attn_res");
    if (res && cfg.router != RouterFamily::authors_code) router(L + ".mlp_res");
    s.push_back({L + ".mlp_norm.weight", {d}, Init::ones});
    s.push_back({L + ".mlp.gate_proj.weight", {f, d}, Init::normal});
    s.push_back({L + ".mlp.up_proj.weight", {f, d}, Init::normal});
    s.push_back({L + ".mlp.down_proj.weight", {d, f}, Init::normal});
    if (res && cfg.router == RouterFamily::authors_code) router(L + ".mlp_res");
  }
  if (res && cfg.readout_or_default() == Readout::final_attnres) router("final_res");
  s.push_back({"norm.weight", {d}, Init::ones});
  if (!cfg.tie_embeddings) s.push_back({"lm_head.weight", {cfg.vocab_size, d}, Init::normal});
  // Baseline parameters come last, so that switching them on leaves the initialisation of every
  // other parameter (same seed) unchanged.
  for (index_t b = 0; b < cfg.n_blocks; ++b) {
    const std::string L = "layers." + std::to_string(b);
    if (cfg.gated_attention) {
      s.push_back({L + ".attn.head_gate.weight", {H, d}, Init::normal});
      s.push_back({L + ".attn.head_gate.bias", {H}, Init::zeros});  // gates start near sigmoid(0) = 1/2
    }
    if (cfg.prefix_sink) {
      s.push_back({L + ".attn.sink_key", {Hkv, dh}, Init::normal});
      s.push_back({L + ".attn.sink_value", {Hkv, dh}, Init::normal});
    }
  }
  return s;
}

/// What one sublayer (or the final readout router) did, for analysis and tests.
/// Routing tensors are [n, B, T] over the n candidates (empty without depth routing).
template <class T>
struct SublayerTrace {
  std::string name;                 ///< "layers.{b}.attn", "layers.{b}.mlp", "final_res"
  SublayerKind kind = SublayerKind::attention;
  bool has_route = false;           ///< a depth router ran (false for the original backbone)
  RowNorm token_normalizer = RowNorm::softmax;  ///< attention sublayers
  RowNorm depth_normalizer = RowNorm::softmax;  ///< routed sublayers
  bool coupled = false;             ///< psi coupling enabled in this router
  double beta = 0;                  ///< coupling strength used (0 when not coupled)
  std::vector<SourceKind> source_kinds;
  std::vector<std::string> source_names;
  Tensor<T> sources;                ///< [n, B, T, d] candidate values
  Tensor<T> g_old, g, psi, dpsi, alpha;  ///< [n, B, T]
  Tensor<T> alpha_null;             ///< [B, T]
  /// Kimi: input = routed state h_l feeding the sublayer; authors_code: input = the previous
  /// routed state and routed = this router's output; readout: routed = the readout state.
  Tensor<T> input, output, routed;  ///< [B, T, d]
  Tensor<T> p_null, lse;            ///< [B, H, T] attention sublayers (LSE1 for softmax1)
  Tensor<T> branch_psi;             ///< [B, T] attention sublayers
  Tensor<T> attn_q, attn_k, attn_v; ///< [B, T, H d_h], [B, T, H_kv d_h] x 2: projections (q, k after q/k norm, RoPE)
  Tensor<T> attn_heads;             ///< [B, T, H d_h] per-head attention outputs before W_o
  Tensor<T> mlp_hidden;             ///< [B, T, d_ff] silu(W_gate x) * (W_up x)
  /// Attention probabilities [B, H, T, T_keys] (ForwardOptions::trace_probs; with the prefix sink
  /// T_keys = cache + T + 1 and column 0 is the sink).
  Tensor<T> attn_probs;
  Tensor<T> attn_gates;             ///< [B, H, T] gated attention: the gates (attn_heads is gated)
  Tensor<T> p_sink;                 ///< [B, H, T] prefix sink: probability of the sink key
};

struct ForwardOptions {
  bool trace = false;   ///< fill ForwardResult::trace
  /// Unit roundoff of the precision whose forward error is bounded (0: off); see docs/model.md.
  double error_u = 0;
  /// Fake weight-activation quantisation (oasis/ops/quantize.hpp; null: off, bit-identical to no hook).
  /// Every linear layer of the blocks (q, k, v, o, gate, up, down and the attention head gate)
  /// runs as linear(Q_A(x), Q_W(W)) (oasis::qlinear: dynamic ranges over the call's rows, or
  /// calibrated static ranges through quant->calibration, one site per activation quantiser in
  /// forward order; each forward is one calibration or evaluation pass); the embedding, LM head,
  /// norms, routers and sink parameters stay in full precision. The pointee must outlive the
  /// call. Not combinable with error_u.
  const WAQuantConfig* quant = nullptr;
  bool trace_probs = false;  ///< with trace: keep the attention probabilities (SublayerTrace::attn_probs)
  /// Storage rounding (layers.hpp StoreFn; null: off): every activation handed from one step to the
  /// next is rounded when it is produced — the embedding rows, q, k, v (after RoPE), the heads,
  /// p_null, LSE and psi, every sublayer output, MLP hidden rows, routed states, candidate and
  /// block sums and their psi, the readout state and the logits. Models an implementation that
  /// computes in T and stores bfloat16 (or float16, float32) activations. Not combinable with error_u.
  StoreFn store = nullptr;
  /// The matrix products of every linear layer (MatrixProducts, layers.hpp; null: sequential sums,
  /// incremental decoding equal to the full forward bit for bit). Ignored with error_u.
  const MatrixProducts* products = nullptr;
};

template <class T>
struct ForwardResult {
  Tensor<T> logits;                       ///< [B, T, vocab]
  Tensor<T> state;                        ///< [B, T, d] readout state before the final norm
  std::vector<SublayerTrace<T>> trace;    ///< per sublayer in order, then the readout router
  std::vector<double> logit_error;        ///< [B * T] first-order bound on max_v |logit error|
  std::vector<double> state_error;        ///< [B * T] the same for the readout state
};

/// Key/value caches (one per attention sublayer) and the position of incremental decoding.
/// Depth routing is per token, so a step needs nothing else of the earlier positions.
template <class T>
struct DecodeState {
  index_t batch = 0;
  index_t length = 0;
  std::vector<KVCache<T>> kv;
};

/// What Model::run hands to the model backward (its `record` argument), in wiring order.
template <class T>
struct ForwardRecord {
  std::vector<Tensor<T>> inputs;       ///< per sublayer: the rows [N, d] it read
  std::vector<RouteResult<T>> routes;  ///< per router: its candidates, psi, logits and options
};

template <class T>
class Model {
 public:
  /// Parameters with their shapes, zero-filled (load or initialise them).
  explicit Model(ModelConfig cfg) : cfg_(std::move(cfg)), schedule_(forward_schedule(cfg_)) {
    for (const ParamSpec& p : parameter_specs(cfg_)) params_.emplace(p.name, Tensor<T>(p.shape));
  }

  /// Deterministic seeded initialisation: normal weights N(0, init_std^2) drawn in double from
  /// mt19937_64(seed) in canonical parameter order, rounded once to T; gains 1; pseudo-queries,
  /// recency 0; theta = theta_init.
  static Model initialized(const ModelConfig& cfg, std::uint64_t seed) {
    Model m(cfg);
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> nd(0.0, cfg.init_std);
    for (const ParamSpec& p : parameter_specs(cfg)) {
      Tensor<T>& t = m.params_.at(p.name);
      for (index_t i = 0; i < t.size(); ++i) {
        switch (p.init) {
          case Init::normal: t[i] = T(cfg.init_std > 0 ? nd(rng) : 0.0); break;
          case Init::ones: t[i] = T(1); break;
          case Init::zeros: t[i] = T(0); break;
          case Init::theta: t[i] = T(cfg.theta_init); break;
        }
      }
    }
    return m;
  }

  const ModelConfig& config() const { return cfg_; }
  /// The steps run() executes: the configuration's wiring (schedule.hpp).
  const ForwardSchedule& schedule() const { return schedule_; }
  const std::map<std::string, Tensor<T>>& parameters() const { return params_; }

  const Tensor<T>& param(const std::string& name) const {
    const auto it = params_.find(name);
    OASIS_REQUIRE(it != params_.end(), name, "no such parameter in this configuration");
    return it->second;
  }
  /// Replace a parameter; the shape must match parameter_specs (error names the tensor).
  void set_param(const std::string& name, Tensor<T> value) {
    const auto it = params_.find(name);
    OASIS_REQUIRE(it != params_.end(), name, "no such parameter in this configuration");
    OASIS_REQUIRE(value.shape() == it->second.shape(), name, "shape ", shape_str(value.shape()),
                  " does not match the expected ", shape_str(it->second.shape()));
    require_finite(value, name.c_str());
    it->second = std::move(value);
  }

  /// The same model in another scalar (every parameter converted element-wise).
  template <class U>
  Model<U> cast() const {
    Model<U> m(cfg_);
    for (const auto& [name, t] : params_) m.set_param(name, t.template cast<U>());
    return m;
  }

  /// Full-sequence forward of token ids [B * T] (row-major (b, t)), causal.
  ForwardResult<T> forward(const std::vector<index_t>& ids, index_t B, index_t Tn, const ForwardOptions& opt = {}) const {
    DecodeState<T> st = new_state(B);
    return run(st, embed(ids, B, Tn), B, Tn, opt);
  }
  /// Full-sequence forward of input embeddings [B, T, d] (in place of the token embedding).
  ForwardResult<T> forward_embeddings(const Tensor<T>& x, const ForwardOptions& opt = {}) const {
    require_rank(x, 3, "x", "[B, T, d]");
    DecodeState<T> st = new_state(x.dim(0));
    return run(st, embed_rows(x), x.dim(0), x.dim(1), opt);
  }

  DecodeState<T> new_state(index_t B) const {
    OASIS_REQUIRE(B > 0, "B", "batch must be positive, got ", B);
    DecodeState<T> st;
    st.batch = B;
    st.kv.resize(static_cast<std::size_t>(cfg_.n_blocks));
    return st;
  }

  /// Rows [B*T, d] of the token embedding; ids must lie in [0, vocab_size).
  Rows<T> embed(const std::vector<index_t>& ids, index_t B, index_t Tn) const {
    OASIS_REQUIRE(B > 0 && Tn > 0, "ids", "empty batch or sequence (B = ", B, ", T = ", Tn, ")");
    OASIS_REQUIRE(static_cast<index_t>(ids.size()) == B * Tn, "ids", "has ", ids.size(), " entries, expected B * T = ", B * Tn);
    const Tensor<T>& E = param("embed_tokens.weight");
    const index_t d = cfg_.d_model;
    Rows<T> x{Tensor<T>({B * Tn, d}), {}};
    for (index_t r = 0; r < B * Tn; ++r) {
      const index_t id = ids[static_cast<std::size_t>(r)];
      OASIS_REQUIRE(id >= 0 && id < cfg_.vocab_size, "ids", "token id ", id, " at position ", r,
                    " is outside [0, vocab_size = ", cfg_.vocab_size, ")");
      std::copy(E.ptr(id), E.ptr(id) + d, x.x.ptr(r));
    }
    return x;
  }
  Rows<T> embed_rows(const Tensor<T>& x) const {
    require_rank(x, 3, "x", "[B, T, d]");
    OASIS_REQUIRE(x.dim(0) > 0 && x.dim(1) > 0, "x", "empty batch or sequence in ", shape_str(x.shape()));
    OASIS_REQUIRE(x.dim(2) == cfg_.d_model, "x", "width ", x.dim(2), " differs from d_model = ", cfg_.d_model);
    require_finite(x, "x");
    return Rows<T>{x.reshaped({x.dim(0) * x.dim(1), x.dim(2)}), {}};
  }

  /// Run Tn new positions of every batch row through the model, extending `st` (incremental
  /// decoding; a fresh state gives the full forward). `record` (optional) receives every
  /// sublayer's input and every router's result (the model backward's record of the forward).
  ForwardResult<T> run(DecodeState<T>& st, Rows<T> x0, index_t B, index_t Tn, const ForwardOptions& opt,
                       ForwardRecord<T>* record = nullptr) const;

 public:
  /// theta of a router (theta_init when the variant has no coupling parameter).
  double theta_of(const std::string& router) const {
    return variant_spec(cfg_.variant).coupling ? to_double(param(router + ".theta")[0]) : cfg_.theta_init;
  }
  /// Key-norm gain of a Kimi router (empty when key_norm_gain is off).
  const Tensor<T>& gain_of(const std::string& router) const {
    static const Tensor<T> none;
    return cfg_.key_norm_gain ? param(router + ".key_norm.weight") : none;
  }
  /// The router with parameter prefix `router` on its candidates: the configured family's logits
  /// with its parameters (authors_route, else kimi_route), then couple, normalise and mix.
  RouteResult<T> route(const std::string& router, const std::vector<const DepthSource<T>*>& c, const ErrorModel& em) const {
    if (cfg_.router == RouterFamily::authors_code)
      return authors_route(c, param(router + ".q_proj.weight"), param(router + ".k_proj.weight"),
                           param(router + ".recency_bias")[0], theta_of(router), cfg_, em);
    return kimi_route(c, param(router + ".query"), gain_of(router), theta_of(router), cfg_, em);
  }
  /// Weights of the attention sublayer of block b.
  AttentionWeights<T> attn_weights(index_t b) const {
    const std::string L = "layers." + std::to_string(b);
    return {&param(L + ".attn_norm.weight"), &param(L + ".attn.q_proj.weight"), &param(L + ".attn.k_proj.weight"),
            &param(L + ".attn.v_proj.weight"), &param(L + ".attn.o_proj.weight"),
            cfg_.qk_norm ? &param(L + ".attn.q_norm.weight") : nullptr,
            cfg_.qk_norm ? &param(L + ".attn.k_norm.weight") : nullptr,
            cfg_.gated_attention ? &param(L + ".attn.head_gate.weight") : nullptr,
            cfg_.gated_attention ? &param(L + ".attn.head_gate.bias") : nullptr,
            cfg_.prefix_sink ? &param(L + ".attn.sink_key") : nullptr,
            cfg_.prefix_sink ? &param(L + ".attn.sink_value") : nullptr};
  }
  /// The head: logits = LM head(RMSNorm(state)) with the final norm's options.
  Rows<T> head(const Rows<T>& state, const ErrorModel& em) const {
    const Rows<T> xn = rms_norm(state, param("norm.weight"), cfg_.norm_options(), em);
    return linear(xn, cfg_.tie_embeddings ? param("embed_tokens.weight") : param("lm_head.weight"), em);
  }
  /// Weights of the MLP sublayer of block b.
  MlpWeights<T> mlp_weights(index_t b) const {
    const std::string L = "layers." + std::to_string(b);
    return {&param(L + ".mlp_norm.weight"), &param(L + ".mlp.gate_proj.weight"), &param(L + ".mlp.up_proj.weight"),
            &param(L + ".mlp.down_proj.weight")};
  }

 private:
  ModelConfig cfg_;
  ForwardSchedule schedule_;
  std::map<std::string, Tensor<T>> params_;
};

namespace detail {

template <class T> Tensor<T> to_btd(const Tensor<T>& rows, index_t B, index_t Tn) {
  return rows.reshaped({B, Tn, rows.dim(1)});
}

template <class T>
void record_route(SublayerTrace<T>& tr, const RouteResult<T>& r, index_t B, index_t Tn) {
  const index_t n = r.g_old.dim(0);
  tr.has_route = true;
  tr.depth_normalizer = r.options.normalizer;
  tr.coupled = r.options.coupling;
  tr.beta = r.options.coupling ? to_double(depth_beta<double>(r.options)) : 0.0;
  tr.source_kinds = r.kinds;
  tr.source_names = r.names;
  tr.sources = r.sources.reshaped({n, B, Tn, r.sources.dim(2)});
  tr.g_old = r.g_old.reshaped({n, B, Tn});
  tr.g = r.route.g.reshaped({n, B, Tn});
  tr.psi = r.psi.reshaped({n, B, Tn});
  tr.dpsi = r.route.dpsi.reshaped({n, B, Tn});
  tr.alpha = r.route.alpha.reshaped({n, B, Tn});
  tr.alpha_null = r.route.alpha_null.reshaped({B, Tn});
}

template <class T>
void record_attention(SublayerTrace<T>& tr, const AttentionSublayer<T>& a, RowNorm norm, index_t B, index_t Tn) {
  tr.attn_q = to_btd(a.q.x, B, Tn);
  tr.attn_k = to_btd(a.k.x, B, Tn);
  tr.attn_v = to_btd(a.v.x, B, Tn);
  tr.attn_heads = to_btd(a.heads.x, B, Tn);
  tr.token_normalizer = norm;
  tr.p_null = a.p_null;
  tr.lse = a.lse;
  tr.branch_psi = a.psi;
  tr.attn_probs = a.probs;
  tr.attn_gates = a.gates;
  tr.p_sink = a.p_sink;
}

/// Psi of a sublayer as a depth source [N] from the branch psi [B, T].
template <class T> Tensor<T> flat_psi(const Tensor<T>& psi) { return psi.reshaped({psi.size()}); }

/// The psi a router reads from a candidate: the mean of the branch psi of the attention
/// sublayers psi_from (summed left to right, then divided; one branch: its psi exactly; none:
/// zeros, the embedding's), rounded by the storage rounding when it is a mean of several; its
/// error bound the sum of the branches' bounds, ErrorModel::mean_error for n > 1.
template <class T>
void candidate_psi(DepthSource<T>& c, const std::vector<index_t>& psi_from, const std::vector<Tensor<T>>& branch_psi,
                   const std::vector<std::vector<double>>& branch_e_psi, index_t N, const ErrorModel& em, StoreFn store) {
  c.psi = Tensor<T>({N});
  c.e_psi.assign(em.on() ? static_cast<std::size_t>(N) : 0, 0.0);
  for (index_t a : psi_from) {
    const Tensor<T>& p = branch_psi[static_cast<std::size_t>(a)];
    for (index_t t = 0; t < N; ++t) c.psi[t] += p[t];
    for (std::size_t t = 0; t < c.e_psi.size(); ++t) c.e_psi[t] += branch_e_psi[static_cast<std::size_t>(a)][t];
  }
  const std::size_t n = psi_from.size();
  if (n == 0) return;
  for (index_t t = 0; t < N; ++t) c.psi[t] = c.psi[t] / T(static_cast<double>(n));
  if (n == 1) return;
  store_values(c.psi, store);
  for (std::size_t t = 0; t < c.e_psi.size(); ++t)
    c.e_psi[t] = em.mean_error(c.e_psi[t], static_cast<double>(n), to_double(c.psi[static_cast<index_t>(t)]));
}

}  // namespace detail

template <class T>
ForwardResult<T> Model<T>::run(DecodeState<T>& st, Rows<T> x0, index_t B, index_t Tn, const ForwardOptions& opt,
                               ForwardRecord<T>* record) const {
  OASIS_REQUIRE(st.batch == B && static_cast<index_t>(st.kv.size()) == cfg_.n_blocks, "state",
                "decode state was made for batch ", st.batch, " but the input has batch ", B);
  OASIS_REQUIRE(x0.n() == B * Tn && x0.w() == cfg_.d_model, "x", "rows ", shape_str(x0.x.shape()),
                " are not [B * T, d] = [", B * Tn, ", ", cfg_.d_model, "]");
  OASIS_REQUIRE(opt.error_u >= 0 && opt.error_u < 1e-2, "error_u", "unit roundoff must lie in [0, 1e-2), got ", opt.error_u);
  OASIS_REQUIRE(opt.error_u == 0 || (!opt.quant && cfg_.forward_bound_derived() && !opt.store), "error_u",
                "no forward error bound is derived with fake quantisation, storage rounding, gated attention or the prefix sink");
  const ErrorModel em{opt.error_u, opt.error_u > 0 ? nullptr : opt.products};
  const SublayerOptions so{opt.quant, opt.trace && opt.trace_probs, opt.store};
  if (opt.quant && opt.quant->calibration) opt.quant->calibration->begin_pass();
  const StoreFn store = opt.store;
  auto stored = [store](Rows<T> r) { store_values(r.x, store); return r; };
  store_values(x0.x, store);
  const index_t N = B * Tn, pos0 = st.length;
  if (em.on()) x0.e.assign(static_cast<std::size_t>(N), 0.0);  // inputs exact in the bounded precision
  const ModelWiring& w = schedule_.wiring;
  const std::size_t L = w.sublayers.size();
  // The slots of the schedule; as a router candidate a slot also carries the kind, psi and name
  // the wiring gives it (psi_of: the psi_from its psi was computed for).
  std::vector<DepthSource<T>> slot(static_cast<std::size_t>(schedule_.slots));
  std::vector<const std::vector<index_t>*> psi_of(slot.size(), nullptr);
  std::vector<Tensor<T>> branch_psi(L);  // [N] per attention sublayer
  std::vector<std::vector<double>> branch_e_psi(L);
  slot[0].v = std::move(x0);
  ForwardResult<T> res;
  if (opt.trace) res.trace.resize(static_cast<std::size_t>(schedule_.trace_entries));
  if (record) {
    record->inputs.assign(L, Tensor<T>());
    record->routes.assign(w.routers.size(), RouteResult<T>());
  }
  for (const ScheduledStep& s : schedule_.steps) {
    DepthSource<T>& out = slot[static_cast<std::size_t>(s.out)];
    const std::size_t k = static_cast<std::size_t>(s.index);
    if (s.kind == ScheduledStep::Kind::add) {
      out.v = stored(add_rows(slot[static_cast<std::size_t>(s.in[0])].v, slot[static_cast<std::size_t>(s.in[1])].v, em));
    } else if (s.kind == ScheduledStep::Kind::sublayer) {
      const WiredSublayer& S = w.sublayers[k];
      const Rows<T>& h = slot[static_cast<std::size_t>(s.in[0])].v;
      SublayerTrace<T>* tr = opt.trace ? &res.trace[k] : nullptr;
      if (S.kind == SublayerKind::attention) {
        AttentionSublayer<T> a = attention_sublayer(h, B, Tn, pos0, attn_weights(S.block), cfg_,
                                                    st.kv[static_cast<std::size_t>(S.block)], em, so);
        branch_psi[k] = detail::flat_psi(a.psi);
        branch_e_psi[k] = a.e_psi;
        if (tr) detail::record_attention(*tr, a, cfg_.token_norm(), B, Tn);
        out.v = std::move(a.out);
      } else {
        const MlpWeights<T> W = mlp_weights(S.block);
        const Rows<T> hid = stored(mlp_hidden(h, W, cfg_, em, opt.quant));
        if (tr) tr->mlp_hidden = detail::to_btd(hid.x, B, Tn);
        out.v = stored(qlinear(hid, *W.down, em, opt.quant));
      }
      if (tr) {
        tr->name = S.name;
        tr->kind = S.kind;
        tr->input = detail::to_btd(h.x, B, Tn);
        tr->output = detail::to_btd(out.v.x, B, Tn);
      }
      if (record) record->inputs[k] = h.x;
    } else {
      const WiredRouter& R = w.routers[k];
      std::vector<const DepthSource<T>*> cands;
      for (std::size_t i = 0; i < s.in.size(); ++i) {
        const std::size_t j = static_cast<std::size_t>(s.in[i]);
        const WiredCandidate& c = R.candidates[i];
        slot[j].kind = c.kind;
        slot[j].name = c.name;
        if (!psi_of[j] || *psi_of[j] != c.psi_from) {
          detail::candidate_psi(slot[j], c.psi_from, branch_psi, branch_e_psi, N, em, store);
          psi_of[j] = &c.psi_from;
        }
        cands.push_back(&slot[j]);
      }
      RouteResult<T> r = route(R.params, cands, em);
      store_values(r.h.x, store);
      if (opt.trace) {
        const index_t e = schedule_.router_trace[k];
        SublayerTrace<T>& tr = res.trace[static_cast<std::size_t>(e)];
        if (e >= static_cast<index_t>(L)) {
          tr.name = R.trace;
          tr.kind = SublayerKind::readout;
        }
        detail::record_route(tr, r, B, Tn);
        tr.routed = detail::to_btd(r.h.x, B, Tn);
      }
      out.v = r.h;
      if (record) record->routes[k] = std::move(r);
    }
    for (index_t j : s.release) {
      slot[static_cast<std::size_t>(j)] = DepthSource<T>{};
      psi_of[static_cast<std::size_t>(j)] = nullptr;
    }
  }

  if (opt.quant && opt.quant->calibration) opt.quant->calibration->end_pass();
  const Rows<T>& state = slot[static_cast<std::size_t>(schedule_.state)].v;
  const Rows<T> logits = stored(head(state, em));
  res.logits = detail::to_btd(logits.x, B, Tn);
  res.state = detail::to_btd(state.x, B, Tn);
  res.logit_error = logits.e;
  res.state_error = state.e;
  st.length += Tn;
  return res;
}

}  // namespace oasis::model

// The compiled library instantiates Model for float, double, long double (src/core/model_builtin.cpp)
// and oasis::mp50 (src/core/model_mp50.cpp); code linking oasis::oasis does not re-instantiate.
#if defined(OASIS_COMPILED_INSTANCES) && !defined(OASIS_MODEL_INSTANTIATING)
extern template class oasis::model::Model<float>;
extern template class oasis::model::Model<double>;
extern template class oasis::model::Model<long double>;
extern template class oasis::model::Model<::oasis::mp50>;
#endif
