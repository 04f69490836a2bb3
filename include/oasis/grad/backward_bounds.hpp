// oasis/grad/backward_bounds.hpp — derived per-element error bounds of the backward reference in T.
//
// As oasis/ops/error_bounds.hpp for the forward: for the backward computed in scalar T (unit roundoff
// u) on inputs and incoming gradients exact in T, a bound on |computed - exact| per element, where
// "exact" is the high-precision backward on the same inputs. First order, standard model
// fl(a op b) = (a op b)(1 + d), |d| <= u; a dot product or recursive sum of n products has absolute
// error <= n u sum |terms|; exp, log, log1p within 2u. The forward quantities the backward
// recomputes (p, p_null, alpha, the coupled logits) carry the forward bounds of error_bounds.hpp.
// Exact values (p, D, ...) come from the high-precision forward; the derivation is in
// docs/tolerances.md ("Backward"). Every bound is multiplied by 1.02 (second-order terms) and
// gets the absolute floor 2 denorm_min(T).
//
// Kinks: where the exact value that decides a clamp (a coupled logit against +-L, beta_raw
// against beta_max, the authors' mass deficit against 0) lies within its own rounding bound of the
// bound, the computed decision may differ from the exact one; the element's bound then also
// admits the other side (|exact gradient| added).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "oasis/ops/error_bounds.hpp"
#include "oasis/grad/attention_backward.hpp"
#include "oasis/grad/pseudo_query_backward.hpp"

namespace oasis::bounds {

/// Bounds of token_attention_backward's results (shapes as AttentionGrads; bias and scores
/// [B, H, Tq, Tk] always filled, null_logits [H] for softmax1).
struct AttentionBackwardBounds {
  Tensor<double> q, k, v, null_logits, bias, scores;
};

/// A backward bound of a bthd call through its bhtd form: f(q, k, v, d, opt, ref) on [B, H, T, d]
/// views (ref.out swapped with them), the gradients' bounds swapped back.
template <class T, class R, class F>
AttentionBackwardBounds backward_bounds_bhtd(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                             const AttentionCotangents<T>& d, const AttentionOptions& opt,
                                             const AttentionResult<R>& ref, F f) {
  AttentionOptions o = opt;
  o.layout = AttentionLayout::bhtd;
  AttentionResult<R> rr = ref;
  rr.out = swap_head_time(ref.out);
  AttentionBackwardBounds b = f(swap_head_time(q), swap_head_time(k), swap_head_time(v),
                                AttentionCotangents<T>{swap_head_time(d.out), d.lse, d.p_null}, o, rr);
  b.q = swap_head_time(b.q);
  b.k = swap_head_time(b.k);
  b.v = swap_head_time(b.v);
  return b;
}

/// Bound on |token_attention_backward<T>(q, k, v, d, opt) - exact| per element. `ref` is the
/// high-precision forward on the same inputs, computed with return_probs = true. `flush`: a kernel
/// that may flush subnormal results to zero (Precision::flushing): each probability, product and
/// sum below the normal range may be lost, an absolute error below min(T) each.
template <class T, class R>
AttentionBackwardBounds attention_backward_bounds(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                                  const AttentionCotangents<T>& d, const AttentionOptions& opt,
                                                  const AttentionResult<R>& ref, bool flush = false) {
  const AttentionShape s = check_attention_args(q, k, v, opt);
  check_attention_cotangents(s, opt, d);
  OASIS_REQUIRE(!ref.probs.empty(), "ref", "the reference must be computed with return_probs = true");
  if (opt.layout == AttentionLayout::bthd)
    return backward_bounds_bhtd(q, k, v, d, opt, ref, [flush](const auto&... a) { return attention_backward_bounds(a..., flush); });
  const AttentionBounds fw = attention_bounds(q, k, v, opt, ref);
  const Precision pr = flush ? Precision::flushing<T>() : Precision::of<T>();
  const double fz = pr.flush;
  const double u = pr.u;
  const double scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(s.d_h));
  const index_t group = s.H / s.H_kv;
  const bool has_null = opt.normalizer == RowNorm::softmax1;
  auto D = [](const auto& x) { return static_cast<double>(x); };

