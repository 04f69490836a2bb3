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
const char* const kRef = "Theorem 5.2 (§5, App. C.5)";

template <class T> struct Impl {
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

template <class T> void body(const Impl<T>& impl, const CheckConfig& cfg, Tally& t) {
  using std::abs; using std::exp;
  Rng rng(seed_for(cfg, kId));
  const int count = instances_for<T>(cfg);
  for (int it = 0; it < count; ++it) {
    const bool tight = it % 4 == 3;
    const bool feasibility = it % 2 == 1;  // logits built to meet the threshold
    t.begin(it, tight, feasibility ? "feasibility threshold" : "bound");
    // ---- token level ----
    {
      const int m = rng.integer(1, 10), dv = rng.integer(1, 5);
      const double s = rd<T>(rng.normal(2.0));
      std::vector<std::vector<double>> v(static_cast<std::size_t>(m), std::vector<double>(static_cast<std::size_t>(dv)));
      for (auto& row : v) for (double& x : row) x = rd<T>(rng.normal(1.0));
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
      for (double& x : z) x = rd<T>(x);
      const AttentionEval a = attend<T>(t, impl.attention, RowSpec{{z}, {v}, -1, RowNorm::softmax1, {s}});
      R se(1);
      for (double x : z) se += exp(R(x) - R(s));
      const R pn = R(1) / se;  // definition of p_null on the rounded logits
      t.identity("p_null = e^s / (e^s + sum e^z)", dbl(abs(a.val.p_null(0, 0, 0) - pn)), a.bound.p_null(0, 0, 0) + kEvalAllowance);
      R V(0);
      for (const auto& row : v) V = std::max(V, norm_of(std::vector<R>(row.begin(), row.end())));
      const R An = norm_of(last_axis(a.val.out, 0, dv));
      const double bA = norm_of(last_axis(a.bound.out, 0, dv)) / dbl(V) + kEvalAllowance;
      if (tight) t.tight_margin("||A~|| <= V_max (1 - p_null)", dbl((R(impl.loosen) * V * (1 - pn) - An) / V), bA);
      else t.margin("||A~|| <= V_max (1 - p_null)", dbl((R(impl.loosen) * V * (1 - pn) - An) / V), bA);
      if (feasibility) {
        // the threshold as constructed: delta' = V_max (1 - p_null) <= delta (equal when tight)
        const R d = R(impl.loosen) * (tight ? V * (1 - pn) : R(delta));
        if (!(pn >= 1 - d / V * (1 + 1e-9))) t.fail("construction", "p_null below the threshold 1 - delta/V_max");
        if (tight) t.tight_margin("p_null >= 1 - delta/V_max => ||A~|| <= delta", dbl((d - An) / V), bA);
        else t.margin("p_null >= 1 - delta/V_max => ||A~|| <= delta", dbl((d - An) / V), bA);
      }
    }
    // ---- depth level ----
    {
      const int n = rng.integer(1, 8), d = rng.integer(1, 5);
      RouteSpec spec;
      spec.n = n;
      spec.d = d;
      std::vector<double> first(static_cast<std::size_t>(d));
      for (double& x : first) x = rd<T>(rng.normal(1.0));
      for (int i = 0; i < n; ++i)
        for (int c = 0; c < d; ++c) spec.sources.push_back(tight ? first[static_cast<std::size_t>(c)] : rd<T>(rng.normal(1.0)));
      std::vector<double> href(static_cast<std::size_t>(d));
      for (double& x : href) x = rd<T>(rng.normal(1.0));
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
      for (double& x : spec.g_old) x = rd<T>(x);
      spec.psi.assign(static_cast<std::size_t>(n), 0.0);
      spec.kinds.assign(static_cast<std::size_t>(n), SourceKind::attention);
      spec.kinds[0] = SourceKind::initial;
      spec.opt.normalizer = RowNorm::softmax1;
      spec.opt.coupling = false;
      const RouteEval e = route<T>(t, impl.route, spec);
      R se(1);
      for (double g : spec.g_old) se += exp(R(g));
      const R an = R(1) / se;
      t.identity("alpha_null = 1 / (1 + sum e^g)", dbl(abs(e.val.alpha_null[0] - an)), e.bound.alpha_null[0] + kEvalAllowance);
      R B(0), U(0);
      std::vector<R> sum_u(static_cast<std::size_t>(d), R(0));
      for (int i = 0; i < n; ++i) {
        std::vector<R> si(static_cast<std::size_t>(d)), ui(static_cast<std::size_t>(d));
        for (int c = 0; c < d; ++c) {
          si[static_cast<std::size_t>(c)] = R(spec.sources[static_cast<std::size_t>(i * d + c)]);
          ui[static_cast<std::size_t>(c)] = si[static_cast<std::size_t>(c)] - R(href[static_cast<std::size_t>(c)]);
        }
        B = std::max(B, norm_of(si));
        U = std::max(U, norm_of(ui));
      }
      std::vector<R> h = last_axis(e.val.h, 0, d), hu(static_cast<std::size_t>(d));
      for (int c = 0; c < d; ++c) hu[static_cast<std::size_t>(c)] = h[static_cast<std::size_t>(c)] - (1 - an) * R(href[static_cast<std::size_t>(c)]);
      const R hn = norm_of(h), hun = norm_of(hu);
      const double bh = norm_of(last_axis(e.bound.h, 0, d));
      double b_alpha = 0;
      for (int i = 0; i < n; ++i) b_alpha += e.bound.alpha(i, 0);
      const double allowB = bh / dbl(B) + kEvalAllowance;
      const double allowU = (bh + b_alpha * norm_of(href)) / dbl(U) + kEvalAllowance;
      if (tight) {
        t.tight_margin("||h~|| <= B_max (1 - alpha_null)", dbl((R(impl.loosen) * B * (1 - an) - hn) / B), allowB);
        t.tight_margin("||sum alpha_i u_i|| <= U_max (1 - alpha_null)", dbl((R(impl.loosen) * U * (1 - an) - hun) / U), allowU);
      } else {
        t.margin("||h~|| <= B_max (1 - alpha_null)", dbl((R(impl.loosen) * B * (1 - an) - hn) / B), allowB);
        t.margin("||sum alpha_i u_i|| <= U_max (1 - alpha_null)", dbl((R(impl.loosen) * U * (1 - an) - hun) / U), allowU);
      }
      if (feasibility) {
        const R dd = R(impl.loosen) * (tight ? B * (1 - an) : R(delta));
        if (!(an >= 1 - dd / B * (1 + 1e-9))) t.fail("construction", "alpha_null below the threshold 1 - delta/B_max");
        if (tight) t.tight_margin("alpha_null >= 1 - delta/B_max => ||h~|| <= delta", dbl((dd - hn) / B), allowB);
        else t.margin("alpha_null >= 1 - delta/B_max => ||h~|| <= delta", dbl((dd - hn) / B), allowB);
      }
    }
  }
}

// ---- mutants -------------------------------------------------------------------------------------

/// Token rows normalised with plain softmax where Softmax1 is configured.
template <class T> Impl<T> token_softmax_instead_of_softmax1() {
  return {[](const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const AttentionOptions& o) {
            AttentionOptions o0 = o;
            o0.normalizer = RowNorm::softmax;
            o0.null_logits.clear();
            return token_attention<T>(q, k, v, o0);
          },
          library_route<T>()};
}

/// The depth null routes to the most recent source (an identity shortcut), not to the zero vector.
template <class T> Impl<T> depth_null_as_identity() {
  return {library_attention<T>(), [](const Tensor<T>& s, const Tensor<T>& g, const Tensor<T>& p,
                                     const std::vector<SourceKind>& k, const DepthOptions& o) {
            DepthRoute<T> r = attn_res_route<T>(s, g, p, k, o);
            const index_t n = s.dim(0);
            for (index_t t = 0; t < s.dim(1); ++t)
              for (index_t c = 0; c < s.dim(2); ++c) r.h(t, c) += r.alpha_null[t] * s(n - 1, t, c);
            return r;
          }};
}

}  // namespace

