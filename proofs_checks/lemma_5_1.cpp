// proofs_checks/lemma_5_1.cpp — Lemma 5.1 (no-op outliers are structurally induced, App. C.1)
// and the separation counterexample.
//
// Statement: plain softmax attention A = sum_j p_j v_j; a token o and a unit u with
// ||v_o|| <= c0 and <v_j, u> >= c1 > c0 for every j != o; if ||A|| <= delta < c1 then
//     p_o >= (c1 - delta) / (c0 + c1).
// Equality: v_j = c1 u (j != o), v_o = -c0 u and p_o <= c1 / (c0 + c1), where
// ||A|| = c1 - (c0 + c1) p_o exactly.
// Counterexample (separation is essential): values u and -u with equal logits give A = 0 with
// p = (1/2, 1/2): a no-op without any sink, and the separation assumption fails.
#include "statements.hpp"
#include "support.hpp"

namespace oasis::checks {
namespace {
using namespace detail;

const char* const kId = "lemma_5_1";
const char* const kPaperRef = "Lemma 5.1 (§5, App. C.1, Assumptions D.1, D.3)";

template <class T> struct Implementation {
  AttentionFn<T> attention;  ///< token attention; the lemma is about plain softmax rows
  /// Factor applied to the statement's bound (1 = the paper's). Only the teeth tests change it, to
  /// show that the equality case exposes a bound that is off by a constant.
  double loosen = 1.0;
};

/// One instance: logits z, values v (rounded to T), no-op token o, direction u (double).
struct Instance {
  std::vector<double> z;
  std::vector<std::vector<double>> v;
  int o = 0;
  std::vector<double> u;
  double pmax_guarantee = 0;  ///< p_o c0 + (1 - p_o) V_max of the construction (< c1)
};

template <class T> Instance random_instance(Rng& rng, bool tight) {
  Instance in;
  const int m = rng.integer(2, 10), dv = rng.integer(1, 6);
  in.o = rng.integer(0, m - 1);
  in.v.assign(static_cast<std::size_t>(m), std::vector<double>(static_cast<std::size_t>(dv), 0.0));
  double c0, c1, p_o;
  if (tight) {
    // Axis-aligned, dyadic: exactly collinear and exactly representable in every T.
    const int axis = rng.integer(0, dv - 1);
    c1 = rng.integer(8, 48) / 16.0;
    c0 = c1 * rng.integer(0, 15) / 16.0;
    in.u.assign(static_cast<std::size_t>(dv), 0.0);
    in.u[static_cast<std::size_t>(axis)] = 1.0;
    for (int j = 0; j < m; ++j) in.v[static_cast<std::size_t>(j)][static_cast<std::size_t>(axis)] = j == in.o ? -c0 : c1;
    p_o = rng.uniform(0.05, 0.98) * c1 / (c0 + c1);  // keeps ||A|| = c1 - (c0 + c1) p_o >= 0
    in.pmax_guarantee = c1 - (c0 + c1) * p_o;
  } else {
    in.u = rng.unit(dv);
    c1 = rng.uniform(0.5, 3.0);
    c0 = c1 * rng.uniform(0.0, 0.9);
    double vmax = 0;
    for (int j = 0; j < m; ++j) {
      auto& vj = in.v[static_cast<std::size_t>(j)];
      if (j == in.o) {  // ||v_o|| <= c0
        const auto dir = rng.unit(dv);
        const double r = c0 * rng.uniform(0.0, 0.999);
        for (int e = 0; e < dv; ++e) vj[static_cast<std::size_t>(e)] = rounded<T>(r * dir[static_cast<std::size_t>(e)]);
      } else {  // <v_j, u> = a >= c1 plus a component orthogonal to u
        const double a = c1 * 1.001 + rng.uniform(0.0, 2.0);
        auto w = rng.unit(dv);
        double wu = 0;
        for (int e = 0; e < dv; ++e) wu += w[static_cast<std::size_t>(e)] * in.u[static_cast<std::size_t>(e)];
        const double wscale = dv > 1 ? rng.uniform(0.0, 2.0) : 0.0;
        for (int e = 0; e < dv; ++e)
          vj[static_cast<std::size_t>(e)] = rounded<T>(a * in.u[static_cast<std::size_t>(e)] +
                                                  wscale * (w[static_cast<std::size_t>(e)] - wu * in.u[static_cast<std::size_t>(e)]));
      }
      vmax = std::max(vmax, norm_of(vj));
    }
    // ||A|| <= p_o c0 + (1 - p_o) V_max < c1 needs p_o > (V_max - c1) / (V_max - c0).
    const double pmin = vmax > c1 ? (vmax - c1) / (vmax - c0) : 0.0;
    p_o = pmin + (1.0 - pmin) * rng.uniform(0.05, 0.95);
    in.pmax_guarantee = p_o * c0 + (1.0 - p_o) * vmax;
  }
  // Logits: others random, z_o placed so that softmax gives p_o; a common shift (softmax is
  // shift invariant) moves the row far from 0 in either direction.
  in.z.assign(static_cast<std::size_t>(m), 0.0);
  double mx = -1e300;
  for (int j = 0; j < m; ++j)
    if (j != in.o) { in.z[static_cast<std::size_t>(j)] = rng.normal(2.0); mx = std::max(mx, in.z[static_cast<std::size_t>(j)]); }
  double se = 0;
  for (int j = 0; j < m; ++j) if (j != in.o) se += std::exp(in.z[static_cast<std::size_t>(j)] - mx);
  in.z[static_cast<std::size_t>(in.o)] = std::log(p_o / (1.0 - p_o)) + mx + std::log(se);
  const double shift = rng.uniform(-30.0, 10.0);
  for (double& x : in.z) x = rounded<T>(x + shift);
  return in;
}

template <class T> void check_statement(const Implementation<T>& impl, const CheckConfig& cfg, CheckRun& run) {
  Rng rng(seed_for(cfg, kId));
  const int n = instances_for<T>(cfg);
  for (int it = 0; it < n; ++it) {
    const bool tight = it % 4 == 3;  // every fourth instance is an equality case
    const Instance in = random_instance<T>(rng, tight);
    run.begin_instance(it, tight);
    RowSpec spec{{in.z}, {in.v}, -1, RowNorm::softmax, {}};
    const AttentionEval e = attend<T>(run, impl.attention, spec);
    const index_t m = static_cast<index_t>(in.z.size()), dv = static_cast<index_t>(in.u.size());
    // Assumptions, evaluated in mp50 on the rounded instance: the tightest admissible c0, c1.
    std::vector<mp50> u(in.u.begin(), in.u.end());
    const mp50 un = norm_of(u);
    for (mp50& x : u) x /= un;
    const mp50 c0 = norm_of(std::vector<mp50>(in.v[static_cast<std::size_t>(in.o)].begin(), in.v[static_cast<std::size_t>(in.o)].end()));
    mp50 c1 = pos_inf<mp50>();
    for (index_t j = 0; j < m; ++j) {
      if (j == in.o) continue;
      mp50 dot(0);
      for (index_t c = 0; c < dv; ++c) dot += mp50(in.v[static_cast<std::size_t>(j)][static_cast<std::size_t>(c)]) * u[static_cast<std::size_t>(c)];
      c1 = std::min(c1, dot);
    }
    if (!(c0 < c1)) { run.fail("construction", "separation c0 = ", to_double(c0), " < c1 = ", to_double(c1), " does not hold"); continue; }
    const mp50 delta = norm_of(last_axis(e.val.out, 0, dv));  // the smallest admissible delta
    const double delta_err = norm_of(last_axis(e.bound.out, 0, dv));
    // The construction guarantees ||A|| <= p_o c0 + (1 - p_o) V_max < c1 for softmax rows.
    // (1e-3 (c0 + c1) absorbs the rounding of the logits, which moves p_o slightly.)
    if (!(to_double(delta) <= in.pmax_guarantee + 1e-3 * to_double(c0 + c1) + delta_err) || !(delta < c1)) {
      run.fail("no-op target", "||A|| = ", to_double(delta), " exceeds the construction's guarantee ", in.pmax_guarantee,
               " (c1 = ", to_double(c1), ")");
      continue;
    }
    const mp50 p_o = e.val.probs(0, 0, 0, in.o);
    const mp50 rhs = impl.loosen * (c1 - delta) / (c0 + c1);
    const double allowed = e.bound.probs(0, 0, 0, in.o) + delta_err / to_double(c0 + c1) + kEvalAllowance;
    if (tight) run.tight_margin("p_o >= (c1 - delta)/(c0 + c1)", to_double(p_o - rhs), allowed);
    else run.margin("p_o >= (c1 - delta)/(c0 + c1)", to_double(p_o - rhs), allowed);
  }
  // Counterexample: v = (u, -u), equal logits. A = 0 with p = (1/2, 1/2) and no sink; the
  // separation assumption fails for either choice of o (<v_other, u> = -1 < 1 = ||v_o||).
  for (int it = 0; it < 8; ++it) {
    run.begin_instance(n + it, false, "counterexample u, -u");
    const int dv = rng.integer(1, 6);
    const auto uu = rng.unit(dv);
    std::vector<double> up(uu.size()), um(uu.size());
    for (std::size_t c = 0; c < uu.size(); ++c) { up[c] = rounded<T>(uu[c]); um[c] = -up[c]; }
    const double zc = rounded<T>(rng.uniform(-20.0, 20.0));
    RowSpec spec{{{zc, zc}}, {{up, um}}, -1, RowNorm::softmax, {}};
    const AttentionEval e = attend<T>(run, impl.attention, spec);
    const mp50 a = norm_of(last_axis(e.val.out, 0, dv));
    run.identity("||A|| = 0 for values (u, -u)", to_double(a), norm_of(last_axis(e.bound.out, 0, dv)) + kEvalAllowance);
    for (index_t j = 0; j < 2; ++j)
      run.identity("p_j = 1/2 (no sink)", to_double(abs(e.val.probs(0, 0, 0, j) - mp50(0.5))), e.bound.probs(0, 0, 0, j) + kEvalAllowance);
    // The assumption check itself: with u_hat = u/||u||, <v_2, u_hat> = -||u|| < ||v_1|| = ||u||.
    const mp50 nu = norm_of(std::vector<mp50>(up.begin(), up.end()));
    mp50 dot(0);
    for (std::size_t c = 0; c < up.size(); ++c) dot += mp50(um[c]) * mp50(up[c]) / nu;
    if (!(dot < nu)) run.fail("counterexample", "separation unexpectedly holds");
  }
}

// ---- the library and the mutants -----------------------------------------------------------------

template <class T> Implementation<T> library_implementation(ScalarTag<T>, Backend b) { return {library_attention<T>(b)}; }

template <class T> Implementation<T> softmax1_instead_of_softmax(ScalarTag<T>) {
  return {attention_with_normalizer<T>(RowNorm::softmax1)};
}

/// Off-by-one value loop: the output misses key 0's contribution (probabilities are right).
template <class T> Implementation<T> output_skips_first_key(ScalarTag<T>) {
  return {[](const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionOptions& o) {
    AttentionOptions o1 = o;
    o1.return_probs = true;
    AttentionResult<T> r = token_attention<T>(q, k, v, o1);
    for (index_t b = 0; b < r.out.dim(0); ++b)
      for (index_t h = 0; h < r.out.dim(1); ++h)
        for (index_t t = 0; t < r.out.dim(2); ++t)
          for (index_t c = 0; c < r.out.dim(3); ++c)
            r.out(b, h, t, c) -= r.probs(b, h, t, 0) * v(b, h / (q.dim(1) / k.dim(1)), 0, c);
    return r;
  }};
}

}  // namespace

Check make_lemma_5_1() {
  return define_check(
             kId, kPaperRef,
             "softmax rows with ||v_o|| <= c0 < c1 <= <v_j,u> and ||A|| <= delta < c1 give p_o >= (c1-delta)/(c0+c1); "
             "values (u,-u) reach A = 0 with p = 1/2 (separation is essential)",
             BackendCoverage::every_available,
             [](const auto& impl, const CheckConfig& cfg, CheckRun& run) { check_statement(impl, cfg, run); },
             [](auto scalar, Backend b) { return library_implementation(scalar, b); })
      .mutant("softmax1_instead_of_softmax", "token rows normalised with a null category (mass leaks to null)",
              [](auto scalar) { return softmax1_instead_of_softmax(scalar); })
      .mutant("output_skips_first_key", "off-by-one value loop: A misses p_0 v_0",
              [](auto scalar) { return output_skips_first_key(scalar); })
      .loosened_bound(0.9, "lower bound 0.9 (c1 - delta)/(c0 + c1): the equality case must expose it")
      .check();
}

}  // namespace oasis::checks
