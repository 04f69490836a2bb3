// proofs_checks/coupling_limits.cpp — the coupling's degenerate cases (§4.3; docs/spec.md §3, §5.7).
//
//   beta = 0                      OASIS routing equals AoS (no coupling) exactly;
//   one transformed branch        Dpsi = 0 exactly (paper_v2), so routing equals AoS for any beta;
//   l = 1 (only the initial state) no coupling under either convention.
// These are exact identities: g_new = g_old - beta * 0 = g_old in floating point, so the check
// requires bitwise equality in every scalar and backend.
#include "statements.hpp"
#include "support.hpp"

namespace oasis::checks {
namespace {
using namespace detail;

const char* const kId = "coupling_limits";
const char* const kPaperRef = "§4.3 coupling: beta = 0, one branch, l = 1 (docs/spec.md §3, §5.7)";

template <class T> struct Implementation {
  RouteFn<T> route;
};

/// Bitwise equality of two tensors (converted exactly to mp50).
inline void require_bitwise_equal(CheckRun& run, const char* what, const Tensor<mp50>& a, const Tensor<mp50>& b) {
  if (a.shape() != b.shape()) { run.fail(what, "shapes differ"); return; }
  mp50 worst(0);
  for (index_t i = 0; i < a.size(); ++i) {
    using std::abs;
    const mp50 d = abs(a[i] - b[i]);
    if (d > worst) worst = d;
  }
  run.identity(what, to_double(worst), 0.0);
}

template <class T> void check_statement(const Implementation<T>& impl, const CheckConfig& cfg, CheckRun& run) {
  Rng rng(seed_for(cfg, kId));
  const int count = instances_for<T>(cfg);
  for (int it = 0; it < count; ++it) {
    const int which = it % 3;  // 0: beta = 0; 1: one transformed branch; 2: l = 1
    const int conv = rng.integer(0, 2);
    CouplingOptions co;
    if (conv == 1) co = CouplingOptions{Centring::authors_code, HeadlessRule::inherit,
                                        std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
    if (conv == 2) co = CouplingOptions::authors_code();  // clamps inactive: |g| < 50
    if (which == 1) co = CouplingOptions::paper_v2();      // the one-branch rule is paper_v2's
    co.headless = rng.integer(0, 1) ? HeadlessRule::inherit : HeadlessRule::no_evidence;
    RouteSpec spec;
    spec.N = rng.integer(1, 3);
    spec.d = rng.integer(1, 4);
    if (which == 0) {
      spec.n = rng.integer(1, 8);
      spec.kinds.push_back(SourceKind::initial);
      for (index_t i = 1; i < spec.n; ++i) spec.kinds.push_back(rng.integer(0, 2) ? SourceKind::attention : SourceKind::headless);
    } else if (which == 1) {
      // the initial state, one attention branch, and head-less sources without evidence
      co.headless = HeadlessRule::no_evidence;
      spec.kinds = {SourceKind::initial, SourceKind::attention};
      const int extra = rng.integer(0, 3);
      for (int i = 0; i < extra; ++i) spec.kinds.push_back(SourceKind::headless);
      spec.n = static_cast<index_t>(spec.kinds.size());
    } else {
      spec.n = 1;
      spec.kinds = {SourceKind::initial};
    }
    for (index_t i = 0; i < spec.n * spec.N * spec.d; ++i) spec.sources.push_back(rounded<T>(rng.normal(1.0)));
    for (index_t i = 0; i < spec.n * spec.N; ++i) {
      spec.g_old.push_back(rounded<T>(rng.normal(3.0)));
      spec.psi.push_back(rounded<T>(rng.uniform(0.0, 1.0)));
    }
    spec.opt.normalizer = RowNorm::softmax1;
    spec.opt.coupling = true;
    spec.opt.coupling_options = co;
    spec.opt.beta = which == 0 ? 0.0 : rng.uniform(0.1, 3.0);
    run.begin_instance(it, false, which == 0 ? "beta = 0" : which == 1 ? "one transformed branch" : "l = 1");
    const RouteEval coupled = route<T>(run, impl.route, spec);
    RouteSpec aos = spec;
    aos.opt.coupling = false;
    const RouteEval plain = route<T>(run, impl.route, aos);
    require_bitwise_equal(run, "coupled logits = g_old", coupled.val.g, plain.val.g);
    require_bitwise_equal(run, "alpha = AoS alpha (exact)", coupled.val.alpha, plain.val.alpha);
    require_bitwise_equal(run, "alpha_null = AoS alpha_null (exact)", coupled.val.alpha_null, plain.val.alpha_null);
    require_bitwise_equal(run, "h = AoS h (exact)", coupled.val.h, plain.val.h);
    if (which > 0) {
      mp50 worst(0);
      for (index_t i = 0; i < coupled.val.dpsi.size(); ++i) {
        using std::abs;
        if (abs(coupled.val.dpsi[i]) > worst) worst = abs(coupled.val.dpsi[i]);
      }
      run.identity(which == 1 ? "one transformed branch: Dpsi = 0" : "l = 1: Dpsi = 0", to_double(worst), 0.0);
    }
  }
}

// ---- the library and the mutants -----------------------------------------------------------------

template <class T> Implementation<T> library_implementation(ScalarTag<T>, Backend b) { return {library_route<T>(b)}; }

/// The beta override is ignored: beta = softplus(theta) (about 0.0067 at theta = -5) always.
template <class T> Implementation<T> beta_override_ignored(ScalarTag<T>) {
  return {[](const Tensor<T>& s, const Tensor<T>& g, const Tensor<T>& p, const std::vector<SourceKind>& k,
             const DepthOptions& o) {
    DepthOptions o2 = o;
    o2.beta.reset();
    return attn_res_route<T>(s, g, p, k, o2);
  }};
}

template <class T> Implementation<T> centring_includes_initial_state(ScalarTag<T>) {
  return {route_centring_over_every_candidate<T>()};
}

/// psi injected without centring: g_new = g_old - beta psi for candidates with evidence.
template <class T> Implementation<T> uncentred_psi(ScalarTag<T>) {
  return {[](const Tensor<T>& s, const Tensor<T>& g, const Tensor<T>& p, const std::vector<SourceKind>& k,
             const DepthOptions& o) {
    if (!o.coupling) return attn_res_route<T>(s, g, p, k, o);
    const index_t n = g.dim(0), N = g.dim(1);
    const T beta = depth_beta<T>(o);
    Tensor<T> gn({n, N}), dps({n, N});
    for (index_t i = 0; i < n; ++i)
      for (index_t t = 0; t < N; ++t) {
        const bool ev = has_null_evidence(k[static_cast<std::size_t>(i)], o.coupling_options.headless);
        dps(i, t) = ev ? p(i, t) : T(0);
        gn(i, t) = g(i, t) - beta * dps(i, t);
      }
    DepthOptions o2 = o;
    o2.coupling = false;
    DepthRoute<T> r = attn_res_route<T>(s, gn, p, k, o2);
    r.dpsi = dps;
    return r;
  }};
}

}  // namespace

Check make_coupling_limits() {
  return define_check(
             kId, kPaperRef,
             "beta = 0 reproduces AoS exactly; one transformed branch gives Dpsi = 0; l = 1 has no coupling",
             BackendCoverage::every_available,
             [](const auto& impl, const CheckConfig& cfg, CheckRun& run) { check_statement(impl, cfg, run); },
             [](auto scalar, Backend b) { return library_implementation(scalar, b); })
      .mutant("beta_override_ignored", "beta = softplus(theta) even when beta is given",
              [](auto scalar) { return beta_override_ignored(scalar); })
      .mutant("centring_includes_initial_state", "paper_v2 mean over all candidates",
              [](auto scalar) { return centring_includes_initial_state(scalar); })
      .mutant("uncentred_psi", "g_new = g_old - beta psi (no centring)",
              [](auto scalar) { return uncentred_psi(scalar); })
      .check();
}

}  // namespace oasis::checks
