// proofs_checks/mass_scaling.cpp — mass scaling and ratio preservation (Eq. 4.1, App. C.5;
// docs/spec.md §1, §5.1).
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
const char* const kPaperRef = "Eq. 4.1 and App. C.5 (mass scaling, ratio preservation)";

template <class T> struct Implementation {
  AttentionFn<T> attention;  ///< evaluated with softmax and with softmax1 (null logit s)
};

template <class T> void check_statement(const Implementation<T>& impl, const CheckConfig& cfg, CheckRun& run) {
  using std::abs; using std::exp; using std::log;
  Rng rng(seed_for(cfg, kId));
  const int n = instances_for<T>(cfg);
  for (int it = 0; it < n; ++it) {
    // Instance kinds: 0..5 random rows, 6 fully masked row, 7 the -inf limit (equal, very negative logits).
    const int kind = it % 8;
    const int m = rng.integer(1, 12), dv = rng.integer(1, 4);
    const double s = rounded<T>(rng.normal(2.0));
    std::vector<double> z(static_cast<std::size_t>(m));
    const double shift = kind == 7 ? -200.0 : rng.uniform(-30.0, 10.0);
    const double zc = rng.normal(1.0);
    for (double& x : z) x = rounded<T>((kind == 7 ? zc : rng.normal(3.0)) + shift);
    std::vector<std::vector<double>> v(static_cast<std::size_t>(m), std::vector<double>(static_cast<std::size_t>(dv)));
    for (auto& row : v) for (double& x : row) x = rounded<T>(rng.normal(1.0));
    const index_t visible = kind == 6 ? 0 : (rng.integer(0, 3) == 0 ? rng.integer(1, m) : m);
    run.begin_instance(it, kind >= 6, kind == 6 ? "fully masked row" : kind == 7 ? "all logits -> -inf" : "");

    const AttentionEval a = attend<T>(run, impl.attention, RowSpec{{z}, {v}, visible, RowNorm::softmax, {}});
    const AttentionEval b = attend<T>(run, impl.attention, RowSpec{{z}, {v}, visible, RowNorm::softmax1, {s}});
    const mp50 pn = b.val.p_null(0, 0, 0), lse1 = b.val.lse(0, 0, 0), lse_keys = a.val.lse(0, 0, 0);
    const double b_pn = b.bound.p_null(0, 0, 0);
    const mp50 s_mp(s);

    // sum_j p_j + p_null = 1
    mp50 mass = pn;
    double b_mass = b_pn;
    for (index_t j = 0; j < visible; ++j) { mass += b.val.probs(0, 0, 0, j); b_mass += b.bound.probs(0, 0, 0, j); }
    run.identity("sum_j p_j + p_null = 1", to_double(abs(mass - 1)), b_mass + kEvalAllowance);
    // masked keys carry exactly zero probability in both normalisers
    for (index_t j = visible; j < m; ++j)
      if (b.val.probs(0, 0, 0, j) != 0 || a.val.probs(0, 0, 0, j) != 0) run.fail("masking", "masked key ", j, " has p != 0");

    if (visible == 0) {  // fully masked: p_null = 1, LSE1 = s, output 0 (exact in every T)
      run.identity("fully masked row: p_null = 1", to_double(abs(pn - 1)), 0.0);
      run.identity("fully masked row: LSE1 = s", to_double(abs(lse1 - s_mp)), 0.0);
      for (index_t c = 0; c < dv; ++c) run.identity("fully masked row: A~ = 0", to_double(abs(b.val.out(0, 0, 0, c))), 0.0);
      continue;
    }
    // p_j = (1 - p_null) q_j, and ratio preservation p_j q_k = p_k q_j for the extreme pair
    index_t jmax = 0, jmin = 0;
    for (index_t j = 0; j < visible; ++j) {
      const mp50 q = a.val.probs(0, 0, 0, j), p = b.val.probs(0, 0, 0, j);
      const double allowed = b.bound.probs(0, 0, 0, j) + to_double(q) * b_pn + to_double(1 - pn) * a.bound.probs(0, 0, 0, j);
      run.identity("p_j = (1 - p_null) q_j", to_double(abs(p - (1 - pn) * q)), allowed + kEvalAllowance);
      if (q > a.val.probs(0, 0, 0, jmax)) jmax = j;
      if (q < a.val.probs(0, 0, 0, jmin)) jmin = j;
    }
    {
      const mp50 pj = b.val.probs(0, 0, 0, jmax), pk = b.val.probs(0, 0, 0, jmin);
      const mp50 qj = a.val.probs(0, 0, 0, jmax), qk = a.val.probs(0, 0, 0, jmin);
      // relative residual of p_j q_k = p_k q_j
      const mp50 scale = pj * qk + pk * qj;
      const double rel = to_double(pj) > 0 && to_double(qk) > 0 && to_double(pk) > 0 && to_double(qj) > 0
                             ? b.bound.probs(0, 0, 0, jmax) / to_double(pj) + a.bound.probs(0, 0, 0, jmin) / to_double(qk) +
                                   b.bound.probs(0, 0, 0, jmin) / to_double(pk) + a.bound.probs(0, 0, 0, jmax) / to_double(qj)
                             : 0.0;
      if (scale > 0 && rel < 1) run.identity("p_j / p_k = q_j / q_k", to_double(abs(pj * qk - pk * qj) / scale), rel + kEvalAllowance);
    }
    // p_null = sigmoid(s - LSE_keys), LSE1 = logaddexp(s, LSE_keys)
    const mp50 sig = sigmoid(s_mp - lse_keys);
    run.identity("p_null = sigmoid(s - LSE_keys)", to_double(abs(pn - sig)),
                 b_pn + to_double(sig * (1 - sig)) * a.bound.lse(0, 0, 0) + kEvalAllowance);
    const mp50 lae = logaddexp(s_mp, lse_keys);
    run.identity("LSE1 = logaddexp(s, LSE_keys)", to_double(abs(lse1 - lae)),
                 b.bound.lse(0, 0, 0) + to_double(1 - sig) * a.bound.lse(0, 0, 0) + kEvalAllowance * (1 + to_double(abs(lae))));
    // A~ = (1 - p_null) A
    for (index_t c = 0; c < dv; ++c) {
      const mp50 A = a.val.out(0, 0, 0, c), At = b.val.out(0, 0, 0, c);
      const double allowed = b.bound.out(0, 0, 0, c) + to_double(abs(A)) * b_pn + to_double(1 - pn) * a.bound.out(0, 0, 0, c);
      run.identity("A~ = (1 - p_null) A", to_double(abs(At - (1 - pn) * A)), allowed + kEvalAllowance);
    }
    if (kind == 7) {
      // limit: 1 - p_null = sum_j e^{z_j - s} / (e^0 + ...) <= m e^{max z - s}; plain softmax uniform.
      const mp50 tail = mp50(visible) * exp(mp50(z[0]) - s_mp);
      run.margin("all z -> -inf: 1 - p_null <= m e^{z - s}", to_double(tail - (1 - pn)), b_pn + kEvalAllowance);
      for (index_t j = 0; j < visible; ++j)
        run.identity("all z -> -inf: softmax stays uniform", to_double(abs(a.val.probs(0, 0, 0, j) - mp50(1) / mp50(visible))),
                     a.bound.probs(0, 0, 0, j) + kEvalAllowance);
    }
  }
}

