// Model family: what the AttnRes transformer oracle computes and how (docs/spec.md §2–4):
// incremental decoding equals the full forward, bad input names the argument, a token
// normaliser override passes through, uneven blocks, the wiring and the schedule are what
// Model::run computes, storage rounding and float32 norms.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "oasis/io/dtype.hpp"
#include "oasis/model/decode.hpp"
#include "oasis/model/model.hpp"
#include "oasis/model/wiring.hpp"
#include "model_test_util.hpp"
#include "oasis_test.hpp"

namespace om = oasis::model;
using oasis::index_t;
using oasis::RowNorm;
using oasis::SourceKind;
using oasis::Tensor;
using oasis::Variant;
using oasis::test::exactly_equal;
using oasis::test::thrown_argument;

namespace {

using oasis::model_test::random_model;
using oasis::model_test::tiny;
using oasis::model_test::tokens;
using oasis::model_test::kRouters;

}  // namespace

// Incremental decoding (key/value caches) equals the full forward: the step computes the same
// operations in the same order for every position, so the logits agree bit for bit, in float and
// double, for every router family, one token at a time and in chunks, batch 2.
template <class T>
void check_decode(const om::ModelConfig& c, std::uint64_t seed) {
  const auto m = random_model<double>(c, seed).template cast<T>();
  const index_t B = 2, Tn = 6;
  const auto ids = tokens(B * Tn, seed, c.vocab_size);
  const auto full = m.forward(ids, B, Tn);
  for (const std::vector<index_t>& chunks : {std::vector<index_t>{1, 1, 1, 1, 1, 1}, std::vector<index_t>{2, 3, 1}}) {
    om::Decoder<T> dec(m, B);
    index_t t0 = 0;
    for (index_t len : chunks) {
      std::vector<index_t> step;
      for (index_t b = 0; b < B; ++b)
        for (index_t t = t0; t < t0 + len; ++t) step.push_back(ids[static_cast<std::size_t>(b * Tn + t)]);
      const auto r = dec.step(step, len);
      for (index_t b = 0; b < B; ++b)
        for (index_t t = 0; t < len; ++t)
          for (index_t v = 0; v < c.vocab_size; ++v)
            ASSERT_EQ(r.logits(b, t, v), full.logits(b, t0 + t, v))
                << om::to_string(c.router) << " " << oasis::to_string(c.variant) << " b " << b << " t " << t0 + t;
      t0 += len;
    }
    EXPECT_EQ(dec.length(), Tn);
    EXPECT_EQ(dec.state().kv[0].length(), Tn);
  }
}

TEST(ModelDecode, IncrementalEqualsFullForward) {
  for (om::RouterFamily r : kRouters)
    for (Variant v : {Variant::original, Variant::vanilla_attnres, Variant::oasis}) {
      om::ModelConfig c = tiny(v, r, 2);
      c.rope = r == om::RouterFamily::kimi_block ? om::RopeLayout::interleaved : om::RopeLayout::rotate_half;
      c.qk_norm = r == om::RouterFamily::kimi_full;
      c.n_kv_heads = 1;
      check_decode<double>(c, 20);
      check_decode<float>(c, 21);
      check_decode<long double>(c, 22);
    }
}

