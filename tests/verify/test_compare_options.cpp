// tests/verify/test_compare_options.cpp — compare's attention features and report details: a
// sliding window, an additive bias and a boolean mask, the [B, T, H, d] layout (each: the
// reference's result passes, the result computed without the feature fails, the fast and the mp50
// oracle agree); --sample (reproducible rows, stated in the report, unchecked rows can hide an
// error); NaN reported as nan; the ulps column at max(|ref|, rms).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis_random.hpp"

namespace io = oasis::io;
namespace verify = oasis::verify;
using oasis::index_t;
using oasis::Tensor;

namespace {

struct Att {
  Tensor<float> q, k, v;
  oasis::AttentionOptions opt;
};

/// B = 2, H = 4, H_kv = 2, Tq = 9, Tk = 12, d = 8 in the bhtd layout, sinks.
Att make_att(std::uint64_t seed) {
  auto rng = oasis::test::make_rng(seed);
  Att a{oasis::test::randn<float>({2, 4, 9, 8}, rng), oasis::test::randn<float>({2, 2, 12, 8}, rng),
        oasis::test::randn<float>({2, 2, 12, 8}, rng), {}};
  a.opt.null_logits = {0.5, -1.0, 2.0, 0.0};
  a.opt.causal = true;
  return a;
}

io::StoredTensor f32(const Tensor<float>& t) { return {io::DType::f32, t.cast<double>()}; }

io::TensorMap inputs(const Att& a, oasis::AttentionLayout layout = oasis::AttentionLayout::bhtd) {
  const bool t = layout == oasis::AttentionLayout::bthd;
  return {{"q", f32(t ? oasis::swap_head_time(a.q) : a.q)},
          {"k", f32(t ? oasis::swap_head_time(a.k) : a.k)},
          {"v", f32(t ? oasis::swap_head_time(a.v) : a.v)}};
}

/// The library's float result for options o (out in o's layout) as an implementation's outputs.
io::TensorMap outputs(const Att& a, oasis::AttentionOptions o) {
  const bool t = o.layout == oasis::AttentionLayout::bthd;
  o.return_probs = true;
  const auto r = t ? oasis::token_attention(oasis::swap_head_time(a.q), oasis::swap_head_time(a.k),
                                            oasis::swap_head_time(a.v), o)
                   : oasis::token_attention(a.q, a.k, a.v, o);
  return {{"out", f32(r.out)}, {"lse", f32(r.lse)}, {"p_null", f32(r.p_null)}, {"probs", f32(r.probs)}};
}

verify::CompareReport check(const io::TensorMap& in, const io::TensorMap& out, const std::string& options,
                            verify::Oracle oracle = verify::Oracle::fast) {
  verify::CompareOptions co;
  co.oracle = oracle;
  return verify::check("attention", in, out, io::json::parse(options), co);
}

const char* kSinks = R"("null_logits": [0.5, -1.0, 2.0, 0.0])";

/// Both oracles give the same verdicts (tensor by tensor).
void expect_oracles_agree(const io::TensorMap& in, const io::TensorMap& out, const std::string& options) {
  const verify::CompareReport f = check(in, out, options), m = check(in, out, options, verify::Oracle::mp50);
  ASSERT_EQ(f.tensors.size(), m.tensors.size());
  EXPECT_EQ(f.passed, m.passed);
  for (std::size_t i = 0; i < f.tensors.size(); ++i) {
    EXPECT_EQ(f.tensors[i].violations, m.tensors[i].violations) << f.tensors[i].name;
    EXPECT_EQ(f.tensors[i].violations_certain, m.tensors[i].violations_certain) << f.tensors[i].name;
  }
}

}  // namespace

TEST(CompareOptions, SlidingWindow) {
  const Att a = make_att(11);
  oasis::AttentionOptions o = a.opt;
  o.window = 4;
  const std::string opts = std::string("{\"causal\": true, \"window\": 4, ") + kSinks + "}";
  const verify::CompareReport r = check(inputs(a), outputs(a, o), opts);
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  const verify::CompareReport w = check(inputs(a), outputs(a, a.opt), opts);  // computed without the window
  EXPECT_FALSE(w.passed);
  for (const auto& t : w.tensors) EXPECT_TRUE(t.certain_failure) << t.name;
  expect_oracles_agree(inputs(a), outputs(a, o), opts);
  // a window is a non-negative integer
  EXPECT_THROW(check(inputs(a), outputs(a, o), R"({"window": 2.5})"), oasis::invalid_argument);
  EXPECT_THROW(check(inputs(a), outputs(a, o), R"({"window": -1})"), oasis::invalid_argument);
}

