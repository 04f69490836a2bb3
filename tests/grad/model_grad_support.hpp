// tests/grad/model_grad_support.hpp — tiny models for the model backward tests: one configuration
// per router family, readout, variant and psi estimator; seeded random parameters (non-zero
// pseudo-queries, gains, recency; theta a multiple of 2^-5 so that theta +- 2^-40 is exact in
// double, where the model holds it); the loss L = sum(logits * R) with a fixed random R.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <utility>
#include <string>
#include <vector>

#include "oasis/grad/model_backward.hpp"
#include "oasis_test.hpp"

namespace oasis::model_grad_test {

namespace om = oasis::model;
using oasis::index_t;

inline std::uint64_t base_seed() {
  const char* s = std::getenv("OASIS_GRAD_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 4100;
}

struct ModelCase {
  std::string name;
  om::ModelConfig cfg;
  index_t B = 2, T = 3;
};

inline om::ModelConfig tiny(Variant v, om::RouterFamily r) {
  om::ModelConfig c;
  c.vocab_size = 7;
  c.d_model = 8;
  c.n_blocks = 2;
  c.n_heads = 2;
  c.d_ff = 6;
  c.variant = v;
  c.router = r;
  c.authors_rank = 4;
  if (r == om::RouterFamily::authors_code) c = om::ModelConfig::authors_profile(c);
  return c;
}

/// Every router family, readout, variant (coupling on/off, Softmax1/softmax at both levels), psi
/// estimator, head-less rule, q/k norm, GQA, key-norm gain, tied embeddings, uneven blocks.
inline std::vector<ModelCase> model_cases() {
  using om::Readout;
  using om::RouterFamily;
  std::vector<ModelCase> v;
  {  // Kimi Full, OASIS, final AttnRes readout, q/k norm, GQA, key-norm gain
    om::ModelConfig c = tiny(Variant::oasis, RouterFamily::kimi_full);
    c.qk_norm = true;
    c.n_kv_heads = 1;
    c.key_norm_gain = true;
    v.push_back({"kimi_full_oasis_final", c});
  }
  {  // Block AttnRes S = 2, sum readout, the authors' psi estimator, interleaved RoPE
    om::ModelConfig c = tiny(Variant::oasis, RouterFamily::kimi_block);
    c.block_size = 2;
    c.readout = Readout::sum;
    c.psi_estimator = om::PsiEstimator::mass_deficit;
    c.rope = om::RopeLayout::interleaved;
    v.push_back({"kimi_block2_oasis_sum_mass", c});
  }
  {  // Block AttnRes S = 3 over L = 4 (uneven: the last block is one MLP, head-less, inheriting the
     // psi of attention 2; block 1's psi is the mean over attention 0 and 2), final AttnRes readout
     // (the only router that sees two candidates with evidence), tied embeddings
    om::ModelConfig c = tiny(Variant::oasis, RouterFamily::kimi_block);
    c.block_size = 3;
    c.tie_embeddings = true;
    v.push_back({"kimi_block3_oasis_tied", c});
  }
  {  // the no_evidence head-less rule and the authors' centring and clamps on the Kimi router
    om::ModelConfig c = tiny(Variant::oasis, RouterFamily::kimi_full);
    c.coupling = CouplingOptions::authors_code();
    c.coupling->headless = HeadlessRule::no_evidence;
    v.push_back({"kimi_full_oasis_authors_centring_no_evidence", c});
  }
  {  // a fixed beta: theta exists but receives nothing
    om::ModelConfig c = tiny(Variant::oasis, RouterFamily::kimi_full);
    c.beta = 0.75;
    c.readout = Readout::last;
    v.push_back({"kimi_full_oasis_fixed_beta", c});
  }
  v.push_back({"kimi_full_token_only", tiny(Variant::token_only, RouterFamily::kimi_full)});
  v.push_back({"kimi_full_depth_only", tiny(Variant::depth_only, RouterFamily::kimi_full)});
  v.push_back({"kimi_block2_vanilla", [] {
                 om::ModelConfig c = tiny(Variant::vanilla_attnres, RouterFamily::kimi_block);
                 c.readout = Readout::sum;
                 return c;
               }()});
  v.push_back({"authors_oasis", tiny(Variant::oasis, RouterFamily::authors_code)});
  {  // the authors' router without coupling (the uncoupled clamp), psi from p_null
    om::ModelConfig c = tiny(Variant::aos, RouterFamily::authors_code);
    c.psi_estimator = om::PsiEstimator::p_null;
    c.tie_embeddings = true;
    v.push_back({"authors_aos_tied", c});
  }
  {
    om::ModelConfig c = tiny(Variant::original, RouterFamily::kimi_full);
    c.n_kv_heads = 1;
    v.push_back({"original", c});
  }
  return v;
}

/// A model with every parameter random and non-degenerate (scale `sd` for the weights).
template <class T>
om::Model<T> random_model(const om::ModelConfig& cfg, std::uint64_t seed, double sd = 0.4) {
  om::ModelConfig c = cfg;
  c.init_std = sd;
  om::Model<double> m = om::Model<double>::initialized(c, seed);
  auto rng = oasis::test::make_rng(seed + 11);
  for (const auto& spec : om::parameter_specs(c)) {
    const std::string& n = spec.name;
    auto ends = [&](const std::string& s) { return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0; };
    if (ends(".query")) m.set_param(n, oasis::test::randn<double>(spec.shape, rng, 1.0));
    if (n.find("norm.weight") != std::string::npos) m.set_param(n, oasis::test::uniform<double>(spec.shape, rng, 0.5, 1.5));
    if (ends(".recency_bias")) m.set_param(n, oasis::test::uniform<double>(spec.shape, rng, -1.0, 1.0));
    if (ends(".theta")) {  // a multiple of 2^-5 in [-1, 1]
      Tensor<double> t = oasis::test::uniform<double>(spec.shape, rng, -1.0, 1.0);
      t[0] = std::round(t[0] * 32) / 32;
      m.set_param(n, t);
    }
  }
  return m.template cast<T>();
}

/// The loss weights R [B, T, V] (dL/dlogits) and the token ids of a case.
struct LossInputs {
  std::vector<index_t> ids;
  Tensor<double> R, x;  ///< x: input embeddings [B, T, d] for the embedding path
};

inline LossInputs loss_inputs(const ModelCase& mc, std::uint64_t seed) {
  auto rng = oasis::test::make_rng(seed + 23);
  LossInputs li;
  li.ids.resize(static_cast<std::size_t>(mc.B * mc.T));
  for (auto& t : li.ids) t = static_cast<index_t>(rng() % static_cast<std::uint64_t>(mc.cfg.vocab_size));
  li.R = oasis::test::randn<double>({mc.B, mc.T, mc.cfg.vocab_size}, rng);
  li.x = oasis::test::randn<double>({mc.B, mc.T, mc.cfg.d_model}, rng);
  return li;
}

// ---- the zoo of wrong model backwards ---------------------------------------------------------------
//
// Each mutant is the oracle's backward with one known mistake of a training implementation, made
// by editing the recorded forward graph (a missing edge) or the routers' gradients before use.

enum class ModelMutant {
  none,
  router_keys_missing,         ///< a router's candidates get gradient through the mix only, not their keys/query
  residual_not_split,          ///< residual + sublayer_out: only the sublayer output gets the gradient
  theta_dropped,               ///< the coupling's theta gets no gradient
  inherited_psi_dropped,       ///< a head-less (MLP) candidate's psi gradient never reaches the attention it inherits from
  tied_head_not_summed,        ///< tied embeddings: the LM head's gradient is not added to the table
  block_sum_last_term_only,    ///< a block sum passes its gradient to its last term only
  block_psi_mean_undivided,    ///< a block's psi (mean over its attention sublayers) passes dpsi undivided
};

inline const char* name_of(ModelMutant m) {
  switch (m) {
    case ModelMutant::none: return "reference";
    case ModelMutant::router_keys_missing: return "router_source_gradient_without_key_path";
    case ModelMutant::residual_not_split: return "residual_gradient_not_split";
    case ModelMutant::theta_dropped: return "theta_gradient_dropped";
    case ModelMutant::inherited_psi_dropped: return "mlp_psi_gradient_not_reaching_attention";
    case ModelMutant::tied_head_not_summed: return "tied_embedding_gradient_not_summed";
    case ModelMutant::block_sum_last_term_only: return "block_sum_gradient_to_last_term_only";
    case ModelMutant::block_psi_mean_undivided: return "block_psi_mean_gradient_undivided";
  }
  return "?";
}

/// The mutants and the case (by name, model_cases()) each one is exercised on.
inline std::vector<std::pair<ModelMutant, std::string>> mutant_cases() {
  return {{ModelMutant::router_keys_missing, "kimi_full_oasis_final"},
          {ModelMutant::router_keys_missing, "authors_oasis"},
          {ModelMutant::residual_not_split, "authors_oasis"},
          {ModelMutant::theta_dropped, "kimi_full_oasis_final"},
          {ModelMutant::inherited_psi_dropped, "kimi_full_oasis_final"},
          {ModelMutant::inherited_psi_dropped, "authors_oasis"},
          {ModelMutant::tied_head_not_summed, "kimi_block3_oasis_tied"},
          {ModelMutant::block_sum_last_term_only, "kimi_block2_oasis_sum_mass"},
          {ModelMutant::block_psi_mean_undivided, "kimi_block3_oasis_tied"}};
}

inline ModelCase case_named(const std::string& name) {
  for (const ModelCase& c : model_cases())
    if (c.name == name) return c;
  throw std::runtime_error("no model case " + name);
}

/// The backward with one mistake (ModelMutant::none: exactly model_backward).
template <class T>
om::ModelGrads<T> mutant_backward(const om::Model<T>& m, const std::vector<index_t>& ids, index_t B, index_t Tn,
                                  const Tensor<T>& dlogits, ModelMutant mu) {
  om::detail::ModelTape<T> tp = om::detail::record_forward(m, m.embed(ids, B, Tn), B, Tn);
  for (auto& s : tp.steps) {
    if (!s.is_router) continue;
    for (std::size_t k = 0; k < s.candidates.size(); ++k) {
      om::detail::NodeSum& c = s.candidates[k];
      if ((mu == ModelMutant::residual_not_split || mu == ModelMutant::block_sum_last_term_only) && c.nodes.size() > 1)
        c.nodes.erase(c.nodes.begin(), c.nodes.end() - 1);
      if (mu == ModelMutant::inherited_psi_dropped && s.route.kinds[k] == SourceKind::headless) c.psi_from.clear();
      if (mu == ModelMutant::block_psi_mean_undivided) c.psi_div = std::min<index_t>(c.psi_div, 1);
    }
  }
  if (mu == ModelMutant::router_keys_missing)
    tp.adjust_route = [](om::RouteGrads<T>& g, const om::detail::TapeStep<T>&) { g.sources = g.depth.sources; };
  if (mu == ModelMutant::theta_dropped)
    tp.adjust_route = [](om::RouteGrads<T>& g, const om::detail::TapeStep<T>&) { g.depth.theta = T(0); };
  if (mu == ModelMutant::tied_head_not_summed) tp.tied_head_into_embedding = false;
  om::ModelGrads<T> g = om::detail::backward_from_tape(m, tp, dlogits, Tensor<T>());
  om::detail::accumulate_embedding_table(g, ids);
  return g;
}

}  // namespace oasis::model_grad_test
