// oasis/ops/error_bounds.hpp — derived per-element error bounds of the plain reference in T.
//
// For a computation in scalar T (unit roundoff u = eps(T)/2) on inputs that are exact in T,
// these functions return, element by element, a bound on |computed - exact|, where "exact" is
// the high-precision reference (oasis::mp50) on the *same* inputs. The derivation is in
// docs/tolerances.md; in short (first-order, standard model fl(a op b) = (a op b)(1 + d),
// |d| <= u; exp, log, log1p within 1 ulp (<= 2u); sqrt correctly rounded):
//
//  row normaliser, term k (real logits and, for softmax1, the null logit), M = max:
//    a_k   = u (|z_k - M| + 2)             rounding of z_k - M, then exp
//    D_k   = bound on an error already present in z_k (scores, coupled logits; 0 if exact)
//    sigma = sum_k p_k (a_k + D_k) + (m' - 1) u      relative error of the normaliser sum
//    rel(p_j)    <= a_j + D_j + sigma + 2u            (reciprocal, product)
//    |dLSE|      <= sigma + 2u log S + u |LSE|
//    p_j also gets the underflow floor 2 * denorm_min(T).
//  token attention:  D_j = scale u (d_h + 2) sum_c |q_c k_jc| + u |z_j| (dot product, scale),
//    |dA_c| <= sum_j (rel(p_j) p_j + floor) |v_jc| + m u sum_j p_j |v_jc| + underflow_floor.
//  depth routing: D_i from centring (mean of `count` values), beta = softplus(theta) (6u + u|theta|),
//    the product and the subtraction, then the normaliser as above, then the mixing as attention.
//  pseudo-query logits: rel(inv rms) <= (d/2 + 3) u, |dg| <= (rel(inv) + (d + 2) u) sum_c |w_c y_c|.
//  P rounded to a 16-bit format f before P V (tensor-core kernels; p_rounding_bound):
//    |dA_c| gains sum_j (u_f p_j + [p_j < 2 n_f] g_f) |v_jc|.
// A final factor 1.02 covers the second-order terms (valid while every relative term is < 1e-2,
// which holds for float and wider at the sizes of this library; see docs/tolerances.md).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "oasis/ops/attention.hpp"
#include "oasis/ops/depth.hpp"

