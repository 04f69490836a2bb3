// proofs_checks/evaluate.hpp — the functions under test and their evaluation against mp50.
//
// A check evaluates token attention and depth routing through std::function types (AttentionFn,
// RouteFn): the library on a backend by default, a wrong implementation in the teeth tests.
// attend() and route() evaluate one on an explicit instance in T, compare every output with the
// library in mp50 under the documented bounds (oasis/ops/error_bounds.hpp), and return the T outputs
// converted to mp50 together with those bounds, for the statement's own allowance.
#pragma once

#include <cmath>
#include <functional>
#include <type_traits>
#include <vector>

#include "check_run.hpp"
#include "instances.hpp"
#include "oasis/backends/backend.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/oasis.hpp"

namespace oasis::checks::detail {

template <class T>
using AttentionFn = std::function<AttentionResult<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,
                                                     const AttentionOptions&)>;
template <class T>
using RouteFn = std::function<DepthRoute<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,
                                            const std::vector<SourceKind>&, const DepthOptions&)>;

/// The library's token attention in T (for float on backend b).
template <class T> AttentionFn<T> library_attention(Backend b = Backend::reference) {
  if constexpr (std::is_same_v<T, float>) {
    if (b != Backend::reference)
      return [b](const Tensor<float>& q, const Tensor<float>& k, const Tensor<float>& v, const AttentionOptions& o) {
        return token_attention(b, q, k, v, o);
      };
  }
  (void)b;
  return [](const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionOptions& o) {
    return token_attention<T>(q, k, v, o);
  };
}

/// The library's depth routing in T (for float on backend b).
template <class T> RouteFn<T> library_route(Backend b = Backend::reference) {
  if constexpr (std::is_same_v<T, float>) {
    if (b != Backend::reference)
      return [b](const Tensor<float>& s, const Tensor<float>& g, const Tensor<float>& p,
                 const std::vector<SourceKind>& k, const DepthOptions& o) { return attn_res_route(b, s, g, p, k, o); };
  }
  (void)b;
  return [](const Tensor<T>& s, const Tensor<T>& g, const Tensor<T>& p, const std::vector<SourceKind>& k,
            const DepthOptions& o) { return attn_res_route<T>(s, g, p, k, o); };
}

inline Tensor<double> scaled(Tensor<double> b, double f) {
  for (index_t i = 0; i < b.size(); ++i) b[i] *= f;
  return b;
}

// ---- attention on explicit rows ------------------------------------------------------------------

/// Rows of token attention given by their logits: H heads, one query each, d_h = 1, q = 1,
/// k_j = z_j and scale = 1, so the scores are exactly z_j in every T. Keys at index >= visible
/// are padding (key_lengths), i.e. masked.
struct RowSpec {
  std::vector<std::vector<double>> z;               ///< [H][m] logits (already rounded to T)
  std::vector<std::vector<std::vector<double>>> v;  ///< [H][m][d_v] values (already rounded to T)
  index_t visible = -1;                             ///< visible keys (-1 = all m)
  RowNorm kind = RowNorm::softmax1;
  std::vector<double> null_logits;                  ///< per head (softmax1), empty = 0
};

/// The arguments of token_attention that realise a RowSpec in T.
template <class T> struct RowCall {
  Tensor<T> q, k, v;
  AttentionOptions opt;
};

template <class T> RowCall<T> row_call(const RowSpec& s) {
  const index_t H = static_cast<index_t>(s.z.size()), m = static_cast<index_t>(s.z[0].size());
  const index_t dv = static_cast<index_t>(s.v[0][0].size());
  RowCall<T> c{Tensor<T>({1, H, 1, 1}, T(1)), Tensor<T>({1, H, m, 1}), Tensor<T>({1, H, m, dv}), {}};
  for (index_t h = 0; h < H; ++h)
    for (index_t j = 0; j < m; ++j) {
      c.k(0, h, j, 0) = T(s.z[static_cast<std::size_t>(h)][static_cast<std::size_t>(j)]);
      for (index_t e = 0; e < dv; ++e)
        c.v(0, h, j, e) = T(s.v[static_cast<std::size_t>(h)][static_cast<std::size_t>(j)][static_cast<std::size_t>(e)]);
    }
  c.opt.normalizer = s.kind;
  c.opt.null_logits = s.null_logits;
  c.opt.scale = 1.0;
  c.opt.return_probs = true;
  if (s.visible >= 0) c.opt.key_lengths = {s.visible};
  return c;
}

