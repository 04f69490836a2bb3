// tests/parity/attn_res_bound.hpp — the kernel parity rule (bounds::check_parity; docs/tolerances.md,
// "Fused kernels") over every output of the fused AttnRes routing and of its backward, with the
// float reference's derived bound as the floor, composed as docs/tolerances.md, "Fused AttnRes
// routing" states (worst-case line):
//   e_g      = |scale| (1 + 1/(d + 3)) pseudo_query_logits_bounds          (the logits' error)
//   forward  = depth_route_bounds(..., g_old_err = e_g)
//   backward = depth_route_backward_bounds(..., g_old_err = e_g): grad psi, beta, theta, dL/dg and
//              the mix's part of grad sources; e_dg = |scale| B(dL/dg) + 1.02 u |dg| (dg = scale
//              dL/dg) enters pseudo_query_logits_backward_bounds as dg's error: grad w, grad gain
//              and the keys' part of grad sources.
// Shared by tests/parity/test_parity_attn_res.cpp and the benchmarks' validation before timing
// (bench/bench_attn_res.cpp); no GoogleTest here.
#pragma once

#include <cmath>
#include <vector>

#include "oasis/grad/attn_res_backward.hpp"
#include "oasis/grad/backward_bounds.hpp"
#include "oasis/grad/depth_backward_bounds.hpp"
#include "oasis/ops/attn_res.hpp"
#include "oasis/ops/error_bounds.hpp"

