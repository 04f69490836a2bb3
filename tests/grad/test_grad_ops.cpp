// The gradient ops of `oasis-verify compare` (docs/verify.md, "Gradients"): the library's float
// and double backward pass in f32 and f64, a moved element fails exactly its tensor and is named,
// a wrong backward fails, and unusable calls are input errors naming the problem.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "oasis/grad/grad.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis_test.hpp"

using namespace oasis;

namespace {

io::TensorMap as_map(std::initializer_list<std::pair<const char*, Tensor<double>>> l, io::DType d = io::DType::f32) {
  io::TensorMap m;
  for (const auto& [name, t] : l)
    if (!t.empty()) m.emplace(name, io::StoredTensor{d, t});
  return m;
}

const verify::TensorReport* find(const verify::CompareReport& r, const std::string& name) {
  for (const auto& t : r.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::string arg_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const oasis::invalid_argument& e) {
    return e.argument() + ": " + e.what();
  }
  return "none";
}

struct AttnCase {
  Tensor<double> q, k, v, dout, dlse, nl, bias;
};

AttnCase attn_case() {
  auto rng = oasis::test::make_rng(1700);
  AttnCase c{oasis::test::randn<float>({2, 4, 5, 8}, rng).cast<double>(), oasis::test::randn<float>({2, 2, 6, 8}, rng).cast<double>(),
             oasis::test::randn<float>({2, 2, 6, 4}, rng).cast<double>(), oasis::test::randn<float>({2, 4, 5, 4}, rng).cast<double>(),
             oasis::test::randn<float>({2, 4, 5}, rng).cast<double>(), Tensor<double>({4}, {0.5, -1.0, 0.0, 2.0}),
             oasis::test::randn<float>({5, 6}, rng, 0.5).cast<double>()};
  return c;
}

const char* kAttnOptions = R"({"causal": true, "window": 4, "key_lengths": [6, 4]})";

template <class T>
AttentionGrads<T> attn_grads(const AttnCase& c) {
  AttentionOptions o;
  o.causal = true;
  o.window = 4;
  o.key_lengths = {6, 4};
  o.null_logits = c.nl.storage();
  o.bias = c.bias;
  return token_attention_backward(c.q.cast<T>(), c.k.cast<T>(), c.v.cast<T>(),
                                  AttentionCotangents<T>{c.dout.cast<T>(), c.dlse.cast<T>(), {}}, o);
}

}  // namespace

TEST(GradOps, AttentionBackwardPassesInF32AndF64AndNamesAMovedElement) {
  const AttnCase c = attn_case();
  const io::TensorMap in = as_map({{"q", c.q}, {"k", c.k}, {"v", c.v}, {"grad_out", c.dout}, {"grad_lse", c.dlse},
                                   {"null_logits", c.nl}, {"bias", c.bias}});
  const io::json::Value opt = io::json::parse(kAttnOptions);
  for (io::DType d : {io::DType::f32, io::DType::f64}) {
    auto out_of = [&](const auto& g) {
      return as_map({{"grad_q", g.q.template cast<double>()}, {"grad_k", g.k.template cast<double>()},
                     {"grad_v", g.v.template cast<double>()}, {"grad_null_logits", g.null_logits.template cast<double>()},
                     {"grad_bias", g.bias.template cast<double>()}},
                    d);
    };
    io::TensorMap out = d == io::DType::f32 ? out_of(attn_grads<float>(c)) : out_of(attn_grads<double>(c));
    const verify::CompareReport r = verify::check("attention_backward", in, out, opt);
    EXPECT_TRUE(r.passed) << verify::format_report(r);
    EXPECT_EQ(r.tensors.size(), 5u);
    // the largest element of grad_k moved by 1e-3 relative: only grad_k fails, with one violation, named
    io::StoredTensor& gk = out.at("grad_k");
    index_t at = 0;
    for (index_t i = 0; i < gk.values.size(); ++i)
      if (std::abs(gk.values[i]) > std::abs(gk.values[at])) at = i;
    gk.values[at] *= 1.001;
    const verify::CompareReport bad = verify::check("attention_backward", in, out, opt);
    EXPECT_FALSE(bad.passed);
    for (const auto& t : bad.tensors) EXPECT_EQ(t.passed, t.name != "grad_k") << t.name;
    ASSERT_NE(find(bad, "grad_k"), nullptr);
    EXPECT_EQ(find(bad, "grad_k")->violations, 1);
    ASSERT_FALSE(find(bad, "grad_k")->first_mismatches.empty());
    EXPECT_NE(find(bad, "grad_k")->first_mismatches[0].find("grad_k" + oasis::test::index_str(gk.values.shape(), at)),
              std::string::npos);
  }
}

