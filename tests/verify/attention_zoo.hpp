// tests/verify/attention_zoo.hpp — correct and wrong "other implementations" of token attention,
// for the tests of the compare policies (test_policy.cpp) and the table of docs/tolerances.md
// (policy_table.cpp).
//
// Correct implementations ("the zoo") compute the same mathematics as oasis::token_attention in
// float32 with other evaluation orders and algorithms, as real kernels do: pairwise sums, no max
// subtraction, blockwise online softmax with exp2 and a pre-scaled log2(e) (FlashAttention 2),
// split-K decoding with the null category added once at the combine, FMA dot products, reversed
// key order, double evaluation rounded once. storage() rounds a float result to f16 or bf16, as a
// kernel that accumulates in float and stores 16-bit outputs does; p16 also rounds the
// probabilities to the 16-bit type before P·V (FlashAttention, torch SDPA).
// Mutants change the mathematics the way real bugs do: the null counted twice, a causal mask that
// excludes the diagonal, the null (sink) dropped, the sink scaled by the softmax scale, the LSE
// without the null; one_element_off() moves one output element by a number of ulps.
// Inputs and outputs are [B, H, T, d] (the bhtd layout); the options are oasis::AttentionOptions.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <functional>
#include <string>
#include <vector>

#include "oasis/ops/attention.hpp"
#include "oasis/io/dtype.hpp"
#include "oasis_random.hpp"

