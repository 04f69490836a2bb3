// oasis/ops/attention.hpp — multi-head token attention with a selectable row normaliser (docs/spec.md §2).
//
// Per (batch b, query head h, query t):
//   z_{t,j} = scale * <q_t, k_j>,  scale = 1/sqrt(d_h) unless given,
//   p_t     = normaliser(z_t) over the visible keys (softmax1 uses the head's null logit s_h),
//   A_t     = sum_j p_{t,j} v_j,   and per row LSE1 (or LSE) and p_null.
// Visible keys of row t, with t' = t + (Tk - Tq) (bottom-right alignment, so a query block at the
// end of a longer key sequence — incremental decoding — sees its past; docs/spec.md §8):
//   j < key_lengths[b] (padding), j <= t' if causal, t' - W < j <= t' with a sliding window W.
// Masked keys are removed from the row, which is exactly -inf masking. An additive bias
// z_{t,j} += b_{t,j} (broadcast over batch and heads; -inf masks a key) comes after the scale; the
// null logit is never biased or scaled.
// Grouped-query attention: H_kv divides H; query head h reads kv head h / (H / H_kv).
// Layouts: q, k, v and out are [B, H, T, d] (SDPA) or [B, T, H, d] (Hugging Face); the per-row
// statistics [B, H, Tq] and the probabilities [B, H, Tq, Tk] are the same in both.
//
// This is the plain reference: loops in T, left-to-right sums. Its float instance is the
// "same-precision reference" of the tolerance policy (docs/tolerances.md).
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "oasis/ops/normalizer.hpp"
#include "oasis/ops/online_softmax.hpp"
#include "oasis/core/tensor.hpp"

