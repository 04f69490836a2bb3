// oasis/ops/varlen.hpp — token attention and its backward on packed variable-length sequences, the
// THD layout of FlashAttention's varlen functions and TransformerEngine (docs/spec.md §8, "Packed
// and paged layouts").
//
// B sequences packed along the token axis, delimited by offsets (B + 1 entries each):
//   q   [total_q, H, d_h]      rows cu_seqlens_q[i] .. cu_seqlens_q[i+1] - 1 are sequence i's queries
//   k   [total_k, H_kv, d_h]   rows cu_seqlens_k[i] .. cu_seqlens_k[i+1] - 1 are its keys (v alike)
//   out [total_q, H, d_v]
//   lse, p_null [H, total_q]   head-major, FlashAttention-2 varlen's softmax_lse layout — NOT [B, H,
//                              max_seqlen] (a kernel that writes the dense layout and a reader that
//                              takes it as [H, total_q] disagree from the second sequence on)
// Sequence i is the dense op with B = 1, Tq = Tq_i, Tk = Tk_i: causal and windows bottom-right
// aligned within the sequence (query t sees key j iff j <= t + Tk_i - Tq_i), null logits per query
// head, GQA. A sequence with Tq_i = 0 has no rows (its keys receive zero gradients); one with
// Tk_i = 0 and Tq_i > 0 has fully masked rows (docs/spec.md §1: Softmax1 out 0, p_null 1, LSE1 = s).
// The backward's cotangents and gradients are in the same packed layouts; the null logits'
// gradient [H] is summed over every sequence (sequence by sequence, in order).
//
// Not offered packed: key_lengths (cu_seqlens_k holds the lengths), an additive bias and the
// probability matrix (their [Tq, Tk] differs per sequence), AttentionOptions::layout (packed
// tensors have one layout; it stays at its default). Each is refused naming it.
//
// The reference copies each sequence to a dense [1, Tq_i, H, d] (bthd) tensor and runs
// token_attention / token_attention_backward on it; attention_varlen_with takes the dense op as an
// argument, so the backends' adaptor (oasis/backends/layouts.hpp) runs the same stitching.
#pragma once

#include <algorithm>
#include <vector>

#include "oasis/grad/attention_backward.hpp"

