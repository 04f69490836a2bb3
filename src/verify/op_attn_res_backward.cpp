// src/verify/op_attn_res_backward.cpp — op "attn_res_backward": the gradients of the fused AttnRes
// routing h = sum_i alpha_i s_i, alpha = softmax(1)(g - beta Dpsi), g_i = scale w^T RMSNorm(s_i)
// (docs/spec.md §4, §8; docs/verify.md, "Fused AttnRes routing"). The reference chains the depth
// backward (dg_old), dg = scale dg_old, the pseudo-query backward of dg; grad_sources is the total,
// the mix's part alpha_i dh plus the keys' part. Bounds: docs/tolerances.md, "Fused AttnRes routing".
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "attn_res_support.hpp"
#include "ops.hpp"
#include "oasis/oasis.hpp"

namespace oasis::verify::detail {
namespace {

/// The reference in T: the gradients, and the logits, forward and dg = scale dg_old it went through.
template <class T>
struct Chain {
  Tensor<T> g, dg;
  DepthRoute<T> fwd;
  AttnResGrads<T> grads;
};

template <class T>
Chain<T> chain(const AttnResCall& a, const DepthCotangents<T>& cot) {
  Chain<T> r;
  r.g = attn_res_logits<T>(a);
  const Tensor<T> s = a.sources->values.cast<T>(), p = a.psi.cast<T>();
  r.fwd = attn_res_route(s, r.g, p, a.kinds, a.depth);
  r.grads = attn_res_backward_from_logits(s, a.w->values.cast<T>(), a.gain.empty() ? Tensor<T>() : a.gain.cast<T>(),
                                          p, a.kinds, a.options(), cot, r.g);
  r.dg = r.grads.logits;  // the keys' cotangent scale dL/dg, as attn_res_backward forms it
  for (index_t i = 0; i < r.dg.size(); ++i) r.dg[i] = r.dg[i] * T(a.scale);
  return r;
}

/// The reference's gradients by output name, moved out of `c` (its logits and forward, which the
/// bounds read, stay).
template <class T>
std::map<std::string, Tensor<T>> gradients(Chain<T>& c, bool gain) {
  std::map<std::string, Tensor<T>> m;
  AttnResGrads<T>& g = c.grads;
  m.emplace("grad_sources", std::move(g.sources));
  m.emplace("grad_w", std::move(g.w));
  m.emplace("grad_psi", std::move(g.psi));
  m.emplace("grad_beta", Tensor<T>(Shape{1}, g.beta));
  m.emplace("grad_theta", Tensor<T>(Shape{1}, g.theta));
  if (gain) m.emplace("grad_gain", std::move(g.gain));
  return m;
}

struct Cot {
  const StoredTensor *h, *alpha, *alpha_null;
  template <class T>
  DepthCotangents<T> as() const {
    return {h->values.cast<T>(), alpha ? alpha->values.cast<T>() : Tensor<T>(),
            alpha_null ? alpha_null->values.cast<T>() : Tensor<T>()};
  }
};

/// The bounds of the chain in T from the reference `c` (exact, or double with ref_u = 2^-53):
/// the depth backward with the logits' error e_g = u err1 already in g_old; under the
/// probabilistic policy (lambda > 0) its own events plus, deterministic, the part of its
/// worst-case line that e_g adds (with e_g minus without); then the keys' backward with dg's
/// error |scale| B(dg_old) + u |dg| (the product) chained (keys_backward_bounds; its events at
/// u16 when the inputs are 16-bit, as the depth backward's).
template <class T, class R>
BoundMap chain_bounds(const AttnResCall& a, const Cot& cot, const Tensor<double>& err1, const Chain<R>& c, double lambda,
                      double ref_u, double u16, double n16) {
  const double u = bounds::Precision::of<T>().u;
  Tensor<double> eg = err1;
  for (index_t i = 0; i < eg.size(); ++i) eg[i] *= u;
  const Tensor<T> s = a.sources->values.cast<T>(), g = c.g.template cast<T>(), p = a.psi.cast<T>();
  const DepthCotangents<T> d = cot.as<T>();
  auto depth = [&](const Tensor<double>* e, double lam) {
    return bounds::depth_route_backward_bounds(s, g, p, a.kinds, a.depth, d, c.fwd, e, lam, ref_u, u16, n16);
  };
  bounds::DepthBackwardBounds db = depth(&eg, 0.0);
  if (lambda > 0) {
    const bounds::DepthBackwardBounds own = depth(nullptr, lambda), wc0 = depth(nullptr, 0.0);
    auto add = [](Tensor<double>& x, const Tensor<double>& p_, const Tensor<double>& w0) {
      for (index_t i = 0; i < x.size(); ++i) x[i] = p_[i] + std::max(0.0, x[i] - w0[i]);
    };
    add(db.sources, own.sources, wc0.sources);
    add(db.g_old, own.g_old, wc0.g_old);
    add(db.psi, own.psi, wc0.psi);
    db.beta = own.beta + std::max(0.0, db.beta - wc0.beta);
    db.theta = own.theta + std::max(0.0, db.theta - wc0.theta);
    for (std::size_t t = 0; t < db.kink_edge.size(); ++t) db.kink_edge[t] |= own.kink_edge[t];
  }
  Tensor<double> edg = db.g_old;
  for (index_t i = 0; i < edg.size(); ++i)
    edg[i] = std::abs(a.scale) * edg[i] + bounds::kSecondOrder * u * std::abs(static_cast<double>(c.dg[i]));
  const bounds::PseudoQueryBackwardBounds kb =
      keys_backward_bounds<T>(s, a.w->values.cast<T>(), a.gain.empty() ? Tensor<T>() : a.gain.cast<T>(),
                              c.dg.template cast<T>(), a.key_norm, lambda, &edg, u16 > u ? u16 / u : 1.0);
  Tensor<double> src = db.sources, edge({static_cast<index_t>(db.kink_edge.size())});
  for (index_t i = 0; i < src.size(); ++i) src[i] += kb.sources[i];
  for (index_t t = 0; t < edge.size(); ++t) edge[t] = db.kink_edge[static_cast<std::size_t>(t)];
  return {{"grad_sources", src},
          {"grad_w", kb.w},
          {"grad_gain", kb.gain},
          {"grad_psi", db.psi},
          {"grad_beta", Tensor<double>(Shape{1}, {db.beta})},
          {"grad_theta", Tensor<double>(Shape{1}, {db.theta})},
          {"kink_edge", edge}};
}

}  // namespace

CompareReport attn_res_backward_report(const OpCall& call, const std::string& op, const SourcesSplit& split,
                                       const std::string& what) {
  const AttnResCall a = attn_res_call(call, op, what);
  const TensorMap& in = call.inputs;
  const CompareOptions& copt = call.compare;
  const StoredTensor& dh = need(in, "grad_h", op);
  OASIS_REQUIRE(dh.values.shape() == (Shape{a.N, a.d}), "grad_h", "shape ", shape_str(dh.values.shape()),
                " is not [N, d] = [", a.N, ", ", a.d, "]");
  const Cot cot{&dh, maybe(in, "grad_alpha") ? &need(in, "grad_alpha", op) : nullptr,
                maybe(in, "grad_alpha_null") ? &need(in, "grad_alpha_null", op) : nullptr};
  OASIS_REQUIRE(!cot.alpha || cot.alpha->values.shape() == (Shape{a.n, a.N}), "grad_alpha", "shape ",
                shape_str(cot.alpha ? cot.alpha->values.shape() : Shape{}), " is not [n, N] = [", a.n, ", ", a.N, "]");
  OASIS_REQUIRE(!cot.alpha_null || cot.alpha_null->values.shape() == (Shape{a.N}), "grad_alpha_null", "shape ",
                shape_str(cot.alpha_null ? cot.alpha_null->values.shape() : Shape{}), " is not [N] = [", a.N, "]");
  OASIS_REQUIRE(!call.outputs.count("grad_gain") || !a.gain.empty(), "grad_gain", "grad_gain given but the inputs hold no gain");
  // 16-bit sources or grad_h: the probabilistic bound admits intermediates stored in that type
  double u16 = 0, n16 = 0;
  for (const StoredTensor* x : {a.sources, &dh})
    if (is16(x->dtype)) {
      u16 = std::max(u16, unit_roundoff(x->dtype));
      n16 = std::max(n16, std::ldexp(1.0, io::dtype_min_exponent(x->dtype)));
    }
  const DType in16 = input16({a.in16, dh.dtype});
  const Tensor<double> err1 = attn_res_logit_err1(a);
  auto bounds_from = [&](const auto& c, double ref_u, double lambda) {
    return [&, ref_u, lambda](bool wide) {
      BoundMap m = wide ? chain_bounds<double>(a, cot, err1, c, lambda, ref_u, u16, n16)
                        : chain_bounds<float>(a, cot, err1, c, lambda, ref_u, u16, n16);
      if (wide && lambda > 0)  // f64 gradients keep the worst-case line, as attention_backward's
        keep_worst_case_line(m);
      split_sources(m, split);
      return m;
    };
  };
  const bool use_prob = copt.policy != Policy::worst_case;
  CompareReport rep;
  rep.op = op;
  std::string fallback;
  const bool clamp = a.depth.coupling && std::isfinite(a.depth.coupling_options.score_clamp);
  if (copt.oracle == Oracle::fast && !clamp) {
    // The fast oracle: the chain in double, each element judged with the double reference's own
    // worst-case bound (its logits' error u_d err1 included) folded in; the policy's terms known
    // within rho = 1e-7 (as depth_backward's). A coupled clamp's kink is left to mp50 (the
    // double logits' error would widen every zone).
    Chain<double> cd = chain(a, cot.as<double>());
    const double ud = oasis::unit_roundoff<double>();
    BoundMap own = chain_bounds<double>(a, cot, err1, cd, 0.0, ud, 0.0, 0.0);
    PlainBounds pb(bounds_from(cd, ud, 0.0)), pp(bounds_from(cd, ud, kLambda));
    BoundMap vals = gradients(cd, !a.gain.empty());
    split_sources(vals, split);
    split_sources(own, split);
    std::map<std::string, DoubleRef> refs;
    for (const auto& [name, v] : vals) refs[name] = {&v, &own.at(name), 1.0};
    const index_t undecided = compare_outputs(rep, call.outputs, refs, pb, copt, 1e-7, use_prob ? &pp : nullptr, in16);
    if (undecided == 0) {
      rep.oracle = "fast (double, its own error bound folded in)";
      return rep;
    }
    const double work = 20.0 * static_cast<double>(a.sources->values.size());
    const double bytes = 7.0 * static_cast<double>(sizeof(mp50)) * static_cast<double>(a.sources->values.size());
    if (!mp50_fallback(rep, op, undecided, work, bytes, copt,
                       "the backward (grad_w, grad_gain and dbeta sum over every token: the whole op)", fallback))
      return rep;
  }
  Chain<mp50> cm = chain(a, cot.as<mp50>());
  PlainBounds pb(bounds_from(cm, 0.0, 0.0)), pp(bounds_from(cm, 0.0, kLambda));
  std::map<std::string, Ref> vals = gradients(cm, !a.gain.empty());
  split_sources(vals, split);
  std::map<std::string, const Ref*> refs;
  for (const auto& [name, v] : vals) refs[name] = &v;
  compare_outputs(rep, call.outputs, refs, pb, copt, use_prob ? &pp : nullptr, in16);
  rep.oracle = "mp50" + fallback;
  return rep;
}

OpSpec attn_res_backward_op() {
  std::vector<std::string> keys = kDepthOptionKeys;
  keys.insert(keys.end(), {"eps", "scale"});
  return {"attn_res_backward",
          {{"sources", "[n,N,d]"},
           {"w", "[d]"},
           {"gain", "[d]", false},
           {"psi", "[n,N]", false},
           {"grad_h", "[N,d]"},
           {"grad_alpha", "[n,N]", false},
           {"grad_alpha_null", "[N]", false}},
          {{"grad_sources", "[n,N,d]"},
           {"grad_w", "[d]"},
           {"grad_gain", "[d]"},
           {"grad_psi", "[n,N]"},
           {"grad_beta", "[1]"},
           {"grad_theta", "[1]"}},
          keys,
          "as attn_res; grad_sources: the total (the mix and the keys); grad_beta, grad_theta as depth_backward's",
          [](const OpCall& c) { return attn_res_backward_report(c, "attn_res_backward"); }};
}

}  // namespace oasis::verify::detail
