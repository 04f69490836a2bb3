// src/cpu_fast/attn_res.cpp — Backend::cpu_fast's fused AttnRes routing (oasis/ops/attn_res.hpp)
// and its backward (oasis/grad/attn_res_backward.hpp).
//
// Forward: g_i = scale (wg^T s_i) inv_i, inv_i = 1 / sqrt(mean_c s_ic^2 + eps), wg = w gain: one
// read of each source row (i, t) gives both sums (AttnResRows::sums, vectorised per ISA); the
// row's logit is the reference's w^T (s_i inv_i gain) with the scalar inv_i taken out of the sum.
// Then the fast depth routing (route.cpp: the reference's scalar weights, the vectorised mix).
//
// Backward, per token t (tokens in fixed chunks of kChunk, the chunks over OpenMP threads):
//   pass 1, each row i: ss_i, dot_i = wg^T s_i and <dh, s_i> in one read; g_i as the forward;
//           da_i = <dh, s_i> + dalpha_i
//   weights: depth_weights and depth_weights_backward (the reference's scalar functions) give
//           dL/dg_i, dL/dpsi_i and dbeta; dg_i = scale dL/dg_i
//   pass 2, each row i (the token's rows, read again from L2): ds = alpha_i dh +
//           RMSNorm-backward(s_i; dy = dg_i w), with m = mean_c dxhat_c xhat_c = dg_i inv_i dot_i / d;
//           P += dg_i inv_i s_i. Above kStreamFloats, ds is written with non-temporal stores.
// dL/dw_c = gain_c P_c and dL/dgain_c = w_c P_c (both sums are sum_{i,t} dg_i inv_i s_ic times the
// other factor), P and dbeta summed per chunk, then over the chunks in order (in double): the
// result does not depend on the number of threads, and repeated calls are bitwise equal.
#include <algorithm>
#include <cmath>
#include <exception>
#include <vector>

#include "attn_res_kernels.hpp"
#include "entry_points.hpp"
#include "oasis/core/instances.hpp"
#include "ops.hpp"
#include "oasis/backends/cpu_fast.hpp"
#include "workspace.hpp"