TEST(CompareOptions, BiasAndMask) {
  const Att a = make_att(12);
  auto rng = oasis::test::make_rng(13);
  // a [B, 1, Tq, Tk] bias with some keys masked by -inf, and the boolean mask of those keys
  Tensor<double> bias = oasis::test::randn<double>({2, 1, 9, 12}, rng, 0.5), mask({2, 1, 9, 12});
  for (index_t i = 0; i < bias.size(); ++i) {
    const bool masked = (i * 7) % 5 == 0;
    mask[i] = masked ? 0.0 : 1.0;
    if (masked) bias[i] = -std::numeric_limits<double>::infinity();
  }
  oasis::AttentionOptions o = a.opt;
  o.bias = bias;
  io::TensorMap in = inputs(a);
  in.emplace("bias", io::StoredTensor{io::DType::f64, bias});
  const std::string opts = std::string("{\"causal\": true, ") + kSinks + "}";
  const verify::CompareReport r = check(in, outputs(a, o), opts);
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  EXPECT_FALSE(check(in, outputs(a, a.opt), opts).passed);  // bias ignored
  expect_oracles_agree(in, outputs(a, o), opts);
  // the mask alone is the bias 0 / -inf
  oasis::AttentionOptions om = a.opt;
  om.bias = Tensor<double>(mask.shape());
  for (index_t i = 0; i < mask.size(); ++i) om.bias[i] = mask[i] == 1.0 ? 0.0 : -std::numeric_limits<double>::infinity();
  io::TensorMap inm = inputs(a);
  inm.emplace("mask", io::StoredTensor{io::DType::f32, mask});
  EXPECT_TRUE(check(inm, outputs(a, om), opts).passed);
  EXPECT_FALSE(check(inm, outputs(a, a.opt), opts).passed);
  // bias and mask together add up
  inm.emplace("bias", io::StoredTensor{io::DType::f64, bias});
  EXPECT_TRUE(check(inm, outputs(a, o), opts).passed);
  // a mask value other than 0 or 1 is an input error naming the mask
  io::TensorMap bad = inputs(a);
  Tensor<double> half = mask;
  half[3] = 0.5;
  bad.emplace("mask", io::StoredTensor{io::DType::f32, half});
  try {
    check(bad, outputs(a, om), opts);
    ADD_FAILURE() << "a mask of 0.5 was accepted";
  } catch (const oasis::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("mask"), std::string::npos) << e.what();
  }
  // a [Tq, Tk] bias broadcast over batch and heads
  Tensor<double> b2 = oasis::test::randn<double>({9, 12}, rng);
  oasis::AttentionOptions o2 = a.opt;
  o2.bias = b2;
  io::TensorMap in2 = inputs(a);
  in2.emplace("bias", io::StoredTensor{io::DType::f64, b2});
  EXPECT_TRUE(check(in2, outputs(a, o2), opts).passed);
}

TEST(CompareOptions, BthdLayout) {
  const Att a = make_att(14);
  oasis::AttentionOptions o = a.opt;
  o.layout = oasis::AttentionLayout::bthd;
  const std::string opts = std::string("{\"causal\": true, \"layout\": \"bthd\", ") + kSinks + "}";
  const io::TensorMap in = inputs(a, oasis::AttentionLayout::bthd), out = outputs(a, o);
  EXPECT_EQ(out.at("out").values.shape(), (oasis::Shape{2, 9, 4, 8}));
  const verify::CompareReport r = check(in, out, opts);
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  // the same values as the bhtd check
  const verify::CompareReport rb = check(inputs(a), outputs(a, a.opt), std::string("{\"causal\": true, ") + kSinks + "}");
  for (std::size_t i = 0; i < r.tensors.size(); ++i) EXPECT_NEAR(r.tensors[i].worst_ratio, rb.tensors[i].worst_ratio, 1e-12);
  expect_oracles_agree(in, out, opts);
  // one element of out moved: named by its bthd index
  io::TensorMap moved = out;
  const index_t flat = ((1 * 9 + 5) * 4 + 3) * 8 + 2;  // out[1, 5, 3, 2] = (b, t, h, c)
  moved.at("out").values[flat] += 0.01;
  const verify::CompareReport m = check(in, moved, opts);
  ASSERT_FALSE(m.passed);
  for (const auto& t : m.tensors)
    if (t.name == "out") ASSERT_EQ(t.first_mismatches.at(0).rfind("out[1, 5, 3, 2]", 0), 0u) << t.first_mismatches[0];
  EXPECT_THROW(check(in, out, R"({"layout": "tbhd"})"), oasis::invalid_argument);
}

