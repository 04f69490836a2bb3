// oasis/attention.hpp — multi-head token attention with a selectable row normaliser (SPEC §2).
//
// Per (batch b, query head h, query t):
//   z_{t,j} = scale * <q_t, k_j>,  scale = 1/sqrt(d_h) unless given,
//   p_t     = normaliser(z_t) over the visible keys (softmax1 uses the head's null logit s_h),
//   A_t     = sum_j p_{t,j} v_j,   and per row LSE1 (or LSE) and p_null.
// Visible keys of row t: j < key_lengths[b] (padding) and, if causal, j <= t + (Tk - Tq)
// (bottom-right alignment, so a query block at the end of a longer key sequence — incremental
// decoding — sees its past). Masked keys are removed from the row, which is exactly -inf masking.
// Grouped-query attention: H_kv divides H; query head h reads kv head h / (H / H_kv).
//
// This is the plain reference: loops in T, left-to-right sums. Its float instance is the
// "same-precision reference" of the tolerance policy (docs/tolerances.md).
#pragma once

#include <optional>
#include <vector>

#include "oasis/normalizer.hpp"
#include "oasis/tensor.hpp"

namespace oasis {

struct AttentionOptions {
  RowNorm normalizer = RowNorm::softmax1;
  /// Null logit per query head (size H) for softmax1; empty means s = 0 (Softmax1).
  /// Given in double and converted to T (exact for T at least as wide as double).
  std::vector<double> null_logits;
  bool causal = false;
  /// Number of valid (non-padding) keys per batch element, each in [0, Tk]; empty = all Tk.
  std::vector<index_t> key_lengths;
  /// Score scale; default 1/sqrt(d_h) evaluated in T.
  std::optional<double> scale;
  /// Also return the probability matrix [B, H, Tq, Tk] (zeros at masked keys).
  bool return_probs = false;
  /// Plain softmax on a row with no visible key (Softmax1 is always defined).
  MaskedRow masked_row = MaskedRow::zero;
  /// Parameters of the parametrised normalisers (clipped softmax: gamma, zeta).
  NormParams norm_params;
};

template <class T>
struct AttentionResult {
  Tensor<T> out;     ///< [B, H, Tq, d_v]
  Tensor<T> lse;     ///< [B, H, Tq]  LSE1 (softmax1, includes the null logit) or LSE (softmax)
  Tensor<T> p_null;  ///< [B, H, Tq]  null probability (0 for plain softmax)
  Tensor<T> probs;   ///< [B, H, Tq, Tk] when requested, else empty
};

/// Shape facts of one attention call, validated once (shared by every backend).
struct AttentionShape {
  index_t B, H, H_kv, Tq, Tk, d_h, d_v;
};

/// Validates shapes, GQA divisibility, lengths and options; throws naming the argument.
template <class T>
AttentionShape check_attention_args(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                    const AttentionOptions& opt) {
  require_rank(q, 4, "q", "[B, H, Tq, d_h]");
  require_rank(k, 4, "k", "[B, H_kv, Tk, d_h]");
  require_rank(v, 4, "v", "[B, H_kv, Tk, d_v]");
  AttentionShape s{q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3), v.dim(3)};
  OASIS_REQUIRE(s.B > 0 && s.H > 0 && s.Tq > 0 && s.d_h > 0, "q", "empty dimension in shape ",
                shape_str(q.shape()));
  OASIS_REQUIRE(s.H_kv > 0 && s.Tk > 0 && s.d_v > 0, "k", "empty dimension in k ",
                shape_str(k.shape()), " or v ", shape_str(v.shape()));
  OASIS_REQUIRE(k.dim(0) == s.B, "k", "batch ", k.dim(0), " differs from q's batch ", s.B);
  OASIS_REQUIRE(v.dim(0) == s.B && v.dim(1) == s.H_kv && v.dim(2) == s.Tk, "v", "shape ",
                shape_str(v.shape()), " does not match k ", shape_str(k.shape()), " in [B, H_kv, Tk]");
  OASIS_REQUIRE(k.dim(3) == s.d_h, "k", "head size ", k.dim(3), " differs from q's ", s.d_h);
  OASIS_REQUIRE(s.H % s.H_kv == 0, "k", "grouped-query attention needs H_kv to divide H, got H = ",
                s.H, ", H_kv = ", s.H_kv);
  OASIS_REQUIRE(opt.null_logits.empty() || static_cast<index_t>(opt.null_logits.size()) == s.H,
                "null_logits", "has ", opt.null_logits.size(), " entries, expected one per query head (",
                s.H, ")");
  for (std::size_t h = 0; h < opt.null_logits.size(); ++h)
    OASIS_REQUIRE(std::isfinite(opt.null_logits[h]), "null_logits", "entry ", h, " is not finite");
  OASIS_REQUIRE(opt.null_logits.empty() || has_null_category(opt.normalizer), "null_logits",
                "given but the normaliser is ", to_string(opt.normalizer), " (no null category)");
  OASIS_REQUIRE(opt.key_lengths.empty() || static_cast<index_t>(opt.key_lengths.size()) == s.B,
                "key_lengths", "has ", opt.key_lengths.size(), " entries, expected one per batch element (",
                s.B, ")");
  for (std::size_t b = 0; b < opt.key_lengths.size(); ++b)
    OASIS_REQUIRE(opt.key_lengths[b] >= 0 && opt.key_lengths[b] <= s.Tk, "key_lengths", "entry ", b,
                  " = ", opt.key_lengths[b], " is outside [0, Tk = ", s.Tk, "]");
  OASIS_REQUIRE(!opt.scale || (std::isfinite(*opt.scale) && *opt.scale > 0), "scale",
                "must be finite and positive");
  require_finite(q, "q");
  require_finite(k, "k");
  require_finite(v, "v");
  return s;
}

