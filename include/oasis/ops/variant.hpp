// oasis/ops/variant.hpp — the paper's variants as points of one matrix (docs/spec.md §4, Tables 1, 2, 8):
// token normaliser x depth normaliser x coupling.
//
// | variant            | token    | depth            | coupling |
// | original           | softmax  | standard residual| -        |
// | vanilla_attnres    | softmax  | softmax          | no       |
// | token_only         | softmax1 | softmax          | no       |  (OutEffHop)
// | depth_only         | softmax  | softmax1         | no       |
// | aos                | softmax1 | softmax1         | no       |
// | oasis              | softmax1 | softmax1         | yes      |
#pragma once

#include <array>
#include <string>
#include <string_view>

#include "oasis/ops/attention.hpp"
#include "oasis/ops/depth.hpp"

namespace oasis {

enum class Variant { original, vanilla_attnres, token_only, depth_only, aos, oasis };

struct VariantSpec {
  Variant variant;
  std::string_view name;
  RowNorm token;     ///< normaliser of token attention
  RowNorm depth;     ///< normaliser over depth (meaningless when !attn_res)
  bool coupling;     ///< token-to-depth psi coupling
  bool attn_res;     ///< depth routing (false: standard residual stream)
};

inline constexpr std::array<VariantSpec, 6> kVariants{{
    {Variant::original, "original", RowNorm::softmax, RowNorm::softmax, false, false},
    {Variant::vanilla_attnres, "vanilla_attnres", RowNorm::softmax, RowNorm::softmax, false, true},
    {Variant::token_only, "token_only", RowNorm::softmax1, RowNorm::softmax, false, true},
    {Variant::depth_only, "depth_only", RowNorm::softmax, RowNorm::softmax1, false, true},
    {Variant::aos, "aos", RowNorm::softmax1, RowNorm::softmax1, false, true},
    {Variant::oasis, "oasis", RowNorm::softmax1, RowNorm::softmax1, true, true},
}};

inline const VariantSpec& variant_spec(Variant v) {
  for (const auto& s : kVariants) if (s.variant == v) return s;
  throw invalid_argument("variant", "unknown variant value");
}
inline std::string_view to_string(Variant v) { return variant_spec(v).name; }
inline Variant parse_variant(std::string_view name) {
  for (const auto& s : kVariants) if (s.name == name) return s.variant;
  std::string known;
  for (const auto& s : kVariants) known += (known.empty() ? "" : ", ") + std::string(s.name);
  throw invalid_argument("variant", "unknown variant '" + std::string(name) + "' (expected one of " + known + ")");
}

/// Token-attention options of a variant (other fields at their defaults).
inline AttentionOptions attention_options(Variant v) {
  AttentionOptions o;
  o.normalizer = variant_spec(v).token;
  return o;
}

/// Depth-routing options of a variant; `base` supplies conventions (centring, theta, ...).
inline DepthOptions depth_options(Variant v, DepthOptions base = {}) {
  const VariantSpec& s = variant_spec(v);
  base.normalizer = s.depth;
  base.coupling = s.coupling;
  return base;
}

}  // namespace oasis
