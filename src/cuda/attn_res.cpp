// src/cuda/attn_res.cpp — Backend::cuda's fused AttnRes routing (oasis/ops/attn_res.hpp) and its
// backward (oasis/grad/attn_res_backward.hpp), validated as the reference validates.
//
// Forward, all on the device from one upload of sources, w, gain and psi:
//   g_r = (w^T RMSNorm(s_r)) * scale        pseudo_query_kernel (depth.cu), then the scale (attn_res.cu)
//   (h, alpha, alpha_null) = route(g)        depth_weights_kernel and depth_mix_kernel (depth.cu)
// The logits stay on the device; only the index of the first token with a non-finite logit comes
// back (4 bytes), and the logits themselves only to word the error when there is one.
//
// Backward, a hybrid: the O(n N d) work on the device (attn_res.cu: the logits, the weights,
// da = <dh, s_i> + dalpha, grad sources = alpha_i dh + RMSNorm-backward(s_i; dg_i w), the
// deterministic column sums dw and dgain) and the per-token O(n) weight backward on the host: the
// reference's own attn_res_route_backward run on the device's logits g_old and da [n, N] copied
// back, with width-1 zero sources and dalpha = da (its dalpha_i = <0, 0> + da_i = da_i exactly),
// so that dg_old, dpsi, dbeta and dtheta come from depth_weights_backward with every convention of
// the reference (normaliser backward, centring, the score clamp's kink, the beta cap, dbeta summed
// in token order). Reasons: that step is O(n N), 1/d of the sources' size, branchy and sequential
// in dbeta; one implementation keeps the conventions in one place. Its inputs and outputs are
// Tensors (std::vector storage): no Eigen object crosses between this file and the compiled
// instances, whose allocator differs under AddressSanitizer (Eigen's handmade aligned malloc). A
// da that overflowed (|<dh, s_i>| beyond float) is rejected there as a non-finite "dalpha".
#include <cmath>
#include <cstddef>

#include "attn_res_launch.hpp"
#include "device_util.hpp"
#include "entry_points.hpp"