namespace oasis::zoo {

using Result = AttentionResult<float>;

/// What an implementation gets wrong (none: a correct one).
enum class Bug { none, null_twice, causal_no_diagonal, null_dropped, sink_times_scale, lse_without_null, sink_per_kv_head,
                 window_off_by_one };

/// How an implementation evaluates a row.
enum class Algo {
  plain,        ///< the reference's loops (sequential sums, max subtraction, exp)
  pairwise,     ///< pairwise (tree) sums for the dot products, the normaliser and P·V
  no_max,       ///< e^z without subtracting the maximum (valid for small logits only)
  online,       ///< FlashAttention 2: key blocks, running max, exp2 of log2(e)-scaled scores
  split_k,      ///< decoding: key chunks reduced separately, combined with the null added once
  fma,          ///< fused multiply-add dot products and P·V accumulation
  reversed,     ///< sequential sums over the keys in reverse order
  in_double,    ///< evaluated in double, rounded once to float
  eager16,      ///< torch eager in p16_type: scores, probabilities and P·V each stored in p16_type
};

struct Impl {
  std::string name;
  Algo algo = Algo::plain;
  index_t block = 64;  ///< online: keys per block; split_k: number of chunks
  Bug bug = Bug::none;
  bool p16 = false;    ///< round the probabilities to `p16_type` before P·V
  io::DType p16_type = io::DType::bf16;
  bool ftz = false;       ///< online: GPU fast math flushes every subnormal result to zero
  bool fast_exp = false;  ///< online: exp2 of ex2.approx's class (relative error up to 2^-22)
};

namespace detail {

inline float pairwise_sum(const float* x, index_t n) {
  if (n <= 0) return 0.0f;
  if (n == 1) return x[0];
  const index_t h = n / 2;
  return pairwise_sum(x, h) + pairwise_sum(x + h, n - h);
}

inline float round16(float x, io::DType d) { return static_cast<float>(io::round_to_dtype(x, d)); }

/// One row: logits z (visible keys, -inf masked by a bias), values rows vj(j), null logit s.
struct RowOut {
  std::vector<float> out, p;
  float lse = 0, p_null = 0;
};

template <class VRow>
RowOut eval_row(const Impl& im, const std::vector<float>& zin, const std::vector<double>& zd, index_t d_v, VRow vrow,
                bool has_null, float s) {
  const index_t m = static_cast<index_t>(zin.size());
  RowOut r;
  r.out.assign(static_cast<std::size_t>(d_v), 0.0f);
  r.p.assign(static_cast<std::size_t>(m), 0.0f);
  const bool twice = im.bug == Bug::null_twice;
  if (im.algo == Algo::in_double) {
    double M = has_null ? static_cast<double>(s) : -INFINITY;
    for (double x : zd) M = std::max(M, x);
    if (std::isinf(M)) {  // plain softmax, fully masked: the documented zero
      r.lse = -INFINITY;
      return r;
    }
    double S = has_null ? (twice ? 2.0 : 1.0) * std::exp(s - M) : 0.0;
    std::vector<double> e(static_cast<std::size_t>(m));
    for (index_t j = 0; j < m; ++j) S += e[static_cast<std::size_t>(j)] = std::exp(zd[static_cast<std::size_t>(j)] - M);
    std::vector<double> o(static_cast<std::size_t>(d_v), 0.0);
    for (index_t j = 0; j < m; ++j) {
      const float* vj = vrow(j);
      const double pj = e[static_cast<std::size_t>(j)] / S;
      r.p[static_cast<std::size_t>(j)] = static_cast<float>(pj);
      for (index_t c = 0; c < d_v; ++c) o[static_cast<std::size_t>(c)] += pj * vj[c];
    }
    for (index_t c = 0; c < d_v; ++c) r.out[static_cast<std::size_t>(c)] = static_cast<float>(o[static_cast<std::size_t>(c)]);
    const double lse = M + std::log(S);
    r.lse = static_cast<float>(im.bug == Bug::lse_without_null && has_null ? M + std::log(S - std::exp(s - M)) : lse);
    r.p_null = has_null ? static_cast<float>(std::exp(s - M) / S) : 0.0f;
    return r;
  }
  if (im.algo == Algo::online || im.algo == Algo::split_k) {
    // Chunks of keys, each with its running max m_b, sum l_b and unnormalised output o_b; online
    // rescales one accumulator block by block (exp2, log2(e) folded into the scores), split_k keeps
    // the chunks apart and combines them at the end. The null logit enters once, at the combine.
    const float kLog2e = 1.4426950408889634f;
    const bool online = im.algo == Algo::online;
    // fast math: a result below the normal range flushed to zero; exp2 off by up to 2^-22 relative
    // (the sign taken from the argument's low bits: deterministic, both directions)
    auto fl = [&](float x) { return im.ftz && std::abs(x) < std::numeric_limits<float>::min() ? 0.0f : x; };
    auto exp2f_ = [&](float x) {
      float e = std::exp2(x);
      if (im.fast_exp) {
        std::uint32_t bits;
        std::memcpy(&bits, &x, sizeof bits);
        e *= (bits & 1u) ? 1.0f + 0x1p-22f : 1.0f - 0x1p-22f;
      }
      return fl(e);
    };
    const index_t chunk = online ? std::max<index_t>(im.block, 1) : std::max<index_t>((m + im.block - 1) / std::max<index_t>(im.block, 1), 1);
    struct Part { float mx = -INFINITY, l = 0; std::vector<float> o; };
    std::vector<Part> parts;
    Part acc;
    acc.o.assign(static_cast<std::size_t>(d_v), 0.0f);
    std::vector<float> pe(static_cast<std::size_t>(m));
    for (index_t b0 = 0; b0 < m; b0 += chunk) {
      const index_t b1 = std::min(m, b0 + chunk);
      Part cur;
      cur.o.assign(static_cast<std::size_t>(d_v), 0.0f);
      float bm = -INFINITY;
      for (index_t j = b0; j < b1; ++j) bm = std::max(bm, online ? zin[static_cast<std::size_t>(j)] * kLog2e : zin[static_cast<std::size_t>(j)]);
      Part& tgt = online ? acc : cur;
      const float mnew = std::max(tgt.mx, bm);
      if (std::isinf(mnew)) continue;  // every key of the block masked so far
      const float corr = online ? exp2f_(tgt.mx - mnew) : 1.0f;
      if (online) {
        tgt.l = fl(tgt.l * corr);
        for (auto& x : tgt.o) x = fl(x * corr);
      }
      tgt.mx = mnew;
      for (index_t j = b0; j < b1; ++j) {
        const float x = zin[static_cast<std::size_t>(j)];
        const float pj = online ? exp2f_(x * kLog2e - mnew) : std::exp(x - mnew);
        pe[static_cast<std::size_t>(j)] = pj;
        tgt.l = fl(tgt.l + pj);
        const float pv = im.p16 ? round16(pj, im.p16_type) : pj;
        const float* vj = vrow(j);
        for (index_t c = 0; c < d_v; ++c) tgt.o[static_cast<std::size_t>(c)] = fl(tgt.o[static_cast<std::size_t>(c)] + fl(pv * vj[c]));
      }
      if (!online) parts.push_back(cur);
    }
    if (online) parts.push_back(acc);
    // combine (online: one part, already in log2 units)
    const float sl = online ? s * kLog2e : s;
    float M = has_null ? sl : -INFINITY;
    for (const Part& pt : parts) M = std::max(M, pt.mx);
    if (std::isinf(M)) {
      r.lse = -INFINITY;
      return r;
    }
    auto ex = [&](float x) { return online ? exp2f_(x) : std::exp(x); };
    float L = has_null ? (twice ? 2.0f : 1.0f) * ex(sl - M) : 0.0f;
    std::vector<float> o(static_cast<std::size_t>(d_v), 0.0f);
    std::vector<float> scl(parts.size());
    for (std::size_t i = 0; i < parts.size(); ++i) {
      scl[i] = std::isinf(parts[i].mx) ? 0.0f : ex(parts[i].mx - M);
      L = fl(L + fl(parts[i].l * scl[i]));
      for (index_t c = 0; c < d_v; ++c)
        o[static_cast<std::size_t>(c)] = fl(o[static_cast<std::size_t>(c)] + fl(parts[i].o[static_cast<std::size_t>(c)] * scl[i]));
    }
    const float inv = 1.0f / L;
    for (index_t c = 0; c < d_v; ++c) r.out[static_cast<std::size_t>(c)] = fl(o[static_cast<std::size_t>(c)] * inv);
    const float lse2 = M + std::log2(L);  // in log2 units when online
    const float lse = online ? lse2 / kLog2e : M + std::log(L);
    r.lse = lse;
    if (im.bug == Bug::lse_without_null && has_null) r.lse = online ? (M + std::log2(L - ex(sl - M))) / kLog2e : M + std::log(L - ex(sl - M));
    r.p_null = has_null ? fl(ex(sl - M) * inv) : 0.0f;
    // probabilities: the chunk's exponentials rescaled to the final maximum
    std::size_t pi = 0;
    for (index_t b0 = 0; b0 < m; b0 += chunk, ++pi) {
      const index_t b1 = std::min(m, b0 + chunk);
      for (index_t j = b0; j < b1; ++j) {
        const float x = zin[static_cast<std::size_t>(j)];
        r.p[static_cast<std::size_t>(j)] = std::isinf(x) ? 0.0f : fl((online ? exp2f_(x * kLog2e - M) : std::exp(x - M)) * inv);
      }
    }
    return r;
  }
  // plain, pairwise, no_max, fma, reversed
  float M = has_null ? s : -INFINITY;
  for (float x : zin) M = std::max(M, x);
  if (std::isinf(M)) {
    r.lse = -INFINITY;
    return r;
  }
  const float shift = im.algo == Algo::no_max ? 0.0f : M;
  std::vector<float> e(static_cast<std::size_t>(m));
  for (index_t j = 0; j < m; ++j) e[static_cast<std::size_t>(j)] = std::exp(zin[static_cast<std::size_t>(j)] - shift);
  const float en = has_null ? std::exp(s - shift) : 0.0f;
  float S;
  if (im.algo == Algo::pairwise) {
    S = pairwise_sum(e.data(), m) + en;
  } else if (im.algo == Algo::reversed) {
    S = 0.0f;
    for (index_t j = m; j-- > 0;) S += e[static_cast<std::size_t>(j)];
    S += en;
  } else {
    S = en;
    for (index_t j = 0; j < m; ++j) S += e[static_cast<std::size_t>(j)];
  }
  if (twice) S += en;
  const float inv = 1.0f / S;
  for (index_t j = 0; j < m; ++j) r.p[static_cast<std::size_t>(j)] = e[static_cast<std::size_t>(j)] * inv;
  std::vector<float> col(static_cast<std::size_t>(m));
  for (index_t c = 0; c < d_v; ++c) {
    float acc = 0.0f;
    if (im.algo == Algo::pairwise) {
      for (index_t j = 0; j < m; ++j) {
        const float pj = im.p16 ? round16(r.p[static_cast<std::size_t>(j)], im.p16_type) : r.p[static_cast<std::size_t>(j)];
        col[static_cast<std::size_t>(j)] = pj * vrow(j)[c];
      }
      acc = pairwise_sum(col.data(), m);
    } else if (im.algo == Algo::reversed) {
      for (index_t j = m; j-- > 0;) acc += r.p[static_cast<std::size_t>(j)] * vrow(j)[c];
    } else {
      for (index_t j = 0; j < m; ++j) {
        const float pj = im.p16 ? round16(r.p[static_cast<std::size_t>(j)], im.p16_type) : r.p[static_cast<std::size_t>(j)];
        acc = im.algo == Algo::fma ? std::fma(pj, vrow(j)[c], acc) : acc + pj * vrow(j)[c];
      }
    }
    r.out[static_cast<std::size_t>(c)] = acc;
  }
  r.lse = shift + std::log(S);
  if (im.bug == Bug::lse_without_null && has_null) r.lse = shift + std::log(S - en);
  r.p_null = en * inv;
  return r;
}

}  // namespace detail

/// Token attention by implementation `im` (float32 arithmetic; bhtd layout). probs are returned
/// when opt.return_probs.
inline Result attention(const Impl& im, const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v,
                        const AttentionOptions& opt_in) {
  AttentionOptions opt = opt_in;
  if (im.bug == Bug::null_dropped) {
    opt.normalizer = RowNorm::softmax;
    opt.null_logits.clear();
  }
  if (im.bug == Bug::sink_times_scale)
    for (double& s : opt.null_logits) s *= opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(q.dim(3)));
  if (im.bug == Bug::window_off_by_one && opt.window > 0) opt.window += 1;
  const AttentionShape s = check_attention_args(q, k, v, opt);
  if (im.bug == Bug::sink_per_kv_head && !opt.null_logits.empty())  // head h takes the sink of its kv head's index
    for (index_t h = 0; h < s.H; ++h) opt.null_logits[static_cast<std::size_t>(h)] = opt_in.null_logits[static_cast<std::size_t>(h / (s.H / s.H_kv))];
  const float scale = opt.scale ? static_cast<float>(*opt.scale) : 1.0f / std::sqrt(static_cast<float>(s.d_h));
  const double scaled = opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(s.d_h));
  const bool has_null = opt.normalizer == RowNorm::softmax1;
  const index_t group = s.H / s.H_kv;
  Result r;
  r.out = Tensor<float>({s.B, s.H, s.Tq, s.d_v});
  r.lse = Tensor<float>({s.B, s.H, s.Tq});
  r.p_null = Tensor<float>({s.B, s.H, s.Tq});
  if (opt.return_probs) r.probs = Tensor<float>({s.B, s.H, s.Tq, s.Tk});
  for (index_t b = 0; b < s.B; ++b)
    for (index_t h = 0; h < s.H; ++h) {
      const index_t hk = h / group;
      const float sl = opt.null_logits.empty() ? 0.0f : static_cast<float>(opt.null_logits[static_cast<std::size_t>(h)]);
      for (index_t t = 0; t < s.Tq; ++t) {
        KeyRange kr = visible_range(s, opt, b, t);
        if (im.bug == Bug::causal_no_diagonal && opt.causal) kr.end = std::min(kr.end, t + (s.Tk - s.Tq));
        const index_t m = kr.count();
        std::vector<float> z(static_cast<std::size_t>(m));
        std::vector<double> zd(static_cast<std::size_t>(m));
        const float* qt = q.ptr(b, h, t);
        std::vector<float> prod(static_cast<std::size_t>(s.d_h));
        for (index_t j = 0; j < m; ++j) {
          const float* kj = k.ptr(b, hk, kr.begin + j);
          float dot = 0.0f;
          double dd = 0.0;
          if (im.algo == Algo::pairwise) {
            for (index_t c = 0; c < s.d_h; ++c) prod[static_cast<std::size_t>(c)] = qt[c] * kj[c];
            dot = detail::pairwise_sum(prod.data(), s.d_h);
          } else if (im.algo == Algo::fma) {
            for (index_t c = 0; c < s.d_h; ++c) dot = std::fma(qt[c], kj[c], dot);
          } else {
            for (index_t c = 0; c < s.d_h; ++c) dot += qt[c] * kj[c];
          }
          if (im.algo == Algo::in_double)
            for (index_t c = 0; c < s.d_h; ++c) dd += static_cast<double>(qt[c]) * static_cast<double>(kj[c]);
          const double bias = attention_bias(opt, b, h, t, kr.begin + j);
          z[static_cast<std::size_t>(j)] = scale * dot + static_cast<float>(bias);
          if (im.algo == Algo::eager16) z[static_cast<std::size_t>(j)] = detail::round16(z[static_cast<std::size_t>(j)], im.p16_type);
          zd[static_cast<std::size_t>(j)] = scaled * dd + bias;
        }
        const detail::RowOut ro = detail::eval_row(
            im, z, zd, s.d_v, [&](index_t j) { return v.ptr(b, hk, kr.begin + j); }, has_null, sl);
        std::copy(ro.out.begin(), ro.out.end(), r.out.ptr(b, h, t));
        r.lse(b, h, t) = ro.lse;
        r.p_null(b, h, t) = ro.p_null;
        if (opt.return_probs) std::copy(ro.p.begin(), ro.p.end(), r.probs.ptr(b, h, t) + kr.begin);
      }
    }
  return r;
}

