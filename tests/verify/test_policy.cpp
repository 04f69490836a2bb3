// tests/verify/test_policy.cpp — the compare policies (oasis/verify/policy.hpp) have teeth and
// raise no false alarm: every mutant of the zoo (tests/verify/attention_zoo.hpp) fails under the
// default policy at the shapes where the worst-case bound let it pass, and every correct
// implementation of the zoo passes every case; the fast oracle's verdicts are the mp50 oracle's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "attention_zoo.hpp"
#include "oasis/oasis.hpp"
#include "oasis/ops/prob_bounds.hpp"
#include "oasis/verify/compare.hpp"
#include "float_sums.hpp"

namespace io = oasis::io;
namespace verify = oasis::verify;
namespace zoo = oasis::zoo;
namespace fsum = oasis::verify::detail::fsum;
using oasis::index_t;
using oasis::Tensor;

namespace {

/// How far the fast oracle's worst ratios may lie from the mp50 oracle's, relative
/// (docs/tolerances.md, "The fast oracle"): 1e-9 for its double evaluation; gamma_{d_h+2} for its
/// float Q_j, which every bound is affine in; for `out`, gamma_{keys+3} for its float V1, G1 and Z
/// (the worst-case line is linear in V1 and G1, and Z is the largest of R^2's terms, at most a few
/// R^2 on Gaussian data) and another for X1, which moves R^2 by at most gamma (A^2 sw + Z), where
/// R^2 does not cancel (where it does, the worst ratio is known to rho_out only).
double fast_oracle_rel(index_t d_h, index_t keys, bool out) {
  return 1e-9 + fsum::gamma(d_h + 2) + (out ? 2.0 * fsum::gamma(keys + 3) : 0.0);
}

io::json::Value options_of(const zoo::Case& c) { return io::json::parse(zoo::options_json(c)); }

zoo::Result run_impl(const zoo::Impl& im, const zoo::Case& c, io::DType d) {
  oasis::AttentionOptions o = c.opt;
  o.return_probs = true;
  zoo::Result r = zoo::attention(im, c.q, c.k, c.v, o);
  return d == io::DType::f32 ? r : zoo::storage(r, d);
}

verify::CompareReport check(const zoo::Case& c, const io::TensorMap& out, verify::Policy p = verify::Policy::probabilistic,
                            verify::Oracle oracle = verify::Oracle::fast) {
  verify::CompareOptions co;
  co.policy = p;
  co.oracle = oracle;
  return verify::check("attention", zoo::inputs_of(c), out, options_of(c), co);
}

zoo::Case find_case(const std::string& name) {
  for (auto& c : zoo::policy_cases())
    if (c.name == name) return c;
  throw std::runtime_error("no case " + name);
}

zoo::Impl mutant(zoo::Bug b) {
  for (const auto& m : zoo::mutants())
    if (m.bug == b) return m;
  throw std::runtime_error("no mutant");
}

}  // namespace

// Every correct implementation passes every case in every dtype under the default policy (16-bit:
// accumulated in float, stored once) and the certain line; kernels that also round P to 16 bits
// pass under the p16 policy.
TEST(ComparePolicy, NoFalseAlarmOverTheCorrectZoo) {
  for (const zoo::Case& c : zoo::policy_cases())
    for (io::DType d : c.dtypes) {
      for (const zoo::Impl& im : zoo::correct_zoo(c.small_logits)) {
        const verify::CompareReport r = check(c, zoo::outputs_of(run_impl(im, c, d), d));
        EXPECT_TRUE(r.passed) << c.name << " " << io::to_string(d) << " " << im.name << "\n" << verify::format_report(r);
        for (const auto& t : r.tensors) EXPECT_FALSE(t.certain_failure) << c.name << " " << im.name << " " << t.name;
      }
      if (d == io::DType::f32) continue;
      for (zoo::Impl im : {zoo::Impl{"p16_plain", zoo::Algo::plain}, zoo::Impl{"p16_online_b64", zoo::Algo::online, 64}}) {
        im.p16 = true;
        im.p16_type = d;
        const verify::CompareReport r = check(c, zoo::outputs_of(run_impl(im, c, d), d), verify::Policy::p16);
        EXPECT_TRUE(r.passed) << c.name << " " << io::to_string(d) << " " << im.name << "\n" << verify::format_report(r);
      }
    }
}