namespace oasis {

/// Shape facts of one packed call, validated once.
struct VarlenShape {
  index_t B, H, H_kv, total_q, total_k, d_h, d_v;
};

namespace detail {

/// cu_seqlens of `total` packed rows: B + 1 >= 2 entries, starting at 0, non-decreasing, ending at total.
inline void check_cu_seqlens(const std::vector<index_t>& cu, index_t total, const char* arg, const char* rows) {
  OASIS_REQUIRE(cu.size() >= 2, arg, "has ", cu.size(), " entries; it holds B + 1 >= 2 offsets (B sequences)");
  OASIS_REQUIRE(cu[0] == 0, arg, "starts at ", cu[0], "; the first offset is 0");
  for (std::size_t i = 1; i < cu.size(); ++i)
    OASIS_REQUIRE(cu[i] >= cu[i - 1], arg, "decreases at entry ", i, " (", cu[i - 1], " then ", cu[i], "): sequence ", i - 1,
                  " would have the negative length ", cu[i] - cu[i - 1]);
  OASIS_REQUIRE(cu.back() == total, arg, "ends at ", cu.back(), " but ", rows, " holds ", total,
                " packed rows (the last offset is the total)");
}

/// The dense options of a packed or paged call: what AttentionOptions offers less what differs per
/// sequence (key_lengths, bias, return_probs); `layout_free`: the dense layout is not the caller's to set.
inline void check_per_sequence_options(const AttentionOptions& opt, const char* what, bool layout_free) {
  OASIS_REQUIRE(opt.key_lengths.empty(), "key_lengths", what, " takes the key lengths from its own metadata; leave key_lengths empty");
  OASIS_REQUIRE(opt.bias.empty(), "bias", what, " takes no additive bias (its [Tq, Tk] differs per sequence)");
  OASIS_REQUIRE(!opt.return_probs, "return_probs", what,
                " does not return the probability matrix (its [Tq, Tk] differs per sequence)");
  OASIS_REQUIRE(!layout_free || opt.layout == AttentionLayout::bhtd, "layout", what,
                " tensors have one layout; leave AttentionOptions::layout at its default");
}

/// The option rules of the dense op (null logits, scale, window, normaliser), through
/// check_attention_shapes on one-token tensors of the call's head counts and sizes.
inline void check_dense_options(index_t H, index_t H_kv, index_t d_h, index_t d_v, AttentionOptions opt) {
  opt.layout = AttentionLayout::bthd;
  check_attention_shapes(Tensor<float>({1, 1, H, d_h}), Tensor<float>({1, 1, H_kv, d_h}), Tensor<float>({1, 1, H_kv, d_v}), opt);
}

/// Rows [begin, begin + n) of a [total, heads, d] tensor as the dense [1, n, heads, d] (bthd).
template <class T>
Tensor<T> packed_rows(const Tensor<T>& x, index_t begin, index_t n) {
  Tensor<T> y({1, n, x.dim(1), x.dim(2)});
  const index_t w = x.dim(1) * x.dim(2);
  std::copy(x.data() + begin * w, x.data() + (begin + n) * w, y.data());
  return y;
}

/// Columns [begin, begin + n) of a [H, total] statistic as the dense [1, H, n].
template <class T>
Tensor<T> packed_stat(const Tensor<T>& x, index_t begin, index_t n) {
  Tensor<T> y({1, x.dim(0), n});
  for (index_t h = 0; h < x.dim(0); ++h) std::copy(x.ptr(h) + begin, x.ptr(h) + begin + n, y.ptr(0, h));
  return y;
}

/// The dense call of one sequence: bthd, and no visible key when it has none.
inline AttentionOptions sequence_options(const AttentionOptions& opt, AttentionLayout layout, index_t keys) {
  AttentionOptions o = opt;
  o.layout = layout;
  if (keys == 0) o.key_lengths = {0};
  return o;
}

/// A sequence without keys runs on one zero key that key_lengths = {0} masks: rows fully masked.
template <class T>
Tensor<T> keys_or_dummy(const Tensor<T>& x, index_t begin, index_t n) {
  return n > 0 ? packed_rows(x, begin, n) : Tensor<T>({1, 1, x.dim(1), x.dim(2)});
}

}  // namespace detail

/// Validates shapes, offsets and options of a packed call; throws naming the argument. q, k and v
/// finite.
template <class T>
VarlenShape check_varlen_args(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const std::vector<index_t>& cu_seqlens_q,
                              const std::vector<index_t>& cu_seqlens_k, const AttentionOptions& opt) {
  require_rank(q, 3, "q", "[total_q, H, d_h] (packed THD)");
  require_rank(k, 3, "k", "[total_k, H_kv, d_h] (packed THD)");
  require_rank(v, 3, "v", "[total_k, H_kv, d_v] (packed THD)");
  const VarlenShape s{static_cast<index_t>(cu_seqlens_q.size()) - 1, q.dim(1), k.dim(1), q.dim(0), k.dim(0), q.dim(2), v.dim(2)};
  OASIS_REQUIRE(s.H > 0 && s.d_h > 0, "q", "empty head dimension in ", shape_str(q.shape()));
  OASIS_REQUIRE(s.H_kv > 0 && s.d_v > 0, "k", "empty head dimension in k ", shape_str(k.shape()), " or v ", shape_str(v.shape()));
  OASIS_REQUIRE(k.dim(2) == s.d_h, "k", "head size ", k.dim(2), " differs from q's ", s.d_h);
  OASIS_REQUIRE(v.dim(0) == s.total_k && v.dim(1) == s.H_kv, "v", "shape ", shape_str(v.shape()), " does not match k ",
                shape_str(k.shape()), " in keys and kv heads");
  OASIS_REQUIRE(cu_seqlens_k.size() == cu_seqlens_q.size(), "cu_seqlens_k", "has ", cu_seqlens_k.size(),
                " entries, cu_seqlens_q ", cu_seqlens_q.size(), " (both hold B + 1 offsets)");
  detail::check_cu_seqlens(cu_seqlens_q, s.total_q, "cu_seqlens_q", "q");
  detail::check_cu_seqlens(cu_seqlens_k, s.total_k, "cu_seqlens_k", "k");
  detail::check_per_sequence_options(opt, "the packed (THD) layout", true);
  detail::check_dense_options(s.H, s.H_kv, s.d_h, s.d_v, opt);
  require_finite_inputs(q, k, v);
  return s;
}

/// Validates the packed cotangents: out [total_q, H, d_v], lse and p_null [H, total_q] or empty,
/// finite; the normaliser softmax or softmax1.
template <class T>
void check_varlen_cotangents(const VarlenShape& s, const AttentionOptions& opt, const AttentionCotangents<T>& d) {
  const Shape out{s.total_q, s.H, s.d_v}, rows{s.H, s.total_q};
  OASIS_REQUIRE(d.out.shape() == out, "dout", "shape ", shape_str(d.out.shape()), " is not [total_q, H, d_v] = ", shape_str(out));
  OASIS_REQUIRE(d.lse.empty() || d.lse.shape() == rows, "dlse", "shape ", shape_str(d.lse.shape()),
                " is not [H, total_q] = ", shape_str(rows), " (the packed statistics are head-major)");
  OASIS_REQUIRE(d.p_null.empty() || d.p_null.shape() == rows, "dp_null", "shape ", shape_str(d.p_null.shape()),
                " is not [H, total_q] = ", shape_str(rows), " (the packed statistics are head-major)");
  OASIS_REQUIRE(opt.normalizer == RowNorm::softmax || opt.normalizer == RowNorm::softmax1, "normalizer",
                "no backward for ", to_string(opt.normalizer), " (the backward covers softmax and softmax1)");
  require_finite(d.out, "dout");
  require_finite(d.lse, "dlse");
  require_finite(d.p_null, "dp_null");
}

/// The packed forward with `dense(q_i, k_i, v_i, opt_i)` (token_attention's signature) run on each
/// sequence's dense bthd copy.
template <class T, class Dense>
AttentionResult<T> attention_varlen_with(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                         const std::vector<index_t>& cu_seqlens_q, const std::vector<index_t>& cu_seqlens_k,
                                         const AttentionOptions& opt, Dense dense) {
  const VarlenShape s = check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, opt);
  AttentionResult<T> r;
  r.out = Tensor<T>({s.total_q, s.H, s.d_v});
  r.lse = Tensor<T>({s.H, s.total_q});
  r.p_null = Tensor<T>({s.H, s.total_q});
  for (index_t i = 0; i < s.B; ++i) {
    const std::size_t ii = static_cast<std::size_t>(i);
    const index_t q0 = cu_seqlens_q[ii], tq = cu_seqlens_q[ii + 1] - q0;
    const index_t k0 = cu_seqlens_k[ii], tk = cu_seqlens_k[ii + 1] - k0;
    if (tq == 0) continue;
    const AttentionResult<T> ri = dense(detail::packed_rows(q, q0, tq), detail::keys_or_dummy(k, k0, tk),
                                        detail::keys_or_dummy(v, k0, tk),
                                        detail::sequence_options(opt, AttentionLayout::bthd, tk));
    std::copy(ri.out.data(), ri.out.data() + ri.out.size(), r.out.ptr(q0));
    for (index_t h = 0; h < s.H; ++h)
      for (index_t t = 0; t < tq; ++t) {
        r.lse(h, q0 + t) = ri.lse(0, h, t);
        r.p_null(h, q0 + t) = ri.p_null(0, h, t);
      }
  }
  return r;
}