namespace oasis::fast_parity {

/// The inputs of one fused call.
struct AttnResInputs {
  Tensor<float> sources, w, gain, psi;
  std::vector<SourceKind> kinds;
  AttnResOptions opt;
  DepthCotangents<float> d;  ///< the backward's cotangents
};

/// e_g: the error of the logits scale w^T RMSNorm(s_i) computed in float ([n, N]).
inline Tensor<double> attn_res_logit_err(const AttnResInputs& in) {
  Tensor<double> e = bounds::pseudo_query_logits_bounds(in.sources, in.w, in.gain, in.opt.key_norm);
  const double f = std::abs(in.opt.scale) * (1.0 + 1.0 / (static_cast<double>(in.w.size()) + 3.0));
  for (index_t i = 0; i < e.size(); ++i) e[i] *= f;
  return e;
}

/// The forward's float reference, oracle (in R) and floor.
template <class R>
struct AttnResForwardOracle {
  DepthRoute<float> ref;
  DepthRoute<R> hp;
  bounds::DepthRouteBounds b;
};

template <class R>
AttnResForwardOracle<R> attn_res_forward_oracle(const AttnResInputs& in) {
  AttnResForwardOracle<R> o;
  o.ref = attn_res(in.sources, in.w, in.gain, in.psi, in.kinds, in.opt);
  o.hp = attn_res(in.sources.cast<R>(), in.w.cast<R>(), in.gain.cast<R>(), in.psi.cast<R>(), in.kinds, in.opt);
  const Tensor<double> e_g = attn_res_logit_err(in);
  o.b = bounds::depth_route_bounds(in.sources, in.psi, in.kinds, in.opt.depth, o.hp, &e_g);
  return o;
}

/// The backward's float reference, oracle (in R) and floor (beta, theta as one-element tensors).
template <class R>
struct AttnResBackwardOracle {
  AttnResGrads<float> ref;
  AttnResGrads<R> hp;
  Tensor<double> sources, w, gain, psi, logits, beta, theta;
};

template <class R>
AttnResBackwardOracle<R> attn_res_backward_oracle(const AttnResInputs& in) {
  AttnResBackwardOracle<R> o;
  o.ref = attn_res_backward(in.sources, in.w, in.gain, in.psi, in.kinds, in.opt, in.d);
  const Tensor<R> s = in.sources.cast<R>(), w = in.w.cast<R>(), gain = in.gain.cast<R>(), psi = in.psi.cast<R>();
  const DepthCotangents<R> d{in.d.h.cast<R>(), in.d.alpha.cast<R>(), in.d.alpha_null.cast<R>()};
  o.hp = attn_res_backward(s, w, gain, psi, in.kinds, in.opt, d);
  const Tensor<R> g = attn_res_logits(s, w, gain, in.opt);
  const DepthRoute<R> fwd = attn_res_route(s, g, psi, in.kinds, in.opt.depth);
  const Tensor<double> e_g = attn_res_logit_err(in);
  const bounds::DepthBackwardBounds db = bounds::depth_route_backward_bounds(
      in.sources, g.template cast<float>(), in.psi, in.kinds, in.opt.depth, in.d, fwd, &e_g);
  const double u = bounds::Precision::of<float>().u;
  Tensor<R> dg = o.hp.logits;  // dL/d(w^T RMSNorm(s_i)) = scale dL/dg
  Tensor<double> e_dg(dg.shape());
  for (index_t i = 0; i < dg.size(); ++i) {
    dg[i] = dg[i] * R(in.opt.scale);
    e_dg[i] = std::abs(in.opt.scale) * db.g_old[i] + bounds::kSecondOrder * u * std::abs(static_cast<double>(dg[i]));
  }
  const bounds::PseudoQueryBackwardBounds kb = bounds::pseudo_query_logits_backward_bounds(
      in.sources, in.w, in.gain, dg.template cast<float>(), in.opt.key_norm, &e_dg);
  o.sources = db.sources;
  for (index_t i = 0; i < o.sources.size(); ++i) o.sources[i] += kb.sources[i];
  o.w = kb.w;
  o.gain = kb.gain;
  o.psi = db.psi;
  o.logits = db.g_old;
  o.beta = Tensor<double>({1}, db.beta);
  o.theta = Tensor<double>({1}, db.theta);
  return o;
}

/// Every output of a forward under the rule.
template <class R>
bounds::ParityOutcome check_attn_res(const DepthRoute<float>& got, const AttnResForwardOracle<R>& o) {
  bounds::ParityOutcome r;
  bounds::check_parity("h", got.h, o.ref.h, o.hp.h, o.b.h, r);
  bounds::check_parity("alpha", got.alpha, o.ref.alpha, o.hp.alpha, o.b.alpha, r);
  bounds::check_parity("alpha_null", got.alpha_null, o.ref.alpha_null, o.hp.alpha_null, o.b.alpha_null, r);
  bounds::check_parity("g", got.g, o.ref.g, o.hp.g, o.b.g, r);
  bounds::check_parity("dpsi", got.dpsi, o.ref.dpsi, o.hp.dpsi, o.b.dpsi, r);
  return r;
}

/// Every gradient of a backward under the rule (gain's when there is one; beta and theta with coupling).
template <class R>
bounds::ParityOutcome check_attn_res_backward(const AttnResGrads<float>& got, const AttnResBackwardOracle<R>& o,
                                              bool coupling) {
  bounds::ParityOutcome r;
  bounds::check_parity("grad_sources", got.sources, o.ref.sources, o.hp.sources, o.sources, r);
  bounds::check_parity("grad_w", got.w, o.ref.w, o.hp.w, o.w, r);
  if (!o.gain.empty()) bounds::check_parity("grad_gain", got.gain, o.ref.gain, o.hp.gain, o.gain, r);
  bounds::check_parity("grad_psi", got.psi, o.ref.psi, o.hp.psi, o.psi, r);
  bounds::check_parity("grad_logits", got.logits, o.ref.logits, o.hp.logits, o.logits, r);
  if (coupling) {
    bounds::check_parity("grad_beta", Tensor<float>({1}, got.beta), Tensor<float>({1}, o.ref.beta),
                         Tensor<R>({1}, o.hp.beta), o.beta, r);
    bounds::check_parity("grad_theta", Tensor<float>({1}, got.theta), Tensor<float>({1}, o.ref.theta),
                         Tensor<R>({1}, o.hp.theta), o.theta, r);
  }
  return r;
}

}  // namespace oasis::fast_parity