// float32, one query over 4096 keys, sinks stratified over [-3, 3] (zoo::stratified_sinks: one of
// the 8 heads' above 2.25, whatever the seed; with 8 independent draws, at one base seed of 40 no
// sink was high enough for a doubled null to move `out` beyond its bound): the null counted twice
// and a causal mask that excludes the diagonal fail `out` alone (the worst-case bound passes them).
TEST(ComparePolicy, MutantsFailAt4096Keys) {
  zoo::Case c = find_case("decode_4096_sinks");
  c.opt.null_logits = zoo::stratified_sinks(8, -3.0, 3.0, 101);
  for (zoo::Bug b : {zoo::Bug::null_twice, zoo::Bug::causal_no_diagonal}) {
    const zoo::Result r = run_impl(mutant(b), c, io::DType::f32);
    const verify::CompareReport rep = check(c, zoo::outputs_of(r, io::DType::f32, {"out"}));
    EXPECT_FALSE(rep.passed) << mutant(b).name << "\n" << verify::format_report(rep);
    EXPECT_FALSE(check(c, zoo::outputs_of(r, io::DType::f32)).passed) << mutant(b).name;
  }
}

// 512 keys, `out` alone: plain softmax instead of Softmax1 (the sink dropped), a doubled null and
// a sink scaled by the softmax scale fail.
TEST(ComparePolicy, MutantsFailOnOutAloneAt512Keys) {
  zoo::Case c = find_case("decode_512_sinks");
  c.opt.null_logits = zoo::stratified_sinks(8, -3.0, 3.0, 102);  // (as above)
  for (zoo::Bug b : {zoo::Bug::null_dropped, zoo::Bug::null_twice, zoo::Bug::sink_times_scale}) {
    const verify::CompareReport rep = check(c, zoo::outputs_of(run_impl(mutant(b), c, io::DType::f32), io::DType::f32, {"out"}));
    EXPECT_FALSE(rep.passed) << mutant(b).name << "\n" << verify::format_report(rep);
  }
}

// bf16 outputs computed in float and stored in bf16: the sink dropped, the sink scaled by the
// softmax scale and the doubled null fail `out` alone at 4, 16 and 64 keys; under the worst-case
// policy (every intermediate in bf16) they pass, which is what the default replaces.
TEST(ComparePolicy, Bf16StoredMutantsFailOnOut) {
  for (const char* name : {"bf16_4_keys", "bf16_16_keys", "prefill_64_sinks"}) {
    const zoo::Case c = find_case(name);
    for (zoo::Bug b : {zoo::Bug::null_dropped, zoo::Bug::sink_times_scale, zoo::Bug::null_twice}) {
      const io::TensorMap out = zoo::outputs_of(run_impl(mutant(b), c, io::DType::bf16), io::DType::bf16, {"out"});
      const verify::CompareReport rep = check(c, out);
      EXPECT_FALSE(rep.passed) << name << " " << mutant(b).name << "\n" << verify::format_report(rep);
    }
  }
  // the teeth the default adds: the doubled null passed the worst-case policy at 16 keys; the
  // default's report says that only a kernel keeping its intermediates in 16 bits may use it
  const zoo::Case c = find_case("bf16_16_keys");
  const io::TensorMap out = zoo::outputs_of(run_impl(mutant(zoo::Bug::null_twice), c, io::DType::bf16), io::DType::bf16, {"out"});
  EXPECT_TRUE(check(c, out, verify::Policy::worst_case).passed);
  const auto hint = [](const verify::CompareReport& r) {
    return std::count_if(r.notes.begin(), r.notes.end(), [](const std::string& n) { return n.rfind("16-bit out:", 0) == 0; });
  };
  const verify::CompareReport rep = check(c, out);
  ASSERT_FALSE(rep.passed);
  EXPECT_EQ(hint(rep), 1) << verify::format_report(rep);
  EXPECT_EQ(hint(check(c, out, verify::Policy::worst_case)), 0);
  // no hint on a pass, nor on a failure outside the certain line
  EXPECT_EQ(hint(check(c, zoo::outputs_of(run_impl({"plain"}, c, io::DType::bf16), io::DType::bf16, {"out"}))), 0);
  // a FlashAttention-style kernel (P rounded to bf16) fails the default with the hint naming p16,
  // and passes p16
  zoo::Impl fa{"p16_plain", zoo::Algo::plain};
  fa.p16 = true;
  const io::TensorMap fa_out = zoo::outputs_of(run_impl(fa, c, io::DType::bf16), io::DType::bf16, {"out"});
  const verify::CompareReport fa_rep = check(c, fa_out);
  EXPECT_FALSE(fa_rep.passed);
  EXPECT_EQ(hint(fa_rep), 1) << verify::format_report(fa_rep);
  EXPECT_NE(verify::format_report(fa_rep).find("policy p16"), std::string::npos);
  EXPECT_TRUE(check(c, fa_out, verify::Policy::p16).passed);
}