/// The packed backward with `dense(q_i, k_i, v_i, d_i, opt_i)` (token_attention_backward's
/// signature) run on each sequence; the null logits' gradient summed over the sequences in order.
template <class T, class Dense>
AttentionGrads<T> attention_varlen_backward_with(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                                 const std::vector<index_t>& cu_seqlens_q,
                                                 const std::vector<index_t>& cu_seqlens_k, const AttentionCotangents<T>& d,
                                                 const AttentionOptions& opt, Dense dense) {
  const VarlenShape s = check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, opt);
  check_varlen_cotangents(s, opt, d);
  AttentionGrads<T> g;
  g.q = Tensor<T>(q.shape());
  g.k = Tensor<T>(k.shape());
  g.v = Tensor<T>(v.shape());
  if (opt.normalizer == RowNorm::softmax1) g.null_logits = Tensor<T>({s.H});
  for (index_t i = 0; i < s.B; ++i) {
    const std::size_t ii = static_cast<std::size_t>(i);
    const index_t q0 = cu_seqlens_q[ii], tq = cu_seqlens_q[ii + 1] - q0;
    const index_t k0 = cu_seqlens_k[ii], tk = cu_seqlens_k[ii + 1] - k0;
    if (tq == 0) continue;  // no query sees these keys: their gradients stay 0
    const AttentionCotangents<T> di{detail::packed_rows(d.out, q0, tq),
                                    d.lse.empty() ? Tensor<T>() : detail::packed_stat(d.lse, q0, tq),
                                    d.p_null.empty() ? Tensor<T>() : detail::packed_stat(d.p_null, q0, tq)};
    const AttentionGrads<T> gi = dense(detail::packed_rows(q, q0, tq), detail::keys_or_dummy(k, k0, tk),
                                       detail::keys_or_dummy(v, k0, tk), di,
                                       detail::sequence_options(opt, AttentionLayout::bthd, tk));
    std::copy(gi.q.data(), gi.q.data() + gi.q.size(), g.q.ptr(q0));
    if (tk > 0) {
      std::copy(gi.k.data(), gi.k.data() + gi.k.size(), g.k.ptr(k0));
      std::copy(gi.v.data(), gi.v.data() + gi.v.size(), g.v.ptr(k0));
    }
    for (index_t h = 0; h < g.null_logits.size(); ++h) g.null_logits[h] += gi.null_logits[h];
  }
  return g;
}