/// The result stored in dtype d (round to nearest even from float, as a kernel's final store).
inline Result storage(Result r, io::DType d) {
  for (Tensor<float>* t : {&r.out, &r.lse, &r.p_null, &r.probs})
    for (index_t i = 0; i < t->size(); ++i) (*t)[i] = static_cast<float>(io::round_to_dtype((*t)[i], d));
  return r;
}

/// The correct implementations of the zoo (float32 arithmetic).
inline std::vector<Impl> correct_zoo(bool small_logits) {
  std::vector<Impl> z = {{"plain", Algo::plain},        {"pairwise", Algo::pairwise},
                         {"online_b16", Algo::online, 16}, {"online_b64", Algo::online, 64},
                         {"online_b256", Algo::online, 256}, {"split_k4", Algo::split_k, 4},
                         {"split_k16", Algo::split_k, 16}, {"fma", Algo::fma},
                         {"reversed", Algo::reversed},  {"in_double", Algo::in_double}};
  if (small_logits) z.push_back({"no_max", Algo::no_max});
  return z;
}

/// The mutants (on the plain algorithm).
inline std::vector<Impl> mutants() {
  return {{"null_twice", Algo::plain, 64, Bug::null_twice},
          {"causal_no_diagonal", Algo::plain, 64, Bug::causal_no_diagonal},
          {"null_dropped", Algo::plain, 64, Bug::null_dropped},
          {"sink_times_scale", Algo::plain, 64, Bug::sink_times_scale},
          {"lse_without_null", Algo::plain, 64, Bug::lse_without_null}};
}