namespace oasis::cuda::detail {
namespace {

/// A validated fused call: the route's setup (evidence flags; beta is set by resolve_token_checks)
/// and the first token whose psi fails centre_null_statistic's check (N when none).
struct FusedSetup {
  index_t n = 0, N = 0, d = 0;
  RouteSetup route;
  index_t psi_bad = 0, psi_i = 0;
  float psi_value = 0.0f;
};

/// oasis::attn_res's checks in its order — attn_res_logits (scale; pseudo_query_logits: shapes,
/// eps, finite w), then attn_res_route (finite sources; the backward's cotangents when given) —
/// and the CUDA backend's limits. The per-token checks of depth_weights need the logits:
/// resolve_token_checks finishes them.
FusedSetup check_fused_args(const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain,
                            const Tensor<float>& psi, const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                            const DepthCotangents<float>* cot) {
  OASIS_REQUIRE(std::isfinite(opt.scale), "scale", "must be finite, got ", opt.scale);
  const RouteShape s = check_attn_res_shapes(sources, w, gain, psi, kinds);
  OASIS_REQUIRE(opt.key_norm.eps > 0 && std::isfinite(opt.key_norm.eps), "eps", "must be finite and positive");
  require_finite(w, "w");
  require_finite(sources, "sources");
  if (cot) check_depth_cotangents(s, *cot);
  require_cuda_normalizer(opt.depth.normalizer, "normalizer");
  require_int(sources.size(), "sources", "size");
  require_int(s.n, "sources", "number of depth candidates n", kMaxCandidates);
  require_int(s.d, "sources", "width d", kMaxWidth);
  FusedSetup f;
  f.n = s.n;
  f.N = s.N;
  f.d = s.d;
  f.psi_bad = s.N;
  f.route.evidence.resize(static_cast<std::size_t>(s.n));
  for (index_t i = 0; i < s.n; ++i)
    f.route.evidence[static_cast<std::size_t>(i)] =
        has_null_evidence(kinds[static_cast<std::size_t>(i)], opt.depth.coupling_options.headless) ? 1 : 0;
  if (opt.depth.coupling)  // centre_null_statistic: psi of the candidates with evidence in [0, 1]
    for (index_t t = 0; t < s.N && f.psi_bad == s.N; ++t)
      for (index_t i = 0; i < s.n; ++i) {
        const float p = psi(i, t);
        if (f.route.evidence[static_cast<std::size_t>(i)] && !(std::isfinite(p) && p >= 0.0f && p <= 1.0f)) {
          f.psi_bad = t;
          f.psi_i = i;
          f.psi_value = p;
          break;
        }
      }
  return f;
}

/// The device logits g_old = scale w^T RMSNorm(s_i) [n, N]; returns the first token with a
/// non-finite logit (N when none).
index_t device_logits(const FusedSetup& f, const float* sources, const float* w, const float* gain,
                      const AttnResOptions& opt, float* g_old) {
  const int n = static_cast<int>(f.n), N = static_cast<int>(f.N), d = static_cast<int>(f.d);
  check(launch_pseudo_query_logits(sources, n, N, d, w, gain, static_cast<float>(opt.key_norm.eps), g_old, nullptr),
        "pseudo-query logits launch");
  DeviceBuffer<int> bad(static_cast<std::size_t>(f.N)), first(1);
  check(launch_attn_res_scale_logits(g_old, n, N, static_cast<float>(opt.scale), bad.get(), first.get(), nullptr),
        "logit scale launch");
  int t = 0;
  first.download(&t);
  return t;
}

/// depth_weights' per-token checks in its order: token t's logits, then its psi; beta (checked at
/// every token) after token 0's. Sets the route's beta.
void resolve_token_checks(FusedSetup& f, index_t g_bad, const float* g_old, const DepthOptions& opt) {
  auto fail_at = [&](index_t t) {
    if (g_bad == t) {  // the error path only: the logits come back to name the candidate
      Tensor<float> g({f.n, f.N});
      check(cudaMemcpy(g.data(), g_old, static_cast<std::size_t>(g.size()) * sizeof(float), cudaMemcpyDeviceToHost),
            "cudaMemcpy D2H");
      for (index_t i = 0; i < f.n; ++i)
        OASIS_REQUIRE(std::isfinite(g(i, t)), "g_old", "non-finite depth logit ", g(i, t), " at candidate ", i,
                      " (token ", t, ")");
    }
    OASIS_REQUIRE(false, "psi", "entry ", f.psi_i, " = ", f.psi_value, " is not a probability in [0, 1] (token ", t,
                  ")");
  };
  const index_t first = g_bad < f.psi_bad ? g_bad : f.psi_bad;
  if (first == 0) fail_at(0);
  if (opt.coupling) {
    f.route.beta = depth_beta<float>(opt);  // the reference's float beta, bit for bit
    OASIS_REQUIRE(std::isfinite(f.route.beta) && f.route.beta >= 0.0f, "beta", "must be finite and >= 0, got ",
                  f.route.beta);
  }
  if (first < f.N) fail_at(first);
}

/// The depth weights kernel alone (launch_attn_res_route without the mix, whose h the backward
/// does not need); the launch filled as route.cpp fills it.
void launch_weights(const FusedSetup& f, const DepthOptions& opt, const float* g_old, const float* psi, float* g,
                    float* dpsi, float* alpha, float* alpha_null) {
  DepthLaunch a;
  a.n = static_cast<int>(f.n);
  a.N = static_cast<int>(f.N);
  a.g_old = g_old;
  a.psi = psi;
  for (index_t i = 0; i < f.n; ++i) a.evidence.flag[i] = f.route.evidence[static_cast<std::size_t>(i)];
  a.coupling = opt.coupling;
  a.clamp_uncoupled = false;  // attn_res clamps only coupled logits
  a.authors_code = opt.coupling_options.centring == Centring::authors_code;
  a.beta = f.route.beta;
  a.score_clamp = static_cast<float>(opt.coupling_options.score_clamp);
  a.softmax1 = opt.normalizer == RowNorm::softmax1;
  a.g = g;
  a.dpsi = dpsi;
  a.alpha = alpha;
  a.alpha_null = alpha_null;
  check(launch_depth_weights(a, nullptr), "depth weights launch");
}

Tensor<float> download(const DeviceBuffer<float>& b, Shape s) {
  Tensor<float> t(std::move(s));
  b.download(t.data());
  return t;
}

}  // namespace
}  // namespace oasis::cuda::detail

