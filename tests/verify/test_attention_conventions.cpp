// tests/verify/test_attention_conventions.cpp — other libraries' conventions as options of the
// attention ops (docs/verify.md, "Other libraries' conventions"): the LSE with the null or over the
// keys only, in base e or base 2 (lse_null, lse_base), and null logits of -inf (a head without a
// null) and +inf (all the mass on the null). A kernel following each convention passes under it
// and fails under the others (both oracles); bad values are named errors (exit 2 in the CLI);
// a NaN null logit is refused; a NaN output is a FAIL naming the element.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "oasis/io/npy.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis_test.hpp"

namespace io = oasis::io;
namespace verify = oasis::verify;
using oasis::index_t;
using oasis::Tensor;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Att {
  Tensor<float> q, k, v;
  oasis::AttentionOptions opt;
};

/// B = 1, H = 4, H_kv = 2, Tq = 6, Tk = 9, d = 8, causal, the given null logits.
Att make_att(std::uint64_t seed, std::vector<double> sinks) {
  auto rng = oasis::test::make_rng(seed);
  Att a{oasis::test::randn<float>({1, 4, 6, 8}, rng, 1.5), oasis::test::randn<float>({1, 2, 9, 8}, rng),
        oasis::test::randn<float>({1, 2, 9, 8}, rng), {}};
  a.opt.null_logits = std::move(sinks);
  a.opt.causal = true;
  return a;
}

io::StoredTensor f32(const Tensor<float>& t) { return {io::DType::f32, t.cast<double>()}; }

/// q, k, v and the null logits as an input tensor (JSON holds no infinity).
io::TensorMap inputs(const Att& a) {
  return {{"q", f32(a.q)}, {"k", f32(a.k)}, {"v", f32(a.v)},
          {"null_logits", {io::DType::f32, Tensor<double>({4}, a.opt.null_logits)}}};
}

/// The LSE of every row as a float kernel stores it. Base e: the library's float reference (keys
/// only: plain softmax over the same keys, as FlashInfer's sink-exclusive LSE). Base 2, as
/// Triton-style kernels: scores times log2(e), the null logit likewise (unless keys_only), m the
/// maximum, l = sum exp2(x - m), lse2 = m + log2(l).
Tensor<double> kernel_lse(const Att& a, bool keys_only, bool base2) {
  if (!base2) {
    oasis::AttentionOptions o = a.opt;
    if (keys_only) {
      o.normalizer = oasis::RowNorm::softmax;
      o.null_logits.clear();
    }
    return oasis::token_attention(a.q, a.k, a.v, o).lse.cast<double>();
  }
  const oasis::AttentionShape s = oasis::check_attention_args(a.q, a.k, a.v, a.opt);
  const float scale_log2 = static_cast<float>(1.0 / std::sqrt(8.0)) * 1.44269504f;
  Tensor<double> lse({s.B, s.H, s.Tq});
  for (index_t h = 0; h < s.H; ++h)
    for (index_t t = 0; t < s.Tq; ++t) {
      const oasis::KeyRange kr = oasis::visible_range(s, a.opt, 0, t);
      std::vector<float> x;
      for (index_t j = kr.begin; j < kr.end; ++j) {
        float dot = 0;
        for (index_t c = 0; c < 8; ++c) dot += a.q(0, h, t, c) * a.k(0, h / 2, j, c);
        x.push_back(dot * scale_log2);
      }
      const double sink = a.opt.null_logits[static_cast<std::size_t>(h)];
      if (!keys_only && sink > -kInf) x.push_back(static_cast<float>(sink) * 1.44269504f);
      float m = -std::numeric_limits<float>::infinity(), l = 0;
      for (float xi : x) m = std::max(m, xi);
      for (float xi : x) l += std::exp2(xi - m);
      lse(0, h, t) = std::isinf(m) ? m : m + std::log2(l);
    }
  return lse;
}