/// Outputs of one attention evaluation converted to mp50, with their error bounds in T.
struct AttentionEval {
  AttentionResult<mp50> val;
  bounds::AttentionBounds bound;  ///< bounds on |val - exact| (mp50's rounding and the run's bound factor included)
};

/// Evaluate `f` in T on the rows, compare with the library in mp50 (T != mp50) and return the
/// T outputs in mp50.
template <class T>
AttentionEval attend(CheckRun& run, const AttentionFn<T>& f, const RowSpec& spec) {
  const RowCall<T> c = row_call<T>(spec);
  const AttentionResult<T> got = f(c.q, c.k, c.v, c.opt);
  AttentionEval e;
  e.val = {to_mp50(got.out), to_mp50(got.lse), to_mp50(got.p_null), to_mp50(got.probs)};
  const double fac = mp50_rounding_factor<T>() * run.bound_factor();
  if constexpr (std::is_same_v<T, mp50>) {
    bounds::AttentionBounds b = bounds::attention_bounds<T, mp50>(c.q, c.k, c.v, c.opt, e.val);
    e.bound = {scaled(b.out, fac), scaled(b.lse, fac), scaled(b.p_null, fac), scaled(b.probs, fac)};
  } else {
    const RowCall<mp50> call_mp = row_call<mp50>(spec);
    const AttentionResult<mp50> ref = token_attention<mp50>(call_mp.q, call_mp.k, call_mp.v, call_mp.opt);
    bounds::AttentionBounds b = bounds::attention_bounds<T, mp50>(c.q, c.k, c.v, c.opt, ref);
    e.bound = {scaled(b.out, fac), scaled(b.lse, fac), scaled(b.p_null, fac), scaled(b.probs, fac)};
    compare(run, "attention output vs mp50", e.val.out, ref.out, e.bound.out);
    compare(run, "p_null vs mp50", e.val.p_null, ref.p_null, e.bound.p_null);
    compare(run, "probabilities vs mp50", e.val.probs, ref.probs, e.bound.probs);
    compare(run, "LSE vs mp50", e.val.lse, ref.lse, e.bound.lse);
  }
  return e;
}

// ---- depth routing on explicit candidates --------------------------------------------------------

/// One depth-routing call: n candidates, N tokens, width d (all values already rounded to T).
struct RouteSpec {
  index_t n = 0, N = 1, d = 1;
  std::vector<double> sources;  ///< [n, N, d]
  std::vector<double> g_old;    ///< [n, N]
  std::vector<double> psi;      ///< [n, N]
  std::vector<SourceKind> kinds;
  DepthOptions opt;
};

template <class T> Tensor<T> tensor_of(const Shape& s, const std::vector<double>& x) {
  Tensor<T> t(s);
  for (index_t i = 0; i < t.size(); ++i) t[i] = T(x[static_cast<std::size_t>(i)]);
  return t;
}

/// Outputs of one routing evaluation converted to mp50, with their error bounds in T.
struct RouteEval {
  DepthRoute<mp50> val;
  bounds::DepthRouteBounds bound;
};