/// The reference packed attention (docs/spec.md §8): token_attention per sequence.
template <class T>
AttentionResult<T> token_attention_varlen(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                          const std::vector<index_t>& cu_seqlens_q, const std::vector<index_t>& cu_seqlens_k,
                                          const AttentionOptions& opt = {}) {
  return attention_varlen_with(q, k, v, cu_seqlens_q, cu_seqlens_k, opt,
                               [](const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& c, const AttentionOptions& o) {
                                 return token_attention(a, b, c, o);
                               });
}

/// The reference packed backward: token_attention_backward per sequence. d: out [total_q, H, d_v],
/// lse and p_null [H, total_q] (empty: 0). Grads: q, k, v packed, null_logits [H] summed over the
/// sequences (softmax1); bias and scores empty.
template <class T>
AttentionGrads<T> token_attention_varlen_backward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                                  const std::vector<index_t>& cu_seqlens_q,
                                                  const std::vector<index_t>& cu_seqlens_k, const AttentionCotangents<T>& d,
                                                  const AttentionOptions& opt = {}) {
  return attention_varlen_backward_with(
      q, k, v, cu_seqlens_q, cu_seqlens_k, d, opt,
      [](const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& c, const AttentionCotangents<T>& e,
         const AttentionOptions& o) { return token_attention_backward(a, b, c, e, o); });
}

}  // namespace oasis
