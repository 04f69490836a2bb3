// tests/verify/test_block_attn_res.cpp — ops block_attn_res and block_attn_res_backward, Block
// AttnRes (Kimi, Eq. 5-6): layer i of block n routes over the block summaries b_0 .. b_{n-1} and,
// after the block's first layer, the partial sum b_n^{i-1} (docs/verify.md, "Block AttnRes"). A
// float kernel written as Kimi's block_attn_res (stack blocks + [partial], RMSNorm in float, the
// softmax over depth, the mix; backward by hand) and the library's float functions composed on the
// stack (softmax1 with OASIS's psi coupling) pass forward and backward, with and without a partial,
// with and without the gain, with one block, in bf16; each mistake of a block kernel FAILs at the
// tensor it changes; the split of grad_sources into grad_blocks and grad_partial keeps every
// verdict of attn_res_backward on the stacked sources; the fast oracle gives mp50's verdicts;
// inconsistent calls are named errors; the fuzzer's block regimes leave the float reference clean
// and find two block mistakes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <set>
#include <string>

#include "oasis/grad/grad.hpp"
#include "oasis/oasis.hpp"
#include "oasis/verify/compare.hpp"
#include "compare_test_util.hpp"
#include "oasis/verify/fuzz.hpp"

namespace verify = oasis::verify;
namespace io = oasis::io;
using oasis::index_t;
using oasis::Shape;
using oasis::Tensor;

using oasis::verify_test::describe_report;
using oasis::verify_test::failing_tensors;

namespace {

struct BlockSetup {
  std::string name;
  bool partial = true, gain = true, null = false, couple = false, dalpha = false;
  double scale = 1.0;  // Kimi's block_attn_res has no scale
  index_t m = 3, N = 24, d = 32;
  io::DType dt = io::DType::f32;  ///< the inputs' and the kernel's outputs' type (bf16: torch under autocast)
  index_t n() const { return m + (partial ? 1 : 0); }
  std::string options() const {
    return std::string("{\"scale\": ") + std::to_string(scale) + ", \"eps\": 1e-6, \"normalizer\": \"" +
           (null ? "softmax1" : "softmax") + "\"" + (couple ? ", \"coupling\": true, \"beta\": 0.3" : "") + "}";
  }
};
const BlockSetup kKimi{"kimi"}, kFirst{"first layer of a block", false}, kNoGain{"no gain", true, false},
    kOneBlock{"one block", true, true, false, false, false, 1.0, 1}, kNull{"softmax1", true, true, true, false, true, 1.3},
    kOasis{"oasis", true, true, true, true, true}, kOasisFirst{"oasis first layer", false, true, true, true, true},
    kBf16{"bf16", true, true, false, false, false, 1.0, 3, 24, 32, io::DType::bf16};

/// The inputs (rounded to the setup's type) and the cotangents, as doubles; sources grow with depth as
/// block summaries do (a block's sum over its sublayers).
struct Data {
  Tensor<double> blocks, partial, w, gain, psi, dh, da, dan;
};

Data make(const BlockSetup& st, unsigned seed = 11) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  std::uniform_real_distribution<double> ud(0, 1);
  const index_t m = st.m, N = st.N, d = st.d, n = st.n();
  Data x{Tensor<double>({m, N, d}), Tensor<double>({N, d}), Tensor<double>({d}),   Tensor<double>({d}),
         Tensor<double>({n, N}),    Tensor<double>({N, d}), Tensor<double>({n, N}), Tensor<double>({N})};
  auto f = [&](double v) { return io::round_to_dtype(static_cast<float>(v), st.dt); };
  for (index_t i = 0; i < m; ++i)
    for (index_t t = 0; t < N; ++t)
      for (index_t c = 0; c < d; ++c) x.blocks(i, t, c) = f(nd(rng) * (1.0 + 0.5 * static_cast<double>(i)));
  for (index_t i = 0; i < x.partial.size(); ++i) x.partial[i] = f(0.7 * nd(rng));
  for (index_t c = 0; c < d; ++c) {
    x.w[c] = f(0.4 * nd(rng));
    x.gain[c] = f(1.0 + 0.2 * nd(rng));
  }
  for (index_t i = 0; i < x.psi.size(); ++i) x.psi[i] = ud(rng);
  for (index_t i = 0; i < x.dh.size(); ++i) x.dh[i] = f(nd(rng));
  for (index_t i = 0; i < x.da.size(); ++i) x.da[i] = st.dalpha ? nd(rng) : 0.0;
  for (index_t i = 0; i < x.dan.size(); ++i) x.dan[i] = st.dalpha ? nd(rng) : 0.0;
  return x;
}

