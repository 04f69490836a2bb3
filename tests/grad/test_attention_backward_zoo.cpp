// The zoo of token-attention backwards (docs/spec.md §8): a FlashAttention-2-style blockwise backward
// (correct zoo) and its mutants (wrong zoo) through the finite-difference check
// (attention_grad_support.hpp) and through `oasis-verify compare` (op attention_backward).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>

#include "attention_grad_support.hpp"
#include "oasis/grad/backward_bounds.hpp"
#include "oasis/io/dtype.hpp"
#include "oasis/verify/compare.hpp"

using namespace oasis;
using namespace oasis::attention_grad_test;

// ---- the zoo: a FlashAttention-2-style backward and its mutants --------------------------------

namespace {

enum class Mutant {
  none,              ///< correct
  sink_dropped,      ///< ds = 0
  d_without_null,    ///< D from probabilities that exclude the null: <dO, O> / (1 - p_null)
  d_unnormalised,    ///< D from the unnormalised accumulator: <dO, l O>
  gqa_not_summed,    ///< dk, dv of a kv head from its last query head only
  causal_missing,    ///< the backward recomputes the scores without the causal mask
  dp_without_complement,  ///< ds's dP term p_null dP instead of p_null (1 - p_null) dP
};

const char* name_of(Mutant m) {
  switch (m) {
    case Mutant::none: return "fa2_blockwise";
    case Mutant::sink_dropped: return "sink_gradient_dropped";
    case Mutant::d_without_null: return "D_from_probabilities_without_the_null";
    case Mutant::d_unnormalised: return "D_from_the_unnormalised_output";
    case Mutant::gqa_not_summed: return "gqa_gradients_not_summed";
    case Mutant::causal_missing: return "causal_mask_missing_in_backward";
    case Mutant::dp_without_complement: return "dp_term_without_1_minus_p_null";
  }
  return "?";
}

/// FlashAttention-2-style backward on [B, H, T, d] (bhtd, no window): the forward in key blocks
/// with the online softmax started at (max = s, sum = 1) for the null, O and LSE1 kept; then, per
/// key block and query block, P = exp(S - LSE1), dP = dO V^T, dS = P (dP - D + dLSE - p_null dP_null),
/// D = rowsum(dO O), accumulated blockwise into dq, dk, dv. `mu` injects one mistake.
template <class T>
AttentionGrads<T> fa2_backward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionCotangents<T>& d,
                               const AttentionOptions& opt, Mutant mu, index_t block = 2) {
  using std::exp;
  using std::log;
  using std::sqrt;
  const AttentionShape s = check_attention_args(q, k, v, opt);
  const T scale = T(1) / sqrt(T(s.d_h));
  const index_t group = s.H / s.H_kv;
  const bool null = opt.normalizer == RowNorm::softmax1;
  AttentionOptions back = opt;
  if (mu == Mutant::causal_missing) back.causal = false;
  auto score = [&](const AttentionOptions& o, index_t b, index_t h, index_t t, index_t j, bool& visible) {
    const KeyRange kr = visible_range(s, o, b, t);
    const double bias = attention_bias(o, b, h, t, j);
    visible = j >= kr.begin && j < kr.end && !std::isinf(bias);
    T dot(0);
    for (index_t c = 0; c < s.d_h; ++c) dot += q(b, h, t, c) * k(b, h / group, j, c);
    return scale * dot + T(bias);
  };
  Tensor<T> O({s.B, s.H, s.Tq, s.d_v}), lse({s.B, s.H, s.Tq}), pn({s.B, s.H, s.Tq}), D({s.B, s.H, s.Tq});
  for (index_t b = 0; b < s.B; ++b)
    for (index_t h = 0; h < s.H; ++h) {
      const T sl = opt.null_logits.empty() ? T(0) : T(opt.null_logits[static_cast<std::size_t>(h)]);
      for (index_t t = 0; t < s.Tq; ++t) {
        T m = null ? sl : neg_inf<T>(), l = null ? T(1) : T(0);
        std::vector<T> acc(static_cast<std::size_t>(s.d_v), T(0));
        for (index_t j0 = 0; j0 < s.Tk; j0 += block) {
          const index_t j1 = std::min(s.Tk, j0 + block);
          std::vector<T> z;
          std::vector<index_t> keys;
          T mb = m;
          for (index_t j = j0; j < j1; ++j) {
            bool vis;
            const T x = score(opt, b, h, t, j, vis);
            if (!vis) continue;
            z.push_back(x);
            keys.push_back(j);
            if (x > mb) mb = x;
          }
          if (keys.empty()) continue;
          const T corr = is_neg_inf(m) ? T(0) : exp(m - mb);
          l *= corr;
          for (auto& a : acc) a *= corr;
          for (std::size_t i = 0; i < keys.size(); ++i) {
            const T e = exp(z[i] - mb);
            l += e;
            for (index_t c = 0; c < s.d_v; ++c) acc[static_cast<std::size_t>(c)] += e * v(b, h / group, keys[i], c);
          }
          m = mb;
        }
        const bool empty = !null && l == T(0);
        lse(b, h, t) = empty ? neg_inf<T>() : m + log(l);
        pn(b, h, t) = null ? exp(sl - lse(b, h, t)) : T(0);
        T dd(0);
        for (index_t c = 0; c < s.d_v; ++c) {
          O(b, h, t, c) = empty ? T(0) : acc[static_cast<std::size_t>(c)] / l;
          dd += d.out(b, h, t, c) * (mu == Mutant::d_unnormalised ? acc[static_cast<std::size_t>(c)] : O(b, h, t, c));
        }
        if (mu == Mutant::d_without_null && null && pn(b, h, t) < T(1)) dd /= (T(1) - pn(b, h, t));
        D(b, h, t) = dd;
      }
    }
  AttentionGrads<T> g{Tensor<T>(q.shape()), Tensor<T>(k.shape()), Tensor<T>(v.shape()),
                      null ? Tensor<T>({s.H}) : Tensor<T>(), Tensor<T>(), Tensor<T>()};
  for (index_t b = 0; b < s.B; ++b)
    for (index_t hk = 0; hk < s.H_kv; ++hk)
      for (index_t j0 = 0; j0 < s.Tk; j0 += block) {  // key block: dk, dv accumulate in registers
        const index_t j1 = std::min(s.Tk, j0 + block);
        Tensor<T> dk({j1 - j0, s.d_h}), dv({j1 - j0, s.d_v});
        for (index_t h = hk * group; h < (hk + 1) * group; ++h) {
          if (mu == Mutant::gqa_not_summed) dk = Tensor<T>(dk.shape()), dv = Tensor<T>(dv.shape());
          for (index_t t0 = 0; t0 < s.Tq; t0 += block)
            for (index_t t = t0; t < std::min(s.Tq, t0 + block); ++t) {
              if (is_neg_inf(lse(b, h, t))) continue;
              const T dl = d.lse.empty() ? T(0) : d.lse(b, h, t), dP = d.p_null.empty() ? T(0) : d.p_null(b, h, t);
              for (index_t j = j0; j < j1; ++j) {
                bool vis;
                const T z = score(back, b, h, t, j, vis);
                if (!vis) continue;
                const T p = exp(z - lse(b, h, t));
                T dp(0);
                for (index_t c = 0; c < s.d_v; ++c) dp += d.out(b, h, t, c) * v(b, hk, j, c);
                const T dz = p * (dp - D(b, h, t) + dl - pn(b, h, t) * dP);
                for (index_t c = 0; c < s.d_v; ++c) dv(j - j0, c) += p * d.out(b, h, t, c);
                for (index_t c = 0; c < s.d_h; ++c) {
                  dk(j - j0, c) += scale * dz * q(b, h, t, c);
                  g.q(b, h, t, c) += scale * dz * k(b, hk, j, c);
                }
              }
            }
        }
        for (index_t j = j0; j < j1; ++j) {
          for (index_t c = 0; c < s.d_h; ++c) g.k(b, hk, j, c) = dk(j - j0, c);
          for (index_t c = 0; c < s.d_v; ++c) g.v(b, hk, j, c) = dv(j - j0, c);
        }
      }
  if (null && mu != Mutant::sink_dropped)
    for (index_t b = 0; b < s.B; ++b)
      for (index_t h = 0; h < s.H; ++h)
        for (index_t t = 0; t < s.Tq; ++t) {
          const T p = pn(b, h, t), dl = d.lse.empty() ? T(0) : d.lse(b, h, t), dP = d.p_null.empty() ? T(0) : d.p_null(b, h, t);
          const T comp = mu == Mutant::dp_without_complement ? T(1) : T(1) - p;
          g.null_logits[h] += p * (dl - D(b, h, t) + comp * dP);
        }
  return g;
}