/// Move the element of largest magnitude of `t` (stored in dtype d) by `ulps` units of d.
inline index_t one_element_off(Tensor<float>& t, io::DType d, double ulps) {
  index_t at = 0;
  for (index_t i = 0; i < t.size(); ++i)
    if (std::abs(t[i]) > std::abs(t[at])) at = i;
  t[at] = static_cast<float>(io::round_to_dtype(t[at] + ulps * io::dtype_ulp(d, t[at]), d));
  return at;
}

/// An input case of the policy measurements.
struct Case {
  std::string name;
  Tensor<float> q, k, v;
  AttentionOptions opt;
  std::vector<io::DType> dtypes;  ///< output dtypes measured
  bool small_logits = false;      ///< |z| small enough for the no-max-subtraction member
};

/// q, k ~ N(0, q_sd^2), N(0, 1) (scores of standard deviation q_sd at d_h = 64), v ~ N(0, v_sd^2);
/// sinks: one null logit per head uniform in [-3, 3] (gpt-oss), else Softmax1 (s = 0).
inline Case make_case(const std::string& name, index_t B, index_t H, index_t H_kv, index_t Tq, index_t Tk, index_t d,
                      bool causal, bool sinks, double q_sd, double v_sd, std::uint64_t seed,
                      std::vector<io::DType> dtypes = {io::DType::f32}) {
  auto rng = test::make_rng(seed);
  Case c{name, test::randn<float>({B, H, Tq, d}, rng, q_sd), test::randn<float>({B, H_kv, Tk, d}, rng),
         test::randn<float>({B, H_kv, Tk, d}, rng, v_sd), {}, std::move(dtypes), q_sd <= 0.2};
  c.opt.causal = causal;
  if (sinks) {
    std::uniform_real_distribution<double> ud(-3.0, 3.0);
    for (index_t h = 0; h < H; ++h) c.opt.null_logits.push_back(ud(rng));
  }
  return c;
}

