// proofs_checks/theorem_5_1.cpp — Theorem 5.1 (conditional depth collapse, App. C.3).
//
// Statement (softmax depth weights, sum_i alpha_i = 1): with u_i = s_i - h_ref, a branch i* with
// ||u_{i*}|| <= b0, a unit w with <u_i, w> >= b1 for i != i*, and ||sum_i alpha_i u_i|| <= delta_t < b1,
//     alpha_{i*} >= (b1 - delta_t) / (b0 + b1).
// With softmax weights h - h_ref = sum_i alpha_i u_i, so delta_t is read from the routed state h.
// Equality: u_i = b1 w (i != i*), u_{i*} = -b0 w, alpha_{i*} <= b1 / (b0 + b1).
#include "statements.hpp"
#include "support.hpp"

namespace oasis::checks {
namespace {
using namespace detail;

const char* const kId = "theorem_5_1";
const char* const kPaperRef = "Theorem 5.1 (§5, App. C.3)";

template <class T> struct Implementation {
  RouteFn<T> route;  ///< depth routing; the theorem is about softmax depth weights
  /// Factor applied to the statement's bound (1 = the paper's). Only the teeth tests change it, to
  /// show that the equality case exposes a bound that is off by a constant.
  double loosen = 1.0;
};

template <class T> void check_statement(const Implementation<T>& impl, const CheckConfig& cfg, CheckRun& run) {
  Rng rng(seed_for(cfg, kId));
  const int count = instances_for<T>(cfg);
  for (int it = 0; it < count; ++it) {
    const bool tight = it % 4 == 3;
    const int n = rng.integer(2, 8), d = rng.integer(1, 6), istar = rng.integer(0, n - 1);
    std::vector<double> href(static_cast<std::size_t>(d)), w(static_cast<std::size_t>(d), 0.0);
    std::vector<std::vector<double>> u(static_cast<std::size_t>(n), std::vector<double>(static_cast<std::size_t>(d), 0.0));
    double b0, b1, a_star, guarantee;
    if (tight) {  // axis-aligned dyadic values: exactly collinear in every T
      const int axis = rng.integer(0, d - 1);
      w[static_cast<std::size_t>(axis)] = 1.0;
      b1 = rng.integer(8, 48) / 16.0;
      b0 = b1 * rng.integer(0, 15) / 16.0;
      for (int i = 0; i < n; ++i) u[static_cast<std::size_t>(i)][static_cast<std::size_t>(axis)] = i == istar ? -b0 : b1;
      for (double& x : href) x = rng.integer(-32, 32) / 16.0;
      a_star = rng.uniform(0.05, 0.98) * b1 / (b0 + b1);
      guarantee = b1 - (b0 + b1) * a_star;
    } else {
      w = rng.unit(d);
      b1 = rng.uniform(0.5, 3.0);
      b0 = b1 * rng.uniform(0.0, 0.9);
      // a small reference state: ||h_ref|| <= 0.2 b1
      const auto dir = rng.unit(d);
      const double hr = 0.2 * b1 * rng.uniform(0.0, 1.0);
      for (int c = 0; c < d; ++c) href[static_cast<std::size_t>(c)] = hr * dir[static_cast<std::size_t>(c)];
      double umax = 0;
      for (int i = 0; i < n; ++i) {
        auto& ui = u[static_cast<std::size_t>(i)];
        if (i == istar) {
          const auto e = rng.unit(d);
          const double r = b0 * rng.uniform(0.0, 0.99);
          for (int c = 0; c < d; ++c) ui[static_cast<std::size_t>(c)] = r * e[static_cast<std::size_t>(c)];
        } else {
          const double a = b1 * 1.01 + rng.uniform(0.0, 2.0);
          auto o = rng.unit(d);
          double ow = 0;
          for (int c = 0; c < d; ++c) ow += o[static_cast<std::size_t>(c)] * w[static_cast<std::size_t>(c)];
          const double os = d > 1 ? rng.uniform(0.0, 2.0) : 0.0;
          for (int c = 0; c < d; ++c)
            ui[static_cast<std::size_t>(c)] = a * w[static_cast<std::size_t>(c)] + os * (o[static_cast<std::size_t>(c)] - ow * w[static_cast<std::size_t>(c)]);
        }
        umax = std::max(umax, norm_of(ui) * 1.01 + 0.01 * b1);  // room for rounding s_i to T
      }
      const double amin = umax > b1 ? (umax - b1) / (umax - b0) : 0.0;
      a_star = amin + (1.0 - amin) * rng.uniform(0.05, 0.95);
      guarantee = a_star * b0 * 1.01 + (1.0 - a_star) * umax;
    }
    for (double& x : href) x = rounded<T>(x);
    RouteSpec spec;
    spec.n = n;
    spec.d = d;
    spec.sources.resize(static_cast<std::size_t>(n * d));
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < d; ++c)
        spec.sources[static_cast<std::size_t>(i * d + c)] = rounded<T>(href[static_cast<std::size_t>(c)] + u[static_cast<std::size_t>(i)][static_cast<std::size_t>(c)]);
    // logits: the others random, g_{i*} placed for softmax weight a_star; common shift
    spec.g_old.assign(static_cast<std::size_t>(n), 0.0);
    double mx = -1e300, se = 0;
    for (int i = 0; i < n; ++i) if (i != istar) { spec.g_old[static_cast<std::size_t>(i)] = rng.normal(2.0); mx = std::max(mx, spec.g_old[static_cast<std::size_t>(i)]); }
    for (int i = 0; i < n; ++i) if (i != istar) se += std::exp(spec.g_old[static_cast<std::size_t>(i)] - mx);
    spec.g_old[static_cast<std::size_t>(istar)] = std::log(a_star / (1 - a_star)) + mx + std::log(se);
    const double shift = rng.uniform(-30.0, 10.0);
    for (double& x : spec.g_old) x = rounded<T>(x + shift);
    spec.psi.assign(static_cast<std::size_t>(n), 0.0);
    spec.kinds.assign(static_cast<std::size_t>(n), SourceKind::attention);
    spec.kinds[0] = SourceKind::initial;
    spec.opt.normalizer = RowNorm::softmax;
    spec.opt.coupling = false;
    run.begin_instance(it, tight);
    const RouteEval e = route<T>(run, impl.route, spec);

    // Assumption constants of the rounded instance, in mp50.
    std::vector<mp50> w_mp(w.begin(), w.end());
    const mp50 wn = norm_of(w_mp);
    for (mp50& x : w_mp) x /= wn;
    std::vector<std::vector<mp50>> u_mp(static_cast<std::size_t>(n), std::vector<mp50>(static_cast<std::size_t>(d)));
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < d; ++c)
        u_mp[static_cast<std::size_t>(i)][static_cast<std::size_t>(c)] = mp50(spec.sources[static_cast<std::size_t>(i * d + c)]) - mp50(href[static_cast<std::size_t>(c)]);
    const mp50 B0 = norm_of(u_mp[static_cast<std::size_t>(istar)]);
    mp50 B1 = pos_inf<mp50>();
    for (int i = 0; i < n; ++i) {
      if (i == istar) continue;
      mp50 dot(0);
      for (int c = 0; c < d; ++c) dot += u_mp[static_cast<std::size_t>(i)][static_cast<std::size_t>(c)] * w_mp[static_cast<std::size_t>(c)];
      B1 = std::min(B1, dot);
    }
    if (!(B0 < B1)) { run.fail("construction", "separation b0 = ", to_double(B0), " < b1 = ", to_double(B1), " fails"); continue; }
    std::vector<mp50> dh(static_cast<std::size_t>(d));
    std::vector<double> dh_err(static_cast<std::size_t>(d));
    for (int c = 0; c < d; ++c) {
      dh[static_cast<std::size_t>(c)] = e.val.h(0, c) - mp50(href[static_cast<std::size_t>(c)]);
      dh_err[static_cast<std::size_t>(c)] = e.bound.h(0, c);
    }
    const mp50 delta = norm_of(dh);
    const double delta_err = norm_of(dh_err);
    // (1e-3 (b0 + b1) absorbs the rounding of the logits, which moves alpha_{i*} slightly.)
    if (!(to_double(delta) <= guarantee + 1e-3 * to_double(B0 + B1) + delta_err) || !(delta < B1)) {
      run.fail("no-op target", "||h - h_ref|| = ", to_double(delta), " exceeds the construction's guarantee ", guarantee,
               " (b1 = ", to_double(B1), ")");
      continue;
    }
    const mp50 a = e.val.alpha(istar, 0);
    const mp50 rhs = impl.loosen * (B1 - delta) / (B0 + B1);
    const double allowed = e.bound.alpha(istar, 0) + delta_err / to_double(B0 + B1) + kEvalAllowance;
    if (tight) run.tight_margin("alpha_{i*} >= (b1 - delta_t)/(b0 + b1)", to_double(a - rhs), allowed);
    else run.margin("alpha_{i*} >= (b1 - delta_t)/(b0 + b1)", to_double(a - rhs), allowed);
  }
}

