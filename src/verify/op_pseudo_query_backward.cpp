// src/verify/op_pseudo_query_backward.cpp — op "pseudo_query_backward": the gradients of the Kimi
// depth logits g_i = w^T RMSNorm(s_i) (docs/spec.md §4, §8) from the incoming gradient of g.
#include <cmath>
#include <map>

#include "ops.hpp"
#include "oasis/grad/grad.hpp"
#include "oasis/oasis.hpp"

namespace oasis::verify::detail {
namespace {

CompareReport run(const OpCall& c) {
  const TensorMap &in = c.inputs, &out = c.outputs;
  const std::string op = "pseudo_query_backward";
  const StoredTensor &src = need(in, "sources", op), &w = need(in, "w", op), &dg = need(in, "grad_g", op);
  Tensor<double> gain;
  if (maybe(in, "gain")) gain = need(in, "gain", op).values;
  OASIS_REQUIRE(!out.count("grad_gain") || !gain.empty(), "grad_gain", "grad_gain given but the inputs hold no gain");
  KeyNormOptions k;
  k.eps = c.options.number("eps", k.eps);
  k.compute_in_float32 = c.options.boolean("compute_in_float32", false);
  const PseudoQueryGrads<mp50> ref = pseudo_query_logits_backward(
      as<mp50>(src), as<mp50>(w), gain.empty() ? Ref() : as<mp50>(gain), as<mp50>(dg), k);
  PlainBounds bounds([&](bool wide) {
    auto run = [&](auto tag) {
      using T = decltype(tag);
      const bounds::PseudoQueryBackwardBounds b = bounds::pseudo_query_logits_backward_bounds(
          as<T>(src), as<T>(w), gain.empty() ? Tensor<T>() : as<T>(gain), as<T>(dg), k);
      return BoundMap{{"grad_sources", b.sources}, {"grad_w", b.w}, {"grad_gain", b.gain}};
    };
    return wide ? run(double{}) : run(float{});
  });
  CompareReport rep;
  rep.op = op;
  compare_outputs(rep, out, {{"grad_sources", &ref.sources}, {"grad_w", &ref.w}, {"grad_gain", &ref.gain}}, bounds,
                  c.compare);
  return rep;
}

}  // namespace

OpSpec pseudo_query_backward_op() {
  return {"pseudo_query_backward",
          {{"sources", "[n,N,d]"}, {"w", "[d]"}, {"gain", "[d]", false}, {"grad_g", "[n,N]"}},
          {{"grad_sources", "[n,N,d]"}, {"grad_w", "[d]"}, {"grad_gain", "[d]"}},
          {"eps", "compute_in_float32"},
          "grad_sources through the keys only (the mix's part is op depth_backward's)",
          run};
}

}  // namespace oasis::verify::detail
