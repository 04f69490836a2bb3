// tests/verify/test_attn_res.cpp — ops attn_res and attn_res_backward, the fused AttnRes routing
// (fla's naive_attnres: g_i = scale w^T RMSNorm(s_i), softmax over depth, h = sum_i alpha_i s_i;
// docs/verify.md, "Fused AttnRes routing"; bounds: docs/tolerances.md). A zoo of correct float
// implementations (the library's float functions composed; a fused single-pass kernel computing
// the logits, the softmax and the mix per token, scale folded into the query as fla does; the same
// kernel eager in bf16 as torch eager, every result rounded; d = 32 and 512) passes forward and
// backward under both policies; each mistake fails, named at the tensor it changes; the fast
// oracle gives mp50's verdicts; inconsistent calls are named errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <set>
#include <string>

#include "oasis/grad/grad.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"
#include "compare_test_util.hpp"

namespace verify = oasis::verify;
namespace io = oasis::io;
using oasis::index_t;
using oasis::Shape;
using oasis::Tensor;

using oasis::verify_test::describe_report;
using oasis::verify_test::failing_tensors;

namespace {

struct RouteSetup {
  std::string name;
  bool null = false, couple = false, dalpha = false;
  double scale = 0.7;
  index_t n = 5, N = 24, d = 32;
  std::string options() const {
    return std::string("{\"scale\": ") + std::to_string(scale) + ", \"eps\": 1e-6, \"normalizer\": \"" +
           (null ? "softmax1" : "softmax") + "\"" + (couple ? ", \"coupling\": true, \"beta\": 0.3" : "") + "}";
  }
};
const RouteSetup kFla{"fla"}, kNull{"softmax1", true, false, true, 1.3}, kOasis{"oasis", true, true, true, 1.0},
    kWide{"wide", false, false, false, 0.7, 5, 8, 512};

/// The inputs (rounded to `dt`) and the cotangents, as doubles.
struct Data {
  Tensor<double> s, w, gain, psi, dh, da, dan;
  io::DType dt = io::DType::f32;
};

Data make(const RouteSetup& st, io::DType dt = io::DType::f32, unsigned seed = 7) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  std::uniform_real_distribution<double> ud(0, 1);
  const index_t n = st.n, N = st.N, d = st.d;
  Data x{Tensor<double>({n, N, d}), Tensor<double>({d}), Tensor<double>({d}), Tensor<double>({n, N}),
         Tensor<double>({N, d}),    Tensor<double>({n, N}), Tensor<double>({N}), dt};
  auto r16 = [&](double v) { return io::round_to_dtype(static_cast<float>(v), dt); };
  for (index_t i = 0; i < n; ++i)
    for (index_t t = 0; t < N; ++t)
      for (index_t c = 0; c < d; ++c) x.s(i, t, c) = r16(nd(rng) * (1.0 + 0.5 * static_cast<double>(i)));
  for (index_t c = 0; c < d; ++c) {
    x.w[c] = r16(0.4 * nd(rng));
    x.gain[c] = r16(1.0 + 0.2 * nd(rng));
  }
  for (index_t i = 0; i < x.psi.size(); ++i) x.psi[i] = ud(rng);
  for (index_t i = 0; i < x.dh.size(); ++i) x.dh[i] = r16(nd(rng));
  for (index_t i = 0; i < x.da.size(); ++i) x.da[i] = st.dalpha ? nd(rng) : 0.0;
  for (index_t i = 0; i < x.dan.size(); ++i) x.dan[i] = st.dalpha ? nd(rng) : 0.0;
  return x;
}

io::TensorMap inputs(const RouteSetup& st, const Data& x, bool backward) {
  io::TensorMap m{{"sources", {x.dt, x.s}}, {"w", {x.dt, x.w}}, {"gain", {x.dt, x.gain}}};
  if (st.couple) m["psi"] = {io::DType::f32, x.psi};
  if (backward) {
    m["grad_h"] = {x.dt, x.dh};
    if (st.dalpha) {
      m["grad_alpha"] = {io::DType::f32, x.da};
      m["grad_alpha_null"] = {io::DType::f32, x.dan};
    }
  }
  return m;
}