TEST(ModelErrors, BadInputNamesTheArgument) {
  const om::ModelConfig c = tiny(Variant::oasis, om::RouterFamily::kimi_full, 2);
  const auto m = om::Model<double>::initialized(c, 30);
  EXPECT_EQ(thrown_argument([&] { m.forward({1, 2, 99}, 1, 3); }), "ids");
  EXPECT_EQ(thrown_argument([&] { m.forward({1, 2}, 1, 3); }), "ids");
  EXPECT_EQ(thrown_argument([&] { m.forward_embeddings(Tensor<double>({1, 2, 5})); }), "x");
  EXPECT_EQ(thrown_argument([&] { m.forward_embeddings(Tensor<double>({1, 2, 8}, std::nan(""))); }), "x");
  EXPECT_EQ(thrown_argument([&] { m.param("layers.7.attn.q_proj.weight"); }), "layers.7.attn.q_proj.weight");
  om::Model<double> mm = m;
  EXPECT_EQ(thrown_argument([&] { mm.set_param("norm.weight", Tensor<double>({3})); }), "norm.weight");
  om::ModelConfig bad = c;
  bad.n_kv_heads = 3;
  EXPECT_EQ(thrown_argument([&] { bad.validate(); }), "n_kv_heads");
  bad = c;
  bad.router = om::RouterFamily::authors_code;
  bad.readout = om::Readout::final_attnres;
  EXPECT_EQ(thrown_argument([&] { bad.validate(); }), "readout");
  bad = c;
  bad.block_size = 0;
  EXPECT_EQ(thrown_argument([&] { bad.validate(); }), "block_size");
  bad = c;
  bad.block_sizes = {2, 2};  // kimi_full has no blocks
  EXPECT_EQ(thrown_argument([&] { bad.validate(); }), "block_sizes");
  bad.router = om::RouterFamily::kimi_block;
  bad.block_sizes = {2, 1};  // sums to 3, the model has 4 sublayers
  EXPECT_EQ(thrown_argument([&] { bad.validate(); }), "block_sizes");
  bad.block_sizes = {2, 0, 2};
  EXPECT_EQ(thrown_argument([&] { bad.validate(); }), "block_sizes");
  EXPECT_EQ(thrown_argument([&] { om::parse_router_family("kimi"); }), "router");
  EXPECT_EQ(thrown_argument([&] { om::parse_readout("mean"); }), "readout");
  EXPECT_EQ(thrown_argument([&] { om::parse_rope_layout("neox"); }), "rope");
  om::Decoder<double> dec(m, 2);
  EXPECT_EQ(thrown_argument([&] { dec.step_embeddings(Tensor<double>({1, 1, 8})); }), "x");
}

// Any token normaliser of the core passes through AttentionOptions::normalizer (here the
// baselines' sparsemax and clipped Softmax1): the trace records it and the logits change.
TEST(ModelStructure, TokenNormalizerOverridePassesThrough) {
  const om::ModelConfig base = tiny(Variant::aos, om::RouterFamily::kimi_full, 2);
  const auto m = random_model<double>(base, 40);
  const auto ids = tokens(5, 40, base.vocab_size);
  const auto ref = m.forward(ids, 1, 5).logits;
  for (RowNorm norm : {RowNorm::sparsemax, RowNorm::clipped_softmax1}) {
    om::ModelConfig c = base;
    c.token_normalizer = norm;
    om::Model<double> mo(c);
    for (const auto& [name, t] : m.parameters()) mo.set_param(name, t);
    const auto r = mo.forward(ids, 1, 5, {true});
    EXPECT_EQ(r.trace[0].token_normalizer, norm);
    EXPECT_FALSE(exactly_equal("logits", r.logits, ref)) << oasis::to_string(norm);
    for (index_t k = 0; k < r.logits.size(); ++k) ASSERT_TRUE(std::isfinite(r.logits[k]));
    // no derived forward error rule for these normalisers: the error model refuses, naming itself
    om::ForwardOptions fo;
    fo.error_u = 1e-8;
    try {
      mo.forward(ids, 1, 5, fo);
      ADD_FAILURE() << "expected an error";
    } catch (const oasis::invalid_argument& e) {
      EXPECT_EQ(e.argument(), "error_bound");
    }
  }
}

// Uneven blocks (ModelConfig::block_sizes): 6 sublayers in blocks of 2, 2, 1, 1 route over
// 1, 2, 2, 3, 3, 4 candidates and the readout over 5; uniform sizes equal block_size bit for bit.
TEST(ModelStructure, UnevenBlocksFollowBlockSizes) {
  om::ModelConfig c = tiny(Variant::oasis, om::RouterFamily::kimi_block, 3);
  c.block_sizes = {2, 2, 1, 1};
  const auto m = random_model<double>(c, 50);
  const auto r = m.forward(tokens(4, 50, c.vocab_size), 1, 4, {true});
  ASSERT_EQ(r.trace.size(), 7u);
  const std::vector<std::size_t> want = {1, 2, 2, 3, 3, 4, 5};
  for (std::size_t l = 0; l < 7; ++l) EXPECT_EQ(r.trace[l].source_kinds.size(), want[l]) << r.trace[l].name;
  // block 4 is layers.2.mlp alone: head-less, inheriting the psi of layers.2.attn
  EXPECT_EQ(r.trace[6].source_kinds.back(), SourceKind::headless);
  EXPECT_EQ(r.trace[6].source_names.back(), "block 4 (layers.2.mlp)");
  om::ModelConfig u = c;
  u.block_sizes = {2, 2, 2};
  om::ModelConfig s = c;
  s.block_sizes.clear();
  s.block_size = 2;
  const auto ids = tokens(5, 51, c.vocab_size);
  EXPECT_TRUE(exactly_equal("logits", random_model<double>(u, 52).forward(ids, 1, 5).logits,
                            random_model<double>(s, 52).forward(ids, 1, 5).logits));
}