io::TensorMap inputs(const BlockSetup& st, const Data& x, bool backward) {
  const io::DType f = st.dt;
  io::TensorMap m{{"blocks", {f, x.blocks}}, {"w", {f, x.w}}};
  if (st.partial) m["partial"] = {f, x.partial};
  if (st.gain) m["gain"] = {f, x.gain};
  if (st.couple) m["psi"] = {io::DType::f32, x.psi};
  if (backward) {
    m["grad_h"] = {f, x.dh};
    if (st.dalpha) {
      m["grad_alpha"] = {io::DType::f32, x.da};
      m["grad_alpha_null"] = {io::DType::f32, x.dan};
    }
  }
  return m;
}

/// Kimi's torch.stack(blocks + [partial_block]) as one [n, N, d] tensor (`first`: the partial first).
Tensor<double> stacked(const BlockSetup& st, const Data& x, bool first = false) {
  Tensor<double> s({st.n(), st.N, st.d});
  const index_t row = st.N * st.d, off = first && st.partial ? row : 0;
  std::copy(x.blocks.data(), x.blocks.data() + x.blocks.size(), s.data() + off);
  if (st.partial) std::copy(x.partial.data(), x.partial.data() + row, s.data() + (first ? 0 : st.m * row));
  return s;
}

/// `t` stored in the setup's type (rounded once, as a kernel computing in float and storing in
/// its inputs' type).
io::StoredTensor store(const BlockSetup& st, Tensor<double> t) {
  for (index_t i = 0; i < t.size(); ++i) t[i] = io::round_to_dtype(static_cast<float>(t[i]), st.dt);
  return {st.dt, std::move(t)};
}

/// grad_blocks and grad_partial of a stacked [n, N, d] gradient.
void split_into(io::TensorMap& out, const BlockSetup& st, const Tensor<double>& ds) {
  const index_t row = st.N * st.d;
  Tensor<double> gb({st.m, st.N, st.d}), gp({st.N, st.d});
  std::copy(ds.data(), ds.data() + st.m * row, gb.data());
  out["grad_blocks"] = store(st, gb);
  if (!st.partial) return;
  std::copy(ds.data() + st.m * row, ds.data() + (st.m + 1) * row, gp.data());
  out["grad_partial"] = store(st, gp);
}

enum class Mut { none, no_partial, partial_first, detach_blocks, partial_mix_only, wrong_block };