namespace oasis::bounds {

inline constexpr double kSecondOrder = 1.02;

/// Rounding characteristics of a scalar type.
struct Precision {
  double u;          ///< unit roundoff eps/2
  double p_floor;    ///< absolute floor for probabilities (subnormal underflow): 2 * denorm_min
  double flush = 0;  ///< flush-to-zero: each result below the normal range may be 0 (error < this)
  template <class T> static Precision of() {
    return {static_cast<double>(std::numeric_limits<T>::epsilon()) / 2.0,
            2.0 * static_cast<double>(std::numeric_limits<T>::denorm_min())};
  }
  /// A kernel under judgement, which may flush subnormal results to zero (GPU fast math, FTZ/DAZ
  /// on the CPU): every floor at the smallest normal number min(T) instead of the subnormal
  /// rounding (docs/tolerances.md, "Flush to zero").
  template <class T> static Precision flushing() {
    const double mn = static_cast<double>(std::numeric_limits<T>::min());
    return {static_cast<double>(std::numeric_limits<T>::epsilon()) / 2.0, mn, mn};
  }
};

/// The error coefficient D_j / u of a finite score z = scale <q, k> + bias (the header's formula):
/// Q = sum_c |q_c k_c|, sd = scale <q, k>; the bias's rounding and addition only with a bias.
inline double score_error(index_t d_h, double scale, double Q, double sd, double bias, bool has_bias) {
  return scale * static_cast<double>(d_h + 2) * Q + std::abs(sd) + (has_bias ? std::abs(bias) + std::abs(sd + bias) : 0.0);
}

/// Absolute floor of a mixture sum_{j<m} p_j v_j: the final rounding near zero (p_floor) and,
/// per product p_j v_j that falls below the normal range, an absolute rounding error of at most
/// denorm_min / 2 = p_floor / 4 that the relative model does not cover; flushing, per key a
/// flushed product and a flushed rescaled accumulator (online softmax), each below `flush`.
inline double underflow_floor(const Precision& pr, index_t m) {
  return pr.p_floor * (1.0 + 0.25 * static_cast<double>(m)) + 2.0 * pr.flush * static_cast<double>(m);
}

/// a_k of the header: the rounding of x_k = z_k - M and of its exponential (within 2u), relative.
inline double exp_term_error(double z, double M, double u) { return u * (std::abs(z - M) + 2.0); }
/// rel(p_k) of the header: a_k + D_k + sigma + 2u, with the second-order factor.
inline double term_rel_bound(double a, double D, double sigma, double u) { return kSecondOrder * (a + D + sigma + 2.0 * u); }
/// |dLSE| of the header: sigma + 2u log S + u |LSE|, with log S = LSE - M (>= 0), and the second-order factor.
inline double lse_bound(double sigma, double lse_ref, double M, double u) {
  const double logS = std::max(0.0, lse_ref - M);
  return kSecondOrder * (sigma + 2.0 * u * logS + u * std::abs(lse_ref));
}

/// Bounds of one normalised row.
struct RowBound {
  std::vector<double> p;   ///< per real category
  double p_null = 0;       ///< null probability
  double lse = 0;          ///< LSE1 / LSE
  std::vector<double> rel; ///< relative bound of each p_j (used by the output bound)
  double rel_max = 0;      ///< max_j rel_j
};

/// Row normaliser bound. z: logits as computed in T (copied to double), z_err: bound on an
/// error already present in each z (may be null = 0), s/s_err: the null logit and its error,
/// p_ref/p_null_ref/lse_ref: exact results (double copies of the high-precision reference).
/// Written into `b`, its storage reused (hot loops call it once per row).
inline void row_bound_into(const Precision& pr, RowNorm kind, const double* z, const double* z_err, index_t m,
                           double s, double s_err, const double* p_ref, double p_null_ref, double lse_ref, RowBound& b) {
  OASIS_REQUIRE(kind == RowNorm::softmax || kind == RowNorm::softmax1, "normalizer",
                "no derived error bound for ", to_string(kind), " (bounds cover softmax and softmax1)");
  b.p.resize(static_cast<std::size_t>(m));  // every entry set below (0 where exact)
  b.rel.resize(b.p.size());
  b.p_null = b.lse = b.rel_max = 0;
  auto exact = [&] {
    std::fill(b.p.begin(), b.p.end(), 0.0);
    std::fill(b.rel.begin(), b.rel.end(), 0.0);
  };
  // an infinite null logit: -inf is no null term; +inf makes every result exact (p = 0, p_null = 1)
  if (kind == RowNorm::softmax1 && std::isinf(s) && s > 0) return exact();
  const bool has_null = kind == RowNorm::softmax1 && !std::isinf(s);
  double M = has_null ? s : -std::numeric_limits<double>::infinity();
  index_t terms = has_null ? 1 : 0;
  for (index_t j = 0; j < m; ++j) {
    if (std::isinf(z[j])) continue;  // masked: exactly 0 in every implementation
    M = std::max(M, z[j]);
    ++terms;
  }
  if (std::isinf(M)) return exact();  // plain softmax, fully masked: documented zero, exact
  const double u = pr.u;
  double sigma = has_null ? p_null_ref * (exp_term_error(s, M, u) + s_err) : 0.0;
  for (index_t j = 0; j < m; ++j)
    if (!std::isinf(z[j])) sigma += p_ref[j] * (exp_term_error(z[j], M, u) + (z_err ? z_err[j] : 0.0));
  sigma += static_cast<double>(std::max<index_t>(terms - 1, 0)) * u;
  double rel_max = 0;  // a local: a field of b could alias the arrays, and its store each step serialises the loop
  for (index_t j = 0; j < m; ++j) {
    const bool masked = std::isinf(z[j]);
    const double rel = masked ? 0.0 : term_rel_bound(exp_term_error(z[j], M, u), z_err ? z_err[j] : 0.0, sigma, u);
    b.rel[static_cast<std::size_t>(j)] = rel;
    rel_max = std::max(rel_max, rel);
    b.p[static_cast<std::size_t>(j)] = masked ? 0.0 : rel * std::abs(p_ref[j]) + pr.p_floor;
  }
  b.rel_max = rel_max;
  if (has_null) b.p_null = term_rel_bound(exp_term_error(s, M, u), s_err, sigma, u) * p_null_ref + pr.p_floor;
  b.lse = lse_bound(sigma, lse_ref, M, u);
}
/// row_bound_into on a fresh RowBound.
inline RowBound row_bound(const Precision& pr, RowNorm kind, const double* z, const double* z_err, index_t m,
                          double s, double s_err, const double* p_ref, double p_null_ref, double lse_ref) {
  RowBound b;
  row_bound_into(pr, kind, z, z_err, m, s, s_err, p_ref, p_null_ref, lse_ref, b);
  return b;
}

/// Bounds of a token-attention result (shapes as AttentionResult).
struct AttentionBounds {
  Tensor<double> out, lse, p_null, probs;
};

/// Bound on |token_attention<T>(q,k,v,opt) - exact| per element. `ref` is the high-precision
/// result on the same inputs and MUST have been computed with return_probs = true.
template <class T, class R>
AttentionBounds attention_bounds(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                 const AttentionOptions& opt, const AttentionResult<R>& ref) {
  const AttentionShape s = check_attention_args(q, k, v, opt);
  OASIS_REQUIRE(!ref.probs.empty(), "ref", "the reference must be computed with return_probs = true");
  if (opt.layout == AttentionLayout::bthd) {  // bounds on [B, H, T, d] views, out swapped back
    AttentionOptions o = opt;
    o.layout = AttentionLayout::bhtd;
    AttentionResult<R> rr = ref;
    rr.out = swap_head_time(ref.out);
    AttentionBounds b = attention_bounds(swap_head_time(q), swap_head_time(k), swap_head_time(v), o, rr);
    b.out = swap_head_time(b.out);
    return b;
  }
  const Precision pr = Precision::of<T>();
  const double u = pr.u;
  const double scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(s.d_h));
  const index_t group = s.H / s.H_kv;
  AttentionBounds b{Tensor<double>({s.B, s.H, s.Tq, s.d_v}), Tensor<double>({s.B, s.H, s.Tq}),
                    Tensor<double>({s.B, s.H, s.Tq}), Tensor<double>({s.B, s.H, s.Tq, s.Tk})};
  // rows are independent: (batch, head) pairs in parallel (nothing below throws: the normaliser
  // row_bound would refuse is refused here first)
  OASIS_REQUIRE(opt.normalizer == RowNorm::softmax || opt.normalizer == RowNorm::softmax1, "normalizer",
                "no derived error bound for ", to_string(opt.normalizer), " (bounds cover softmax and softmax1)");
#pragma omp parallel for schedule(dynamic)
  for (index_t unit = 0; unit < s.B * s.H; ++unit) {
    std::vector<double> z(static_cast<std::size_t>(s.Tk)), zerr(z.size()), p(z.size());
    {
      const index_t bb = unit / s.H, h = unit % s.H;
      const index_t hk = h / group;
      const double sl = opt.null_logits.empty() ? 0.0 : opt.null_logits[static_cast<std::size_t>(h)];
      const double s_err = u * std::abs(sl);  // conversion of the double null logit to T
      for (index_t t = 0; t < s.Tq; ++t) {
        const KeyRange kr = visible_range(s, opt, bb, t);
        const index_t m = kr.count();
        for (index_t j = 0; j < m; ++j) {
          const index_t key = kr.begin + j;
          double dot = 0, absdot = 0;
          for (index_t c = 0; c < s.d_h; ++c) {
            const double x = static_cast<double>(q(bb, h, t, c)) * static_cast<double>(k(bb, hk, key, c));
            dot += x;
            absdot += std::abs(x);
          }
          const double bias = attention_bias(opt, bb, h, t, key);
          z[static_cast<std::size_t>(j)] = scale * dot + bias;
          // the bias: rounded to T (u |b|) and added (u |z|)
          zerr[static_cast<std::size_t>(j)] =
              std::isinf(bias) ? 0.0 : u * score_error(s.d_h, scale, absdot, scale * dot, bias, !opt.bias.empty());
          p[static_cast<std::size_t>(j)] = static_cast<double>(ref.probs(bb, h, t, key));
        }
        const RowBound rb = row_bound(pr, opt.normalizer, z.data(), zerr.data(), m, sl, s_err, p.data(),
                                      static_cast<double>(ref.p_null(bb, h, t)), static_cast<double>(ref.lse(bb, h, t)));
        b.lse(bb, h, t) = rb.lse;
        b.p_null(bb, h, t) = rb.p_null;
        for (index_t j = 0; j < m; ++j) b.probs(bb, h, t, kr.begin + j) = rb.p[static_cast<std::size_t>(j)];
        for (index_t c = 0; c < s.d_v; ++c) {
          double err = 0, mass = 0;
          for (index_t j = 0; j < m; ++j) {
            const double av = std::abs(static_cast<double>(v(bb, hk, kr.begin + j, c)));
            err += rb.p[static_cast<std::size_t>(j)] * av;
            mass += p[static_cast<std::size_t>(j)] * av;
          }
          b.out(bb, h, t, c) = kSecondOrder * (err + static_cast<double>(m) * u * mass) + underflow_floor(pr, m);
        }
      }
    }
  }
  return b;
}