/// The zoo's instance: GQA, causal, padding (one sequence fully padded, one with 3 of 4 keys, so
/// that the causal mask matters), sinks, dLSE and dP: every mutant's mistake shows here.
Instance zoo_instance() {
  Case c{"zoo", 2, 4, 2, 4, 4, 2, 2};
  c.causal = c.sinks = c.dlse = c.dp_null = true;
  Instance I = make_instance(c, base_seed() + 200);
  I.opt.key_lengths = {0, 3};
  return I;
}

io::TensorMap as_map(std::initializer_list<std::pair<const char*, Tensor<double>>> l) {
  io::TensorMap m;
  for (const auto& [name, t] : l)
    if (!t.empty()) m.emplace(name, io::StoredTensor{io::DType::f32, t});
  return m;
}

/// `oasis-verify compare` on the gradients `g` of instance I stored as `d` (op attention_backward).
verify::CompareReport compare_grads(const Instance& I, const AttentionGrads<double>& g, io::DType d,
                                    const verify::CompareOptions& co = {}) {
  std::string o = "{\"causal\": " + std::string(I.opt.causal ? "true" : "false");
  if (!I.opt.key_lengths.empty()) {
    o += ", \"key_lengths\": [";
    for (std::size_t i = 0; i < I.opt.key_lengths.size(); ++i) o += (i ? ", " : "") + std::to_string(I.opt.key_lengths[i]);
    o += "]";
  }
  o += ", \"normalizer\": \"" + std::string(to_string(I.opt.normalizer)) + "\"}";
  const io::json::Value opt = io::json::parse(o);
  Tensor<double> nl;
  if (!I.opt.null_logits.empty()) nl = Tensor<double>({static_cast<index_t>(I.opt.null_logits.size())}, I.opt.null_logits);
  const io::TensorMap in = as_map({{"q", I.q}, {"k", I.k}, {"v", I.v}, {"grad_out", I.dout}, {"grad_lse", I.dlse},
                                   {"grad_p_null", I.dpn}, {"null_logits", nl}});
  io::TensorMap out = as_map({{"grad_q", g.q}, {"grad_k", g.k}, {"grad_v", g.v}, {"grad_null_logits", g.null_logits}});
  for (auto& [name, t] : out) t.dtype = d;
  return verify::check("attention_backward", in, out, opt, co);
}

