// bench/oasis_test_random.hpp — reproducible random float tensors for the benchmarks (no gtest).
#pragma once

#include <cstdint>
#include <random>

#include "oasis/tensor.hpp"

namespace oasis_bench {

inline std::mt19937_64 make_rng(std::uint64_t salt) { return std::mt19937_64(20261129ULL * 1000003ULL + salt); }

inline oasis::Tensor<float> randn_f(oasis::Shape shape, std::mt19937_64& rng, double sd = 1.0) {
  std::normal_distribution<double> nd(0.0, sd);
  oasis::Tensor<float> t(std::move(shape));
  for (oasis::index_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(nd(rng));
  return t;
}

inline oasis::Tensor<float> uniform_f(oasis::Shape shape, std::mt19937_64& rng, double lo, double hi) {
  std::uniform_real_distribution<double> ud(lo, hi);
  oasis::Tensor<float> t(std::move(shape));
  for (oasis::index_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(ud(rng));
  return t;
}

}  // namespace oasis_bench
