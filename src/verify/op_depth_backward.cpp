// src/verify/op_depth_backward.cpp — op "depth_backward": the gradients of the coupled depth router
// h = sum_i alpha_i s_i (docs/spec.md §3–4, §8) from the incoming gradients of h (and of the weights).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "ops.hpp"
#include "oasis/grad/grad.hpp"
#include "oasis/oasis.hpp"

namespace oasis::verify::detail {
namespace {

CompareReport run(const OpCall& c) {
  const StoredTensor& g_old = need(c.inputs, "g_old", "depth_backward");
  require_rank(g_old.values, 2, "g_old", "[n, N]");
  return depth_backward_report(c.inputs, c.outputs, parse_depth_options(c.options, true),
                               parse_kinds(c.options, g_old.values.dim(0)), c.compare);
}

}  // namespace

CompareReport depth_backward_report(const TensorMap& in, const TensorMap& out, const DepthOptions& d,
                                    const std::vector<SourceKind>& kinds, const CompareOptions& copt) {
  const std::string op = "depth_backward";
  const StoredTensor &sources = need(in, "sources", op), &g_old = need(in, "g_old", op), &dh = need(in, "grad_h", op);
  require_rank(g_old.values, 2, "g_old", "[n, N]");
  const index_t n = g_old.values.dim(0), N = g_old.values.dim(1);
  const StoredTensor *da = maybe(in, "grad_alpha"), *dan = maybe(in, "grad_alpha_null");
  if (da) (void)need(in, "grad_alpha", op);
  if (dan) (void)need(in, "grad_alpha_null", op);
  Tensor<double> psi(Shape{n, N});
  if (const StoredTensor* p = maybe(in, "psi")) psi = need(in, "psi", op).values;
  else OASIS_REQUIRE(!d.coupling, "psi", "op ", op, " with coupling needs input tensor 'psi' [n, N]");
  auto cot = [&](auto tag) {
    using T = decltype(tag);
    return DepthCotangents<T>{as<T>(dh), da ? as<T>(*da) : Tensor<T>(), dan ? as<T>(*dan) : Tensor<T>()};
  };
  auto to_map = [](const bounds::DepthBackwardBounds& b) {
    Tensor<double> edge({static_cast<index_t>(b.kink_edge.size())});
    for (index_t t = 0; t < edge.size(); ++t) edge[t] = b.kink_edge[static_cast<std::size_t>(t)];
    return BoundMap{{"grad_sources", b.sources},
                    {"grad_g_old", b.g_old},
                    {"grad_psi", b.psi},
                    {"grad_beta", Tensor<double>(Shape{1}, {b.beta})},
                    {"grad_theta", Tensor<double>(Shape{1}, {b.theta})},
                    {"kink_edge", edge}};
  };
  // 16-bit sources or grad_h: the probabilistic bound admits intermediates stored in that type
  double u16 = 0, n16 = 0;  // unit roundoff and smallest normal of that type
  for (const StoredTensor* x : {&sources, &dh})
    if (is16(x->dtype)) {
      u16 = std::max(u16, unit_roundoff(x->dtype));
      n16 = std::max(n16, std::ldexp(1.0, io::dtype_min_exponent(x->dtype)));
    }
  const DType in16 = input16({sources.dtype, dh.dtype});
  // The bounds of the backward in T from the forward `fwd` (exact, or double with ref_u = 2^-53):
  // the worst-case line (lambda = 0) or the probabilistic bound (depth_backward_bounds.hpp), the
  // latter for f32/f16/bf16 gradients only (f64 ones keep the worst-case line, as attention_backward's).
  auto bounds_from = [&](const auto& fwd, double ref_u, double lambda) {
    return [&, ref_u, lambda](bool wide) {
      auto run = [&](auto tag) {
        using T = decltype(tag);
        return to_map(bounds::depth_route_backward_bounds(as<T>(sources.values), as<T>(g_old.values), as<T>(psi), kinds,
                                                          d, cot(tag), fwd, nullptr, lambda, ref_u, u16, n16));
      };
      BoundMap m = wide ? run(double{}) : run(float{});
      if (wide && lambda > 0)
        keep_worst_case_line(m);
      return m;
    };
  };
  const bool use_prob = copt.policy != Policy::worst_case;
  CompareReport rep;
  rep.op = op;
  std::string fallback;
  if (copt.oracle == Oracle::fast) {
    // The fast oracle: the backward in double, each element judged with the double reference's own
    // worst-case bound folded in. The bounds are made from the double forward: their terms are
    // known within rho = 1e-7 (a relative 2^-53 (n + |g|) in the weights, against bounds of at
    // least u_f32), and a clamp's kink zone widens by the double logit's error. A token whose
    // logit lies at the edge of a zone (kink_edge), and then dbeta, is left to mp50.
    const Tensor<double>& sd = sources.values;
    const DepthRoute<double> fd = attn_res_route(sd, g_old.values, psi, kinds, d);
    const DepthGrads<double> rd = attn_res_route_backward(sd, g_old.values, psi, kinds, d, cot(double{}));
    const double ud = oasis::unit_roundoff<double>();
    bounds::DepthBackwardBounds own =
        bounds::depth_route_backward_bounds(sd, g_old.values, psi, kinds, d, cot(double{}), fd, nullptr, 0.0, ud);
    PlainBounds pb(bounds_from(fd, ud, 0.0)), pp(bounds_from(fd, ud, kLambda));
    std::vector<unsigned char> edge = own.kink_edge;
    for (const auto& [name, t] : out) {
      for (PlainBounds* b : {&pb, &pp}) {
        if (b == &pp && !use_prob) continue;
        const Tensor<double>& e = b->raw("kink_edge", t.dtype);
        for (index_t x = 0; x < e.size(); ++x)
          if (e[x] != 0) edge[static_cast<std::size_t>(x)] = 1;
      }
    }
    const double inf = std::numeric_limits<double>::infinity();
    bool any_edge = false;
    for (index_t t = 0; t < N; ++t)
      if (edge[static_cast<std::size_t>(t)]) {
        any_edge = true;
        for (index_t i = 0; i < n; ++i) own.g_old(i, t) = own.psi(i, t) = inf;
      }
    if (any_edge) own.beta = own.theta = inf;
    const Tensor<double> rb(Shape{1}, {rd.beta}), rt(Shape{1}, {rd.theta}), ob(Shape{1}, {own.beta}),
        ot(Shape{1}, {own.theta});
    const index_t undecided = compare_outputs(rep, out,
                                              {{"grad_sources", {&rd.sources, &own.sources, 1.0}},
                                               {"grad_g_old", {&rd.g_old, &own.g_old, 1.0}},
                                               {"grad_psi", {&rd.psi, &own.psi, 1.0}},
                                               {"grad_beta", {&rb, &ob, 1.0}},
                                               {"grad_theta", {&rt, &ot, 1.0}}},
                                              pb, copt, 1e-7, use_prob ? &pp : nullptr, in16);
    if (undecided == 0) {
      rep.oracle = "fast (double, its own error bound folded in)";
      return rep;
    }
    const double work = 8.0 * static_cast<double>(sources.values.size());
    const double bytes = 3.0 * static_cast<double>(sizeof(mp50)) * static_cast<double>(sources.values.size());
    if (!mp50_fallback(rep, op, undecided, work, bytes, copt, "the backward (dbeta sums over every token: the whole op)",
                       fallback))
      return rep;
  }
  const Tensor<mp50> sm = as<mp50>(sources.values), gm = as<mp50>(g_old.values), pm = as<mp50>(psi);
  const DepthRoute<mp50> fwd = attn_res_route(sm, gm, pm, kinds, d);
  const DepthGrads<mp50> ref = attn_res_route_backward(sm, gm, pm, kinds, d, cot(mp50{}));
  const Ref ref_beta(Shape{1}, {ref.beta}), ref_theta(Shape{1}, {ref.theta});
  PlainBounds bounds(bounds_from(fwd, 0.0, 0.0)), pp(bounds_from(fwd, 0.0, kLambda));
  compare_outputs(rep, out,
                  {{"grad_sources", &ref.sources},
                   {"grad_g_old", &ref.g_old},
                   {"grad_psi", &ref.psi},
                   {"grad_beta", &ref_beta},
                   {"grad_theta", &ref_theta}},
                  bounds, copt, use_prob ? &pp : nullptr, in16);
  rep.oracle = "mp50" + fallback;
  return rep;
}

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