enum class Mut { none, raw_dot, scale_twice, no_null, mix_only, keys_only, w_no_gain, drop_proj, gain_axis };

/// The library's float functions composed: pseudo_query_logits, x scale, attn_res_route (and their
/// backward, the sources' gradient the mix's part plus the keys').
io::TensorMap library(const RouteSetup& st, const Data& x, bool backward) {
  const Tensor<float> s = x.s.cast<float>(), w = x.w.cast<float>(), gn = x.gain.cast<float>(), p = x.psi.cast<float>();
  oasis::DepthOptions o;
  o.normalizer = st.null ? oasis::RowNorm::softmax1 : oasis::RowNorm::softmax;
  o.coupling = st.couple;
  o.beta = 0.3;
  std::vector<oasis::SourceKind> kinds(static_cast<std::size_t>(st.n), oasis::SourceKind::attention);
  kinds[0] = oasis::SourceKind::initial;  // the op's default kinds
  oasis::KeyNormOptions k;
  Tensor<float> g = oasis::pseudo_query_logits(s, w, gn, k);
  for (index_t i = 0; i < g.size(); ++i) g[i] *= static_cast<float>(st.scale);
  if (!backward) {
    const oasis::DepthRoute<float> f = oasis::attn_res_route(s, g, p, kinds, o);
    return {{"h", {io::DType::f32, f.h.cast<double>()}},
            {"alpha", {io::DType::f32, f.alpha.cast<double>()}},
            {"alpha_null", {io::DType::f32, f.alpha_null.cast<double>()}}};
  }
  const oasis::DepthCotangents<float> cot{x.dh.cast<float>(), st.dalpha ? x.da.cast<float>() : Tensor<float>(),
                                          st.dalpha ? x.dan.cast<float>() : Tensor<float>()};
  const oasis::DepthGrads<float> dr = oasis::attn_res_route_backward(s, g, p, kinds, o, cot);
  Tensor<float> dg = dr.g_old;
  for (index_t i = 0; i < dg.size(); ++i) dg[i] *= static_cast<float>(st.scale);
  const oasis::PseudoQueryGrads<float> kg = oasis::pseudo_query_logits_backward(s, w, gn, dg, k);
  Tensor<float> ds = dr.sources;
  for (index_t i = 0; i < ds.size(); ++i) ds[i] += kg.sources[i];
  return {{"grad_sources", {io::DType::f32, ds.cast<double>()}}, {"grad_w", {io::DType::f32, kg.w.cast<double>()}},
          {"grad_gain", {io::DType::f32, kg.gain.cast<double>()}}, {"grad_psi", {io::DType::f32, dr.psi.cast<double>()}},
          {"grad_beta", {io::DType::f32, Tensor<double>(Shape{1}, {dr.beta})}},
          {"grad_theta", {io::DType::f32, Tensor<double>(Shape{1}, {dr.theta})}}};
}

