// proofs_checks/lemma_5_2.cpp — Lemma 5.2 (sink preservation before and after collapse, App. C.4).
//
// sigma_l = sum_{j in K} p^{(l)}_j (sink mass of branch l's token attention, K the sink-prone
// positions), Sigma = sum_l alpha_l sigma_l with depth weights alpha:
//   softmax depth (sum alpha = 1):   min_l sigma_l <= Sigma <= max_l sigma_l;
//   Softmax1 depth:                  (1 - alpha_null) min sigma <= Sigma <= (1 - alpha_null) max sigma,
//                                    alpha_null = 1 / (1 + sum_r e^{g_r})  (its definition);
//   after collapse (any weights):    |Sigma - sigma_{l*}| <= 1 - alpha_{l*}, l* = argmax alpha.
// Equality of both bounds: every branch has the same sink mass.
#include "statements.hpp"
#include "support.hpp"

namespace oasis::checks {
namespace {
using namespace detail;

const char* const kId = "lemma_5_2";
const char* const kPaperRef = "Lemma 5.2 (§5, App. C.4, Assumption D.2)";

template <class T> struct Implementation {
  AttentionFn<T> attention;  ///< the branches' token attention (sink masses)
  RouteFn<T> route;          ///< the depth weights
  /// Factor applied to the statement's bound (1 = the paper's). Only the teeth tests change it, to
  /// show that the equality case exposes a bound that is off by a constant.
  double loosen = 1.0;
};

template <class T> void check_statement(const Implementation<T>& impl, const CheckConfig& cfg, CheckRun& run) {
  using std::abs; using std::exp;
  Rng rng(seed_for(cfg, kId));
  const int count = instances_for<T>(cfg);
  for (int it = 0; it < count; ++it) {
    const bool tight = it % 4 == 3;
    const bool depth_null = (it / 2) % 2 == 1;  // alternate depth softmax / Softmax1
    const RowNorm token_norm = it % 2 == 0 ? RowNorm::softmax : RowNorm::softmax1;
    const int L = rng.integer(1, 6), m = rng.integer(2, 10), k0 = rng.integer(1, m - 1);
    // token rows: sink positions j < k0 get a random boost; equal rows in the equality case
    std::vector<std::vector<double>> z(static_cast<std::size_t>(L), std::vector<double>(static_cast<std::size_t>(m)));
    std::vector<std::vector<std::vector<double>>> v(static_cast<std::size_t>(L),
                                                    std::vector<std::vector<double>>(static_cast<std::size_t>(m), {1.0}));
    for (int l = 0; l < L; ++l) {
      const double boost = rng.uniform(0.0, 6.0), shift = rng.uniform(-10.0, 5.0);
      for (int j = 0; j < m; ++j)
        z[static_cast<std::size_t>(l)][static_cast<std::size_t>(j)] = rounded<T>(rng.normal(2.0) + (j < k0 ? boost : 0.0) + shift);
      if (tight && l > 0) z[static_cast<std::size_t>(l)] = z[0];
    }
    RouteSpec spec;
    spec.n = L;
    spec.d = 1;
    const double gshift = rng.uniform(-8.0, 8.0);
    for (int l = 0; l < L; ++l) {
      spec.sources.push_back(rounded<T>(rng.normal(1.0)));
      spec.g_old.push_back(rounded<T>(rng.normal(2.0) + gshift));
      spec.psi.push_back(0.0);
      spec.kinds.push_back(l == 0 ? SourceKind::initial : SourceKind::attention);
    }
    spec.opt.normalizer = depth_null ? RowNorm::softmax1 : RowNorm::softmax;
    spec.opt.coupling = false;
    run.begin_instance(it, tight, std::string("token ") + std::string(to_string(token_norm)) + ", depth " +
                           std::string(to_string(spec.opt.normalizer)));
    const AttentionEval a = attend<T>(run, impl.attention, RowSpec{z, v, -1, token_norm, {}});
    const RouteEval e = route<T>(run, impl.route, spec);

    std::vector<mp50> sigma(static_cast<std::size_t>(L));
    std::vector<double> b_sigma(static_cast<std::size_t>(L), 0.0);
    mp50 Sigma(0);
    double b_Sigma = kEvalAllowance;
    index_t lmax = 0, lmin = 0, lstar = 0;
    for (index_t l = 0; l < L; ++l) {
      mp50 s(0);
      for (index_t j = 0; j < k0; ++j) { s += a.val.probs(0, l, 0, j); b_sigma[static_cast<std::size_t>(l)] += a.bound.probs(0, l, 0, j); }
      sigma[static_cast<std::size_t>(l)] = s;
      Sigma += e.val.alpha(l, 0) * s;
      b_Sigma += e.bound.alpha(l, 0) * to_double(s) + to_double(e.val.alpha(l, 0)) * b_sigma[static_cast<std::size_t>(l)];
      if (s > sigma[static_cast<std::size_t>(lmax)]) lmax = l;
      if (s < sigma[static_cast<std::size_t>(lmin)]) lmin = l;
      if (e.val.alpha(l, 0) > e.val.alpha(lstar, 0)) lstar = l;
    }
    const mp50 smax = sigma[static_cast<std::size_t>(lmax)], smin = sigma[static_cast<std::size_t>(lmin)];
    const double b_max = b_Sigma + b_sigma[static_cast<std::size_t>(lmax)], b_min = b_Sigma + b_sigma[static_cast<std::size_t>(lmin)];
    // the null weight by its definition, from the (exact) logits
    mp50 denom(depth_null ? 1 : 0);
    for (double g : spec.g_old) denom += exp(mp50(g));
    const mp50 a_null = depth_null ? mp50(1) / denom : mp50(0);
    mp50 total = e.val.alpha_null[0];
    double b_total = e.bound.alpha_null[0] + kEvalAllowance;
    for (index_t l = 0; l < L; ++l) { total += e.val.alpha(l, 0); b_total += e.bound.alpha(l, 0); }
    run.identity("sum_l alpha_l + alpha_null = 1", to_double(abs(total - 1)), b_total);
    run.identity("alpha_null = 1 / (1 + sum_r e^{g_r})", to_double(abs(e.val.alpha_null[0] - a_null)), e.bound.alpha_null[0] + kEvalAllowance);
    const mp50 keep = 1 - a_null, up_keep = keep * mp50(impl.loosen), lo_keep = keep / mp50(impl.loosen);
    const char* up = depth_null ? "Sigma <= (1 - alpha_null) max sigma" : "Sigma <= max sigma";
    const char* lo = depth_null ? "Sigma >= (1 - alpha_null) min sigma" : "Sigma >= min sigma";
    if (tight) {
      run.tight_margin(up, to_double(up_keep * smax - Sigma), b_max);
      run.tight_margin(lo, to_double(Sigma - lo_keep * smin), b_min);
    } else {
      run.margin(up, to_double(up_keep * smax - Sigma), b_max);
      run.margin(lo, to_double(Sigma - lo_keep * smin), b_min);
    }
    const mp50 as = e.val.alpha(lstar, 0);
    run.margin("after collapse: |Sigma - sigma_{l*}| <= 1 - alpha_{l*}",
               to_double((1 - as) - abs(Sigma - sigma[static_cast<std::size_t>(lstar)])),
               b_Sigma + b_sigma[static_cast<std::size_t>(lstar)] + e.bound.alpha(lstar, 0));
  }
}

// ---- the library and the mutants -----------------------------------------------------------------

template <class T> Implementation<T> library_implementation(ScalarTag<T>, Backend b) {
  return {library_attention<T>(b), library_route<T>(b)};
}

/// Plain softmax over depth where Softmax1 is configured (no depth null category).
template <class T> Implementation<T> depth_softmax_instead_of_softmax1(ScalarTag<T>) {
  return {library_attention<T>(), route_with_normalizer<T>(RowNorm::softmax)};
}

/// The null logit is dropped from the denominator of the real weights (alpha = softmax(g)), while
/// alpha_null is still reported as 1 / (1 + sum e^g).
template <class T> Implementation<T> null_dropped_from_denominator(ScalarTag<T>) {
  return {library_attention<T>(), [](const Tensor<T>& s, const Tensor<T>& g, const Tensor<T>& p,
                                     const std::vector<SourceKind>& k, const DepthOptions& o) {
            DepthRoute<T> r = attn_res_route<T>(s, g, p, k, o);
            if (o.normalizer == RowNorm::softmax1) {
              DepthOptions o1 = o;
              o1.normalizer = RowNorm::softmax;
              const DepthRoute<T> r0 = attn_res_route<T>(s, g, p, k, o1);
              r.alpha = r0.alpha;
              r.h = r0.h;
            }
            return r;
          }};
}

}  // namespace

Check make_lemma_5_2() {
  return define_check(
             kId, kPaperRef,
             "Sigma = sum alpha_l sigma_l lies in [min sigma, max sigma] (softmax depth) and in "
             "(1 - alpha_null) [min sigma, max sigma] (Softmax1 depth); |Sigma - sigma_{l*}| <= 1 - alpha_{l*}",
             BackendCoverage::every_available,
             [](const auto& impl, const CheckConfig& cfg, CheckRun& run) { check_statement(impl, cfg, run); },
             [](auto scalar, Backend b) { return library_implementation(scalar, b); })
      .mutant("depth_softmax_instead_of_softmax1", "no depth null category",
              [](auto scalar) { return depth_softmax_instead_of_softmax1(scalar); })
      .mutant("null_dropped_from_denominator", "alpha = softmax(g) but alpha_null = 1/(1 + sum e^g) reported",
              [](auto scalar) { return null_dropped_from_denominator(scalar); })
      .loosened_bound(1.1, "bounds 1.1 max sigma and min sigma / 1.1: the equality case must expose them")
      .check();
}

}  // namespace oasis::checks
