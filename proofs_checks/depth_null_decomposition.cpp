// proofs_checks/depth_null_decomposition.cpp — the depth null attenuates, it is not an identity
// shortcut (§4.3; docs/spec.md §3).
//
// With depth Softmax1 (alpha_null = 1 - sum_i alpha_i) and h = sum_i alpha_i s_i, for ANY
// reference state h_ref:
//     h - h_ref = sum_i alpha_i (s_i - h_ref) - alpha_null h_ref,
// and sum_i alpha_i + alpha_null = 1. In the limit of very negative logits, h -> 0 (not h_ref).
// Checked with the OASIS coupling on (either centring convention) and for plain softmax depth
// (alpha_null = 0).
#include "statements.hpp"
#include "support.hpp"

namespace oasis::checks {
namespace {
using namespace detail;

const char* const kId = "depth_null_decomposition";
const char* const kPaperRef = "§4.3 depth null value = 0 (docs/spec.md §3): h - h_ref = sum a_i (s_i - h_ref) - a_null h_ref";

template <class T> struct Implementation {
  RouteFn<T> route;
};

template <class T> void check_statement(const Implementation<T>& impl, const CheckConfig& cfg, CheckRun& run) {
  using std::abs;
  Rng rng(seed_for(cfg, kId));
  const int count = instances_for<T>(cfg);
  for (int it = 0; it < count; ++it) {
    const bool limit = it % 8 == 7;  // all depth logits very negative
    RouteSpec spec;
    spec.n = rng.integer(1, 8);
    spec.N = rng.integer(1, 3);
    spec.d = rng.integer(1, 5);
    spec.kinds.push_back(SourceKind::initial);
    for (index_t i = 1; i < spec.n; ++i) spec.kinds.push_back(rng.integer(0, 2) ? SourceKind::attention : SourceKind::headless);
    for (index_t i = 0; i < spec.n * spec.N * spec.d; ++i) spec.sources.push_back(rounded<T>(rng.normal(1.0)));
    const double shift = limit ? -40.0 : rng.uniform(-6.0, 4.0);
    for (index_t i = 0; i < spec.n * spec.N; ++i) {
      spec.g_old.push_back(rounded<T>(rng.normal(2.0) + shift));
      spec.psi.push_back(rounded<T>(rng.uniform(0.0, 1.0)));
    }
    std::vector<double> href(static_cast<std::size_t>(spec.N * spec.d));
    for (double& x : href) x = rounded<T>(rng.normal(1.5));
    const bool depth_null = limit || it % 4 != 1;
    spec.opt.normalizer = depth_null ? RowNorm::softmax1 : RowNorm::softmax;
    spec.opt.coupling = it % 2 == 0;
    if (rng.integer(0, 1)) spec.opt.coupling_options = CouplingOptions::authors_code();
    spec.opt.beta = rng.uniform(0.0, 3.0);
    run.begin_instance(it, false, limit ? "all depth logits -> -inf" : std::string(to_string(spec.opt.normalizer)));
    const RouteEval e = route<T>(run, impl.route, spec);
    for (index_t tok = 0; tok < spec.N; ++tok) {
      const mp50 an = e.val.alpha_null[tok];
      mp50 total = an;
      double b_total = e.bound.alpha_null[tok] + kEvalAllowance;
      for (index_t i = 0; i < spec.n; ++i) { total += e.val.alpha(i, tok); b_total += e.bound.alpha(i, tok); }
      run.identity("sum_i alpha_i + alpha_null = 1", to_double(abs(total - 1)), b_total);
      if (!depth_null) run.identity("softmax depth: alpha_null = 0", to_double(abs(an)), 0.0);
      for (index_t c = 0; c < spec.d; ++c) {
        const mp50 hr(href[static_cast<std::size_t>(tok * spec.d + c)]);
        mp50 rhs = -an * hr, scale = abs(an * hr) + abs(hr);
        double allowed = e.bound.h(tok, c) + e.bound.alpha_null[tok] * to_double(abs(hr));
        for (index_t i = 0; i < spec.n; ++i) {
          const mp50 u = mp50(spec.sources[static_cast<std::size_t>((i * spec.N + tok) * spec.d + c)]) - hr;
          rhs += e.val.alpha(i, tok) * u;
          scale += abs(e.val.alpha(i, tok) * u);
          allowed += e.bound.alpha(i, tok) * to_double(abs(u));
        }
        const mp50 lhs = e.val.h(tok, c) - hr;
        run.identity("h - h_ref = sum_i alpha_i (s_i - h_ref) - alpha_null h_ref", to_double(abs(lhs - rhs)),
                     allowed + kEvalAllowance * (1 + to_double(scale)));
        if (limit) {
          // h -> 0, not h_ref: |h_c| <= (1 - alpha_null) max_i |s_ic|
          mp50 smax(0);
          for (index_t i = 0; i < spec.n; ++i)
            smax = std::max(smax, abs(mp50(spec.sources[static_cast<std::size_t>((i * spec.N + tok) * spec.d + c)])));
          run.margin("all logits -> -inf: |h| <= (1 - alpha_null) max |s|", to_double((1 - an) * smax - abs(e.val.h(tok, c))),
                     e.bound.h(tok, c) + e.bound.alpha_null[tok] * to_double(smax) + kEvalAllowance);
        }
      }
    }
  }
}

// ---- the library and the mutants -----------------------------------------------------------------

template <class T> Implementation<T> library_implementation(ScalarTag<T>, Backend b) { return {library_route<T>(b)}; }

template <class T> Implementation<T> depth_null_as_identity(ScalarTag<T>) { return {route_with_null_as_identity<T>()}; }

/// The null weight is not reported (alpha_null = 0) although Softmax1 weights are used.
template <class T> Implementation<T> null_weight_not_reported(ScalarTag<T>) {
  return {[](const Tensor<T>& s, const Tensor<T>& g, const Tensor<T>& p, const std::vector<SourceKind>& k,
             const DepthOptions& o) {
    DepthRoute<T> r = attn_res_route<T>(s, g, p, k, o);
    for (index_t t = 0; t < r.alpha_null.size(); ++t) r.alpha_null[t] = T(0);
    return r;
  }};
}

}  // namespace

Check make_depth_null_decomposition() {
  return define_check(
             kId, kPaperRef,
             "h - h_ref = sum_i alpha_i (s_i - h_ref) - alpha_null h_ref for any h_ref; sum alpha + alpha_null = 1; "
             "h -> 0 as all depth logits -> -inf",
             BackendCoverage::every_available,
             [](const auto& impl, const CheckConfig& cfg, CheckRun& run) { check_statement(impl, cfg, run); },
             [](auto scalar, Backend b) { return library_implementation(scalar, b); })
      .mutant("depth_null_as_identity", "h = sum alpha_i s_i + alpha_null s_{n-1}",
              [](auto scalar) { return depth_null_as_identity(scalar); })
      .mutant("null_weight_not_reported", "alpha_null reported as 0",
              [](auto scalar) { return null_weight_not_reported(scalar); })
      .check();
}

}  // namespace oasis::checks