/// A float kernel as Kimi's block_attn_res: V = stack(blocks + [partial]), K = RMSNorm(V) (times
/// the gain), logits scale w^T K, softmax over depth (softmax1: the null's e^{-max}), h = sum alpha V;
/// backward by hand through the mix and through the keys (no coupling). `mu` injects one mistake.
io::TensorMap kimi(const BlockSetup& st, const Data& x, bool backward, Mut mu = Mut::none) {
  const bool drop = mu == Mut::no_partial;
  const index_t n = drop ? st.m : st.n(), N = st.N, d = st.d;
  const Tensor<double> V = stacked(st, x);
  const float eps = 1e-6f, sc = static_cast<float>(st.scale);
  auto gain = [&](index_t c) { return st.gain ? static_cast<float>(x.gain[c]) : 1.0f; };
  Tensor<double> h({N, d}), al({n, N}), an({N}), ds({st.n(), N, d}), dw({d}), dgn({d});
  std::vector<float> inv(static_cast<std::size_t>(n)), g(inv.size()), a(inv.size()), da(inv.size());
  for (index_t t = 0; t < N; ++t) {
    auto v = [&](index_t i, index_t c) { return static_cast<float>(V(i, t, c)); };
    auto vhat = [&](index_t i, index_t c) { return v(i, c) * inv[i]; };
    float mx = st.null ? 0.0f : -INFINITY;
    for (index_t i = 0; i < n; ++i) {
      float ss = 0, dot = 0;
      for (index_t c = 0; c < d; ++c) ss += v(i, c) * v(i, c);
      inv[i] = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
      for (index_t c = 0; c < d; ++c) dot += vhat(i, c) * gain(c) * static_cast<float>(x.w[c]);
      g[i] = sc * dot;
      mx = std::max(mx, g[i]);
    }
    const float e0 = st.null ? std::exp(-mx) : 0.0f;
    float S = e0;
    for (index_t i = 0; i < n; ++i) S += (a[i] = std::exp(g[i] - mx));
    for (index_t i = 0; i < n; ++i) a[i] /= S;
    an[t] = e0 / S;
    for (index_t i = 0; i < n; ++i) {  // the partial's weight is the last row, unless the mistake puts it first
      const index_t row = mu == Mut::partial_first && st.partial ? (i + 1) % n : i;
      al(row, t) = a[i];
    }
    for (index_t c = 0; c < d; ++c) {
      float acc = 0;
      for (index_t i = 0; i < n; ++i) acc += a[i] * v(i, c);
      h(t, c) = acc;
    }
    if (!backward) continue;
    // dL/dg_i = alpha_i (dL/dalpha_i - D), dL/dalpha_i = grad_alpha_i + <grad_h, v_i>, D = sum_j
    // alpha_j dL/dalpha_j + alpha_null grad_alpha_null (softmax and softmax1 alike)
    float D = static_cast<float>(an[t]) * static_cast<float>(x.dan[t]);
    for (index_t i = 0; i < n; ++i) {
      float acc = static_cast<float>(x.da(i, t));
      for (index_t c = 0; c < d; ++c) acc += static_cast<float>(x.dh(t, c)) * v(i, c);
      da[i] = acc;
      D += a[i] * acc;
    }
    for (index_t i = 0; i < n; ++i) {
      const float dg = sc * a[i] * (da[i] - D);
      // the RMSNorm's backward: dv = inv (dvhat - vhat mean(dvhat vhat)), dvhat = dg w gain
      float mm = 0;
      for (index_t c = 0; c < d; ++c) {
        const float dvh = dg * static_cast<float>(x.w[c]) * gain(c);
        dw[c] += dg * vhat(i, c) * gain(c);
        dgn[c] += dg * static_cast<float>(x.w[c]) * vhat(i, c);
        mm += dvh * vhat(i, c);
      }
      mm /= static_cast<float>(d);
      const bool block = i < st.m;
      const bool mix_only = (mu == Mut::detach_blocks && block) || (mu == Mut::partial_mix_only && !block);
      for (index_t c = 0; c < d; ++c) {
        const float keys = inv[i] * (dg * static_cast<float>(x.w[c]) * gain(c) - vhat(i, c) * mm);
        const float mix = a[i] * static_cast<float>(x.dh(t, c));
        const float total = mix_only ? mix : keys + mix;
        // the mistake: block m-1's gradient accumulated into block m-2
        const index_t into = mu == Mut::wrong_block && i == st.m - 1 ? i - 1 : i;
        ds(into, t, c) += total;
      }
    }
  }
  if (!backward) return {{"h", store(st, h)}, {"alpha", {io::DType::f32, al}}, {"alpha_null", {io::DType::f32, an}}};
  io::TensorMap out{{"grad_w", store(st, dw)}};
  if (st.gain) out["grad_gain"] = store(st, dgn);
  split_into(out, st, ds);
  return out;
}

/// The library's float functions composed on Kimi's stack: pseudo_query_logits x scale,
/// attn_res_route (softmax1, OASIS's psi coupling) and their backward.
io::TensorMap library(const BlockSetup& st, const Data& x, bool backward) {
  const Tensor<float> s = stacked(st, x).cast<float>(), w = x.w.cast<float>(), p = x.psi.cast<float>();
  const Tensor<float> gn = st.gain ? x.gain.cast<float>() : Tensor<float>();
  oasis::DepthOptions o;
  o.normalizer = st.null ? oasis::RowNorm::softmax1 : oasis::RowNorm::softmax;
  o.coupling = st.couple;
  o.beta = 0.3;
  std::vector<oasis::SourceKind> kinds(static_cast<std::size_t>(st.n()), oasis::SourceKind::attention);
  kinds[0] = oasis::SourceKind::initial;  // b_0, the embedding (the op's default kinds)
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
  io::TensorMap out{{"grad_w", {io::DType::f32, kg.w.cast<double>()}}};
  if (st.gain) out["grad_gain"] = {io::DType::f32, kg.gain.cast<double>()};
  if (st.couple) {
    out["grad_psi"] = {io::DType::f32, dr.psi.cast<double>()};
    out["grad_beta"] = {io::DType::f32, Tensor<double>(Shape{1}, {dr.beta})};
  }
  split_into(out, st, ds.cast<double>());
  return out;
}

