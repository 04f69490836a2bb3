// src/verify/op_attention_backward.cpp — op "attention_backward": the gradients of token attention
// (docs/spec.md §8) from the incoming gradients of its outputs.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "attention_backward_oracle.hpp"
#include "lse_convention.hpp"
#include "op_layouts.hpp"
#include "ops.hpp"
#include "oasis/grad/backward_prob_bounds.hpp"
#include "oasis/grad/grad.hpp"
#include "oasis/oasis.hpp"

namespace oasis::verify::detail {
namespace {

CompareReport run(const OpCall& c) {
  if (thd_layout(c.options)) return thd_attention_backward(c, run);  // packed: per-sequence dense calls of run
  const TensorMap &in = c.inputs, &out = c.outputs;
  const std::string op = "attention_backward";
  const StoredTensor &q = need(in, "q", op), &k = need(in, "k", op), &v = need(in, "v", op), &dout = need(in, "grad_out", op);
  const StoredTensor *dlse = maybe(in, "grad_lse"), *dpn = maybe(in, "grad_p_null");
  if (dlse) (void)need(in, "grad_lse", op);
  if (dpn) (void)need(in, "grad_p_null", op);
  AttentionOptions a = attention_call_options(c.options, in);
  OASIS_REQUIRE(!out.count("grad_null_logits") || a.normalizer == RowNorm::softmax1, "grad_null_logits",
                "grad_null_logits given but the normaliser is softmax (no null logit)");
  OASIS_REQUIRE(!out.count("grad_bias") || !a.bias.empty(), "grad_bias", "grad_bias given but the inputs hold no bias");
  a.return_probs = true;  // the bounds need the exact probabilities
  // grad_lse of an LSE in another convention (lse_convention.hpp) becomes the cotangents of LSE1 and
  // p_null, converted from the exact forward: the op is then checked in mp50, where that is exact
  const LseConvention lc = lse_convention(c.options);
  const bool convert = dlse && !lc.is_default();
  Tensor<mp50> dlse1, dpn1;
  auto cot = [&](auto tag) {
    using T = decltype(tag);
    if (convert) return AttentionCotangents<T>{as<T>(dout), dlse1.cast<T>(), dpn1.cast<T>()};
    return AttentionCotangents<T>{as<T>(dout), dlse ? as<T>(*dlse) : Tensor<T>(), dpn ? as<T>(*dpn) : Tensor<T>()};
  };
  AttentionOptions ab = a;
  ab.return_probs = false;
  // The forward the kernel's backward reads (FlashAttention-2: D from the stored O, P from the
  // stored LSE): as given, each checked against the forward first; O not given may be stored in
  // the inputs' type when that is 16-bit (docs/tolerances.md, "Designs of real kernels").
  const StoredTensor *sout = maybe(in, "out"), *slse = maybe(in, "lse");
  if (sout) (void)need(in, "out", op);
  if (slse) (void)need(in, "lse", op);
  Tensor<double> lse1;  // the stored LSE in nats with the null (LSE1)
  if (slse) lse1 = lse1_of(lc, a, slse->values);
  bounds::StoredForward sf;
  sf.out = sout ? &sout->values : nullptr;
  sf.lse = slse ? &lse1 : nullptr;
  double n16 = 0;  // the smallest normal number of a 16-bit input type (P and dS rounded to it)
  for (const StoredTensor* x : {&q, &dout})
    if (is16(x->dtype)) {
      sf.out_u = std::max(sf.out_u, unit_roundoff(x->dtype));
      n16 = std::max(n16, std::ldexp(1.0, io::dtype_min_exponent(x->dtype)));
    }
  sf.out_min = n16;
  const bool stored = sf.out || sf.lse || sf.out_u > 0;  // else the stored forward adds nothing
  auto bound_map = [](const bounds::AttentionBackwardBounds& b) {
    return BoundMap{{"grad_q", b.q}, {"grad_k", b.k}, {"grad_v", b.v}, {"grad_null_logits", b.null_logits},
                    {"grad_bias", b.bias}};
  };
  // the probabilistic bound of f64 gradients: none (the worst-case line decides them)
  auto nan_bounds = [&] {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    auto filled = [nan](const Shape& sh) {
      Tensor<double> t(sh);
      for (index_t i = 0; i < t.size(); ++i) t[i] = nan;
      return t;
    };
    return BoundMap{{"grad_q", filled(q.values.shape())}, {"grad_k", filled(k.values.shape())},
                    {"grad_v", filled(v.values.shape())},
                    {"grad_null_logits", a.normalizer == RowNorm::softmax1 ? filled({q.values.dim(a.layout == AttentionLayout::bthd ? 2 : 1)}) : Tensor<double>()},
                    {"grad_bias", a.bias.empty() ? Tensor<double>() : filled(a.bias.shape())}};
  };
  // the blocked oracle covers calls with finite null logits, on inputs exact in float
  // (its float bounds read them as the plain ones read their float copies)
  auto blocked_applies = [&] {
    if (!fast_backward_applies(a)) return false;
    for (const StoredTensor* x : {&q, &k, &v, &dout, dlse, dpn})
      if (x && x->dtype == DType::f64) return false;
    return true;
  };
  auto any_f64_output = [&] {
    for (const auto& [name, t] : out)
      if (t.dtype == DType::f64) return true;
    return false;
  };
  // The policy's bounds: the reference backward's bound in float (f16/bf16/f32 outputs) or double
  // (f64), with the coefficients taken from the forward `fwd` (mp50, or the fast oracle's double),
  // and the stored forward's error added unscaled.
  // `prob`: the probabilistic bound (backward_prob_bounds.hpp) instead of the worst case, for
  // f32/f16/bf16 gradients; f64 ones keep the worst-case line (NaN: none), which the double oracle
  // decides without recomputing the whole op in mp50 (at u = 2^-53 its own error is of the order
  // of the probabilistic line).
  auto plain_bounds = [&](const auto& fwd, bool prob) {
    return PlainBounds(
        [&q, &k, &v, &cot, &a, &fwd, &sf, bound_map, prob, n16, &nan_bounds](bool wide) {
          auto run = [&](auto tag) {
            using T = decltype(tag);
            return bound_map(prob ? bounds::prob_attention_backward_bounds(as<T>(q), as<T>(k), as<T>(v), cot(tag), a, fwd,
                                                                           kLambda, sf.out_u, n16)
                                  : bounds::attention_backward_bounds(as<T>(q), as<T>(k), as<T>(v), cot(tag), a, fwd, true));
          };
          if (!wide || !prob) return wide ? run(double{}) : run(float{});
          return nan_bounds();
        },
        stored ? PlainBounds::Fn([&q, &k, &v, &cot, &a, &fwd, &sf, bound_map](bool wide) {
          auto run = [&](auto tag) {
            using T = decltype(tag);
            return bound_map(bounds::stored_forward_bounds(as<T>(q), as<T>(k), as<T>(v), cot(tag), a, fwd, sf));
          };
          return wide ? run(double{}) : run(float{});
        })
               : PlainBounds::Fn());
  };
  // a stored forward beyond the forward's certain line is not the forward of these inputs
  auto plain_fwd_bounds = [&q, &k, &v, &a](const auto& fwd) {
    return [&q, &k, &v, &a, &fwd](bool wide) {
      auto run = [&](auto tag) {
        using T = decltype(tag);
        return bounds::attention_bounds(as<T>(q), as<T>(k), as<T>(v), a, fwd);
      };
      return wide ? run(double{}) : run(float{});
    };
  };
  // (`fb(wide)`: attention_bounds' out and lse in double for an f64 stored tensor, else in float)
  auto check_stored = [&](const auto& fwd, const auto& fb) {
    if (!sout && !slse) return;
    for (const StoredTensor* x : {sout, slse}) {
      if (!x) continue;
      const bool is_out = x == sout;
      const bounds::AttentionBounds& fb_x = fb(x->dtype == DType::f64);
      const Tensor<double>& B = is_out ? fb_x.out : fb_x.lse;
      const double sc = x->dtype == DType::f64 ? 1.0 : unit_roundoff(x->dtype) / unit_roundoff(DType::f32);
      const auto& ex = is_out ? fwd.out : fwd.lse;
      const Tensor<double>& got = is_out ? x->values : lse1;
      OASIS_REQUIRE(got.shape() == ex.shape(), is_out ? "out" : "lse", "has shape ", shape_str(x->values.shape()),
                    ", expected ", shape_str(ex.shape()), " (the forward's)");
      for (index_t i = 0; i < got.size(); ++i) {
        const double e = static_cast<double>(ex[i]);
        if (std::isinf(e) && got[i] == e) continue;
        const double err = std::abs(got[i] - e), allowed = 2.0 * B[i] * sc + io::dtype_ulp(x->dtype, std::abs(e));
        OASIS_REQUIRE(err <= allowed, is_out ? "out" : "lse", "the stored ", is_out ? "output" : "LSE", " is not the "
                      "forward of these inputs: flat index ", i, " holds ", x->values[i], ", the exact forward ", e,
                      is_out ? "" : " (as LSE1 in nats)", ", |err| ", err, " beyond the forward's certain bound ", allowed,
                      " (check the forward with op attention)");
      }
    }
  };
  CompareReport rep;
  rep.op = op;
  std::string fallback;
  if (c.compare.oracle == Oracle::fast && !convert) {
    // The fast oracle: forward and backward in double, each element judged with the double
    // reference's own worst-case error (attention_backward_bounds at u = 2^-53, x 1.01 because its
    // coefficients come from the double forward) folded in, and the policy's terms within a relative
    // kRho of their values at the exact forward (each is a sum of magnitudes scaled by u_D, whose
    // double evaluation is ~1e-16 relative). An element either line leaves undecided sends the
    // whole op to mp50 (the gradients of k, v and the null logits are sums over every row), unless
    // every tensor holding one is already FAIL-certain or the recomputation is past the budget
    // (docs/policies.md, "Failing fast"). The blocked oracle (attention_backward_oracle.hpp)
    // computes the same values and bounds as matrix products; the plain functions serve the rest.
    constexpr double kRho = 1e-6;
    const Tensor<double> qd = as<double>(q), kd = as<double>(k), vd = as<double>(v);
    const AttentionCotangents<double> dd = cot(double{});
    index_t undecided = 0;
    auto judge = [&](const AttentionGrads<double>& ref, const bounds::AttentionBackwardBounds& own, PlainBounds& pb,
                     PlainBounds& pp) {
      undecided = compare_outputs(rep, out,
                                  {{"grad_q", {&ref.q, &own.q, 1.01}},
                                   {"grad_k", {&ref.k, &own.k, 1.01}},
                                   {"grad_v", {&ref.v, &own.v, 1.01}},
                                   {"grad_null_logits", {&ref.null_logits, &own.null_logits, 1.01}},
                                   {"grad_bias", {&ref.bias, &own.bias, 1.01}}},
                                  pb, c.compare, kRho, c.compare.policy == Policy::worst_case ? nullptr : &pp);
    };
    if (blocked_applies()) {
      BackwardOracleRequest rq;
      rq.wc_double = any_f64_output();
      rq.prob = c.compare.policy != Policy::worst_case;
      rq.lambda = kLambda;
      rq.u16 = sf.out_u;
      rq.n16 = n16;
      if (stored) rq.stored = &sf;
      const BackwardOracle bo = fast_attention_backward(qd, kd, vd, dd, a, rq);
      check_stored(bo.fwd, [&](bool wide) -> const bounds::AttentionBounds& { return wide ? bo.fwd_double : bo.fwd_float; });
      const PlainBounds::Fn fixed =
          stored ? PlainBounds::Fn([&](bool wide) { return bound_map(wide ? bo.fixed_double : bo.fixed_float); })
                 : PlainBounds::Fn();
      PlainBounds pb([&](bool wide) { return bound_map(wide ? bo.wc_double : bo.wc_float); }, fixed),
          pp([&](bool wide) { return wide ? nan_bounds() : bound_map(bo.prob); }, fixed);
      judge(bo.ref, bo.own, pb, pp);
    } else {
      const AttentionResult<double> fwd = token_attention(qd, kd, vd, a);
      check_stored(fwd, plain_fwd_bounds(fwd));
      const AttentionGrads<double> ref = token_attention_backward(qd, kd, vd, dd, ab);
      const bounds::AttentionBackwardBounds own = bounds::attention_backward_bounds(qd, kd, vd, dd, a, fwd);
      PlainBounds pb = plain_bounds(fwd, false), pp = plain_bounds(fwd, true);
      judge(ref, own, pb, pp);
    }
    if (undecided == 0) {
      rep.oracle = "fast (double, its own error bound folded in)";
      return rep;
    }
    bool needed = false;  // some undecided element could still change its tensor's verdict
    for (const TensorReport& t : rep.tensors) needed = needed || (t.undecided > 0 && !t.certain_failure);
    const AttentionShape s = check_attention_shapes(qd, kd, vd, a);
    // mp50 forward (q k, p v) and backward (q k again, dO v, dS k, dS q, P dO) per (row, key), and
    // the probabilities of every row held at once besides one head's P, dP and dS
    const double pairs = static_cast<double>(s.B * s.H * s.Tq) * static_cast<double>(s.Tk);
    const double work = pairs * static_cast<double>(4 * s.d_h + 3 * s.d_v);
    const double bytes =
        static_cast<double>(sizeof(mp50)) * (pairs + 3.0 * static_cast<double>(s.Tq * s.Tk) +
                                             static_cast<double>(q.values.size() + k.values.size() + v.values.size()) * 2);
    const std::string kept = "fast (double, its own error bound folded in; " + std::to_string(undecided) +
                             " elements undecided, 0 rows recomputed in mp50)";
    if (!needed) {
      rep.notes.push_back("the elements left undecided by the double oracle were not recomputed in mp50: each lies "
                          "in a tensor already FAIL-certain, whose verdict they cannot change");
      rep.oracle = kept;
      return rep;
    }
    if (!mp50_fits(rep, work, bytes, c.compare, "the backward (its k, v and null-logit gradients sum over every row: the whole op)")) {
      rep.oracle = kept;
      return rep;
    }
    rep = CompareReport{};
    rep.mp50_rows = s.B * s.H * s.Tq;
    rep.mp50_work = work;
    rep.op = op;
    fallback = "; " + std::to_string(undecided) + " elements undecided by the fast oracle";
  }
  const Tensor<mp50> qm = as<mp50>(q), km = as<mp50>(k), vm = as<mp50>(v);
  const AttentionResult<mp50> fwd = token_attention(qm, km, vm, a);
  if (fallback.empty()) check_stored(fwd, plain_fwd_bounds(fwd));
  if (convert) lse_cotangents(lc, fwd, a.normalizer, dlse->values, dpn ? &dpn->values : nullptr, dlse1, dpn1);
  const AttentionGrads<mp50> ref = token_attention_backward(qm, km, vm, cot(mp50{}), ab);
  PlainBounds bounds = plain_bounds(fwd, false), prob = plain_bounds(fwd, true);
  compare_outputs(rep, out,
                  {{"grad_q", &ref.q}, {"grad_k", &ref.k}, {"grad_v", &ref.v}, {"grad_null_logits", &ref.null_logits},
                   {"grad_bias", &ref.bias}},
                  bounds, c.compare, c.compare.policy == Policy::worst_case ? nullptr : &prob);
  rep.oracle = convert ? "mp50 (grad_lse in another LSE convention: converted exactly in mp50)" : "mp50" + fallback;
  return rep;
}

}  // namespace

OpSpec attention_backward_op() {
  return {"attention_backward",
          {{"q", "[B,H,Tq,dh]"},
           {"k", "[B,Hkv,Tk,dh]"},
           {"v", "[B,Hkv,Tk,dv]"},
           {"grad_out", "[B,H,Tq,dv]"},
           {"grad_lse", "[B,H,Tq]", false},
           {"grad_p_null", "[B,H,Tq]", false},
           {"null_logits", "[H]", false},
           {"bias", "[Tq,Tk] or [B|1,H|1,Tq,Tk]", false},
           {"out", "[B,H,Tq,dv]", false},
           {"lse", "[B,H,Tq]", false},
           {"cu_seqlens_q", "[B+1] int32/int64 (layout thd)", false},
           {"cu_seqlens_k", "[B+1] int32/int64 (layout thd)", false}},
          {{"grad_q", "[B,H,Tq,dh]"},
           {"grad_k", "[B,Hkv,Tk,dh]"},
           {"grad_v", "[B,Hkv,Tk,dv]"},
           {"grad_null_logits", "[H] (thd: [B,H] per sequence, or [H] with one sequence of queries)"},
           {"grad_bias", "shape of bias"}},
          {"normalizer", "causal", "key_lengths", "null_logits", "scale", "window", "layout", "lse_null", "lse_base"},
          "as attention, plus window (0: none) and layout (bhtd | bthd: q, k, v, grad_out and grad_q/k/v as [B,T,H,d]);\n"
          "                grad_lse, grad_p_null: incoming gradients of lse and p_null (absent: 0); grad_lse is of the\n"
          "                LSE in the convention of lse_null and lse_base (as attention);\n"
          "                out, lse: the forward's stored output and LSE (as attention) when the backward reads them\n"
          "                (FlashAttention-2: D = rowsum(grad_out out)); absent: out may be stored in a 16-bit input type;\n"
          "                layout thd: every tensor packed as op attention's (grad_lse, grad_p_null, lse [H,total_q])",
          run};
}

}  // namespace oasis::verify::detail
