// Shared helpers of the model test family: tiny configurations, reproducible token ids, and
// randomised models whose routing is not uniform.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "oasis/model/model.hpp"
#include "oasis_test.hpp"

namespace oasis::model_test {

namespace om = oasis::model;
using oasis::index_t;
using oasis::Variant;

/// Every router family.
inline const std::vector<om::RouterFamily> kRouters = {om::RouterFamily::kimi_full, om::RouterFamily::kimi_block,
                                                       om::RouterFamily::authors_code};

inline om::ModelConfig tiny(Variant v, om::RouterFamily r, index_t blocks = 2) {
  om::ModelConfig c;
  c.vocab_size = 11;
  c.d_model = 8;
  c.n_blocks = blocks;
  c.n_heads = 2;
  c.d_ff = 12;
  c.variant = v;
  c.router = r;
  c.authors_rank = 4;
  if (r == om::RouterFamily::authors_code) c = om::ModelConfig::authors_profile(c);
  return c;
}

inline std::vector<index_t> tokens(index_t n, std::uint64_t salt, index_t vocab) {
  auto rng = oasis::test::make_rng(salt);
  std::vector<index_t> ids(static_cast<std::size_t>(n));
  for (auto& t : ids) t = static_cast<index_t>(rng() % static_cast<std::uint64_t>(vocab));
  return ids;
}

/// Initialised model with random (non-zero) pseudo-queries, gains, recency and theta, so that
/// routing is not uniform and every parameter matters.
template <class T>
om::Model<T> random_model(const om::ModelConfig& cfg, std::uint64_t seed, double std = 0.3) {
  om::ModelConfig c = cfg;
  c.init_std = std;
  om::Model<T> m = om::Model<T>::initialized(c, seed);
  auto rng = oasis::test::make_rng(seed + 7);
  for (const auto& spec : om::parameter_specs(c)) {
    const std::string& n = spec.name;
    const bool is_query = n.size() > 6 && n.compare(n.size() - 6, 6, ".query") == 0;
    const bool is_gain = n.find("norm.weight") != std::string::npos;
    const bool is_theta = n.find(".theta") != std::string::npos;
    const bool is_rec = n.find("recency_bias") != std::string::npos;
    if (is_query) m.set_param(n, oasis::test::randn<T>(spec.shape, rng, 1.0));
    if (is_gain) m.set_param(n, oasis::test::uniform<T>(spec.shape, rng, 0.5, 1.5));
    if (is_theta) m.set_param(n, oasis::test::uniform<T>(spec.shape, rng, -1.0, 1.0));
    if (is_rec) m.set_param(n, oasis::test::uniform<T>(spec.shape, rng, -1.0, 1.0));
  }
  return m;
}

}  // namespace oasis::model_test