verify::CompareReport check(const std::string& op, const BlockSetup& st, const io::TensorMap& in, const io::TensorMap& out,
                            verify::Oracle oracle = verify::Oracle::fast, verify::Policy p = verify::Policy::probabilistic) {
  verify::CompareOptions co;
  co.oracle = oracle;
  co.policy = p;
  return verify::check(op, in, out, io::json::parse(st.options()), co);
}


struct Member {
  std::string name;
  BlockSetup st;
  std::function<io::TensorMap(const BlockSetup&, const Data&, bool)> run;
};

std::vector<Member> zoo() {
  auto k = [](const BlockSetup& s, const Data& x, bool b) { return kimi(s, x, b); };
  return {{"kimi", kKimi, k},
          {"kimi, first layer of a block", kFirst, k},
          {"kimi, no gain", kNoGain, k},
          {"kimi, one block", kOneBlock, k},
          {"kimi softmax1", kNull, k},
          {"kimi, bf16 inputs and outputs", kBf16, k},
          {"library oasis", kOasis, library},
          {"library oasis, first layer", kOasisFirst, library}};
}

}  // namespace

TEST(BlockAttnRes, CorrectKernelsPass) {
  for (const Member& m : zoo())
    for (const verify::Policy p : {verify::Policy::probabilistic, verify::Policy::worst_case})
      for (const bool bw : {false, true}) {
        const Data x = make(m.st);
        const verify::CompareReport r = check(bw ? "block_attn_res_backward" : "block_attn_res", m.st,
                                              inputs(m.st, x, bw), m.run(m.st, x, bw), verify::Oracle::fast, p);
        EXPECT_TRUE(r.passed) << m.name << (bw ? " backward" : " forward")
                              << (p == verify::Policy::worst_case ? " worst_case" : " probabilistic") << "\n" << describe_report(r);
        std::set<std::string> names;
        for (const auto& t : r.tensors) names.insert(t.name);
        if (bw) {  // the report names the block op's tensors
          EXPECT_TRUE(names.count("grad_blocks")) << m.name;
          EXPECT_EQ(names.count("grad_partial"), m.st.partial ? 1u : 0u) << m.name;
          EXPECT_FALSE(names.count("grad_sources")) << m.name;
        }
      }
}

namespace {
struct Mutant {
  std::string name;
  Mut m;
  bool backward;
  std::set<std::string> fails;
};
std::vector<Mutant> mutants() {
  return {{"partial omitted from the sources", Mut::no_partial, false, {"alpha", "h"}},
          {"the partial's weight first, not last", Mut::partial_first, false, {"alpha"}},
          {"block summaries detached in the keys (grad_blocks the mix only)", Mut::detach_blocks, true, {"grad_blocks"}},
          {"grad_partial the mix only", Mut::partial_mix_only, true, {"grad_partial"}},
          {"a block's gradient accumulated into the block before", Mut::wrong_block, true, {"grad_blocks"}}};
}
}  // namespace

TEST(BlockAttnRes, MistakesFailAtTheirTensor) {
  for (const Mutant& mu : mutants()) {
    const Data x = make(kKimi);
    const std::string op = mu.backward ? "block_attn_res_backward" : "block_attn_res";
    const verify::CompareReport r = check(op, kKimi, inputs(kKimi, x, mu.backward), kimi(kKimi, x, mu.backward, mu.m));
    EXPECT_FALSE(r.passed) << mu.name;
    EXPECT_EQ(failing_tensors(r), mu.fails) << mu.name << "\n" << describe_report(r);
  }
}

TEST(BlockAttnRes, FastOracleGivesMp50Verdicts) {
  std::vector<std::pair<std::string, Member>> cases;
  for (const Member& m : zoo()) cases.push_back({m.name, m});
  for (const Mutant& mu : mutants())
    cases.push_back({mu.name, {mu.name, kKimi, [mu](const BlockSetup& s, const Data& x, bool b) { return kimi(s, x, b, mu.m); }}});
  for (const auto& [name, c] : cases)
    for (const bool bw : {false, true}) {
      const Data x = make(c.st);
      const io::TensorMap in = inputs(c.st, x, bw), out = c.run(c.st, x, bw);
      const std::string op = bw ? "block_attn_res_backward" : "block_attn_res";
      const verify::CompareReport f = check(op, c.st, in, out), e = check(op, c.st, in, out, verify::Oracle::mp50);
      EXPECT_EQ(f.passed, e.passed) << name << " " << op << "\nfast: " << describe_report(f) << "\nmp50: " << describe_report(e);
      EXPECT_EQ(failing_tensors(f), failing_tensors(e)) << name << " " << op;
    }
}