AttentionGrads<double> widened(const AttentionGrads<float>& g) {
  return {g.q.cast<double>(), g.k.cast<double>(), g.v.cast<double>(), g.null_logits.cast<double>(), g.bias.cast<double>()};
}

/// `oasis-verify compare` on the float gradients `g` of instance I.
verify::CompareReport compare_float(const Instance& I, const AttentionGrads<float>& g) {
  return compare_grads(I, widened(g), io::DType::f32);
}

/// `g` with every element moved by 1.5 B, B the double reference's own bound: the double oracle,
/// which knows its reference within 1.01 B, cannot decide it against the certain line 2 B.
AttentionGrads<double> nudged(const Instance& I, AttentionGrads<double> g) {
  AttentionOptions o = I.opt;
  o.return_probs = true;
  const bounds::AttentionBackwardBounds b =
      bounds::attention_backward_bounds(I.q, I.k, I.v, cotangents<double>(I), I.opt, token_attention(I.q, I.k, I.v, o));
  for (auto [x, e] : {std::pair{&g.q, &b.q}, {&g.k, &b.k}, {&g.v, &b.v}, {&g.null_logits, &b.null_logits}})
    for (index_t i = 0; i < x->size(); ++i) (*x)[i] += 1.5 * (*e)[i];
  return g;
}

}  // namespace