/// A fused single-pass kernel (no coupling): per token the logits (scale folded into the query, as
/// fla), the softmax (softmax1: the null's e^{-max}), the mix and, backward, the whole chain;
/// every elementwise result and every sum's result rounded by `R` (float, or bf16 for the member
/// eager in 16 bits, as torch eager: the sums accumulated in float32, each stored once). `m`
/// injects one mistake.
template <class Round>
io::TensorMap fused(const RouteSetup& st, const Data& x, bool backward, Round R, Mut m = Mut::none) {
  const index_t n = st.n, N = st.N, d = st.d;
  const float eps = 1e-6f, sc = static_cast<float>(st.scale);
  Tensor<double> h({N, d}), al({n, N}), an({N}), ds({n, N, d}), dw({d}), dgn({d});
  std::vector<float> q(static_cast<std::size_t>(d));
  for (index_t c = 0; c < d; ++c) {
    q[c] = R(static_cast<float>(x.w[c]) * sc);
    if (m == Mut::scale_twice) q[c] = R(q[c] * sc);
  }
  std::vector<float> inv(static_cast<std::size_t>(n)), g(inv.size()), a(inv.size()), da(inv.size());
  for (index_t t = 0; t < N; ++t) {
    auto xs = [&](index_t i, index_t c) { return static_cast<float>(x.s(i, t, c)); };
    auto xhat = [&](index_t i, index_t c) { return R(xs(i, c) * inv[i]); };
    float mx = st.null && m != Mut::no_null ? 0.0f : -INFINITY;
    for (index_t i = 0; i < n; ++i) {
      float ss = 0, dot = 0;
      for (index_t c = 0; c < d; ++c) ss += R(xs(i, c) * xs(i, c));
      inv[i] = R(1.0f / R(std::sqrt(R(R(R(ss) / static_cast<float>(d)) + eps))));
      for (index_t c = 0; c < d; ++c) {
        const float k = m == Mut::raw_dot ? xs(i, c) : R(xhat(i, c) * static_cast<float>(x.gain[c]));
        dot += R(k * q[c]);
      }
      g[i] = dot = R(dot);
      mx = std::max(mx, dot);
    }
    float S = st.null && m != Mut::no_null ? R(std::exp(-mx)) : 0.0f;
    for (index_t i = 0; i < n; ++i) S += (a[i] = R(std::exp(R(g[i] - mx))));
    S = R(S);
    for (index_t i = 0; i < n; ++i) al(i, t) = a[i] = R(a[i] / S);
    const float a0 = st.null && m != Mut::no_null ? R(R(std::exp(-mx)) / S) : 0.0f;
    an[t] = a0;
    for (index_t c = 0; c < d; ++c) {
      float acc = 0;
      for (index_t i = 0; i < n; ++i) acc += R(a[i] * xs(i, c));
      h(t, c) = R(acc);
    }
    if (!backward) continue;
    float D = R(a0 * static_cast<float>(x.dan[t]));
    for (index_t i = 0; i < n; ++i) {
      float acc = static_cast<float>(x.da(i, t));
      for (index_t c = 0; c < d; ++c) acc += R(static_cast<float>(x.dh(t, c)) * xs(i, c));
      da[i] = acc = R(acc);
      D += R(a[i] * acc);
    }
    D = R(D);
    for (index_t i = 0; i < n; ++i) {
      const float dg = R(a[i] * R(da[i] - D));
      float mm = 0;
      std::vector<float> dxh(static_cast<std::size_t>(d));
      for (index_t c = 0; c < d; ++c) {
        const float xh = xhat(i, c), gc = static_cast<float>(x.gain[c]), dy = R(dg * q[c]);
        dw[c] += R(dg * (m == Mut::w_no_gain ? xh : R(xh * gc)));
        if (m != Mut::gain_axis || t == 0) dgn[c] += R(dy * xh);
        dxh[c] = R(dy * gc);
        mm += R(dxh[c] * xh);
      }
      mm = R(R(mm) / static_cast<float>(d));
      for (index_t c = 0; c < d; ++c) {
        const float keys = m == Mut::drop_proj ? R(inv[i] * dxh[c]) : R(inv[i] * R(dxh[c] - R(xhat(i, c) * mm)));
        const float mix = R(a[i] * static_cast<float>(x.dh(t, c)));
        ds(i, t, c) = m == Mut::mix_only ? mix : m == Mut::keys_only ? keys : R(keys + mix);
      }
    }
  }
  const io::DType od = x.dt;
  if (!backward) return {{"h", {od, h}}, {"alpha", {io::DType::f32, al}}, {"alpha_null", {io::DType::f32, an}}};
  for (index_t c = 0; c < d; ++c) {  // dw = scale sum dg y; the sums over rows in float, rounded once
    dw[c] = R(R(static_cast<float>(dw[c])) * sc);
    dgn[c] = R(static_cast<float>(dgn[c]));
  }
  return {{"grad_sources", {od, ds}}, {"grad_w", {od, dw}}, {"grad_gain", {od, dgn}},
          {"grad_psi", {io::DType::f32, Tensor<double>({n, N})}}};
}

