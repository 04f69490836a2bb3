// proofs_checks/theorem_5_2.cpp — Theorem 5.2 (Softmax1 null bounds, App. C.5).
//
// Token level, Softmax1 rows with null logit s, ||v_j|| <= V_max:
//   ||A~|| <= V_max (1 - p_null),  p_null = e^s / (e^s + sum_k e^{z_k})  (its definition);
//   feasibility: p_null >= 1 - delta / V_max implies ||A~|| <= delta.
// Depth level, depth Softmax1, ||s_i|| <= B_max, u_i = s_i - h_ref, ||u_i|| <= U_max:
//   ||h~|| <= B_max (1 - alpha_null),  ||sum_i alpha_i u_i|| <= U_max (1 - alpha_null),
//   alpha_null = 1 / (1 + sum_r e^{g_r});  feasibility: alpha_null >= 1 - delta / B_max => ||h~|| <= delta.
// Equality: every value (every source) is the same vector, and delta at its threshold.
#include "statements.hpp"
#include "support.hpp"

namespace oasis::checks {
namespace {
using namespace detail;

const char* const kId = "theorem_5_2";
const char* const kPaperRef = "Theorem 5.2 (§5, App. C.5)";

template <class T> struct Implementation {
  AttentionFn<T> attention;
  RouteFn<T> route;
  /// Factor applied to the statement's bound (1 = the paper's). Only the teeth tests change it, to
  /// show that the equality case exposes a bound that is off by a constant.
  double loosen = 1.0;
};

/// Logits whose null probability (null logit s) is `target` exactly in real arithmetic.
inline std::vector<double> logits_for_null(Rng& rng, int m, double s, double target) {
  std::vector<double> w(static_cast<std::size_t>(m));
  double sw = 0;
  for (double& x : w) { x = rng.uniform(0.05, 1.0); sw += x; }
  std::vector<double> z(static_cast<std::size_t>(m));
  for (int j = 0; j < m; ++j)
    z[static_cast<std::size_t>(j)] = s + std::log((1.0 - target) / target) + std::log(w[static_cast<std::size_t>(j)] / sw);
  return z;
}

template <class T> void check_statement(const Implementation<T>& impl, const CheckConfig& cfg, CheckRun& run) {
  using std::abs; using std::exp;
  Rng rng(seed_for(cfg, kId));
  const int count = instances_for<T>(cfg);
  for (int it = 0; it < count; ++it) {
    const bool tight = it % 4 == 3;
    const bool feasibility = it % 2 == 1;  // logits built to meet the threshold
    run.begin_instance(it, tight, feasibility ? "feasibility threshold" : "bound");
    // ---- token level ----
    {
      const int m = rng.integer(1, 10), dv = rng.integer(1, 5);
      const double s = rounded<T>(rng.normal(2.0));
      std::vector<std::vector<double>> v(static_cast<std::size_t>(m), std::vector<double>(static_cast<std::size_t>(dv)));
      for (auto& row : v) for (double& x : row) x = rounded<T>(rng.normal(1.0));
      if (tight) for (auto& row : v) row = v[0];
      double vmax = 0;
      for (const auto& row : v) vmax = std::max(vmax, norm_of(row));
      const double delta = vmax * rng.uniform(0.01, 1.0);
      std::vector<double> z;
      if (feasibility) {
        // p_null = 1 - delta/V_max (equality case) or above it
        const double target = 1.0 - (delta / vmax) * (tight ? 1.0 : rng.uniform(0.0, 1.0));
        z = logits_for_null(rng, m, s, std::min(target, 1.0 - 1e-12));
      } else {
        const double shift = rng.uniform(-10.0, 6.0);
        for (int j = 0; j < m; ++j) z.push_back(rng.normal(2.0) + shift);
      }
      for (double& x : z) x = rounded<T>(x);
      const AttentionEval a = attend<T>(run, impl.attention, RowSpec{{z}, {v}, -1, RowNorm::softmax1, {s}});
      mp50 se(1);
      for (double x : z) se += exp(mp50(x) - mp50(s));
      const mp50 pn = mp50(1) / se;  // definition of p_null on the rounded logits
      run.identity("p_null = e^s / (e^s + sum e^z)", to_double(abs(a.val.p_null(0, 0, 0) - pn)), a.bound.p_null(0, 0, 0) + kEvalAllowance);
      mp50 V(0);
      for (const auto& row : v) V = std::max(V, norm_of(std::vector<mp50>(row.begin(), row.end())));
      const mp50 An = norm_of(last_axis(a.val.out, 0, dv));
      const double bA = norm_of(last_axis(a.bound.out, 0, dv)) / to_double(V) + kEvalAllowance;
      if (tight) run.tight_margin("||A~|| <= V_max (1 - p_null)", to_double((mp50(impl.loosen) * V * (1 - pn) - An) / V), bA);
      else run.margin("||A~|| <= V_max (1 - p_null)", to_double((mp50(impl.loosen) * V * (1 - pn) - An) / V), bA);
      if (feasibility) {
        // the threshold as constructed: delta' = V_max (1 - p_null) <= delta (equal when tight)
        const mp50 d = mp50(impl.loosen) * (tight ? V * (1 - pn) : mp50(delta));
        if (!(pn >= 1 - d / V * (1 + 1e-9))) run.fail("construction", "p_null below the threshold 1 - delta/V_max");
        if (tight) run.tight_margin("p_null >= 1 - delta/V_max => ||A~|| <= delta", to_double((d - An) / V), bA);
        else run.margin("p_null >= 1 - delta/V_max => ||A~|| <= delta", to_double((d - An) / V), bA);
      }
    }
    // ---- depth level ----
    {
      const int n = rng.integer(1, 8), d = rng.integer(1, 5);
      RouteSpec spec;
      spec.n = n;
      spec.d = d;
      std::vector<double> first(static_cast<std::size_t>(d));
      for (double& x : first) x = rounded<T>(rng.normal(1.0));
      for (int i = 0; i < n; ++i)
        for (int c = 0; c < d; ++c) spec.sources.push_back(tight ? first[static_cast<std::size_t>(c)] : rounded<T>(rng.normal(1.0)));
      std::vector<double> href(static_cast<std::size_t>(d));
      for (double& x : href) x = rounded<T>(rng.normal(1.0));
      double bmax = 0;
      for (int i = 0; i < n; ++i)
        bmax = std::max(bmax, norm_of(std::vector<double>(spec.sources.begin() + i * d, spec.sources.begin() + (i + 1) * d)));
      const double delta = bmax * rng.uniform(0.01, 1.0);
      if (feasibility) {
        const double target = 1.0 - (delta / bmax) * (tight ? 1.0 : rng.uniform(0.0, 1.0));
        spec.g_old = logits_for_null(rng, n, 0.0, std::min(target, 1.0 - 1e-12));
      } else {
        const double shift = rng.uniform(-8.0, 6.0);
        for (int i = 0; i < n; ++i) spec.g_old.push_back(rng.normal(2.0) + shift);
      }
      for (double& x : spec.g_old) x = rounded<T>(x);
      spec.psi.assign(static_cast<std::size_t>(n), 0.0);
      spec.kinds.assign(static_cast<std::size_t>(n), SourceKind::attention);
      spec.kinds[0] = SourceKind::initial;
      spec.opt.normalizer = RowNorm::softmax1;
      spec.opt.coupling = false;
      const RouteEval e = route<T>(run, impl.route, spec);
      mp50 se(1);
      for (double g : spec.g_old) se += exp(mp50(g));
      const mp50 an = mp50(1) / se;
      run.identity("alpha_null = 1 / (1 + sum e^g)", to_double(abs(e.val.alpha_null[0] - an)), e.bound.alpha_null[0] + kEvalAllowance);
      mp50 B(0), U(0);
      std::vector<mp50> sum_u(static_cast<std::size_t>(d), mp50(0));
      for (int i = 0; i < n; ++i) {
        std::vector<mp50> si(static_cast<std::size_t>(d)), ui(static_cast<std::size_t>(d));
        for (int c = 0; c < d; ++c) {
          si[static_cast<std::size_t>(c)] = mp50(spec.sources[static_cast<std::size_t>(i * d + c)]);
          ui[static_cast<std::size_t>(c)] = si[static_cast<std::size_t>(c)] - mp50(href[static_cast<std::size_t>(c)]);
        }
        B = std::max(B, norm_of(si));
        U = std::max(U, norm_of(ui));
      }
      std::vector<mp50> h = last_axis(e.val.h, 0, d), hu(static_cast<std::size_t>(d));
      for (int c = 0; c < d; ++c) hu[static_cast<std::size_t>(c)] = h[static_cast<std::size_t>(c)] - (1 - an) * mp50(href[static_cast<std::size_t>(c)]);
      const mp50 hn = norm_of(h), hun = norm_of(hu);
      const double bh = norm_of(last_axis(e.bound.h, 0, d));
      double b_alpha = 0;
      for (int i = 0; i < n; ++i) b_alpha += e.bound.alpha(i, 0);
      const double allowB = bh / to_double(B) + kEvalAllowance;
      const double allowU = (bh + b_alpha * norm_of(href)) / to_double(U) + kEvalAllowance;
      if (tight) {
        run.tight_margin("||h~|| <= B_max (1 - alpha_null)", to_double((mp50(impl.loosen) * B * (1 - an) - hn) / B), allowB);
        run.tight_margin("||sum alpha_i u_i|| <= U_max (1 - alpha_null)", to_double((mp50(impl.loosen) * U * (1 - an) - hun) / U), allowU);
      } else {
        run.margin("||h~|| <= B_max (1 - alpha_null)", to_double((mp50(impl.loosen) * B * (1 - an) - hn) / B), allowB);
        run.margin("||sum alpha_i u_i|| <= U_max (1 - alpha_null)", to_double((mp50(impl.loosen) * U * (1 - an) - hun) / U), allowU);
      }
      if (feasibility) {
        const mp50 dd = mp50(impl.loosen) * (tight ? B * (1 - an) : mp50(delta));
        if (!(an >= 1 - dd / B * (1 + 1e-9))) run.fail("construction", "alpha_null below the threshold 1 - delta/B_max");
        if (tight) run.tight_margin("alpha_null >= 1 - delta/B_max => ||h~|| <= delta", to_double((dd - hn) / B), allowB);
        else run.margin("alpha_null >= 1 - delta/B_max => ||h~|| <= delta", to_double((dd - hn) / B), allowB);
      }
    }
  }
}

// ---- the library and the mutants -----------------------------------------------------------------

template <class T> Implementation<T> library_implementation(ScalarTag<T>, Backend b) {
  return {library_attention<T>(b), library_route<T>(b)};
}

/// Token rows normalised with plain softmax where Softmax1 is configured.
template <class T> Implementation<T> token_softmax_instead_of_softmax1(ScalarTag<T>) {
  return {attention_with_normalizer<T>(RowNorm::softmax), library_route<T>()};
}

template <class T> Implementation<T> depth_null_as_identity(ScalarTag<T>) {
  return {library_attention<T>(), route_with_null_as_identity<T>()};
}

}  // namespace

Check make_theorem_5_2() {
  return define_check(
             kId, kPaperRef,
             "||A~|| <= V_max (1 - p_null), ||h~|| <= B_max (1 - alpha_null), ||sum alpha_i u_i|| <= U_max (1 - alpha_null); "
             "p_null >= 1 - delta/V_max => ||A~|| <= delta (and the depth analogue)",
             BackendCoverage::every_available,
             [](const auto& impl, const CheckConfig& cfg, CheckRun& run) { check_statement(impl, cfg, run); },
             [](auto scalar, Backend b) { return library_implementation(scalar, b); })
      .mutant("token_softmax_instead_of_softmax1", "token rows without the null category",
              [](auto scalar) { return token_softmax_instead_of_softmax1(scalar); })
      .mutant("depth_null_as_identity", "h = sum alpha_i s_i + alpha_null s_{n-1}",
              [](auto scalar) { return depth_null_as_identity(scalar); })
      .loosened_bound(1.1, "bounds 1.1 V_max (1 - p_null), 1.1 B_max (1 - alpha_null), 1.1 delta: the equality case "
                           "must expose them")
      .check();
}

}  // namespace oasis::checks