TEST(AttentionBackwardZoo, CorrectImplementationsPass) {
  const Instance I = zoo_instance();
  const fd::Summary s = fd_check(I, fa2_backward(I.q.cast<R>(), I.k.cast<R>(), I.v.cast<R>(), cotangents<R>(I), I.opt,
                                                 Mutant::none));
  EXPECT_TRUE(s.ok()) << "fa2 in mp50 against finite differences:\n" << s.first;
  // float: the plain reference and the blockwise kernel (block 2 and 3); double: the reference
  for (index_t block : {2, 3}) {
    const verify::CompareReport r =
        compare_float(I, fa2_backward(I.q.cast<float>(), I.k.cast<float>(), I.v.cast<float>(), cotangents<float>(I),
                                      I.opt, Mutant::none, block));
    EXPECT_TRUE(r.passed) << verify::format_report(r);
  }
  const verify::CompareReport r = compare_float(I, library_backward<float>(I));
  EXPECT_TRUE(r.passed) << verify::format_report(r);
  std::printf("%s", verify::format_report(r).c_str());
}

TEST(AttentionBackwardZoo, EveryMutantFailsBothChecks) {
  const Instance I = zoo_instance();
  for (Mutant mu : {Mutant::sink_dropped, Mutant::d_without_null, Mutant::d_unnormalised, Mutant::gqa_not_summed,
                    Mutant::causal_missing, Mutant::dp_without_complement}) {
    SCOPED_TRACE(name_of(mu));
    const fd::Summary s =
        fd_check(I, fa2_backward(I.q.cast<R>(), I.k.cast<R>(), I.v.cast<R>(), cotangents<R>(I), I.opt, mu), 1);
    EXPECT_FALSE(s.ok()) << "the finite-difference check missed " << name_of(mu);
    const verify::CompareReport r =
        compare_float(I, fa2_backward(I.q.cast<float>(), I.k.cast<float>(), I.v.cast<float>(), cotangents<float>(I),
                                      I.opt, mu));
    EXPECT_FALSE(r.passed) << "compare missed " << name_of(mu) << "\n" << verify::format_report(r);
    std::string failed;
    for (const auto& t : r.tensors)
      if (!t.passed) failed += " " + t.name + " (err/bound " + std::to_string(t.worst_ratio) + ")";
    std::printf("mutant %-40s FD: first failure after %ld gradients (%.3g x tol); compare FAIL:%s\n", name_of(mu),
                s.checked, s.worst_ratio, failed.c_str());
  }
}

