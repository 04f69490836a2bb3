// src/verify/op_psi_backward.cpp — op "psi_backward": the gradient of the null statistic psi
// (docs/spec.md §3, §8) with respect to p_null (or, for the authors' estimator, the probabilities).
#include <cmath>
#include <map>

#include "ops.hpp"
#include "oasis/grad/grad.hpp"
#include "oasis/oasis.hpp"

namespace oasis::verify::detail {
namespace {

CompareReport run(const OpCall& c) {
  const TensorMap &in = c.inputs, &out = c.outputs;
  const std::string op = "psi_backward";
  const std::string est = c.options.string("estimator", "p_null");
  OASIS_REQUIRE(est == "p_null" || est == "mass", "estimator", "must be p_null or mass");
  const StoredTensor& dpsi = need(in, "grad_psi", op);
  CompareReport rep;
  rep.op = op;
  if (est == "p_null") {
    const StoredTensor& pn = need(in, "p_null", op);
    require_rank(pn.values, 3, "p_null", "[B, H, T]");
    require_rank(dpsi.values, 2, "grad_psi", "[B, T]");
    OASIS_REQUIRE(dpsi.values.dim(0) == pn.values.dim(0) && dpsi.values.dim(1) == pn.values.dim(2), "grad_psi", "shape ",
                  shape_str(dpsi.values.shape()), " is not [B, T] of p_null ", shape_str(pn.values.shape()));
    const index_t H = pn.values.dim(1);
    PlainBounds bounds([&](bool wide) {
      return BoundMap{{"grad_p_null", wide ? bounds::null_statistic_backward_bounds(as<double>(dpsi), H)
                                           : bounds::null_statistic_backward_bounds(as<float>(dpsi), H)}};
    });
    OASIS_REQUIRE(!out.count("grad_probs"), "grad_probs", "grad_probs belongs to estimator mass");
    if (c.compare.oracle == Oracle::fast) {
      // dpsi / H in double (one division: its own bound) decides every element or leaves it to mp50
      const Tensor<double> rd = null_statistic_backward(dpsi.values, H);
      const Tensor<double> own = bounds::null_statistic_backward_bounds(dpsi.values, H);
      if (compare_outputs(rep, out, {{"grad_p_null", {&rd, &own, 1.0}}}, bounds, c.compare, 1e-12) == 0) {
        rep.oracle = "fast (double, its own error bound folded in)";
        return rep;
      }
      rep = CompareReport{};
      rep.op = op;
    }
    const Ref ref = null_statistic_backward(as<mp50>(dpsi), H);
    compare_outputs(rep, out, {{"grad_p_null", &ref}}, bounds, c.compare);
    rep.oracle = "mp50";
    return rep;
  }
  const StoredTensor& pr = need(in, "probs", op);
  require_rank(pr.values, 4, "probs", "[B, H, Tq, Tk]");
  // dprobs = -dpsi / H where the deficit 1 - sum_j p_j >= 0: one division (u); where the deficit
  // lies within its own rounding ((Tk + 1) u) of 0 the computed clamp may decide either way.
  PlainBounds bounds([&](bool wide) {
    const double u = wide ? unit_roundoff(DType::f64) : unit_roundoff(DType::f32);
    const index_t H = pr.values.dim(1), Tk = pr.values.dim(3);
    Tensor<double> b(pr.values.shape());
    for (index_t r = 0; r < pr.values.size() / Tk; ++r) {
      double mass = 0;
      for (index_t j = 0; j < Tk; ++j) mass += pr.values[r * Tk + j];
      const index_t bb = r / (H * pr.values.dim(2)), t = r % pr.values.dim(2);
      const double g = std::abs(dpsi.values(bb, t)) / static_cast<double>(H);
      const bool ambiguous = std::abs(1.0 - mass) <= static_cast<double>(Tk + 1) * u;
      for (index_t j = 0; j < Tk; ++j) b[r * Tk + j] = bounds::kSecondOrder * (u * g + (ambiguous ? g : 0.0));
    }
    return BoundMap{{"grad_probs", b}};
  });
  OASIS_REQUIRE(!out.count("grad_p_null"), "grad_p_null", "grad_p_null belongs to estimator p_null");
  if (c.compare.oracle == Oracle::fast) {
    // The same in double: one division (u_d |g|); where the double deficit lies within its own
    // rounding ((Tk + 1) u_d sum_j p_j) of 0 the double clamp may differ from the exact one, and
    // the element's own bound admits both sides (|g|): it is then left undecided, for mp50.
    const Tensor<double> rd = null_statistic_from_mass_backward(pr.values, dpsi.values);
    const double ud = unit_roundoff(DType::f64);
    const index_t H = pr.values.dim(1), Tk = pr.values.dim(3);
    Tensor<double> own(pr.values.shape());
    for (index_t r = 0; r < pr.values.size() / Tk; ++r) {
      double mass = 0, abs_mass = 0;
      for (index_t j = 0; j < Tk; ++j) {
        mass += pr.values[r * Tk + j];
        abs_mass += std::abs(pr.values[r * Tk + j]);
      }
      const index_t bb = r / (H * pr.values.dim(2)), t = r % pr.values.dim(2);
      const double g = std::abs(dpsi.values(bb, t)) / static_cast<double>(H);
      const bool kink = std::abs(1.0 - mass) <= 2.0 * static_cast<double>(Tk + 1) * ud * (abs_mass + 1.0);
      for (index_t j = 0; j < Tk; ++j) own[r * Tk + j] = bounds::kSecondOrder * (ud * g + (kink ? g : 0.0));
    }
    if (compare_outputs(rep, out, {{"grad_probs", {&rd, &own, 1.0}}}, bounds, c.compare, 1e-12) == 0) {
      rep.oracle = "fast (double, its own error bound folded in)";
      return rep;
    }
    rep = CompareReport{};
    rep.op = op;
  }
  const Ref ref = null_statistic_from_mass_backward(as<mp50>(pr), as<mp50>(dpsi));
  compare_outputs(rep, out, {{"grad_probs", &ref}}, bounds, c.compare);
  rep.oracle = "mp50";
  return rep;
}

}  // namespace

OpSpec psi_backward_op() {
  return {"psi_backward",
          {{"p_null", "[B,H,T]", false}, {"probs", "[B,H,Tq,Tk]", false}, {"grad_psi", "[B,T]"}},
          {{"grad_p_null", "[B,H,T]"}, {"grad_probs", "[B,H,Tq,Tk]"}},
          {"estimator"},
          "estimator: p_null (default: grad_p_null = grad_psi / H) | mass (grad_probs = -grad_psi / H where\n"
          "                1 - sum_j p_j >= 0, else 0)",
          run};
}

}  // namespace oasis::verify::detail