// The fast oracle (double with its own error bound folded in) gives the mp50 oracle's verdicts:
// the same violations on correct gradients and on a moved element, in f32 and f64, and for f32
// outputs the same worst ratios to rounding; the report names the oracle.
TEST(GradOps, AttentionBackwardFastOracleAgreesWithMp50) {
  const AttnCase c = attn_case();
  const io::TensorMap in = as_map({{"q", c.q}, {"k", c.k}, {"v", c.v}, {"grad_out", c.dout}, {"grad_lse", c.dlse},
                                   {"null_logits", c.nl}, {"bias", c.bias}});
  const io::json::Value opt = io::json::parse(kAttnOptions);
  verify::CompareOptions fast, mp;
  mp.oracle = verify::Oracle::mp50;
  for (io::DType d : {io::DType::f32, io::DType::f64}) {
    auto out_of = [&](const auto& g) {
      return as_map({{"grad_q", g.q.template cast<double>()}, {"grad_k", g.k.template cast<double>()},
                     {"grad_v", g.v.template cast<double>()}, {"grad_null_logits", g.null_logits.template cast<double>()},
                     {"grad_bias", g.bias.template cast<double>()}},
                    d);
    };
    io::TensorMap out = d == io::DType::f32 ? out_of(attn_grads<float>(c)) : out_of(attn_grads<double>(c));
    for (int moved = 0; moved < 2; ++moved) {
      if (moved) out.at("grad_v").values[3] *= 1.001;
      const verify::CompareReport a = verify::check("attention_backward", in, out, opt, fast);
      const verify::CompareReport b = verify::check("attention_backward", in, out, opt, mp);
      EXPECT_EQ(a.oracle, "fast (double, its own error bound folded in)");
      EXPECT_EQ(b.oracle, "mp50");
      EXPECT_EQ(a.passed, !moved) << verify::format_report(a);
      EXPECT_EQ(a.passed, b.passed);
      ASSERT_EQ(a.tensors.size(), b.tensors.size());
      for (std::size_t i = 0; i < a.tensors.size(); ++i) {
        SCOPED_TRACE(a.tensors[i].name);
        EXPECT_EQ(a.tensors[i].name, b.tensors[i].name);
        EXPECT_EQ(a.tensors[i].violations, b.tensors[i].violations);
        EXPECT_EQ(a.tensors[i].violations_certain, b.tensors[i].violations_certain);
        // f32: the double reference's own error is ~2^-29 of the float error; f64 outputs of the
        // double backward are the fast oracle's reference itself (estimated error 0): verdicts only
        if (d == io::DType::f32)
          EXPECT_NEAR(a.tensors[i].worst_ratio, b.tensors[i].worst_ratio, 1e-6 * b.tensors[i].worst_ratio + 1e-12);
      }
    }
  }
}

TEST(GradOps, AttentionBackwardInputErrors) {
  const AttnCase c = attn_case();
  const AttentionGrads<float> g = attn_grads<float>(c);
  const io::TensorMap in = as_map({{"q", c.q}, {"k", c.k}, {"v", c.v}, {"grad_out", c.dout}});
  const io::TensorMap out = as_map({{"grad_q", g.q.cast<double>()}});
  // plain softmax has no null logit; no bias, no grad_bias; grad_out is required; unknown options
  EXPECT_NE(arg_of([&] {
              verify::check("attention_backward", in, as_map({{"grad_null_logits", g.null_logits.cast<double>()}}),
                            io::json::parse(R"({"normalizer": "softmax"})"));
            }).find("grad_null_logits given but the normaliser is softmax"),
            std::string::npos);
  EXPECT_NE(arg_of([&] {
              verify::check("attention_backward", in, as_map({{"grad_bias", g.bias.cast<double>()}}), io::json::Value{});
            }).find("grad_bias given but the inputs hold no bias"),
            std::string::npos);
  EXPECT_NE(arg_of([&] {
              verify::check("attention_backward", as_map({{"q", c.q}, {"k", c.k}, {"v", c.v}}), out, io::json::Value{});
            }).find("grad_out"),
            std::string::npos);
  EXPECT_NE(arg_of([&] { verify::check("attention_backward", in, out, io::json::parse(R"({"windw": 2})")); })
                .find("unknown option 'windw'"),
            std::string::npos);
  EXPECT_NE(arg_of([&] { verify::check("attention_backward", in, out, io::json::parse(R"({"window": -1})")); })
                .find("window"),
            std::string::npos);
  EXPECT_NE(arg_of([&] {
              verify::check("attention_backward", as_map({{"q", c.q}, {"k", c.k}, {"v", c.v}, {"grad_out", c.dlse}}), out,
                            io::json::Value{});
            }).find("dout"),
            std::string::npos);
}