// Failing fast (docs/policies.md, "Failing fast"): over 4096 keys with sinks of +6, where a backward
// whose D omits the null once stalled the check for more than 600 s in a whole-op mp50
// recomputation, every mutant finishes FAIL-certain with no row recomputed in mp50: in float32 (the
// double oracle decides every element) and in float64 with every element moved by 1.5 times the
// double reference's own bound (nudged): the correct elements are then undecided; those of a tensor
// already FAIL-certain are left so, and the others would need the whole op in mp50, past a budget
// set here below its estimate.
// The correct backward at the same size passes in float32 without mp50.
TEST(AttentionBackwardZoo, GrossMutantsFailFastOver4096Keys) {
  Case c{"fail_fast", 1, 2, 1, 8, 4096, 16, 16};
  c.dlse = c.dp_null = true;
  Instance I = make_instance(c, base_seed() + 300);
  I.opt.null_logits.assign(2, 6.0);
  const AttentionCotangents<float> df = cotangents<float>(I);
  const AttentionCotangents<double> dd = cotangents<double>(I);
  const verify::CompareReport ok =
      compare_float(I, fa2_backward(I.q.cast<float>(), I.k.cast<float>(), I.v.cast<float>(), df, I.opt, Mutant::none, 64));
  EXPECT_TRUE(ok.passed) << verify::format_report(ok);
  EXPECT_EQ(ok.mp50_rows, 0);
  verify::CompareOptions tight;
  tight.mp50_budget = 1e6;  // the whole op in mp50: 2 * 8 * 4096 * (4 * 16 + 3 * 16) = 7.3e6 multiply-adds
  for (Mutant mu : {Mutant::sink_dropped, Mutant::d_without_null, Mutant::d_unnormalised, Mutant::gqa_not_summed,
                    Mutant::dp_without_complement}) {
    SCOPED_TRACE(name_of(mu));
    const verify::CompareReport r32 = compare_float(
        I, fa2_backward(I.q.cast<float>(), I.k.cast<float>(), I.v.cast<float>(), df, I.opt, mu, 64));
    EXPECT_EQ(verify::verdict_word(r32), "FAIL-certain") << verify::format_report(r32);
    EXPECT_EQ(r32.mp50_rows, 0) << r32.oracle;
    const verify::CompareReport r64 =
        compare_grads(I, nudged(I, fa2_backward(I.q, I.k, I.v, dd, I.opt, mu, 64)), io::DType::f64, tight);
    EXPECT_EQ(verify::verdict_word(r64), "FAIL-certain") << verify::format_report(r64);
    index_t undecided = 0;
    for (const auto& t : r64.tensors) undecided += t.undecided;
    EXPECT_GT(undecided, 0) << verify::format_report(r64);
    EXPECT_EQ(r64.mp50_rows, 0) << r64.oracle;
    EXPECT_EQ(r64.mp50_work, 0.0);
  }
}

// The backward's mp50 fallback keeps to its budget. Float64 gradients whose errors are 1.5 times
// the double reference's own bound B (the certain line is 2 B, the double oracle knows its value
// within 1.01 B) leave every element undecided and are right (1.5 B + the double error < 2 B); by
// default the op is recomputed in mp50 (its rows counted) and passes; with a budget below the op's
// estimate nothing is recomputed and the verdict is UNDECIDED, the elements listed.
TEST(AttentionBackwardZoo, Mp50FallbackKeepsToItsBudget) {
  const Instance I = zoo_instance();
  const AttentionGrads<double> g = nudged(I, library_backward<double>(I));
  const verify::CompareReport full = compare_grads(I, g, io::DType::f64);
  ASSERT_TRUE(full.passed) << verify::format_report(full);
  ASSERT_EQ(full.mp50_rows, 2 * 4 * 4) << full.oracle;  // B H Tq: the whole op
  verify::CompareOptions none;
  none.mp50_budget = 0;
  const verify::CompareReport r = compare_grads(I, g, io::DType::f64, none);
  EXPECT_EQ(verify::verdict_word(r), "UNDECIDED") << verify::format_report(r);
  EXPECT_EQ(r.mp50_rows, 0);
  EXPECT_NE(verify::format_report(r).find("undecided: grad_"), std::string::npos) << verify::format_report(r);
  // every tensor FAIL-certain (one element of each moved far off): under the default budget, which
  // the whole op fits, its undecided elements still go to no mp50
  AttentionGrads<double> wrong = g;
  for (Tensor<double>* x : {&wrong.q, &wrong.k, &wrong.v, &wrong.null_logits}) (*x)[0] += 1.0;
  const verify::CompareReport rw = compare_grads(I, wrong, io::DType::f64);
  EXPECT_EQ(verify::verdict_word(rw), "FAIL-certain") << verify::format_report(rw);
  EXPECT_EQ(rw.mp50_rows, 0) << rw.oracle;
}
