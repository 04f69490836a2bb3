// proofs_checks/centring_ratio.cpp — the centring ratio identity of the OASIS coupling (§4.3;
// SPEC §3, §5.6).
//
// psi_i = (1/H) sum_h p_null^{(i,h)} (mean over query heads), g_new = g - beta Dpsi, depth Softmax1.
// For every candidate i:  alpha_i / alpha_null = exp(g_i - beta Dpsi_i)   (definition), hence
//   transformed branches i, k in the centring set E:
//       alpha_i / alpha_k = exp(g_i - g_k) exp(-beta (psi_i - psi_k))     — the mean cancels;
//   against the null category:  alpha_k / alpha_null = exp(g_k - beta psi_k) exp(+beta mean_E psi)
//   and against the initial state (Dpsi_0 = 0 under paper_v2):
//       alpha_k / alpha_0 = exp(g_k - g_0) exp(-beta psi_k) exp(+beta mean_E psi) — it does not.
// Under authors_code the mean runs over all n candidates with psi_0 := 0, so the first identity
// holds for every pair including the initial state. The slides' teaching example (psi = 0.8, 0.2,
// g = 0, beta = 1, paper_v2) gives (initial, branch 1, branch 2, null) = (0.2445, 0.1811, 0.3300, 0.2445).
#include "statements.hpp"
#include "support.hpp"