// The wiring (oasis/model/wiring.hpp) is what Model::run computes: every router candidate, its
// kind and psi, every sublayer input and the readout state, recomputed from the traced outputs,
// inputs and router outputs in the model's own order of operations, equal the trace bit for bit.
TEST(ModelStructure, WiringIsWhatTheModelComputes) {
  std::vector<om::ModelConfig> configs;
  for (om::RouterFamily r : kRouters)
    for (Variant v : {Variant::original, Variant::aos, Variant::oasis}) configs.push_back(tiny(v, r, 3));
  om::ModelConfig uneven = tiny(Variant::oasis, om::RouterFamily::kimi_block, 3);
  uneven.block_sizes = {1, 3, 2};
  uneven.readout = om::Readout::sum;
  configs.push_back(uneven);
  om::ModelConfig last = tiny(Variant::oasis, om::RouterFamily::kimi_full, 2);
  last.readout = om::Readout::last;
  last.coupling = oasis::CouplingOptions::paper_v2();
  last.coupling->headless = oasis::HeadlessRule::no_evidence;
  configs.push_back(last);
  om::ModelConfig s3 = tiny(Variant::oasis, om::RouterFamily::kimi_block, 3);
  s3.block_size = 3;
  configs.push_back(s3);
  for (const om::ModelConfig& c : configs) {
    const std::string what = std::string(om::to_string(c.router)) + "/" + std::string(oasis::to_string(c.variant));
    const auto m = random_model<double>(c, 60);
    const index_t Tn = 4;
    const auto ids = tokens(Tn, 60, c.vocab_size);
    const auto r = m.forward(ids, 1, Tn, {true});
    const om::ModelWiring w = om::model_wiring(c);
    auto trace_of = [&](const std::string& name) -> const om::SublayerTrace<double>& {
      for (const auto& t : r.trace)
        if (t.name == name) return t;
      throw std::runtime_error("no trace " + name);
    };
    const index_t N = Tn, d = c.d_model;
    std::function<Tensor<double>(const om::WiredValue&)> value = [&](const om::WiredValue& v) -> Tensor<double> {
      using K = om::WiredValue::Kind;
      switch (v.kind) {
        case K::embedding: return m.embed(ids, 1, Tn).x;
        case K::output: return trace_of(w.sublayers[static_cast<std::size_t>(v.index)].name).output.reshaped({N, d});
        case K::input: return trace_of(w.sublayers[static_cast<std::size_t>(v.index)].name).input.reshaped({N, d});
        case K::routed: return trace_of(w.routers[static_cast<std::size_t>(v.index)].trace).routed.reshaped({N, d});
        case K::sum: {
          Tensor<double> acc = value(v.terms[0]);
          for (std::size_t k = 1; k < v.terms.size(); ++k) {
            const Tensor<double> b = value(v.terms[k]);
            for (index_t i = 0; i < acc.size(); ++i) acc[i] = acc[i] + b[i];
          }
          return acc;
        }
      }
      return {};
    };
    for (const om::WiredRouter& R : w.routers) {
      const om::SublayerTrace<double>& tr = trace_of(R.trace);
      ASSERT_TRUE(tr.has_route) << what << " " << R.trace;
      ASSERT_EQ(tr.source_kinds.size(), R.candidates.size()) << what << " " << R.trace;
      for (std::size_t i = 0; i < R.candidates.size(); ++i) {
        const om::WiredCandidate& k = R.candidates[i];
        EXPECT_EQ(tr.source_kinds[i], k.kind) << what << " " << R.trace << " candidate " << i;
        const Tensor<double> v = value(k.value);
        for (index_t j = 0; j < N * d; ++j)
          ASSERT_EQ(tr.sources.ptr(static_cast<index_t>(i))[j], v[j]) << what << " " << R.trace << " candidate " << k.name;
        if (!oasis::has_null_evidence(k.kind, c.coupling_or_default().headless)) continue;
        for (index_t t = 0; t < N; ++t) {
          double acc = 0;
          for (index_t a : k.psi_from) acc += trace_of(w.sublayers[static_cast<std::size_t>(a)].name).branch_psi[t];
          acc /= static_cast<double>(k.psi_from.size());
          EXPECT_EQ(tr.psi.ptr(static_cast<index_t>(i))[t], acc) << what << " " << R.trace << " psi of " << k.name;
        }
      }
    }
    for (const om::WiredSublayer& S : w.sublayers) {
      const Tensor<double> v = value(S.input);
      for (index_t j = 0; j < N * d; ++j) ASSERT_EQ(trace_of(S.name).input[j], v[j]) << what << " input of " << S.name;
    }
    const Tensor<double> st = value(w.state);
    for (index_t j = 0; j < N * d; ++j) ASSERT_EQ(r.state[j], st[j]) << what << " state";
  }
}