// One element of `out` (the largest) moved by 64 ulps fails at the 64-key prefill, where the
// worst-case bound is about 1000 ulps; the report names the element and it is not FAIL-certain.
TEST(ComparePolicy, OneElementOff64UlpsFails) {
  const zoo::Case c = find_case("prefill_64_sinks");
  zoo::Result r = run_impl({"plain"}, c, io::DType::f32);
  const index_t at = zoo::one_element_off(r.out, io::DType::f32, 64);
  const verify::CompareReport rep = check(c, zoo::outputs_of(r, io::DType::f32, {"out"}));
  ASSERT_EQ(rep.tensors.size(), 1u);
  const verify::TensorReport& t = rep.tensors[0];
  EXPECT_FALSE(t.passed) << verify::format_report(rep);
  EXPECT_EQ(t.violations, 1);
  EXPECT_FALSE(t.certain_failure);
  ASSERT_FALSE(t.first_mismatches.empty());
  const index_t d = c.q.dim(3);
  const std::string where = "out[0, " + std::to_string(at / (64 * d)) + ", " + std::to_string((at / d) % 64) + ", " +
                            std::to_string(at % d) + "]";
  EXPECT_EQ(t.first_mismatches[0].rfind(where, 0), 0u) << t.first_mismatches[0];
  EXPECT_TRUE(check(c, zoo::outputs_of(r, io::DType::f32, {"out"}), verify::Policy::worst_case).passed);
}