TEST(GradOps, PseudoQueryBackwardPassesAndCatchesTheDroppedProjection) {
  auto rng = oasis::test::make_rng(1701);
  const Tensor<double> s = oasis::test::randn<float>({3, 4, 16}, rng).cast<double>(),
                       w = oasis::test::randn<float>({16}, rng).cast<double>(),
                       gain = oasis::test::uniform<float>({16}, rng, 0.5, 1.5).cast<double>(),
                       dg = oasis::test::randn<float>({3, 4}, rng).cast<double>();
  PseudoQueryGrads<float> g = pseudo_query_logits_backward(s.cast<float>(), w.cast<float>(), gain.cast<float>(), dg.cast<float>());
  const io::TensorMap in = as_map({{"sources", s}, {"w", w}, {"gain", gain}, {"grad_g", dg}});
  auto out_of = [](const PseudoQueryGrads<float>& x) {
    return as_map({{"grad_sources", x.sources.cast<double>()}, {"grad_w", x.w.cast<double>()}, {"grad_gain", x.gain.cast<double>()}});
  };
  const verify::CompareReport r = verify::check("pseudo_query_backward", in, out_of(g));
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  // the RMSNorm backward without its projection term: ds = inv gain w dg
  for (index_t i = 0; i < 3; ++i)
    for (index_t t = 0; t < 4; ++t) {
      double ss = 0;
      for (index_t c = 0; c < 16; ++c) ss += s(i, t, c) * s(i, t, c);
      const double inv = 1.0 / std::sqrt(ss / 16 + 1e-6);
      for (index_t c = 0; c < 16; ++c) g.sources(i, t, c) = static_cast<float>(inv * gain[c] * w[c] * dg(i, t));
    }
  const verify::CompareReport bad = verify::check("pseudo_query_backward", in, out_of(g));
  EXPECT_FALSE(bad.passed);
  EXPECT_FALSE(find(bad, "grad_sources")->passed);
  EXPECT_TRUE(find(bad, "grad_w")->passed);
  EXPECT_NE(arg_of([&] {
              verify::check("pseudo_query_backward", as_map({{"sources", s}, {"w", w}, {"grad_g", dg}}),
                            as_map({{"grad_gain", g.gain.cast<double>()}}));
            }).find("grad_gain given but the inputs hold no gain"),
            std::string::npos);
}

TEST(GradOps, PsiBackwardPassesAndCatchesASumOverHeads) {
  auto rng = oasis::test::make_rng(1702);
  const Tensor<double> pn = oasis::test::uniform<float>({2, 3, 5}, rng, 0.0, 1.0).cast<double>(),
                       dpsi = oasis::test::randn<float>({2, 5}, rng).cast<double>();
  const io::TensorMap in = as_map({{"p_null", pn}, {"grad_psi", dpsi}});
  const Tensor<double> good = null_statistic_backward(dpsi.cast<float>(), 3).cast<double>();
  const verify::CompareReport r = verify::check("psi_backward", in, as_map({{"grad_p_null", good}}));
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  const verify::CompareReport bad = verify::check("psi_backward", in, as_map({{"grad_p_null", null_statistic_backward(dpsi, 1).reshaped({2, 1, 5})}}));
  EXPECT_FALSE(bad.passed);  // wrong shape: psi "summed" over heads gives one gradient per token
  Tensor<double> summed({2, 3, 5});
  for (index_t b = 0; b < 2; ++b)
    for (index_t h = 0; h < 3; ++h)
      for (index_t t = 0; t < 5; ++t) summed(b, h, t) = dpsi(b, t);  // missing 1/H
  EXPECT_FALSE(verify::check("psi_backward", in, as_map({{"grad_p_null", summed}})).passed);
  // the authors' estimator: gradient -dpsi/H where the mass deficit is >= 0
  const Tensor<double> probs = oasis::test::uniform<float>({2, 3, 5, 4}, rng, 0.0, 0.4).cast<double>();
  const Tensor<double> gm = null_statistic_from_mass_backward(probs.cast<float>(), dpsi.cast<float>()).cast<double>();
  const verify::CompareReport rm = verify::check("psi_backward", as_map({{"probs", probs}, {"grad_psi", dpsi}}),
                                                 as_map({{"grad_probs", gm}}), io::json::parse(R"({"estimator": "mass"})"));
  EXPECT_TRUE(rm.passed) << verify::format_report(rm);
}

