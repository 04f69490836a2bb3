// tests/verify/test_tensor16.cpp — the host's float <-> float16 / bfloat16 conversions
// (oasis/io/tensor16.hpp) against definitions that share no code with oasis/io/dtype.hpp:
//   widening   every one of the 65536 patterns of each format, against the IEEE 754 binary16
//              formula and against bfloat16 = the upper half of a binary32 pattern (and against
//              the compiler's _Float16 where it has one);
//   narrowing  round to nearest, ties to even, defined through the widened values: at every
//              midpoint of two neighbours the even one, one float ulp either side the nearer one,
//              past the largest finite value infinity; then against the classic integer rounding
//              of a binary32 pattern to bfloat16, and for float16 against a nearest-neighbour
//              search over the widened values (and _Float16) on sampled floats.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "oasis/io/tensor16.hpp"
#include "oasis_test.hpp"

namespace io = oasis::io;
using io::DType;
using oasis::index_t;
using oasis::Tensor;

namespace {

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

/// IEEE 754 binary16: sign s, exponent e (5 bits, bias 15), fraction m (10 bits).
float half_by_definition(std::uint16_t b) {
  const int s = b >> 15, e = (b >> 10) & 0x1F, m = b & 0x3FF;
  float v;
  if (e == 0) v = std::ldexp(static_cast<float>(m), -24);  // subnormal: m 2^-14 2^-10
  else if (e == 31) v = m ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else v = std::ldexp(static_cast<float>(1024 + m), e - 25);  // (1 + m/1024) 2^(e-15)
  return s ? -v : v;
}

/// bfloat16 is the upper half of a binary32 pattern.
float bf16_by_definition(std::uint16_t b) { return float_of(static_cast<std::uint32_t>(b) << 16); }

/// The classic integer rounding of a binary32 pattern to bfloat16, ties to even (not for NaN).
std::uint16_t bf16_round_by_integers(float x) {
  const std::uint32_t u = bits_of(x);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

bool same_value(float a, float b) {  // bitwise for non-NaN (keeps the sign of zero); NaN matches NaN
  return (std::isnan(a) && std::isnan(b)) || bits_of(a) == bits_of(b);
}

/// The finite non-negative values of a format in increasing order, with their patterns.
struct Ladder {
  std::vector<float> value;
  std::vector<std::uint16_t> bits;
};
Ladder ladder(float (*widen)(std::uint16_t)) {
  Ladder l;
  for (std::uint32_t b = 0; b < 0x8000; ++b) {
    const float v = widen(static_cast<std::uint16_t>(b));
    if (!std::isfinite(v)) break;  // patterns increase with the value up to infinity
    l.value.push_back(v);
    l.bits.push_back(static_cast<std::uint16_t>(b));
  }
  return l;
}

/// Round to nearest, ties to even, by search over the ladder (x finite or infinite, not NaN);
/// `overflow` is the midpoint between the largest finite value and the next power step.
std::uint16_t nearest_by_search(float x, const Ladder& l, double overflow) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const float ax = std::fabs(x);
  const std::uint16_t inf = static_cast<std::uint16_t>(l.bits.back() + 1);
  if (static_cast<double>(ax) >= overflow) return sign | inf;  // at the tie too: inf's pattern is even
  const auto hi = std::lower_bound(l.value.begin(), l.value.end(), ax);
  if (hi == l.value.end()) return sign | l.bits.back();
  const std::size_t j = static_cast<std::size_t>(hi - l.value.begin());
  if (*hi == ax || j == 0) return sign | l.bits[j];
  const double below = static_cast<double>(ax) - l.value[j - 1], above = static_cast<double>(*hi) - ax;
  if (below < above) return sign | l.bits[j - 1];
  if (above < below) return sign | l.bits[j];
  return sign | ((l.bits[j] & 1u) ? l.bits[j - 1] : l.bits[j]);
}

// The properties of round_to_bits that define round to nearest, ties to even, given the values
// of the format (already checked by the widening tests).
void expect_ties_to_even(DType t, const Ladder& l, const char* name) {
  for (std::size_t i = 0; i + 1 < l.value.size(); ++i) {
    const float x = l.value[i], y = l.value[i + 1];
    const float mid = x + (y - x) / 2;  // exact: a binary32 holds every midpoint of these formats
    ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(x) + y) / 2) << name;
    const std::uint16_t even = (l.bits[i] & 1u) ? l.bits[i + 1] : l.bits[i];
    for (const float sgn : {1.0f, -1.0f}) {
      const std::uint16_t s = sgn < 0 ? 0x8000 : 0;
      ASSERT_EQ(io::round_to_bits(sgn * x, t), s | l.bits[i]) << name << " value " << sgn * x;
      ASSERT_EQ(io::round_to_bits(sgn * mid, t), s | even) << name << " tie between " << x << " and " << y;
      ASSERT_EQ(io::round_to_bits(sgn * std::nextafter(mid, 0.0f), t), s | l.bits[i])
          << name << " just below the midpoint of " << x << " and " << y;
      ASSERT_EQ(io::round_to_bits(sgn * std::nextafter(mid, INFINITY), t), s | l.bits[i + 1])
          << name << " just above the midpoint of " << x << " and " << y;
    }
  }
}

}  // namespace