TEST(BlockAttnRes, SplitKeepsAttnResVerdicts) {
  // grad_blocks and grad_partial are attn_res_backward's grad_sources on the stack, row for row:
  // the same elements checked, the same violations, the worse part's ratio the stacked one's
  for (const Mut mu : {Mut::none, Mut::partial_mix_only, Mut::detach_blocks}) {
    const Data x = make(kKimi);
    const io::TensorMap bo = kimi(kKimi, x, true, mu);
    const verify::CompareReport b = check("block_attn_res_backward", kKimi, inputs(kKimi, x, true), bo);
    io::TensorMap ai = inputs(kKimi, x, true), ao = bo;
    ai.erase("blocks");
    ai.erase("partial");
    ai["sources"] = {io::DType::f32, stacked(kKimi, x)};
    Tensor<double> gs({kKimi.n(), kKimi.N, kKimi.d});
    const Tensor<double>&gb = bo.at("grad_blocks").values, &gp = bo.at("grad_partial").values;
    std::copy(gb.data(), gb.data() + gb.size(), gs.data());
    std::copy(gp.data(), gp.data() + gp.size(), gs.data() + gb.size());
    ao.erase("grad_blocks");
    ao.erase("grad_partial");
    ao["grad_sources"] = {io::DType::f32, gs};
    const verify::CompareReport a = check("attn_res_backward", kKimi, ai, ao);
    EXPECT_EQ(a.passed, b.passed) << describe_report(a) << "\n" << describe_report(b);
    const verify::TensorReport* whole = nullptr;
    for (const auto& t : a.tensors)
      if (t.name == "grad_sources") whole = &t;
    ASSERT_NE(whole, nullptr);
    index_t checked = 0, violations = 0;
    double worst = 0;
    for (const auto& t : b.tensors)
      if (t.name == "grad_blocks" || t.name == "grad_partial") {
        checked += t.checked;
        violations += t.violations;
        worst = std::max(worst, t.worst_ratio);
      } else {
        for (const auto& u : a.tensors)
          if (u.name == t.name) EXPECT_EQ(u.worst_ratio, t.worst_ratio) << t.name;
      }
    EXPECT_EQ(checked, whole->checked);
    EXPECT_EQ(violations, whole->violations);
    EXPECT_EQ(worst, whole->worst_ratio);
  }
}

TEST(BlockAttnRes, InconsistentCallsAreNamedErrors) {
  const Data x = make(kOasis);
  const io::TensorMap good = inputs(kOasis, x, true), out = library(kOasis, x, true);
  auto expect_error = [&](const io::TensorMap& in, const io::TensorMap& o, const std::string& options,
                          const std::string& name, const std::string& op = "block_attn_res_backward") {
    oasis::verify_test::expect_named_error(op, in, o, options, name);
  };
  auto with = [&](const std::string& t, Shape sh) {
    io::TensorMap in = good;
    in[t] = io::StoredTensor{io::DType::f32, Tensor<double>(std::move(sh), 0.5)};
    return in;
  };
  const std::string opt = kOasis.options();
  const index_t m = kOasis.m, N = kOasis.N, d = kOasis.d;
  expect_error(with("partial", {N, d + 1}), out, opt, "partial");
  expect_error(with("partial", {1, N, d}), out, opt, "partial");
  expect_error(with("blocks", {m, N}), out, opt, "blocks");
  expect_error(with("blocks", {0, N, d}), out, opt, "blocks");
  expect_error(with("psi", {m, N}), out, opt, "psi");  // with a partial: m + 1 rows
  expect_error(with("psi", {m + 2, N}), out, opt, "psi");
  expect_error(with("grad_alpha", {m, N}), out, opt, "grad_alpha");
  expect_error(with("w", {d - 1}), out, opt, "w");
  expect_error(with("gain", {d + 1}), out, opt, "gain");
  expect_error(with("grad_h", {N, d - 1}), out, opt, "grad_h");
  expect_error(good, out, R"({"coupling": true, "kinds": ["initial", "attention", "attention"]})", "kinds");
  io::TensorMap no_partial = good;  // the first layer of a block: psi has m rows
  no_partial.erase("partial");
  expect_error(no_partial, out, opt, "psi");
  no_partial["psi"] = {io::DType::f32, Tensor<double>({m, N}, 0.5)};
  no_partial["grad_alpha"] = {io::DType::f32, Tensor<double>({m, N}, 0.5)};
  expect_error(no_partial, out, opt, "grad_partial");
  io::TensorMap bad_value = good;
  bad_value["partial"].values[3] = INFINITY;
  expect_error(bad_value, out, opt, "partial");
  expect_error(with("partial", {N + 1, d}), kimi(kKimi, make(kKimi), false), kKimi.options(), "partial", "block_attn_res");
}

