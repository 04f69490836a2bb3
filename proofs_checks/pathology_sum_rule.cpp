// proofs_checks/pathology_sum_rule.cpp — Definitions 5.1/5.2 (pathology scores) and the sum rule
// of Proposition 5.1 (App. C.2, Assumption D.4).
//
//   S^AR = L^AR + lambda1 C^AR + lambda2 E^AR,   S^V = L^V + lambda1 C^V + lambda2 E^V   (definitions)
//   sum rule: lambda1, lambda2 >= 0 and L^AR >= L^V, C^AR >= C^V, E^AR >= E^V  =>  S^AR >= S^V.
// The check evaluates the library's pathology_score / vanilla_pathology_score (oasis/research/pathology.hpp)
// against the definitions recomputed in mp50, and the sum rule on instances built to satisfy the
// three component inequalities (the assumption is constructed, not tested on a model):
//   vanilla p = softmax(z) with its argmax j* in the irrelevant set N (the runner-up outside it); every AttnResidual branch
//   row is q_l = (1 - theta_l) p + theta_l e_{j*}, which majorises p (more leakage, a larger
//   maximum, less entropy); depth weights are concentrated softmax weights. Instances where
//   -H(alpha) spoils E^AR >= E^V are replaced by the collapsed case alpha = (1).
// Equality: alpha = (1), q = p, where S^AR = S^V.
#include "oasis/research/pathology.hpp"
#include "statements.hpp"
#include "support.hpp"