  AttentionBackwardBounds b{Tensor<double>(q.shape()), Tensor<double>(k.shape()), Tensor<double>(v.shape()),
                            has_null ? Tensor<double>({s.H}) : Tensor<double>(),
                            opt.bias.empty() ? Tensor<double>() : Tensor<double>(opt.bias.shape()),
                            Tensor<double>({s.B, s.H, s.Tq, s.Tk})};
  // accumulated sums: S = sum of propagated term errors, A = sum |terms|, and term counts
  Tensor<double> Sk(k.shape()), Ak(k.shape()), Sv(v.shape()), Av(v.shape()), cnt_kv({s.B, s.H_kv, s.Tk});
  Tensor<double> Sn({s.B, s.H}), An({s.B, s.H}), cnt_n({s.B, s.H});  // per batch element, summed below
  Tensor<double> Sb(b.bias.shape()), Ab(b.bias.shape()), cnt_b(b.bias.shape());
  const std::size_t Tk = static_cast<std::size_t>(s.Tk);
  // (batch, kv head) pairs in parallel: each writes only its own keys' sums (a bias shared across
  // them is summed in order, without threads); rows within a pair in the sequential order
#pragma omp parallel for schedule(dynamic) if (opt.bias.empty())
  for (index_t unit = 0; unit < s.B * s.H_kv; ++unit) {
    std::vector<double> p(Tk), P(Tk), dp(Tk), E(Tk), dz(Tk), Z(Tk);
    const index_t bb = unit / s.H_kv, hk = unit % s.H_kv;
    for (index_t h = hk * group; h < (hk + 1) * group; ++h) {
      for (index_t t = 0; t < s.Tq; ++t) {
        const KeyRange kr = visible_range(s, opt, bb, t);
        const index_t m = kr.count();
        const double pn = has_null ? D(ref.p_null(bb, h, t)) : 0.0, Pn = has_null ? fw.p_null(bb, h, t) : 0.0;
        const double dpn = d.p_null.empty() ? 0.0 : D(d.p_null(bb, h, t)), dl = d.lse.empty() ? 0.0 : D(d.lse(bb, h, t));
        // dp_j = <dO_t, v_j> (exact inputs: dot-product rounding d_v u sum |.|), D_t = sum p dp + p_null dP
        double Dt = pn * dpn, absD = pn * std::abs(dpn), ED = Pn * std::abs(dpn);
        for (index_t j = 0; j < m; ++j) {
          const std::size_t jj = static_cast<std::size_t>(j);
          const index_t key = kr.begin + j;
          double x = 0, ax = 0;
          for (index_t c = 0; c < s.d_v; ++c) {
            const double y = D(d.out(bb, h, t, c)) * D(v(bb, hk, key, c));
            x += y;
            ax += std::abs(y);
          }
          p[jj] = D(ref.probs(bb, h, t, key));
          P[jj] = fw.probs(bb, h, t, key);
          dp[jj] = x;
          E[jj] = static_cast<double>(s.d_v) * u * ax;
          Dt += p[jj] * x;
          absD += p[jj] * std::abs(x);
          ED += P[jj] * std::abs(x) + p[jj] * E[jj];
        }
        ED += static_cast<double>(m + 1) * u * absD;
        // the cotangent of p_null may reach the kernel through the probabilities (autograd of the
        // authors' psi, 1 - sum_j p_j): dp_j - dP on every key, D' = sum_j p_j (dp_j - dP), whose
        // dP parts cancel to p_null dP; their errors do not (docs/tolerances.md, "Backward")
        double sP = 0;
        for (index_t j = 0; j < m; ++j) sP += P[static_cast<std::size_t>(j)];
        ED += (sP + static_cast<double>(m + 1) * u * std::max(0.0, 1.0 - pn)) * std::abs(dpn);
        // dz_j = p_j ((dp_j - D) + dLSE): the recomputed p_j, dp_j, D, two roundings and the product
        for (index_t j = 0; j < m; ++j) {
          const std::size_t jj = static_cast<std::size_t>(j);
          const double w = dp[jj] - Dt + dl;
          dz[jj] = p[jj] * w;
          Z[jj] = P[jj] * std::abs(w) + p[jj] * (E[jj] + ED + u * std::abs(dp[jj] - Dt) + 2.0 * u * std::abs(w) + u * std::abs(dpn)) +
                  fz * (std::abs(w) + 2.0);  // p_j flushed, and the product
          b.scores(bb, h, t, kr.begin + j) = kSecondOrder * Z[jj] + pr.p_floor;
        }
        // ds_t = p_null ((dP - D) + dLSE); an infinite null logit's gradient is 0 (attention_backward.hpp)
        if (has_null && (opt.null_logits.empty() || std::isfinite(opt.null_logits[static_cast<std::size_t>(h)]))) {
          const double w = dpn - Dt + dl;
          Sn(bb, h) += Pn * std::abs(w) + pn * (ED + u * std::abs(dpn - Dt) + 2.0 * u * std::abs(w)) + fz * (std::abs(w) + 3.0);
          An(bb, h) += std::abs(pn * w);
          cnt_n(bb, h) += 1;
        }
        // dq_t = scale * sum_j dz_j k_j: m products and sums, then the scale (computed: 2u) and its product
        for (index_t c = 0; c < s.d_h; ++c) {
          double S = 0, A = 0;
          for (index_t j = 0; j < m; ++j) {
            const double kc = std::abs(D(k(bb, hk, kr.begin + j, c)));
            S += Z[static_cast<std::size_t>(j)] * kc;
            A += std::abs(dz[static_cast<std::size_t>(j)]) * kc;
          }
          b.q(bb, h, t, c) = kSecondOrder * (scale * (S + static_cast<double>(m + 3) * u * A) + static_cast<double>(m + 3) * fz) +
                             pr.p_floor;
        }
        for (index_t j = 0; j < m; ++j) {
          const std::size_t jj = static_cast<std::size_t>(j);
          const index_t key = kr.begin + j;
          cnt_kv(bb, hk, key) += 1;
          for (index_t c = 0; c < s.d_h; ++c) {
            const double qc = std::abs(D(q(bb, h, t, c)));
            Sk(bb, hk, key, c) += Z[jj] * qc;
            Ak(bb, hk, key, c) += std::abs(dz[jj]) * qc;
          }
          for (index_t c = 0; c < s.d_v; ++c) {
            const double oc = std::abs(D(d.out(bb, h, t, c)));
            Sv(bb, hk, key, c) += P[jj] * oc + fz * (oc + 1.0);
            Av(bb, hk, key, c) += p[jj] * oc;
          }
          if (!opt.bias.empty()) {
            const index_t off = attention_bias_offset(opt, bb, h, t, key);
            Sb[off] += Z[jj] + fz;
            Ab[off] += std::abs(dz[jj]);
            cnt_b[off] += 1;
          }
        }
      }
    }
  }
  for (index_t bb = 0; bb < s.B; ++bb)
    for (index_t hk = 0; hk < s.H_kv; ++hk)
      for (index_t j = 0; j < s.Tk; ++j) {
        const double n = cnt_kv(bb, hk, j);
        for (index_t c = 0; c < s.d_h; ++c)
          b.k(bb, hk, j, c) =
              kSecondOrder * (scale * (Sk(bb, hk, j, c) + (n + 3.0) * u * Ak(bb, hk, j, c)) + (n + 3.0) * fz) + pr.p_floor;
        for (index_t c = 0; c < s.d_v; ++c)
          b.v(bb, hk, j, c) = kSecondOrder * (Sv(bb, hk, j, c) + n * u * Av(bb, hk, j, c)) + pr.p_floor;
      }
  for (index_t h = 0; h < b.null_logits.size(); ++h) {
    double S = 0, A = 0, n = 0;
    for (index_t bb = 0; bb < s.B; ++bb) S += Sn(bb, h), A += An(bb, h), n += cnt_n(bb, h);
    b.null_logits[h] = kSecondOrder * (S + n * u * A) + pr.p_floor;
  }
  for (index_t i = 0; i < b.bias.size(); ++i) b.bias[i] = kSecondOrder * (Sb[i] + cnt_b[i] * u * Ab[i]) + pr.p_floor;
  return b;
}

