// src/cuda/route.cpp — host side of the CUDA depth router (oasis::attn_res_route semantics):
// Backend::cuda's attn_res_route on host tensors and attn_res_route_device on device buffers,
// both through check_route_args' validation and launch_attn_res_route; and the device entry point
// of the pseudo-query logits.
#include <cmath>

#include "device_util.hpp"
#include "entry_points.hpp"
#include "oasis/backends/cuda.hpp"

namespace oasis::cuda::detail {

RouteSetup check_route_args(const Tensor<float>& sources, const Tensor<float>& g_old, const Tensor<float>& psi,
                            const std::vector<SourceKind>& kinds, const DepthOptions& opt) {
  // oasis::attn_res_route's checks, in its order.
  const auto [n, N, d] = check_route_shapes(sources, g_old, psi, kinds);
  require_finite(sources, "sources");
  require_cuda_normalizer(opt.normalizer, "normalizer");
  require_int(sources.size(), "sources", "size");
  require_int(n, "sources", "number of depth candidates n", kMaxCandidates);
  require_int(d, "sources", "width d", kMaxWidth);
  // oasis::depth_weights' per-token checks: finite logits; with coupling, psi of the candidates
  // with null evidence in [0, 1] (centre_null_statistic) and a valid beta (depth_beta).
  RouteSetup r;
  r.evidence.resize(static_cast<std::size_t>(n));
  for (index_t i = 0; i < n; ++i)
    r.evidence[static_cast<std::size_t>(i)] =
        has_null_evidence(kinds[static_cast<std::size_t>(i)], opt.coupling_options.headless) ? 1 : 0;
  for (index_t t = 0; t < N; ++t)
    for (index_t i = 0; i < n; ++i)
      OASIS_REQUIRE(std::isfinite(g_old(i, t)), "g_old", "non-finite depth logit ", g_old(i, t), " at candidate ", i,
                    " (token ", t, ")");
  if (opt.coupling) {
    for (index_t t = 0; t < N; ++t)
      for (index_t i = 0; i < n; ++i) {
        const float p = psi(i, t);
        OASIS_REQUIRE(!r.evidence[static_cast<std::size_t>(i)] || (std::isfinite(p) && p >= 0.0f && p <= 1.0f), "psi",
                      "entry ", i, " = ", p, " is not a probability in [0, 1] (token ", t, ")");
      }
    r.beta = depth_beta<float>(opt);  // the reference's float beta, bit for bit
    OASIS_REQUIRE(std::isfinite(r.beta) && r.beta >= 0.0f, "beta", "must be finite and >= 0, got ", r.beta);
  }
  return r;
}

void launch_attn_res_route(const float* sources, const float* g_old, const float* psi, index_t n, index_t N, index_t d,
                           const RouteSetup& setup, const DepthOptions& opt, float* h, float* alpha, float* alpha_null,
                           float* g, float* dpsi, CUstream_st* stream) {
  DepthLaunch a;
  a.n = static_cast<int>(n);
  a.N = static_cast<int>(N);
  a.g_old = g_old;
  a.psi = psi;
  for (index_t i = 0; i < n; ++i) a.evidence.flag[i] = setup.evidence[static_cast<std::size_t>(i)];
  a.coupling = opt.coupling;
  a.clamp_uncoupled = setup.clamp_uncoupled;
  a.authors_code = opt.coupling_options.centring == Centring::authors_code;
  a.beta = setup.beta;
  a.score_clamp = static_cast<float>(opt.coupling_options.score_clamp);  // T(score_clamp), inf stays inf
  a.softmax1 = opt.normalizer == RowNorm::softmax1;
  a.g = g;
  a.dpsi = dpsi;
  a.alpha = alpha;
  a.alpha_null = alpha_null;
  check(launch_depth_weights(a, stream), "depth weights launch");
  check(launch_depth_mix(sources, alpha, a.n, a.N, static_cast<int>(d), h, stream), "depth mix launch");
}

DeviceRoute::DeviceRoute(index_t n_, index_t N_, index_t d_)
    : n(n_), N(N_), d(d_),
      g(static_cast<std::size_t>(n * N)), dpsi(static_cast<std::size_t>(n * N)), alpha(static_cast<std::size_t>(n * N)),
      alpha_null(static_cast<std::size_t>(N)), h(static_cast<std::size_t>(N * d)) {}

DepthRoute<float> DeviceRoute::download() const {
  DepthRoute<float> out{Tensor<float>({N, d}), Tensor<float>({n, N}), Tensor<float>({N}), Tensor<float>({n, N}),
                        Tensor<float>({n, N})};
  h.download(out.h.data());
  alpha.download(out.alpha.data());
  alpha_null.download(out.alpha_null.data());
  g.download(out.g.data());
  dpsi.download(out.dpsi.data());
  return out;
}

}  // namespace oasis::cuda::detail