/// The library's float result (out, p_null, probs) with `lse` in place of its LSE.
io::TensorMap outputs(const Att& a, const Tensor<double>& lse) {
  oasis::AttentionOptions o = a.opt;
  o.return_probs = true;
  const auto r = oasis::token_attention(a.q, a.k, a.v, o);
  return {{"out", f32(r.out)}, {"lse", {io::DType::f32, lse}}, {"p_null", f32(r.p_null)}, {"probs", f32(r.probs)}};
}

verify::CompareReport check(const std::string& op, const io::TensorMap& in, const io::TensorMap& out,
                            const std::string& options, verify::Oracle oracle = verify::Oracle::fast,
                            verify::Policy policy = verify::Policy::probabilistic) {
  verify::CompareOptions co;
  co.oracle = oracle;
  co.policy = policy;
  return verify::check(op, in, out, io::json::parse(options), co);
}

const verify::TensorReport& find(const verify::CompareReport& r, const std::string& name) {
  for (const auto& t : r.tensors)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

const char* kConventions[4] = {R"({"causal": true})", R"({"causal": true, "lse_null": "excluded"})",
                               R"({"causal": true, "lse_base": "2"})",
                               R"({"causal": true, "lse_null": "excluded", "lse_base": "2"})"};

}  // namespace

TEST(AttentionConventions, EachLseConventionPassesUnderItsOptionsAndFailsUnderTheOthers) {
  const Att a = make_att(3201, {0.5, -1.0, 2.0, 0.0});
  for (int kernel = 0; kernel < 4; ++kernel) {
    const io::TensorMap out = outputs(a, kernel_lse(a, kernel & 1, kernel & 2));
    for (int judged = 0; judged < 4; ++judged)
      for (verify::Oracle o : {verify::Oracle::fast, verify::Oracle::mp50})
        for (verify::Policy p : {verify::Policy::probabilistic, verify::Policy::worst_case}) {
          const verify::CompareReport r = check("attention", inputs(a), out, kConventions[judged], o, p);
          SCOPED_TRACE(std::string(kConventions[kernel]) + " judged as " + kConventions[judged]);
          EXPECT_EQ(find(r, "lse").passed, kernel == judged) << verify::format_report(r);
          EXPECT_TRUE(find(r, "out").passed && find(r, "p_null").passed && find(r, "probs").passed);
          if (kernel != judged) EXPECT_TRUE(find(r, "lse").certain_failure);
        }
  }
  const verify::CompareReport r = check("attention", inputs(a), outputs(a, kernel_lse(a, true, true)), kConventions[3]);
  EXPECT_NE(find(r, "lse").bound.find("LSE keys only, base 2"), std::string::npos) << find(r, "lse").bound;
}

TEST(AttentionConventions, UnknownConventionValuesAreNamedErrors) {
  const Att a = make_att(3202, {0.5, -1.0, 2.0, 0.0});
  const io::TensorMap out = outputs(a, kernel_lse(a, false, false));
  EXPECT_EQ(oasis::test::thrown_argument([&] { check("attention", inputs(a), out, R"({"lse_null": "sometimes"})"); }),
            "lse_null");
  EXPECT_EQ(oasis::test::thrown_argument([&] { check("attention", inputs(a), out, R"({"lse_base": "10"})"); }), "lse_base");
  EXPECT_EQ(oasis::test::thrown_argument([&] { check("attention", inputs(a), out, R"({"lse_base": 2})"); }), "lse_base");
  io::TensorMap g = inputs(a);
  g.emplace("grad_out", f32(Tensor<float>({1, 4, 6, 8}, 1.0f)));
  const io::TensorMap gout{{"grad_q", f32(Tensor<float>({1, 4, 6, 8}))}};
  EXPECT_EQ(oasis::test::thrown_argument([&] { check("attention_backward", g, gout, R"({"lse_null": "yes"})"); }),
            "lse_null");
  // the command line: exit 2, the option named
  const std::string dir = ::testing::TempDir() + "oasis_conventions_" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("mkdir -p '" + dir + "'").c_str()), 0);
  for (const char* n : {"q", "k", "v"}) io::write_npy(dir + "/" + n + ".npy", inputs(a).at(n));
  io::write_npy(dir + "/lse.npy", out.at("lse"));
  std::ofstream(dir + "/config.json") << R"({"op": "attention", "inputs": {"q": "q.npy", "k": "k.npy", "v": "v.npy"},)"
                                      << R"( "outputs": {"lse": "lse.npy"}, "options": {"lse_base": "10"}})";
  const int st = std::system(("'" OASIS_VERIFY_CLI "' compare '" + dir + "/config.json' > '" + dir + "/log' 2>&1").c_str());
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 2);
  std::ifstream log(dir + "/log");
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_NE(text.str().find("lse_base"), std::string::npos) << text.str();
}

