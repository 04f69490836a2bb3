// Model family: structure of the AttnRes transformer oracle (docs/spec.md §2–4).
// Source sets of Full/Block AttnRes, N = L blocks equals Full, zero pseudo-queries give uniform
// depth weights, beta = 0 equals AoS, each variant selects its normalisers (through the trace),
// psi of every attention sublayer feeds every later router, head-less rules, the authors'
// router, RoPE layouts, GQA, initialisation. Decoding, wiring and execution: test_model_wiring.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "oasis/model/model.hpp"
#include "model_test_util.hpp"
#include "oasis_test.hpp"

namespace om = oasis::model;
using oasis::index_t;
using oasis::RowNorm;
using oasis::SourceKind;
using oasis::Tensor;
using oasis::Variant;
using oasis::test::exactly_equal;

namespace {

using oasis::model_test::random_model;
using oasis::model_test::tiny;
using oasis::model_test::tokens;
using oasis::model_test::kRouters;

const std::vector<Variant> kAllVariants = {Variant::original, Variant::vanilla_attnres, Variant::token_only,
                                           Variant::depth_only, Variant::aos, Variant::oasis};

}  // namespace

// docs/spec.md §4: 8 sublayers, S = 2 -> source-set sizes 1,2,2,3,3,4,4,5 (and 5 for the final readout).
TEST(ModelStructure, BlockAttnResSourceSetSizes) {
  om::ModelConfig c = tiny(Variant::aos, om::RouterFamily::kimi_block, 4);
  c.block_size = 2;
  const auto m = random_model<double>(c, 1);
  const auto r = m.forward(tokens(3, 1, c.vocab_size), 1, 3, {true});
  ASSERT_EQ(r.trace.size(), 9u);
  const std::vector<std::size_t> want = {1, 2, 2, 3, 3, 4, 4, 5, 5};
  for (std::size_t l = 0; l < 9; ++l) {
    EXPECT_EQ(r.trace[l].source_kinds.size(), want[l]) << r.trace[l].name;
    EXPECT_EQ(r.trace[l].alpha.dim(0), static_cast<index_t>(want[l])) << r.trace[l].name;
  }
  EXPECT_EQ(r.trace[8].kind, om::SublayerKind::readout);
  // b_0 is the embedding, then completed blocks; the last candidate of a block's second layer is partial.
  EXPECT_EQ(r.trace[3].source_names,
            (std::vector<std::string>{"embedding", "block 1 (layers.0.attn .. layers.0.mlp)", "block 2 (layers.1.attn, partial)"}));
}

TEST(ModelStructure, FullAttnResSourceSetSizes) {
  const om::ModelConfig c = tiny(Variant::aos, om::RouterFamily::kimi_full, 4);
  const auto m = random_model<double>(c, 2);
  const auto r = m.forward(tokens(3, 2, c.vocab_size), 1, 3, {true});
  ASSERT_EQ(r.trace.size(), 9u);
  for (std::size_t l = 0; l < 9; ++l) EXPECT_EQ(r.trace[l].source_kinds.size(), l + 1) << r.trace[l].name;
  // Source kinds: embedding, then attention / MLP outputs alternating.
  const auto& k = r.trace[8].source_kinds;
  EXPECT_EQ(k[0], SourceKind::initial);
  for (std::size_t i = 1; i < k.size(); ++i)
    EXPECT_EQ(k[i], i % 2 == 1 ? SourceKind::attention : SourceKind::headless) << i;
}

