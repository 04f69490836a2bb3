#include <gtest/gtest.h>
#include "oasis/oasis.hpp"
TEST(Smoke, TeachingExample) {
  using namespace oasis;
  Vec<double> g = Vec<double>::Zero(3), psi(3); psi << 0, 0.8, 0.2;
  DepthOptions o = depth_options(Variant::oasis); o.beta = 1.0;
  auto w = depth_weights(g, psi, {SourceKind::initial, SourceKind::attention, SourceKind::attention}, o);
  EXPECT_NEAR(w.alpha[1], 0.1811, 1e-4);
}