/// The forward a backward reads, as FlashAttention-2 reads it: D = rowsum(dO . O) formed from the
/// output O' the forward stored (in the input type), P = exp(S - LSE') recomputed from the LSE1 it
/// stored (docs/tolerances.md, "Designs of real kernels").
struct StoredForward {
  const Tensor<double>* out = nullptr;  ///< O' as given ([B, H, Tq, d_v], the options' layout); null: unknown
  double out_u = 0;                     ///< without `out`: O' is O stored with this unit roundoff
  double out_min = 0;                   ///< and this smallest normal (below it the rounding is absolute)
  const Tensor<double>* lse = nullptr;  ///< LSE1' in nats as given ([B, H, Tq]); null: recomputed in T
};

/// The error a backward made from a stored forward carries besides its own rounding (absolute; to
/// add to attention_backward_bounds, not to be scaled to another precision). With dO'_c = |O'_c - O_c|
/// (given: as measured; not given: out_u max(|O_c|, out_min), the storage rounding; the forward's own error in T
/// is left to the rounding bound, whose D recomputed from P has the same sums) and the probabilities
/// off by a relative eps = e^|LSE' - LSE| - 1 (0 without `lse`):
///   dD   <= sum_c |dO_c| dO'_c + d_v u sum_c |dO_c| (|O_c| + dO'_c) + eps (p_null |dP| + sum_j p_j |dp_j|)
///   d(dz_j) <= eps |dz_j| + (1 + eps) p_j dD, the null's alike; dv_j gains eps p_j |dO|;
///   dq, dk, dbias carry d(dz) as the rounding bound carries its dz terms.
template <class T, class R>
AttentionBackwardBounds stored_forward_bounds(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                              const AttentionCotangents<T>& d, const AttentionOptions& opt,
                                              const AttentionResult<R>& ref, const StoredForward& sf) {
  const AttentionShape s = check_attention_args(q, k, v, opt);
  check_attention_cotangents(s, opt, d);
  OASIS_REQUIRE(!ref.probs.empty(), "ref", "the reference must be computed with return_probs = true");
  if (opt.layout == AttentionLayout::bthd) {
    Tensor<double> ob;
    StoredForward sb = sf;
    if (sf.out) sb.out = &(ob = swap_head_time(*sf.out));
    return backward_bounds_bhtd(q, k, v, d, opt, ref, [&sb](const auto&... a) { return stored_forward_bounds(a..., sb); });
  }
  const double u = Precision::of<T>().u;
  const double scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(s.d_h));
  const index_t group = s.H / s.H_kv;
  const bool has_null = opt.normalizer == RowNorm::softmax1;
  auto D = [](const auto& x) { return static_cast<double>(x); };
  AttentionBackwardBounds b{Tensor<double>(q.shape()), Tensor<double>(k.shape()), Tensor<double>(v.shape()),
                            has_null ? Tensor<double>({s.H}) : Tensor<double>(),
                            opt.bias.empty() ? Tensor<double>() : Tensor<double>(opt.bias.shape()), Tensor<double>()};
  const std::size_t Tk = static_cast<std::size_t>(s.Tk);
  Tensor<double> Bn({s.B, s.H});  // the null logits' part per batch element, summed below
  // (batch, kv head) pairs in parallel, as attention_backward_bounds