/// A 16-bit floating-point format a kernel rounds an intermediate to: its unit roundoff, its
/// smallest normal number and half its subnormal spacing (the largest rounding error below the
/// normal range).
struct Format16 {
  double u;
  double min_normal;
  double half_gap;
};
inline constexpr Format16 kBinary16{0x1p-11, 0x1p-14, 0x1p-25};
inline constexpr Format16 kBfloat16{0x1p-8, 0x1p-126, 0x1p-134};

/// The term a kernel adds to the output bound when it rounds the probabilities to the format f
/// before P V while the normaliser S sums the unrounded ones (the tensor-core kernels, as
/// FlashAttention does): the kernel computes o = sum_j p^_j v_j / S with p^_j = fl_f(p_j), so
///     |sum_j (p^_j - p_j) v_jc| <= sum_{visible j} (u_f p_j + [p_j < 2 n_f] g_f) |v_jc|
/// to first order (docs/tolerances.md, "Tensor cores"). The rounded weight is the unnormalised
/// w_j = e^{z_j - M'} of the running maximum M' <= M; it is rounded with relative error u_f when
/// it is normal, which p_j >= 2 n_f guarantees (w_j >= e^{z_j - M} = p_j S >= p_j, S >= 1, and the
/// factor 2 absorbs the float error of w_j), else with absolute error g_f, which the rescale by
/// e^{M' - M} <= 1 and the division by S >= 1 only shrink. Masked keys have p^ = p = 0 exactly.
/// `ref` is the high-precision result (with probabilities) on the same inputs; the returned
/// tensor has the shape of `out` and adds to AttentionBounds::out (times kSecondOrder).
template <class T, class R>
Tensor<double> p_rounding_bound(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                const AttentionOptions& opt, const AttentionResult<R>& ref, const Format16& f) {
  const AttentionShape s = check_attention_args(q, k, v, opt);
  OASIS_REQUIRE(!ref.probs.empty(), "ref", "the reference must be computed with return_probs = true");
  if (opt.layout == AttentionLayout::bthd) {  // on [B, H, T, d] views, swapped back
    AttentionOptions o = opt;
    o.layout = AttentionLayout::bhtd;
    return swap_head_time(
        p_rounding_bound(swap_head_time(q), swap_head_time(k), swap_head_time(v), o, ref, f));
  }
  const index_t group = s.H / s.H_kv;
  Tensor<double> term({s.B, s.H, s.Tq, s.d_v});
  for (index_t b = 0; b < s.B; ++b)
    for (index_t h = 0; h < s.H; ++h)
      for (index_t t = 0; t < s.Tq; ++t) {
        const KeyRange kr = visible_range(s, opt, b, t);
        for (index_t j = kr.begin; j < kr.end; ++j) {
          const double p = std::abs(static_cast<double>(ref.probs(b, h, t, j)));
          const double w = f.u * p + (p < 2.0 * f.min_normal ? f.half_gap : 0.0);
          for (index_t c = 0; c < s.d_v; ++c)
            term(b, h, t, c) += kSecondOrder * w * std::abs(static_cast<double>(v(b, h / group, j, c)));
        }
      }
  return term;
}