TEST(CompareOptions, SampleChecksReproducibleRowsAndSaysSo) {
  const Att a = make_att(15);
  const std::string opts = std::string("{\"causal\": true, ") + kSinks + "}";
  io::TensorMap out = outputs(a, a.opt);
  verify::CompareOptions co;
  co.sample = 5;
  co.seed = 99;
  const verify::CompareReport r1 = verify::check("attention", inputs(a), out, io::json::parse(opts), co);
  const verify::CompareReport r2 = verify::check("attention", inputs(a), out, io::json::parse(opts), co);
  EXPECT_TRUE(r1.passed);
  ASSERT_EQ(r1.sample.rows, 5);
  EXPECT_EQ(r1.sample.total, 2 * 4 * 9);
  EXPECT_EQ(r1.sample.which, r2.sample.which);  // the seed fixes the rows
  EXPECT_EQ(r1.sample.which.size(), 5u);
  for (const auto& t : r1.tensors) EXPECT_EQ(t.checked, 5 * (t.name == "out" ? 8 : t.name == "probs" ? 12 : 1)) << t.name;
  const std::string text = verify::format_report(r1);
  EXPECT_NE(text.find("sample: 5 of 72 rows (b, h, t) checked (seed 99)"), std::string::npos) << text;
  EXPECT_NE(text.find("unchecked rows can hide errors"), std::string::npos);
  EXPECT_NE(verify::report_json(r1).find("\"sample\":{\"rows\":5,\"total\":72,\"seed\":99"), std::string::npos);
  co.seed = 100;
  EXPECT_NE(verify::check("attention", inputs(a), out, io::json::parse(opts), co).sample.which, r1.sample.which);
  // an error in a row that is not sampled passes; sampling that row fails
  co.seed = 99;
  index_t unsampled = 0;
  for (index_t row = 0; row < 72; ++row) {
    const std::string lab = "(" + std::to_string(row / 36) + ", " + std::to_string((row / 9) % 4) + ", " + std::to_string(row % 9) + ")";
    if (std::find(r1.sample.which.begin(), r1.sample.which.end(), lab) == r1.sample.which.end()) {
      unsampled = row;
      break;
    }
  }
  out.at("lse").values[unsampled] += 1.0;
  EXPECT_TRUE(verify::check("attention", inputs(a), out, io::json::parse(opts), co).passed);
  co.sample = 72;  // every row
  EXPECT_FALSE(verify::check("attention", inputs(a), out, io::json::parse(opts), co).passed);
  // ops without rows refuse to sample
  co.sample = 3;
  io::TensorMap pin{{"p_null", f32(Tensor<float>({1, 2, 3}, 0.5f))}};
  io::TensorMap pout{{"psi", f32(Tensor<float>({1, 3}, 0.5f))}};
  EXPECT_THROW(verify::check("psi", pin, pout, {}, co), oasis::invalid_argument);
}

