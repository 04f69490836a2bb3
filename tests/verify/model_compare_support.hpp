// tests/verify/model_compare_support.hpp — the test models of the model-level verdict (Kimi Full,
// Kimi Block with uneven blocks, the authors' router; non-trivial routers, weights exact in float),
// their traces as the library writes them, the comparison of a trace against the weights, and the
// fast oracle's agreement with the mp50 oracle.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "compare_test_util.hpp"
#include "oasis/io/safetensors.hpp"
#include "oasis/model/io.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"

namespace oasis::verify_test {

namespace om = oasis::model;

inline constexpr index_t kB = 2, kT = 5;

// ---- the test models ----------------------------------------------------------------------------

/// Two transformer blocks, d = 16, H = 2, vocab 32, weights N(0, 0.3^2): logits of order 1.
/// theta = 0.5 (beta ~ 0.97) so that psi matters; a learned key-norm gain.
inline om::ModelConfig kimi_full() {
  om::ModelConfig c;
  c.init_std = 0.3;
  c.theta_init = 0.5;
  c.key_norm_gain = true;
  return c;
}
/// Block AttnRes with uneven blocks: 6 sublayers in blocks of 2, 2, 1, 1 (the last block starts
/// at an MLP sublayer).
inline om::ModelConfig kimi_block() {
  om::ModelConfig c = kimi_full();
  c.router = om::RouterFamily::kimi_block;
  c.n_blocks = 3;
  c.block_sizes = {2, 2, 1, 1};
  return c;
}
/// The authors' router, centring, clamps and mass-deficit psi; low-rank width 8.
inline om::ModelConfig authors() {
  om::ModelConfig c = om::ModelConfig::authors_profile(kimi_full());
  c.key_norm_gain = false;
  c.authors_rank = 8;
  return c;
}

/// The model of `cfg` with non-trivial routers (pseudo-queries N(0, 0.5^2), key gains 1 + N(0, 0.3^2),
/// recency +-1.2), every weight exact in float. `like`: take the weights of that model where the
/// names agree (a mistaken configuration with the same weights).
inline om::Model<double> test_model(const om::ModelConfig& cfg, std::uint64_t seed, const om::Model<double>* like = nullptr) {
  om::Model<double> m = om::Model<double>::initialized(cfg, seed);
  std::mt19937_64 rng(seed + 17);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (const auto& [name, t0] : m.parameters()) {
    Tensor<double> t = t0;
    auto ends = [&](const char* s) { return name.size() >= std::strlen(s) && name.compare(name.size() - std::strlen(s), std::strlen(s), s) == 0; };
    for (index_t i = 0; i < t.size(); ++i) {
      if (ends(".query")) t[i] = 0.5 * nd(rng);
      else if (ends(".key_norm.weight")) t[i] = 1.0 + 0.3 * nd(rng);
      else if (ends(".recency_bias")) t[i] = (name.find("mlp") == std::string::npos ? 1.2 : -1.2);
      t[i] = static_cast<double>(static_cast<float>(t[i]));
    }
    if (like && like->parameters().count(name)) t = like->param(name);
    m.set_param(name, t);
  }
  return m;
}

inline std::vector<index_t> token_ids(const om::ModelConfig& c) {
  std::vector<index_t> ids;
  for (index_t i = 0; i < kB * kT; ++i) ids.push_back((7 * i + 3) % c.vocab_size);
  return ids;
}
/// The ids as the implementation writes them: int32.
inline io::StoredTensor ids_tensor(const std::vector<index_t>& ids) {
  Tensor<double> t({kB, kT});
  for (index_t i = 0; i < kB * kT; ++i) t[i] = static_cast<double>(ids[static_cast<std::size_t>(i)]);
  return {io::DType::i32, t};
}

template <class T>
io::TensorMap library_trace(const om::Model<T>& m, const std::vector<index_t>& ids, io::DType dt, om::StoreFn store = nullptr) {
  om::ForwardOptions fo;
  fo.trace = true;
  fo.store = store;
  io::TensorMap t = om::trace_tensors(m.forward(ids, kB, kT, fo), dt);
  t.emplace("ids", ids_tensor(ids));
  return t;
}

inline double store_bf16(double x) { return io::round_to_dtype(x, io::DType::bf16); }
inline double store_f16(double x) { return io::round_to_dtype(x, io::DType::f16); }
inline double store_f32(double x) { return io::round_to_dtype(x, io::DType::f32); }

/// Keep only the named fields (by suffix) and ids.
inline io::TensorMap only(const io::TensorMap& t, const std::vector<std::string>& suffixes) {
  io::TensorMap o;
  for (const auto& [name, v] : t) {
    if (name == "ids") o.emplace(name, v);
    for (const auto& s : suffixes)
      if (name == s || (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0 &&
                        name[name.size() - s.size() - 1] == '.'))
        o.emplace(name, v);
  }
  return o;
}

// ---- running a comparison -----------------------------------------------------------------------

struct Outcome {
  verify::CompareReport rep;
  double seconds = 0;
};

inline Outcome compare(const std::string& dir, const om::Model<double>& weights, const io::TensorMap& trace,
                   io::DType weights_dtype = io::DType::f32, verify::Oracle oracle = verify::Oracle::fast,
                   verify::Policy policy = verify::Policy::probabilistic) {
  om::save_model(weights, dir + "/model.safetensors", weights_dtype);
  io::write_safetensors(dir + "/run.safetensors", trace);
  std::ofstream(dir + "/config.json") << kModelCfg;
  verify::CompareOptions opt;
  opt.oracle = oracle;
  opt.policy = policy;
  const auto t0 = std::chrono::steady_clock::now();
  Outcome r{verify::compare_config_file(dir + "/config.json", opt), 0};
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

inline om::Model<float> as_float(const om::Model<double>& m) { return m.cast<float>(); }

/// The float32 trace of the library's model with the weights of `m` and a mistaken configuration.
inline io::TensorMap mistaken_trace(const om::Model<double>& m, const std::vector<index_t>& ids,
                                    const std::function<void(om::ModelConfig&)>& change) {
  om::ModelConfig c = m.config();
  change(c);
  return library_trace(as_float(test_model(c, 1, &m)), ids, io::DType::f32);
}

/// The fast oracle's report gives the mp50 oracle's verdicts: the same tensors, verdicts and
/// violation counts, and for float32 and 16-bit tensors the worst ratios to a relative 1e-6 (the
/// fast ratios are taken at the double reference, within ~1e-9 of the allowance of the exact one;
/// for float64 tensors that error is of the order of the allowance).
inline void expect_same_verdicts(const verify::CompareReport& fast, const verify::CompareReport& mp, const std::string& what) {
  EXPECT_EQ(fast.passed, mp.passed) << what;
  ASSERT_EQ(fast.tensors.size(), mp.tensors.size()) << what;
  for (std::size_t i = 0; i < fast.tensors.size(); ++i) {
    const verify::TensorReport &f = fast.tensors[i], &m = mp.tensors[i];
    EXPECT_EQ(f.name, m.name) << what;
    EXPECT_EQ(f.passed, m.passed) << what << " " << f.name;
    EXPECT_EQ(f.violations, m.violations) << what << " " << f.name;
    if (std::isfinite(m.worst_ratio) && f.dtype != io::DType::f64)
      EXPECT_NEAR(f.worst_ratio, m.worst_ratio, 1e-6 * m.worst_ratio + 1e-12) << what << " " << f.name;
  }
}

}  // namespace oasis::verify_test