TEST(BlockAttnRes, SampledTokens) {
  const Data x = make(kNull);
  verify::CompareOptions co;
  co.sample = 6;
  const verify::CompareReport r = verify::check("block_attn_res", inputs(kNull, x, false), kimi(kNull, x, false),
                                                io::json::parse(kNull.options()), co);
  EXPECT_TRUE(r.passed) << describe_report(r);
  EXPECT_EQ(r.sample.rows, 6);
  EXPECT_EQ(r.sample.total, kNull.N);
}

namespace {
namespace fz = oasis::verify::fuzz;

/// Fuzz `op` (f32, regime block_typical) with a kernel whose outputs `bend` changes.
fz::FuzzReport fuzz_block(const std::string& op, const std::function<void(const io::TensorMap&, io::TensorMap&)>& bend) {
  const fz::Kernel ref = fz::reference_kernel(op), fwd = fz::reference_kernel("block_attn_res");
  const fz::Kernel k = [=](const io::TensorMap& in, const io::json::Value& o) {
    io::TensorMap out = ref(in, o);
    if (in.count("partial")) {
      io::TensorMap both = fwd(in, o);
      both.insert(out.begin(), out.end());
      bend(in, both);
      for (auto& [name, t] : out) t = both.at(name);
    }
    return out;
  };
  fz::FuzzOptions opt;
  opt.only = {"block_typical"};
  opt.max_shrink_runs = 40;
  opt.replay_dir = ::testing::TempDir() + "oasis-block-fuzz";
  return fz::fuzz(op, k, opt);
}
}  // namespace

TEST(BlockAttnRes, FuzzFindsBlockMistakes) {
  for (const std::string op : {"block_attn_res", "block_attn_res_backward"}) {
    fz::FuzzOptions opt;
    opt.dtypes = {io::DType::f32, io::DType::bf16};
    const fz::FuzzReport r = fz::fuzz(op, fz::reference_kernel(op), opt);
    EXPECT_TRUE(r.passed) << fz::format_fuzz_report(r);
  }
  // the partial's weight written first: alpha fails, h does not
  const fz::FuzzReport a = fuzz_block("block_attn_res", [](const io::TensorMap&, io::TensorMap& out) {
    Tensor<double>& al = out.at("alpha").values;
    const index_t n = al.dim(0), N = al.dim(1);
    std::rotate(al.data(), al.data() + (n - 1) * N, al.data() + n * N);
  });
  ASSERT_TRUE(a.has_failure);
  EXPECT_EQ(failing_tensors(a.failure.report), std::set<std::string>{"alpha"}) << fz::format_fuzz_report(a);
  // grad_partial through the mix only: alpha_m grad_h
  const fz::FuzzReport b = fuzz_block("block_attn_res_backward", [](const io::TensorMap& in, io::TensorMap& out) {
    const Tensor<double>&al = out.at("alpha").values, &dh = in.at("grad_h").values;
    Tensor<double>& gp = out.at("grad_partial").values;
    const index_t m = al.dim(0) - 1, d = dh.dim(1);
    for (index_t i = 0; i < gp.size(); ++i) gp[i] = static_cast<float>(al(m, i / d) * dh[i]);
  });
  ASSERT_TRUE(b.has_failure);
  EXPECT_EQ(failing_tensors(b.failure.report), std::set<std::string>{"grad_partial"}) << fz::format_fuzz_report(b);
}
