// proofs_checks/centring_ratio.cpp — the centring ratio identity of the OASIS coupling (§4.3;
// docs/spec.md §3, §5.6).
//
// psi_i = (1/H) sum_h p_null^{(i,h)} (mean over query heads), g_new = g - beta Dpsi, depth Softmax1.
// For every candidate i:  alpha_i / alpha_null = exp(g_i - beta Dpsi_i)   (definition), hence
//   transformed branches i, k in the centring set E:
//       alpha_i / alpha_k = exp(g_i - g_k) exp(-beta (psi_i - psi_k))     — the mean cancels;
//   against the null category:  alpha_k / alpha_null = exp(g_k - beta psi_k) exp(+beta mean_E psi)
//   and against the initial state (Dpsi_0 = 0 under paper_v2):
//       alpha_k / alpha_0 = exp(g_k - g_0) exp(-beta psi_k) exp(+beta mean_E psi) — it does not.
// Under authors_code the mean runs over all n candidates with psi_0 := 0, so the first identity
// holds for every pair including the initial state. The teaching example of docs/spec.md §3 (psi = 0.8, 0.2,
// g = 0, beta = 1, paper_v2) gives (initial, branch 1, branch 2, null) = (0.2445, 0.1811, 0.3300, 0.2445).
#include "statements.hpp"
#include "support.hpp"