/// Sinks of H heads in [lo, hi), stratified: the h-th of H equal parts of the range goes to a head
/// drawn at random, a uniform point within it. Each head's sink is uniform on the range, and every
/// draw holds one within (hi - lo) / H of hi, so a mistake whose effect grows with the sink (the null
/// dropped, counted twice, left out of the LSE) shows at every seed, not only where H independent
/// draws happened to reach high.
inline std::vector<double> stratified_sinks(index_t H, double lo, double hi, std::uint64_t seed) {
  auto rng = test::make_rng(seed);
  std::vector<index_t> part(static_cast<std::size_t>(H));
  for (index_t h = 0; h < H; ++h) part[static_cast<std::size_t>(h)] = h;
  std::shuffle(part.begin(), part.end(), rng);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  std::vector<double> s(static_cast<std::size_t>(H));
  for (index_t h = 0; h < H; ++h)
    s[static_cast<std::size_t>(h)] = lo + (hi - lo) * (static_cast<double>(part[static_cast<std::size_t>(h)]) + ud(rng)) /
                                              static_cast<double>(H);
  return s;
}

/// The cases of docs/tolerances.md: the acceptance shapes (float32 decoding over 4096 keys with
/// sinks, 512 keys, bf16 outputs at 4-64 keys, the 64-key prefill where one element is moved) and
/// the zoo's ranges (8192 keys, extreme logits, subnormal outputs, small logits, GQA).
inline std::vector<Case> policy_cases() {
  using io::DType;
  const std::vector<DType> all = {DType::f32, DType::bf16, DType::f16};
  return {make_case("decode_4096_sinks", 1, 8, 8, 1, 4096, 64, true, true, 1.0, 1.0, 1),
          make_case("decode_512_sinks", 1, 8, 8, 4, 512, 64, true, true, 1.0, 1.0, 2),
          make_case("prefill_64_sinks", 1, 8, 8, 64, 64, 64, true, true, 1.0, 1.0, 4, all),
          make_case("prefill_260_gqa_sinks", 1, 8, 2, 260, 260, 64, true, true, 1.0, 1.0, 3),
          make_case("bf16_4_keys", 1, 8, 8, 4, 4, 64, true, true, 1.0, 1.0, 9, all),
          make_case("bf16_16_keys", 1, 8, 8, 16, 16, 64, true, true, 1.0, 1.0, 10, all),
          make_case("small_logits_softmax1", 1, 4, 4, 64, 64, 64, true, false, 0.1, 1.0, 5),
          make_case("decode_8192", 1, 4, 4, 1, 8192, 64, true, true, 1.0, 1.0, 6),
          make_case("extreme_logits", 1, 4, 4, 16, 128, 64, true, true, 20.0, 1.0, 7),
          make_case("subnormal_out", 1, 4, 4, 16, 128, 64, true, true, 1.0, 1e-39, 8)};
}