TEST(AttentionConventions, InfiniteNullLogitsAreLimits) {
  // head 0: -inf (no null), head 1: +inf (all on the null), heads 2 and 3 finite
  const Att a = make_att(3203, {-kInf, kInf, 1.0, 0.0});
  oasis::AttentionOptions o = a.opt;
  o.return_probs = true;
  const auto r = oasis::token_attention(a.q, a.k, a.v, o);
  oasis::AttentionOptions plain = o;
  plain.normalizer = oasis::RowNorm::softmax;
  plain.null_logits.clear();
  const auto rs = oasis::token_attention(a.q, a.k, a.v, plain);
  for (index_t t = 0; t < 6; ++t) {
    EXPECT_EQ(r.lse(0, 0, t), rs.lse(0, 0, t));
    EXPECT_EQ(r.p_null(0, 0, t), 0.0f);
    for (index_t c = 0; c < 8; ++c) EXPECT_EQ(r.out(0, 0, t, c), rs.out(0, 0, t, c));
    EXPECT_EQ(r.lse(0, 1, t), std::numeric_limits<float>::infinity());
    EXPECT_EQ(r.p_null(0, 1, t), 1.0f);
    for (index_t c = 0; c < 8; ++c) EXPECT_EQ(r.out(0, 1, t, c), 0.0f);
  }
  // the library's float result passes (both oracles), the LSE with the null and over the keys only
  const io::TensorMap out = outputs(a, r.lse.cast<double>());
  for (verify::Oracle orc : {verify::Oracle::fast, verify::Oracle::mp50}) {
    const verify::CompareReport ok = check("attention", inputs(a), out, R"({"causal": true})", orc);
    EXPECT_TRUE(ok.passed) << verify::format_report(ok);
    const verify::CompareReport keys =
        check("attention", inputs(a), outputs(a, kernel_lse(a, true, false)), kConventions[1], orc);
    EXPECT_TRUE(keys.passed) << verify::format_report(keys);
  }
  // a kernel that takes the -inf null logit for 0 (Softmax1 on head 0) fails
  Att zero = a;
  zero.opt.null_logits[0] = 0.0;
  oasis::AttentionOptions oz = zero.opt;
  oz.return_probs = true;
  const auto rz = oasis::token_attention(a.q, a.k, a.v, oz);
  const verify::CompareReport wrong = check("attention", inputs(a), outputs(zero, rz.lse.cast<double>()), R"({"causal": true})");
  EXPECT_TRUE(find(wrong, "out").certain_failure && find(wrong, "p_null").certain_failure && find(wrong, "lse").certain_failure);
  // a naive kernel's NaN on the +inf head (exp(inf - inf)) is a FAIL naming the element
  io::TensorMap nan = out;
  nan.at("out").values[(1 * 6 + 2) * 8 + 3] = std::numeric_limits<double>::quiet_NaN();  // out[0, 1, 2, 3]
  const verify::CompareReport rn = check("attention", inputs(a), nan, R"({"causal": true})");
  ASSERT_FALSE(find(rn, "out").passed);
  EXPECT_EQ(find(rn, "out").first_mismatches.at(0).rfind("out[0, 1, 2, 3]: got nan", 0), 0u) << find(rn, "out").first_mismatches[0];
  // a NaN null logit is refused by name
  io::TensorMap bad = inputs(a);
  bad.at("null_logits").values[2] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(oasis::test::thrown_argument([&] { check("attention", bad, out, R"({"causal": true})"); }), "null_logits");
  oasis::AttentionOptions on = a.opt;
  on.null_logits[3] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(oasis::test::thrown_argument([&] { oasis::token_attention(a.q, a.k, a.v, on); }), "null_logits");
}

