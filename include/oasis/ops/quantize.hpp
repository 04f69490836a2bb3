// oasis/ops/quantize.hpp — fake (simulated) uniform quantisation, as the model's quantised linear
// layers and the W8A8-style studies use it (docs/spec.md §6; docs/baselines.md; the named presets are in
// oasis/research/quant_presets.hpp).
//
// A scheme has a bit width b, a kind, a grid, a range rule and a granularity.
//   symmetric   codes [-qmax, qmax] with qmax = 2^(b-1) - 1 (restricted, zero-centred grid), or
//               with full_signed_grid [-2^(b-1), qmax] (Bondarenko et al.'s code); with
//               unsigned_if_nonnegative a tensor whose values are all >= 0 uses the unsigned grid
//               [0, 2^b - 1] (their code's rule: signed = min x < 0, one decision per tensor).
//               scale = a / top, top = the grid's largest code, a = the range's max |x|;
//               q = clamp(rne(x / scale), lo, top),                  x^ = q * scale
//   asymmetric  lo = min(min x, 0), hi = max(max x, 0) (range_holds_zero, the default: 0 is exact),
//               or lo = min x, hi = max x (the group's own range, OmniQuant's RTN, their Eq. 2),
//               scale = (hi - lo) / (2^b - 1), zp = rne(-lo / scale) (clamped to [0, 2^b - 1]
//               when the range holds 0; the own range of a one-signed group puts it off the grid),
//               q = clamp(rne(x / scale) + zp, 0, 2^b - 1),          x^ = (q - zp) * scale
// rne is round half to even (IEEE default). A group whose range has zero width is widened to hold
// 0 (a constant c gets [min(c, 0), max(c, 0)], so c is exact; {0} gets scale 1, zp 0). In exact
// arithmetic |x - x^| <= scale / 2 inside the range; docs/baselines.md gives the floating-point
// bound the tests check.
// Range rules: minmax (the group's own min and max), mse_grid (symmetric only; Bondarenko et
// al.'s evaluation of weights: a in {c * step : c = 1..N}, step = (max(|min x|, max x) + margin) / N,
// N = 100, margin = 0.5, the candidate of least sum (x - x^)^2 per group, first on ties), and
// static ranges from calibration (RunningMinMax: min and max of the first calibration batch, then
// r <- (1 - momentum) r_batch + momentum r, momentum 0.9, as their running_minmax estimator).
// Granularity: per_tensor (one range), per_channel (one range per index along `channel_axis`;
// axis 0 is the output channel of a [out, in] weight), per_token (one range per row of the
// tensor viewed as [numel / last, last]: each token of an activation [..., T, d]).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "oasis/core/error.hpp"
#include "oasis/core/tensor.hpp"