namespace oasis::checks {
namespace {
using namespace detail;

const char* const kId = "pathology_sum_rule";
const char* const kPaperRef = "Definitions 5.1, 5.2 and Proposition 5.1 (§5, App. C.2, Assumption D.4)";

template <class T> struct Implementation {
  std::function<T(const Vec<T>&, const Mat<T>&, const std::vector<bool>&, const T&, const T&)> score;
  std::function<T(const Vec<T>&, const std::vector<bool>&, const T&, const T&)> vanilla;
};

template <class T> Implementation<T> library_implementation(ScalarTag<T>, Backend) {
  return {[](const Vec<T>& a, const Mat<T>& p, const std::vector<bool>& N, const T& l1, const T& l2) {
            return pathology_score<T>(a, p, N, l1, l2);
          },
          [](const Vec<T>& p, const std::vector<bool>& N, const T& l1, const T& l2) {
            return vanilla_pathology_score<T>(p, N, l1, l2);
          }};
}

/// The three terms by their definitions, in mp50, plus the magnitudes the error bound needs.
struct Terms {
  mp50 L, C, E;
  mp50 entropy_mass;  ///< H(alpha) + sum_l alpha_l H(p_l) >= 0
};

inline mp50 entropy_mp50(const std::vector<mp50>& x) {
  using std::log;
  mp50 h(0);
  for (const mp50& v : x) if (v > 0) h -= v * log(v);
  return h;
}

inline Terms terms_mp50(const std::vector<mp50>& alpha, const std::vector<std::vector<mp50>>& q, const std::vector<bool>& N) {
  Terms t{mp50(0), mp50(0), mp50(0), mp50(0)};
  const mp50 Ha = entropy_mp50(alpha);
  t.E = -Ha;
  t.entropy_mass = Ha;
  for (std::size_t l = 0; l < alpha.size(); ++l) {
    mp50 leak(0);
    for (std::size_t j = 0; j < q[l].size(); ++j) {
      if (N[j]) leak += q[l][j];
      if (alpha[l] * q[l][j] > t.C) t.C = alpha[l] * q[l][j];
    }
    t.L += alpha[l] * leak;
    const mp50 Hl = entropy_mp50(q[l]);
    t.E -= alpha[l] * Hl;
    t.entropy_mass += alpha[l] * Hl;
  }
  return t;
}

/// Bound on |S computed in T - S exact| (docs/paper-map.md, error model of the pathology score).
template <class T> double score_bound(const Terms& t, int L, int m, double l1, double l2) {
  const double u = bounds::Precision::of<T>().u;
  return bounds::kSecondOrder * u *
             ((m + L + 4) * to_double(t.L) + 4 * l1 * to_double(t.C) + l2 * (m + L + 8) * to_double(t.entropy_mass)) *
             mp50_rounding_factor<T>() +
         (1 + l1 + l2) * 1e3 * static_cast<double>(std::numeric_limits<T>::min());
}

template <class T> void check_statement(const Implementation<T>& impl, const CheckConfig& cfg, CheckRun& run) {
  Rng rng(seed_for(cfg, kId));
  const int count = instances_for<T>(cfg);
  for (int it = 0; it < count; ++it) {
    const bool tight = it % 4 == 3;
    const int m = rng.integer(2, 10);
    Vec<T> z(m);
    for (int j = 0; j < m; ++j) z[j] = T(rng.normal(2.0));
    const Vec<T> p = softmax<T>(z).p;  // the library's normaliser
    int jstar = 0;
    for (int j = 1; j < m; ++j) if (p[j] > p[jstar]) jstar = j;
    std::vector<bool> N(static_cast<std::size_t>(m));
    // N holds the argmax and never the runner-up, so leakage grows by theta (1 - L^V) >= theta p_2nd,
    // well above rounding (with N = every key the leakage inequality would be an equality).
    int second = jstar == 0 ? 1 : 0;
    for (int j = 0; j < m; ++j) if (j != jstar && p[j] > p[second]) second = j;
    for (int j = 0; j < m; ++j) N[static_cast<std::size_t>(j)] = j == jstar || (j != second && rng.integer(0, 2) == 0);
    const double l1 = rng.integer(0, 8) / 4.0, l2 = rng.integer(0, 8) / 4.0;

    int L = tight ? 1 : rng.integer(1, 5);
    auto build = [&](int layers, bool collapsed) {
      Mat<T> Q(layers, m);
      for (int l = 0; l < layers; ++l) {
        const double th = tight ? 0.0 : rng.uniform(0.05, 0.9);
        const T thT(th);  // in T arithmetic, so that theta = 0 gives q = p exactly
        for (int j = 0; j < m; ++j) Q(l, j) = (T(1) - thT) * p[j] + (j == jstar ? thT : T(0));
      }
      Vec<T> alpha(layers);
      if (collapsed || layers == 1) {
        alpha = Vec<T>::Ones(layers) / T(layers);
      } else {
        Vec<T> g(layers);
        for (int l = 0; l < layers; ++l) g[l] = T(l == 0 ? 12.0 : rng.normal(1.0));
        alpha = softmax<T>(g).p;
      }
      return std::make_pair(alpha, Q);
    };
    auto [alpha, Q] = build(L, false);
    auto to_terms = [&](const Vec<T>& a, const Mat<T>& q) {
      std::vector<mp50> alpha_mp;
      std::vector<std::vector<mp50>> q_mp;
      for (index_t l = 0; l < a.size(); ++l) {
        alpha_mp.push_back(to_mp50(a[l]));
        q_mp.emplace_back();
        for (index_t j = 0; j < q.cols(); ++j) q_mp.back().push_back(to_mp50(q(l, j)));
      }
      return terms_mp50(alpha_mp, q_mp, N);
    };
    std::vector<mp50> p_mp;
    for (int j = 0; j < m; ++j) p_mp.push_back(to_mp50(p[j]));
    const Terms V = terms_mp50({mp50(1)}, {p_mp}, N);
    Terms A = to_terms(alpha, Q);
    const bool assumption = A.L >= V.L && A.C >= V.C && A.E >= V.E;
    if (!assumption) {  // collapsed depth: alpha = (1) on one majorising row
      L = 1;
      std::tie(alpha, Q) = build(1, true);
      A = to_terms(alpha, Q);
    }
    run.begin_instance(it, tight, "L = " + std::to_string(L));
    if (!(A.L >= V.L && A.C >= V.C && A.E >= V.E)) {
      run.fail("construction", "Assumption D.4 does not hold on the constructed instance: L ", to_double(A.L - V.L), ", C ",
               to_double(A.C - V.C), ", E ", to_double(A.E - V.E));
      continue;
    }
    const T l1T(l1), l2T(l2);
    const mp50 S_ar = to_mp50(impl.score(alpha, Q, N, l1T, l2T));
    const mp50 S_v = to_mp50(impl.vanilla(p, N, l1T, l2T));
    const double b_ar = score_bound<T>(A, L, m, l1, l2), b_v = score_bound<T>(V, 1, m, l1, l2);
    using std::abs;
    // the library's scores against the definitions evaluated in mp50 (worst_error)
    run.error("Definition 5.1: S = L + lambda1 C + lambda2 E", to_double(abs(S_ar - (A.L + l1 * A.C + l2 * A.E))), b_ar + kEvalAllowance);
    run.error("Definition 5.2: S^V = L^V + lambda1 C^V + lambda2 E^V", to_double(abs(S_v - (V.L + l1 * V.C + l2 * V.E))),
              b_v + kEvalAllowance);
    if (tight) run.tight_margin("Proposition 5.1 sum rule: S^AR >= S^V", to_double(S_ar - S_v), b_ar + b_v + kEvalAllowance);
    else run.margin("Proposition 5.1 sum rule: S^AR >= S^V", to_double(S_ar - S_v), b_ar + b_v + kEvalAllowance);
  }
}

// ---- the library and the mutants -----------------------------------------------------------------

template <class T> Implementation<T> entropy_sign_flipped(ScalarTag<T> scalar) {
  Implementation<T> m = library_implementation(scalar, Backend::reference);
  m.score = [](const Vec<T>& a, const Mat<T>& p, const std::vector<bool>& N, const T& l1, const T& l2) {
    const PathologyTerms<T> t = pathology_terms<T>(a, p, N);
    return t.leakage + l1 * t.concentration - l2 * t.entropy_collapse;
  };
  return m;
}

template <class T> Implementation<T> leakage_not_depth_weighted(ScalarTag<T> scalar) {
  Implementation<T> m = library_implementation(scalar, Backend::reference);
  m.score = [](const Vec<T>& a, const Mat<T>& p, const std::vector<bool>& N, const T& l1, const T& l2) {
    const PathologyTerms<T> t = pathology_terms<T>(a, p, N);
    T leak(0);
    for (index_t l = 0; l < p.rows(); ++l)
      for (index_t j = 0; j < p.cols(); ++j) if (N[static_cast<std::size_t>(j)]) leak += p(l, j);
    return leak + l1 * t.concentration + l2 * t.entropy_collapse;
  };
  return m;
}

template <class T> Implementation<T> concentration_ignores_depth(ScalarTag<T> scalar) {
  Implementation<T> m = library_implementation(scalar, Backend::reference);
  m.score = [](const Vec<T>& a, const Mat<T>& p, const std::vector<bool>& N, const T& l1, const T& l2) {
    const PathologyTerms<T> t = pathology_terms<T>(a, p, N);
    T c(0);
    for (index_t l = 0; l < p.rows(); ++l)
      for (index_t j = 0; j < p.cols(); ++j) if (p(l, j) > c) c = p(l, j);
    return t.leakage + l1 * c + l2 * t.entropy_collapse;
  };
  return m;
}

}  // namespace

Check make_pathology_sum_rule() {
  return define_check(
             kId, kPaperRef,
             "pathology_score / vanilla_pathology_score equal their definitions; L, C, E dominance with "
             "lambda >= 0 gives S^AR >= S^V (equality when collapsed onto the vanilla row)",
             BackendCoverage::reference_only,
             [](const auto& impl, const CheckConfig& cfg, CheckRun& run) { check_statement(impl, cfg, run); },
             [](auto scalar, Backend b) { return library_implementation(scalar, b); })
      .mutant("entropy_sign_flipped", "S = L + lambda1 C - lambda2 E",
              [](auto scalar) { return entropy_sign_flipped(scalar); })
      .mutant("leakage_not_depth_weighted", "L = sum_l sum_{j in N} p_lj",
              [](auto scalar) { return leakage_not_depth_weighted(scalar); })
      .mutant("concentration_ignores_depth", "C = max_{l,j} p_lj",
              [](auto scalar) { return concentration_ignores_depth(scalar); })
      .check();
}

}  // namespace oasis::checks