TEST(GradOps, DepthBackwardPassesInF64AndTheOpsAreListed) {
  auto rng = oasis::test::make_rng(1703);
  const Tensor<double> s = oasis::test::randn<float>({4, 3, 8}, rng).cast<double>(), g0 = oasis::test::randn<float>({4, 3}, rng).cast<double>(),
                       psi = oasis::test::uniform<float>({4, 3}, rng, 0.0, 1.0).cast<double>(),
                       dh = oasis::test::randn<float>({3, 8}, rng).cast<double>();
  DepthOptions o;
  o.coupling_options = CouplingOptions::authors_code();
  o.theta = 0.5;
  const std::vector<SourceKind> kinds = {SourceKind::initial, SourceKind::attention, SourceKind::headless, SourceKind::attention};
  const DepthGrads<double> g = attn_res_route_backward(s, g0, psi, kinds, o, DepthCotangents<double>{dh});
  const io::TensorMap in = as_map({{"sources", s}, {"g_old", g0}, {"psi", psi}, {"grad_h", dh}});
  const io::TensorMap out = as_map({{"grad_sources", g.sources}, {"grad_g_old", g.g_old}, {"grad_psi", g.psi},
                                    {"grad_beta", Tensor<double>({1}, {g.beta})}, {"grad_theta", Tensor<double>({1}, {g.theta})}},
                                   io::DType::f64);
  const verify::CompareReport r = verify::check(
      "depth_backward", in, out,
      io::json::parse(R"({"profile": "authors_code", "theta": 0.5, "kinds": ["initial", "attention", "headless", "attention"]})"));
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  EXPECT_EQ(r.tensors.size(), 5u);
  const std::string ops = verify::describe_ops();
  for (const char* op : {"attention_backward", "psi_backward", "depth_backward", "pseudo_query_backward"})
    EXPECT_NE(ops.find(op), std::string::npos) << op;
}

TEST(GradOps, AttentionBackwardInTheBthdLayout) {
  // [B, T, H, d] tensors with layout "bthd": the same verdict as the [B, H, T, d] call.
  const AttnCase c = attn_case();
  const AttentionGrads<float> g = attn_grads<float>(c);
  const io::TensorMap in = as_map({{"q", swap_head_time(c.q)}, {"k", swap_head_time(c.k)}, {"v", swap_head_time(c.v)},
                                   {"grad_out", swap_head_time(c.dout)}, {"grad_lse", c.dlse}, {"null_logits", c.nl},
                                   {"bias", c.bias}});
  const io::TensorMap out = as_map({{"grad_q", swap_head_time(g.q).cast<double>()}, {"grad_k", swap_head_time(g.k).cast<double>()},
                                    {"grad_v", swap_head_time(g.v).cast<double>()}});
  const io::json::Value opt = io::json::parse(R"({"causal": true, "window": 4, "key_lengths": [6, 4], "layout": "bthd"})");
  const verify::CompareReport r = verify::check("attention_backward", in, out, opt);
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  // the [B, H, T, d] gradients reinterpreted as [B, T, H, d] (reshaped, not transposed) fail
  const verify::CompareReport bad = verify::check(
      "attention_backward", in, as_map({{"grad_q", g.q.cast<double>().reshaped({2, 5, 4, 8})}}), opt);
  EXPECT_FALSE(bad.passed);
}