// Block values are the block sums: b_n = sum of the raw outputs of its sublayers.
TEST(ModelStructure, BlockSourcesAreSumsOfSublayerOutputs) {
  om::ModelConfig c = tiny(Variant::oasis, om::RouterFamily::kimi_block, 3);
  c.block_size = 2;
  const auto m = random_model<double>(c, 3);
  const auto r = m.forward(tokens(4, 3, c.vocab_size), 1, 4, {true});
  // Final readout over [b_0, b_1, b_2, b_3] with b_0 = the token embedding and
  // b_n = out_{2n-1} + out_{2n}: h = sum_n alpha_n b_n, same operations in the same order (exact).
  const auto& fin = r.trace.back();
  ASSERT_EQ(fin.alpha.dim(0), 4);
  const auto ids = tokens(4, 3, c.vocab_size);
  const auto& E = m.param("embed_tokens.weight");
  for (index_t t = 0; t < 4; ++t)
    for (index_t ch = 0; ch < c.d_model; ++ch) {
      double h = fin.alpha(0, 0, t) * E(ids[static_cast<std::size_t>(t)], ch);
      for (index_t n = 1; n <= 3; ++n)
        h += fin.alpha(n, 0, t) * (r.trace[static_cast<std::size_t>(2 * n - 2)].output(0, t, ch) +
                                   r.trace[static_cast<std::size_t>(2 * n - 1)].output(0, t, ch));
      // Same products and sums in the same order as the model: exact.
      EXPECT_EQ(h, fin.routed(0, t, ch)) << "t " << t << " ch " << ch;
    }
}

// docs/spec.md §4: N = L blocks (S = 1) recovers Full AttnRes, bit for bit.
TEST(ModelStructure, BlockSizeOneEqualsFull) {
  for (Variant v : {Variant::vanilla_attnres, Variant::aos, Variant::oasis}) {
    const om::ModelConfig full = tiny(v, om::RouterFamily::kimi_full, 3);
    om::ModelConfig blk = full;
    blk.router = om::RouterFamily::kimi_block;
    blk.block_size = 1;
    const auto mf = random_model<double>(full, 4);
    om::Model<double> mb(blk);
    for (const auto& [name, t] : mf.parameters()) mb.set_param(name, t);
    const auto ids = tokens(5, 4, full.vocab_size);
    EXPECT_TRUE(exactly_equal("logits", mb.forward(ids, 1, 5).logits, mf.forward(ids, 1, 5).logits))
        << oasis::to_string(v);
  }
}

// Zero pseudo-queries (the initialisation) give uniform depth weights: 1/n (softmax) or
// 1/(n+1) with alpha_null = 1/(n+1) (Softmax1); exact, since exp(0) = 1 and the sum is n (+1).
TEST(ModelStructure, ZeroPseudoQueriesGiveUniformDepthWeights) {
  for (Variant v : {Variant::vanilla_attnres, Variant::token_only, Variant::depth_only, Variant::aos, Variant::oasis})
    for (om::RouterFamily r : {om::RouterFamily::kimi_full, om::RouterFamily::kimi_block}) {
      om::ModelConfig c = tiny(v, r, 3);
      c.init_std = 0.3;
      c.beta = 0.0;  // OASIS: no coupling shift, so the uniform claim is exact for it too
      const auto m = om::Model<double>::initialized(c, 5);
      const auto res = m.forward(tokens(4, 5, c.vocab_size), 1, 4, {true});
      const bool null = oasis::variant_spec(v).depth == RowNorm::softmax1;
      for (const auto& tr : res.trace) {
        const index_t n = tr.alpha.dim(0);
        const double want = 1.0 / static_cast<double>(n + (null ? 1 : 0));
        for (index_t k = 0; k < tr.alpha.size(); ++k) ASSERT_EQ(tr.alpha[k], want) << tr.name;
        for (index_t k = 0; k < tr.alpha_null.size(); ++k) ASSERT_EQ(tr.alpha_null[k], null ? want : 0.0) << tr.name;
      }
    }
}

// docs/spec.md §3, §5.7: beta = 0 reproduces AoS exactly (every router family).
TEST(ModelStructure, BetaZeroEqualsAoS) {
  for (om::RouterFamily r : kRouters) {
    om::ModelConfig oc = tiny(Variant::oasis, r, 3);
    oc.beta = 0.0;
    om::ModelConfig ac = oc;
    ac.variant = Variant::aos;
    ac.beta.reset();
    const auto mo = random_model<double>(oc, 6);
    om::Model<double> ma(ac);
    for (const auto& [name, t] : ma.parameters()) ma.set_param(name, mo.param(name));
    const auto ids = tokens(5, 6, oc.vocab_size);
    const auto ro = mo.forward(ids, 1, 5, {true});
    EXPECT_TRUE(exactly_equal("logits", ro.logits, ma.forward(ids, 1, 5).logits)) << om::to_string(r);
    // and the coupling was live: the centred statistic is not identically zero
    double dmax = 0;
    for (const auto& tr : ro.trace)
      for (index_t k = 0; k < tr.dpsi.size(); ++k) dmax = std::max(dmax, std::abs(tr.dpsi[k]));
    EXPECT_GT(dmax, 0.0) << om::to_string(r);
  }
}