// The engine's bounds are the definitions: on a case with GQA, padding, sinks, a window, a bias
// and the bthd layout, the worst err/bound of each tensor under the probabilistic and the
// worst-case policy equals the one computed from oasis::bounds::prob_attention_bounds and
// attention_bounds on the mp50 reference (to 1e-9, and the fast oracle's to its float sums' gamma;
// the underflow floors, ~1e-44, are left out).
TEST(ComparePolicy, BoundsAreTheDefinitions) {
  zoo::Case c = zoo::make_case("definition", 2, 4, 2, 7, 11, 16, true, true, 1.0, 1.0, 91);
  auto rng = oasis::test::make_rng(92);
  c.opt.key_lengths = {11, 8};
  c.opt.window = 5;
  c.opt.bias = oasis::test::randn<double>({2, 1, 7, 11}, rng, 0.3);
  c.opt.bias[17] = -INFINITY;
  c.opt.layout = oasis::AttentionLayout::bthd;
  const Tensor<float> q = oasis::swap_head_time(c.q), k = oasis::swap_head_time(c.k), v = oasis::swap_head_time(c.v);
  oasis::AttentionOptions o = c.opt;
  o.return_probs = true;
  const auto mine = oasis::token_attention(q, k, v, o);  // the implementation: the float reference
  const auto ref = oasis::token_attention(q.cast<oasis::mp50>(), k.cast<oasis::mp50>(), v.cast<oasis::mp50>(), o);
  const auto wc = oasis::bounds::attention_bounds(q, k, v, o, ref);
  const auto pb = oasis::bounds::prob_attention_bounds(q, k, v, o, ref);
  io::TensorMap in{{"q", {io::DType::f32, q.cast<double>()}}, {"k", {io::DType::f32, k.cast<double>()}},
                   {"v", {io::DType::f32, v.cast<double>()}}, {"bias", {io::DType::f64, c.opt.bias}}};
  io::TensorMap out{{"out", {io::DType::f32, mine.out.cast<double>()}}, {"lse", {io::DType::f32, mine.lse.cast<double>()}},
                    {"p_null", {io::DType::f32, mine.p_null.cast<double>()}}, {"probs", {io::DType::f32, mine.probs.cast<double>()}}};
  std::string opts = "{\"causal\": true, \"key_lengths\": [11, 8], \"window\": 5, \"layout\": \"bthd\", \"null_logits\": [";
  for (std::size_t i = 0; i < c.opt.null_logits.size(); ++i) {
    char b[40];
    std::snprintf(b, sizeof b, "%s%.17g", i ? ", " : "", c.opt.null_logits[i]);
    opts += b;
  }
  const io::json::Value ov = io::json::parse(opts + "]}");
  const double u = std::ldexp(1.0, -24);
  for (verify::Policy pol : {verify::Policy::probabilistic, verify::Policy::worst_case})
    for (verify::Oracle oracle : {verify::Oracle::fast, verify::Oracle::mp50}) {
      verify::CompareOptions co;
      co.policy = pol;
      co.oracle = oracle;
      const verify::CompareReport r = verify::check("attention", in, out, ov, co);
      EXPECT_TRUE(r.passed) << verify::format_report(r);
      for (const auto& t : r.tensors) {
        const Tensor<oasis::mp50>& rt = t.name == "out" ? ref.out : t.name == "lse" ? ref.lse : t.name == "p_null" ? ref.p_null : ref.probs;
        const Tensor<double>& w = t.name == "out" ? wc.out : t.name == "lse" ? wc.lse : t.name == "p_null" ? wc.p_null : wc.probs;
        const Tensor<double>& R = t.name == "out" ? pb.out : t.name == "lse" ? pb.lse : t.name == "p_null" ? pb.p_null : pb.probs;
        double worst = 0;
        for (index_t i = 0; i < rt.size(); ++i) {
          const double rd = static_cast<double>(rt[i]);
          if (!std::isfinite(rd)) continue;
          const double err = static_cast<double>(abs(oasis::mp50(out.at(t.name).values[i]) - rt[i]));
          const double certain = 0.5 * io::dtype_ulp(io::DType::f32, rd) + 2.0 * w[i];
          const double policy = pol == verify::Policy::worst_case
                                    ? certain
                                    : std::min(certain, 0.5 * io::dtype_ulp(io::DType::f32, rd) + 1.02 * verify::kLambda * u * R[i]);
          if (policy > 0) worst = std::max(worst, err / policy);
        }
        // (rows of at most 11 keys)
        const double rel = oracle == verify::Oracle::fast ? fast_oracle_rel(q.dim(3), 11, t.name == "out") : 1e-9;
        EXPECT_NEAR(t.worst_ratio, worst, rel * std::max(worst, 1e-3)) << to_string(pol) << " " << to_string(oracle) << " " << t.name;
      }
    }
}

