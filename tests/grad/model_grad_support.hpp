// tests/grad/model_grad_support.hpp — tiny models for the model backward tests: one configuration
// per router family, readout, variant and psi estimator; seeded random parameters (non-zero
// pseudo-queries, gains, recency; theta a multiple of 2^-5 so that theta +- 2^-40 is exact in
// double, where the model holds it); the loss L = sum(logits * R) with a fixed random R.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
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
  {  // Block AttnRes S = 3 over L = 4 (uneven: the last block is one MLP, head-less, inheriting psi),
     // last readout, tied embeddings
    om::ModelConfig c = tiny(Variant::oasis, RouterFamily::kimi_block);
    c.block_size = 3;
    c.readout = Readout::last;
    c.tie_embeddings = true;
    v.push_back({"kimi_block3_oasis_last_tied", c});
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

}  // namespace oasis::model_grad_test