namespace oasis::fast {
namespace {

constexpr index_t kChunk = 32;  // backward: tokens per partial sum of P and dbeta
// backward: grad sources larger than this are written with non-temporal stores (no read of each
// line into the cache before it is overwritten; the result is far larger than the caches)
constexpr index_t kStreamFloats = index_t(1) << 20;  // 4 MiB

// The reference's checks in its order: the dispatcher's shapes (check_attn_res_shapes), then
// attn_res_logits's scale and pseudo_query_logits's eps and finite w. Non-finite sources are
// reported where an output or a row's sum of squares is not finite (route.cpp's mix: alpha_i times
// a non-finite element is not finite, alpha_i = 0 included; the backward: the sums of squares).
RouteShape check_values(const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain,
                        const Tensor<float>& psi, const std::vector<SourceKind>& kinds, const AttnResOptions& opt) {
  const RouteShape s = check_attn_res_shapes(sources, w, gain, psi, kinds);
  OASIS_REQUIRE(std::isfinite(opt.scale), "scale", "must be finite, got ", opt.scale);
  OASIS_REQUIRE(opt.key_norm.eps > 0 && std::isfinite(opt.key_norm.eps), "eps", "must be finite and positive");
  require_finite(w, "w");
  return s;
}

// wg_c = w_c gain_c (w without a gain): the dot product's weights.
std::vector<float> fold_gain(const Tensor<float>& w, const Tensor<float>& gain) {
  std::vector<float> wg(w.data(), w.data() + w.size());
  if (!gain.empty())
    for (index_t c = 0; c < w.size(); ++c) wg[static_cast<std::size_t>(c)] *= gain[c];
  return wg;
}

// The reference's inverse RMS of a row with sum of squares ss (rms_norm_row's arithmetic).
inline float inverse_rms(float ss, float d, float eps) { return 1.0f / std::sqrt(ss / d + eps); }

// w^T RMSNorm(x) = dot inv (dot = wg^T x). Where ss overflowed (finite x, |x| beyond 2^64 or so),
// inv is 0 and the reference's normalised row x inv gain is 0, so is its logit: 0, not dot * 0
// (NaN when dot overflowed too). A non-finite x makes ss non-finite: the caller reports it.
inline float unit_logit(float ss, float dot, float d, float eps) {
  const float inv = inverse_rms(ss, d, eps);
  return inv == 0.0f ? 0.0f : dot * inv;
}

// Records the error of token t if it is the first failing token so far (the reference's
// sequential loop reports the first).
void record_error(index_t t, index_t& err_t, std::exception_ptr& err) {
#pragma omp critical(oasis_cpu_fast_attn_res_error)
  if (t < err_t) {
    err_t = t;
    err = std::current_exception();
  }
}

void attn_res_impl(const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain,
                   const Tensor<float>& psi, const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                   DepthRoute<float>& r) {
  const RouteShape s = check_values(sources, w, gain, psi, kinds, opt);
  const index_t rows = s.n * s.N, d = s.d;
  const std::vector<float> wg = fold_gain(w, gain);
  const AttnResRows& K = attn_res_rows();
  const float fd = static_cast<float>(d), eps = static_cast<float>(opt.key_norm.eps);
  const float scale = static_cast<float>(opt.scale);
  const float* src = sources.data();
  const float* wgp = wg.data();
  // the logits [n, N]: row i * N + t of the sources [n * N, d] is source i of token t
  Tensor<float> g({s.n, s.N});
  float* gp = g.data();
#pragma omp parallel for schedule(static)
  for (index_t row = 0; row < rows; ++row) {
    float sm[3];
    K.sums(src + row * d, wgp, d, sm);
    gp[row] = unit_logit(sm[0], sm[1], fd, eps) * scale;
  }
  // a non-finite logit (from a non-finite source, gain or an overflow) is reported by the routing
  // as the reference reports it: "sources" when a source is not finite, else "g_old"
  route_impl(sources, g, psi, kinds, opt.depth, r);
}

void attn_res_backward_impl(const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain,
                            const Tensor<float>& psi, const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                            const DepthCotangents<float>& dc, AttnResGrads<float>& r) {
  const RouteShape s = check_values(sources, w, gain, psi, kinds, opt);
  check_depth_cotangents(s, dc);
  const index_t n = s.n, N = s.N, d = s.d;
  const std::vector<float> wg = fold_gain(w, gain);
  const AttnResRows& K = attn_res_rows();
  const float fd = static_cast<float>(d), eps = static_cast<float>(opt.key_norm.eps);
  const float scale = static_cast<float>(opt.scale);
  const DepthOptions& dopt = opt.depth;
  const auto grad_row = n * N * d > kStreamFloats ? K.grad_stream : K.grad;
  // every element of these is written below (or the call throws): the caller's storage is reused
  ensure_shape(r.sources, {n, N, d});
  ensure_shape(r.w, {d});
  if (gain.empty()) r.gain = Tensor<float>();
  else ensure_shape(r.gain, {d});
  ensure_shape(r.psi, {n, N});
  ensure_shape(r.logits, {n, N});
  r.beta = r.theta = 0.0f;

  const index_t nchunk = (N + kChunk - 1) / kChunk;
  std::vector<float> part(static_cast<std::size_t>(nchunk * d));  // P of each chunk
  std::vector<float> dbeta(static_cast<std::size_t>(nchunk));
  std::exception_ptr err;
  index_t err_t = N;
  bool dg_ok = true, ss_ok = true;
#pragma omp parallel reduction(&& : dg_ok, ss_ok)
  {
    Vec<float> g(n), ps(n), da(n);
    std::vector<float> inv(static_cast<std::size_t>(n)), graw(inv.size());
#pragma omp for schedule(static)
    for (index_t chunk = 0; chunk < nchunk; ++chunk) {
      float* P = part.data() + chunk * d;
      float db = 0.0f;
      const index_t t1 = std::min(N, (chunk + 1) * kChunk);
      for (index_t t = chunk * kChunk; t < t1; ++t) {
        const float* dh = dc.h.ptr(t);
        for (index_t i = 0; i < n; ++i) {
          const std::size_t iu = static_cast<std::size_t>(i);
          float sm[3];
          K.sums_dh(sources.ptr(i, t), wg.data(), dh, d, sm);
          ss_ok = ss_ok && std::isfinite(sm[0]);  // false for a non-finite source (or an overflow)
          inv[iu] = inverse_rms(sm[0], fd, eps);
          graw[iu] = unit_logit(sm[0], sm[1], fd, eps);  // w^T RMSNorm(s_i)
          g[i] = graw[iu] * scale;
          ps[i] = psi(i, t);
          da[i] = dc.alpha.empty() ? sm[2] : sm[2] + dc.alpha(i, t);
        }
        const float dan = dc.alpha_null.empty() ? 0.0f : dc.alpha_null[t];
        try {
          const DepthWeights<float> fw = depth_weights(g, ps, kinds, dopt);
          const DepthWeightsGrads<float> wb = depth_weights_backward(fw, g, kinds, dopt, da, dan);
          db += wb.beta;
          for (index_t i = 0; i < n; ++i) {
            const std::size_t iu = static_cast<std::size_t>(i);
            r.logits(i, t) = wb.g_old[i];
            r.psi(i, t) = wb.psi[i];
            const float dg = wb.g_old[i] * scale;  // dL/d(w^T RMSNorm(s_i))
            dg_ok = dg_ok && std::isfinite(dg);
            const float m = dg * graw[iu] / fd;   // mean_c dxhat_c xhat_c
            const AttnResRowGrad a{fw.alpha[i], inv[iu], dg, inv[iu] * m, dg * inv[iu]};
            grad_row(sources.ptr(i, t), wg.data(), dh, d, a, r.sources.ptr(i, t), P);
          }
        } catch (...) {
          record_error(t, err_t, err);
        }
      }
      dbeta[static_cast<std::size_t>(chunk)] = db;
    }
    stream_fence();  // this thread's non-temporal stores, before the region's closing barrier
  }
  // as the reference: non-finite sources first (a sum of squares that is not finite: a non-finite
  // source, or finite ones whose squares overflowed, which pass), then the first failing token's error
  if (err || !ss_ok) require_finite(sources, "sources");
  if (err) std::rethrow_exception(err);
  if (!dg_ok) {  // the reference checks the keys' incoming dg (pseudo_query_logits_backward)
    Tensor<float> dg = r.logits;
    for (index_t i = 0; i < dg.size(); ++i) dg[i] = dg[i] * scale;
    require_finite(dg, "dg");
  }
  // dL/dw = gain P, dL/dgain = w P; P over the chunks in order
  const float* pp = part.data();
#pragma omp parallel for schedule(static)
  for (index_t c = 0; c < d; ++c) {
    double acc = 0.0;
    for (index_t k = 0; k < nchunk; ++k) acc += static_cast<double>(pp[k * d + c]);
    r.w[c] = gain.empty() ? static_cast<float>(acc) : static_cast<float>(static_cast<double>(gain[c]) * acc);
    if (!gain.empty()) r.gain[c] = static_cast<float>(static_cast<double>(w[c]) * acc);
  }
  if (dopt.coupling) {  // attn_res_route_backward's beta and theta
    double db = 0.0;
    for (const float x : dbeta) db += static_cast<double>(x);
    r.beta = coupling_beta_cap_backward(depth_beta_raw<float>(dopt), static_cast<float>(db), dopt.coupling_options);
    if (!dopt.beta) r.theta = r.beta * sigmoid(static_cast<float>(dopt.theta));
  }
}

}  // namespace
}  // namespace oasis::fast