// A gross mistake is outside even the certain bound: FAIL-certain, in the report and the JSON.
TEST(ComparePolicy, GrossMistakeIsFailCertain) {
  const zoo::Case c = find_case("prefill_64_sinks");
  const verify::CompareReport rep = check(c, zoo::outputs_of(run_impl(mutant(zoo::Bug::null_dropped), c, io::DType::f32),
                                                        io::DType::f32, {"out", "lse"}));
  EXPECT_FALSE(rep.passed);
  for (const auto& t : rep.tensors) EXPECT_TRUE(t.certain_failure) << t.name;
  EXPECT_NE(verify::format_report(rep).find("verdict: FAIL-certain"), std::string::npos) << verify::format_report(rep);
  EXPECT_NE(verify::report_json(rep).find("\"verdict\":\"FAIL-certain\""), std::string::npos);
}

// The fast oracle gives the mp50 oracle's verdicts, under the probabilistic and the worst-case
// policy: on a case with GQA, padding and sinks, for f32, bf16 and f64 outputs (f64: the library's
// double reference, whose errors are of the order of the double oracle's own error, so that under
// the probabilistic policy its rows are recomputed in mp50), and for f32 and bf16 the same worst
// ratios to the fast oracle's float sums' uncertainty (fast_oracle_rel) relative to the larger of 1
// and the ratio
// (its reference is within ~1e-16 of the exact one, the errors are ~1e-8; for f64 the two differ by
// as much as the errors themselves).
TEST(ComparePolicy, FastOracleAgreesWithMp50) {
  zoo::Case c = zoo::make_case("agree", 2, 4, 2, 9, 13, 16, true, true, 1.0, 1.0, 77);
  c.opt.key_lengths = {13, 6};
  for (const zoo::Impl& im : {zoo::Impl{"plain"}, zoo::Impl{"online", zoo::Algo::online, 4}, mutant(zoo::Bug::null_twice)})
    for (io::DType d : {io::DType::f32, io::DType::bf16, io::DType::f64}) {
      io::TensorMap out;
      if (d == io::DType::f64) {
        if (im.bug != zoo::Bug::none) continue;
        oasis::AttentionOptions o = c.opt;
        o.return_probs = true;
        const auto r = oasis::token_attention(c.q.cast<double>(), c.k.cast<double>(), c.v.cast<double>(), o);
        out = {{"out", {d, r.out}}, {"lse", {d, r.lse}}, {"p_null", {d, r.p_null}}, {"probs", {d, r.probs}}};
      } else {
        out = zoo::outputs_of(run_impl(im, c, d), d);
      }
      std::string opts = "{\"causal\": true, \"key_lengths\": [13, 6], \"null_logits\": [";
      for (std::size_t i = 0; i < c.opt.null_logits.size(); ++i) {
        char b[40];
        std::snprintf(b, sizeof b, "%s%.17g", i ? ", " : "", c.opt.null_logits[i]);
        opts += b;
      }
      const io::json::Value ov = io::json::parse(opts + "]}");
      // worst_case: the fast oracle leaves out the probabilistic bound's products
      for (verify::Policy pol : {verify::Policy::probabilistic, verify::Policy::worst_case}) {
        verify::CompareOptions fast, slow;
        fast.policy = slow.policy = pol;
        slow.oracle = verify::Oracle::mp50;
        const verify::CompareReport rf = verify::check("attention", zoo::inputs_of(c), out, ov, fast);
        const verify::CompareReport rs = verify::check("attention", zoo::inputs_of(c), out, ov, slow);
        const std::string what = im.name + " " + std::string(to_string(pol));
        ASSERT_EQ(rf.tensors.size(), rs.tensors.size());
        EXPECT_EQ(rf.passed, rs.passed) << what;
        if (d == io::DType::f64) {
          EXPECT_TRUE(rf.passed) << verify::format_report(rf);
          // rows recomputed in mp50 (the certain line, twice the worst case, leaves room for the
          // oracle's own error: worst_case may decide them all in double)
          if (pol == verify::Policy::probabilistic) EXPECT_EQ(rf.oracle.find("; 0 of"), std::string::npos) << rf.oracle;
        }
        for (std::size_t i = 0; i < rf.tensors.size(); ++i) {
          const auto &a = rf.tensors[i], &b = rs.tensors[i];
          EXPECT_EQ(a.violations, b.violations) << what << " " << a.name;
          EXPECT_EQ(a.violations_certain, b.violations_certain) << what << " " << a.name;
          if (d == io::DType::f64) continue;
          const double rel = fast_oracle_rel(c.q.dim(3), 13, a.name == "out");  // (rows of at most 13 keys)
          EXPECT_NEAR(a.worst_ratio, b.worst_ratio, rel * std::max(1.0, b.worst_ratio)) << what << " " << a.name;
          EXPECT_NEAR(a.worst_ratio_certain, b.worst_ratio_certain, rel * std::max(1.0, b.worst_ratio_certain))
              << what << " " << a.name;
        }
      }
    }
}