TEST(CompareOptions, DepthSampleAndOracles) {
  auto rng = oasis::test::make_rng(16);
  const index_t n = 5, N = 40, d = 6;
  const Tensor<float> src = oasis::test::randn<float>({n, N, d}, rng), g = oasis::test::randn<float>({n, N}, rng),
                      psi = oasis::test::uniform<float>({n, N}, rng, 0.0, 1.0);
  std::vector<oasis::SourceKind> kinds(n, oasis::SourceKind::attention);
  kinds[0] = oasis::SourceKind::initial;
  oasis::DepthOptions o;
  o.beta = 0.7;
  const auto r = oasis::attn_res_route(src, g, psi, kinds, o);
  const io::TensorMap in{{"sources", f32(src)}, {"g_old", f32(g)}, {"psi", f32(psi)}};
  io::TensorMap out{{"h", f32(r.h)}, {"alpha", f32(r.alpha)}, {"alpha_null", f32(r.alpha_null)}, {"g", f32(r.g)},
                    {"dpsi", f32(r.dpsi)}};
  const io::json::Value opts = io::json::parse(R"({"beta": 0.7})");
  verify::CompareOptions fast, slow, sample;
  slow.oracle = verify::Oracle::mp50;
  sample.sample = 7;
  const verify::CompareReport rf = verify::check("depth", in, out, opts, fast), rs = verify::check("depth", in, out, opts, slow);
  EXPECT_TRUE(rf.passed) << verify::format_report(rf);
  EXPECT_TRUE(rs.passed) << verify::format_report(rs);
  for (std::size_t i = 0; i < rf.tensors.size(); ++i)
    EXPECT_NEAR(rf.tensors[i].worst_ratio, rs.tensors[i].worst_ratio, 1e-6 * std::max(1.0, rs.tensors[i].worst_ratio))
        << rf.tensors[i].name;
  const verify::CompareReport rp = verify::check("depth", in, out, opts, sample);
  EXPECT_EQ(rp.sample.rows, 7);
  EXPECT_EQ(rp.sample.total, N);
  // a routing weight moved by 1e-3: failed by both oracles
  out.at("alpha").values[2 * N + 17] += 1e-3;
  EXPECT_FALSE(verify::check("depth", in, out, opts, fast).passed);
  EXPECT_FALSE(verify::check("depth", in, out, opts, slow).passed);
}

TEST(CompareReportFormat, NanIsReportedAsNan) {
  const Att a = make_att(17);
  io::TensorMap out = outputs(a, a.opt);
  out.at("out").values[5] = std::numeric_limits<double>::quiet_NaN();
  const verify::CompareReport r = check(inputs(a), out, std::string("{\"causal\": true, ") + kSinks + "}");
  EXPECT_FALSE(r.passed);
  for (const auto& t : r.tensors)
    if (t.name == "out") {
      EXPECT_TRUE(std::isnan(t.max_abs));
      EXPECT_TRUE(t.certain_failure);
      EXPECT_NE(t.first_mismatches.at(0).find("got nan"), std::string::npos) << t.first_mismatches[0];
    }
  const std::string text = verify::format_report(r);
  EXPECT_NE(text.find(" nan "), std::string::npos) << text;
  EXPECT_EQ(text.find(" inf "), std::string::npos) << text;
  EXPECT_NE(verify::report_json(r).find("\"has_nan\":true"), std::string::npos);
}

// The ulps column measures an error at max(|ref|, rms of the tensor): an output element that is
// nearly zero by cancellation has an error of the size of its neighbours', which in its own ulps
// would be huge.
TEST(CompareReportFormat, UlpsColumnIsNotDominatedByNearZeroReferences) {
  Att a = make_att(18);
  // v with two opposite keys: row 1 of every head averages values that nearly cancel
  for (index_t b = 0; b < 2; ++b)
    for (index_t h = 0; h < 2; ++h)
      for (index_t c = 0; c < 8; ++c) a.v(b, h, 1, c) = -a.v(b, h, 0, c) * (1.0f + 1e-6f);
  const io::TensorMap out = outputs(a, a.opt);
  const verify::CompareReport r = check(inputs(a), out, std::string("{\"causal\": true, ") + kSinks + "}");
  ASSERT_TRUE(r.passed) << verify::format_report(r);
  oasis::AttentionOptions o = a.opt;
  o.return_probs = false;
  const auto ref = oasis::token_attention(a.q.cast<oasis::mp50>(), a.k.cast<oasis::mp50>(), a.v.cast<oasis::mp50>(), o);
  double own_ulps = 0;  // the old column: error in ulps of the element itself
  for (index_t i = 0; i < ref.out.size(); ++i) {
    const double rd = static_cast<double>(ref.out[i]);
    own_ulps = std::max(own_ulps, std::abs(out.at("out").values[i] - rd) / io::dtype_ulp(io::DType::f32, rd));
  }
  for (const auto& t : r.tensors)
    if (t.name == "out") {
      EXPECT_LT(t.max_ulps, 16.0);
      EXPECT_GT(own_ulps, 10 * t.max_ulps) << "the case does not exercise near-zero references";
    }
}