/// The coupling strength and its rounding in T (unit roundoff u): beta_raw = softplus(theta) in T
/// (exp, log1p, add: <= 6u relative; theta rounded to T: u |theta| sigmoid(theta)) or the given beta
/// rounded once (u beta); beta = min(beta_raw, beta_max) (a capped beta is beta_max rounded once).
struct BetaBound {
  double raw, raw_err;  ///< beta_raw (exact) and the bound on its error in T
  double beta, err;     ///< beta after the cap and the bound on its error in T
};
inline BetaBound beta_bound(const DepthOptions& opt, double u) {
  const CouplingOptions& co = opt.coupling_options;
  BetaBound b{};
  if (opt.beta) {
    b.raw = *opt.beta;
    b.raw_err = u * b.raw;
  } else {
    b.raw = std::max(opt.theta, 0.0) + std::log1p(std::exp(-std::abs(opt.theta)));
    const double sig = 1.0 / (1.0 + std::exp(-opt.theta));
    b.raw_err = 6.0 * u * b.raw + u * std::abs(opt.theta) * sig;
  }
  b.beta = std::min(b.raw, co.beta_max);
  b.err = b.raw > co.beta_max ? u * b.beta : b.raw_err;
  return b;
}

/// Bounds of a depth-routing result (shapes as DepthRoute).
struct DepthRouteBounds {
  Tensor<double> h, alpha, alpha_null, g, dpsi;
};

