// oasis/model/precision.hpp — the stepwise precision check of a model against a high-precision
// model with the same weights (docs/model.md, "Forward error bound").
//
// Every step of the T model — each depth router; each attention sublayer as projections (q, k, v),
// attention core (heads, psi) and output projection; each MLP as hidden rows and output
// projection; the head — is re-evaluated in the
// reference scalar R on the T model's own inputs of that step (exact in R), with the error model
// of T's unit roundoff and zero input error. The step passes when every element satisfies
//   |got - ref| <= slack * bound(row),   slack = 1.02 (first-order bounds, second-order margin).
// The weights of both models must be equal (e.g. reference = model.cast<R>() of a T model).
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "oasis/model/model.hpp"

namespace oasis::model {

/// Outcome of one step: worst |err| / bound, number of elements over the bound, elements compared.
struct StepCheck {
  std::string step;
  double worst_ratio = 0;
  index_t violations = 0;
  index_t count = 0;
};

namespace detail {

template <class T, class R>
StepCheck compare_rows(const std::string& name, const Tensor<T>& got, const Tensor<R>& ref,
                       const std::vector<double>& bound, index_t w, double slack) {
  StepCheck c{name, 0.0, 0, got.size()};
  OASIS_REQUIRE(got.size() == ref.size(), name, "sizes differ: ", got.size(), " vs reference ", ref.size());
  for (index_t i = 0; i < got.size(); ++i) {
    const double g = to_double(got[i]), r = to_double(ref[i]);
    const double b = slack * bound[static_cast<std::size_t>(i / w)];
    const double err = std::abs(g - r);
    if (!(err <= b)) ++c.violations;  // NaN counts as a violation
    if (b > 0) c.worst_ratio = std::max(c.worst_ratio, err / b);
    else if (err > 0) c.worst_ratio = HUGE_VAL;
  }
  return c;
}

template <class T, class R>
Rows<R> exact_rows(const T* data, index_t rows, index_t w) {
  Rows<R> r{Tensor<R>({rows, w}), std::vector<double>(static_cast<std::size_t>(rows), 0.0)};
  for (index_t i = 0; i < rows * w; ++i) r.x[i] = R(data[i]);
  return r;
}

}  // namespace detail

/// Stepwise check of `model` (scalar T) against `reference` (scalar R, same weights) on token ids.
template <class T, class R>
std::vector<StepCheck> stepwise_precision(const Model<T>& model, const Model<R>& reference, const std::vector<index_t>& ids,
                                          index_t B, index_t Tn, double slack = 1.02) {
  const ModelConfig& c = model.config();
  OASIS_REQUIRE(c.forward_bound_derived(), "model",
                "stepwise precision needs the forward error bounds, which are not derived for gated attention "
                "or the prefix sink");
  const index_t N = B * Tn, d = c.d_model;
  const ForwardResult<T> res = model.forward(ids, B, Tn, {true});
  const ErrorModel em{unit_roundoff<T>()};
  const ForwardSchedule& S = reference.schedule();
  std::vector<std::string> router_params(static_cast<std::size_t>(S.trace_entries));  // per trace entry (wiring)
  for (std::size_t r = 0; r < S.wiring.routers.size(); ++r)
    router_params[static_cast<std::size_t>(S.router_trace[r])] = S.wiring.routers[r].params;
  std::vector<StepCheck> out;
  for (std::size_t l = 0; l < res.trace.size(); ++l) {
    const SublayerTrace<T>& tr = res.trace[l];
    const index_t b = static_cast<index_t>(l / 2);
    if (tr.has_route) {
      const index_t n = tr.sources.dim(0);
      std::vector<DepthSource<R>> src(static_cast<std::size_t>(n));
      std::vector<const DepthSource<R>*> ptr;
      for (index_t i = 0; i < n; ++i) {
        DepthSource<R>& s = src[static_cast<std::size_t>(i)];
        s.v = detail::exact_rows<T, R>(tr.sources.ptr(i), N, d);
        s.kind = tr.source_kinds[static_cast<std::size_t>(i)];
        s.psi = Tensor<R>({N});
        for (index_t t = 0; t < N; ++t) s.psi[t] = R(tr.psi.ptr(i)[t]);
        s.e_psi.assign(static_cast<std::size_t>(N), 0.0);
        ptr.push_back(&s);
      }
      const RouteResult<R> ref = reference.route(router_params[l], ptr, em);
      out.push_back(detail::compare_rows(tr.name + " routed", tr.routed, ref.h.x, ref.h.e, d, slack));
    }
    if (tr.kind == SublayerKind::attention) {
      // three steps: projections (norm, q/k/v, q/k norm, RoPE), attention core, output projection
      const AttentionWeights<R> W = reference.attn_weights(b);
      const index_t wq = tr.attn_q.dim(2), wkv = tr.attn_k.dim(2);
      Rows<R> q, k, v;
      attention_projections(detail::exact_rows<T, R>(tr.input.data(), N, d), Tn, 0, W, c, em, q, k, v);
      out.push_back(detail::compare_rows(tr.name + " q", tr.attn_q, q.x, q.e, wq, slack));
      out.push_back(detail::compare_rows(tr.name + " k", tr.attn_k, k.x, k.e, wkv, slack));
      out.push_back(detail::compare_rows(tr.name + " v", tr.attn_v, v.x, v.e, wkv, slack));
      KVCache<R> cache;
      const AttentionSublayer<R> a =
          attention_core(detail::exact_rows<T, R>(tr.attn_q.data(), N, wq), detail::exact_rows<T, R>(tr.attn_k.data(), N, wkv),
                         detail::exact_rows<T, R>(tr.attn_v.data(), N, wkv), B, Tn, c, cache, em);
      out.push_back(detail::compare_rows(tr.name + " heads", tr.attn_heads, a.heads.x, a.heads.e, wq, slack));
      out.push_back(detail::compare_rows(tr.name + " psi", tr.branch_psi, a.psi, a.e_psi, 1, slack));
      const Rows<R> o = linear(detail::exact_rows<T, R>(tr.attn_heads.data(), N, wq), *W.wo, em);
      out.push_back(detail::compare_rows(tr.name + " output", tr.output, o.x, o.e, d, slack));
    } else if (tr.kind == SublayerKind::mlp) {
      // two steps: hidden silu(W_gate x) * (W_up x) of x = RMSNorm(h), output projection
      const MlpWeights<R> W = reference.mlp_weights(b);
      const Rows<R> hid = mlp_hidden(detail::exact_rows<T, R>(tr.input.data(), N, d), W, c, em);
      out.push_back(detail::compare_rows(tr.name + " hidden", tr.mlp_hidden, hid.x, hid.e, c.d_ff, slack));
      const Rows<R> f = linear(detail::exact_rows<T, R>(tr.mlp_hidden.data(), N, c.d_ff), *W.down, em);
      out.push_back(detail::compare_rows(tr.name + " output", tr.output, f.x, f.e, d, slack));
    }
  }
  const Rows<R> logits = reference.head(detail::exact_rows<T, R>(res.state.data(), N, d), em);
  out.push_back(detail::compare_rows("head logits", res.logits, logits.x, logits.e, c.vocab_size, slack));
  return out;
}

}  // namespace oasis::model