// The schedule Model::run executes (oasis/model/schedule.hpp) computes each wired value once: a
// block of k sublayers costs k - 1 adds (each partial sum extends the previous one), a readout sum
// over n sources n - 1, the authors' residual candidates one each, the original stream one per
// sublayer; every step runs once, in the model's order, and every slot but the state is freed
// once, after its last reader.
TEST(ModelStructure, ScheduleComputesEachWiredValueOnce) {
  using Kind = om::ScheduledStep::Kind;
  struct Want {
    om::ModelConfig cfg;
    int adds;
  };
  om::ModelConfig s2 = tiny(Variant::oasis, om::RouterFamily::kimi_block, 4);  // 8 sublayers, blocks of 2
  om::ModelConfig s2sum = s2;
  s2sum.readout = om::Readout::sum;
  om::ModelConfig uneven = tiny(Variant::oasis, om::RouterFamily::kimi_block, 3);
  uneven.block_sizes = {2, 2, 1, 1};
  uneven.readout = om::Readout::last;
  const std::vector<Want> cases = {{tiny(Variant::oasis, om::RouterFamily::kimi_full, 3), 0},
                                   {s2, 4},
                                   {s2sum, 4 + 4},
                                   {uneven, 2 + 1},  // two blocks of 2, then h_L + v_L
                                   {tiny(Variant::oasis, om::RouterFamily::authors_code, 3), 6},
                                   {tiny(Variant::original, om::RouterFamily::kimi_full, 3), 6}};
  for (const Want& c : cases) {
    const om::ForwardSchedule S = om::forward_schedule(c.cfg);
    const std::string what = std::string(om::to_string(c.cfg.router)) + "/" + std::string(oasis::to_string(c.cfg.variant));
    int adds = 0;
    std::vector<int> sublayers(S.wiring.sublayers.size(), 0), routers(S.wiring.routers.size(), 0),
        freed(static_cast<std::size_t>(S.slots), 0);
    std::vector<std::size_t> last_read(static_cast<std::size_t>(S.slots), 0);
    index_t next_sublayer = 0;
    for (std::size_t i = 0; i < S.steps.size(); ++i) {
      const om::ScheduledStep& st = S.steps[i];
      if (st.kind == Kind::add) ++adds;
      if (st.kind == Kind::sublayer) {
        EXPECT_EQ(st.index, next_sublayer++) << what;
        ++sublayers[static_cast<std::size_t>(st.index)];
      }
      if (st.kind == Kind::router) ++routers[static_cast<std::size_t>(st.index)];
      for (index_t k : st.in) {
        EXPECT_EQ(freed[static_cast<std::size_t>(k)], 0) << what << ": slot " << k << " read after it was freed";
        last_read[static_cast<std::size_t>(k)] = i;
      }
      for (index_t k : st.release) ++freed[static_cast<std::size_t>(k)];
    }
    EXPECT_EQ(adds, c.adds) << what;
    for (int n : sublayers) EXPECT_EQ(n, 1) << what;
    for (int n : routers) EXPECT_EQ(n, 1) << what;
    for (index_t k = 0; k < S.slots; ++k) EXPECT_EQ(freed[static_cast<std::size_t>(k)], k == S.state ? 0 : 1) << what << " slot " << k;
    for (std::size_t i = 0; i < S.steps.size(); ++i)
      for (index_t k : S.steps[i].release)
        if (k != S.steps[i].out) EXPECT_EQ(last_read[static_cast<std::size_t>(k)], i) << what << " slot " << k;
  }
}

