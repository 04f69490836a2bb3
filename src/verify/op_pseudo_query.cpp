// src/verify/op_pseudo_query.cpp — op "pseudo_query": Kimi depth logits g_i = w^T RMSNorm(s_i) (docs/spec.md §4).
#include <cmath>
#include <map>

#include "ops.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/oasis.hpp"

namespace oasis::verify::detail {
namespace {

CompareReport run(const OpCall& c) {
  const TensorMap &in = c.inputs, &out = c.outputs;
  const Options& o = c.options;
  const CompareOptions& copt = c.compare;
  const StoredTensor &src = need(in, "sources", "pseudo_query"), &w = need(in, "w", "pseudo_query");
  Tensor<double> gain;
  if (const StoredTensor* g = maybe(in, "gain")) gain = g->values;
  KeyNormOptions k;
  k.eps = o.number("eps", k.eps);
  k.compute_in_float32 = o.boolean("compute_in_float32", false);
  // (a default Tensor has shape [] and casts to one element: keep "no gain" empty)
  const Ref g = pseudo_query_logits(src.values.cast<mp50>(), w.values.cast<mp50>(),
                                    gain.empty() ? Ref() : gain.cast<mp50>(), k);
  PlainBounds bounds([&](bool wide) {
    auto run = [&](auto tag) {
      using T = decltype(tag);
      return BoundMap{{"g", bounds::pseudo_query_logits_bounds(as<T>(src), as<T>(w), gain.empty() ? Tensor<T>() : as<T>(gain), k)}};
    };
    return wide ? run(double{}) : run(float{});
  });
  CompareReport rep;
  rep.op = "pseudo_query";
  compare_outputs(rep, out, {{"g", &g}}, bounds, copt);
  return rep;
}

}  // namespace

OpSpec pseudo_query_op() {
  return {"pseudo_query",
          {{"sources", "[n,N,d]"}, {"w", "[d]"}, {"gain", "[d]", false}},
          {{"g", "[n,N]"}},
          {"eps", "compute_in_float32"},
          "",
          run};
}

}  // namespace oasis::verify::detail
