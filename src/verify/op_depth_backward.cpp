// src/verify/op_depth_backward.cpp — op "depth_backward": the gradients of the coupled depth router
// h = sum_i alpha_i s_i (docs/spec.md §3–4, §8) from the incoming gradients of h (and of the weights).
#include <cmath>
#include <map>

#include "ops.hpp"
#include "oasis/grad/grad.hpp"
#include "oasis/oasis.hpp"

namespace oasis::verify::detail {
namespace {

CompareReport run(const OpCall& c) {
  const TensorMap &in = c.inputs, &out = c.outputs;
  const std::string op = "depth_backward";
  const StoredTensor &sources = need(in, "sources", op), &g_old = need(in, "g_old", op), &dh = need(in, "grad_h", op);
  require_rank(g_old.values, 2, "g_old", "[n, N]");
  const index_t n = g_old.values.dim(0), N = g_old.values.dim(1);
  const StoredTensor *da = maybe(in, "grad_alpha"), *dan = maybe(in, "grad_alpha_null");
  if (da) (void)need(in, "grad_alpha", op);
  if (dan) (void)need(in, "grad_alpha_null", op);
  const DepthOptions d = parse_depth_options(c.options, true);
  Tensor<double> psi(Shape{n, N});
  if (const StoredTensor* p = maybe(in, "psi")) psi = need(in, "psi", op).values;
  else OASIS_REQUIRE(!d.coupling, "psi", "op ", op, " with coupling needs input tensor 'psi' [n, N]");
  const std::vector<SourceKind> kinds = parse_kinds(c.options, n);
  auto cot = [&](auto tag) {
    using T = decltype(tag);
    return DepthCotangents<T>{as<T>(dh), da ? as<T>(*da) : Tensor<T>(), dan ? as<T>(*dan) : Tensor<T>()};
  };
  const Tensor<mp50> sm = as<mp50>(sources.values), gm = as<mp50>(g_old.values), pm = as<mp50>(psi);
  const DepthRoute<mp50> fwd = attn_res_route(sm, gm, pm, kinds, d);
  const DepthGrads<mp50> ref = attn_res_route_backward(sm, gm, pm, kinds, d, cot(mp50{}));
  const Ref ref_beta(Shape{1}, {ref.beta}), ref_theta(Shape{1}, {ref.theta});
  PlainBounds bounds([&](bool wide) {
    auto run = [&](auto tag) {
      using T = decltype(tag);
      const bounds::DepthBackwardBounds b = bounds::depth_route_backward_bounds(
          as<T>(sources.values), as<T>(g_old.values), as<T>(psi), kinds, d, cot(tag), fwd);
      return BoundMap{{"grad_sources", b.sources},
                      {"grad_g_old", b.g_old},
                      {"grad_psi", b.psi},
                      {"grad_beta", Tensor<double>(Shape{1}, {b.beta})},
                      {"grad_theta", Tensor<double>(Shape{1}, {b.theta})}};
    };
    return wide ? run(double{}) : run(float{});
  });
  CompareReport rep;
  rep.op = op;
  compare_outputs(rep, out,
                  {{"grad_sources", &ref.sources},
                   {"grad_g_old", &ref.g_old},
                   {"grad_psi", &ref.psi},
                   {"grad_beta", &ref_beta},
                   {"grad_theta", &ref_theta}},
                  bounds, c.compare);
  return rep;
}

}  // namespace

OpSpec depth_backward_op() {
  return {"depth_backward",
          {{"sources", "[n,N,d]"},
           {"g_old", "[n,N]"},
           {"psi", "[n,N]", false},
           {"grad_h", "[N,d]"},
           {"grad_alpha", "[n,N]", false},
           {"grad_alpha_null", "[N]", false}},
          {{"grad_sources", "[n,N,d]"},
           {"grad_g_old", "[n,N]"},
           {"grad_psi", "[n,N]"},
           {"grad_beta", "[1]"},
           {"grad_theta", "[1]"}},
          kDepthOptionKeys,
          "as depth; grad_sources through the mix only; grad_beta: d/d(beta given, or softplus(theta)) before\n"
          "                the beta_max cap; grad_theta: 0 when beta is given",
          run};
}

}  // namespace oasis::verify::detail