// Storage rounding (ForwardOptions::store): every tensor handed from one step to the next is a
// bfloat16 value; off, the forward is the plain one bit for bit; no error bound is derived for it.
TEST(ModelStructure, StorageRoundingRoundsWhatIsHandedOn) {
  for (om::RouterFamily rf : kRouters) {
    const om::ModelConfig c = tiny(Variant::oasis, rf, 2);
    const auto m = random_model<float>(c, 70);
    const auto ids = tokens(4, 70, c.vocab_size);
    om::ForwardOptions fo;
    fo.trace = true;
    fo.store = [](double x) { return oasis::io::round_to_dtype(x, oasis::io::DType::bf16); };
    const auto r = m.forward(ids, 1, 4, fo);
    auto is_bf16 = [](const Tensor<float>& t, const std::string& name) {
      for (index_t i = 0; i < t.size(); ++i)
        if (oasis::io::round_to_dtype(t[i], oasis::io::DType::bf16) != static_cast<double>(t[i]))
          return ::testing::AssertionFailure() << name << "[" << i << "] = " << t[i] << " is not a bfloat16 value";
      return ::testing::AssertionSuccess();
    };
    EXPECT_TRUE(is_bf16(r.logits, "logits"));
    EXPECT_TRUE(is_bf16(r.state, "state"));
    for (const auto& tr : r.trace) {
      for (const auto* f : {&tr.sources, &tr.psi, &tr.routed, &tr.input, &tr.output, &tr.attn_q, &tr.attn_k, &tr.attn_v,
                            &tr.attn_heads, &tr.branch_psi, &tr.p_null, &tr.lse, &tr.mlp_hidden})
        EXPECT_TRUE(is_bf16(*f, tr.name)) << om::to_string(rf);
    }
    fo.store = nullptr;
    EXPECT_TRUE(exactly_equal("logits", m.forward(ids, 1, 4, fo).logits, m.forward(ids, 1, 4).logits));
    fo.store = [](double x) { return x; };
    fo.error_u = oasis::unit_roundoff<float>();
    try {
      m.forward(ids, 1, 4, fo);
      ADD_FAILURE() << "error bound with storage rounding accepted";
    } catch (const oasis::invalid_argument& e) {
      EXPECT_EQ(e.argument(), "error_u");
    }
  }
}

// Every RMSNorm in float32 (ModelConfig::norm_float32): a no-op for a float model; for a double
// model the normalised rows are float values (the logits move by float rounding, not more).
TEST(ModelStructure, Float32NormsAreEvaluatedInFloat) {
  om::ModelConfig c = tiny(Variant::oasis, om::RouterFamily::kimi_full, 2);
  c.qk_norm = true;
  om::ModelConfig f = c;
  f.norm_float32 = true;
  const auto md = random_model<double>(c, 80);
  om::Model<double> mf(f);
  for (const auto& [name, t] : md.parameters()) mf.set_param(name, t);
  const auto ids = tokens(5, 80, c.vocab_size);
  EXPECT_TRUE(exactly_equal("logits", mf.cast<float>().forward(ids, 1, 5).logits, md.cast<float>().forward(ids, 1, 5).logits));
  const auto a = md.forward(ids, 1, 5), b = mf.forward(ids, 1, 5);
  double diff = 0, scale = 0;
  for (index_t i = 0; i < a.logits.size(); ++i) {
    diff = std::max(diff, std::abs(a.logits[i] - b.logits[i]));
    scale = std::max(scale, std::abs(a.logits[i]));
  }
  EXPECT_GT(diff, 0.0);
  EXPECT_LT(diff, 1e-4 * scale);
  const oasis::KeyNormOptions o = f.norm_options();
  EXPECT_TRUE(o.compute_in_float32);
  EXPECT_EQ(o.eps, f.norm_eps);
}