// The fast double oracle of pseudo_query_backward and psi_backward gives the mp50 oracle's verdicts
// and violation counts (f32 and f64 outputs; one element moved), deciding every element itself.
TEST(GradOps, PseudoQueryAndPsiBackwardFastOracleAgreesWithMp50) {
  auto rng = oasis::test::make_rng(1703);
  const Tensor<double> s = oasis::test::randn<float>({5, 32, 64}, rng).cast<double>(),
                       w = oasis::test::randn<float>({64}, rng).cast<double>(),
                       gain = oasis::test::uniform<float>({64}, rng, 0.5, 1.5).cast<double>(),
                       dg = oasis::test::randn<float>({5, 32}, rng).cast<double>(),
                       dpsi = oasis::test::randn<float>({2, 32}, rng).cast<double>();
  verify::CompareOptions fast, mp;
  mp.oracle = verify::Oracle::mp50;
  for (io::DType d : {io::DType::f32, io::DType::f64}) {
    const io::TensorMap in = as_map({{"sources", s}, {"w", w}, {"gain", gain}, {"grad_g", dg}});
    auto grads = [&](auto tag) {
      using T = decltype(tag);
      const PseudoQueryGrads<T> g = pseudo_query_logits_backward(s.cast<T>(), w.cast<T>(), gain.cast<T>(), dg.cast<T>());
      return as_map({{"grad_sources", g.sources.template cast<double>()}, {"grad_w", g.w.template cast<double>()},
                     {"grad_gain", g.gain.template cast<double>()}},
                    d);
    };
    const io::TensorMap pin = as_map({{"p_null", Tensor<double>({2, 4, 32})}, {"grad_psi", dpsi}});
    io::TensorMap out = d == io::DType::f32 ? grads(float{}) : grads(double{});
    io::TensorMap pout = as_map({{"grad_p_null", d == io::DType::f32 ? null_statistic_backward(dpsi.cast<float>(), 4).cast<double>()
                                                                        : null_statistic_backward(dpsi, 4)}},
                                d);
    for (int moved = 0; moved < 2; ++moved) {
      SCOPED_TRACE(std::string(io::to_string(d)) + (moved ? " moved" : ""));
      if (moved) out.at("grad_w").values[3] *= 1.1, pout.at("grad_p_null").values[7] *= 1.001;
      for (const auto& [op, i, o] : {std::tuple{"pseudo_query_backward", &in, &out}, std::tuple{"psi_backward", &pin, &pout}}) {
        const verify::CompareReport a = verify::check(op, *i, *o, io::json::parse("{}"), fast);
        const verify::CompareReport b = verify::check(op, *i, *o, io::json::parse("{}"), mp);
        EXPECT_EQ(a.oracle, "fast (double, its own error bound folded in)") << op;
        EXPECT_EQ(a.passed, !moved) << verify::format_report(a);
        EXPECT_EQ(a.passed, b.passed) << op;
        ASSERT_EQ(a.tensors.size(), b.tensors.size());
        for (std::size_t x = 0; x < a.tensors.size(); ++x) EXPECT_EQ(a.tensors[x].violations, b.tensors[x].violations) << op;
      }
    }
  }
}

// psi_backward's mass estimator (dp_j = -dpsi / H where 1 - sum_j p_j >= 0): the fast oracle gives
// mp50's verdicts and counts, with and without a row whose mass is exactly 1 (the clamp's kink:
// its gradient passes; the double reference's own bound there admits both sides, as the element's
// allowance does).
TEST(GradOps, PsiMassBackwardFastOracleAgreesWithMp50) {
  auto rng = oasis::test::make_rng(1705);
  const index_t B = 2, H = 3, T = 8, Tk = 4;
  Tensor<double> probs = oasis::test::uniform<float>({B, H, T, Tk}, rng, 0.0, 0.45).cast<double>();
  const Tensor<double> dpsi = oasis::test::randn<float>({B, T}, rng).cast<double>();
  verify::CompareOptions fast, mp;
  mp.oracle = verify::Oracle::mp50;
  const auto opts = io::json::parse("{\"estimator\": \"mass\"}");
  for (int kink = 0; kink < 2; ++kink) {
    if (kink)
      for (index_t j = 0; j < Tk; ++j) probs(1, 2, 5, j) = 0.25;  // mass exactly 1
    const Tensor<double> g = null_statistic_from_mass_backward(probs.cast<float>(), dpsi.cast<float>()).cast<double>();
    for (int moved = 0; moved < 2; ++moved) {
      SCOPED_TRACE(std::string(kink ? "kink" : "no kink") + (moved ? " moved" : ""));
      io::TensorMap out = as_map({{"grad_probs", g}});
      if (moved) out.at("grad_probs").values[9] *= 1.001;
      const io::TensorMap in = as_map({{"probs", probs}, {"grad_psi", dpsi}});
      const verify::CompareReport a = verify::check("psi_backward", in, out, opts, fast);
      const verify::CompareReport b = verify::check("psi_backward", in, out, opts, mp);
      if (!kink) EXPECT_EQ(a.oracle, "fast (double, its own error bound folded in)");
      EXPECT_EQ(a.passed, !moved) << verify::format_report(a);
      EXPECT_EQ(a.passed, b.passed);
      ASSERT_EQ(a.tensors.size(), b.tensors.size());
      EXPECT_EQ(a.tensors[0].violations, b.tensors[0].violations);
    }
  }
}

