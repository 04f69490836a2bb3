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
#include "oasis/multiprecision.hpp"

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

/// Rows [N, w] in mp50 from a [.., w] tensor of T (exact), with zero input error.
template <class T>
om::Rows<mp50> exact_rows(const oasis::Tensor<T>& x, index_t w) {
  om::Rows<mp50> r{x.template cast<mp50>().reshaped({x.size() / w, w}), {}};
  r.e.assign(static_cast<std::size_t>(x.size() / w), 0.0);
  return r;
}

/// |got - ref| <= 1.02 * bound(row) for tensors whose rows are `w` wide.
template <class T>
::testing::AssertionResult rows_within(const std::string& name, const oasis::Tensor<T>& got, const oasis::Tensor<mp50>& ref,
                                       const std::vector<double>& bound, index_t w) {
  auto v = oasis::test::within_bound<T, mp50>(name, got, ref.reshaped(got.shape()), [&](index_t i, double) {
    return kSecondOrder * bound[static_cast<std::size_t>(i / w)];
  });
  if (std::getenv("OASIS_MODEL_PRINT_RATIOS")) std::printf("%s\n", v.message());
  return v;
}

/// Stepwise policy: every step of the T model (each depth router, each sublayer, the head),
/// evaluated on its own T inputs (exact in T), is within the derived local bound of the same
/// step in mp50 on those inputs (the op bounds with zero input error, u = u(T)).
template <class T>
void check_steps(const Case& k, std::uint64_t seed, double weight_std) {
  const Models<T> m = models<T>(k, seed, weight_std);
  const om::ModelConfig& c = k.cfg;
  const index_t B = 2, Tn = 4, N = B * Tn, d = c.d_model;
  const auto ids = tokens(N, seed, c.vocab_size);
  const auto res = m.t.forward(ids, B, Tn, {true});
  const om::ErrorModel em{oasis::unit_roundoff<T>()};
  const std::string ctx = k.name + " (" + typeid(T).name() + ", std " + std::to_string(weight_std) + ")";
  for (std::size_t l = 0; l < res.trace.size(); ++l) {
    const auto& tr = res.trace[l];
    const index_t b = static_cast<index_t>(l / 2);
    if (tr.has_route) {
      const index_t n = tr.sources.dim(0);
      std::vector<om::DepthSource<mp50>> src(static_cast<std::size_t>(n));
      std::vector<const om::DepthSource<mp50>*> ptr;
      for (index_t i = 0; i < n; ++i) {
        auto& s = src[static_cast<std::size_t>(i)];
        s.v = exact_rows(oasis::Tensor<T>({N, d}, std::vector<T>(tr.sources.ptr(i), tr.sources.ptr(i) + N * d)), d);
        s.kind = tr.source_kinds[static_cast<std::size_t>(i)];
        s.psi = oasis::Tensor<T>({N}, std::vector<T>(tr.psi.ptr(i), tr.psi.ptr(i) + N)).template cast<mp50>();
        s.e_psi.assign(static_cast<std::size_t>(N), 0.0);
        ptr.push_back(&s);
      }
      const std::string R = tr.kind == om::SublayerKind::readout ? "final_res"
                            : "layers." + std::to_string(b) + (tr.kind == om::SublayerKind::attention ? ".attn_res" : ".mlp_res");
      const auto ref = c.router == om::RouterFamily::authors_code
                           ? om::authors_route(ptr, m.r.param(R + ".q_proj.weight"), m.r.param(R + ".k_proj.weight"),
                                               m.r.param(R + ".recency_bias")[0], m.r.theta_of(R), c, em)
                           : om::kimi_route(ptr, m.r.param(R + ".query"), m.r.gain_of(R), m.r.theta_of(R), c, em);
      EXPECT_TRUE(rows_within(tr.name + " routed", tr.routed, ref.h.x, ref.h.e, d)) << ctx;
    }
    if (tr.kind == om::SublayerKind::attention) {
      om::KVCache<mp50> cache;
      const auto a = om::attention_sublayer(exact_rows(tr.input, d), B, Tn, 0, m.r.attn_weights(b), c, cache, em);
      EXPECT_TRUE(rows_within(tr.name + " output", tr.output, a.out.x, a.out.e, d)) << ctx;
      EXPECT_TRUE(rows_within(tr.name + " psi", tr.branch_psi, a.psi, a.e_psi, 1)) << ctx;
    } else if (tr.kind == om::SublayerKind::mlp) {
      const auto f = om::mlp_sublayer(exact_rows(tr.input, d), m.r.mlp_weights(b), c, em);
      EXPECT_TRUE(rows_within(tr.name + " output", tr.output, f.x, f.e, d)) << ctx;
    }
  }
  const auto xn = om::rms_norm(exact_rows(res.state, d), m.r.param("norm.weight"), oasis::KeyNormOptions{c.norm_eps, false}, em);
  const auto logits = om::linear(xn, m.r.param(c.tie_embeddings ? "embed_tokens.weight" : "lm_head.weight"), em);
  EXPECT_TRUE(rows_within("head logits", res.logits, logits.x, logits.e, c.vocab_size)) << ctx;
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