TEST(AttentionConventions, InfiniteNullLogitsInTheBackward) {
  const Att a = make_att(3204, {-kInf, kInf, 1.0, 0.0});
  auto rng = oasis::test::make_rng(3205);
  oasis::AttentionCotangents<float> d{oasis::test::randn<float>({1, 4, 6, 8}, rng),
                                      oasis::test::randn<float>({1, 4, 6}, rng), oasis::test::randn<float>({1, 4, 6}, rng)};
  const oasis::AttentionGrads<float> g = oasis::token_attention_backward(a.q, a.k, a.v, d, a.opt);
  EXPECT_EQ(g.null_logits[0], 0.0f);  // defined as 0 for an infinite null logit
  EXPECT_EQ(g.null_logits[1], 0.0f);
  EXPECT_NE(g.null_logits[2], 0.0f);
  // head 0 is plain softmax attention: its query gradient is plain softmax's
  oasis::AttentionOptions plain = a.opt;
  plain.normalizer = oasis::RowNorm::softmax;
  plain.null_logits.clear();
  const oasis::AttentionGrads<float> gs = oasis::token_attention_backward(a.q, a.k, a.v, d, plain);
  for (index_t i = 0; i < 6 * 8; ++i) EXPECT_EQ(g.q[i], gs.q[i]);
  for (index_t i = 6 * 8; i < 2 * 6 * 8; ++i) EXPECT_EQ(g.q[i], 0.0f);  // head 1: no mass on a key
  io::TensorMap in = inputs(a);
  in.emplace("grad_out", f32(d.out));
  in.emplace("grad_lse", f32(d.lse));
  in.emplace("grad_p_null", f32(d.p_null));
  io::TensorMap out{{"grad_q", f32(g.q)}, {"grad_k", f32(g.k)}, {"grad_v", f32(g.v)}, {"grad_null_logits", f32(g.null_logits)}};
  for (verify::Oracle o : {verify::Oracle::fast, verify::Oracle::mp50}) {
    const verify::CompareReport r = check("attention_backward", in, out, R"({"causal": true})", o);
    EXPECT_TRUE(r.passed) << verify::format_report(r);
  }
  out.at("grad_null_logits").values[1] = 0.25;  // the +inf head's gradient is 0, not anything else
  EXPECT_FALSE(find(check("attention_backward", in, out, R"({"causal": true})"), "grad_null_logits").passed);
}