namespace oasis {

enum class QuantGranularity { per_tensor, per_channel, per_token };

/// How a group's range is chosen from the values it quantises.
enum class QuantRange {
  minmax,    ///< the group's min and max (dynamic when applied to each tensor as it comes)
  mse_grid,  ///< Bondarenko et al.'s grid search for the least squared error (symmetric only)
};

struct QuantScheme {
  int bits = 8;
  bool symmetric = true;
  QuantGranularity granularity = QuantGranularity::per_tensor;
  index_t channel_axis = 0;              ///< used by per_channel
  QuantRange range = QuantRange::minmax;
  bool full_signed_grid = false;         ///< symmetric: codes down to -2^(b-1) (authors' code)
  bool unsigned_if_nonnegative = false;  ///< symmetric: grid [0, 2^b - 1] for a tensor with min >= 0
  int mse_candidates = 100;              ///< mse_grid: number of candidate ranges N
  double mse_margin = 0.5;               ///< mse_grid: absolute margin added to max |x|
  /// asymmetric: the range is widened to hold 0 (true) or is the group's own [min x, max x]
  bool range_holds_zero = true;
};

/// Range parameters of one quantisation of one tensor (one entry per group).
template <class T>
struct QuantParams {
  QuantScheme scheme;
  Shape shape;                  ///< shape of the tensor the parameters were computed for
  std::vector<T> scale;         ///< > 0
  std::vector<T> zero_point;    ///< integer-valued; 0 for symmetric
  T code_min = T(0), code_max = T(0);  ///< the integer grid [code_min, code_max]
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
  OASIS_REQUIRE(s.symmetric || (!s.full_signed_grid && !s.unsigned_if_nonnegative), "scheme",
                "full_signed_grid and unsigned_if_nonnegative apply to symmetric schemes only");
  OASIS_REQUIRE(s.range_holds_zero || !s.symmetric, "range_holds_zero",
                "a symmetric range [-a, a] always holds 0; the group's own range is for asymmetric schemes");
  OASIS_REQUIRE(s.range != QuantRange::mse_grid || s.symmetric, "range",
                "mse_grid is defined for symmetric schemes only (the authors' one-dimensional search)");
  OASIS_REQUIRE(s.range != QuantRange::mse_grid || (s.mse_candidates >= 1 && std::isfinite(s.mse_margin) &&
                                                     s.mse_margin >= 0.0),
                "mse_candidates", "mse_grid needs mse_candidates >= 1 and a finite mse_margin >= 0, got ",
                s.mse_candidates, " and ", s.mse_margin);
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
/// round_half_even for |y| <= 2^16 (a clamped code): for float and double evaluated in their own
/// format, y + 1.5 * 2^(p-1) lies in [2^(p-1), 2^p) where the spacing is 1, so the addition
/// rounds y to an integer under the default rounding mode (half to even) and the subtraction is
/// exact — the value of round_half_even without its floor calls. Other types use round_half_even.
template <class T>
T round_half_even_small(const T& y) {
  if constexpr ((std::is_same_v<T, double> || std::is_same_v<T, float>) && FLT_EVAL_METHOD == 0) {
    constexpr T shifter = T(1.5) * static_cast<T>(std::is_same_v<T, double> ? 4503599627370496.0 : 8388608.0);
    return (y + shifter) - shifter;
  } else {
    return round_half_even(y);
  }
}
inline double qmax_sym(int bits) { return std::ldexp(1.0, bits - 1) - 1.0; }
inline double qmax_asym(int bits) { return std::ldexp(1.0, bits) - 1.0; }

/// The integer grid of scheme s for a tensor that is non-negative (`nonneg`) or not.
struct CodeGrid {
  double lo = 0, hi = 0;
};
inline CodeGrid code_grid(const QuantScheme& s, bool nonneg) {
  if (!s.symmetric) return {0.0, qmax_asym(s.bits)};
  if (s.unsigned_if_nonnegative && nonneg) return {0.0, qmax_asym(s.bits)};
  const double q = qmax_sym(s.bits);
  return {s.full_signed_grid ? -q - 1.0 : -q, q};
}

/// Per-group min and max of x, each range holding 0 (lo <= 0 <= hi) when `holds_zero`.
template <class T>
void group_ranges(const Tensor<T>& x, const QuantGroups& G, std::vector<T>& lo, std::vector<T>& hi,
                  bool holds_zero = true) {
  lo.assign(static_cast<std::size_t>(G.count), holds_zero ? T(0) : pos_inf<T>());
  hi.assign(static_cast<std::size_t>(G.count), holds_zero ? T(0) : neg_inf<T>());
  for (index_t i = 0; i < x.size(); ++i) {
    const auto g = static_cast<std::size_t>(G.of(i));
    if (x[i] < lo[g]) lo[g] = x[i];
    if (x[i] > hi[g]) hi[g] = x[i];
  }
}

/// Scale and zero point of group g with range [lo, hi] on the grid of p (lo <= 0 <= hi unless the
/// scheme takes the group's own range).
template <class T>
void set_group_params(QuantParams<T>& p, std::size_t g, T lo, T hi) {
  if (p.scheme.symmetric) {
    const T amax = -lo > hi ? -lo : hi;
    p.scale[g] = amax > T(0) ? amax / p.code_max : T(1);
  } else {
    if (!(hi > lo)) {  // zero width: widened to hold 0, so the constant is exact
      if (lo > T(0)) lo = T(0);
      if (hi < T(0)) hi = T(0);
    }
    const T range = hi - lo;
    p.scale[g] = range > T(0) ? range / p.code_max : T(1);
    const T zp = round_half_even(-lo / p.scale[g]);
    p.zero_point[g] = !p.scheme.range_holds_zero ? zp : zp < T(0) ? T(0) : (zp > p.code_max ? p.code_max : zp);
  }
}

/// Parameters of ranges [lo_g, hi_g] per group for a tensor of shape `shape`; `nonneg` selects
/// the unsigned grid where the scheme asks for it.
template <class T>
QuantParams<T> params_from_ranges(const QuantScheme& s, const Shape& shape, const std::vector<T>& lo,
                                  const std::vector<T>& hi, bool nonneg) {
  const CodeGrid grid = code_grid(s, nonneg);
  QuantParams<T> p{s, shape, std::vector<T>(lo.size()), std::vector<T>(lo.size(), T(0)), T(grid.lo), T(grid.hi)};
  for (std::size_t g = 0; g < lo.size(); ++g) set_group_params(p, g, lo[g], hi[g]);
  return p;
}
}  // namespace detail

/// Min-max range parameters of x under scheme s (s.range is not consulted; see quant_params).
template <class T>
QuantParams<T> minmax_quant_params(const Tensor<T>& x, const QuantScheme& s) {
  detail::check_scheme(s, x.shape());
  require_finite(x, "x");
  const detail::QuantGroups G = detail::quant_groups(s, x.shape());
  std::vector<T> lo, hi;
  detail::group_ranges(x, G, lo, hi, s.range_holds_zero);
  const bool nonneg = *std::min_element(lo.begin(), lo.end()) >= T(0);
  return detail::params_from_ranges(s, x.shape(), lo, hi, nonneg);
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
  const T lo = p.code_min, hi = p.code_max;
  OASIS_REQUIRE(hi > lo, "params", "empty integer grid [", to_double(lo), ", ", to_double(hi), "]");
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

/// MSE-grid range parameters of x under symmetric scheme s (Bondarenko et al.'s weight ranges):
/// candidates a_c = c * step, c = 1..N, step = (max(|min x|, max x) + margin) / N over the whole
/// tensor; per group the candidate of least sum (x - x^)^2 (accumulated in double; the first on
/// ties). The grid is unsigned when s.unsigned_if_nonnegative and min x >= 0 (their one-sided search).
template <class T>
QuantParams<T> mse_grid_quant_params(const Tensor<T>& x, const QuantScheme& s) {
  detail::check_scheme(s, x.shape());
  OASIS_REQUIRE(s.symmetric, "range", "mse_grid is defined for symmetric schemes only");
  require_finite(x, "x");
  const detail::QuantGroups G = detail::quant_groups(s, x.shape());
  std::vector<T> lo, hi;
  detail::group_ranges(x, G, lo, hi);
  const T tmin = *std::min_element(lo.begin(), lo.end()), tmax = *std::max_element(hi.begin(), hi.end());
  QuantParams<T> p = detail::params_from_ranges(s, x.shape(), lo, hi, tmin >= T(0));
  const T top = -tmin > tmax ? -tmin : tmax;
  const T step = (top + T(s.mse_margin)) / T(s.mse_candidates);
  if (!(step > T(0))) return p;  // all-zero tensor without margin: the min-max parameters (scale 1)
  const auto ng = static_cast<std::size_t>(G.count);
  std::vector<double> best(ng, std::numeric_limits<double>::infinity()), loss(ng);
  std::vector<T> best_scale(ng);
  std::vector<std::size_t> group(static_cast<std::size_t>(x.size()));
  for (index_t i = 0; i < x.size(); ++i) group[static_cast<std::size_t>(i)] = static_cast<std::size_t>(G.of(i));
  for (int c = 1; c <= s.mse_candidates; ++c) {
    const T scale = step * T(c) / p.code_max;
    std::fill(loss.begin(), loss.end(), 0.0);
    // Sums run over maximal runs of one group in a local accumulator (per tensor: one run).
    std::size_t cur = group.empty() ? 0 : group[0];
    double acc = 0;
    for (index_t i = 0; i < x.size(); ++i) {
      const std::size_t g = group[static_cast<std::size_t>(i)];
      if (g != cur) {
        loss[cur] += acc;
        acc = 0;
        cur = g;
      }
      // clamp(rne(y), lo, hi) = rne(clamp(y, lo, hi)) for integer lo, hi (rne is monotone).
      T y = x[i] / scale;
      y = y < p.code_min ? p.code_min : (y > p.code_max ? p.code_max : y);
      const double e = to_double(x[i] - detail::round_half_even_small(y) * scale);
      acc += e * e;
    }
    loss[cur] += acc;
    for (std::size_t g = 0; g < ng; ++g)
      if (loss[g] < best[g]) {
        best[g] = loss[g];
        best_scale[g] = scale;
      }
  }
  p.scale = best_scale;
  return p;
}

/// Range parameters of x under scheme s by its range rule (minmax or mse_grid).
template <class T>
QuantParams<T> quant_params(const Tensor<T>& x, const QuantScheme& s) {
  return s.range == QuantRange::mse_grid ? mse_grid_quant_params(x, s) : minmax_quant_params(x, s);
}

/// Fake quantisation with ranges from x itself by the scheme's range rule (dynamic quantisation
/// for minmax).
template <class T>
Tensor<T> fake_quantize(const Tensor<T>& x, const QuantScheme& s) {
  return fake_quantize(x, quant_params(x, s));
}

// ------------------------------------------------------------------------------------------------
// Static activation ranges from calibration batches.

/// Bondarenko et al.'s running min-max estimator: per group, the min and max of the first batch,
/// then lo <- (1 - momentum) min(batch) + momentum lo, likewise hi. Ranges are held in double.
struct RunningMinMax {
  double momentum = 0.9;
  std::vector<double> lo, hi;  ///< per group, the running estimates of min x and max x
  index_t batches = 0;         ///< calibration batches seen
  Shape group_shape;           ///< shape of the first batch's groups (per_channel: that axis' size)

  template <class T>
  void update(const Tensor<T>& x, const QuantScheme& s) {
    detail::check_scheme(s, x.shape());
    OASIS_REQUIRE(s.granularity != QuantGranularity::per_token, "granularity",
                  "static (calibrated) ranges need groups that do not depend on the number of tokens; "
                  "per_token ranges are dynamic by definition");
    OASIS_REQUIRE(std::isfinite(momentum) && momentum >= 0.0 && momentum < 1.0, "momentum",
                  "must be in [0, 1), got ", momentum);
    require_finite(x, "x");
    const detail::QuantGroups G = detail::quant_groups(s, x.shape());
    const auto ng = static_cast<std::size_t>(G.count);
    std::vector<double> bl(ng, HUGE_VAL), bh(ng, -HUGE_VAL);
    for (index_t i = 0; i < x.size(); ++i) {
      const auto g = static_cast<std::size_t>(G.of(i));
      bl[g] = std::min(bl[g], to_double(x[i]));
      bh[g] = std::max(bh[g], to_double(x[i]));
    }
    if (batches == 0) {
      lo = bl;
      hi = bh;
      group_shape = Shape{G.count};
    } else {
      OASIS_REQUIRE(static_cast<index_t>(lo.size()) == G.count, "x", "calibration batch has ", G.count,
                    " range groups, the earlier batches had ", lo.size());
      for (std::size_t g = 0; g < ng; ++g) {
        lo[g] = (1.0 - momentum) * bl[g] + momentum * lo[g];
        hi[g] = (1.0 - momentum) * bh[g] + momentum * hi[g];
      }
    }
    ++batches;
  }

  /// Parameters of the current estimates for a tensor of `shape` under scheme s: each range is
  /// widened to hold 0 (lo <- min(lo, 0), hi <- max(hi, 0)) unless the scheme takes the group's
  /// own range; the grid is unsigned where the scheme asks for it and the estimated min is >= 0.
  template <class T>
  QuantParams<T> params(const QuantScheme& s, const Shape& shape) const {
    OASIS_REQUIRE(batches > 0, "calibration", "no calibration batch has been seen");
    detail::check_scheme(s, shape);
    const detail::QuantGroups G = detail::quant_groups(s, shape);
    OASIS_REQUIRE(static_cast<index_t>(lo.size()) == G.count, "x", "shape ", shape_str(shape), " has ", G.count,
                  " range groups, the calibration had ", lo.size());
    std::vector<T> l(lo.size()), h(lo.size());
    for (std::size_t g = 0; g < lo.size(); ++g) {
      l[g] = T(s.range_holds_zero ? std::min(lo[g], 0.0) : lo[g]);
      h[g] = T(s.range_holds_zero ? std::max(hi[g], 0.0) : hi[g]);
    }
    return detail::params_from_ranges(s, shape, l, h, *std::min_element(lo.begin(), lo.end()) >= 0.0);
  }
};

/// Calibration state of a static-activation configuration: one RunningMinMax per activation
/// quantiser, in the order a forward visits them. While `frozen` is false every visit updates
/// its estimator with the batch and quantises with the updated estimate (calibration passes);
/// once frozen, the ranges are fixed (evaluation).
struct ActivationCalibration {
  std::vector<RunningMinMax> sites;
  std::size_t cursor = 0;  ///< next site; reset by begin_pass()
  bool frozen = false;

  void begin_pass() { cursor = 0; }
  /// After a frozen pass: every calibrated site was visited (the same model and forward).
  void end_pass() const {
    OASIS_REQUIRE(!frozen || cursor == sites.size(), "calibration", "the forward visited ", cursor,
                  " activation quantisers, the calibration recorded ", sites.size());
  }
};

/// How a weight-activation configuration sets its activation ranges.
enum class ActivationRanges {
  dynamic,     ///< from each activation tensor itself (QuantScheme's range rule)
  calibrated,  ///< static, from calibration batches (RunningMinMax through ActivationCalibration)
};

/// A weight-activation configuration (W<b>A<b>).
struct WAQuantConfig {
  std::string name;        ///< the preset name (wa_preset)
  QuantScheme weights;     ///< weights [out, in]
  QuantScheme activations; ///< activations [..., T, d]
  ActivationRanges activation_ranges = ActivationRanges::dynamic;
  double calibration_momentum = 0.9;                ///< RunningMinMax momentum of calibrated ranges
  ActivationCalibration* calibration = nullptr;     ///< state of calibrated ranges (not owned)
};

/// Fake-quantised activation x under cfg: dynamic ranges from x, or the next calibration site
/// (updated with x first while the calibration is not frozen).
template <class T>
Tensor<T> quantize_activation(const Tensor<T>& x, const WAQuantConfig& cfg) {
  if (cfg.activation_ranges == ActivationRanges::dynamic) return fake_quantize(x, cfg.activations);
  OASIS_REQUIRE(cfg.calibration != nullptr, "calibration", "preset '", cfg.name,
                "' has calibrated activation ranges: set WAQuantConfig::calibration and run calibration passes first");
  ActivationCalibration& c = *cfg.calibration;
  const std::size_t k = c.cursor++;
  if (!c.frozen) {
    if (k == c.sites.size()) {
      c.sites.emplace_back();
      c.sites.back().momentum = cfg.calibration_momentum;
    }
    c.sites[k].update(x, cfg.activations);
  }
  OASIS_REQUIRE(k < c.sites.size(), "calibration", "activation quantiser ", k + 1, " was not calibrated (",
                c.sites.size(), " were)");
  return fake_quantize(x, c.sites[k].params<T>(cfg.activations, x.shape()));
}

/// A linear layer y = Q_A(x) Q_W(W)^T with fake-quantised activations x [N, in] (one token per
/// row; quantize_activation) and weights W [out, in] (PyTorch nn.Linear layout; ranges by the
/// weight scheme's rule). The product is accumulated in T, left to right over `in`.
template <class T>
Tensor<T> fake_quant_linear(const Tensor<T>& x, const Tensor<T>& W, const WAQuantConfig& cfg) {
  require_rank(x, 2, "x", "[N, in]");
  require_rank(W, 2, "W", "[out, in]");
  OASIS_REQUIRE(x.dim(1) == W.dim(1), "W", "input width ", W.dim(1), " differs from x's ", x.dim(1));
  const Tensor<T> xq = quantize_activation(x, cfg), wq = fake_quantize(W, cfg.weights);
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
