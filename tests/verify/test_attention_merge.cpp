// tests/verify/test_attention_merge.cpp — op attention_merge (docs/verify.md, "The split-KV merge";
// bounds: docs/tolerances.md, "The split-KV merge"). Form A: the zoo of correct float merges of
// tests/verify/merge_zoo.hpp (log space, base 2, online, the null seeded into split 0, uneven splits,
// an empty split with a NaN out, 16-bit partials, fully masked rows) passes with sinks N(0, 1), +100,
// +1e4 and -inf, and each mistake fails where it changes the result (a linear-space merge and a
// weight against the partials' maximum only overflow at large sinks; the null counted per split,
// twice or not at all; an empty split's NaN read; weights without the maximum); the fast oracle
// gives mp50's verdicts; every inconsistent call is a named error. Form B: a float split-KV kernel
// passes; one wrong split fails out_parts with its index, and out as far as the merge used it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "merge_zoo.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"

namespace verify = oasis::verify;
using namespace merge_zoo;

namespace {

verify::CompareReport check(const io::TensorMap& in, const io::TensorMap& out, const std::string& options = "{}",
                            verify::Oracle oracle = verify::Oracle::fast) {
  verify::CompareOptions co;
  co.oracle = oracle;
  return verify::check("attention_merge", in, out, io::json::parse(options), co);
}

double worst(const verify::CompareReport& r) {
  double w = 0;
  for (const auto& t : r.tensors) w = std::isnan(t.worst_ratio) || std::isnan(w) ? NAN : std::max(w, t.worst_ratio);
  return w;
}

std::string failing(const verify::CompareReport& r) {
  std::string s;
  for (const auto& t : r.tensors)
    if (!t.passed) s += (s.empty() ? "" : ", ") + t.name + " (" + verify::verdict_word(t) + ")";
  return s;
}

const verify::TensorReport& find(const verify::CompareReport& r, const std::string& name) {
  for (const auto& t : r.tensors)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

/// The sink regimes: per head N(0, 1), +100, +1e4, -inf.
struct Sinks {
  std::string name;
  std::vector<double> s;
};
std::vector<Sinks> sink_regimes() {
  return {{"randn", {0.31, -1.2, 1.7, -0.4}}, {"+100", {100, 100, 100, 100}}, {"+1e4", {1e4, 1e4, 1e4, 1e4}},
          {"-inf", {-kInf, -kInf, -kInf, -kInf}}};
}

/// One member of the correct zoo: the data it reads and how it merges.
struct Member {
  std::string name;
  Kind kind;
  std::string mode = "merge";
  bool base2 = false, one_empty = false;
  io::DType od = io::DType::f32;  ///< out_parts and the outputs
  io::DType ld = io::DType::f32;  ///< lse_parts
};

std::string options_of(const Member& m) {
  return std::string("{\"sink_in\": \"") + m.mode + "\"" + (m.base2 ? ", \"parts_lse_base\": \"2\"" : "") + "}";
}

}  // namespace

TEST(AttentionMerge, CorrectMergesPassEverySinkRegime) {
  const std::vector<Member> zoo = {
      {"log_space", Kind::log_space}, {"exp2", Kind::exp2}, {"online", Kind::online}, {"cascade", Kind::cascade},
      {"split0_cascade", Kind::cascade, "split0"},
      {"base2_parts_log_space", Kind::log_space, "merge", true}, {"base2_parts_exp2", Kind::exp2, "merge", true},
      {"split0_log_space", Kind::log_space, "split0"}, {"split0_online", Kind::online, "split0"},
      {"split0_exp2_base2", Kind::exp2, "split0", true}, {"empty_split_nan", Kind::log_space, "merge", false, true},
      {"empty_split_online", Kind::online, "merge", false, true}, {"bf16_parts", Kind::log_space, "merge", false, false, io::DType::bf16},
      {"f16_parts_online", Kind::online, "merge", false, false, io::DType::f16},
      {"bf16_parts_and_lse", Kind::exp2, "merge", false, true, io::DType::bf16, io::DType::bf16}};
  const std::pair<index_t, index_t> shapes[] = {{1, 4}, {16, 16}};  // (Tq, S)
  double worst_all = 0;
  for (const Member& m : zoo) {
    double w_member = 0;
    std::map<std::string, double> per_tensor;
    for (const Sinks& sk : sink_regimes())
      for (auto [Tq, S] : shapes) {
        const Parts p = make_parts(7000 + static_cast<std::uint64_t>(Tq * S), S, Tq, sk.s, m.one_empty);
        const io::TensorMap in = inputs(p, m.od, m.ld, m.mode == "split0", m.base2);
        const verify::CompareReport r = check(in, merge(m.kind, in, m.mode, m.base2, m.od), options_of(m));
        EXPECT_TRUE(r.passed) << m.name << " sinks " << sk.name << " Tq=" << Tq << " S=" << S << ": " << failing(r) << "\n"
                              << verify::format_report(r);
        w_member = std::max(w_member, worst(r));
        for (const auto& t : r.tensors) per_tensor[t.name] = std::max(per_tensor[t.name], t.worst_ratio);
      }
    std::printf("correct %-22s worst err/bound %.3g (out %.3g, lse %.3g, p_null %.3g)\n", m.name.c_str(), w_member,
                per_tensor["out"], per_tensor["lse"], per_tensor["p_null"]);
    worst_all = std::max(worst_all, w_member);
  }
  EXPECT_LT(worst_all, 1.0);
}

TEST(AttentionMerge, MistakesFailWhereTheyChangeTheResult) {
  struct Expect {
    Kind kind;
    std::vector<std::string> fail_at;  ///< the sink regimes where it must fail
    bool one_empty = false;
  };
  // The null counted S times, twice or not at all changes nothing without a null (-inf); a linear
  // merge and the sink against the partials' maximum only overflow at large sinks.
  const std::vector<Expect> zoo = {{Kind::linear, {"+100", "+1e4"}},
                                   {Kind::sink_every_split, {"randn", "+100", "+1e4"}},
                                   {Kind::sink_twice, {"randn", "+100", "+1e4"}},
                                   {Kind::sink_omitted, {"randn", "+100", "+1e4"}},
                                   {Kind::nan_read, {"randn", "+100", "+1e4", "-inf"}, true},
                                   {Kind::no_max, {"+100", "+1e4"}},
                                   {Kind::sink_partial_max, {"+100", "+1e4"}}};
  for (const Expect& e : zoo)
    for (const Sinks& sk : sink_regimes()) {
      const bool must = std::count(e.fail_at.begin(), e.fail_at.end(), sk.name) > 0;
      for (auto [Tq, S] : {std::pair<index_t, index_t>{1, 4}, {8, 16}}) {
        const Parts p = make_parts(8100 + static_cast<std::uint64_t>(S), S, Tq, sk.s, e.one_empty);
        const io::TensorMap in = inputs(p);
        const verify::CompareReport r = check(in, merge(e.kind, in));
        std::printf("mistake %-17s sinks %-5s Tq=%-2lld S=%-2lld %-12s err/bound %-9.3g fails: %s\n", name(e.kind),
                    sk.name.c_str(), static_cast<long long>(Tq), static_cast<long long>(S), verify::verdict_word(r).c_str(),
                    worst(r), failing(r).c_str());
        if (must) {
          EXPECT_FALSE(r.passed) << name(e.kind) << " with sinks " << sk.name;
        }
      }
    }
  // 16-bit partials and outputs (lse_parts in float32, the weights too): the null's mistakes are a
  // few bf16 ulps of out (p_null about 0.01) and still fail; with lse_parts in bf16 as well, every
  // intermediate may be bf16 and only the null counted S times is beyond that noise
  for (Kind k : {Kind::sink_every_split, Kind::sink_twice, Kind::sink_omitted}) {
    const Parts p = make_parts(8150, 4, 8, sink_regimes()[0].s);
    const io::TensorMap in = inputs(p, io::DType::bf16);
    const verify::CompareReport r = check(in, merge(k, in, "merge", false, io::DType::bf16));
    std::printf("mistake %-17s bf16 out_parts and outputs: %s (worst err/bound %.3g)\n", name(k), failing(r).c_str(), worst(r));
    EXPECT_FALSE(r.passed) << name(k) << " in bf16";
  }
  // weights e^{lse_i} e^{-M}: the partials' own LSEs near 95 overflow in float whatever the sink
  const Parts big = make_parts(8200, 4, 4, sink_regimes()[0].s, false, false, 95.0);
  const io::TensorMap in = inputs(big);
  EXPECT_FALSE(check(in, merge(Kind::no_max, in)).passed);
  EXPECT_TRUE(check(in, merge(Kind::log_space, in)).passed);
}

TEST(AttentionMerge, FullyMaskedRowsAreTheDefinedCase) {
  // every third row without a key: out 0, LSE the null logit (or -inf without one), p_null 1 (or 0)
  const Parts p = make_parts(8300, 4, 6, {-kInf, 0.5, -kInf, 2.0}, false, true);
  const io::TensorMap in = inputs(p);
  for (Kind k : {Kind::log_space, Kind::online, Kind::exp2}) {
    const verify::CompareReport r = check(in, merge(k, in));
    EXPECT_TRUE(r.passed) << name(k) << ": " << failing(r);
  }
  io::TensorMap out = merge(Kind::log_space, in);
  out["lse"].values[0] = std::nan("");  // row (0, 0, 0): every split empty, no null
  out["p_null"].values[6] = 0.0f;       // row (0, 1, 0): every split empty, p_null 1
  const verify::CompareReport r = check(in, out);
  EXPECT_EQ(failing(r), "lse (FAIL-certain), p_null (FAIL-certain)");
}

TEST(AttentionMerge, WeightsRoundedTo16BitsNeedPolicyP16) {
  // bf16 partials merged with the weights rounded to bf16 before the products, out stored in bf16:
  // outside the default bound of a float32 merge stored once, within p16's
  const Parts p = make_parts(8350, 4, 8, sink_regimes()[0].s);
  const io::TensorMap in = inputs(p, io::DType::bf16);
  const io::TensorMap out = merge(Kind::weights16, in, "merge", false, io::DType::bf16);
  const verify::CompareReport def = check(in, out);
  EXPECT_EQ(failing(def), "out (FAIL)") << verify::format_report(def);
  verify::CompareOptions co;
  co.policy = verify::Policy::p16;
  const verify::CompareReport r16 = verify::check("attention_merge", in, out, io::json::parse("{}"), co);
  EXPECT_TRUE(r16.passed) << verify::format_report(r16);
  std::printf("weights rounded to bf16: default err/bound %.3g, p16 %.3g\n", worst(def), worst(r16));
}

TEST(AttentionMerge, FastOracleGivesMp50sVerdicts) {
  struct Case {
    std::vector<Kind> kinds;
    std::string mode, options;
    bool base2;
    io::DType od;
  };
  const std::vector<Case> cases = {
      {{Kind::log_space, Kind::online, Kind::sink_twice, Kind::linear}, "merge", "{}", false, io::DType::bf16},
      {{Kind::log_space, Kind::cascade, Kind::sink_omitted}, "split0", R"({"sink_in": "split0"})", false, io::DType::f32},
      {{Kind::exp2, Kind::no_max}, "merge", R"({"parts_lse_base": "2"})", true, io::DType::f32},
      {{Kind::log_space}, "merge", R"({"lse_null": "excluded", "lse_base": "2"})", false, io::DType::f32}};
  for (const Case& c : cases) {
    const Parts p = make_parts(8400, 6, 4, {0.3, 100, -kInf, -2.0}, c.mode == "merge");
    const io::TensorMap in = inputs(p, c.od, io::DType::f32, c.mode == "split0", c.base2);
    for (Kind k : c.kinds) {
      const io::TensorMap out = merge(k, in, c.mode, c.base2, c.od);
      const verify::CompareReport f = check(in, out, c.options), m = check(in, out, c.options, verify::Oracle::mp50);
      ASSERT_EQ(f.tensors.size(), m.tensors.size());
      for (std::size_t i = 0; i < f.tensors.size(); ++i) {
        const std::string what = std::string(name(k)) + " " + c.options + " " + f.tensors[i].name;
        EXPECT_EQ(verify::verdict_word(f.tensors[i]), verify::verdict_word(m.tensors[i])) << what;
        EXPECT_EQ(f.tensors[i].violations, m.tensors[i].violations) << what;
        if (std::isfinite(m.tensors[i].worst_ratio)) {
          EXPECT_NEAR(f.tensors[i].worst_ratio, m.tensors[i].worst_ratio, 1e-6 * m.tensors[i].worst_ratio + 1e-12) << what;
        }
      }
    }
  }
}

TEST(AttentionMerge, Float64OutputsAndTheMp50Fallback) {
  // a merge in long double stored as f64 passes
  const Parts p = make_parts(8450, 4, 2, {0.3, 100, -kInf, -2.0}, true);
  const io::TensorMap in = inputs(p);
  const index_t R = p.rows();
  Tensor<double> out({p.B, p.H, p.Tq, p.dv}), lse({p.B, p.H, p.Tq}), pn({p.B, p.H, p.Tq});
  for (index_t r = 0; r < R; ++r) {
    const long double s = in.at("null_logits").values[(r / p.Tq) % p.H];
    long double M = s, sum = 0;
    for (index_t i = 0; i < p.S; ++i) M = std::max(M, static_cast<long double>(in.at("lse_parts").values[i * R + r]));
    std::vector<long double> w(static_cast<std::size_t>(p.S), 0.0L);
    for (index_t i = 0; i < p.S; ++i) {
      const long double z = in.at("lse_parts").values[i * R + r];
      if (!std::isinf(static_cast<double>(z))) sum += w[static_cast<std::size_t>(i)] = std::exp(z - M);
    }
    const long double w0 = std::isinf(static_cast<double>(s)) ? 0.0L : std::exp(s - M);
    sum += w0;
    lse[r] = static_cast<double>(M + std::log(sum));
    pn[r] = static_cast<double>(w0 / sum);
    for (index_t x = 0; x < p.dv; ++x) {
      long double a = 0;
      for (index_t i = 0; i < p.S; ++i)
        if (w[static_cast<std::size_t>(i)] > 0) a += w[static_cast<std::size_t>(i)] / sum * in.at("out_parts").values[(i * R + r) * p.dv + x];
      out[r * p.dv + x] = static_cast<double>(a);
    }
  }
  io::TensorMap res = {{"out", {io::DType::f64, out}}, {"lse", {io::DType::f64, lse}}, {"p_null", {io::DType::f64, pn}}};
  const verify::CompareReport r = check(in, res);
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  // lse[0] moved onto its bound (bisected with the mp50 oracle): the double oracle cannot decide it
  // and recomputes the op in mp50, whose verdict it reports
  const double l0 = lse[0];
  double lo = 0, hi = 1e-12;
  for (int it = 0; it < 80; ++it) {
    const double mid = 0.5 * (lo + hi);
    res["lse"].values[0] = l0 + mid;
    (check(in, res, "{}", verify::Oracle::mp50).passed ? lo : hi) = mid;
  }
  res["lse"].values[0] = l0 + lo;
  const verify::CompareReport edge = check(in, res);
  EXPECT_TRUE(edge.passed) << verify::format_report(edge);
  EXPECT_NE(edge.oracle.find("mp50"), std::string::npos) << edge.oracle;
  res["lse"].values[0] = l0 + hi;
  const verify::CompareReport past = check(in, res);
  EXPECT_EQ(failing(past).rfind("lse (FAIL", 0), 0u) << verify::format_report(past);
  EXPECT_NE(past.oracle.find("mp50"), std::string::npos) << past.oracle;
}

TEST(AttentionMerge, OutputLseConventions) {
  // the keys-only LSE log sum_i e^{lse_i} (FlashInfer's sink-exclusive LSE) and the base-2 LSE
  const Parts p = make_parts(8500, 4, 4, {0.3, 1.5, -1.0, 4.0});
  const io::TensorMap in = inputs(p);
  io::TensorMap keys = merge(Kind::log_space, in), base2 = keys;
  const index_t R = p.rows();
  for (index_t r = 0; r < R; ++r) {
    float M = -INFINITY, sum = 0;
    for (index_t i = 0; i < p.S; ++i) M = std::max(M, static_cast<float>(in.at("lse_parts").values[i * R + r]));
    for (index_t i = 0; i < p.S; ++i) sum += std::exp(static_cast<float>(in.at("lse_parts").values[i * R + r]) - M);
    keys["lse"].values[r] = M + std::log(sum);
    base2["lse"].values[r] = static_cast<float>(base2["lse"].values[r]) * 1.44269504f;
  }
  EXPECT_TRUE(check(in, keys, R"({"lse_null": "excluded"})").passed);
  EXPECT_TRUE(find(check(in, keys), "lse").certain_failure);
  EXPECT_TRUE(check(in, base2, R"({"lse_base": "2"})").passed);
  EXPECT_TRUE(find(check(in, base2), "lse").certain_failure);
}

TEST(AttentionMerge, InconsistentCallsAreNamedErrors) {
  const Parts p = make_parts(8600, 4, 2, {0.3, 1.5, -1.0, 4.0}, true);
  const io::TensorMap good = inputs(p);
  const io::TensorMap out = merge(Kind::log_space, good);
  auto expect_error = [&](io::TensorMap in, const std::string& options, const std::string& name) {
    try {
      check(in, out, options);
      ADD_FAILURE() << "no error for " << name << " (" << options << ")";
    } catch (const oasis::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  auto with = [&](const std::string& t, oasis::Shape sh, double fill = 0.0) {
    io::TensorMap in = good;
    in[t] = io::StoredTensor{io::DType::f32, Tensor<double>(std::move(sh), fill)};
    return in;
  };
  expect_error(with("lse_parts", {3, 2, 4, 2}), "{}", "lse_parts");         // S mismatch
  expect_error(with("lse_parts", {4, 2, 4}), "{}", "lse_parts");            // rank
  expect_error(with("lse_parts", {4, 2, 3, 2}), "{}", "lse_parts");         // H mismatch
  expect_error(with("out_parts", {4, 2, 4, 2}), "{}", "out_parts");         // rank
  expect_error(with("out_parts", {0, 2, 4, 2, 64}), "{}", "out_parts");     // no split
  expect_error(with("null_logits", {3}), "{}", "null_logits");              // not [H]
  io::TensorMap bad = good;
  bad["lse_parts"].values[5] = std::nan("");
  expect_error(bad, "{}", "lse_parts");
  bad = good;
  bad["lse_parts"].values[5] = kInf;
  expect_error(bad, "{}", "lse_parts");
  bad = good;
  bad["out_parts"].values[64 * 9 + 3] = std::nan("");  // split 0, row 1: not empty
  expect_error(bad, "{}", "out_parts");
  bad = good;
  bad.erase("lse_parts");
  expect_error(bad, "{}", "lse_parts");
  expect_error(good, R"({"sink_in": "twice"})", "sink_in");
  expect_error(good, R"({"parts_lse_base": "10"})", "parts_lse_base");
  expect_error(good, R"({"sink_in": "none"})", "null_logits");  // a null with no null category
  expect_error(good, R"({"sink_in": "split0", "lse_null": "excluded"})", "lse_null");
  expect_error(good, R"({"sink_in": "split0"})", "lse_parts");  // split 0 empty in row 0 but holding the null
  expect_error(good, R"({"split_size": 4})", "split_size");     // a form B option
  expect_error(good, R"({"causal": true})", "causal");
  io::TensorMap both = good;
  both["q"] = io::StoredTensor{io::DType::f32, Tensor<double>({2, 4, 2, 8})};
  expect_error(both, "{}", "inputs");
  expect_error({{"null_logits", good.at("null_logits")}}, "{}", "inputs");
  EXPECT_NE(verify::describe_ops().find("attention_merge"), std::string::npos);
}

namespace {

/// Form B: B = 2, H = 4, H_kv = 2, Tq = 4 over Tk = 50 keys (decoding, causal), key lengths 50 and
/// 20 (batch 1's splits 2 and 3 empty), null logits per head.
struct Att {
  Tensor<float> q, k, v;
  oasis::AttentionOptions opt;
};

Att make_att() {
  std::mt19937_64 rng(8700);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Att a{Tensor<float>({2, 4, 4, 16}), Tensor<float>({2, 2, 50, 16}), Tensor<float>({2, 2, 50, 16}), {}};
  for (auto* t : {&a.q, &a.k, &a.v})
    for (float& x : t->storage()) x = nd(rng);
  a.opt.causal = true;
  a.opt.key_lengths = {50, 20};
  a.opt.null_logits = {0.4, -1.1, 2.5, 100.0};
  return a;
}

io::StoredTensor f32(const Tensor<float>& t) { return {io::DType::f32, t.cast<double>()}; }

/// A float split-KV kernel with splits of `ss` keys: each split's plain-softmax partial (its LSE over
/// its keys; an empty split -inf with a NaN out), merged in log space with the null added once
/// (sink_in split0: split 0's running state starts from the null's (s, 1) and the merge adds none).
/// bug 1: split `bad` also takes the first key of the next split; bug 2: split `bad`'s stored out
/// scaled by 1 + 1e-3 after the merge used it.
io::TensorMap split_kv(const Att& a, index_t ss, bool split0 = false, int bug = 0, index_t bad = 1) {
  const oasis::AttentionShape s = oasis::check_attention_args(a.q, a.k, a.v, a.opt);
  const index_t S = (s.Tk + ss - 1) / ss, R = s.B * s.H * s.Tq, dv = s.d_v;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.d_h));
  Tensor<double> lp({S, s.B, s.H, s.Tq}), op({S, s.B, s.H, s.Tq, dv});
  for (index_t b = 0; b < s.B; ++b)
    for (index_t h = 0; h < s.H; ++h)
      for (index_t t = 0; t < s.Tq; ++t) {
        const oasis::KeyRange kr = oasis::visible_range(s, a.opt, b, t);
        const index_t r = (b * s.H + h) * s.Tq + t;
        for (index_t i = 0; i < S; ++i) {
          const index_t j0 = std::max(kr.begin, i * ss);
          const index_t j1 = std::min(kr.end, (i + 1) * ss + (bug == 1 && i == bad ? 1 : 0));
          const bool sink = split0 && i == 0;
          float m = sink ? static_cast<float>(a.opt.null_logits[static_cast<std::size_t>(h)]) : -INFINITY;
          float l = sink ? 1.0f : 0.0f;
          std::vector<float> o(static_cast<std::size_t>(dv), 0.0f);
          for (index_t j = j0; j < j1; ++j) {
            float z = 0;
            for (index_t c = 0; c < s.d_h; ++c) z += a.q(b, h, t, c) * a.k(b, h / 2, j, c);
            z *= scale;
            const float mn = std::max(m, z), cr = std::exp(m - mn), e = std::exp(z - mn);
            l = l * cr + e;
            for (index_t c = 0; c < dv; ++c) o[static_cast<std::size_t>(c)] = o[static_cast<std::size_t>(c)] * cr + e * a.v(b, h / 2, j, c);
            m = mn;
          }
          lp[i * R + r] = l > 0 ? m + std::log(l) : -INFINITY;
          for (index_t c = 0; c < dv; ++c) op[(i * R + r) * dv + c] = l > 0 ? o[static_cast<std::size_t>(c)] / l : NAN;
        }
      }
  io::TensorMap parts = {{"out_parts", {io::DType::f32, op}}, {"lse_parts", {io::DType::f32, lp}},
                         {"null_logits", {io::DType::f32, Tensor<double>({s.H}, a.opt.null_logits)}}};
  io::TensorMap out = merge(Kind::log_space, parts, split0 ? "split0" : "merge");
  if (bug == 2)
    for (index_t k = bad * R * dv; k < (bad + 1) * R * dv; ++k) op[k] = static_cast<float>(op[k] * 1.001);
  out["out_parts"] = {io::DType::f32, op};
  out["lse_parts"] = {io::DType::f32, lp};
  return out;
}

io::TensorMap attention_inputs(const Att& a) {
  return {{"q", f32(a.q)}, {"k", f32(a.k)}, {"v", f32(a.v)},
          {"null_logits", {io::DType::f32, Tensor<double>({4}, a.opt.null_logits)}}};
}

const char* kSplitOptions = R"({"causal": true, "key_lengths": [50, 20], "split_size": 16})";

/// [.., B, H, T, d] as [.., B, T, H, d] (the bthd layout): the two axes before the last swapped.
io::StoredTensor swap_ht(const io::StoredTensor& t) {
  oasis::Shape sh = t.values.shape();
  const std::size_t a = sh.size() - 3;
  const index_t H = sh[a], T = sh[a + 1], d = sh[a + 2], lead = t.values.size() / (H * T * d);
  std::swap(sh[a], sh[a + 1]);
  Tensor<double> r(sh);
  for (index_t l = 0; l < lead; ++l)
    for (index_t h = 0; h < H; ++h)
      for (index_t x = 0; x < T; ++x)
        for (index_t c = 0; c < d; ++c) r[((l * T + x) * H + h) * d + c] = t.values[((l * H + h) * T + x) * d + c];
  return {t.dtype, r};
}

}  // namespace

TEST(AttentionMergeSplitKV, CorrectKernelPassesSplitBySplitAndMerged) {
  const Att a = make_att();
  const io::TensorMap in = attention_inputs(a);
  const verify::CompareReport r = check(in, split_kv(a, 16), kSplitOptions);
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  ASSERT_EQ(r.tensors.size(), 5u);
  EXPECT_EQ(find(r, "out_parts").checked, 4 * 2 * 4 * 4 * 16);  // every element, the empty splits' as zeros
  EXPECT_EQ(find(r, "lse_parts").checked, 4 * 2 * 4 * 4);
  EXPECT_TRUE(check(in, split_kv(a, 16), kSplitOptions, verify::Oracle::mp50).passed);
  // inputs and outputs from one file: the partials held with the inputs are the outputs, form B
  io::TensorMap one = split_kv(a, 16);
  for (const auto& [n, t] : in) one[n] = t;
  EXPECT_TRUE(check(one, one, kSplitOptions).passed);
  // the bthd layout: q, k, v, out and out_parts with T before H
  io::TensorMap in_t = in, out_t = split_kv(a, 16);
  for (const char* n : {"q", "k", "v"}) in_t[n] = swap_ht(in.at(n));
  for (const char* n : {"out", "out_parts"}) out_t[n] = swap_ht(out_t.at(n));
  EXPECT_TRUE(check(in_t, out_t, R"({"causal": true, "key_lengths": [50, 20], "split_size": 16, "layout": "bthd"})").passed);
  // uneven splits: 50 keys in splits of 7 (the last holds 1)
  EXPECT_TRUE(check(in, split_kv(a, 7), R"({"causal": true, "key_lengths": [50, 20], "split_size": 7})").passed);
  const verify::CompareReport r0 = check(in, split_kv(a, 16, true),
                                         R"({"causal": true, "key_lengths": [50, 20], "split_size": 16, "sink_in": "split0"})");
  EXPECT_TRUE(r0.passed) << verify::format_report(r0);
  // the same kernel judged with the null in the wrong place
  EXPECT_FALSE(check(in, split_kv(a, 16, true), kSplitOptions).passed);
}

TEST(AttentionMergeSplitKV, OneWrongSplitIsNamedByItsIndex) {
  const Att a = make_att();
  const io::TensorMap in = attention_inputs(a);
  // split 1 also takes key 32: its partial is wrong and the merge counts key 32 twice
  const verify::CompareReport r = check(in, split_kv(a, 16, false, 1, 1), kSplitOptions);
  EXPECT_EQ(failing(r), "out_parts (FAIL-certain), lse_parts (FAIL-certain), lse (FAIL-certain), out (FAIL-certain), "
                        "p_null (FAIL-certain)");
  ASSERT_FALSE(find(r, "out_parts").first_mismatches.empty());
  EXPECT_EQ(find(r, "out_parts").first_mismatches[0].rfind("out_parts[1, ", 0), 0u) << find(r, "out_parts").first_mismatches[0];
  EXPECT_EQ(find(r, "lse_parts").first_mismatches[0].rfind("lse_parts[1, ", 0), 0u);
  // split 2's stored out off by 1e-3 after a correct merge: out_parts fails at split 2 alone
  const verify::CompareReport r2 = check(in, split_kv(a, 16, false, 2, 2), kSplitOptions);
  EXPECT_EQ(failing(r2), "out_parts (FAIL-certain)");
  EXPECT_EQ(find(r2, "out_parts").first_mismatches[0].rfind("out_parts[2, ", 0), 0u) << find(r2, "out_parts").first_mismatches[0];
  // the heat map of the partials: every split's cells placed, the failing ones (err/bound > 1) and
  // the worst elements all in split 2
  const verify::ErrorMap& m = find(r2, "out_parts").map;
  ASSERT_FALSE(m.empty());
  ASSERT_FALSE(m.worst.empty());
  for (const verify::ElementError& w : m.worst) EXPECT_EQ(w.index[0], 2) << "a worst element outside split 2";
  const index_t per_split = static_cast<index_t>(m.cells.size()) / m.blocks[0];
  ASSERT_EQ(m.block[0], 1);
  for (index_t c = 0; c < static_cast<index_t>(m.cells.size()); ++c) {
    EXPECT_NE(m.cells[static_cast<std::size_t>(c)], -1.0f) << "cell " << c << " of a checked split left empty";
    if (m.cells[static_cast<std::size_t>(c)] > 1.0f) EXPECT_EQ(c / per_split, 2) << "failing cell " << c;
  }
}

TEST(AttentionMergeSplitKV, InconsistentCallsAreNamedErrors) {
  const Att a = make_att();
  const io::TensorMap in = attention_inputs(a), out = split_kv(a, 16);
  for (const char* o : {R"({"causal": true})", R"({"split_size": 0})", R"({"split_size": -3})", R"({"split_size": 2.5})"}) {
    try {
      check(in, out, o);
      ADD_FAILURE() << "no error for " << o;
    } catch (const oasis::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("split_size"), std::string::npos) << e.what();
    }
  }
}
