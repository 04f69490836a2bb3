// Model family: float and double models against the high-precision model (oasis::mp50).
//
// Policy (docs/model.md, "Forward error bound"), with weights exact in T:
//  * stepwise: every step of the T model (router, sublayer, head) on its own T inputs is within
//    1.02 x the derived local bound of the same step in mp50 (ErrorModel with u = u(T), zero
//    input error); the local bounds are informative (a few hundred u relative);
//  * the composed end-to-end first-order bound (ForwardOptions::error_u on a whole forward) is
//    valid but overestimates by 1e7 to 1e30 (worst-case alignment compounds over ~10 ops per
//    sublayer), so it is documented, not tested (docs/model.md).
// OASIS_MODEL_PRINT_RATIOS=1 prints the worst |err|/bound of every step.
// The rules are derived op by op in layers.hpp / router.hpp; 1.02 covers second-order terms.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model_test_util.hpp"
#include "oasis/model/precision.hpp"
#include "oasis/core/multiprecision.hpp"

namespace om = oasis::model;
using oasis::index_t;
using oasis::mp50;
using oasis::Variant;
using oasis::model_test::random_model;
using oasis::model_test::tiny;
using oasis::model_test::tokens;

namespace {

constexpr double kSecondOrder = 1.02;

struct Case {
  std::string name;
  om::ModelConfig cfg;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (om::RouterFamily r : {om::RouterFamily::kimi_full, om::RouterFamily::kimi_block, om::RouterFamily::authors_code})
    for (Variant v : {Variant::vanilla_attnres, Variant::depth_only, Variant::aos, Variant::oasis}) {
      om::ModelConfig c = tiny(v, r, 3);
      out.push_back({std::string(om::to_string(r)) + "/" + std::string(oasis::to_string(v)), c});
    }
  om::ModelConfig o = tiny(Variant::original, om::RouterFamily::kimi_full, 3);
  out.push_back({"original", o});
  om::ModelConfig g = tiny(Variant::oasis, om::RouterFamily::kimi_full, 2);
  g.n_kv_heads = 1;
  g.qk_norm = true;
  g.rope = om::RopeLayout::interleaved;
  g.key_norm_gain = true;
  g.readout = om::Readout::sum;
  out.push_back({"kimi_full/oasis gqa qk_norm interleaved sum-readout", g});
  om::ModelConfig l = tiny(Variant::oasis, om::RouterFamily::kimi_block, 3);
  l.block_size = 3;
  l.readout = om::Readout::last;
  oasis::CouplingOptions co = oasis::CouplingOptions::authors_code();
  co.headless = oasis::HeadlessRule::no_evidence;
  l.coupling = co;
  out.push_back({"kimi_block S=3/oasis authors centring no_evidence last-readout", l});
  om::ModelConfig f32 = tiny(Variant::oasis, om::RouterFamily::kimi_block, 2);
  f32.key_norm.compute_in_float32 = true;
  f32.key_norm.eps = 1e-5;
  f32.key_norm_gain = true;
  out.push_back({"kimi_block/oasis key norm in float32 eps 1e-5", f32});
  om::ModelConfig n32 = tiny(Variant::oasis, om::RouterFamily::kimi_block, 3);
  n32.norm_float32 = true;
  n32.qk_norm = true;
  n32.block_sizes = {2, 2, 1, 1};
  out.push_back({"kimi_block 2,2,1,1/oasis every norm in float32, q/k norm", n32});
  om::ModelConfig p = tiny(Variant::oasis, om::RouterFamily::authors_code, 2);
  p.psi_estimator = om::PsiEstimator::p_null;
  out.push_back({"authors_code/oasis p_null estimator", p});
  return out;
}

template <class T>
struct Models {
  om::Model<float> f;
  om::Model<T> t;
  om::Model<mp50> r;
};

/// Weights drawn in double, rounded to float: exact in float, T and mp50 alike.
template <class T>
Models<T> models(const Case& k, std::uint64_t seed, double weight_std) {
  auto f = random_model<double>(k.cfg, seed, weight_std).template cast<float>();
  auto t = f.template cast<T>();
  auto r = f.template cast<mp50>();
  return {std::move(f), std::move(t), std::move(r)};
}

/// Stepwise policy (om::stepwise_precision): every step of the T model on its own T inputs is
/// within 1.02 x the derived local bound of the same step in mp50.
template <class T>
void check_steps(const Case& k, std::uint64_t seed, double weight_std) {
  const Models<T> m = models<T>(k, seed, weight_std);
  const index_t B = 2, Tn = 4;
  const auto steps = om::stepwise_precision(m.t, m.r, tokens(B * Tn, seed, k.cfg.vocab_size), B, Tn);
  EXPECT_EQ(steps.size(), static_cast<std::size_t>(
      1 + 8 * k.cfg.n_blocks + (k.cfg.attn_res() ? 2 * k.cfg.n_blocks : 0) +
      (k.cfg.attn_res() && k.cfg.readout_or_default() == om::Readout::final_attnres ? 1 : 0))) << k.name;
  for (const auto& st : steps) {
    EXPECT_EQ(st.violations, 0) << k.name << " (" << typeid(T).name() << ", std " << weight_std << "): " << st.step
                                << " worst |err|/bound " << st.worst_ratio;
    if (std::getenv("OASIS_MODEL_PRINT_RATIOS")) std::printf("%s: worst |err|/bound = %.3g\n", st.step.c_str(), st.worst_ratio);
  }
}

}  // namespace

TEST(ModelPrecision, FloatStepsWithinDerivedBoundOfMp50) {
  std::uint64_t seed = 100;
  for (const Case& k : cases())
    for (double std : {0.02, 0.5}) check_steps<float>(k, seed++, std);
}

TEST(ModelPrecision, DoubleStepsWithinDerivedBoundOfMp50) {
  std::uint64_t seed = 200;
  for (const Case& k : cases())
    for (double std : {0.02, 0.5}) check_steps<double>(k, seed++, std);
}

// The check has teeth: a reference whose v projection of block 0 differs by a relative 1e-4 (as
// a step that lost 10 bits of float would) is caught at that step ("v"), and nowhere else: every
// later step is re-evaluated on the T model's own inputs.
TEST(ModelPrecision, StepwiseCheckDetectsALocalDeviation) {
  const Case k{"kimi_full/oasis", tiny(Variant::oasis, om::RouterFamily::kimi_full, 2)};
  const Models<float> m = models<float>(k, 900, 0.5);
  om::Model<mp50> bad = m.r;
  auto w = bad.param("layers.0.attn.v_proj.weight");
  for (index_t i = 0; i < w.size(); ++i) w[i] *= mp50(1.0001);
  bad.set_param("layers.0.attn.v_proj.weight", w);
  const auto steps = om::stepwise_precision(m.f, bad, tokens(8, 900, k.cfg.vocab_size), 2, 4);
  index_t flagged = 0;
  for (const auto& st : steps) {
    if (st.step == "layers.0.attn v") EXPECT_GT(st.violations, 0) << "worst ratio " << st.worst_ratio;
    else EXPECT_EQ(st.violations, 0) << st.step;
    flagged += st.violations > 0;
  }
  EXPECT_EQ(flagged, 1);
}
