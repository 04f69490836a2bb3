// proofs_checks/mass_scaling.cpp — mass scaling and ratio preservation (Eq. 4.1, App. C.5;
// SPEC §1, §5.1).
//
// With q = softmax(z) and (p, p_null) = softmax with a null category of logit s:
//   p_j = (1 - p_null) q_j,   p_j / p_k = q_j / q_k,   sum_j p_j + p_null = 1,
//   p_null = sigmoid(s - LSE_keys),   LSE1 = logaddexp(s, LSE_keys),   A~ = (1 - p_null) A,
// where A and A~ are the token-attention outputs of the two normalisers on the same row.
// Limits: a fully masked row gives p_null = 1, LSE1 = s, A~ = 0; all logits -> -inf gives
// p_null -> 1 while plain softmax stays uniform.
#include "statements.hpp"
#include "support.hpp"

namespace oasis::checks {
namespace {
using namespace detail;

const char* const kId = "mass_scaling";
const char* const kRef = "Eq. 4.1 and App. C.5 (mass scaling, ratio preservation)";

template <class T> struct Impl {
  AttentionFn<T> attention;  ///< evaluated with softmax and with softmax1 (null logit s)
};

template <class T> void body(const Impl<T>& impl, const CheckConfig& cfg, Tally& t) {
  using std::abs; using std::exp; using std::log;
  Rng rng(seed_for(cfg, kId));
  const int n = instances_for<T>(cfg);
  for (int it = 0; it < n; ++it) {
    // Instance kinds: 0..5 random rows, 6 fully masked row, 7 the -inf limit (equal, very negative logits).
    const int kind = it % 8;
    const int m = rng.integer(1, 12), dv = rng.integer(1, 4);
    const double s = rd<T>(rng.normal(2.0));
    std::vector<double> z(static_cast<std::size_t>(m));
    const double shift = kind == 7 ? -200.0 : rng.uniform(-30.0, 10.0);
    const double zc = rng.normal(1.0);
    for (double& x : z) x = rd<T>((kind == 7 ? zc : rng.normal(3.0)) + shift);
    std::vector<std::vector<double>> v(static_cast<std::size_t>(m), std::vector<double>(static_cast<std::size_t>(dv)));
    for (auto& row : v) for (double& x : row) x = rd<T>(rng.normal(1.0));
    const index_t visible = kind == 6 ? 0 : (rng.integer(0, 3) == 0 ? rng.integer(1, m) : m);
    t.begin(it, kind >= 6, kind == 6 ? "fully masked row" : kind == 7 ? "all logits -> -inf" : "");

    const AttentionEval a = attend<T>(t, impl.attention, RowSpec{{z}, {v}, visible, RowNorm::softmax, {}});
    const AttentionEval b = attend<T>(t, impl.attention, RowSpec{{z}, {v}, visible, RowNorm::softmax1, {s}});
    const R pn = b.val.p_null(0, 0, 0), lse1 = b.val.lse(0, 0, 0), lse_keys = a.val.lse(0, 0, 0);
    const double b_pn = b.bound.p_null(0, 0, 0);
    const R sR(s);

    // sum_j p_j + p_null = 1
    R mass = pn;
    double b_mass = b_pn;
    for (index_t j = 0; j < visible; ++j) { mass += b.val.probs(0, 0, 0, j); b_mass += b.bound.probs(0, 0, 0, j); }
    t.identity("sum_j p_j + p_null = 1", dbl(abs(mass - 1)), b_mass + kEvalAllowance);
    // masked keys carry exactly zero probability in both normalisers
    for (index_t j = visible; j < m; ++j)
      if (b.val.probs(0, 0, 0, j) != 0 || a.val.probs(0, 0, 0, j) != 0) t.fail("masking", "masked key ", j, " has p != 0");

    if (visible == 0) {  // fully masked: p_null = 1, LSE1 = s, output 0 (exact in every T)
      t.identity("fully masked row: p_null = 1", dbl(abs(pn - 1)), 0.0);
      t.identity("fully masked row: LSE1 = s", dbl(abs(lse1 - sR)), 0.0);
      for (index_t c = 0; c < dv; ++c) t.identity("fully masked row: A~ = 0", dbl(abs(b.val.out(0, 0, 0, c))), 0.0);
      continue;
    }
    // p_j = (1 - p_null) q_j, and ratio preservation p_j q_k = p_k q_j for the extreme pair
    index_t jmax = 0, jmin = 0;
    for (index_t j = 0; j < visible; ++j) {
      const R q = a.val.probs(0, 0, 0, j), p = b.val.probs(0, 0, 0, j);
      const double allowed = b.bound.probs(0, 0, 0, j) + dbl(q) * b_pn + dbl(1 - pn) * a.bound.probs(0, 0, 0, j);
      t.identity("p_j = (1 - p_null) q_j", dbl(abs(p - (1 - pn) * q)), allowed + kEvalAllowance);
      if (q > a.val.probs(0, 0, 0, jmax)) jmax = j;
      if (q < a.val.probs(0, 0, 0, jmin)) jmin = j;
    }
    {
      const R pj = b.val.probs(0, 0, 0, jmax), pk = b.val.probs(0, 0, 0, jmin);
      const R qj = a.val.probs(0, 0, 0, jmax), qk = a.val.probs(0, 0, 0, jmin);
      // relative residual of p_j q_k = p_k q_j
      const R scale = pj * qk + pk * qj;
      const double rel = dbl(pj) > 0 && dbl(qk) > 0 && dbl(pk) > 0 && dbl(qj) > 0
                             ? b.bound.probs(0, 0, 0, jmax) / dbl(pj) + a.bound.probs(0, 0, 0, jmin) / dbl(qk) +
                                   b.bound.probs(0, 0, 0, jmin) / dbl(pk) + a.bound.probs(0, 0, 0, jmax) / dbl(qj)
                             : 0.0;
      if (scale > 0 && rel < 1) t.identity("p_j / p_k = q_j / q_k", dbl(abs(pj * qk - pk * qj) / scale), rel + kEvalAllowance);
    }
    // p_null = sigmoid(s - LSE_keys), LSE1 = logaddexp(s, LSE_keys)
    const R sig = sigmoid(sR - lse_keys);
    t.identity("p_null = sigmoid(s - LSE_keys)", dbl(abs(pn - sig)),
               b_pn + dbl(sig * (1 - sig)) * a.bound.lse(0, 0, 0) + kEvalAllowance);
    const R lae = logaddexp(sR, lse_keys);
    t.identity("LSE1 = logaddexp(s, LSE_keys)", dbl(abs(lse1 - lae)),
               b.bound.lse(0, 0, 0) + dbl(1 - sig) * a.bound.lse(0, 0, 0) + kEvalAllowance * (1 + dbl(abs(lae))));
    // A~ = (1 - p_null) A
    for (index_t c = 0; c < dv; ++c) {
      const R A = a.val.out(0, 0, 0, c), At = b.val.out(0, 0, 0, c);
      const double allowed = b.bound.out(0, 0, 0, c) + dbl(abs(A)) * b_pn + dbl(1 - pn) * a.bound.out(0, 0, 0, c);
      t.identity("A~ = (1 - p_null) A", dbl(abs(At - (1 - pn) * A)), allowed + kEvalAllowance);
    }
    if (kind == 7) {
      // limit: 1 - p_null = sum_j e^{z_j - s} / (e^0 + ...) <= m e^{max z - s}; plain softmax uniform.
      const R tail = R(visible) * exp(R(z[0]) - sR);
      t.margin("all z -> -inf: 1 - p_null <= m e^{z - s}", dbl(tail - (1 - pn)), b_pn + kEvalAllowance);
      for (index_t j = 0; j < visible; ++j)
        t.identity("all z -> -inf: softmax stays uniform", dbl(abs(a.val.probs(0, 0, 0, j) - R(1) / R(visible))),
                   a.bound.probs(0, 0, 0, j) + kEvalAllowance);
    }
  }
}

// ---- mutants -------------------------------------------------------------------------------------

/// Null logit left out of the LSE: p = softmax(z) and p_null = exp(s - LSE_keys).
template <class T> Impl<T> null_logit_left_out_of_lse() {
  return {[](const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionOptions& o) {
    if (o.normalizer != RowNorm::softmax1) return token_attention<T>(q, k, v, o);
    using std::exp;
    AttentionOptions o0 = o;
    o0.normalizer = RowNorm::softmax;
    o0.null_logits.clear();
    AttentionResult<T> r = token_attention<T>(q, k, v, o0);
    for (index_t i = 0; i < r.p_null.size(); ++i) {
      const T s = o.null_logits.empty() ? T(0) : T(o.null_logits[static_cast<std::size_t>(i % q.dim(1))]);
      r.p_null[i] = is_neg_inf(r.lse[i]) ? T(1) : exp(s - r.lse[i]);
    }
    return r;
  }};
}

/// The sink logit is ignored: Softmax1 (s = 0) whatever the configured null logit.
template <class T> Impl<T> null_logit_ignored() {
  return {[](const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionOptions& o) {
    AttentionOptions o1 = o;
    o1.null_logits.clear();
    return token_attention<T>(q, k, v, o1);
  }};
}

/// The output is mixed with the softmax weights (not attenuated) while p and p_null are right.
template <class T> Impl<T> output_not_attenuated() {
  return {[](const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionOptions& o) {
    AttentionResult<T> r = token_attention<T>(q, k, v, o);
    if (o.normalizer == RowNorm::softmax1) {
      AttentionOptions o0 = o;
      o0.normalizer = RowNorm::softmax;
      o0.null_logits.clear();
      r.out = token_attention<T>(q, k, v, o0).out;
    }
    return r;
  }};
}

}  // namespace

Check make_mass_scaling() {
  Check c;
  c.id = kId;
  c.paper_ref = kRef;
  c.statement = "p_j = (1 - p_null) q_j, ratios kept, p_null = sigmoid(s - LSE_keys), LSE1 = logaddexp(s, LSE_keys), "
                "A~ = (1 - p_null) A; masked row and -inf limit";
  c.run = [](const CheckConfig& cfg) {
    return run_check(kId, kRef, cfg, true, [&](auto tag, Backend b, Tally& t) {
      using T = typename decltype(tag)::type;
      body<T>(Impl<T>{library_attention<T>(b)}, cfg, t);
    });
  };
  c.mutants.push_back(mutant_of(kId, kRef, "null_logit_left_out_of_lse", "p = softmax(z), p_null = exp(s - LSE_keys)",
                                [](auto tag, const CheckConfig& cfg, Tally& t) {
                                  using T = typename decltype(tag)::type;
                                  body<T>(null_logit_left_out_of_lse<T>(), cfg, t);
                                }));
  c.mutants.push_back(mutant_of(kId, kRef, "sink_logit_ignored", "null logit s treated as 0 (Softmax1 always)",
                                [](auto tag, const CheckConfig& cfg, Tally& t) {
                                  using T = typename decltype(tag)::type;
                                  body<T>(null_logit_ignored<T>(), cfg, t);
                                }));
  c.mutants.push_back(mutant_of(kId, kRef, "output_not_attenuated", "A~ mixed with the softmax weights",
                                [](auto tag, const CheckConfig& cfg, Tally& t) {
                                  using T = typename decltype(tag)::type;
                                  body<T>(output_not_attenuated<T>(), cfg, t);
                                }));
  return c;
}

}  // namespace oasis::checks
