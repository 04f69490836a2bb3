// Consumer of the installed package: reproduces the docs/spec.md §3 teaching example and a Softmax1 row.
#include <cmath>
#include <cstdio>

#include <oasis/oasis.hpp>

int main() {
  using namespace oasis;
  Vec<double> g = Vec<double>::Zero(3), psi(3);
  psi << 0.0, 0.8, 0.2;
  DepthOptions opt = depth_options(Variant::oasis);
  opt.beta = 1.0;
  const auto w = depth_weights(g, psi, {SourceKind::initial, SourceKind::attention, SourceKind::attention}, opt);
  const double expect[4] = {0.244458, 0.181099, 0.329984, 0.244458};
  const double got[4] = {w.alpha[0], w.alpha[1], w.alpha[2], w.alpha_null};
  int bad = 0;
  for (int i = 0; i < 4; ++i) {
    std::printf("alpha[%d] = %.6f\n", i, got[i]);
    bad += std::abs(got[i] - expect[i]) > 1e-6;
  }
  Vec<mp50> z(2);
  z << 1, 2;
  const auto r = softmax1(z);
  std::printf("softmax1([1,2]) p_null = %.12f\n", to_double(r.p_null));
  bad += std::abs(to_double(r.p_null) - 1.0 / (1.0 + std::exp(1.0) + std::exp(2.0))) > 1e-15;
  std::printf(bad ? "consumer: FAILED\n" : "consumer: OK\n");
  return bad ? 1 : 0;
}