Check make_theorem_5_2() {
  Check c;
  c.id = kId;
  c.paper_ref = kRef;
  c.statement = "||A~|| <= V_max (1 - p_null), ||h~|| <= B_max (1 - alpha_null), ||sum alpha_i u_i|| <= U_max (1 - alpha_null); "
                "p_null >= 1 - delta/V_max => ||A~|| <= delta (and the depth analogue)";
  c.run = [](const CheckConfig& cfg) {
    return run_check(kId, kRef, cfg, true, [&](auto tag, Backend b, Tally& t) {
      using T = typename decltype(tag)::type;
      body<T>(Impl<T>{library_attention<T>(b), library_route<T>(b)}, cfg, t);
    });
  };
  c.mutants.push_back(mutant_of(kId, kRef, "token_softmax_instead_of_softmax1", "token rows without the null category",
                                [](auto tag, const CheckConfig& cfg, Tally& t) {
                                  using T = typename decltype(tag)::type;
                                  body<T>(token_softmax_instead_of_softmax1<T>(), cfg, t);
                                }));
  c.mutants.push_back(mutant_of(kId, kRef, "depth_null_as_identity", "h = sum alpha_i s_i + alpha_null s_{n-1}",
                                [](auto tag, const CheckConfig& cfg, Tally& t) {
                                  using T = typename decltype(tag)::type;
                                  body<T>(depth_null_as_identity<T>(), cfg, t);
                                }));
  c.mutants.push_back(mutant_of(kId, kRef, "bound_loosened_10_percent", "bounds 1.1 V_max (1 - p_null), 1.1 B_max (1 - alpha_null), 1.1 delta: the equality case must expose them",
                                [](auto tag, const CheckConfig& cfg, Tally& t) {
                                  using T = typename decltype(tag)::type;
                                  Impl<T> m{library_attention<T>(), library_route<T>()};
                                  m.loosen = 1.1;
                                  body<T>(m, cfg, t);
                                }));
  return c;
}

}  // namespace oasis::checks