/// Worst-case bounds of one token's depth weights.
struct DepthTokenBound {
  RowBound rb;                   ///< alpha (rb.p), alpha_null, the log-normaliser, rel
  std::vector<double> g, dpsi;   ///< bounds of the coupled logits and of the centred statistic
  std::vector<double> g_err;     ///< first-order error of each coupled logit (before the 1.02)
  double mean_abs = 0;           ///< |mean| of the centring set
  index_t mean_count = 0;        ///< size of the centring set
  bool coupled = false;
};

/// One token: psi[i] (the token's n values), the exact coupled logits g, centred statistic dpsi,
/// weights alpha and alpha_null. Centring: the mean of mean_count values (gamma) and a
/// subtraction, |dDpsi_i| <= u (|Dpsi_i| + (c + 1) mean|psi|); the coupled logit g - beta Dpsi:
/// beta |dDpsi_i| + |Dpsi_i| |dbeta| + u |beta Dpsi_i| + u |g_i| (clamping is 1-Lipschitz); then
/// the normaliser row.
inline DepthTokenBound depth_token_bound(const Precision& pr, const BetaBound& beta, const double* psi,
                                         const std::vector<SourceKind>& kinds, const DepthOptions& opt, const double* g,
                                         const double* dpsi, const double* alpha, double alpha_null,
                                         const double* g_old_err = nullptr) {
  const double u = pr.u;
  const CouplingOptions& co = opt.coupling_options;
  const index_t n = static_cast<index_t>(kinds.size());
  DepthTokenBound t;
  index_t count = 0;
  for (SourceKind kd : kinds) count += has_null_evidence(kd, co.headless) ? 1 : 0;
  t.mean_count = co.centring == Centring::paper_v2 ? count : n;
  t.coupled = opt.coupling && (co.centring == Centring::authors_code || count >= 2);
  for (index_t i = 0; i < n; ++i)
    if (has_null_evidence(kinds[static_cast<std::size_t>(i)], co.headless)) t.mean_abs += std::abs(psi[i]);
  t.mean_abs /= static_cast<double>(std::max<index_t>(t.mean_count, 1));
  t.g.assign(static_cast<std::size_t>(n), 0.0);
  t.dpsi = t.g_err = t.g;
  for (index_t i = 0; i < n; ++i) {
    double e = g_old_err ? g_old_err[i] : 0.0;  // an error already in g_old (clamping is 1-Lipschitz)
    if (t.coupled) {
      const bool in_set =
          co.centring == Centring::authors_code || has_null_evidence(kinds[static_cast<std::size_t>(i)], co.headless);
      const double dp = dpsi[i];
      const double dpsi_err = in_set ? u * (std::abs(dp) + (static_cast<double>(t.mean_count) + 1.0) * t.mean_abs) : 0.0;
      t.dpsi[static_cast<std::size_t>(i)] = kSecondOrder * dpsi_err;
      e += beta.beta * dpsi_err + std::abs(dp) * beta.err + u * std::abs(beta.beta * dp) + u * std::abs(g[i]);
    }
    t.g_err[static_cast<std::size_t>(i)] = e;
    t.g[static_cast<std::size_t>(i)] = kSecondOrder * e;
  }
  // the log-normaliser of the exact logits
  double mx = opt.normalizer == RowNorm::softmax1 ? 0.0 : -std::numeric_limits<double>::infinity();
  for (index_t i = 0; i < n; ++i) mx = std::max(mx, g[i]);
  double S = opt.normalizer == RowNorm::softmax1 ? std::exp(-mx) : 0.0;
  for (index_t i = 0; i < n; ++i) S += std::exp(g[i] - mx);
  t.rb = row_bound(pr, opt.normalizer, g, t.g_err.data(), n, 0.0, 0.0, alpha, alpha_null, mx + std::log(S));
  return t;
}