#pragma omp parallel for schedule(dynamic) if (opt.bias.empty())
  for (index_t unit = 0; unit < s.B * s.H_kv; ++unit) {
    std::vector<double> Z(Tk);
    const index_t bb = unit / s.H_kv, hk = unit % s.H_kv;
    for (index_t h = hk * group; h < (hk + 1) * group; ++h) {
      for (index_t t = 0; t < s.Tq; ++t) {
        const KeyRange kr = visible_range(s, opt, bb, t);
        const index_t m = kr.count();
        const double lse_x = D(ref.lse(bb, h, t));
        if (!std::isfinite(lse_x)) continue;  // no visible key and no null, or all mass on the null: exact
        const double eps = sf.lse ? std::expm1(std::abs((*sf.lse)(bb, h, t) - lse_x)) : 0.0;
        const double pn = has_null ? D(ref.p_null(bb, h, t)) : 0.0;
        const double dpn = d.p_null.empty() ? 0.0 : D(d.p_null(bb, h, t)), dl = d.lse.empty() ? 0.0 : D(d.lse(bb, h, t));
        double eD = 0, aD = 0, Dt = pn * dpn, absD = pn * std::abs(dpn);
        for (index_t c = 0; c < s.d_v; ++c) {
          const double o = D(ref.out(bb, h, t, c)), g = std::abs(D(d.out(bb, h, t, c)));
          const double dev = sf.out ? std::abs((*sf.out)(bb, h, t, c) - o) : sf.out_u * std::max(std::abs(o), sf.out_min);
          eD += g * dev;
          aD += g * (std::abs(o) + dev);
        }
        std::vector<double> dp(static_cast<std::size_t>(m));
        for (index_t j = 0; j < m; ++j) {
          double x = 0;
          for (index_t c = 0; c < s.d_v; ++c) x += D(d.out(bb, h, t, c)) * D(v(bb, hk, kr.begin + j, c));
          dp[static_cast<std::size_t>(j)] = x;
          const double p = D(ref.probs(bb, h, t, kr.begin + j));
          Dt += p * x;
          absD += p * std::abs(x);
        }
        const double dD = eD + static_cast<double>(s.d_v) * u * aD + eps * absD;
        for (index_t j = 0; j < m; ++j) {
          const double p = D(ref.probs(bb, h, t, kr.begin + j));
          Z[static_cast<std::size_t>(j)] = eps * std::abs(p * (dp[static_cast<std::size_t>(j)] - Dt + dl)) + (1.0 + eps) * p * dD;
        }
        if (has_null && (opt.null_logits.empty() || std::isfinite(opt.null_logits[static_cast<std::size_t>(h)])))
          Bn(bb, h) += kSecondOrder * (eps * std::abs(pn * (dpn - Dt + dl)) + (1.0 + eps) * pn * dD);
        for (index_t c = 0; c < s.d_h; ++c) {
          double S = 0;
          for (index_t j = 0; j < m; ++j) S += Z[static_cast<std::size_t>(j)] * std::abs(D(k(bb, hk, kr.begin + j, c)));
          b.q(bb, h, t, c) = kSecondOrder * scale * S;
        }
        for (index_t j = 0; j < m; ++j) {
          const index_t key = kr.begin + j;
          const double zj = Z[static_cast<std::size_t>(j)], p = D(ref.probs(bb, h, t, key));
          for (index_t c = 0; c < s.d_h; ++c) b.k(bb, hk, key, c) += kSecondOrder * scale * zj * std::abs(D(q(bb, h, t, c)));
          for (index_t c = 0; c < s.d_v; ++c) b.v(bb, hk, key, c) += kSecondOrder * eps * p * std::abs(D(d.out(bb, h, t, c)));
          if (!opt.bias.empty()) b.bias[attention_bias_offset(opt, bb, h, t, key)] += kSecondOrder * zj;
        }
      }
    }
  }
  for (index_t h = 0; h < b.null_logits.size(); ++h)
    for (index_t bb = 0; bb < s.B; ++bb) b.null_logits[h] += Bn(bb, h);
  return b;
}

