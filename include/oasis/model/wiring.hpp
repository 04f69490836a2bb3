// oasis/model/wiring.hpp — how the steps of a configured model feed each other (docs/spec.md §4, §8).
//
// A model is wired correctly when every step reads what the configuration says it reads. This
// header states that for every router family, in terms of the trace names of
// docs/verify-model.md ("Model level"): the value of every router candidate (the embedding, a sublayer
// output, a block sum, a residual sum, an earlier router's output), the psi it carries, the state
// every sublayer reads and the readout state. This is the one definition of the model's wiring:
// Model<T>::run executes it (compiled to steps by schedule.hpp), the model backward
// (oasis/grad/model_backward.hpp) walks the same steps back, and the model level of the compare
// engine checks a trace against it.
//
//   kimi_full     router l: [embedding, out_0, ..., out_{l-1}]; sublayer l reads routed_l
//   kimi_block    router l: [embedding, B_1, ..., B_{k-1}, partial of block k up to l - 1]
//                 B_j = out_{s_j} + ... + out_{e_j} summed left to right (ModelConfig::block_starts)
//   authors_code  router after attention b: [embedding, y_0..y_{b-1}, in_A + out_A];
//                 router after MLP b: the same plus in_M + out_M; y_j = routed of MLP router j;
//                 attention b reads y_{b-1} (the embedding for b = 0), MLP b reads the attention router's output
//   original      sublayer l reads in_{l-1} + out_{l-1} (the embedding for l = 0)
// Candidate psi: an attention output carries its branch psi; a block the mean of its attention
// sublayers' psi; a head-less candidate (MLP output, block without attention, authors' history and
// MLP candidates) the psi of the attention sublayer of its transformer block (read under the
// `inherit` rule only); the embedding none.
#pragma once

#include <string>
#include <vector>

#include "oasis/ops/depth.hpp"
#include "oasis/model/config.hpp"

namespace oasis::model {

enum class SublayerKind { attention, mlp, readout };

/// A value one step hands to another.
struct WiredValue {
  enum class Kind {
    embedding,  ///< the token embedding rows
    output,     ///< the raw output of sublayer `index` (trace "<sublayer>.output")
    input,      ///< what sublayer `index` reads (trace "<sublayer>.input")
    routed,     ///< the output of router `index` (trace "<router trace>.routed")
    sum,        ///< terms summed left to right (each addition rounded once)
  };
  Kind kind = Kind::embedding;
  index_t index = -1;
  std::vector<WiredValue> terms;

