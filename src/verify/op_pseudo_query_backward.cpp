// src/verify/op_pseudo_query_backward.cpp — op "pseudo_query_backward": the gradients of the Kimi
// depth logits g_i = w^T RMSNorm(s_i) (docs/spec.md §4, §8) from the incoming gradient of g.
#include <cmath>
#include <limits>
#include <map>

#include "ops.hpp"
#include "oasis/grad/backward_prob_bounds.hpp"
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
  auto plain = [&](bool wide) {
    auto run = [&](auto tag) {
      using T = decltype(tag);
      const bounds::PseudoQueryBackwardBounds b = bounds::pseudo_query_logits_backward_bounds(
          as<T>(src), as<T>(w), gain.empty() ? Tensor<T>() : as<T>(gain), as<T>(dg), k);
      return BoundMap{{"grad_sources", b.sources}, {"grad_w", b.w}, {"grad_gain", b.gain}};
    };
    return wide ? run(double{}) : run(float{});
  };
  // the probabilistic bound (backward_prob_bounds.hpp) for f32/f16/bf16 gradients; f64 ones keep the
  // worst-case line (NaN), as attention_backward's
  auto prob = [&](bool wide) {
    const bounds::PseudoQueryBackwardBounds b = bounds::prob_pseudo_query_logits_backward_bounds(
        as<float>(src), as<float>(w), gain.empty() ? Tensor<float>() : as<float>(gain), as<float>(dg), k, kLambda);
    BoundMap m{{"grad_sources", b.sources}, {"grad_w", b.w}, {"grad_gain", b.gain}};
    if (wide) keep_worst_case_line(m);
    return m;
  };
  PlainBounds pp(prob);
  PlainBounds* ppp = c.compare.policy == Policy::worst_case ? nullptr : &pp;
  CompareReport rep;
  rep.op = op;
  std::string fallback;
  if (c.compare.oracle == Oracle::fast && !k.compute_in_float32) {
    // The fast oracle: the backward in double, each element judged with the double reference's own
    // worst-case bound folded in (the bounds depend on the inputs only: no kink, no forward
    // estimate; the policy's terms are known to their own double rounding, rho = 1e-12); an
    // undecided element sends the op to mp50 (grad_w and grad_gain sum over every token), within
    // the budget. A norm computed in float32 is the reference's own arithmetic: mp50 decides.
    PlainBounds pb(plain);
    const Tensor<double> gd = gain.empty() ? Tensor<double>() : gain;
    const PseudoQueryGrads<double> rd = pseudo_query_logits_backward(src.values, w.values, gd, dg.values, k);
    const bounds::PseudoQueryBackwardBounds own =
        bounds::pseudo_query_logits_backward_bounds(src.values, w.values, gd, dg.values, k);
    const index_t undecided = compare_outputs(
        rep, out,
        {{"grad_sources", {&rd.sources, &own.sources, 1.0}}, {"grad_w", {&rd.w, &own.w, 1.0}}, {"grad_gain", {&rd.gain, &own.gain, 1.0}}},
        pb, c.compare, 1e-12, ppp);
    if (undecided == 0) {
      rep.oracle = "fast (double, its own error bound folded in)";
      return rep;
    }
    const double work = 12.0 * static_cast<double>(src.values.size());
    const double bytes = 4.0 * static_cast<double>(sizeof(mp50)) * static_cast<double>(src.values.size());
    if (!mp50_fallback(rep, op, undecided, work, bytes, c.compare,
                       "the backward (grad_w and grad_gain sum over every token: the whole op)", fallback))
      return rep;
  }
  const PseudoQueryGrads<mp50> ref = pseudo_query_logits_backward(
      as<mp50>(src), as<mp50>(w), gain.empty() ? Ref() : as<mp50>(gain), as<mp50>(dg), k);
  PlainBounds bounds(plain);
  compare_outputs(rep, out, {{"grad_sources", &ref.sources}, {"grad_w", &ref.w}, {"grad_gain", &ref.gain}}, bounds,
                  c.compare, ppp);
  rep.oracle = "mp50" + fallback;
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