// docs/spec.md §4 table, checked through the trace over whole models: token normaliser (p_null = 0 for
// softmax, = exp(-LSE1) > 0 for Softmax1), depth normaliser (alpha_null = 0 and sum alpha = 1 for
// softmax; sum alpha + alpha_null = 1 with alpha_null > 0 for Softmax1), coupling
// (g = g_old - beta * Dpsi with beta = softplus(theta) > 0, or g = g_old and Dpsi = 0).
TEST(ModelStructure, EachVariantSelectsItsNormalisers) {
  for (om::RouterFamily r : kRouters)
    for (Variant v : kAllVariants) {
      const om::ModelConfig c = tiny(v, r, 2);
      const auto m = random_model<double>(c, 7);
      const auto res = m.forward(tokens(4, 7, c.vocab_size), 1, 4, {true});
      const auto& spec = oasis::variant_spec(v);
      const std::string ctx = std::string(om::to_string(r)) + "/" + std::string(spec.name);
      ASSERT_EQ(res.trace.size(), static_cast<std::size_t>(4 + (spec.attn_res && r != om::RouterFamily::authors_code)))
          << ctx;
      for (const auto& tr : res.trace) {
        if (tr.kind == om::SublayerKind::attention) {
          EXPECT_EQ(tr.token_normalizer, spec.token) << ctx;
          for (index_t k = 0; k < tr.p_null.size(); ++k) {
            if (spec.token == RowNorm::softmax) ASSERT_EQ(tr.p_null[k], 0.0) << ctx;
            else {
              ASSERT_GT(tr.p_null[k], 0.0) << ctx;
              ASSERT_NEAR(tr.p_null[k], std::exp(-tr.lse[k]), 4e-16) << ctx;  // p_null = e^{0 - LSE1}
            }
          }
        }
        EXPECT_EQ(tr.has_route, spec.attn_res) << ctx << " " << tr.name;
        if (!spec.attn_res) continue;
        EXPECT_EQ(tr.depth_normalizer, spec.depth) << ctx;
        EXPECT_EQ(tr.coupled, spec.coupling) << ctx;
        const index_t n = tr.alpha.dim(0), N = tr.alpha_null.size();
        for (index_t t = 0; t < N; ++t) {
          double sum = tr.alpha_null[t];
          for (index_t i = 0; i < n; ++i) sum += tr.alpha[i * N + t];
          ASSERT_NEAR(sum, 1.0, 1e-14) << ctx;
          if (spec.depth == RowNorm::softmax) ASSERT_EQ(tr.alpha_null[t], 0.0) << ctx;
          else ASSERT_GT(tr.alpha_null[t], 0.0) << ctx;
          for (index_t i = 0; i < n; ++i) {
            const index_t k = i * N + t;
            if (spec.coupling) {
              const double lim = r == om::RouterFamily::authors_code ? 50.0 : HUGE_VAL;
              const double x = std::min(std::max(tr.g_old[k] - tr.beta * tr.dpsi[k], -lim), lim);
              ASSERT_EQ(tr.g[k], x) << ctx;
            } else {
              ASSERT_EQ(tr.g[k], tr.g_old[k]) << ctx;
              ASSERT_EQ(tr.dpsi[k], 0.0) << ctx;
            }
          }
        }
        if (spec.coupling) EXPECT_GT(tr.beta, 0.0) << ctx;
      }
    }
}