/// Bound on |attn_res_route<T>(...) - exact| per element; `ref` is the high-precision result.
/// `g_old_err` (optional, [n, N]) bounds an error already present in g_old (logits a router
/// computed in T); null: g_old is exact. The bounds use the exact coupled logits of ref.
template <class T, class R>
DepthRouteBounds depth_route_bounds(const Tensor<T>& sources, const Tensor<T>& psi, const std::vector<SourceKind>& kinds,
                                    const DepthOptions& opt, const DepthRoute<R>& ref,
                                    const Tensor<double>* g_old_err = nullptr) {
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2);
  const Precision pr = Precision::of<T>();
  const double u = pr.u;
  const BetaBound beta = beta_bound(opt, u);
  DepthRouteBounds b{Tensor<double>({N, d}), Tensor<double>({n, N}), Tensor<double>({N}), Tensor<double>({n, N}),
                     Tensor<double>({n, N})};
  std::vector<double> ps(static_cast<std::size_t>(n)), g(ps.size()), dp(ps.size()), a(ps.size()), ge(ps.size());
  for (index_t t = 0; t < N; ++t) {
    for (index_t i = 0; i < n; ++i) {
      const auto iu = static_cast<std::size_t>(i);
      ge[iu] = g_old_err ? (*g_old_err)(i, t) : 0.0;
      ps[iu] = static_cast<double>(psi(i, t));
      g[iu] = static_cast<double>(ref.g(i, t));
      dp[iu] = static_cast<double>(ref.dpsi(i, t));
      a[iu] = static_cast<double>(ref.alpha(i, t));
    }
    const DepthTokenBound tb = depth_token_bound(pr, beta, ps.data(), kinds, opt, g.data(), dp.data(), a.data(),
                                                 static_cast<double>(ref.alpha_null[t]), ge.data());
    b.alpha_null[t] = tb.rb.p_null;
    for (index_t i = 0; i < n; ++i) {
      b.alpha(i, t) = tb.rb.p[static_cast<std::size_t>(i)];
      b.g(i, t) = tb.g[static_cast<std::size_t>(i)];
      b.dpsi(i, t) = tb.dpsi[static_cast<std::size_t>(i)];
    }
    for (index_t c = 0; c < d; ++c) {
      double err = 0, mass = 0;
      for (index_t i = 0; i < n; ++i) {
        const double av = std::abs(static_cast<double>(sources(i, t, c)));
        err += tb.rb.p[static_cast<std::size_t>(i)] * av;
        mass += a[static_cast<std::size_t>(i)] * av;
      }
      b.h(t, c) = kSecondOrder * (err + static_cast<double>(n) * u * mass) + underflow_floor(pr, n);
    }
  }
  return b;
}