// A sliding window past the padding: rows whose window starts after the last valid key see no key
// (their key range begins far to the right of the tile's keys). The fast oracles, forward and
// backward, give mp50's verdicts on them, and the correct answers pass.
TEST(ComparePolicy, WindowPastThePaddingLeavesRowsWithoutKeys) {
  zoo::Case c = zoo::make_case("window_pad", 2, 2, 1, 70, 70, 8, false, true, 1.0, 1.0, 79);
  c.opt.window = 4;
  c.opt.key_lengths = {10, 0};
  std::string opts = options_json(c);
  opts.insert(opts.size() - 1, ", \"key_lengths\": [10, 0]");
  const io::json::Value ov = io::json::parse(opts);
  verify::CompareOptions fast, slow;
  slow.oracle = verify::Oracle::mp50;
  const io::TensorMap in = zoo::inputs_of(c);
  const io::TensorMap out = zoo::outputs_of(run_impl(zoo::Impl{"plain"}, c, io::DType::f32), io::DType::f32);
  const verify::CompareReport rf = verify::check("attention", in, out, ov, fast), rs = verify::check("attention", in, out, ov, slow);
  EXPECT_TRUE(rf.passed) << verify::format_report(rf);
  EXPECT_EQ(rf.passed, rs.passed);
  // the backward: f32 gradients of the float reference backward from a random grad_out
  oasis::AttentionCotangents<float> d{c.q.cast<float>(), {}, {}};  // grad_out: any [B, H, Tq, dv] tensor
  const oasis::AttentionGrads<float> g = oasis::token_attention_backward(c.q, c.k, c.v, d, c.opt);
  io::TensorMap bin = in;
  bin.emplace("grad_out", io::StoredTensor{io::DType::f32, d.out.cast<double>()});
  io::TensorMap bout{{"grad_q", {io::DType::f32, g.q.cast<double>()}}, {"grad_k", {io::DType::f32, g.k.cast<double>()}},
                     {"grad_v", {io::DType::f32, g.v.cast<double>()}},
                     {"grad_null_logits", {io::DType::f32, g.null_logits.cast<double>()}}};
  const verify::CompareReport bf = verify::check("attention_backward", bin, bout, ov, fast),
                              bs = verify::check("attention_backward", bin, bout, ov, slow);
  EXPECT_TRUE(bf.passed) << verify::format_report(bf);
  EXPECT_EQ(bf.passed, bs.passed);
}