// OASIS across the stack (Full AttnRes, paper_v2, inherit): the psi of every earlier attention
// sublayer is the psi its router candidates carry; MLP sources inherit their block's psi;
// Dpsi = psi_i - mean over the evidence candidates, 0 for the embedding.
TEST(ModelStructure, PsiOfEveryAttentionSublayerFeedsLaterRouters) {
  const om::ModelConfig c = tiny(Variant::oasis, om::RouterFamily::kimi_full, 3);
  const auto m = random_model<double>(c, 8);
  const auto res = m.forward(tokens(4, 8, c.vocab_size), 1, 4, {true});
  for (std::size_t l = 0; l < res.trace.size(); ++l) {
    const auto& tr = res.trace[l];
    const index_t n = tr.alpha.dim(0), N = 4;
    index_t count = 0;
    for (index_t i = 1; i < n; ++i) {
      const auto& src = res.trace[static_cast<std::size_t>(i - 1)];
      const auto& att = src.kind == om::SublayerKind::attention ? src : res.trace[static_cast<std::size_t>(i - 2)];
      for (index_t t = 0; t < N; ++t) ASSERT_EQ(tr.psi(i, 0, t), att.branch_psi(0, t)) << tr.name << " source " << i;
      ++count;
    }
    for (index_t t = 0; t < N; ++t) {
      ASSERT_EQ(tr.dpsi(0, 0, t), 0.0);
      if (count < 2) {
        for (index_t i = 0; i < n; ++i) ASSERT_EQ(tr.dpsi(i, 0, t), 0.0) << tr.name;
        continue;
      }
      double mean = 0;
      for (index_t i = 1; i < n; ++i) mean += tr.psi(i, 0, t);
      mean /= static_cast<double>(count);
      for (index_t i = 1; i < n; ++i) ASSERT_NEAR(tr.dpsi(i, 0, t), tr.psi(i, 0, t) - mean, 1e-15) << tr.name;
    }
  }
}

// HeadlessRule::no_evidence: MLP sources are centred like the initial state (Dpsi = 0, not in the mean).
TEST(ModelStructure, HeadlessNoEvidenceExcludesMlpSources) {
  om::ModelConfig c = tiny(Variant::oasis, om::RouterFamily::kimi_full, 3);
  oasis::CouplingOptions co;
  co.headless = oasis::HeadlessRule::no_evidence;
  c.coupling = co;
  const auto m = random_model<double>(c, 9);
  const auto res = m.forward(tokens(4, 9, c.vocab_size), 1, 4, {true});
  const auto& fin = res.trace.back();
  const index_t n = fin.alpha.dim(0);
  ASSERT_EQ(n, 7);
  for (index_t t = 0; t < 4; ++t) {
    double mean = 0;
    for (index_t i = 1; i < n; i += 2) mean += fin.psi(i, 0, t);
    mean /= 3.0;
    for (index_t i = 0; i < n; ++i) {
      if (i % 2 == 1) ASSERT_NEAR(fin.dpsi(i, 0, t), fin.psi(i, 0, t) - mean, 1e-15);
      else ASSERT_EQ(fin.dpsi(i, 0, t), 0.0) << "source " << i;
    }
  }
}

