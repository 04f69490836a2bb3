// oasis/research/quant_presets.hpp — the quantisation presets of the papers the baselines
// reproduce, as WAQuantConfig values of oasis/ops/quantize.hpp (docs/baselines.md, "Quantisation
// presets", has each paper, table and setting).
#pragma once

#include <string>
#include <string_view>

#include "oasis/core/error.hpp"
#include "oasis/ops/quantize.hpp"

namespace oasis {

/// The presets (docs/baselines.md, "Quantisation presets", has the paper, table and settings):
///   W8A8-dynamic, W6A6-dynamic, W4A4-dynamic   restricted symmetric per-tensor min-max weights,
///                  asymmetric per-tensor min-max activations from each tensor (no paper's setting)
///   bondarenko-W8A8 (also -W6A6, -W4A4)        Bondarenko et al. (2023) PTQ: symmetric per-tensor
///                  weights on the full signed grid (unsigned for a non-negative tensor) with
///                  MSE-grid ranges; asymmetric per-tensor activations with static running
///                  min-max ranges (momentum 0.9) from calibration batches
///   omniquant-rtn-W8A8 (also -W6A6, -W4A4)     OmniQuant's quantiser layout (Shao et al. 2024):
///                  asymmetric per-output-channel min-max weights, asymmetric per-token dynamic
///                  activations; round-to-nearest on each group's own [min, max] (their Eq. 2;
///                  no learned clipping or transformation)
///   rtn0-W8A8 (also -W6A6, -W4A4)              the same layout with each range widened to hold 0
///                  (QuantScheme::range_holds_zero; no paper's setting)
inline WAQuantConfig wa_preset(std::string_view name) {
  const std::string n(name);
  auto bits_of = [&](std::string_view suffix) {
    if (suffix == "W8A8") return 8;
    if (suffix == "W6A6") return 6;
    if (suffix == "W4A4") return 4;
    return 0;
  };
  auto strip = [&](std::string_view prefix, std::string_view post) -> std::string_view {
    if (name.size() < prefix.size() + post.size() || name.substr(0, prefix.size()) != prefix ||
        name.substr(name.size() - post.size()) != post)
      return {};
    return name.substr(prefix.size(), name.size() - prefix.size() - post.size());
  };
  WAQuantConfig c;
  c.name = n;
  if (const int b = bits_of(strip("", "-dynamic"))) {
    c.weights = QuantScheme{b, true, QuantGranularity::per_tensor, 0};
    c.activations = QuantScheme{b, false, QuantGranularity::per_tensor, 0};
  } else if (const int b2 = bits_of(strip("bondarenko-", ""))) {
    c.weights = QuantScheme{b2, true, QuantGranularity::per_tensor, 0};
    c.weights.range = QuantRange::mse_grid;
    c.weights.full_signed_grid = true;
    c.weights.unsigned_if_nonnegative = true;
    c.activations = QuantScheme{b2, false, QuantGranularity::per_tensor, 0};
    c.activation_ranges = ActivationRanges::calibrated;
  } else if (const int b3 = bits_of(strip("omniquant-rtn-", ""))) {
    c.weights = QuantScheme{b3, false, QuantGranularity::per_channel, 0};
    c.activations = QuantScheme{b3, false, QuantGranularity::per_token, 0};
    c.weights.range_holds_zero = c.activations.range_holds_zero = false;
  } else if (const int b4 = bits_of(strip("rtn0-", ""))) {
    c.weights = QuantScheme{b4, false, QuantGranularity::per_channel, 0};
    c.activations = QuantScheme{b4, false, QuantGranularity::per_token, 0};
  } else {
    OASIS_REQUIRE(false, "preset", "unknown quantisation preset '", n,
                  "' (expected W8A8-dynamic, W6A6-dynamic, W4A4-dynamic, bondarenko-W8A8, bondarenko-W6A6, "
                  "bondarenko-W4A4, omniquant-rtn-W8A8, omniquant-rtn-W6A6, omniquant-rtn-W4A4, rtn0-W8A8, "
                  "rtn0-W6A6 or rtn0-W4A4)");
  }
  return c;
}

}  // namespace oasis