namespace oasis::cuda {

void attn_res_route_device(const float* sources, const float* g_old, const float* psi, index_t n, index_t N,
                           index_t d, const std::vector<SourceKind>& kinds, const DepthOptions& opt, float* h,
                           float* alpha, float* alpha_null, float* g, float* dpsi, CUstream_st* stream) {
  OASIS_REQUIRE(n > 0 && N > 0 && d > 0, "sources", "empty dimension in [n, N, d] = [", n, ", ", N, ", ", d, "]");
  OASIS_REQUIRE(static_cast<index_t>(kinds.size()) == n, "kinds", "has ", kinds.size(), " entries but there are ", n,
                " sources");
  OASIS_REQUIRE(sources && g_old && psi, "sources", "null device pointer among sources, g_old, psi");
  OASIS_REQUIRE(h && alpha && alpha_null && g && dpsi, "h", "null device pointer among the outputs");
  detail::require_cuda_normalizer(opt.normalizer, "normalizer");
  detail::require_int(n, "sources", "number of depth candidates n", detail::kMaxCandidates);
  detail::require_int(d, "sources", "width d", detail::kMaxWidth);
  detail::require_int(n * N * d, "sources", "size");
  detail::RouteSetup setup;
  for (SourceKind k : kinds) setup.evidence.push_back(has_null_evidence(k, opt.coupling_options.headless) ? 1 : 0);
  if (opt.coupling) setup.beta = depth_beta<float>(opt);
  detail::require_device();
  detail::launch_attn_res_route(sources, g_old, psi, n, N, d, setup, opt, h, alpha, alpha_null, g, dpsi, stream);
}

void pseudo_query_logits_device(const float* sources, index_t n, index_t N, index_t d, const float* w,
                                const float* gain, const KeyNormOptions& opt, float* g, CUstream_st* stream) {
  OASIS_REQUIRE(n > 0 && N > 0 && d > 0, "sources", "empty dimension in [n, N, d] = [", n, ", ", N, ", ", d, "]");
  OASIS_REQUIRE(sources && w && g, "sources", "null device pointer among sources, w, g");
  OASIS_REQUIRE(opt.eps > 0 && std::isfinite(opt.eps), "eps", "must be finite and positive");
  detail::require_int(n * N * d, "sources", "size");
  detail::require_device();
  detail::check(detail::launch_pseudo_query_logits(sources, static_cast<int>(n), static_cast<int>(N), static_cast<int>(d),
                                                   w, gain, static_cast<float>(opt.eps), g, stream),
                "pseudo-query logits launch");
}

}  // namespace oasis::cuda

// --- Backend::cuda's entry point (entry_points.hpp) ------------------------------------------------------

namespace oasis::detail {

DepthRoute<float> cuda_attn_res_route(const Tensor<float>& sources, const Tensor<float>& g_old,
                                      const Tensor<float>& psi, const std::vector<SourceKind>& kinds,
                                      const DepthOptions& opt) {
  const cuda::detail::RouteSetup setup = cuda::detail::check_route_args(sources, g_old, psi, kinds, opt);
  cuda::detail::require_device();
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2);
  using cuda::detail::to_device;
  const cuda::detail::DeviceBuffer<float> ds = to_device(sources), dg = to_device(g_old), dp = to_device(psi);
  cuda::detail::DeviceRoute r(n, N, d);
  cuda::detail::launch_attn_res_route(ds.get(), dg.get(), dp.get(), n, N, d, setup, opt, r.h.get(), r.alpha.get(),
                                      r.alpha_null.get(), r.g.get(), r.dpsi.get(), nullptr);
  return r.download();
}

}  // namespace oasis::detail