// ---- the library and the mutants -----------------------------------------------------------------

template <class T> Implementation<T> library_implementation(ScalarTag<T>, Backend b) { return {library_attention<T>(b)}; }

/// Null logit left out of the LSE: p = softmax(z) and p_null = exp(s - LSE_keys).
template <class T> Implementation<T> null_logit_left_out_of_lse(ScalarTag<T>) {
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
template <class T> Implementation<T> null_logit_ignored(ScalarTag<T>) {
  return {[](const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionOptions& o) {
    AttentionOptions o1 = o;
    o1.null_logits.clear();
    return token_attention<T>(q, k, v, o1);
  }};
}

/// The output is mixed with the softmax weights (not attenuated) while p and p_null are right.
template <class T> Implementation<T> output_not_attenuated(ScalarTag<T>) {
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
  return define_check(
             kId, kPaperRef,
             "p_j = (1 - p_null) q_j, ratios kept, p_null = sigmoid(s - LSE_keys), LSE1 = logaddexp(s, LSE_keys), "
             "A~ = (1 - p_null) A; masked row and -inf limit",
             BackendCoverage::every_available,
             [](const auto& impl, const CheckConfig& cfg, CheckRun& run) { check_statement(impl, cfg, run); },
             [](auto scalar, Backend b) { return library_implementation(scalar, b); })
      .mutant("null_logit_left_out_of_lse", "p = softmax(z), p_null = exp(s - LSE_keys)",
              [](auto scalar) { return null_logit_left_out_of_lse(scalar); })
      .mutant("sink_logit_ignored", "null logit s treated as 0 (Softmax1 always)",
              [](auto scalar) { return null_logit_ignored(scalar); })
      .mutant("output_not_attenuated", "A~ mixed with the softmax weights",
              [](auto scalar) { return output_not_attenuated(scalar); })
      .check();
}

}  // namespace oasis::checks
