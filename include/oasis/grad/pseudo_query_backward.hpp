// oasis/grad/pseudo_query_backward.hpp — the backward of the Kimi pseudo-query logits (docs/spec.md §4, §8).
//
// g_i = w^T y_i,  y_i = RMSNorm(s_i) = xhat * gain,  xhat = s_i * inv,  inv = 1 / sqrt(mean(s_i^2) + eps).
// With dL/dg_i (one number per candidate and token):
//   dw_c    = sum_{i,t} dg_i y_c                    dgain_c = sum_{i,t} dg_i w_c xhat_c
//   dxhat_c = dg_i w_c gain_c                       ds_c    = inv (dxhat_c - xhat_c mean_c'(dxhat_c' xhat_c'))
// (rms_norm_row_backward). The sources get this gradient through their keys; through the mix
// h = sum_i alpha_i s_i they get alpha_i dh (depth_backward.hpp) — router_backward.hpp adds both.
// With KeyNormOptions::compute_in_float32 the norm's backward is evaluated in float32 too, as
// the forward's norm is.
#pragma once

#include <type_traits>
#include <vector>

#include "oasis/ops/depth.hpp"

namespace oasis {

/// Backward of rms_norm_row(x, d, gain, opt, y) given dy: writes dx[0..d) and adds dL/dgain to
/// dgain[0..d) when gain is given (dgain may be null otherwise).
template <class T>
void rms_norm_row_backward(const T* x, index_t d, const T* gain, const KeyNormOptions& opt, const T* dy, T* dx, T* dgain) {
  using std::sqrt;
  if (opt.compute_in_float32 && !std::is_same_v<T, float>) {
    const std::size_t n = static_cast<std::size_t>(d);
    std::vector<float> xf(n), gf, dyf(n), dxf(n), dgf;
    for (std::size_t c = 0; c < n; ++c) { xf[c] = static_cast<float>(x[c]); dyf[c] = static_cast<float>(dy[c]); }
    if (gain) {
      gf.resize(n);
      dgf.assign(n, 0.0f);
      for (std::size_t c = 0; c < n; ++c) gf[c] = static_cast<float>(gain[c]);
    }
    KeyNormOptions o = opt;
    o.compute_in_float32 = false;
    rms_norm_row_backward<float>(xf.data(), d, gain ? gf.data() : nullptr, o, dyf.data(), dxf.data(),
                                 gain ? dgf.data() : nullptr);
    for (std::size_t c = 0; c < n; ++c) dx[c] = T(dxf[c]);
    if (gain)
      for (std::size_t c = 0; c < n; ++c) dgain[c] += T(dgf[c]);
    return;
  }
  T ss(0);
  for (index_t c = 0; c < d; ++c) ss += x[c] * x[c];
  const T inv = T(1) / sqrt(ss / T(d) + T(opt.eps));
  T m(0);  // sum_c dxhat_c xhat_c
  for (index_t c = 0; c < d; ++c) {
    const T xhat = x[c] * inv;
    const T dxhat = gain ? T(dy[c] * gain[c]) : dy[c];
    if (gain) dgain[c] += dy[c] * xhat;
    m += dxhat * xhat;
  }
  m /= T(d);
  for (index_t c = 0; c < d; ++c) {
    const T xhat = x[c] * inv;
    const T dxhat = gain ? T(dy[c] * gain[c]) : dy[c];
    dx[c] = inv * (dxhat - xhat * m);
  }
}

/// Gradients of pseudo_query_logits(sources, w, gain, opt).
template <class T>
struct PseudoQueryGrads {
  Tensor<T> sources;  ///< [n, N, d], through the keys only
  Tensor<T> w;        ///< [d]
  Tensor<T> gain;     ///< [d]; empty without a gain
};

/// The reference backward of pseudo_query_logits given dL/dg [n, N].
template <class T>
PseudoQueryGrads<T> pseudo_query_logits_backward(const Tensor<T>& sources, const Tensor<T>& w, const Tensor<T>& gain,
                                                 const Tensor<T>& dg, const KeyNormOptions& opt = {}) {
  require_rank(sources, 3, "sources", "[n, N, d]");
  const index_t n = sources.dim(0), N = sources.dim(1), d = sources.dim(2);
  require_rank(w, 1, "w", "[d]");
  OASIS_REQUIRE(w.dim(0) == d, "w", "has ", w.dim(0), " entries, sources have width d = ", d);
  OASIS_REQUIRE(gain.empty() || (gain.rank() == 1 && gain.dim(0) == d), "gain", "shape ", shape_str(gain.shape()),
                " is not [d] = [", d, "]");
  OASIS_REQUIRE(dg.shape() == (Shape{n, N}), "dg", "shape ", shape_str(dg.shape()), " is not [n, N] = [", n, ", ", N, "]");
  OASIS_REQUIRE(opt.eps > 0 && std::isfinite(opt.eps), "eps", "must be finite and positive");
  require_finite(w, "w");
  require_finite(dg, "dg");
  PseudoQueryGrads<T> r{Tensor<T>({n, N, d}), Tensor<T>({d}), gain.empty() ? Tensor<T>() : Tensor<T>({d})};
  const std::size_t dd = static_cast<std::size_t>(d);
  std::vector<T> y(dd), dy(dd);
  for (index_t i = 0; i < n; ++i)
    for (index_t t = 0; t < N; ++t) {
      const T* x = sources.ptr(i, t);
      const T* gp = gain.empty() ? nullptr : gain.data();
      rms_norm_row(x, d, gp, opt, y.data());
      const T gi = dg(i, t);
      for (index_t c = 0; c < d; ++c) {
        r.w[c] += gi * y[static_cast<std::size_t>(c)];
        dy[static_cast<std::size_t>(c)] = gi * w[c];
      }
      rms_norm_row_backward(x, d, gp, opt, dy.data(), r.sources.ptr(i, t), gain.empty() ? nullptr : r.gain.data());
    }
  return r;
}

}  // namespace oasis
