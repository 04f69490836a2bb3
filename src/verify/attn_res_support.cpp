// src/verify/attn_res_support.cpp — the inputs of the fused AttnRes ops and the error of their
// logits (attn_res_support.hpp).
#include "attn_res_support.hpp"

#include <cmath>

#include "ops.hpp"

namespace oasis::verify::detail {

AttnResCall attn_res_call(const OpCall& c, const std::string& op, const std::string& what) {
  AttnResCall a;
  const TensorMap& in = c.inputs;
  const Options& o = c.options;
  a.sources = &need(in, "sources", op);
  a.w = &need(in, "w", op);
  const Tensor<double>& s = a.sources->values;
  require_rank(s, 3, "sources", "[n, N, d]");
  a.n = s.dim(0);
  a.N = s.dim(1);
  a.d = s.dim(2);
  OASIS_REQUIRE(a.n > 0 && a.N > 0 && a.d > 0, "sources", "empty dimension in ", shape_str(s.shape()));
  require_finite(s, "sources");
  require_rank(a.w->values, 1, "w", "[d]");
  OASIS_REQUIRE(a.w->values.dim(0) == a.d, "w", "has ", a.w->values.dim(0), " entries, ", what, " have width d = ", a.d);
  DType g16 = DType::f32;
  if (maybe(in, "gain")) {
    const StoredTensor& g = need(in, "gain", op);
    require_rank(g.values, 1, "gain", "[d]");
    OASIS_REQUIRE(g.values.dim(0) == a.d, "gain", "has ", g.values.dim(0), " entries, ", what, " have width d = ", a.d);
    a.gain = g.values;
    g16 = g.dtype;
  }
  a.key_norm.eps = o.number("eps", a.key_norm.eps);
  OASIS_REQUIRE(a.key_norm.eps > 0 && std::isfinite(a.key_norm.eps), "eps", "must be finite and positive");
  a.scale = o.number("scale", 1.0);
  OASIS_REQUIRE(std::isfinite(a.scale), "scale", "must be finite");
  const StoredTensor* psi = maybe(in, "psi");
  a.depth = parse_depth_options(o, psi != nullptr);
  if (!o.has("normalizer")) a.depth.normalizer = RowNorm::softmax;  // fla's AttnRes
  a.kinds = parse_kinds(o, a.n);
  OASIS_REQUIRE(static_cast<index_t>(a.kinds.size()) == a.n, "kinds", "has ", a.kinds.size(), " entries, ", what, " have n = ", a.n);
  if (psi) {
    const StoredTensor& p = need(in, "psi", op);
    OASIS_REQUIRE(p.values.shape() == (Shape{a.n, a.N}), "psi", "shape ", shape_str(p.values.shape()),
                  " does not match ", what, " [n, N] = [", a.n, ", ", a.N, "]");
    OASIS_REQUIRE(a.depth.coupling, "psi", "given but coupling is false (drop psi or set coupling true)");
    a.psi = p.values;
  } else {
    OASIS_REQUIRE(!a.depth.coupling, "psi", "op ", op, " with coupling needs input tensor 'psi' [n, N]");
    a.psi = Tensor<double>(Shape{a.n, a.N});
  }
  a.in16 = input16({a.sources->dtype, a.w->dtype, g16});
  return a;
}

Tensor<double> attn_res_logit_err1(const AttnResCall& a) {
  Tensor<double> e = bounds::pseudo_query_logits_bounds(a.sources->values, a.w->values, a.gain, a.key_norm);
  const double k = std::abs(a.scale) * (1.0 + 1.0 / (static_cast<double>(a.d) + 3.0)) / oasis::unit_roundoff<double>();
  for (index_t i = 0; i < e.size(); ++i) e[i] *= k;
  return e;
}

}  // namespace oasis::verify::detail