namespace oasis::checks {
namespace {
using namespace detail;

const char* const kId = "centring_ratio";
const char* const kPaperRef = "§4.3 coupling, centring ratio (docs/spec.md §3, §5.6)";

template <class T> struct Implementation {
  std::function<Tensor<T>(const Tensor<T>&)> null_statistic;  ///< p_null [B, H, T] -> psi [B, T]
  RouteFn<T> route;
};

template <class T> Implementation<T> library_implementation(ScalarTag<T>, Backend b) {
  return {[](const Tensor<T>& p) { return oasis::null_statistic<T>(p); }, library_route<T>(b)};
}

struct Candidate {
  SourceKind kind;
  std::vector<double> p_null;  ///< per head (attention sources)
};

template <class T> void check_statement(const Implementation<T>& impl, const CheckConfig& cfg, CheckRun& run) {
  using std::abs; using std::exp;
  Rng rng(seed_for(cfg, kId));
  const int count = instances_for<T>(cfg);
  for (int it = -1; it < count; ++it) {
    const bool example = it < 0;  // the teaching example of docs/spec.md §3 first
    const int H = example ? 1 : rng.integer(1, 6);
    const int n = example ? 3 : rng.integer(2, 8);
    std::vector<Candidate> cand(static_cast<std::size_t>(n));
    CouplingOptions co;
    const int conv = example ? 0 : rng.integer(0, 3);  // 0,1: paper_v2; 2: authors_code unclamped; 3: authors profile
    if (conv == 2) co = CouplingOptions{Centring::authors_code, HeadlessRule::inherit,
                                        std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
    if (conv == 3) co = CouplingOptions::authors_code();
    co.headless = example || rng.integer(0, 1) == 0 ? HeadlessRule::inherit : HeadlessRule::no_evidence;
    cand[0].kind = SourceKind::initial;
    for (int i = 1; i < n; ++i) {
      cand[static_cast<std::size_t>(i)].kind =
          example || i == 1 || rng.integer(0, 2) > 0 ? SourceKind::attention : SourceKind::headless;
      for (int h = 0; h < H; ++h) cand[static_cast<std::size_t>(i)].p_null.push_back(rounded<T>(rng.uniform(0.0, 1.0)));
    }
    if (example) { cand[1].p_null = {rounded<T>(0.8)}; cand[2].p_null = {rounded<T>(0.2)}; }
    const double beta = example ? 1.0 : rng.uniform(0.0, 3.0);
    run.begin_instance(it, false, example ? "teaching example" : std::string(to_string(co.centring)) + "/" + std::string(to_string(co.headless)));

    // psi through the implementation's null statistic (per attention source); head-less sources
    // inherit the psi of the preceding attention source under `inherit`.
    RouteSpec spec;
    spec.n = n;
    std::vector<mp50> psi_def(static_cast<std::size_t>(n), mp50(0));
    double last_psi = 0;
    mp50 last_def(0);
    for (int i = 0; i < n; ++i) {
      const Candidate& c = cand[static_cast<std::size_t>(i)];
      double psi = rounded<T>(rng.uniform(0.0, 1.0));  // ignored entry for candidates without evidence
      if (c.kind == SourceKind::attention) {
        Tensor<T> pn({1, H, 1});
        mp50 sum(0);
        for (int h = 0; h < H; ++h) { pn(0, h, 0) = T(c.p_null[static_cast<std::size_t>(h)]); sum += mp50(c.p_null[static_cast<std::size_t>(h)]); }
        const Tensor<T> ps = impl.null_statistic(pn);
        if (ps.size() != 1) { run.fail("null statistic", "shape ", shape_str(ps.shape()), " for p_null [1, H, 1]"); break; }
        const mp50 mean_def = sum / mp50(H);
        run.error("psi vs mean_h p_null", to_double(abs(to_mp50(ps[0]) - mean_def)),
                  (H + 2) * bounds::Precision::of<T>().u * mp50_rounding_factor<T>() * to_double(mean_def) + kEvalAllowance);
        // The routing below receives this psi (through double: exact for float and double; for
        // the mp scalars a rounding of the already checked value, so the identities use it).
        psi = static_cast<double>(to_mp50(ps[0]));
        last_psi = psi;
        last_def = mp50(psi);
        psi_def[static_cast<std::size_t>(i)] = last_def;
      } else if (c.kind == SourceKind::headless && co.headless == HeadlessRule::inherit) {
        psi = last_psi;
        psi_def[static_cast<std::size_t>(i)] = last_def;
      }
      spec.psi.push_back(psi);
      spec.kinds.push_back(c.kind);
      spec.sources.push_back(rounded<T>(rng.normal(1.0)));
      spec.g_old.push_back(example ? 0.0 : rounded<T>(rng.normal(1.5) + (conv == 3 ? 0.0 : rng.uniform(-3.0, 3.0))));
    }
    if (run.failures()) continue;
    spec.opt.normalizer = RowNorm::softmax1;
    spec.opt.coupling = true;
    spec.opt.coupling_options = co;
    spec.opt.beta = beta;
    const RouteEval e = route<T>(run, impl.route, spec);

    // Dpsi by its definition, in mp50, from the definitional psi.
    std::vector<bool> in_E(static_cast<std::size_t>(n));
    mp50 sumE(0), sumAll(0);
    int nE = 0;
    for (int i = 0; i < n; ++i) {
      in_E[static_cast<std::size_t>(i)] = has_null_evidence(spec.kinds[static_cast<std::size_t>(i)], co.headless);
      if (in_E[static_cast<std::size_t>(i)]) { sumE += psi_def[static_cast<std::size_t>(i)]; ++nE; sumAll += psi_def[static_cast<std::size_t>(i)]; }
    }
    const mp50 beta_mp = std::min(beta, co.beta_max);
    std::vector<mp50> dpsi(static_cast<std::size_t>(n), mp50(0));
    mp50 mean(0);
    if (co.centring == Centring::paper_v2) {
      if (nE >= 2) {
        mean = sumE / mp50(nE);
        for (int i = 0; i < n; ++i) if (in_E[static_cast<std::size_t>(i)]) dpsi[static_cast<std::size_t>(i)] = psi_def[static_cast<std::size_t>(i)] - mean;
      }
    } else {
      mean = sumAll / mp50(n);
      for (int i = 0; i < n; ++i) dpsi[static_cast<std::size_t>(i)] = (in_E[static_cast<std::size_t>(i)] ? psi_def[static_cast<std::size_t>(i)] : mp50(0)) - mean;
    }
    const mp50 an = e.val.alpha_null[0];
    const double rel_null = e.bound.alpha_null[0] / to_double(an);
    auto rel = [&](int i) { return e.bound.alpha(i, 0) / to_double(e.val.alpha(i, 0)) + e.bound.g(i, 0); };
    for (int i = 0; i < n; ++i) {
      // alpha_i / alpha_null = exp(g_i - beta Dpsi_i), written alpha_null exp(...) = alpha_i
      const mp50 ai = e.val.alpha(i, 0);
      const mp50 pred = an * exp(mp50(spec.g_old[static_cast<std::size_t>(i)]) - beta_mp * dpsi[static_cast<std::size_t>(i)]);
      const char* what = !in_E[static_cast<std::size_t>(i)] || co.centring == Centring::authors_code
                             ? "alpha_i / alpha_null = exp(g_i - beta Dpsi_i)"
                             : "alpha_k / alpha_null = exp(g_k - beta psi_k) exp(beta mean_E psi) (mean does not cancel)";
      run.identity(what, to_double(abs(ai - pred) / ai), rel(i) + rel_null + kEvalAllowance);
    }
    for (int i = 0; i < n; ++i)
      for (int k = i + 1; k < n; ++k) {
        const bool pair = co.centring == Centring::authors_code ? true : (in_E[static_cast<std::size_t>(i)] && in_E[static_cast<std::size_t>(k)]);
        if (!pair) continue;
        auto psi_of = [&](int j) { return in_E[static_cast<std::size_t>(j)] ? psi_def[static_cast<std::size_t>(j)] : mp50(0); };
        const mp50 ai = e.val.alpha(i, 0), ak = e.val.alpha(k, 0);
        const mp50 pred = ak * exp(mp50(spec.g_old[static_cast<std::size_t>(i)]) - mp50(spec.g_old[static_cast<std::size_t>(k)]) -
                                beta_mp * (psi_of(i) - psi_of(k)));
        run.identity("alpha_i / alpha_k = exp(g_i - g_k) exp(-beta (psi_i - psi_k)) (mean cancels)",
                     to_double(abs(ai - pred) / ai), rel(i) + rel(k) + kEvalAllowance);
      }
    if (co.centring == Centring::paper_v2 && nE >= 2) {
      // against the initial state: alpha_k / alpha_0 = exp(g_k - g_0 - beta psi_k + beta mean_E psi)
      for (int k = 1; k < n; ++k) {
        if (!in_E[static_cast<std::size_t>(k)]) continue;
        const mp50 pred = e.val.alpha(0, 0) * exp(mp50(spec.g_old[static_cast<std::size_t>(k)]) - mp50(spec.g_old[0]) -
                                               beta_mp * psi_def[static_cast<std::size_t>(k)] + beta_mp * mean);
        run.identity("alpha_k / alpha_0 = exp(g_k - g_0) exp(-beta psi_k) exp(beta mean_E psi) (mean does not cancel)",
                     to_double(abs(e.val.alpha(k, 0) - pred) / e.val.alpha(k, 0)), rel(k) + rel(0) + kEvalAllowance);
      }
    }
    if (example) {
      const double pub[4] = {0.2445, 0.1811, 0.3300, 0.2445};  // docs/spec.md §3, rounded to 4 decimals
      for (int i = 0; i < 3; ++i)
        run.identity("teaching example (spec §3)", std::abs(to_double(e.val.alpha(i, 0)) - pub[i]), 5e-5 + e.bound.alpha(i, 0));
      run.identity("teaching example (spec §3): alpha_null", std::abs(to_double(an) - pub[3]), 5e-5 + e.bound.alpha_null[0]);
    }
  }
}

// ---- the library and the mutants -----------------------------------------------------------------

/// Coupling with the sign flipped: g_new = g_old + beta Dpsi.
template <class T> Implementation<T> coupling_sign_flipped(ScalarTag<T> scalar) {
  Implementation<T> m = library_implementation(scalar, Backend::reference);
  m.route = [](const Tensor<T>& s, const Tensor<T>& g, const Tensor<T>& p, const std::vector<SourceKind>& k,
               const DepthOptions& o) {
    const index_t n = g.dim(0), N = g.dim(1);
    Tensor<T> gn({n, N}), dps({n, N});
    const T beta = depth_beta<T>(o);
    for (index_t t = 0; t < N; ++t) {
      Vec<T> col(n);
      for (index_t i = 0; i < n; ++i) col[i] = p(i, t);
      const Vec<T> d = centre_null_statistic(col, k, o.coupling_options);
      for (index_t i = 0; i < n; ++i) { gn(i, t) = g(i, t) + beta * d[i]; dps(i, t) = d[i]; }
    }
    DepthOptions o2 = o;
    o2.coupling = false;
    DepthRoute<T> r = attn_res_route<T>(s, gn, p, k, o2);
    r.dpsi = dps;
    return r;
  };
  return m;
}

/// psi summed over the heads instead of averaged.
template <class T> Implementation<T> psi_summed_over_heads(ScalarTag<T> scalar) {
  Implementation<T> m = library_implementation(scalar, Backend::reference);
  m.null_statistic = [](const Tensor<T>& p) {
    Tensor<T> psi = oasis::null_statistic<T>(p);
    for (index_t i = 0; i < psi.size(); ++i) psi[i] *= T(p.dim(1));
    return psi;
  };
  return m;
}

/// paper_v2 centring that includes the initial state in the mean (authors' set under the paper's name).
template <class T> Implementation<T> centring_includes_initial_state(ScalarTag<T> scalar) {
  Implementation<T> m = library_implementation(scalar, Backend::reference);
  m.route = route_centring_over_every_candidate<T>();
  return m;
}

}  // namespace

Check make_centring_ratio() {
  return define_check(
             kId, kPaperRef,
             "alpha_i/alpha_k = exp(g_i-g_k) exp(-beta(psi_i-psi_k)) for transformed branches; the centring mean "
             "stays in the ratios to the null category and the initial state; the teaching example of spec §3",
             BackendCoverage::every_available,
             [](const auto& impl, const CheckConfig& cfg, CheckRun& run) { check_statement(impl, cfg, run); },
             [](auto scalar, Backend b) { return library_implementation(scalar, b); })
      .mutant("coupling_sign_flipped", "g_new = g_old + beta Dpsi",
              [](auto scalar) { return coupling_sign_flipped(scalar); })
      .mutant("psi_summed_over_heads", "psi = sum_h p_null instead of the mean",
              [](auto scalar) { return psi_summed_over_heads(scalar); })
      .mutant("centring_includes_initial_state", "paper_v2 mean taken over all candidates with psi_0 = 0",
              [](auto scalar) { return centring_includes_initial_state(scalar); })
      .check();
}

}  // namespace oasis::checks