TEST(Tensor16, HalfWideningMatchesTheBinary16DefinitionForAllPatterns) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    ASSERT_TRUE(same_value(io::widen_bits(bits, DType::f16), half_by_definition(bits))) << "pattern " << b;
#if defined(__FLT16_MANT_DIG__)
    _Float16 h;
    std::memcpy(&h, &bits, sizeof h);
    ASSERT_TRUE(same_value(io::widen_bits(bits, DType::f16), static_cast<float>(h))) << "pattern " << b;
#endif
  }
}

TEST(Tensor16, Bfloat16WideningIsTheUpperHalfOfABinary32ForAllPatterns) {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    ASSERT_TRUE(same_value(io::widen_bits(bits, DType::bf16), bf16_by_definition(bits))) << "pattern " << b;
  }
}

TEST(Tensor16, HalfNarrowingRoundsToNearestTiesToEven) {
  const Ladder l = ladder(half_by_definition);
  ASSERT_EQ(l.value.back(), 65504.0f);
  expect_ties_to_even(DType::f16, l, "f16");
  // Past the largest finite value: the midpoint to 2^16 (65520) ties to the even pattern, infinity.
  EXPECT_EQ(io::round_to_bits(std::nextafter(65520.0f, 0.0f), DType::f16), 0x7BFF);
  EXPECT_EQ(io::round_to_bits(65520.0f, DType::f16), 0x7C00);
  EXPECT_EQ(io::round_to_bits(-INFINITY, DType::f16), 0xFC00);
  EXPECT_TRUE(std::isnan(io::widen_bits(io::round_to_bits(std::nanf(""), DType::f16), DType::f16)));
  // Sampled floats against the search over the widened values (and the compiler's _Float16).
  std::mt19937_64 rng = oasis::test::make_rng(1601);
  std::uniform_int_distribution<int> exponent(-28, 17);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = std::ldexp(mantissa(rng), exponent(rng)) * (i % 2 ? -1.0f : 1.0f);
    const std::uint16_t got = io::round_to_bits(x, DType::f16);
    ASSERT_EQ(got, nearest_by_search(x, l, 65520.0)) << "x = " << x;
#if defined(__FLT16_MANT_DIG__)
    const _Float16 h = static_cast<_Float16>(x);
    std::uint16_t hb;
    std::memcpy(&hb, &h, sizeof hb);
    ASSERT_EQ(got, hb) << "x = " << x;
#endif
  }
}

TEST(Tensor16, Bfloat16NarrowingRoundsToNearestTiesToEven) {
  const Ladder l = ladder(bf16_by_definition);
  expect_ties_to_even(DType::bf16, l, "bf16");
  EXPECT_EQ(io::round_to_bits(std::numeric_limits<float>::max(), DType::bf16), 0x7F80);  // above the last tie: inf
  EXPECT_TRUE(std::isnan(io::widen_bits(io::round_to_bits(std::nanf(""), DType::bf16), DType::bf16)));
  // Against the integer rounding of the binary32 pattern: around every bfloat16 value (the value,
  // one below, the tie, one above, the last below the next) and at random.
  for (std::uint32_t hi = 0; hi < 0x10000; ++hi) {
    if (((hi >> 7) & 0xFF) == 0xFF) continue;  // inf and NaN patterns
    for (const std::uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      const float x = float_of(hi << 16 | lo);
      if (!std::isfinite(x)) continue;
      ASSERT_EQ(io::round_to_bits(x, DType::bf16), bf16_round_by_integers(x)) << "pattern " << (hi << 16 | lo);
    }
  }
  std::mt19937 rng(1602);
  for (int i = 0; i < 200000; ++i) {
    const float x = float_of(rng());
    if (std::isnan(x)) continue;
    ASSERT_EQ(io::round_to_bits(x, DType::bf16), bf16_round_by_integers(x)) << "x = " << x;
  }
}

TEST(Tensor16, TensorsRoundWithinUnitRoundoffAndWidenExactly) {
  std::mt19937_64 rng = oasis::test::make_rng(1603);
  const Tensor<float> x = oasis::test::randn<float>({4096}, rng, 10.0);
  for (const DType t : {DType::f16, DType::bf16}) {
    const io::Tensor16 r = io::round_to(x, t);
    ASSERT_EQ(r.shape, x.shape());
    const Tensor<float> y = io::widen(r);
    const double u = t == DType::f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    for (index_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(y[i], io::widen_bits(r.bits[static_cast<std::size_t>(i)], t));
      const double ax = std::abs(static_cast<double>(x[i]));  // f16 normal range starts at 2^-14
      EXPECT_LE(std::abs(static_cast<double>(y[i]) - x[i]), ax >= 6.2e-5 ? u * ax : 6e-8) << io::to_string(t) << " " << i;
    }
  }
}

TEST(Tensor16, OtherDtypesAndShortStorageAreRejectedByName) {
  using oasis::test::thrown_argument;
  EXPECT_EQ(thrown_argument([] { io::round_to_bits(1.0f, DType::f32); }), "dtype");
  EXPECT_EQ(thrown_argument([] { io::widen_bits(0, DType::f64); }), "dtype");
  EXPECT_EQ(thrown_argument([] { io::round_to(Tensor<float>({2}), DType::f32); }), "dtype");
  io::Tensor16 t{DType::bf16, {2, 3}, std::vector<std::uint16_t>(5)};
  EXPECT_EQ(thrown_argument([&] { io::widen(t); }), "bits");
}