namespace oasis::detail {

DepthRoute<float> cuda_attn_res(const Tensor<float>& sources, const Tensor<float>& w, const Tensor<float>& gain,
                                const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                const AttnResOptions& opt) {
  using namespace cuda::detail;
  FusedSetup f = check_fused_args(sources, w, gain, psi, kinds, opt, nullptr);
  require_device();
  const DeviceBuffer<float> ds = to_device(sources), dw = to_device(w), dgain = to_device(gain), dp = to_device(psi);
  DeviceBuffer<float> g_old(static_cast<std::size_t>(f.n * f.N));
  const index_t g_bad = device_logits(f, ds.get(), dw.get(), dgain.get(), opt, g_old.get());
  resolve_token_checks(f, g_bad, g_old.get(), opt.depth);
  DeviceRoute r(f.n, f.N, f.d);
  launch_attn_res_route(ds.get(), g_old.get(), dp.get(), f.n, f.N, f.d, f.route, opt.depth, r.h.get(), r.alpha.get(),
                        r.alpha_null.get(), r.g.get(), r.dpsi.get(), nullptr);
  return r.download();
}

AttnResGrads<float> cuda_attn_res_backward(const Tensor<float>& sources, const Tensor<float>& w,
                                           const Tensor<float>& gain, const Tensor<float>& psi,
                                           const std::vector<SourceKind>& kinds, const AttnResOptions& opt,
                                           const DepthCotangents<float>& d) {
  using namespace cuda::detail;
  FusedSetup f = check_fused_args(sources, w, gain, psi, kinds, opt, &d);
  require_device();
  const index_t n = f.n, N = f.N, dim = f.d;
  const std::size_t nN = static_cast<std::size_t>(n * N);
  const DeviceBuffer<float> ds = to_device(sources), dw = to_device(w), dgain = to_device(gain), dp = to_device(psi),
                            ddh = to_device(d.h), dda = to_device(d.alpha);
  DeviceBuffer<float> g_old(nN), g(nN), dpsi(nN), alpha(nN), alpha_null(static_cast<std::size_t>(N)), da(nN);
  const index_t g_bad = device_logits(f, ds.get(), dw.get(), dgain.get(), opt, g_old.get());
  resolve_token_checks(f, g_bad, g_old.get(), opt.depth);
  // The forward's weights, then da = <dh, s_i> + dalpha on the device.
  launch_weights(f, opt.depth, g_old.get(), dp.get(), g.get(), dpsi.get(), alpha.get(), alpha_null.get());
  check(launch_attn_res_dalpha(ds.get(), ddh.get(), d.alpha.empty() ? nullptr : dda.get(), static_cast<int>(n),
                               static_cast<int>(N), static_cast<int>(dim), da.get(), nullptr),
        "dalpha launch");
  const Tensor<float> hg_old = download(g_old, {n, N});

  // The per-token weight backward on the host (the file's header: why and how): the reference's
  // attn_res_route_backward on width-1 zero sources with dL/dalpha = da, so that its own
  // dalpha_i = <0, 0> + da_i = da_i exactly and its dg_old, dpsi, dbeta, dtheta are the reference's
  // functions of the device's logits and da.
  const DepthCotangents<float> weights_cot{Tensor<float>({N, 1}), download(da, {n, N}), d.alpha_null};
  DepthGrads<float> wg = attn_res_route_backward(Tensor<float>({n, N, 1}), hg_old, psi, kinds, opt.depth, weights_cot);
  AttnResGrads<float> r;
  r.logits = std::move(wg.g_old);
  r.psi = std::move(wg.psi);
  r.beta = wg.beta;
  r.theta = wg.theta;
  Tensor<float> dg = r.logits;  // dL/d(w^T RMSNorm(s_i)) = scale dL/dg
  const float sc = static_cast<float>(opt.scale);
  for (index_t i = 0; i < dg.size(); ++i) dg[i] = dg[i] * sc;
  require_finite(dg, "dg");  // pseudo_query_logits_backward's check of its incoming gradient

  // grad sources (mix + keys) and the column sums dw, dgain on the device.
  const DeviceBuffer<float> ddg = to_device(dg);
  DeviceBuffer<float> gs(static_cast<std::size_t>(sources.size())), inv(nN), gw(static_cast<std::size_t>(dim)),
      gg(gain.empty() ? 0 : static_cast<std::size_t>(dim));
  check(launch_attn_res_grad_sources(ds.get(), ddh.get(), alpha.get(), ddg.get(), dw.get(), dgain.get(),
                                     static_cast<int>(n), static_cast<int>(N), static_cast<int>(dim),
                                     static_cast<float>(opt.key_norm.eps), gs.get(), inv.get(), nullptr),
        "grad sources launch");
  const ParamGradChunks ch = attn_res_param_grad_chunks(static_cast<int>(n * N));
  const std::size_t parts = static_cast<std::size_t>(ch.chunks) * static_cast<std::size_t>(dim);
  DeviceBuffer<float> part_w(parts), part_g(gain.empty() ? 0 : parts);
  check(launch_attn_res_param_grads(ds.get(), inv.get(), ddg.get(), dw.get(), dgain.get(), static_cast<int>(n * N),
                                    static_cast<int>(dim), ch, part_w.get(), part_g.get(), gw.get(), gg.get(), nullptr),
        "parameter grads launch");
  r.sources = download(gs, sources.shape());
  r.w = download(gw, {dim});
  if (!gain.empty()) r.gain = download(gg, {dim});
  return r;
}

}  // namespace oasis::detail