// R(A) of a mixture (prob_mix, through prob_mix_from_folded) is the square root of the sum of
// squares that defines it (oasis/ops/prob_bounds.hpp):
//   R^2 = sum_j p_j^2 kappa_j^2 (v_j - A)^2 + p_0^2 kappa_0^2 A^2 + (3 m' + 4) A^2 + sum_j p_j^2 v_j^2
//         + 3 m V1^2 + sigma^2 (sum_j p_j) sum_j p_j (v_j - A)^2,
// evaluated term by term in long double. Each expanded term of the double evaluation meets at most
// m + 12 roundings (its products, the sum over the m keys, the fold, the sum of R^2's terms), so to
// first order |R^2 - R_def^2| <= (m + 12) u mag, mag the sum of the expanded terms' magnitudes, and
// |R / R_def - 1| <= (m + 12) u mag / (2 R_def^2). The test allows (m + 8) u mag / R_def^2: at least
// that for every m, and up to twice it as m grows (room for the second order). Rows: sinks from 0
// to +600 (probabilities below 2^-400: the scaled path), values of one sign, of both signs, and all
// equal (their spread about A only from the null's share).
TEST(ComparePolicy, MixtureBoundIsItsSumOfSquares) {
  auto rng = oasis::test::make_rng(311);
  std::normal_distribution<double> g(0.0, 1.0);
  const double u = std::ldexp(1.0, -53);
  for (index_t m : {1, 7, 300})
    for (double sink : {0.0, 6.0, 600.0})
      for (int values = 0; values < 3; ++values) {
        std::vector<double> z(static_cast<std::size_t>(m)), zeta2(z.size()), v(z.size()), p(z.size());
        double M = sink;
        for (std::size_t j = 0; j < z.size(); ++j) {
          z[j] = 2.0 * g(rng);
          zeta2[j] = 1.0 + std::abs(g(rng));
          v[j] = values == 0 ? 1.0 + std::abs(g(rng)) : values == 1 ? g(rng) : 0.75;
          M = std::max(M, z[j]);
        }
        long double S = std::exp(static_cast<long double>(sink - M));
        for (double zj : z) S += std::exp(static_cast<long double>(zj - M));
        const long double lse = M + std::log(S);
        for (std::size_t j = 0; j < z.size(); ++j) p[j] = static_cast<double>(std::exp(z[j] - lse));
        const double p0 = static_cast<double>(std::exp(sink - lse)), sigma = 3.5;
        const oasis::bounds::ProbRow pr = oasis::bounds::prob_row(oasis::RowNorm::softmax1, z.data(), zeta2.data(), m, sink,
                                                                  0.0, sigma, p.data(), p0, static_cast<double>(lse));
        long double A = 0, V1 = 0, sp = 0;
        for (std::size_t j = 0; j < z.size(); ++j) {
          A += static_cast<long double>(p[j]) * v[j];
          V1 += static_cast<long double>(p[j]) * std::abs(v[j]);
          sp += p[j];
        }
        const double Ad = static_cast<double>(A);  // prob_mix takes A in double
        const long double Al = Ad;
        long double def = (static_cast<long double>(p0) * p0 * pr.kappa2_null + 3.0L * pr.terms + 4.0L) * Al * Al +
                          3.0L * m * V1 * V1, spread = 0, mag = def;
        for (std::size_t j = 0; j < z.size(); ++j) {
          const long double pj = p[j], w = pj * pj * pr.kappa2[j], d = v[j] - Al;
          def += w * d * d + pj * pj * v[j] * v[j];
          mag += w * (v[j] * v[j] + 2 * std::abs(Al * v[j]) + Al * Al) + pj * pj * v[j] * v[j];
          spread += pj * d * d;
        }
        def += static_cast<long double>(sigma) * sigma * sp * spread;
        long double y2 = 0;
        for (std::size_t j = 0; j < z.size(); ++j) y2 += static_cast<long double>(p[j]) * v[j] * v[j];
        mag += static_cast<long double>(sigma) * sigma * sp * (y2 + Al * Al * (2 + sp));
        const double R = oasis::bounds::prob_mix(pr, p.data(), v.data(), 1, m, p0, Ad);
        const long double Rdef = std::sqrt(def);
        const std::string what = "m " + std::to_string(m) + " sink " + std::to_string(sink) + " values " + std::to_string(values);
        ASSERT_GT(Rdef, 0.0L) << what;
        EXPECT_NEAR(static_cast<double>(R / Rdef), 1.0, static_cast<double>((m + 8) * u * mag / def)) << what;
      }
}