// The authors' router: candidates [embedding, earlier layer outputs, residual + out] (+ the MLP
// router also sees the attention candidate); authors_code centring over all candidates with
// psi_0 = 0; score clamp [-50, 50] applied even without coupling; recency i/(n-1).
TEST(ModelStructure, AuthorsRouterCandidatesCentringAndClamp) {
  om::ModelConfig c = tiny(Variant::oasis, om::RouterFamily::authors_code, 3);
  const auto m = random_model<double>(c, 10);
  const auto res = m.forward(tokens(3, 10, c.vocab_size), 1, 3, {true});
  ASSERT_EQ(res.trace.size(), 6u);
  for (std::size_t j = 0; j < 3; ++j) {
    const auto& a = res.trace[2 * j];
    const auto& f = res.trace[2 * j + 1];
    ASSERT_EQ(a.source_kinds.size(), j + 2);
    ASSERT_EQ(f.source_kinds.size(), j + 3);
    EXPECT_EQ(a.source_kinds.back(), SourceKind::attention);
    EXPECT_EQ(f.source_kinds.back(), SourceKind::headless);
    const index_t n = f.alpha.dim(0);
    for (index_t t = 0; t < 3; ++t) {
      // the MLP candidate inherits the attention psi of its block; the embedding has psi 0
      ASSERT_EQ(f.psi(n - 1, 0, t), a.branch_psi(0, t));
      ASSERT_EQ(f.psi(n - 2, 0, t), a.branch_psi(0, t));
      double mean = 0;
      for (index_t i = 0; i < n; ++i) mean += f.psi(i, 0, t);
      mean /= static_cast<double>(n);
      for (index_t i = 0; i < n; ++i) ASSERT_NEAR(f.dpsi(i, 0, t), f.psi(i, 0, t) - mean, 1e-15);
      ASSERT_NEAR(f.dpsi(0, 0, t), -mean, 1e-15);
    }
    // the routed state of the attention router is the input of the MLP sublayer
    EXPECT_TRUE(exactly_equal("mlp input", f.input, a.routed));
  }
  // Recency only (zero q/k projections): g_old_i = rec * i / (n - 1); with rec = 1000 the
  // AoS variant (no coupling) still clamps to 50.
  om::ModelConfig ac = c;
  ac.variant = Variant::aos;
  om::Model<double> ma(ac);
  for (const auto& spec : om::parameter_specs(ac)) {
    if (spec.name.find("_res.") == std::string::npos) ma.set_param(spec.name, m.param(spec.name));
    if (spec.name.find("recency_bias") != std::string::npos) ma.set_param(spec.name, Tensor<double>({1}, 1000.0));
  }
  const auto rr = ma.forward(tokens(3, 10, c.vocab_size), 1, 3, {true});
  for (const auto& tr : rr.trace) {
    const index_t n = tr.alpha.dim(0);
    for (index_t i = 0; i < n; ++i)
      for (index_t t = 0; t < 3; ++t)
        ASSERT_EQ(tr.g_old(i, 0, t), std::min(50.0, 1000.0 * (static_cast<double>(i) / static_cast<double>(n - 1))))
            << tr.name << " candidate " << i;
  }
}

// RoPE layouts are one rotation under a channel permutation: interleaved channel 2c <-> rotate_half
// c, 2c+1 <-> c + d_h/2. Same products per element, so equal bit for bit; position 0 is the identity.
TEST(ModelStructure, RopeLayoutsArePermutationsOfEachOther) {
  const index_t H = 2, dh = 6, Tn = 5;
  auto rng = oasis::test::make_rng(11);
  om::Rows<double> x{oasis::test::randn<double>({Tn, H * dh}, rng), {}};
  om::Rows<double> xp{Tensor<double>({Tn, H * dh}), {}};
  for (index_t r = 0; r < Tn; ++r)
    for (index_t h = 0; h < H; ++h)
      for (index_t c = 0; c < dh / 2; ++c) {
        xp.x(r, h * dh + 2 * c) = x.x(r, h * dh + c);
        xp.x(r, h * dh + 2 * c + 1) = x.x(r, h * dh + c + dh / 2);
      }
  const om::ErrorModel off{};
  const auto a = om::rope(x, H, dh, Tn, 3, om::RopeLayout::rotate_half, 10000.0, off);
  const auto b = om::rope(xp, H, dh, Tn, 3, om::RopeLayout::interleaved, 10000.0, off);
  for (index_t r = 0; r < Tn; ++r)
    for (index_t h = 0; h < H; ++h)
      for (index_t c = 0; c < dh / 2; ++c) {
        ASSERT_EQ(b.x(r, h * dh + 2 * c), a.x(r, h * dh + c));
        ASSERT_EQ(b.x(r, h * dh + 2 * c + 1), a.x(r, h * dh + c + dh / 2));
      }
  const auto z = om::rope(x, H, dh, Tn, 0, om::RopeLayout::rotate_half, 10000.0, off);
  for (index_t k = 0; k < H * dh; ++k) ASSERT_EQ(z.x(0, k), x.x(0, k));  // position 0: identity
  // pair (c, c + d_h/2) at position p rotates by p * theta^(-2c/d_h)
  const double ang = 4.0 * std::pow(10000.0, -2.0 / 6.0);
  EXPECT_NEAR(a.x(1, 1), x.x(1, 1) * std::cos(ang) - x.x(1, 4) * std::sin(ang), 1e-15);
}

