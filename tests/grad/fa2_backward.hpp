// tests/grad/fa2_backward.hpp — a FlashAttention-2-style token-attention backward (docs/spec.md §8)
// written as such kernels are written, with the mistakes of the wrong zoo: shared by the zoo of
// wrong backwards (test_attention_backward_zoo.cpp) and the zoo of correct designs
// (test_attention_backward_designs.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_grad_support.hpp"
#include "oasis/io/dtype.hpp"

namespace oasis::attention_grad_test {

/// How the forward stores what the backward reads (FlashAttention-2: O in the input type, LSE1 in
/// float32), and where the stored values go (null: not returned).
struct Fa2Storage {
  io::DType out_dtype = io::DType::f64;  ///< O rounded to this type before D = rowsum(dO O) (f64: kept in T)
  io::DType gemm_dtype = io::DType::f64;  ///< P and dS rounded to this type before the dv, dq, dk products (f64: kept)
  Tensor<double>* out = nullptr;         ///< receives the stored O [B, H, Tq, d_v]
  Tensor<double>* lse = nullptr;         ///< receives the stored LSE1 [B, H, Tq]
};

/// x as the forward stores it in d (f64: unchanged; T float or double).
template <class T>
T stored(T x, io::DType d) {
  if constexpr (std::is_floating_point_v<T>)
    return d == io::DType::f64 ? x : static_cast<T>(io::round_to_dtype(static_cast<double>(x), d));
  else
    return x;
}


enum class Mutant {
  none,              ///< correct
  sink_dropped,      ///< ds = 0
  d_without_null,    ///< D from probabilities that exclude the null: <dO, O> / (1 - p_null)
  d_unnormalised,    ///< D from the unnormalised accumulator: <dO, l O>
  gqa_not_summed,    ///< dk, dv of a kv head from its last query head only
  causal_missing,    ///< the backward recomputes the scores without the causal mask
  dp_without_complement,  ///< ds's dP term p_null dP instead of p_null (1 - p_null) dP
  dlse_missing,      ///< dS without the dLSE term
  dp_term_missing,   ///< dS of the keys without the - p_null dP term
  p_keys_only,       ///< P recomputed with the keys-only denominator, exp(S - LSE_keys)
  ds_group_summed,   ///< the null logits' gradient summed over each GQA group (every head gets its group's sum)
  ds_batch0_only,    ///< the null logits' gradient summed over batch element 0 only
};

inline const char* name_of(Mutant m) {
  switch (m) {
    case Mutant::none: return "fa2_blockwise";
    case Mutant::sink_dropped: return "sink_gradient_dropped";
    case Mutant::d_without_null: return "D_from_probabilities_without_the_null";
    case Mutant::d_unnormalised: return "D_from_the_unnormalised_output";
    case Mutant::gqa_not_summed: return "gqa_gradients_not_summed";
    case Mutant::causal_missing: return "causal_mask_missing_in_backward";
    case Mutant::dp_without_complement: return "dp_term_without_1_minus_p_null";
    case Mutant::dlse_missing: return "dlse_term_missing";
    case Mutant::dp_term_missing: return "dp_term_missing";
    case Mutant::p_keys_only: return "P_with_the_keys_only_denominator";
    case Mutant::ds_group_summed: return "dsink_summed_over_the_gqa_group";
    case Mutant::ds_batch0_only: return "dsink_over_batch_0_only";
  }
  return "?";
}

/// FlashAttention-2-style backward on [B, H, T, d] (bhtd, no window): the forward in key blocks
/// with the online softmax started at (max = s, sum = 1) for the null, O and LSE1 kept; then, per
/// key block and query block, P = exp(S - LSE1), dP = dO V^T, dS = P (dP - D + dLSE - p_null dP_null),
/// D = rowsum(dO O), accumulated blockwise into dq, dk, dv. `mu` injects one mistake; `st` says how
/// the forward stores O (FlashAttention-2 stores it in the input type and forms D from that copy)
/// and receives the stored O and LSE1.
template <class T>
AttentionGrads<T> fa2_backward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionCotangents<T>& d,
                               const AttentionOptions& opt, Mutant mu, index_t block = 2, const Fa2Storage& st = {}) {
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
  if (st.out) *st.out = Tensor<double>(O.shape());
  if (st.lse) *st.lse = Tensor<double>(lse.shape());
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
        if (st.lse) (*st.lse)(b, h, t) = static_cast<double>(lse(b, h, t));
        T dd(0);
        for (index_t c = 0; c < s.d_v; ++c) {
          O(b, h, t, c) = stored(empty ? T(0) : acc[static_cast<std::size_t>(c)] / l, st.out_dtype);
          if (st.out) (*st.out)(b, h, t, c) = static_cast<double>(O(b, h, t, c));
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
              const T dl = d.lse.empty() || mu == Mutant::dlse_missing ? T(0) : d.lse(b, h, t);
              const T dP = d.p_null.empty() ? T(0) : d.p_null(b, h, t);
              const T pnull_term = mu == Mutant::dp_term_missing ? T(0) : pn(b, h, t) * dP;
              const T lse_p = mu == Mutant::p_keys_only && null && pn(b, h, t) < T(1) ? lse(b, h, t) + log(T(1) - pn(b, h, t))
                                                                                      : lse(b, h, t);
              for (index_t j = j0; j < j1; ++j) {
                bool vis;
                const T z = score(back, b, h, t, j, vis);
                if (!vis) continue;
                const T p = exp(z - lse_p);
                T dp(0);
                for (index_t c = 0; c < s.d_v; ++c) dp += d.out(b, h, t, c) * v(b, hk, j, c);
                const T dz = stored(p * (dp - D(b, h, t) + dl - pnull_term), st.gemm_dtype);
                const T pg = stored(p, st.gemm_dtype);
                for (index_t c = 0; c < s.d_v; ++c) dv(j - j0, c) += pg * d.out(b, h, t, c);
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
    for (index_t b = 0; b < (mu == Mutant::ds_batch0_only ? 1 : s.B); ++b)
      for (index_t h = 0; h < s.H; ++h)
        for (index_t t = 0; t < s.Tq; ++t) {
          const T p = pn(b, h, t), dP = d.p_null.empty() ? T(0) : d.p_null(b, h, t);
          const T dl = d.lse.empty() || mu == Mutant::dlse_missing ? T(0) : d.lse(b, h, t);
          const T comp = mu == Mutant::dp_without_complement ? T(1) : T(1) - p;
          g.null_logits[h] += p * (dl - D(b, h, t) + comp * dP);
        }
  if (null && mu == Mutant::ds_group_summed) {
    const Tensor<T> per_head = g.null_logits;
    for (index_t h = 0; h < s.H; ++h) {
      g.null_logits[h] = T(0);
      for (index_t h2 = (h / group) * group; h2 < (h / group + 1) * group; ++h2) g.null_logits[h] += per_head[h2];
    }
  }
  return g;
}

}  // namespace oasis::attention_grad_test