/// Number of keys visible to query t of batch b (masked keys form a suffix of the row).
inline index_t visible_keys(const AttentionShape& s, const AttentionOptions& opt, index_t b, index_t t) {
  index_t n = opt.key_lengths.empty() ? s.Tk : opt.key_lengths[static_cast<std::size_t>(b)];
  if (opt.causal) n = std::min(n, t + (s.Tk - s.Tq) + 1);
  return std::max<index_t>(n, 0);
}

/// The reference token attention (SPEC §2).
template <class T>
AttentionResult<T> token_attention(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                   const AttentionOptions& opt = {}) {
  using std::sqrt;
  const AttentionShape s = check_attention_args(q, k, v, opt);
  const T scale = opt.scale ? T(*opt.scale) : T(1) / sqrt(T(s.d_h));
  const index_t group = s.H / s.H_kv;

  AttentionResult<T> r;
  r.out = Tensor<T>({s.B, s.H, s.Tq, s.d_v});
  r.lse = Tensor<T>({s.B, s.H, s.Tq});
  r.p_null = Tensor<T>({s.B, s.H, s.Tq});
  if (opt.return_probs) r.probs = Tensor<T>({s.B, s.H, s.Tq, s.Tk});

  std::vector<T> z(static_cast<std::size_t>(s.Tk)), p(static_cast<std::size_t>(s.Tk));
  for (index_t b = 0; b < s.B; ++b)
    for (index_t h = 0; h < s.H; ++h) {
      const index_t hk = h / group;
      const T null_logit = opt.null_logits.empty() ? T(0) : T(opt.null_logits[static_cast<std::size_t>(h)]);
      for (index_t t = 0; t < s.Tq; ++t) {
        const index_t m = visible_keys(s, opt, b, t);
        const T* qt = q.ptr(b, h, t);
        for (index_t j = 0; j < m; ++j) {
          const T* kj = k.ptr(b, hk, j);
          T dot(0);
          for (index_t c = 0; c < s.d_h; ++c) dot += qt[c] * kj[c];
          z[static_cast<std::size_t>(j)] = scale * dot;
        }
        const RowStats<T> st = normalize_row(opt.normalizer, z.data(), m, null_logit, p.data(),
                                             opt.norm_params, opt.masked_row, "scores");
        r.lse(b, h, t) = st.lse;
        r.p_null(b, h, t) = st.p_null;
        T* o = r.out.ptr(b, h, t);
        for (index_t j = 0; j < m; ++j) {
          const T pj = p[static_cast<std::size_t>(j)];
          const T* vj = v.ptr(b, hk, j);
          for (index_t c = 0; c < s.d_v; ++c) o[c] += pj * vj[c];
        }
        if (opt.return_probs) {
          T* pr = r.probs.ptr(b, h, t);
          for (index_t j = 0; j < m; ++j) pr[j] = p[static_cast<std::size_t>(j)];
        }
      }
    }
  return r;
}

}  // namespace oasis
