// src/verify/op_normalizer.cpp — op "normalizer": rows of logits through softmax or Softmax1 (docs/spec.md §1).
#include <cmath>
#include <map>

#include "lse_convention.hpp"
#include "ops.hpp"
#include "oasis/ops/prob_bounds.hpp"
#include "oasis/ops/error_bounds.hpp"
#include "oasis/oasis.hpp"

namespace oasis::verify::detail {
namespace {

/// u_D and the subnormal floor 2 denorm_min(D) of a stored dtype.
bounds::Precision precision_of(DType d) {
  return {unit_roundoff(d), 2.0 * std::ldexp(1.0, io::dtype_min_exponent(d) - io::dtype_fraction_bits(d))};
}

CompareReport run(const OpCall& c) {
  const TensorMap &in = c.inputs, &out = c.outputs;
  const Options& o = c.options;
  const CompareOptions& copt = c.compare;
  const RowNorm kind = token_normalizer(o, "normalizer");
  const LseConvention conv = lse_convention(o);
  const StoredTensor& z = need(in, "z", "normalizer");
  OASIS_REQUIRE(z.values.rank() >= 1, "z", "must have rank >= 1 (rows of logits), got a scalar");
  const index_t m = z.values.dim(z.values.rank() - 1);
  Shape lead(z.values.shape().begin(), z.values.shape().end() - 1);
  const index_t R = shape_numel(lead);
  std::vector<double> s(static_cast<std::size_t>(R), o.number("null_logit", 0.0));
  if (const StoredTensor* st = maybe(in, "s")) {
    OASIS_REQUIRE(!o.has("null_logit"), "s", "given both as input tensor 's' and as option null_logit");
    OASIS_REQUIRE(st->values.shape() == lead || st->values.size() == 1, "s", "shape ", shape_str(st->values.shape()),
                  " must be the rows' shape ", shape_str(lead), " or a single value");
    for (index_t r = 0; r < R; ++r) s[static_cast<std::size_t>(r)] = st->values[st->values.size() == 1 ? 0 : r];
  }
  OASIS_REQUIRE(kind == RowNorm::softmax1 || (!maybe(in, "s") && !o.has("null_logit")), "null_logit",
                "given but the normaliser is softmax (no null category)");
  // Outputs present, with their accumulation precision (double for f64, float otherwise).
  // pr: the accumulation precision (double for f64, float otherwise) of the probabilistic term;
  // wc: the precision of the worst-case bound, D itself (a computation entirely in D)
  struct Target {
    int kind;  // 0 p, 1 p_null, 2 lse
    const StoredTensor* got;
    bounds::Precision pr, wc;
  };
  const std::map<std::string, std::pair<int, Shape>> known = {{"p", {0, z.values.shape()}}, {"p_null", {1, lead}}, {"lse", {2, lead}}};
  CompareReport rep;
  rep.op = "normalizer";
  std::vector<Target> targets;
  std::vector<TensorCheck> checks;
  std::vector<std::size_t> slot;
  for (const auto& [name, t] : out) {
    auto it = known.find(name);
    if (it == known.end()) continue;  // an input held in the same file
    if (t.values.shape() != it->second.second) {
      rep.tensors.push_back(shape_mismatch(name, t, it->second.second));
      continue;
    }
    targets.push_back({it->second.first, &t, precision_of(t.dtype == DType::f64 ? DType::f64 : DType::f32), precision_of(t.dtype)});
    checks.emplace_back(name, t, copt.show);
    slot.push_back(rep.tensors.size());
    rep.tensors.emplace_back();
  }
  // Row by row in mp50; the bounds of the row (oasis/ops/error_bounds.hpp row_bound, worst case;
  // oasis/ops/prob_bounds.hpp prob_row, probabilistic) with exact logits (no error of their own).
  const std::vector<index_t> rows = sample_rows(R, copt.sample, copt.seed);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Vec<mp50> zr(m);
  std::vector<double> pd(static_cast<std::size_t>(m));
  for (index_t r : rows) {
    for (index_t j = 0; j < m; ++j) zr[j] = mp50(z.values[r * m + j]);
    const double sr = s[static_cast<std::size_t>(r)];
    const RowProbs<mp50> rp = kind == RowNorm::softmax1 ? softmax_null(zr, mp50(sr)) : softmax(zr);
    for (index_t j = 0; j < m; ++j) pd[static_cast<std::size_t>(j)] = static_cast<double>(rp.p[j]);
    const double pn = static_cast<double>(rp.p_null), ls = static_cast<double>(rp.lse);
    const bounds::RowBound b1 = bounds::row_bound(bounds::Precision{1.0, 0.0}, kind, z.values.data() + r * m, nullptr, m, sr,
                                                  0.0, pd.data(), pn, ls);
    const bounds::ProbRow pr = bounds::prob_row(kind, z.values.data() + r * m, nullptr, m, sr, 0.0, 0.0, pd.data(), pn, ls);
    // the LSE in the call's convention (lse_convention.hpp)
    LseRow lr{ls, rp.lse, true, b1.lse, pr.lse};
    if (!conv.is_default()) {
      mp50 keys(-std::numeric_limits<double>::infinity());
      if (conv.keys_only && !keys_lse_from_probs(rp.lse, std::vector<mp50>(rp.p.data(), rp.p.data() + m), keys))
        keys = softmax(zr).lse;  // a +inf null logit
      to_convention(conv, RowLogits{kind, z.values.data() + r * m, nullptr, nullptr, m, sr, 0.0, pd.data(), pn}, &keys, lr);
    }
    for (std::size_t ti = 0; ti < targets.size(); ++ti) {
      const Target& tg = targets[ti];
      const double uw = tg.wc.u, flw = tg.wc.p_floor, fl = tg.pr.p_floor, lam = bounds::kSecondOrder * kLambda * tg.pr.u;
      // allowed_terms scales a 16-bit worst-case term by u_D / u_f32: undo it for a bound at u_D
      const double back = is16(tg.got->dtype) ? unit_roundoff(DType::f32) / unit_roundoff(tg.got->dtype) : 1.0;
      auto add = [&](index_t flat, const mp50& ref, double wc, double prob) {
        const double hi = static_cast<double>(ref);
        const double lo = std::isfinite(hi) ? static_cast<double>(ref - mp50(hi)) : 0.0;
        checks[ti].add(flat, RefValue{hi, lo, 0.0, &ref}, allowed_terms(tg.got->dtype, copt.policy, wc * back, prob, 0.0));
      };
      if (tg.kind == 0) {
        for (index_t j = 0; j < m; ++j) {
          const bool masked = std::isinf(z.values[r * m + j]);
          add(r * m + j, rp.p[j], masked ? 0.0 : uw * b1.p[static_cast<std::size_t>(j)] + flw,
              masked ? 0.0 : lam * pr.p[static_cast<std::size_t>(j)] + fl);
        }
      } else if (tg.kind == 1) {
        const bool has = kind == RowNorm::softmax1;
        add(r, rp.p_null, has ? uw * b1.p_null + flw : 0.0, has ? lam * pr.p_null + fl : 0.0);
      } else {
        add(r, lr.value_mp, uw * lr.wc, std::isinf(lr.value) ? nan : lam * lr.R);
      }
    }
  }
  for (std::size_t ti = 0; ti < targets.size(); ++ti)
    rep.tensors[slot[ti]] = checks[ti].finish(bound_name(targets[ti].got->dtype, copt.policy, true, false) +
                                              (targets[ti].kind == 2 && !conv.is_default() ? "; LSE " + conv.describe() : ""));
  if (copt.sample > 0 && copt.sample < R) {
    rep.sample.rows = static_cast<index_t>(rows.size());
    rep.sample.total = R;
    rep.sample.seed = copt.seed;
    rep.sample.row_kind = "(row of z)";
    for (index_t r : rows) rep.sample.which.push_back("(" + std::to_string(r) + ")");
  }
  rep.passed = std::all_of(rep.tensors.begin(), rep.tensors.end(), [](const TensorReport& t) { return t.passed; });
  return rep;
}

}  // namespace

OpSpec normalizer_op() {
  OpSpec s{"normalizer",
          {{"z", "[..., m]"}, {"s", "[...] or [1]", false}},
          {{"p", "[..., m]"}, {"p_null", "[...]"}, {"lse", "[...]"}},
          {"normalizer", "null_logit", "lse_null", "lse_base"},
          "normalizer: softmax1 (default) | softmax; null_logit: one null logit for every row (or input s; -inf: no\n"
          "                null, +inf: all on it); lse_null, lse_base: the convention of lse (as attention)",
          run};
  s.samples_rows = true;
  return s;
}

}  // namespace oasis::verify::detail