// ---- the zoo's calls of op attention (tests/verify/test_policy.cpp, policy_table.cpp) ----------

/// The case's inputs q, k, v (float32; or stored in d, when their values are exact in it).
inline io::TensorMap inputs_of(const Case& c, io::DType d = io::DType::f32) {
  io::TensorMap in;
  in.emplace("q", io::StoredTensor{d, c.q.cast<double>()});
  in.emplace("k", io::StoredTensor{d, c.k.cast<double>()});
  in.emplace("v", io::StoredTensor{d, c.v.cast<double>()});
  return in;
}

/// c with q, k, v rounded to d (the inputs of a kernel that takes d).
inline Case rounded_to(Case c, io::DType d) {
  for (Tensor<float>* t : {&c.q, &c.k, &c.v})
    for (index_t i = 0; i < t->size(); ++i) (*t)[i] = detail::round16(static_cast<float>((*t)[i]), d);
  return c;
}

/// The outputs named in `names` (all four when empty), stored in d.
inline io::TensorMap outputs_of(const Result& r, io::DType d, std::vector<std::string> names = {}) {
  if (names.empty()) names = {"out", "lse", "p_null", "probs"};
  io::TensorMap out;
  for (const auto& n : names) {
    const Tensor<float>& t = n == "out" ? r.out : n == "lse" ? r.lse : n == "p_null" ? r.p_null : r.probs;
    out.emplace(n, io::StoredTensor{d, t.cast<double>()});
  }
  return out;
}

/// The op's options of the case as JSON text: causal and the null logits (to 17 digits).
inline std::string options_json(const Case& c) {
  std::string s = "{\"causal\": " + std::string(c.opt.causal ? "true" : "false");
  if (c.opt.window > 0) s += ", \"window\": " + std::to_string(c.opt.window);
  if (!c.opt.null_logits.empty()) {
    s += ", \"null_logits\": [";
    for (std::size_t i = 0; i < c.opt.null_logits.size(); ++i) {
      char b[40];
      std::snprintf(b, sizeof b, "%s%.17g", i ? ", " : "", c.opt.null_logits[i]);
      s += b;
    }
    s += "]";
  }
  return s + "}";
}

}  // namespace oasis::zoo
