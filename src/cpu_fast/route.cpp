// src/cpu_fast/route.cpp — depth routing on the fast path: the weights of every token come from
// the reference's scalar functions (depth_weights: centring, coupling, clamps, normaliser); only
// the mixing h = sum_i alpha_i s_i, the bandwidth-bound part, is vectorised (kernels/route.inc),
// in the reference's order and arithmetic.
#include <algorithm>
#include <exception>

#include "fast_kernels.hpp"
#include "oasis/core/instances.hpp"
#include "ops.hpp"
#include "workspace.hpp"

namespace oasis::fast {
namespace {

constexpr index_t kRouteTile = 16;  // depth routing: tokens per tile (16 floats: one cache line)
constexpr index_t kMixTokens = 4;  // depth mixing: up to 4 tokens per block when 4 d <= 4096

}  // namespace

void route_impl(const Tensor<float>& sources, const Tensor<float>& g_old, const Tensor<float>& psi,
                const std::vector<SourceKind>& kinds, const DepthOptions& opt, DepthRoute<float>& r) {
  // the reference's shape checks (oasis/ops/depth.hpp); the sources are checked for finiteness only
  // where the mixing's output is not finite (Kernels::mix), with the reference's message.
  // plain variables, not a structured binding: OpenMP regions may not capture bindings (clang)
  const RouteShape shape = check_route_shapes(sources, g_old, psi, kinds);
  const index_t n = shape.n, N = shape.N, d = shape.d;
  ensure_shape(r.h, {N, d});
  ensure_shape(r.alpha, {n, N});
  ensure_shape(r.alpha_null, {N});
  ensure_shape(r.g, {n, N});
  ensure_shape(r.dpsi, {n, N});

  // Per tile of kRouteTile consecutive tokens: the weights, by the reference's scalar functions
  // per token, then the mixing of the tile's tokens, ntok at a time, by the vectorised kernel. The
  // [n, N] inputs and outputs are read and written a tile at a time (one cache line per source
  // row), not token by token (a column of [n, N] touches n lines N floats apart, which share one
  // set of the L1 cache). An error is reported for the first failing token, as the reference's
  // sequential loop would (non-finite sources take precedence, as the reference checks them
  // first); a tile with a failing token is not mixed. One parallel region per call.
  std::exception_ptr err;
  index_t err_t = N;
  bool ok = true;
  const fast::Kernels& K = active_kernels();
  const fast::MixStreams streams = active_streams();
  // blocks of ntok consecutive tokens (adjacent rows in every source: longer contiguous reads)
  const index_t ntok = std::max<index_t>(1, std::min<index_t>(kMixTokens, 4096 / d));
  const index_t ntile = (N + kRouteTile - 1) / kRouteTile;
#pragma omp parallel reduction(&& : ok)
  {
    Vec<float> g(n), ps(n);
    // token-major tiles [kRouteTile][n]: g_old, psi, then alpha (the kernel's layout), g, dpsi
    float* buf = grow(tl_alpha, static_cast<std::size_t>(5 * kRouteTile * n));
    float* tg = buf;
    float* tps = buf + kRouteTile * n;
    float* tal = buf + 2 * kRouteTile * n;
    float* tgn = buf + 3 * kRouteTile * n;
    float* tdp = buf + 4 * kRouteTile * n;
#pragma omp for schedule(static)
    for (index_t tile = 0; tile < ntile; ++tile) {
      const index_t t0 = tile * kRouteTile, cnt = std::min(kRouteTile, N - t0);
      for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < cnt; ++j) {
          tg[j * n + i] = g_old(i, t0 + j);
          tps[j * n + i] = psi(i, t0 + j);
        }
      bool tile_ok = true;
      for (index_t j = 0; j < cnt; ++j) {
        try {
          for (index_t i = 0; i < n; ++i) { g[i] = tg[j * n + i]; ps[i] = tps[j * n + i]; }
          const DepthWeights<float> w = depth_weights(g, ps, kinds, opt);
          r.alpha_null[t0 + j] = w.alpha_null;
          for (index_t i = 0; i < n; ++i) {
            tal[j * n + i] = w.alpha[i];
            tgn[j * n + i] = w.g[i];
            tdp[j * n + i] = w.dpsi[i];
          }
        } catch (...) {
          tile_ok = false;
#pragma omp critical(oasis_cpu_fast_route_error)
          if (t0 + j < err_t) { err_t = t0 + j; err = std::current_exception(); }
        }
      }
      if (!tile_ok) continue;  // the error is rethrown below
      for (index_t i = 0; i < n; ++i)
        for (index_t j = 0; j < cnt; ++j) {
          r.alpha(i, t0 + j) = tal[j * n + i];
          r.g(i, t0 + j) = tgn[j * n + i];
          r.dpsi(i, t0 + j) = tdp[j * n + i];
        }
      for (index_t j = 0; j < cnt; j += ntok) {
        const index_t m = std::min(ntok, cnt - j);
        ok = K.mix(sources.data() + (t0 + j) * d, N * d, tal + j * n, n, d, m, r.h.data() + (t0 + j) * d, streams,
                   t0 + j + m < N) && ok;
      }
    }
  }
  if (err) {
    require_finite(sources, "sources");
    std::rethrow_exception(err);
  }
  // a non-finite output: a non-finite source (the reference's error), or else a finite sum that
  // overflowed, which the reference returns as it is (Kernels::mix)
  if (!ok) require_finite(sources, "sources");
}

}  // namespace oasis::fast