float as_float(float v) { return v; }
float as_bf16(float v) { return static_cast<float>(io::round_to_dtype(v, io::DType::bf16)); }

verify::CompareReport check(const std::string& op, const RouteSetup& st, const io::TensorMap& in, const io::TensorMap& out,
                            verify::Oracle oracle = verify::Oracle::fast, verify::Policy p = verify::Policy::probabilistic) {
  verify::CompareOptions co;
  co.oracle = oracle;
  co.policy = p;
  return verify::check(op, in, out, io::json::parse(st.options()), co);
}


/// One member: its setup, input type and outputs.
struct Member {
  std::string name;
  RouteSetup st;
  io::DType dt;
  std::function<io::TensorMap(const RouteSetup&, const Data&, bool)> run;
};

std::vector<Member> zoo() {
  auto fz = [](const RouteSetup& s, const Data& x, bool b) { return fused(s, x, b, as_float); };
  auto bz = [](const RouteSetup& s, const Data& x, bool b) { return fused(s, x, b, as_bf16); };
  return {{"library fla", kFla, io::DType::f32, library},      {"library softmax1", kNull, io::DType::f32, library},
          {"library oasis", kOasis, io::DType::f32, library},  {"fused fla", kFla, io::DType::f32, fz},
          {"fused softmax1", kNull, io::DType::f32, fz},       {"bf16 eager fla", kFla, io::DType::bf16, bz},
          {"bf16 eager softmax1", kNull, io::DType::bf16, bz}, {"fused fla d=512", kWide, io::DType::f32, fz},
          {"bf16 eager fla d=512", kWide, io::DType::bf16, bz}};
}

}  // namespace

TEST(AttnRes, CorrectFusedImplementationsPass) {
  for (const Member& m : zoo())
    for (const verify::Policy p : {verify::Policy::probabilistic, verify::Policy::worst_case})
      for (const bool bw : {false, true}) {
        const Data x = make(m.st, m.dt);
        const verify::CompareReport r =
            check(bw ? "attn_res_backward" : "attn_res", m.st, inputs(m.st, x, bw), m.run(m.st, x, bw), verify::Oracle::fast, p);
        EXPECT_TRUE(r.passed) << m.name << (bw ? " backward" : " forward")
                              << (p == verify::Policy::worst_case ? " worst_case" : " probabilistic") << "\n" << describe_report(r);
      }
}

namespace {
struct Mutant {
  std::string name;
  RouteSetup st;
  Mut m;
  bool backward;
  std::set<std::string> fails;
};
std::vector<Mutant> mutants() {
  return {{"logits without the RMSNorm", kFla, Mut::raw_dot, false, {"alpha", "h"}},
          {"scale applied twice", kFla, Mut::scale_twice, false, {"alpha", "h"}},
          {"softmax without the null", kNull, Mut::no_null, false, {"alpha", "alpha_null", "h"}},
          {"grad_sources: the mix only", kFla, Mut::mix_only, true, {"grad_sources"}},
          {"grad_sources: the keys only", kFla, Mut::keys_only, true, {"grad_sources"}},
          {"grad_w without the gain", kFla, Mut::w_no_gain, true, {"grad_w"}},
          {"the RMSNorm's projection dropped", kNull, Mut::drop_proj, true, {"grad_sources"}},
          {"grad_gain over the wrong axis", kFla, Mut::gain_axis, true, {"grad_gain"}}};
}
}  // namespace

TEST(AttnRes, MistakesFailAtTheirTensor) {
  for (const Mutant& mu : mutants()) {
    const Data x = make(mu.st);
    const std::string op = mu.backward ? "attn_res_backward" : "attn_res";
    const verify::CompareReport r =
        check(op, mu.st, inputs(mu.st, x, mu.backward), fused(mu.st, x, mu.backward, as_float, mu.m));
    EXPECT_FALSE(r.passed) << mu.name;
    EXPECT_EQ(failing_tensors(r), mu.fails) << mu.name << "\n" << describe_report(r);
  }
}

