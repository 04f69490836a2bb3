// The zoo of depth-routing backward implementations (docs/spec.md §8): an independent backward
// written from the contract passes, and each injected mistake fails both the finite-difference
// check (depth_grad_support.hpp) and `oasis-verify compare` (op depth_backward); the Kimi
// RMSNorm and router mutants fail the finite-difference check.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>

#include "depth_zoo.hpp"
#include "oasis/verify/compare.hpp"
#include "router_grad_support.hpp"

using namespace oasis;
using namespace oasis::depth_grad_test;

namespace {

using Mutant = DepthMutant;

verify::CompareReport compare_float(const DepthInstance& I, const DepthGrads<float>& g) { return compare_depth(I, g); }

/// The zoo's instances: paper_v2 with dalpha_null (centring, D, theta), and the authors' clamps
/// with the score clamp and the beta cap active.
std::vector<DepthInstance> zoo_instances() {
  return {make_depth(zoo_case_paper(), base_seed() + 90), make_depth(zoo_case_clamps(), base_seed() + 91)};
}

}  // namespace

TEST(DepthBackwardZoo, CorrectImplementationsPass) {
  for (const DepthInstance& I : zoo_instances()) {
    const fd::Summary s = fd_check_depth(I, zoo_depth_backward<R>(I, Mutant::none));
    EXPECT_TRUE(s.ok()) << s.first;
    for (const verify::CompareReport& r :
         {compare_float(I, zoo_depth_backward<float>(I, Mutant::none)),
          compare_float(I, attn_res_route_backward(I.sources.cast<float>(), I.g_old.cast<float>(), I.psi.cast<float>(),
                                                   I.kinds, I.opt, depth_cot<float>(I)))})
      EXPECT_TRUE(r.passed) << verify::format_report(r);
  }
}

TEST(DepthBackwardZoo, EveryMutantFailsBothChecks) {
  const std::vector<DepthInstance> zoo = zoo_instances();
  for (Mutant mu : {Mutant::clamp_passes_through, Mutant::cap_passes_through, Mutant::beta_sign_flipped,
                    Mutant::centring_mean_dropped, Mutant::d_without_null, Mutant::theta_without_sigmoid,
                    Mutant::dalpha_null_dropped, Mutant::mix_without_null}) {
    SCOPED_TRACE(name_of(mu));
    bool fd_caught = false, cmp_caught = false;
    std::string failed;
    for (const DepthInstance& I : zoo) {
      fd_caught = fd_caught || !fd_check_depth(I, zoo_depth_backward<R>(I, mu), 1).ok();
      const verify::CompareReport r = compare_float(I, zoo_depth_backward<float>(I, mu));
      cmp_caught = cmp_caught || !r.passed;
      for (const auto& t : r.tensors)
        if (!t.passed) failed += " " + t.name + " (err/bound " + std::to_string(t.worst_ratio) + ")";
    }
    EXPECT_TRUE(fd_caught) << "the finite-difference check missed " << name_of(mu);
    EXPECT_TRUE(cmp_caught) << "compare missed " << name_of(mu);
    std::printf("mutant %-38s FD: %s; compare FAIL:%s\n", name_of(mu), fd_caught ? "FAIL" : "pass", failed.c_str());
  }
}

TEST(DepthBackwardZoo, KimiMutantsFail) {
  // RMSNorm backward without its projection term, and a router whose sources miss the key path.
  KimiInstance K = make_kimi(3, 2, 4, true, base_seed() + 95);
  PseudoQueryGrads<R> g = pseudo_query_logits_backward(K.sources.cast<R>(), K.w.cast<R>(), K.gain.cast<R>(),
                                                       K.dg.cast<R>(), K.opt);
  for (index_t i = 0; i < 3; ++i)
    for (index_t t = 0; t < 2; ++t) {  // projection dropped: ds = inv gain w dg
      double ss = 0;
      for (index_t c = 0; c < 4; ++c) ss += K.sources(i, t, c) * K.sources(i, t, c);
      const R inv = R(1) / boost::multiprecision::sqrt(R(ss) / 4 + R(K.opt.eps));
      for (index_t c = 0; c < 4; ++c) g.sources(i, t, c) = inv * R(K.gain[c]) * R(K.w[c]) * R(K.dg(i, t));
    }
  EXPECT_FALSE(fd_check_kimi(K, g, 1).ok()) << "rms_projection_dropped";
  const RouterInstance X = make_router(false, "iaha", true, base_seed() + 96);
  model::RouteGrads<R> rg = router_backward<R>(X);
  rg.sources = rg.depth.sources;  // the sources' key path dropped
  EXPECT_FALSE(fd_check_router(X, rg, 1).ok()) << "router_sources_without_key_gradient";
}