// GQA: one kv head shared by two query heads equals two kv heads holding the same weights.
TEST(ModelStructure, GroupedQueryAttentionEqualsDuplicatedKvHeads) {
  om::ModelConfig g = tiny(Variant::oasis, om::RouterFamily::kimi_full, 2);
  g.n_kv_heads = 1;
  om::ModelConfig f = g;
  f.n_kv_heads = 2;
  const auto mg = random_model<double>(g, 12);
  om::Model<double> mf(f);
  const index_t dh = g.head_dim(), d = g.d_model;
  for (const auto& [name, t] : mf.parameters()) {
    if (name.find("k_proj") != std::string::npos || name.find("v_proj") != std::string::npos) {
      Tensor<double> w({2 * dh, d});
      const auto& src = mg.param(name);
      for (index_t r = 0; r < 2 * dh; ++r)
        for (index_t c = 0; c < d; ++c) w(r, c) = src(r % dh, c);
      mf.set_param(name, w);
    } else {
      mf.set_param(name, mg.param(name));
    }
  }
  const auto ids = tokens(6, 12, g.vocab_size);
  EXPECT_TRUE(exactly_equal("logits", mg.forward(ids, 1, 6).logits, mf.forward(ids, 1, 6).logits));
}

// Deterministic seeded initialisation: linear weights N(0, 0.02^2), zero pseudo-queries, gains 1,
// theta = -5. The sample std of n normal draws has relative sd ~ 1/sqrt(2n): n = 1408 draws of
// the q projections give 1.9 %; the check allows 5 sd (9.5 %).
TEST(ModelStructure, DeterministicInitialisation) {
  om::ModelConfig c = tiny(Variant::oasis, om::RouterFamily::kimi_full, 2);
  c.d_model = 32;
  c.n_heads = 4;
  c.vocab_size = 50;
  const auto a = om::Model<double>::initialized(c, 13), b = om::Model<double>::initialized(c, 13),
             z = om::Model<double>::initialized(c, 14);
  for (const auto& [name, t] : a.parameters()) EXPECT_TRUE(exactly_equal(name, t, b.param(name)));
  EXPECT_NE(a.param("layers.0.attn.q_proj.weight")[0], z.param("layers.0.attn.q_proj.weight")[0]);
  for (const auto& spec : om::parameter_specs(c)) {
    const auto& t = a.param(spec.name);
    if (spec.init == om::Init::zeros) for (index_t i = 0; i < t.size(); ++i) ASSERT_EQ(t[i], 0.0) << spec.name;
    if (spec.init == om::Init::ones) for (index_t i = 0; i < t.size(); ++i) ASSERT_EQ(t[i], 1.0) << spec.name;
    if (spec.init == om::Init::theta) ASSERT_EQ(t[0], -5.0) << spec.name;
  }
  EXPECT_EQ(a.param("layers.1.attn_res.query").size(), 32);
  double ss = 0;
  index_t n = 0;
  for (index_t blk = 0; blk < 2; ++blk) {
    const auto& t = a.param("layers." + std::to_string(blk) + ".attn.q_proj.weight");
    for (index_t i = 0; i < t.size(); ++i) { ss += t[i] * t[i]; ++n; }
  }
  const double sd = std::sqrt(ss / static_cast<double>(n));
  EXPECT_NEAR(sd, 0.02, 5.0 * 0.02 / std::sqrt(2.0 * static_cast<double>(n)));
  // initialisation draws in double and rounds once: the float model is the cast double model
  const auto f = om::Model<float>::initialized(c, 13);
  const auto fd = a.cast<float>();
  for (const auto& [name, t] : f.parameters()) EXPECT_TRUE(exactly_equal(name, t, fd.param(name)));
  // beta at init: softplus(-5)
  const auto res = a.forward(tokens(2, 13, c.vocab_size), 1, 2, {true});
  EXPECT_NEAR(res.trace[3].beta, 0.0067153484891179, 1e-15);
}