namespace oasis {

/// Memory layout of q, k, v and out.
enum class AttentionLayout {
  bhtd,  ///< [B, H, T, d] (PyTorch scaled_dot_product_attention)
  bthd,  ///< [B, T, H, d] (Hugging Face, gpt-oss)
};
std::string_view to_string(AttentionLayout l);
AttentionLayout parse_attention_layout(std::string_view name);  // "bhtd" | "bthd"

struct AttentionOptions {
  RowNorm normalizer = RowNorm::softmax1;
  /// Null logit per query head (size H) for softmax1; empty means s = 0 (Softmax1).
  /// Given in double and converted to T (exact for T at least as wide as double). -inf is a head
  /// without a null (plain softmax attention, p_null = 0); +inf puts all the mass on the null
  /// (p = 0, p_null = 1, out = 0, LSE1 = +inf; normalizer.hpp). NaN is refused.
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
  /// Sliding window W >= 1 (0: none): query t sees key j iff t' - W < j <= t' (W counts the
  /// query's own key; the window includes the causal bound).
  index_t window = 0;
  /// Additive score bias [Tq, Tk] or [B or 1, H or 1, Tq, Tk], added after the scale; -inf masks
  /// a key (a boolean mask is the bias 0 / -inf). Empty: none. Given in double, converted to T.
  Tensor<double> bias;
  /// Layout of q, k, v and out.
  AttentionLayout layout = AttentionLayout::bhtd;
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

namespace detail {
/// Dimensions of a rank-4 tensor in the [B, H, T, d] order, whatever its layout.
template <class T>
void bhtd_dims(const Tensor<T>& x, AttentionLayout l, index_t& b, index_t& h, index_t& t, index_t& d) {
  b = x.dim(0);
  h = l == AttentionLayout::bhtd ? x.dim(1) : x.dim(2);
  t = l == AttentionLayout::bhtd ? x.dim(2) : x.dim(1);
  d = x.dim(3);
}
}  // namespace detail

/// Validates shapes, GQA divisibility, lengths and options; throws naming the argument. The
/// finiteness of q, k and v is check_attention_args's (below).
template <class T>
AttentionShape check_attention_shapes(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                      const AttentionOptions& opt) {
  const bool bthd = opt.layout == AttentionLayout::bthd;
  require_rank(q, 4, "q", bthd ? "[B, Tq, H, d_h]" : "[B, H, Tq, d_h]");
  require_rank(k, 4, "k", bthd ? "[B, Tk, H_kv, d_h]" : "[B, H_kv, Tk, d_h]");
  require_rank(v, 4, "v", bthd ? "[B, Tk, H_kv, d_v]" : "[B, H_kv, Tk, d_v]");
  AttentionShape s{};
  index_t kb, kh, kt, kd, vb, vh, vt, vd;
  detail::bhtd_dims(q, opt.layout, s.B, s.H, s.Tq, s.d_h);
  detail::bhtd_dims(k, opt.layout, kb, kh, kt, kd);
  detail::bhtd_dims(v, opt.layout, vb, vh, vt, vd);
  s.H_kv = kh;
  s.Tk = kt;
  s.d_v = vd;
  OASIS_REQUIRE(s.B > 0 && s.H > 0 && s.Tq > 0 && s.d_h > 0, "q", "empty dimension in shape ",
                shape_str(q.shape()));
  OASIS_REQUIRE(s.H_kv > 0 && s.Tk > 0 && s.d_v > 0, "k", "empty dimension in k ",
                shape_str(k.shape()), " or v ", shape_str(v.shape()));
  OASIS_REQUIRE(kb == s.B, "k", "batch ", kb, " differs from q's batch ", s.B);
  OASIS_REQUIRE(vb == s.B && vh == s.H_kv && vt == s.Tk, "v", "shape ", shape_str(v.shape()),
                " does not match k ", shape_str(k.shape()), " in batch, kv heads and keys");
  OASIS_REQUIRE(kd == s.d_h, "k", "head size ", kd, " differs from q's ", s.d_h);
  OASIS_REQUIRE(s.H % s.H_kv == 0, "k", "grouped-query attention needs H_kv to divide H, got H = ",
                s.H, ", H_kv = ", s.H_kv);
  OASIS_REQUIRE(opt.null_logits.empty() || static_cast<index_t>(opt.null_logits.size()) == s.H,
                "null_logits", "has ", opt.null_logits.size(), " entries, expected one per query head (",
                s.H, ")");
  for (std::size_t h = 0; h < opt.null_logits.size(); ++h)
    OASIS_REQUIRE(!std::isnan(opt.null_logits[h]), "null_logits", "entry ", h,
                  " is NaN (-inf: a head without a null; +inf: all the mass on the null)");
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
  OASIS_REQUIRE(opt.window >= 0, "window", "must be >= 0 (0: no window), got ", opt.window);
  if (!opt.bias.empty()) {
    const Tensor<double>& bi = opt.bias;
    const bool r2 = bi.rank() == 2, r4 = bi.rank() == 4;
    OASIS_REQUIRE(r2 || r4, "bias", "expected [Tq, Tk] or [B or 1, H or 1, Tq, Tk], got ", shape_str(bi.shape()));
    const index_t bq = bi.dim(bi.rank() - 2), bk = bi.dim(bi.rank() - 1);
    OASIS_REQUIRE(bq == s.Tq && bk == s.Tk && (r2 || ((bi.dim(0) == 1 || bi.dim(0) == s.B) &&
                                                    (bi.dim(1) == 1 || bi.dim(1) == s.H))),
                  "bias", "shape ", shape_str(bi.shape()), " does not broadcast to [B, H, Tq, Tk] = [", s.B, ", ",
                  s.H, ", ", s.Tq, ", ", s.Tk, "]");
    for (index_t i = 0; i < bi.size(); ++i)
      OASIS_REQUIRE(!std::isnan(bi[i]) && !(std::isinf(bi[i]) && bi[i] > 0), "bias", "entry ", i, " is ", bi[i],
                    " (NaN and +inf are not allowed; mask with -inf)");
  }
  return s;
}

/// For a backend whose kernels take finite null logits only: an infinite one (which the reference
/// takes as a limit) is refused, naming null_logits and the backend.
inline void require_finite_null_logits(const AttentionOptions& opt, const char* backend) {
  for (std::size_t h = 0; h < opt.null_logits.size(); ++h)
    OASIS_REQUIRE(std::isfinite(opt.null_logits[h]), "null_logits", "entry ", h, " is ", opt.null_logits[h], "; the ",
                  backend, " backend takes finite null logits (the reference backend takes -inf and +inf)");
}

/// q, k and v finite, checked in that order (the first failure is reported).
template <class T>
void require_finite_inputs(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v) {
  require_finite(q, "q");
  require_finite(k, "k");
  require_finite(v, "v");
}

/// check_attention_shapes, then require_finite_inputs.
template <class T>
AttentionShape check_attention_args(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                    const AttentionOptions& opt) {
  const AttentionShape s = check_attention_shapes(q, k, v, opt);
  require_finite_inputs(q, k, v);
  return s;
}

/// Keys [begin, end) visible to query t of batch b (padding, causal and window; a bias may mask
/// more). Fully masked when begin >= end.
struct KeyRange {
  index_t begin = 0, end = 0;
  index_t count() const { return end > begin ? end - begin : 0; }
};
/// The rule is oasis/ops/online_softmax.hpp's key_span, which the fused kernels run.
inline KeyRange visible_range(const AttentionShape& s, const AttentionOptions& opt, index_t b, index_t t) {
  const index_t len = opt.key_lengths.empty() ? s.Tk : opt.key_lengths[static_cast<std::size_t>(b)];
  const online::KeySpan<index_t> k = online::key_span<index_t>(len, opt.causal, opt.window, t, s.Tq, s.Tk);
  return {k.begin, k.end};
}

/// Number of keys visible to query t of batch b without a window (a prefix of the row).
inline index_t visible_keys(const AttentionShape& s, const AttentionOptions& opt, index_t b, index_t t) {
  index_t n = opt.key_lengths.empty() ? s.Tk : opt.key_lengths[static_cast<std::size_t>(b)];
  if (opt.causal) n = std::min(n, t + (s.Tk - s.Tq) + 1);
  return std::max<index_t>(n, 0);
}

/// For computations defined on the [B, H, T, d] layout without a window or bias (the baselines'
/// attention variants): throws naming the option that `what` does not take.
inline void require_basic_masking(const AttentionOptions& opt, const char* what) {
  OASIS_REQUIRE(opt.window == 0, "window", what, " does not take a sliding window");
  OASIS_REQUIRE(opt.bias.empty(), "bias", what, " does not take an additive bias");
  OASIS_REQUIRE(opt.layout == AttentionLayout::bhtd, "layout", what, " takes the bhtd layout only");
}

/// The flat index in opt.bias ([Tq, Tk], or [B or 1, H or 1, Tq, Tk] broadcast) of (b, h, t, j);
/// opt.bias must not be empty.
inline index_t attention_bias_offset(const AttentionOptions& opt, index_t b, index_t h, index_t t, index_t j) {
  const Tensor<double>& bi = opt.bias;
  return bi.rank() == 2 ? bi.offset(t, j) : bi.offset(bi.dim(0) == 1 ? 0 : b, bi.dim(1) == 1 ? 0 : h, t, j);
}

/// The bias of (b, h, t, j) (0 without a bias).
inline double attention_bias(const AttentionOptions& opt, index_t b, index_t h, index_t t, index_t j) {
  return opt.bias.empty() ? 0.0 : opt.bias[attention_bias_offset(opt, b, h, t, j)];
}

/// [B, T, H, d] <-> [B, H, T, d] (the same permutation swaps back).
template <class T>
Tensor<T> swap_head_time(const Tensor<T>& x) {
  Tensor<T> y({x.dim(0), x.dim(2), x.dim(1), x.dim(3)});
  for (index_t a = 0; a < x.dim(0); ++a)
    for (index_t i = 0; i < x.dim(1); ++i)
      for (index_t j = 0; j < x.dim(2); ++j)
        for (index_t c = 0; c < x.dim(3); ++c) y(a, j, i, c) = x(a, i, j, c);
  return y;
}

/// The scale of the scores in T: T(opt.scale), or 1 / sqrt(d_h).
template <class T>
T score_scale(const AttentionShape& s, const AttentionOptions& opt) {
  using std::sqrt;
  return opt.scale ? T(*opt.scale) : T(1) / sqrt(T(s.d_h));
}

/// One row of scores in T: z_j = scale <q_t, k_{kr.begin + j}> (+ bias), the products summed in
/// column order, for the keys kr visible to query t of head h (kv head hk). The forward and the
/// backward reference compute their rows with it, so the backward's scores are the forward's.
template <class T>
void score_row(const Tensor<T>& q, const Tensor<T>& k, const AttentionShape& s, const AttentionOptions& opt, T scale,
               index_t b, index_t h, index_t hk, index_t t, const KeyRange& kr, T* z) {
  const T* qt = q.ptr(b, h, t);
  for (index_t j = 0; j < kr.count(); ++j) {
    const T* kj = k.ptr(b, hk, kr.begin + j);
    T dot(0);
    for (index_t c = 0; c < s.d_h; ++c) dot += qt[c] * kj[c];
    z[j] = scale * dot;
    if (!opt.bias.empty()) z[j] += T(attention_bias(opt, b, h, t, kr.begin + j));
  }
}

/// The reference token attention (docs/spec.md §2).
template <class T>
AttentionResult<T> token_attention(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                   const AttentionOptions& opt = {}) {
  const AttentionShape s = check_attention_args(q, k, v, opt);
  if (opt.layout == AttentionLayout::bthd) {  // the same computation on [B, H, T, d] views
    AttentionOptions o = opt;
    o.layout = AttentionLayout::bhtd;
    AttentionResult<T> r = token_attention(swap_head_time(q), swap_head_time(k), swap_head_time(v), o);
    r.out = swap_head_time(r.out);
    return r;
  }
  const T scale = score_scale<T>(s, opt);
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
        const KeyRange kr = visible_range(s, opt, b, t);
        const index_t m = kr.count();
        score_row(q, k, s, opt, scale, b, h, hk, t, kr, z.data());
        const RowStats<T> st = normalize_row(opt.normalizer, z.data(), m, null_logit, p.data(),
                                             opt.norm_params, opt.masked_row, "scores");
        r.lse(b, h, t) = st.lse;
        r.p_null(b, h, t) = st.p_null;
        T* o = r.out.ptr(b, h, t);
        for (index_t j = 0; j < m; ++j) {
          const T pj = p[static_cast<std::size_t>(j)];
          const T* vj = v.ptr(b, hk, kr.begin + j);
          for (index_t c = 0; c < s.d_v; ++c) o[c] += pj * vj[c];
        }
        if (opt.return_probs) {
          T* pr = r.probs.ptr(b, h, t) + kr.begin;
          for (index_t j = 0; j < m; ++j) pr[j] = p[static_cast<std::size_t>(j)];
        }
      }
    }
  return r;
}

inline std::string_view to_string(AttentionLayout l) { return l == AttentionLayout::bhtd ? "bhtd" : "bthd"; }
inline AttentionLayout parse_attention_layout(std::string_view name) {
  if (name == "bhtd") return AttentionLayout::bhtd;
  if (name == "bthd") return AttentionLayout::bthd;
  throw invalid_argument("layout", "unknown attention layout '" + std::string(name) + "' (expected bhtd or bthd)");
}

}  // namespace oasis