  static WiredValue embedding() { return {}; }
  static WiredValue of(Kind k, index_t i) { return {k, i, {}}; }
  /// The left-to-right sum of terms; one term is that term itself.
  static WiredValue sum_of(std::vector<WiredValue> t) {
    if (t.size() == 1) return t[0];
    return {Kind::sum, -1, std::move(t)};
  }
};

/// One candidate of a router.
struct WiredCandidate {
  SourceKind kind = SourceKind::initial;
  WiredValue value;
  /// The attention sublayers whose branch psi this candidate carries (their mean); empty for the
  /// embedding. Read by the coupling only when has_null_evidence(kind, headless rule).
  std::vector<index_t> psi_from;
  std::string name;  ///< for messages, e.g. "layers.0.attn.output", "block 2 (sublayers 2-3)"
};

struct WiredRouter {
  std::string trace;   ///< trace prefix of its tensors: "layers.{b}.attn", "layers.{b}.mlp", "final_res"
  std::string params;  ///< parameter prefix: "layers.{b}.attn_res", "layers.{b}.mlp_res", "final_res"
  std::vector<WiredCandidate> candidates;
};

struct WiredSublayer {
  std::string name;  ///< "layers.{b}.attn" / "layers.{b}.mlp"
  SublayerKind kind = SublayerKind::attention;
  index_t block = 0;     ///< transformer block b
  WiredValue input;      ///< what the sublayer reads
  index_t router = -1;   ///< the router traced under this sublayer's name (-1: none)
};

struct ModelWiring {
  std::vector<WiredSublayer> sublayers;
  std::vector<WiredRouter> routers;
  WiredValue state;  ///< the readout state before the final norm (trace "state")
};

/// The wiring of a configuration (validated).
inline ModelWiring model_wiring(const ModelConfig& cfg) {
  cfg.validate();
  using K = WiredValue::Kind;
  ModelWiring w;
  const index_t L = cfg.n_sublayers();
  for (index_t l = 0; l < L; ++l) {
    WiredSublayer s;
    s.block = l / 2;
    s.kind = l % 2 == 0 ? SublayerKind::attention : SublayerKind::mlp;
    s.name = "layers." + std::to_string(s.block) + (l % 2 == 0 ? ".attn" : ".mlp");
    w.sublayers.push_back(s);
  }
  auto out = [](index_t l) { return WiredValue::of(K::output, l); };
  auto residual = [](index_t l) {  // in_l + out_l
    return WiredValue::sum_of({WiredValue::of(K::input, l), WiredValue::of(K::output, l)});
  };
  auto attention_of = [](index_t l) { return l - l % 2; };  // the attention sublayer of l's transformer block
  const WiredCandidate emb{SourceKind::initial, WiredValue::embedding(), {}, "embedding"};

  if (!cfg.attn_res()) {
    for (index_t l = 0; l < L; ++l)
      w.sublayers[static_cast<std::size_t>(l)].input = l == 0 ? WiredValue::embedding() : residual(l - 1);
    w.state = residual(L - 1);
    return w;
  }
  if (cfg.router == RouterFamily::authors_code) {
    std::vector<WiredCandidate> hist{emb};
    for (index_t b = 0; b < cfg.n_blocks; ++b) {
      const index_t a = 2 * b, m = a + 1;
      const std::string P = "layers." + std::to_string(b);
      w.sublayers[static_cast<std::size_t>(a)].input =
          b == 0 ? WiredValue::embedding() : WiredValue::of(K::routed, static_cast<index_t>(w.routers.size()) - 1);
      WiredRouter ra{P + ".attn", P + ".attn_res", hist};
      ra.candidates.push_back({SourceKind::attention, residual(a), {a}, P + ".attn.input + " + P + ".attn.output"});
      w.sublayers[static_cast<std::size_t>(a)].router = static_cast<index_t>(w.routers.size());
      w.routers.push_back(ra);
      w.sublayers[static_cast<std::size_t>(m)].input = WiredValue::of(K::routed, static_cast<index_t>(w.routers.size()) - 1);
      WiredRouter rm{P + ".mlp", P + ".mlp_res", ra.candidates};
      rm.candidates.push_back({SourceKind::headless, residual(m), {a}, P + ".mlp.input + " + P + ".mlp.output"});
      w.sublayers[static_cast<std::size_t>(m)].router = static_cast<index_t>(w.routers.size());
      w.routers.push_back(rm);
      hist.push_back({SourceKind::headless, WiredValue::of(K::routed, static_cast<index_t>(w.routers.size()) - 1), {a},
                      P + ".mlp.routed"});
    }
    w.state = WiredValue::of(K::routed, static_cast<index_t>(w.routers.size()) - 1);
    return w;
  }
  // Kimi Full and Block AttnRes.
  const std::vector<index_t> starts = cfg.block_starts();
  const bool full = static_cast<index_t>(starts.size()) == L;
  auto block_candidate = [&](index_t first, index_t last, std::size_t block_number, bool complete) {
    WiredCandidate c;
    std::vector<WiredValue> terms;
    for (index_t l = first; l <= last; ++l) {
      terms.push_back(out(l));
      if (l % 2 == 0) c.psi_from.push_back(l);
    }
    c.value = WiredValue::sum_of(terms);
    c.kind = c.psi_from.empty() ? SourceKind::headless : SourceKind::attention;
    if (c.psi_from.empty()) c.psi_from.push_back(attention_of(last));
    if (full) {
      c.name = w.sublayers[static_cast<std::size_t>(first)].name + ".output";
    } else {
      c.name = "block " + std::to_string(block_number) + " (" + w.sublayers[static_cast<std::size_t>(first)].name;
      if (last > first) c.name += " .. " + w.sublayers[static_cast<std::size_t>(last)].name;
      c.name += complete ? ")" : ", partial)";
    }
    return c;
  };
  std::vector<WiredCandidate> done{emb};
  std::size_t blk = 0;
  for (index_t l = 0; l < L; ++l) {
    if (blk + 1 < starts.size() && l == starts[blk + 1]) {
      done.push_back(block_candidate(starts[blk], l - 1, blk + 1, true));
      ++blk;
    }
    WiredSublayer& s = w.sublayers[static_cast<std::size_t>(l)];
    WiredRouter r{s.name, "layers." + std::to_string(s.block) + (s.kind == SublayerKind::attention ? ".attn_res" : ".mlp_res"), done};
    if (l > starts[blk]) r.candidates.push_back(block_candidate(starts[blk], l - 1, blk + 1, false));
    s.router = static_cast<index_t>(w.routers.size());
    s.input = WiredValue::of(K::routed, s.router);
    w.routers.push_back(std::move(r));
  }
  done.push_back(block_candidate(starts[blk], L - 1, blk + 1, true));
  switch (cfg.readout_or_default()) {
    case Readout::final_attnres:
      w.routers.push_back({"final_res", "final_res", done});
      w.state = WiredValue::of(K::routed, static_cast<index_t>(w.routers.size()) - 1);
      break;
    case Readout::sum: {
      std::vector<WiredValue> terms;
      for (const auto& c : done) terms.push_back(c.value);
      w.state = WiredValue::sum_of(terms);
      break;
    }
    case Readout::last:  // the last routed state plus the last output: h_L + v_L
      w.state = residual(L - 1);
      break;
  }
  return w;
}

/// Trace fields of a sublayer (docs/verify-model.md, model level); routers add kRouterFields.
inline const std::vector<std::string>& attention_trace_fields() {
  static const std::vector<std::string> f = {"input", "attn_q", "attn_k", "attn_v", "p_null", "lse", "attn_heads", "branch_psi", "output"};
  return f;
}
inline const std::vector<std::string>& mlp_trace_fields() {
  static const std::vector<std::string> f = {"input", "mlp_hidden", "output"};
  return f;
}
inline const std::vector<std::string>& router_trace_fields() {
  static const std::vector<std::string> f = {"sources", "psi", "g_old", "g", "dpsi", "alpha", "alpha_null", "routed"};
  return f;
}

}  // namespace oasis::model
