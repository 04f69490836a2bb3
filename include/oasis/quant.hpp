// oasis/quant.hpp — fake (simulated) uniform quantisation for W8A8-style studies (SPEC §6,
// docs/baselines.md).
//
// A scheme has a bit width b, a kind and a granularity; ranges are min-max over each group.
//   symmetric   qmax = 2^(b-1) - 1, scale = max|x| / qmax,
//               q = clamp(rne(x / scale), -qmax, qmax),            x^ = q * scale
//               (restricted, zero-centred grid: -2^(b-1) is not used)
//   asymmetric  lo = min(min x, 0), hi = max(max x, 0) (the range always holds 0, so 0 is exact),
//               scale = (hi - lo) / (2^b - 1), zp = clamp(rne(-lo / scale), 0, 2^b - 1),
//               q = clamp(rne(x / scale) + zp, 0, 2^b - 1),          x^ = (q - zp) * scale
// rne is round half to even (IEEE default). A group whose values are all 0 gets scale 1, zp 0
// (every value is exactly representable). In exact arithmetic |x - x^| <= scale / 2 inside the
// range; docs/baselines.md gives the floating-point bound the tests check.
// Granularity: per_tensor (one range), per_channel (one range per index along `channel_axis`;
// axis 0 is the output channel of a [out, in] weight), per_token (one range per row of the
// tensor viewed as [numel / last, last]: each token of an activation [..., T, d]).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "oasis/error.hpp"
#include "oasis/tensor.hpp"