namespace oasis::cpu_fast {

void attn_res_into(const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain, const Tensor<float>& psi,
                   const std::vector<SourceKind>& kinds, const AttnResOptions& opt, DepthRoute<float>& r) {
  fast::attn_res_impl(sources, w, gain, psi, kinds, opt, r);
}

void attn_res_backward_into(const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain,
                            const Tensor<float>& psi, const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                            const DepthCotangents<float>& d, AttnResGrads<float>& g) {
  fast::attn_res_backward_impl(sources, w, gain, psi, kinds, opt, d, g);
}

}  // namespace oasis::cpu_fast

namespace oasis::detail {

DepthRoute<float> cpu_fast_attn_res(const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain,
                                    const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                    const AttnResOptions& opt) {
  DepthRoute<float> r;
  fast::attn_res_impl(sources, w, gain, psi, kinds, opt, r);
  return r;
}

AttnResGrads<float> cpu_fast_attn_res_backward(const Tensor<float>& sources, const Tensor<float>& w,
                                               const Tensor<float>& gain, const Tensor<float>& psi,
                                               const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                                               const DepthCotangents<float>& d) {
  AttnResGrads<float> r;
  fast::attn_res_backward_impl(sources, w, gain, psi, kinds, opt, d, r);
  return r;
}

}  // namespace oasis::detail