namespace oasis::checks {
namespace {
using namespace detail;

const char* const kId = "centring_ratio";
const char* const kRef = "§4.3 coupling, centring ratio (SPEC §3, §5.6)";

template <class T> struct Impl {
  std::function<Tensor<T>(const Tensor<T>&)> null_statistic;  ///< p_null [B, H, T] -> psi [B, T]
  RouteFn<T> route;
};

template <class T> Impl<T> library_impl(Backend b) {
  return {[](const Tensor<T>& p) { return oasis::null_statistic<T>(p); }, library_route<T>(b)};
}

struct Candidate {
  SourceKind kind;
  std::vector<double> p_null;  ///< per head (attention sources)
};

template <class T> void body(const Impl<T>& impl, const CheckConfig& cfg, Tally& t) {
  using std::abs; using std::exp;
  Rng rng(seed_for(cfg, kId));
  const int count = instances_for<T>(cfg);
  for (int it = -1; it < count; ++it) {
    const bool example = it < 0;  // the slides' teaching example first
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
      for (int h = 0; h < H; ++h) cand[static_cast<std::size_t>(i)].p_null.push_back(rd<T>(rng.uniform(0.0, 1.0)));
    }
    if (example) { cand[1].p_null = {rd<T>(0.8)}; cand[2].p_null = {rd<T>(0.2)}; }
    const double beta = example ? 1.0 : rng.uniform(0.0, 3.0);
    t.begin(it, false, example ? "teaching example" : std::string(to_string(co.centring)) + "/" + std::string(to_string(co.headless)));

    // psi through the implementation's null statistic (per attention source); head-less sources
    // inherit the psi of the preceding attention source under `inherit`.
    RouteSpec spec;
    spec.n = n;
    std::vector<R> psi_def(static_cast<std::size_t>(n), R(0));
    double last_psi = 0;
    R last_def(0);
    for (int i = 0; i < n; ++i) {
      const Candidate& c = cand[static_cast<std::size_t>(i)];
      double psi = rd<T>(rng.uniform(0.0, 1.0));  // ignored entry for candidates without evidence
      if (c.kind == SourceKind::attention) {
        Tensor<T> pn({1, H, 1});
        R sum(0);
        for (int h = 0; h < H; ++h) { pn(0, h, 0) = T(c.p_null[static_cast<std::size_t>(h)]); sum += R(c.p_null[static_cast<std::size_t>(h)]); }
        const Tensor<T> ps = impl.null_statistic(pn);
        if (ps.size() != 1) { t.fail("null statistic", "shape ", shape_str(ps.shape()), " for p_null [1, H, 1]"); break; }
        const R mean_def = sum / R(H);
        t.error("psi vs mean_h p_null", dbl(abs(to_R(ps[0]) - mean_def)),
                (H + 2) * bounds::Precision::of<T>().u * ref_factor<T>() * dbl(mean_def) + kEvalAllowance);
        // The routing below receives this psi (through double: exact for float and double; for
        // the mp scalars a rounding of the already checked value, so the identities use it).
        psi = static_cast<double>(to_R(ps[0]));
        last_psi = psi;
        last_def = R(psi);
        psi_def[static_cast<std::size_t>(i)] = last_def;
      } else if (c.kind == SourceKind::headless && co.headless == HeadlessRule::inherit) {
        psi = last_psi;
        psi_def[static_cast<std::size_t>(i)] = last_def;
      }
      spec.psi.push_back(psi);
      spec.kinds.push_back(c.kind);
      spec.sources.push_back(rd<T>(rng.normal(1.0)));
      spec.g_old.push_back(example ? 0.0 : rd<T>(rng.normal(1.5) + (conv == 3 ? 0.0 : rng.uniform(-3.0, 3.0))));
    }
    if (t.failures()) continue;
    spec.opt.normalizer = RowNorm::softmax1;
    spec.opt.coupling = true;
    spec.opt.coupling_options = co;
    spec.opt.beta = beta;
    const RouteEval e = route<T>(t, impl.route, spec);

    // Dpsi by its definition, in R, from the definitional psi.
    std::vector<bool> in_E(static_cast<std::size_t>(n));
    R sumE(0), sumAll(0);
    int nE = 0;
    for (int i = 0; i < n; ++i) {
      in_E[static_cast<std::size_t>(i)] = has_null_evidence(spec.kinds[static_cast<std::size_t>(i)], co.headless);
      if (in_E[static_cast<std::size_t>(i)]) { sumE += psi_def[static_cast<std::size_t>(i)]; ++nE; sumAll += psi_def[static_cast<std::size_t>(i)]; }
    }
    const R betaR = std::min(beta, co.beta_max);
    std::vector<R> dpsi(static_cast<std::size_t>(n), R(0));
    R mean(0);
    if (co.centring == Centring::paper_v2) {
      if (nE >= 2) {
        mean = sumE / R(nE);
        for (int i = 0; i < n; ++i) if (in_E[static_cast<std::size_t>(i)]) dpsi[static_cast<std::size_t>(i)] = psi_def[static_cast<std::size_t>(i)] - mean;
      }
    } else {
      mean = sumAll / R(n);
      for (int i = 0; i < n; ++i) dpsi[static_cast<std::size_t>(i)] = (in_E[static_cast<std::size_t>(i)] ? psi_def[static_cast<std::size_t>(i)] : R(0)) - mean;
    }
    const R an = e.val.alpha_null[0];
    const double rel_null = e.bound.alpha_null[0] / dbl(an);
    auto rel = [&](int i) { return e.bound.alpha(i, 0) / dbl(e.val.alpha(i, 0)) + e.bound.g(i, 0); };
    for (int i = 0; i < n; ++i) {
      // alpha_i / alpha_null = exp(g_i - beta Dpsi_i), written alpha_null exp(...) = alpha_i
      const R ai = e.val.alpha(i, 0);
      const R pred = an * exp(R(spec.g_old[static_cast<std::size_t>(i)]) - betaR * dpsi[static_cast<std::size_t>(i)]);
      const char* what = !in_E[static_cast<std::size_t>(i)] || co.centring == Centring::authors_code
                             ? "alpha_i / alpha_null = exp(g_i - beta Dpsi_i)"
                             : "alpha_k / alpha_null = exp(g_k - beta psi_k) exp(beta mean_E psi) (mean does not cancel)";
      t.identity(what, dbl(abs(ai - pred) / ai), rel(i) + rel_null + kEvalAllowance);
    }
    for (int i = 0; i < n; ++i)
      for (int k = i + 1; k < n; ++k) {
        const bool pair = co.centring == Centring::authors_code ? true : (in_E[static_cast<std::size_t>(i)] && in_E[static_cast<std::size_t>(k)]);
        if (!pair) continue;
        auto psi_of = [&](int j) { return in_E[static_cast<std::size_t>(j)] ? psi_def[static_cast<std::size_t>(j)] : R(0); };
        const R ai = e.val.alpha(i, 0), ak = e.val.alpha(k, 0);
        const R pred = ak * exp(R(spec.g_old[static_cast<std::size_t>(i)]) - R(spec.g_old[static_cast<std::size_t>(k)]) -
                                betaR * (psi_of(i) - psi_of(k)));
        t.identity("alpha_i / alpha_k = exp(g_i - g_k) exp(-beta (psi_i - psi_k)) (mean cancels)",
                   dbl(abs(ai - pred) / ai), rel(i) + rel(k) + kEvalAllowance);
      }
    if (co.centring == Centring::paper_v2 && nE >= 2) {
      // against the initial state: alpha_k / alpha_0 = exp(g_k - g_0 - beta psi_k + beta mean_E psi)
      for (int k = 1; k < n; ++k) {
        if (!in_E[static_cast<std::size_t>(k)]) continue;
        const R pred = e.val.alpha(0, 0) * exp(R(spec.g_old[static_cast<std::size_t>(k)]) - R(spec.g_old[0]) -
                                               betaR * psi_def[static_cast<std::size_t>(k)] + betaR * mean);
        t.identity("alpha_k / alpha_0 = exp(g_k - g_0) exp(-beta psi_k) exp(beta mean_E psi) (mean does not cancel)",
                   dbl(abs(e.val.alpha(k, 0) - pred) / e.val.alpha(k, 0)), rel(k) + rel(0) + kEvalAllowance);
      }
    }
    if (example) {
      const double pub[4] = {0.2445, 0.1811, 0.3300, 0.2445};  // slides, rounded to 4 decimals
      for (int i = 0; i < 3; ++i)
        t.identity("teaching example (slides)", std::abs(dbl(e.val.alpha(i, 0)) - pub[i]), 5e-5 + e.bound.alpha(i, 0));
      t.identity("teaching example (slides): alpha_null", std::abs(dbl(an) - pub[3]), 5e-5 + e.bound.alpha_null[0]);
    }
  }
}

// ---- mutants -------------------------------------------------------------------------------------

/// Coupling with the sign flipped: g_new = g_old + beta Dpsi.
template <class T> Impl<T> coupling_sign_flipped() {
  Impl<T> m = library_impl<T>(Backend::reference);
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
template <class T> Impl<T> psi_summed_over_heads() {
  Impl<T> m = library_impl<T>(Backend::reference);
  m.null_statistic = [](const Tensor<T>& p) {
    Tensor<T> psi = oasis::null_statistic<T>(p);
    for (index_t i = 0; i < psi.size(); ++i) psi[i] *= T(p.dim(1));
    return psi;
  };
  return m;
}

/// paper_v2 centring that includes the initial state in the mean (authors' set under the paper's name).
template <class T> Impl<T> centring_includes_initial_state() {
  Impl<T> m = library_impl<T>(Backend::reference);
  m.route = [](const Tensor<T>& s, const Tensor<T>& g, const Tensor<T>& p, const std::vector<SourceKind>& k,
               const DepthOptions& o) {
    DepthOptions o2 = o;
    o2.coupling_options.centring = Centring::authors_code;
    return attn_res_route<T>(s, g, p, k, o2);
  };
  return m;
}

}  // namespace

Check make_centring_ratio() {
  Check c;
  c.id = kId;
  c.paper_ref = kRef;
  c.statement = "alpha_i/alpha_k = exp(g_i-g_k) exp(-beta(psi_i-psi_k)) for transformed branches; the centring mean "
                "stays in the ratios to the null category and the initial state; slides' teaching example";
  c.run = [](const CheckConfig& cfg) {
    return run_check(kId, kRef, cfg, true, [&](auto tag, Backend b, Tally& t) {
      using T = typename decltype(tag)::type;
      body<T>(library_impl<T>(b), cfg, t);
    });
  };
  c.mutants.push_back(mutant_of(kId, kRef, "coupling_sign_flipped", "g_new = g_old + beta Dpsi",
                                [](auto tag, const CheckConfig& cfg, Tally& t) {
                                  using T = typename decltype(tag)::type;
                                  body<T>(coupling_sign_flipped<T>(), cfg, t);
                                }));
  c.mutants.push_back(mutant_of(kId, kRef, "psi_summed_over_heads", "psi = sum_h p_null instead of the mean",
                                [](auto tag, const CheckConfig& cfg, Tally& t) {
                                  using T = typename decltype(tag)::type;
                                  body<T>(psi_summed_over_heads<T>(), cfg, t);
                                }));
  c.mutants.push_back(mutant_of(kId, kRef, "centring_includes_initial_state",
                                "paper_v2 mean taken over all candidates with psi_0 = 0",
                                [](auto tag, const CheckConfig& cfg, Tally& t) {
                                  using T = typename decltype(tag)::type;
                                  body<T>(centring_includes_initial_state<T>(), cfg, t);
                                }));
  return c;
}

}  // namespace oasis::checks
