// Generators shared by the core property tests (rapidcheck).
#pragma once

#include <rapidcheck.h>

#include <vector>

#include "oasis/core/scalar.hpp"

namespace oasis::test {

/// A logit row: m in [0, max_m], entries k/64 for integers k (exact in every scalar type),
/// magnitude up to `range`, each masked (-inf) with probability about 1/5 when `masked`.
inline std::vector<double> gen_logits(int max_m, double range, bool masked) {
  const int m = *rc::gen::inRange(0, max_m + 1);
  const int lim = static_cast<int>(range * 64);
  std::vector<double> z(static_cast<std::size_t>(m));
  for (auto& x : z) {
    const bool mask = masked && *rc::gen::inRange(0, 5) == 0;
    x = mask ? neg_inf<double>() : static_cast<double>(*rc::gen::inRange(-lim, lim + 1)) / 64.0;
  }
  return z;
}

template <class T>
Vec<T> to_vec(const std::vector<double>& z) {
  Vec<T> v(static_cast<index_t>(z.size()));
  for (std::size_t i = 0; i < z.size(); ++i) v[static_cast<index_t>(i)] = static_cast<T>(z[i]);
  return v;
}

}  // namespace oasis::test