namespace oasis {

enum class QuantGranularity { per_tensor, per_channel, per_token };

struct QuantScheme {
  int bits = 8;
  bool symmetric = true;
  QuantGranularity granularity = QuantGranularity::per_tensor;
  index_t channel_axis = 0;  ///< used by per_channel
};

/// Range parameters of one quantisation of one tensor (one entry per group).
template <class T>
struct QuantParams {
  QuantScheme scheme;
  Shape shape;                  ///< shape of the tensor the parameters were computed for
  std::vector<T> scale;         ///< > 0
  std::vector<T> zero_point;    ///< integer-valued; 0 for symmetric
};

/// Round half to even, exact for every representable x (x - floor(x) is exact below 2^p).
template <class T>
T round_half_even(const T& x) {
  using std::floor;
  const T f = floor(x);
  const T d = x - f;
  if (d < T(0.5)) return f;
  if (d > T(0.5)) return f + T(1);
  return floor(f / T(2)) * T(2) == f ? f : f + T(1);  // tie: the even neighbour
}

inline std::string_view to_string(QuantGranularity g) {
  switch (g) {
    case QuantGranularity::per_tensor: return "per_tensor";
    case QuantGranularity::per_channel: return "per_channel";
    case QuantGranularity::per_token: return "per_token";
  }
  return "unknown";
}

namespace detail {
inline void check_scheme(const QuantScheme& s, const Shape& shape) {
  OASIS_REQUIRE(s.bits >= 2 && s.bits <= 16, "bits", "must be in [2, 16], got ", s.bits);
  OASIS_REQUIRE(shape_numel(shape) > 0, "x", "empty tensor ", shape_str(shape));
  if (s.granularity == QuantGranularity::per_channel)
    OASIS_REQUIRE(s.channel_axis >= 0 && s.channel_axis < static_cast<index_t>(shape.size()), "channel_axis",
                  s.channel_axis, " is not an axis of shape ", shape_str(shape));
}
/// Number of groups and the group of flat index i.
struct QuantGroups {
  index_t count = 1, stride = 1, dim = 1, row = 1;
  QuantGranularity g = QuantGranularity::per_tensor;
  index_t of(index_t i) const {
    switch (g) {
      case QuantGranularity::per_tensor: return 0;
      case QuantGranularity::per_channel: return (i / stride) % dim;
      case QuantGranularity::per_token: return i / row;
    }
    return 0;
  }
};
inline QuantGroups quant_groups(const QuantScheme& s, const Shape& shape) {
  QuantGroups q;
  q.g = s.granularity;
  if (s.granularity == QuantGranularity::per_channel) {
    const auto ax = static_cast<std::size_t>(s.channel_axis);
    q.dim = shape[ax];
    for (std::size_t d = ax + 1; d < shape.size(); ++d) q.stride *= shape[d];
    q.count = q.dim;
  } else if (s.granularity == QuantGranularity::per_token) {
    q.row = shape.empty() ? 1 : shape.back();
    q.count = shape_numel(shape) / q.row;
  }
  return q;
}
inline double qmax_sym(int bits) { return std::ldexp(1.0, bits - 1) - 1.0; }
inline double qmax_asym(int bits) { return std::ldexp(1.0, bits) - 1.0; }
}  // namespace detail

/// Min-max range parameters of x under scheme s.
template <class T>
QuantParams<T> minmax_quant_params(const Tensor<T>& x, const QuantScheme& s) {
  using std::abs;
  detail::check_scheme(s, x.shape());
  require_finite(x, "x");
  const detail::QuantGroups G = detail::quant_groups(s, x.shape());
  std::vector<T> lo(static_cast<std::size_t>(G.count), T(0)), hi(static_cast<std::size_t>(G.count), T(0));
  for (index_t i = 0; i < x.size(); ++i) {
    const auto g = static_cast<std::size_t>(G.of(i));
    if (x[i] < lo[g]) lo[g] = x[i];
    if (x[i] > hi[g]) hi[g] = x[i];
  }
  QuantParams<T> p{s, x.shape(), std::vector<T>(lo.size()), std::vector<T>(lo.size(), T(0))};
  for (std::size_t g = 0; g < lo.size(); ++g) {
    if (s.symmetric) {
      const T amax = -lo[g] > hi[g] ? -lo[g] : hi[g];
      p.scale[g] = amax > T(0) ? amax / T(detail::qmax_sym(s.bits)) : T(1);
    } else {
      const T qm = T(detail::qmax_asym(s.bits));
      const T range = hi[g] - lo[g];
      p.scale[g] = range > T(0) ? range / qm : T(1);
      T zp = round_half_even(-lo[g] / p.scale[g]);
      p.zero_point[g] = zp < T(0) ? T(0) : (zp > qm ? qm : zp);
    }
  }
  return p;
}

/// Integer codes q of x under fixed parameters p (as T, integer-valued).
template <class T>
Tensor<T> quantize_codes(const Tensor<T>& x, const QuantParams<T>& p) {
  OASIS_REQUIRE(x.shape() == p.shape, "x", "shape ", shape_str(x.shape()), " differs from the parameters' ",
                shape_str(p.shape));
  detail::check_scheme(p.scheme, x.shape());
  require_finite(x, "x");
  const detail::QuantGroups G = detail::quant_groups(p.scheme, x.shape());
  OASIS_REQUIRE(static_cast<index_t>(p.scale.size()) == G.count && p.zero_point.size() == p.scale.size(), "params",
                "has ", p.scale.size(), " scales, expected ", G.count);
  const T lo = p.scheme.symmetric ? T(-detail::qmax_sym(p.scheme.bits)) : T(0);
  const T hi = p.scheme.symmetric ? T(detail::qmax_sym(p.scheme.bits)) : T(detail::qmax_asym(p.scheme.bits));
  Tensor<T> q(x.shape());
  for (index_t i = 0; i < x.size(); ++i) {
    const auto g = static_cast<std::size_t>(G.of(i));
    OASIS_REQUIRE(p.scale[g] > T(0) && is_finite(p.scale[g]), "params", "scale of group ", g, " is not positive");
    const T c = round_half_even(x[i] / p.scale[g]) + p.zero_point[g];
    q[i] = c < lo ? lo : (c > hi ? hi : c);
  }
  return q;
}

/// Dequantised values x^ = (q - zp) * scale of codes q.
template <class T>
Tensor<T> dequantize(const Tensor<T>& q, const QuantParams<T>& p) {
  OASIS_REQUIRE(q.shape() == p.shape, "q", "shape ", shape_str(q.shape()), " differs from the parameters' ",
                shape_str(p.shape));
  const detail::QuantGroups G = detail::quant_groups(p.scheme, q.shape());
  Tensor<T> out(q.shape());
  for (index_t i = 0; i < q.size(); ++i) {
    const auto g = static_cast<std::size_t>(G.of(i));
    out[i] = (q[i] - p.zero_point[g]) * p.scale[g];
  }
  return out;
}

/// Fake quantisation with fixed parameters: dequantize(quantize_codes(x, p), p).
template <class T>
Tensor<T> fake_quantize(const Tensor<T>& x, const QuantParams<T>& p) {
  return dequantize(quantize_codes(x, p), p);
}

/// Fake quantisation with min-max ranges of x itself (dynamic quantisation).
template <class T>
Tensor<T> fake_quantize(const Tensor<T>& x, const QuantScheme& s) {
  return fake_quantize(x, minmax_quant_params(x, s));
}

/// A weight-activation configuration (W<b>A<b>).
struct WAQuantConfig {
  std::string name;        ///< "W8A8", "W6A6", "W4A4"
  QuantScheme weights;     ///< weights [out, in]
  QuantScheme activations; ///< activations [..., T, d]
};

/// The presets of the paper's tables: W8A8, W6A6, W4A4. Following Bondarenko et al. (2023), whom
/// the clipped/gated baselines come from: symmetric per-tensor weights, asymmetric per-tensor
/// activations, min-max ranges (per-tensor activation ranges are the setting that outliers hurt).
inline WAQuantConfig wa_preset(std::string_view name) {
  int bits = 0;
  if (name == "W8A8") bits = 8;
  else if (name == "W6A6") bits = 6;
  else if (name == "W4A4") bits = 4;
  OASIS_REQUIRE(bits != 0, "preset", "unknown quantisation preset '", std::string(name),
                "' (expected W8A8, W6A6 or W4A4)");
  WAQuantConfig c;
  c.name = std::string(name);
  c.weights = QuantScheme{bits, true, QuantGranularity::per_tensor, 0};
  c.activations = QuantScheme{bits, false, QuantGranularity::per_tensor, 0};
  return c;
}

/// A linear layer y = Q_A(x) Q_W(W)^T with fake-quantised activations x [N, in] (one token per
/// row) and weights W [out, in] (PyTorch nn.Linear layout), both with min-max ranges of their
/// own values (dynamic). The product is accumulated in T, left to right over `in`.
template <class T>
Tensor<T> fake_quant_linear(const Tensor<T>& x, const Tensor<T>& W, const WAQuantConfig& cfg) {
  require_rank(x, 2, "x", "[N, in]");
  require_rank(W, 2, "W", "[out, in]");
  OASIS_REQUIRE(x.dim(1) == W.dim(1), "W", "input width ", W.dim(1), " differs from x's ", x.dim(1));
  const Tensor<T> xq = fake_quantize(x, cfg.activations), wq = fake_quantize(W, cfg.weights);
  const index_t N = x.dim(0), in = x.dim(1), out = W.dim(0);
  Tensor<T> y({N, out});
  for (index_t n = 0; n < N; ++n)
    for (index_t o = 0; o < out; ++o) {
      T acc(0);
      for (index_t c = 0; c < in; ++c) acc += xq(n, c) * wq(o, c);
      y(n, o) = acc;
    }
  return y;
}

}  // namespace oasis