/// Evaluate `f` in T on the candidates, compare with the library in mp50 (T != mp50) and return
/// the T outputs in mp50.
template <class T>
RouteEval route(CheckRun& run, const RouteFn<T>& f, const RouteSpec& s) {
  const Tensor<T> src = tensor_of<T>({s.n, s.N, s.d}, s.sources), g = tensor_of<T>({s.n, s.N}, s.g_old),
                  psi = tensor_of<T>({s.n, s.N}, s.psi);
  const DepthRoute<T> got = f(src, g, psi, s.kinds, s.opt);
  RouteEval e;
  e.val = {to_mp50(got.h), to_mp50(got.alpha), to_mp50(got.alpha_null), to_mp50(got.g), to_mp50(got.dpsi)};
  const double fac = mp50_rounding_factor<T>() * run.bound_factor();
  auto scale_all = [&](bounds::DepthRouteBounds b) {
    return bounds::DepthRouteBounds{scaled(b.h, fac), scaled(b.alpha, fac), scaled(b.alpha_null, fac),
                                    scaled(b.g, fac), scaled(b.dpsi, fac)};
  };
  if constexpr (std::is_same_v<T, mp50>) {
    e.bound = scale_all(bounds::depth_route_bounds<T, mp50>(src, psi, s.kinds, s.opt, e.val));
  } else {
    const DepthRoute<mp50> ref =
        attn_res_route<mp50>(tensor_of<mp50>({s.n, s.N, s.d}, s.sources), tensor_of<mp50>({s.n, s.N}, s.g_old),
                             tensor_of<mp50>({s.n, s.N}, s.psi), s.kinds, s.opt);
    e.bound = scale_all(bounds::depth_route_bounds<T, mp50>(src, psi, s.kinds, s.opt, ref));
    compare(run, "routed state h vs mp50", e.val.h, ref.h, e.bound.h);
    compare(run, "depth weights vs mp50", e.val.alpha, ref.alpha, e.bound.alpha);
    compare(run, "depth null weight vs mp50", e.val.alpha_null, ref.alpha_null, e.bound.alpha_null);
    compare(run, "coupled logits vs mp50", e.val.g, ref.g, e.bound.g);
  }
  return e;
}

// ---- small linear algebra ------------------------------------------------------------------------

inline mp50 norm_of(const std::vector<mp50>& x) {
  using std::sqrt;
  mp50 s(0);
  for (const mp50& v : x) s += v * v;
  return sqrt(s);
}
inline double norm_of(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}
/// The `len` contiguous elements of a tensor from flat index `offset` (e.g. out(0, h, 0, :)).
template <class X> std::vector<X> last_axis(const Tensor<X>& t, index_t offset, index_t len) {
  return std::vector<X>(t.data() + offset, t.data() + offset + len);
}

// ---- wrong implementations shared by several checks (the teeth tests) ----------------------------

/// Token attention with the normaliser forced to `kind` (null logits dropped when `kind` has no
/// null category): a row normalised with the wrong map.
template <class T> AttentionFn<T> attention_with_normalizer(RowNorm kind) {
  return [kind](const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionOptions& o) {
    AttentionOptions wrong = o;
    wrong.normalizer = kind;
    if (!has_null_category(kind)) wrong.null_logits.clear();
    return token_attention<T>(q, k, v, wrong);
  };
}

/// Depth routing with the depth normaliser forced to `kind`.
template <class T> RouteFn<T> route_with_normalizer(RowNorm kind) {
  return [kind](const Tensor<T>& s, const Tensor<T>& g, const Tensor<T>& p, const std::vector<SourceKind>& k,
                const DepthOptions& o) {
    DepthOptions wrong = o;
    wrong.normalizer = kind;
    return attn_res_route<T>(s, g, p, k, wrong);
  };
}

/// Depth routing that centres psi with the authors' set (every candidate, psi_0 = 0) whatever the
/// configured convention: under paper_v2 the initial state enters the mean.
template <class T> RouteFn<T> route_centring_over_every_candidate() {
  return [](const Tensor<T>& s, const Tensor<T>& g, const Tensor<T>& p, const std::vector<SourceKind>& k,
            const DepthOptions& o) {
    DepthOptions wrong = o;
    wrong.coupling_options.centring = Centring::authors_code;
    return attn_res_route<T>(s, g, p, k, wrong);
  };
}

/// Depth routing whose null category routes to the most recent source (an identity shortcut)
/// instead of the zero vector: h = sum_i alpha_i s_i + alpha_null s_{n-1}.
template <class T> RouteFn<T> route_with_null_as_identity() {
  return [](const Tensor<T>& s, const Tensor<T>& g, const Tensor<T>& p, const std::vector<SourceKind>& k,
            const DepthOptions& o) {
    DepthRoute<T> r = attn_res_route<T>(s, g, p, k, o);
    const index_t n = s.dim(0);
    for (index_t t = 0; t < s.dim(1); ++t)
      for (index_t c = 0; c < s.dim(2); ++c) r.h(t, c) += r.alpha_null[t] * s(n - 1, t, c);
    return r;
  };
}

}  // namespace oasis::checks::detail
