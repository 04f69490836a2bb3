// tests/verify/test_attention_backward_oracle.cpp — the blocked backward oracle
// (src/verify/attention_backward_oracle.hpp) against the plain functions it replaces, over
// shapes and options that exercise the tiles (row counts around the tile of 64, keys around the
// column quantum of 32), GQA, causal and padded and windowed masks, both normalisers, null logits
// up to +6, the incoming gradients of LSE and p_null, and both layouts:
//   the reference gradients agree within the two own bounds together (each bounds its distance to
//   the exact gradients); every bound (own, the float and double worst-case lines, the
//   probabilistic) is at least the plain one less a relative 1e-9 (summation order), and at most
//   it plus 1e-9 relative and 1e-30 absolute (the floors, taken through maxima);
// and the results do not depend on the number of threads.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "attention_backward_oracle.hpp"
#include "oasis/grad/backward_prob_bounds.hpp"
#include "oasis/verify/compare.hpp"
#include "oasis/verify/policy.hpp"
#include "oasis/io/json.hpp"
#include "oasis_random.hpp"

namespace {

using namespace oasis;
using oasis::verify::detail::BackwardOracle;
using oasis::verify::detail::BackwardOracleRequest;
using oasis::verify::detail::fast_attention_backward;

struct Case {
  std::string name;
  index_t B, H, Hkv, Tq, Tk, dh, dv;
  RowNorm norm = RowNorm::softmax1;
  bool causal = false;
  index_t window = 0;
  bool padded = false, dlse = false, dpn = false, bthd = false, sinks = false;
  bool p16 = false;  ///< P and dS rounded to bf16 before the products (the probabilistic bound's r16 terms)
  int stored = 0;    ///< the stored forward: 1 O stored in bf16 (out_u), 2 O and LSE1 given, off by ~1e-3
  int bias = 0;      ///< a bias, one key in 8 masked (-inf): 1 [Tq, Tk], 2 [1, H, Tq, Tk], 3 [B, H, Tq, Tk];
                     ///< 4 [Tq, Tk] with every third row masked whole (softmax: rows without a finite LSE)
};

Tensor<double> float_exact(Shape sh, std::mt19937_64& rng, double sd = 1.0) {
  Tensor<double> t = test::randn<double>(std::move(sh), rng, sd);
  for (index_t i = 0; i < t.size(); ++i) t[i] = static_cast<double>(static_cast<float>(t[i]));
  return t;
}

Shape rows_shape(const Case& c, index_t H, index_t T, index_t d) {
  return c.bthd ? Shape{c.B, T, H, d} : Shape{c.B, H, T, d};
}

// plain <= blocked <= plain (1 + 1e-9) + 1e-30, elementwise
void expect_bound(const Tensor<double>& plain, const Tensor<double>& blocked, const std::string& what) {
  ASSERT_EQ(plain.shape(), blocked.shape()) << what;
  index_t shown = 0;
  for (index_t i = 0; i < plain.size(); ++i) {
    const double p = plain[i], b = blocked[i];
    const bool ok = b >= p * (1.0 - 1e-9) && b <= p * (1.0 + 1e-9) + 1e-30;
    if (!ok && shown++ < 5) ADD_FAILURE() << what << " [" << i << "]: plain " << p << ", blocked " << b;
  }
}

void expect_values(const Tensor<double>& plain, const Tensor<double>& blocked, const Tensor<double>& own_plain,
                   const Tensor<double>& own_blocked, const std::string& what) {
  ASSERT_EQ(plain.shape(), blocked.shape()) << what;
  index_t shown = 0;
  for (index_t i = 0; i < plain.size(); ++i) {
    const double err = std::abs(plain[i] - blocked[i]), allowed = own_plain[i] + own_blocked[i];
    if (!(err <= allowed) && shown++ < 5)
      ADD_FAILURE() << what << " [" << i << "]: plain " << plain[i] << ", blocked " << blocked[i] << ", |diff| " << err
                    << " over the own bounds " << allowed;
  }
}

void run_case(const Case& c, std::uint64_t salt) {
  SCOPED_TRACE(c.name + " (seed " + std::to_string(test::base_seed()) + ", salt " + std::to_string(salt) + ")");
  auto rng = test::make_rng(salt);
  const Tensor<double> q = float_exact(rows_shape(c, c.H, c.Tq, c.dh), rng, 1.5),
                       k = float_exact(rows_shape(c, c.Hkv, c.Tk, c.dh), rng, 1.5),
                       v = float_exact(rows_shape(c, c.Hkv, c.Tk, c.dv), rng);
  AttentionCotangents<double> d{float_exact(rows_shape(c, c.H, c.Tq, c.dv), rng), {}, {}};
  if (c.dlse) d.lse = float_exact({c.B, c.H, c.Tq}, rng);
  if (c.dpn) d.p_null = float_exact({c.B, c.H, c.Tq}, rng);
  AttentionOptions o;
  o.normalizer = c.norm;
  o.causal = c.causal;
  o.window = c.window;
  o.layout = c.bthd ? AttentionLayout::bthd : AttentionLayout::bhtd;
  if (c.padded)
    for (index_t b = 0; b < c.B; ++b) o.key_lengths.push_back(b == 0 ? c.Tk : b == 1 ? 0 : 7 % (c.Tk + 1));  // full, none, 7
  if (c.sinks)
    for (index_t h = 0; h < c.H; ++h) o.null_logits.push_back(h % 2 ? 6.0 : -3.0 + h);
  if (c.bias) {
    const double ninf = -std::numeric_limits<double>::infinity();
    o.bias = test::randn<double>(c.bias == 1 || c.bias == 4 ? Shape{c.Tq, c.Tk} : Shape{c.bias == 2 ? 1 : c.B, c.H, c.Tq, c.Tk},
                                 rng, 0.7);
    for (index_t i = 0; i < o.bias.size(); i += 8) o.bias[i] = ninf;
    if (c.bias == 4)
      for (index_t t = 0; t < c.Tq; t += 3)
        for (index_t j = 0; j < c.Tk; ++j) o.bias(t, j) = ninf;
  }
  BackwardOracleRequest rq;
  rq.wc_double = true;
  rq.lambda = verify::kLambda;
  if (c.p16) rq.u16 = std::ldexp(1.0, -8), rq.n16 = std::ldexp(1.0, -126);
  AttentionOptions of = o;
  of.return_probs = true;
  const AttentionResult<double> fwd = token_attention(q, k, v, of);
  bounds::StoredForward sf;
  Tensor<double> sout, slse;
  if (c.stored == 1) sf.out_u = std::ldexp(1.0, -8), sf.out_min = std::ldexp(1.0, -126);
  if (c.stored == 2) {
    sout = fwd.out, slse = fwd.lse;
    for (index_t i = 0; i < sout.size(); ++i) sout[i] += 1e-3 * std::sin(static_cast<double>(i));
    for (index_t i = 0; i < slse.size(); ++i) slse[i] += std::isfinite(slse[i]) ? 1e-3 * std::cos(static_cast<double>(i)) : 0.0;
    sf.out = &sout, sf.lse = &slse;
  }
  if (c.stored) rq.stored = &sf;
  const BackwardOracle bo = fast_attention_backward(q, k, v, d, o, rq);
  const AttentionGrads<double> ref = token_attention_backward(q, k, v, d, o);
  const auto own = bounds::attention_backward_bounds(q, k, v, d, o, fwd);
  const auto wcd = bounds::attention_backward_bounds(q, k, v, d, o, fwd, true);
  const Tensor<float> qf = q.cast<float>(), kf = k.cast<float>(), vf = v.cast<float>();
  const AttentionCotangents<float> df{d.out.cast<float>(), d.lse.cast<float>(), d.p_null.cast<float>()};
  const auto wcf = bounds::attention_backward_bounds(qf, kf, vf, df, o, fwd, true);
  const auto prob = bounds::prob_attention_backward_bounds(qf, kf, vf, df, o, fwd, verify::kLambda, rq.u16, rq.n16);

  {  // without the probabilistic bound (its rows' weights apart): the same worst-case lines, bitwise
    BackwardOracleRequest wc_only = rq;
    wc_only.prob = false;
    const BackwardOracle bw = fast_attention_backward(q, k, v, d, o, wc_only);
    EXPECT_TRUE(bw.prob.q.empty());
    for (auto [x, y] : {std::pair{&bo.own, &bw.own}, std::pair{&bo.wc_float, &bw.wc_float}, std::pair{&bo.wc_double, &bw.wc_double}})
      for (auto [a, b] : {std::pair{&x->q, &y->q}, std::pair{&x->k, &y->k}, std::pair{&x->v, &y->v}, std::pair{&x->bias, &y->bias},
                          std::pair{&x->null_logits, &y->null_logits}}) {
        ASSERT_EQ(a->shape(), b->shape());
        for (index_t i = 0; i < a->size(); ++i) ASSERT_EQ((*a)[i], (*b)[i]) << i;
      }
  }
  expect_values(ref.q, bo.ref.q, own.q, bo.own.q, "grad_q");
  expect_values(ref.k, bo.ref.k, own.k, bo.own.k, "grad_k");
  expect_values(ref.v, bo.ref.v, own.v, bo.own.v, "grad_v");
  if (c.bias) expect_values(ref.bias, bo.ref.bias, own.bias, bo.own.bias, "grad_bias");
  if (c.norm == RowNorm::softmax1)
    expect_values(ref.null_logits, bo.ref.null_logits, own.null_logits, bo.own.null_logits, "grad_null_logits");
  const std::pair<const bounds::AttentionBackwardBounds*, const bounds::AttentionBackwardBounds*> pairs[] = {
      {&own, &bo.own}, {&wcf, &bo.wc_float}, {&wcd, &bo.wc_double}, {&prob, &bo.prob}};
  const char* names[] = {"own", "worst case (float)", "worst case (double)", "probabilistic"};
  for (int x = 0; x < 4; ++x) {
    expect_bound(pairs[x].first->q, pairs[x].second->q, std::string(names[x]) + " q");
    expect_bound(pairs[x].first->k, pairs[x].second->k, std::string(names[x]) + " k");
    expect_bound(pairs[x].first->v, pairs[x].second->v, std::string(names[x]) + " v");
    if (c.norm == RowNorm::softmax1)
      expect_bound(pairs[x].first->null_logits, pairs[x].second->null_logits, std::string(names[x]) + " null logits");
    if (c.bias) expect_bound(pairs[x].first->bias, pairs[x].second->bias, std::string(names[x]) + " bias");
  }
  if (c.stored) {
    const auto fixed_f = bounds::stored_forward_bounds(qf, kf, vf, df, o, fwd, sf);
    const auto fixed_d = bounds::stored_forward_bounds(q, k, v, d, o, fwd, sf);
    for (const auto& [plain, blocked, name] :
         {std::tuple{&fixed_f, &bo.fixed_float, "stored (float)"}, std::tuple{&fixed_d, &bo.fixed_double, "stored (double)"}}) {
      expect_bound(plain->q, blocked->q, std::string(name) + " q");
      expect_bound(plain->k, blocked->k, std::string(name) + " k");
      expect_bound(plain->v, blocked->v, std::string(name) + " v");
      if (c.norm == RowNorm::softmax1) expect_bound(plain->null_logits, blocked->null_logits, std::string(name) + " null");
      if (c.bias) expect_bound(plain->bias, blocked->bias, std::string(name) + " bias");
    }
    const auto fbf = bounds::attention_bounds(qf, kf, vf, o, fwd);
    const auto fbd = bounds::attention_bounds(q, k, v, o, fwd);
    expect_bound(fbf.out, bo.fwd_float.out, "forward (float) out");
    expect_bound(fbf.lse, bo.fwd_float.lse, "forward (float) lse");
    expect_bound(fbd.out, bo.fwd_double.out, "forward (double) out");
    expect_bound(fbd.lse, bo.fwd_double.lse, "forward (double) lse");
    for (index_t i = 0; i < fwd.out.size(); ++i) EXPECT_NEAR(bo.fwd.out[i], fwd.out[i], 2.0 * fbd.out[i]) << i;
  }
  for (index_t i = 0; i < fwd.lse.size(); ++i) {
    if (std::isinf(fwd.lse[i]))
      EXPECT_EQ(bo.fwd.lse[i], fwd.lse[i]);
    else
      EXPECT_NEAR(bo.fwd.lse[i], fwd.lse[i], 1e-12 * (1.0 + std::abs(fwd.lse[i])));
    EXPECT_NEAR(bo.fwd.p_null[i], fwd.p_null[i], 1e-12);
  }
}

TEST(AttentionBackwardOracle, EqualsThePlainReferenceAndBounds) {
  const Case cases[] = {
      {"softmax1 dense", 1, 2, 2, 7, 9, 8, 8},
      {"softmax1 causal tiles", 1, 2, 1, 70, 70, 16, 24, RowNorm::softmax1, true},
      {"softmax causal, Tk > Tq", 2, 2, 2, 33, 65, 8, 40, RowNorm::softmax, true},
      {"sinks, dlse, dpn, GQA 4:1", 1, 4, 1, 20, 37, 12, 12, RowNorm::softmax1, false, 0, false, true, true, false, true},
      {"padded keys", 3, 2, 2, 10, 40, 8, 8, RowNorm::softmax1, false, 0, true, true},
      {"padded softmax (rows with no key)", 3, 1, 1, 10, 12, 8, 8, RowNorm::softmax, true, 0, true},
      {"window, bthd", 2, 4, 2, 65, 65, 32, 16, RowNorm::softmax1, true, 9, false, false, true, true, true},
      {"sinks +6, causal, 130 rows", 1, 2, 2, 130, 130, 64, 64, RowNorm::softmax1, true, 0, false, false, false, false, true},
      {"window and padded keys (rows that see no key, far right)", 3, 2, 1, 70, 70, 8, 8, RowNorm::softmax1, true, 4, true, true,
       false, false, true, false, 2},
      {"window, padded, no causal, softmax", 3, 1, 1, 200, 200, 8, 8, RowNorm::softmax, false, 4, true},
      {"16 pairs, unsplit", 2, 16, 8, 10, 12, 8, 8, RowNorm::softmax1, true, 0, false, true, false, false, true},
      {"MQA, one pair in parts", 1, 8, 1, 130, 130, 16, 16, RowNorm::softmax1, true, 0, false, true, true, false, true},
      {"P and dS in bf16", 1, 2, 2, 40, 40, 16, 16, RowNorm::softmax1, true, 0, false, true, false, false, true, true},
      {"O stored in bf16", 2, 2, 1, 70, 70, 16, 16, RowNorm::softmax1, true, 0, true, true, true, false, true, true, 1},
      {"O and LSE given, bthd", 2, 4, 2, 33, 40, 8, 24, RowNorm::softmax1, false, 0, true, true, true, true, true, false, 2},
      {"O and LSE given, softmax", 3, 2, 2, 20, 20, 8, 8, RowNorm::softmax, true, 0, true, true, false, false, false, false, 2},
      {"bias [Tq, Tk], GQA, sinks", 2, 4, 2, 70, 70, 16, 16, RowNorm::softmax1, true, 0, false, true, true, false, true, false, 0, 1},
      {"bias [1, H, Tq, Tk], bthd, stored", 2, 2, 1, 33, 40, 8, 8, RowNorm::softmax1, false, 0, true, true, true, true, true, false, 2, 2},
      {"bias masking whole rows, softmax, stored", 2, 4, 1, 70, 70, 8, 8, RowNorm::softmax, true, 0, false, true, false, false,
       false, false, 1, 4},
      {"bias masking whole rows, softmax1", 1, 2, 2, 40, 40, 8, 8, RowNorm::softmax1, false, 0, false, true, true, false, true,
       false, 0, 4},
      {"bias [B, H, Tq, Tk], softmax, P in bf16", 2, 2, 2, 30, 30, 8, 8, RowNorm::softmax, true, 5, false, true, false, false, false, true, 1, 3},
  };
  std::uint64_t salt = 700;
  for (const Case& c : cases) run_case(c, salt++);
}

// With few (batch, kv head) pairs each pair's tiles are split into parts computed in parallel: the
// split depends on the shape only, so one thread and many give the same bits (4 pairs in 4 parts;
// one pair, MQA over 8 heads, in 16 parts; 32 pairs, unsplit).
TEST(AttentionBackwardOracle, SameResultsOnOneThreadAndMany) {
  struct Shape_ { index_t B, H, Hkv, T; };
  for (const Shape_ sh : {Shape_{2, 4, 2, 70}, Shape_{1, 8, 1, 200}, Shape_{4, 8, 8, 40}}) {
    SCOPED_TRACE("B " + std::to_string(sh.B) + ", H " + std::to_string(sh.H) + ", H_kv " + std::to_string(sh.Hkv));
    auto rng = test::make_rng(750);
    const Tensor<double> q = float_exact({sh.B, sh.H, sh.T, 16}, rng), k = float_exact({sh.B, sh.Hkv, sh.T, 16}, rng),
                         v = float_exact({sh.B, sh.Hkv, sh.T, 8}, rng);
    const AttentionCotangents<double> d{float_exact({sh.B, sh.H, sh.T, 8}, rng), float_exact({sh.B, sh.H, sh.T}, rng), {}};
    AttentionOptions o;
    o.causal = true;
    for (index_t h = 0; h < sh.H; ++h) o.null_logits.push_back(static_cast<double>(h % 4) + 1.0);
    bounds::StoredForward sf;
    sf.out_u = std::ldexp(1.0, -8);
    BackwardOracleRequest rq;
    rq.lambda = verify::kLambda;
    rq.stored = &sf;
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    const BackwardOracle one = fast_attention_backward(q, k, v, d, o, rq);
    omp_set_num_threads(std::max(saved, 3));
    const BackwardOracle many = fast_attention_backward(q, k, v, d, o, rq);
    omp_set_num_threads(saved);
    for (const auto& [a, b] : {std::pair{&one.ref.q, &many.ref.q}, {&one.ref.k, &many.ref.k}, {&one.ref.v, &many.ref.v},
                               {&one.ref.null_logits, &many.ref.null_logits}, {&one.own.k, &many.own.k},
                               {&one.own.null_logits, &many.own.null_logits}, {&one.wc_float.q, &many.wc_float.q},
                               {&one.wc_float.v, &many.wc_float.v}, {&one.prob.v, &many.prob.v},
                               {&one.prob.null_logits, &many.prob.null_logits}, {&one.fixed_float.k, &many.fixed_float.k},
                               {&one.fixed_float.null_logits, &many.fixed_float.null_logits}})
      for (index_t i = 0; i < a->size(); ++i) ASSERT_EQ((*a)[i], (*b)[i]) << i;
  }
}

// Through op attention_backward: the blocked oracle's verdicts are mp50's (f32 and f64 gradients of
// the library's float and double backward, with and without the stored forward a FlashAttention-2
// backward reads, with and without a bias; the largest element of grad_k moved by 1e-3 relative
// fails, exactly there), with the same
// violation counts and, for f32, the same worst ratio to 1e-6.
TEST(AttentionBackwardOracle, OpVerdictsAreMp50s) {
  auto rng = test::make_rng(760);
  const index_t B = 1, H = 4, Hkv = 2, T = 40, dh = 16;
  const Tensor<double> q = float_exact({B, H, T, dh}, rng, 1.5), k = float_exact({B, Hkv, T, dh}, rng, 1.5),
                       v = float_exact({B, Hkv, T, dh}, rng), dout = float_exact({B, H, T, dh}, rng),
                       dlse = float_exact({B, H, T}, rng), dpn = float_exact({B, H, T}, rng);
  Tensor<double> nl({H});
  for (index_t h = 0; h < H; ++h) nl[h] = h % 2 ? 6.0 : -1.5;
  AttentionOptions o;
  o.causal = true;
  o.null_logits.assign(nl.storage().begin(), nl.storage().end());
  Tensor<double> bias = test::randn<double>({T, T}, rng, 0.5);
  for (index_t i = 0; i < bias.size(); i += 7) bias[i] = -std::numeric_limits<double>::infinity();
  auto map = [](std::initializer_list<std::pair<const char*, Tensor<double>>> l, io::DType d) {
    io::TensorMap m;
    for (const auto& [name, t] : l) m.emplace(name, io::StoredTensor{d, t});
    return m;
  };
  const io::json::Value opt = io::json::parse(R"({"causal": true})");
  for (bool with_bias : {false, true})
  for (bool stored : {false, true})
    for (io::DType d : {io::DType::f32, io::DType::f64}) {
      SCOPED_TRACE(std::string(with_bias ? "bias, " : "") + (stored ? "stored forward, " : "") +
                   (d == io::DType::f32 ? "f32" : "f64"));
      if (with_bias) o.bias = bias;
      const AttentionResult<float> ff = token_attention(q.cast<float>(), k.cast<float>(), v.cast<float>(), o);
      io::TensorMap in = map({{"q", q}, {"k", k}, {"v", v}, {"grad_out", dout}, {"grad_lse", dlse}, {"grad_p_null", dpn},
                              {"null_logits", nl}},
                             io::DType::f32);
      if (with_bias) in.emplace("bias", io::StoredTensor{io::DType::f32, bias});
      if (stored) in.emplace("out", io::StoredTensor{io::DType::f32, ff.out.cast<double>()}),
                  in.emplace("lse", io::StoredTensor{io::DType::f32, ff.lse.cast<double>()});
      auto grads = [&](auto tag) {
        using R = decltype(tag);
        const AttentionGrads<R> g = token_attention_backward(
            q.cast<R>(), k.cast<R>(), v.cast<R>(), AttentionCotangents<R>{dout.cast<R>(), dlse.cast<R>(), dpn.cast<R>()}, o);
        io::TensorMap m = map({{"grad_q", g.q.template cast<double>()}, {"grad_k", g.k.template cast<double>()},
                               {"grad_v", g.v.template cast<double>()}, {"grad_null_logits", g.null_logits.template cast<double>()}},
                              d);
        if (with_bias) m.emplace("grad_bias", io::StoredTensor{d, g.bias.template cast<double>()});
        return m;
      };
      io::TensorMap out = d == io::DType::f32 ? grads(float{}) : grads(double{});
      verify::CompareOptions fast, mp;
      mp.oracle = verify::Oracle::mp50;
      for (int moved = 0; moved < 2; ++moved) {
        if (moved) {  // the largest element of grad_k, by 1e-3 relative
          Tensor<double>& gk = out.at("grad_k").values;
          index_t arg = 0;
          for (index_t i = 0; i < gk.size(); ++i)
            if (std::abs(gk[i]) > std::abs(gk[arg])) arg = i;
          gk[arg] *= 1.001;
        }
        const verify::CompareReport a = verify::check("attention_backward", in, out, opt, fast);
        const verify::CompareReport b = verify::check("attention_backward", in, out, opt, mp);
        EXPECT_EQ(a.passed, !moved) << verify::format_report(a);
        EXPECT_EQ(a.passed, b.passed) << verify::format_report(a) << verify::format_report(b);
        if (d == io::DType::f32) EXPECT_EQ(a.oracle, "fast (double, its own error bound folded in)");
        ASSERT_EQ(a.tensors.size(), b.tensors.size());
        for (std::size_t i = 0; i < a.tensors.size(); ++i) {
          SCOPED_TRACE(a.tensors[i].name);
          EXPECT_EQ(a.tensors[i].violations, b.tensors[i].violations);
          EXPECT_EQ(a.tensors[i].violations_certain, b.tensors[i].violations_certain);
          EXPECT_EQ(a.tensors[i].violations > 0, moved && a.tensors[i].name == "grad_k");
          if (d == io::DType::f32)
            EXPECT_NEAR(a.tensors[i].worst_ratio, b.tensors[i].worst_ratio, 1e-6 * b.tensors[i].worst_ratio + 1e-12);
        }
      }
    }
}

TEST(AttentionBackwardOracle, RefusesWhatItDoesNotCover) {
  AttentionOptions o;
  EXPECT_TRUE(verify::detail::fast_backward_applies(o));
  o.null_logits = {std::numeric_limits<double>::infinity()};
  EXPECT_FALSE(verify::detail::fast_backward_applies(o));
  o.null_logits = {-std::numeric_limits<double>::infinity()};
  EXPECT_FALSE(verify::detail::fast_backward_applies(o));
  o.null_logits.clear();
  o.normalizer = RowNorm::clipped_softmax;
  EXPECT_FALSE(verify::detail::fast_backward_applies(o));
}

}  // namespace