/// Bound on |pseudo_query_logits<T>(...) - exact| per element (shape [n, N]).
template <class T>
Tensor<double> pseudo_query_logits_bounds(const Tensor<T>& sources, const Tensor<T>& w, const Tensor<T>& gain = {},
                                          const KeyNormOptions& opt = {}) {
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2);
  const double u = opt.compute_in_float32 ? Precision::of<float>().u : Precision::of<T>().u;
  // compute_in_float32 also rounds the inputs to float: relative u_f per input, absorbed below.
  const double in_round = opt.compute_in_float32 && !std::is_same_v<T, float> ? 3.0 * u : 0.0;
  const double rel_inv = (static_cast<double>(d) / 2.0 + 3.0) * u + in_round;
  Tensor<double> b({n, N});
  for (index_t i = 0; i < n; ++i)
    for (index_t t = 0; t < N; ++t) {
      double ss = 0;
      for (index_t c = 0; c < d; ++c) ss += static_cast<double>(sources(i, t, c)) * static_cast<double>(sources(i, t, c));
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + opt.eps);
      double acc = 0;
      for (index_t c = 0; c < d; ++c)
        acc += std::abs(static_cast<double>(w[c]) * static_cast<double>(sources(i, t, c)) * inv *
                        (gain.empty() ? 1.0 : static_cast<double>(gain[c])));
      b(i, t) = kSecondOrder * (rel_inv + (static_cast<double>(d) + 3.0) * u + in_round) * acc +
                std::numeric_limits<double>::min();
    }
  return b;
}

/// Outcome of the kernel parity rule over one or more tensors.
struct ParityOutcome {
  bool ok = true;
  index_t violations = 0;
  double worst_ratio = 0;    ///< max over elements of |x - x_hp| / (2 |x_ref - x_hp| + floor)
  double worst_err = 0;      ///< max |x - x_hp|
  double worst_ref_err = 0;  ///< max |x_ref - x_hp|
  std::string first;         ///< the first violations, one per line
};

/// The kernel parity rule of docs/tolerances.md (item 4), element-wise: a fast kernel's output x
/// (float, on the same inputs as the plain float reference x_ref) must satisfy
///     |x - x_hp| <= 2 |x_ref - x_hp| + floor
/// against the high-precision result x_hp, where floor is the derived bound of the plain reference
/// (attention_bounds, depth_route_bounds, ...). Equal infinities count as error 0; NaN fails.
template <class R>
void check_parity(const std::string& name, const Tensor<float>& got, const Tensor<float>& ref, const Tensor<R>& hp,
                  const Tensor<double>& floor, ParityOutcome& o, int show = 5) {
  if (got.shape() != hp.shape() || ref.shape() != hp.shape() || floor.shape() != hp.shape()) {
    o.ok = false;
    o.first += name + ": shapes " + shape_str(got.shape()) + ", reference " + shape_str(ref.shape()) + ", oracle " +
               shape_str(hp.shape()) + ", floor " + shape_str(floor.shape()) + "\n";
    return;
  }
  auto abs_err = [](double a, double b) {
    return (std::isinf(a) && std::isinf(b) && (a > 0) == (b > 0)) ? 0.0 : std::abs(a - b);
  };
  std::ostringstream os;
  for (index_t i = 0; i < got.size(); ++i) {
    const double h = static_cast<double>(hp[i]);
    const double e = abs_err(got[i], h), er = abs_err(ref[i], h);
    const double allowed = 2.0 * (std::isfinite(er) ? er : 0.0) + floor[i];
    o.worst_err = std::max(o.worst_err, std::isfinite(e) ? e : 0.0);
    o.worst_ref_err = std::max(o.worst_ref_err, std::isfinite(er) ? er : 0.0);
    if (allowed > 0 && std::isfinite(e)) o.worst_ratio = std::max(o.worst_ratio, e / allowed);
    if (!(e <= allowed)) {
      if (o.violations < show)
        os << "  " << name << "[" << i << "]: got " << got[i] << " oracle " << h << " reference " << ref[i]
           << " |err| " << e << " allowed " << allowed << "\n";
      ++o.violations;
      o.ok = false;
    }
  }
  o.first += os.str();
}

}  // namespace oasis::bounds