// ---- the library and the mutants -----------------------------------------------------------------

template <class T> Implementation<T> library_implementation(ScalarTag<T>, Backend b) { return {library_route<T>(b)}; }

/// Depth Softmax1 where the theorem's softmax is configured (weights no longer sum to 1).
template <class T> Implementation<T> softmax1_instead_of_softmax(ScalarTag<T>) {
  return {route_with_normalizer<T>(RowNorm::softmax1)};
}

/// Sources mixed in reverse order (weight of candidate i applied to source n-1-i).
template <class T> Implementation<T> sources_reversed(ScalarTag<T>) {
  return {[](const Tensor<T>& s, const Tensor<T>& g, const Tensor<T>& p, const std::vector<SourceKind>& k,
             const DepthOptions& o) {
    DepthRoute<T> r = attn_res_route<T>(s, g, p, k, o);
    const index_t n = s.dim(0), N = s.dim(1), d = s.dim(2);
    for (index_t t = 0; t < N; ++t)
      for (index_t c = 0; c < d; ++c) {
        T acc(0);
        for (index_t i = 0; i < n; ++i) acc += r.alpha(i, t) * s(n - 1 - i, t, c);
        r.h(t, c) = acc;
      }
    return r;
  }};
}

}  // namespace

Check make_theorem_5_1() {
  return define_check(
             kId, kPaperRef,
             "softmax depth weights with ||u_{i*}|| <= b0 < b1 <= <u_i,w> and ||sum alpha_i u_i|| <= delta_t < b1 "
             "give alpha_{i*} >= (b1-delta_t)/(b0+b1)",
             BackendCoverage::every_available,
             [](const auto& impl, const CheckConfig& cfg, CheckRun& run) { check_statement(impl, cfg, run); },
             [](auto scalar, Backend b) { return library_implementation(scalar, b); })
      .mutant("softmax1_instead_of_softmax", "depth weights with a null category",
              [](auto scalar) { return softmax1_instead_of_softmax(scalar); })
      .mutant("sources_reversed", "weight of candidate i applied to source n-1-i",
              [](auto scalar) { return sources_reversed(scalar); })
      .loosened_bound(0.9, "lower bound 0.9 (b1 - delta_t)/(b0 + b1): the equality case must expose it")
      .check();
}

}  // namespace oasis::checks