// pseudo_query_backward's probabilistic bound (the default policy for f32 gradients) at a real
// size (9 sources, 64 tokens, d = 1024): the library's float backward passes, with and without
// compute_in_float32 on double inputs; a norm backward whose projection term takes the mean over
// d - 1 fails it (the worst-case line, printed beside it, may not).
TEST(GradOps, PseudoQueryBackwardProbabilisticBound) {
  auto rng = oasis::test::make_rng(1704);
  const index_t n = 9, N = 64, d = 1024;
  const Tensor<double> s = oasis::test::randn<float>({n, N, d}, rng).cast<double>(),
                       w = oasis::test::randn<float>({d}, rng, 0.05).cast<double>(),
                       gain = oasis::test::uniform<float>({d}, rng, 0.5, 1.5).cast<double>(),
                       dg = oasis::test::randn<float>({n, N}, rng).cast<double>();
  const io::TensorMap in = as_map({{"sources", s}, {"w", w}, {"gain", gain}, {"grad_g", dg}});
  auto out_of = [](const PseudoQueryGrads<float>& x) {
    return as_map({{"grad_sources", x.sources.cast<double>()}, {"grad_w", x.w.cast<double>()}, {"grad_gain", x.gain.cast<double>()}});
  };
  PseudoQueryGrads<float> g = pseudo_query_logits_backward(s.cast<float>(), w.cast<float>(), gain.cast<float>(), dg.cast<float>());
  const verify::CompareReport ok = verify::check("pseudo_query_backward", in, out_of(g));
  EXPECT_TRUE(ok.passed) << verify::format_report(ok);
  double worst = 0;
  for (const auto& t : ok.tensors) worst = std::max(worst, t.worst_ratio);
  std::printf("pseudo_query_backward f32 correct: %s, worst err/bound %.3g\n", verify::verdict_word(ok).c_str(), worst);
  // the projection's mean over d - 1 (ds_c = inv (dxhat_c - xhat_c sum_c' dxhat xhat / (d - 1)))
  for (index_t i = 0; i < n; ++i)
    for (index_t t = 0; t < N; ++t) {
      double ss = 0, m = 0;
      for (index_t c = 0; c < d; ++c) ss += s(i, t, c) * s(i, t, c);
      const double inv = 1.0 / std::sqrt(ss / d + 1e-6);
      for (index_t c = 0; c < d; ++c) m += dg(i, t) * w[c] * gain[c] * s(i, t, c) * inv;
      m /= static_cast<double>(d - 1);
      for (index_t c = 0; c < d; ++c)
        g.sources(i, t, c) = static_cast<float>(inv * (dg(i, t) * w[c] * gain[c] - s(i, t, c) * inv * m));
    }
  const verify::CompareReport bad = verify::check("pseudo_query_backward", in, out_of(g));
  EXPECT_FALSE(find(bad, "grad_sources")->passed) << verify::format_report(bad);
  verify::CompareOptions wc;
  wc.policy = verify::Policy::worst_case;
  std::printf("pseudo_query_backward mean over d - 1: default %s (err/bound %.3g), worst_case %s\n",
              verify::verdict_word(bad).c_str(), find(bad, "grad_sources")->worst_ratio,
              verify::verdict_word(verify::check("pseudo_query_backward", in, out_of(g), io::json::parse("{}"), wc)).c_str());
}