/// Bounds of pseudo_query_logits_backward's results (gain empty without a gain).
struct PseudoQueryBackwardBounds {
  Tensor<double> sources, w, gain;
};

/// Bound on |pseudo_query_logits_backward<T>(sources, w, gain, dg, opt) - exact| per element.
/// `dg_err` (optional, [n, N]) bounds an error already present in dg (a gradient computed in T).
template <class T>
PseudoQueryBackwardBounds pseudo_query_logits_backward_bounds(const Tensor<T>& sources, const Tensor<T>& w,
                                                              const Tensor<T>& gain, const Tensor<T>& dg,
                                                              const KeyNormOptions& opt = {},
                                                              const Tensor<double>* dg_err = nullptr) {
  require_rank(sources, 3, "sources", "[n, N, d]");
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2);
  const Precision pr = Precision::of<T>();
  const double u = pr.u;
  const bool f32 = opt.compute_in_float32 && !std::is_same_v<T, float>;
  const double un = f32 ? Precision::of<float>().u : u;   // the norm's arithmetic
  const double in_round = f32 ? 3.0 * un : 0.0;            // inputs (x, gain, dy) rounded to float32
  const double rho = (static_cast<double>(d) / 2.0 + 3.0) * un + in_round;  // relative error of inv
  const double dd = static_cast<double>(d);
  auto D = [](const auto& x) { return static_cast<double>(x); };
  PseudoQueryBackwardBounds b{Tensor<double>({n, N, d}), Tensor<double>({d}), gain.empty() ? Tensor<double>() : Tensor<double>({d})};
  std::vector<double> Sw(static_cast<std::size_t>(d)), Aw(Sw.size()), Sg(Sw.size()), Ag(Sw.size());
  std::vector<double> xh(Sw.size()), dxh(Sw.size()), Dxh(Sw.size());
  for (index_t i = 0; i < n; ++i)
    for (index_t t = 0; t < N; ++t) {
      double ss = 0;
      for (index_t c = 0; c < d; ++c) ss += D(sources(i, t, c)) * D(sources(i, t, c));
      const double inv = 1.0 / std::sqrt(ss / dd + opt.eps);
      const double g = D(dg(i, t)), eg = dg_err ? (*dg_err)(i, t) : 0.0;
      double m = 0, am = 0, Em = 0;
      for (index_t c = 0; c < d; ++c) {
        const std::size_t cc = static_cast<std::size_t>(c);
        const double ga = gain.empty() ? 1.0 : D(gain[c]), wc = D(w[c]);
        xh[cc] = D(sources(i, t, c)) * inv;
        const double Exh = (rho + un) * std::abs(xh[cc]);
        const double y = xh[cc] * ga, Ey = (rho + 2.0 * un) * std::abs(y);
        // dw_c += dg y_c
        Sw[cc] += eg * std::abs(y) + std::abs(g) * Ey;
        Aw[cc] += std::abs(g * y);
        // dgain_c += (dg w_c) xhat_c
        Sg[cc] += eg * std::abs(wc * xh[cc]) + std::abs(g * wc) * (Exh + 2.0 * un * std::abs(xh[cc]) + in_round * std::abs(xh[cc]));
        Ag[cc] += std::abs(g * wc * xh[cc]);
        // dxhat_c = (dg w_c) gain_c
        dxh[cc] = g * wc * ga;
        Dxh[cc] = eg * std::abs(wc * ga) + (2.0 * un + in_round) * std::abs(dxh[cc]);
        m += dxh[cc] * xh[cc];
        am += std::abs(dxh[cc] * xh[cc]);
        Em += Dxh[cc] * std::abs(xh[cc]) + std::abs(dxh[cc]) * Exh;
      }
      m /= dd;
      Em = (Em + (dd + 1.0) * un * am) / dd;
      for (index_t c = 0; c < d; ++c) {
        const std::size_t cc = static_cast<std::size_t>(c);
        const double Exh = (rho + un) * std::abs(xh[cc]);
        const double r = dxh[cc] - xh[cc] * m;
        const double Er = Dxh[cc] + Exh * std::abs(m) + std::abs(xh[cc]) * Em + un * std::abs(xh[cc] * m) + un * std::abs(r);
        b.sources(i, t, c) = kSecondOrder * (inv * Er + (rho + 2.0 * un) * inv * std::abs(r)) + pr.p_floor;
      }
    }
  const double cnt = static_cast<double>(n * N);
  for (index_t c = 0; c < d; ++c) {
    const std::size_t cc = static_cast<std::size_t>(c);
    b.w[c] = kSecondOrder * (Sw[cc] + cnt * u * Aw[cc]) + pr.p_floor;
    if (!gain.empty()) b.gain[c] = kSecondOrder * (Sg[cc] + cnt * u * Ag[cc]) + pr.p_floor;
  }
  return b;
}

/// Bound on |null_statistic_backward<T>(dpsi, H) - exact| per element ([B, H, T]): one division
/// by H (u |dp_null|) plus `dpsi_err` / H when dpsi carries an error (optional, [B, T]).
template <class T>
Tensor<double> null_statistic_backward_bounds(const Tensor<T>& dpsi, index_t H, const Tensor<double>* dpsi_err = nullptr) {
  const index_t B = dpsi.dim(0), Tn = dpsi.dim(1);
  const double u = Precision::of<T>().u, fl = Precision::of<T>().p_floor;
  Tensor<double> b({B, H, Tn});
  for (index_t bb = 0; bb < B; ++bb)
    for (index_t h = 0; h < H; ++h)
      for (index_t t = 0; t < Tn; ++t) {
        const double x = std::abs(static_cast<double>(dpsi(bb, t))) / static_cast<double>(H);
        b(bb, h, t) = kSecondOrder * (u * x + (dpsi_err ? (*dpsi_err)(bb, t) / static_cast<double>(H) : 0.0)) + fl;
      }
  return b;
}

}  // namespace oasis::bounds
