// src/verify/op_psi.cpp — op "psi": the null statistic psi = mean over heads of p_null (docs/spec.md §3).
#include <cmath>
#include <map>

#include "ops.hpp"
#include "oasis/oasis.hpp"

namespace oasis::verify::detail {
namespace {

CompareReport run(const OpCall& c) {
  const TensorMap &in = c.inputs, &out = c.outputs;
  const Options& o = c.options;
  const CompareOptions& copt = c.compare;
  const std::string est = o.string("estimator", "p_null");
  OASIS_REQUIRE(est == "p_null" || est == "mass", "estimator", "must be p_null or mass");
  Ref psi;
  index_t H = 0, Tk = 0;
  if (est == "p_null") {
    const StoredTensor& pn = need(in, "p_null", "psi");
    require_rank(pn.values, 3, "p_null", "[B, H, T]");
    H = pn.values.dim(1);
    psi = null_statistic(pn.values.cast<mp50>());
  } else {
    const StoredTensor& pr = need(in, "probs", "psi");
    require_rank(pr.values, 4, "probs", "[B, H, Tq, Tk]");
    H = pr.values.dim(1);
    Tk = pr.values.dim(3);
    psi = null_statistic_from_mass(pr.values.cast<mp50>());
  }
  PlainBounds bounds([&](bool wide) {
    const double u = wide ? unit_roundoff(DType::f64) : unit_roundoff(DType::f32);
    Tensor<double> b(psi.shape());
    for (index_t i = 0; i < b.size(); ++i) b[i] = psi_bound(u, H, Tk, static_cast<double>(psi[i]));
    return BoundMap{{"psi", b}};
  });
  CompareReport rep;
  rep.op = "psi";
  compare_outputs(rep, out, {{"psi", &psi}}, bounds, copt);
  return rep;
}

}  // namespace

OpSpec psi_op() {
  return {"psi",
          {{"p_null", "[B,H,T]", false}, {"probs", "[B,H,Tq,Tk]", false}},
          {{"psi", "[B,T]"}},
          {"estimator"},
          "estimator: p_null (default, input p_null) | mass (input probs: psi = mean_h (1 - sum_j p_j))",
          run};
}

}  // namespace oasis::verify::detail