TEST(AttnRes, FastOracleGivesMp50Verdicts) {
  std::vector<std::pair<std::string, std::pair<RouteSetup, std::function<io::TensorMap(const Data&, bool)>>>> cases;
  for (const Member& m : zoo())
    if (m.dt == io::DType::f32) cases.push_back({m.name, {m.st, [m](const Data& x, bool b) { return m.run(m.st, x, b); }}});
  for (const Mutant& mu : mutants())
    cases.push_back({mu.name, {mu.st, [mu](const Data& x, bool b) { return fused(mu.st, x, b, as_float, mu.m); }}});
  for (const auto& [name, c] : cases)
    for (const bool bw : {false, true}) {
      const Data x = make(c.first);
      const io::TensorMap in = inputs(c.first, x, bw), out = c.second(x, bw);
      const std::string op = bw ? "attn_res_backward" : "attn_res";
      const verify::CompareReport f = check(op, c.first, in, out), e = check(op, c.first, in, out, verify::Oracle::mp50);
      EXPECT_EQ(f.passed, e.passed) << name << " " << op << "\nfast: " << describe_report(f) << "\nmp50: " << describe_report(e);
      EXPECT_EQ(failing_tensors(f), failing_tensors(e)) << name << " " << op;
    }
}

TEST(AttnRes, InconsistentCallsAreNamedErrors) {
  const Data x = make(kOasis);
  const io::TensorMap good = inputs(kOasis, x, true), out = library(kOasis, x, true);
  auto expect_error = [&](const io::TensorMap& in, const io::TensorMap& o, const std::string& options,
                          const std::string& name, const std::string& op = "attn_res_backward") {
    oasis::verify_test::expect_named_error(op, in, o, options, name);
  };
  auto with = [&](const std::string& t, Shape sh) {
    io::TensorMap in = good;
    in[t] = io::StoredTensor{io::DType::f32, Tensor<double>(std::move(sh), 0.5)};
    return in;
  };
  const std::string opt = kOasis.options();
  expect_error(with("w", {31}), out, opt, "w");
  expect_error(with("gain", {32, 1}), out, opt, "gain");
  expect_error(with("sources", {5, 24}), out, opt, "sources");
  expect_error(with("psi", {4, 24}), out, opt, "psi");
  expect_error(with("grad_h", {24, 31}), out, opt, "grad_h");
  expect_error(with("grad_alpha", {5, 23}), out, opt, "grad_alpha");
  expect_error(with("grad_alpha_null", {23}), out, opt, "grad_alpha_null");
  io::TensorMap no_psi = good;
  no_psi.erase("psi");
  expect_error(no_psi, out, opt, "psi");
  expect_error(good, out, R"({"coupling": false})", "psi");
  expect_error(good, out, R"({"coupling": true, "kinds": ["initial", "attention"]})", "kinds");
  expect_error(good, out, R"({"coupling": true, "eps": 0})", "eps");
  io::TensorMap no_gain = good;
  no_gain.erase("gain");
  expect_error(no_gain, out, opt, "grad_gain");
  expect_error(with("w", {31}), library(kOasis, x, false), opt, "w", "attn_res");
}

TEST(AttnRes, SampledTokens) {
  // --sample draws tokens: the forward checks only those, and says so
  const Data x = make(kNull);
  verify::CompareOptions co;
  co.sample = 6;
  const verify::CompareReport r = verify::check("attn_res", inputs(kNull, x, false), library(kNull, x, false),
                                                io::json::parse(kNull.options()), co);
  EXPECT_TRUE(r.passed) << describe_report(r);
  EXPECT_EQ(r.sample.rows, 6);
  EXPECT_EQ(r.sample.total, kNull.N);
}
