// Fast CPU path, run-time choices: the vectorised exp of every ISA variant within its documented
// error; unknown variants and streamings rejected, the defaults (widest ISA, streaming by vendor).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "cpu_fast_test.hpp"

using namespace oasis;
using namespace oasis::cpu_fast_test;

namespace {

// vector_exp: relative error against double exp on a strided sweep of every float with a
// normal result (1 of every 101 consecutive bit patterns, ~21 M points) and exact special values.
// The subnormal range has an absolute error below the smallest subnormal.
TEST(CpuFastExp, WithinDocumentedErrorForEveryIsa) {
  // The error model's exp (docs/tolerances.md, "Fused kernels") is within 2 u relative;
  // docs/benchmarks.md: exhaustively measured maximum 7.71e-8 (FMA variants) and 9.90e-8 (baseline).
  constexpr double kMaxRel = 0x1p-23;
  IsaGuard guard;
  std::vector<float> x, y;
  auto bits_of = [](float f) { std::uint32_t b; std::memcpy(&b, &f, 4); return b; };
  auto from_bits = [](std::uint32_t b) { float f; std::memcpy(&f, &b, 4); return f; };
  for (std::uint32_t b = 0; b <= bits_of(88.72f); b += 101) x.push_back(from_bits(b));
  for (std::uint32_t b = bits_of(-0.0f); b <= bits_of(-87.33f); b += 101) x.push_back(from_bits(b));
  y.resize(x.size());
  for (const std::string& isa : cpu_fast::available_isas()) {
    SCOPED_TRACE("isa " + isa);
    cpu_fast::set_isa(isa);
    cpu_fast::vector_exp(x.data(), y.data(), static_cast<index_t>(x.size()));
    double worst = 0, at = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double e = std::exp(static_cast<double>(x[i]));
      const double rel = std::abs(static_cast<double>(y[i]) - e) / e;
      if (rel > worst) { worst = rel; at = x[i]; }
    }
    EXPECT_LE(worst, kMaxRel) << "at x = " << at;
    // subnormal results: absolute error at most one subnormal step
    for (float v = -87.4f; v > -104.5f; v -= 0.01f) {
      float out;
      cpu_fast::vector_exp(&v, &out, 1);
      ASSERT_LE(std::abs(static_cast<double>(out) - std::exp(static_cast<double>(v))),
                static_cast<double>(std::numeric_limits<float>::denorm_min())) << "x = " << v;
    }
    {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3e", worst);
      RecordProperty("exp_max_rel_" + isa, buf);
    }
    const float special[] = {0.0f, -0.0f, -std::numeric_limits<float>::infinity(), -105.0f, 89.0f,
                             std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
    float out[7];
    cpu_fast::vector_exp(special, out, 7);
    EXPECT_TRUE(std::isnan(out[6])) << out[6];  // the attention kernel's overflow check relies on it
    EXPECT_EQ(out[0], 1.0f);
    EXPECT_EQ(out[1], 1.0f);
    EXPECT_EQ(out[2], 0.0f);
    EXPECT_EQ(out[3], 0.0f);
    EXPECT_TRUE(std::isinf(out[4]) && out[4] > 0);
    EXPECT_TRUE(std::isinf(out[5]) && out[5] > 0);
  }
}

TEST(CpuFastIsa, UnknownVariantIsRejected) {
  EXPECT_THROW(cpu_fast::set_isa("avx9000"), invalid_argument);
  const std::vector<std::string> isas = cpu_fast::available_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.back(), "generic");
  if (!std::getenv("OASIS_CPU_FAST_ISA")) EXPECT_EQ(std::string(cpu_fast::isa()), isas.front());  // widest by default
}

TEST(CpuFastRouteStreams, UnknownStreamingIsRejectedAndTheDefaultFollowsTheVendor) {
  const Thrown t = thrown_by([] { cpu_fast::set_route_streams("octets-l3"); });
  EXPECT_TRUE(t.threw);
  EXPECT_EQ(t.argument, "route_streams");
  EXPECT_NE(t.what.find("pairs-l2"), std::string::npos) << t.what;  // the message lists the choices
  const std::vector<std::string> all = cpu_fast::available_route_streams();
  EXPECT_EQ(all, (std::vector<std::string>{"pairs-l2", "quads-l1"}));
  if (!std::getenv("OASIS_CPU_FAST_ROUTE_STREAMS")) {
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line, vendor;
    while (vendor.empty() && std::getline(cpuinfo, line))
      if (line.rfind("vendor_id", 0) == 0) vendor = line.substr(line.find(':') + 1);
    const bool amd = vendor.find("AuthenticAMD") != std::string::npos;
    EXPECT_EQ(std::string(cpu_fast::route_streams()), amd ? "quads-l1" : "pairs-l2") << "vendor" << vendor;
  }
}

}  // namespace