TEST(AttentionConventions, TheLseGradientInEachConvention) {
  // grad_lse of an LSE in base 2 or over the keys only: a kernel's gradients (the reference backward
  // on the cotangents the convention gives LSE1 and p_null) pass under the convention's options
  // and fail under the default.
  const Att a = make_att(3206, {0.5, -1.0, 2.0, 0.0});
  auto rng = oasis::test::make_rng(3207);
  const Tensor<float> dout = oasis::test::randn<float>({1, 4, 6, 8}, rng), g = oasis::test::randn<float>({1, 4, 6}, rng);
  oasis::AttentionOptions o = a.opt;
  o.return_probs = true;
  const auto fwd = oasis::token_attention(a.q, a.k, a.v, o);
  for (int conv = 1; conv < 4; ++conv) {
    const bool keys = conv & 1, base2 = conv & 2;
    Tensor<float> dl({1, 4, 6}), dp({1, 4, 6});
    for (index_t r = 0; r < dl.size(); ++r) {
      dl[r] = base2 ? g[r] * 1.44269504f : g[r];
      double sum = 0;
      for (index_t j = 0; j < 9; ++j) sum += fwd.probs[r * 9 + j];
      if (keys) dp[r] = static_cast<float>(-dl[r] / sum);  // LSE_keys = LSE1 + log(sum_j p_j)
    }
    const oasis::AttentionGrads<float> gr = oasis::token_attention_backward(a.q, a.k, a.v, {dout, dl, dp}, a.opt);
    io::TensorMap in = inputs(a);
    in.emplace("grad_out", f32(dout));
    in.emplace("grad_lse", f32(g));
    const io::TensorMap out{{"grad_q", f32(gr.q)}, {"grad_k", f32(gr.k)}, {"grad_null_logits", f32(gr.null_logits)}};
    SCOPED_TRACE(kConventions[conv]);
    const verify::CompareReport r = check("attention_backward", in, out, kConventions[conv]);
    EXPECT_TRUE(r.passed) << verify::format_report(r);
    EXPECT_EQ(r.oracle.rfind("mp50", 0), 0u) << r.oracle;
    EXPECT_FALSE(check("attention_backward", in, out, kConventions[0]).passed);
  }
}

TEST(AttentionConventions, FastBackendsRefuseInfiniteNullLogitsByName) {
  // the cpu_fast kernels (and the CUDA ones, same check on the host) take finite null logits only
  const Att a = make_att(3208, {-kInf, 0.5, 1.0, 0.0});
  EXPECT_EQ(oasis::test::thrown_argument([&] { oasis::token_attention(oasis::Backend::cpu_fast, a.q, a.k, a.v, a.opt); }),
            "null_logits");
  const oasis::AttentionCotangents<float> d{Tensor<float>({1, 4, 6, 8}, 1.0f), {}, {}};
  EXPECT_EQ(oasis::test::thrown_argument(
                [&] { oasis::token_attention_backward(oasis::Backend::cpu_fast, a.q, a.k, a.v, d, a.opt); }),
            "null_logits");
  Att fin = a;
  fin.opt.null_logits[0] = -3.0;  // finite: accepted
  EXPECT_NO_THROW(oasis::token_attention(oasis::Backend::cpu_fast, fin.q, fin.k, fin.v, fin.opt));
}

TEST(AttentionConventions, TheNormalizerOpTakesTheSameOptions) {
  // rows of logits with null logits of every kind; lse over the keys only (plain softmax in float)
  auto rng = oasis::test::make_rng(3209);
  const Tensor<float> z = oasis::test::randn<float>({4, 7}, rng, 2.0f);
  const std::vector<double> s = {-kInf, kInf, 1.5, -0.5};
  Tensor<double> keys({4}), with({4}), s_t({4}, s);
  for (index_t r = 0; r < 4; ++r) {
    oasis::Vec<float> row(7);
    for (index_t j = 0; j < 7; ++j) row[j] = z(r, j);
    keys[r] = oasis::softmax(row).lse;
    with[r] = oasis::softmax_null(row, static_cast<float>(s[static_cast<std::size_t>(r)])).lse;
  }
  const io::TensorMap in{{"z", f32(z)}, {"s", {io::DType::f32, s_t}}};
  for (verify::Policy p : {verify::Policy::probabilistic, verify::Policy::worst_case}) {
    EXPECT_TRUE(check("normalizer", in, {{"lse", {io::DType::f32, with}}}, "{}", verify::Oracle::fast, p).passed);
    EXPECT_TRUE(check("normalizer", in, {{"lse", {io::DType::f32, keys}}}, R"({"lse_null": "excluded"})", verify::Oracle::fast, p)
                    .passed);
    EXPECT_FALSE(check("normalizer", in, {{"lse", {io::DType::f32, keys}}}, "{}", verify::Oracle::fast, p).passed);
  }
}

