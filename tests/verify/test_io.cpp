// tests/verify/test_io.cpp — tensor file I/O: exact conversions, round trips, malformed files.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include "oasis/io/npy.hpp"
#include "oasis/io/safetensors.hpp"
#include "oasis_test.hpp"

namespace io = oasis::io;
using oasis::index_t;
using oasis::Tensor;

namespace {

std::string tmp_path(const std::string& leaf) {
  return ::testing::TempDir() + "oasis_io_" + std::to_string(::getpid()) + "_" + leaf;
}

// Every finite value of a 16-bit format decodes to a double that encodes back to the same bits;
// the midpoint of two neighbours rounds to the even one, and one double-ulp either side of the
// midpoint rounds to the nearer neighbour (round to nearest, ties to even, no double rounding).
template <class Dec, class Enc>
void check_16bit_format(Dec dec, Enc enc, int fraction_bits) {
  const std::uint16_t exp_mask = static_cast<std::uint16_t>(((1u << (15 - fraction_bits)) - 1u) << fraction_bits);
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const std::uint16_t bits = static_cast<std::uint16_t>(b);
    const double x = dec(bits);
    if ((bits & exp_mask) == exp_mask) {  // inf or NaN
      if (bits & ((1u << fraction_bits) - 1u)) {
        EXPECT_TRUE(std::isnan(x));
        EXPECT_TRUE(std::isnan(dec(enc(x))));
      } else {
        EXPECT_TRUE(std::isinf(x));
        EXPECT_EQ(enc(x), bits);
      }
      continue;
    }
    ASSERT_EQ(enc(x), bits) << "bits " << b << " value " << x;
    // Next larger magnitude (the pattern + 1, same sign): midpoint tests.
    const std::uint16_t nb = static_cast<std::uint16_t>(bits + 1);
    if ((nb & 0x7FFF) == 0 || (nb & exp_mask) == exp_mask) continue;
    const double y = dec(nb);
    const double mid = x / 2 + y / 2;  // exact: both are dyadic with few bits
    const std::uint16_t even = (bits & 1u) ? nb : bits;
    ASSERT_EQ(enc(mid), even) << "tie between " << x << " and " << y;
    ASSERT_EQ(enc(std::nextafter(mid, x)), bits) << "just below the midpoint of " << x << " and " << y;
    ASSERT_EQ(enc(std::nextafter(mid, y)), nb) << "just above the midpoint of " << x << " and " << y;
  }
}

}  // namespace

TEST(VerifyIo, HalfConversionIsExactAndRoundsToNearestEven) {
  check_16bit_format(io::half_bits_to_double, io::double_to_half_bits, 10);
  // Overflow threshold: 65504 is the largest finite half; the midpoint to 2^16 (65520) ties to
  // the even neighbour 2^16, i.e. infinity.
  EXPECT_EQ(io::half_bits_to_double(io::double_to_half_bits(65519.999)), 65504.0);
  EXPECT_TRUE(std::isinf(io::half_bits_to_double(io::double_to_half_bits(65520.0))));
  // Smallest subnormal 2^-24; half of it ties to zero (even).
  EXPECT_EQ(io::half_bits_to_double(io::double_to_half_bits(std::ldexp(1.0, -24))), std::ldexp(1.0, -24));
  EXPECT_EQ(io::half_bits_to_double(io::double_to_half_bits(std::ldexp(1.0, -25))), 0.0);
  EXPECT_EQ(io::double_to_half_bits(-0.0), 0x8000);
}

TEST(VerifyIo, Bfloat16ConversionIsExactAndRoundsToNearestEven) {
  check_16bit_format(io::bf16_bits_to_double, io::double_to_bf16_bits, 7);
  // Double rounding through float would get this wrong: 1 + 2^-8 + 2^-30 is above the midpoint
  // of 1 and 1 + 2^-7 but rounds to the midpoint 1 + 2^-8 in float (then ties to 1).
  const double x = 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -30);
  EXPECT_EQ(io::bf16_bits_to_double(io::double_to_bf16_bits(x)), 1.0 + std::ldexp(1.0, -7));
}

TEST(VerifyIo, UlpAndEps) {
  EXPECT_EQ(io::dtype_eps(io::DType::f16), std::ldexp(1.0, -10));
  EXPECT_EQ(io::dtype_eps(io::DType::bf16), std::ldexp(1.0, -7));
  EXPECT_EQ(io::dtype_ulp(io::DType::f32, 1.0), std::ldexp(1.0, -23));
  EXPECT_EQ(io::dtype_ulp(io::DType::f32, 3.0), std::ldexp(1.0, -22));
  EXPECT_EQ(io::dtype_ulp(io::DType::f16, 0.0), std::ldexp(1.0, -24));
  EXPECT_EQ(io::dtype_ulp(io::DType::f16, 1e-6), std::ldexp(1.0, -24));
}

// dtype_ulp and exponent_of read the exponent from the bits; they are the definitions
// 2^(max(ilogb|x|, emin) - f) (emin for 0, inf and NaN) and ilogb (finite x, zeros included) on
// every binade of double, subnormals included, both signs and every dtype.
TEST(VerifyIo, UlpFromBitsIsTheDefinition) {
  auto defined = [](io::DType d, double x) {
    if (io::is_integer(d)) return 1.0;
    const int f = io::dtype_fraction_bits(d), emin = io::dtype_min_exponent(d);
    const double ax = std::fabs(x);
    const int e = std::isfinite(ax) && ax > 0 ? std::max(std::ilogb(ax), emin) : emin;
    return std::ldexp(1.0, e - f);
  };
  std::vector<double> xs = {0.0, -0.0, std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                            std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::denorm_min(),
                            std::numeric_limits<double>::min(), std::numeric_limits<double>::max(), 65504.0, 1e-40};
  std::mt19937_64 rng(603);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  for (int e = -1074; e <= 1023; ++e)
    for (int i = 0; i < 3; ++i) xs.push_back((i == 1 ? -1.0 : 1.0) * std::ldexp(i == 2 ? 1.0 : mant(rng), e));
  for (io::DType d : {io::DType::f16, io::DType::bf16, io::DType::f32, io::DType::f64, io::DType::i32, io::DType::i64})
    for (double x : xs) ASSERT_EQ(io::dtype_ulp(d, x), defined(d, x)) << io::to_string(d) << " " << x;
  for (double x : xs)
    if (std::isfinite(x)) ASSERT_EQ(io::exponent_of(x), std::ilogb(x)) << x;
}

TEST(VerifyIo, RoundTripEveryDtypeSafetensorsAndNpy) {
  auto rng = oasis::test::make_rng(601);
  io::TensorMap m;
  const io::DType all[] = {io::DType::f16, io::DType::bf16, io::DType::f32, io::DType::f64};
  for (io::DType d : all) {
    Tensor<double> t = oasis::test::randn<double>({2, 3, 5}, rng, 3.0);
    for (index_t i = 0; i < t.size(); ++i) t[i] = io::round_to_dtype(t[i], d);
    m.emplace("t_" + std::string(io::to_string(d)), io::StoredTensor{d, t});
  }
  m.emplace("scalar", io::StoredTensor{io::DType::f32, Tensor<double>(oasis::Shape{}, std::vector<double>{2.5})});
  m.emplace("empty", io::StoredTensor{io::DType::f16, Tensor<double>(oasis::Shape{0, 4})});
  const std::string st = tmp_path("rt.safetensors");
  io::write_safetensors(st, m, {{"producer", "test"}});
  const io::TensorMap back = io::read_safetensors(st);
  ASSERT_EQ(back.size(), m.size());
  for (const auto& [name, t] : m) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_EQ(back.at(name).dtype, t.dtype) << name;
    EXPECT_TRUE(oasis::test::exactly_equal(name, back.at(name).values, t.values));
  }
  EXPECT_EQ(io::read_safetensors_metadata(st).at("producer"), "test");
  for (const auto& [name, t] : m) {
    const std::string p = tmp_path(name + (t.dtype == io::DType::bf16 ? ".bf16.npy" : ".npy"));
    io::write_npy(p, t);
    const io::StoredTensor r = io::read_npy(p);
    EXPECT_EQ(r.dtype, t.dtype) << name;
    EXPECT_EQ(r.values.shape(), t.values.shape()) << name;
    EXPECT_TRUE(oasis::test::exactly_equal(name, r.values, t.values));
    std::remove(p.c_str());
  }
  std::remove(st.c_str());
}

TEST(VerifyIo, WritingRoundsToNearestEven) {
  io::TensorMap m;
  m.emplace("x", io::StoredTensor{io::DType::f16, Tensor<double>({3}, std::vector<double>{1.0 + std::ldexp(1.0, -11),
                                                                                          1.0 + 3 * std::ldexp(1.0, -11), 1e6})});
  const io::TensorMap back = io::parse_safetensors(io::serialize_safetensors(m), "mem");
  EXPECT_EQ(back.at("x").values[0], 1.0);                           // tie -> even (1.0)
  EXPECT_EQ(back.at("x").values[1], 1.0 + std::ldexp(1.0, -9));     // tie -> even (1 + 2^-9)
  EXPECT_TRUE(std::isinf(back.at("x").values[2]));                   // overflow -> inf
}

// ---------------------------------------------------------------------------------------------
// Malformed files: each must throw io::format_error whose message names the file (and the
// tensor when the problem is in one tensor) and says what is wrong.

namespace {

std::string le64(std::uint64_t n) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  return s;
}
std::string st_file(const std::string& header, std::size_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\0');
}

::testing::AssertionResult st_rejects(const std::string& bytes, const std::string& must_contain,
                                      const std::string& tensor = "") {
  try {
    io::parse_safetensors(bytes, "bad.safetensors");
  } catch (const io::format_error& e) {
    const std::string w = e.what();
    if (w.find("bad.safetensors") == std::string::npos)
      return ::testing::AssertionFailure() << "message does not name the file: " << w;
    if (w.find(must_contain) == std::string::npos)
      return ::testing::AssertionFailure() << "message lacks '" << must_contain << "': " << w;
    if (e.tensor() != tensor)
      return ::testing::AssertionFailure() << "tensor '" << e.tensor() << "' instead of '" << tensor << "': " << w;
    return ::testing::AssertionSuccess() << w;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "wrong exception type: " << e.what();
  }
  return ::testing::AssertionFailure() << "accepted a malformed file";
}

}  // namespace

TEST(VerifyIoMalformed, SafetensorsEmptyAndTruncated) {
  EXPECT_TRUE(st_rejects("", "empty file"));
  EXPECT_TRUE(st_rejects(std::string("\x10\0\0", 3), "truncated"));
  const std::string good = st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  EXPECT_NO_THROW(io::parse_safetensors(good, "good"));
  // Truncated inside the header: the header length now exceeds what follows.
  EXPECT_TRUE(st_rejects(good.substr(0, 20), "exceeds"));
  // Truncated inside the data: the tensor's range lies beyond the buffer.
  EXPECT_TRUE(st_rejects(good.substr(0, good.size() - 3), "beyond", "a"));
}

TEST(VerifyIoMalformed, SafetensorsHeaderLies) {
  std::string lying = le64(1ull << 62) + "{}";
  EXPECT_TRUE(st_rejects(lying, "exceeds"));
  EXPECT_TRUE(st_rejects(st_file("{\"a\":1,}", 0), "malformed header"));
  EXPECT_TRUE(st_rejects(st_file("[1,2]", 0), "does not start with '{'"));
  EXPECT_TRUE(st_rejects(st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                 "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8),
                         "duplicate key"));
  EXPECT_TRUE(st_rejects(st_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8), "data_offsets", "a"));
  EXPECT_TRUE(st_rejects(st_file(std::string(200, '['), 0), "does not start"));
  EXPECT_TRUE(st_rejects(st_file("{" + std::string(200, '['), 0), "malformed header"));
}

TEST(VerifyIoMalformed, SafetensorsLyingShapesAndOffsets) {
  // shape says 3 floats, offsets hold 2
  EXPECT_TRUE(st_rejects(st_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "byte count", "a"));
  // huge shape: numel overflows / exceeds the file
  EXPECT_TRUE(st_rejects(st_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
                         "byte count", "a"));
  EXPECT_TRUE(st_rejects(st_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "non-negative", "a"));
  EXPECT_TRUE(st_rejects(st_file(R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8), "non-negative", "a"));
  // overlapping ranges
  EXPECT_TRUE(st_rejects(st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
                         "overlap", "b"));
  // out of range
  EXPECT_TRUE(st_rejects(st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 8), "beyond", "a"));
  // hole and trailing bytes
  EXPECT_TRUE(st_rejects(st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "hole", "a"));
  EXPECT_TRUE(st_rejects(st_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8), "not described"));
  EXPECT_TRUE(st_rejects(st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "begin > end", "a"));
}

TEST(VerifyIoMalformed, SafetensorsUnsupportedDtypes) {
  EXPECT_TRUE(st_rejects(st_file(R"({"w":{"dtype":"I16","shape":[4],"data_offsets":[0,8]}})", 8), "unsupported dtype", "w"));
  EXPECT_TRUE(st_rejects(st_file(R"({"w":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})", 8), "unsupported dtype", "w"));
  EXPECT_TRUE(st_rejects(st_file(R"({"w":{"dtype":"float32","shape":[2],"data_offsets":[0,8]}})", 8), "unknown dtype", "w"));
}

TEST(VerifyIoMalformed, MissingFileNamesIt) {
  try {
    io::read_safetensors("/nonexistent/dir/x.safetensors");
    FAIL() << "no exception";
  } catch (const io::format_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.safetensors"), std::string::npos) << e.what();
  }
}

namespace {

std::string npy_file(const std::string& dict, std::size_t data_bytes, int major = 1) {
  std::string h = dict;
  const std::size_t pre = major == 1 ? 10 : 12;
  while ((pre + h.size() + 1) % 64) h.push_back(' ');
  h.push_back('\n');
  std::string s("\x93NUMPY", 6);
  s.push_back(static_cast<char>(major));
  s.push_back(0);
  s.push_back(static_cast<char>(h.size() & 0xFF));
  s.push_back(static_cast<char>(h.size() >> 8));
  if (major != 1) { s.push_back(0); s.push_back(0); }
  return s + h + std::string(data_bytes, '\0');
}

::testing::AssertionResult npy_rejects(const std::string& bytes, const std::string& must_contain,
                                       const std::string& name = "bad.npy") {
  try {
    io::parse_npy(bytes, name);
  } catch (const io::format_error& e) {
    const std::string w = e.what();
    if (w.find(name) == std::string::npos) return ::testing::AssertionFailure() << "file not named: " << w;
    if (w.find(must_contain) == std::string::npos)
      return ::testing::AssertionFailure() << "message lacks '" << must_contain << "': " << w;
    return ::testing::AssertionSuccess() << w;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "wrong exception type: " << e.what();
  }
  return ::testing::AssertionFailure() << "accepted a malformed file";
}

}  // namespace

TEST(VerifyIoMalformed, NpyAll) {
  const std::string good = npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24);
  EXPECT_EQ(io::parse_npy(good, "good.npy").values.shape(), (oasis::Shape{2, 3}));
  EXPECT_EQ(io::parse_npy(npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", 24, 2), "v2.npy")
                .values.shape(), (oasis::Shape{3}));
  EXPECT_TRUE(npy_rejects("", "empty file"));
  EXPECT_TRUE(npy_rejects("\x93NUMP", "truncated"));
  EXPECT_TRUE(npy_rejects("PK\x03\x04 not an npy file", "magic"));
  EXPECT_TRUE(npy_rejects(good.substr(0, 40), "exceeds"));                      // truncated header
  EXPECT_TRUE(npy_rejects(good.substr(0, good.size() - 1), "byte count"));      // truncated data
  EXPECT_TRUE(npy_rejects(good + "xx", "byte count"));                          // trailing data
  EXPECT_TRUE(npy_rejects(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 4), }", 24), "lying shape"));
  EXPECT_TRUE(npy_rejects(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999), }", 24),
                          "byte count"));
  EXPECT_TRUE(npy_rejects(npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24), "fortran_order"));
  EXPECT_TRUE(npy_rejects(npy_file("{'descr': '<i2', 'fortran_order': False, 'shape': (2, 3), }", 12), "unsupported dtype"));
  EXPECT_TRUE(npy_rejects(npy_file("{'descr': '<u4', 'fortran_order': False, 'shape': (2, 3), }", 24), "unsupported dtype"));
  EXPECT_TRUE(npy_rejects(npy_file("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 24), "big-endian"));
  EXPECT_TRUE(npy_rejects(npy_file("{'descr': '<u2', 'fortran_order': False, 'shape': (2, 3), }", 12), "bf16.npy"));
  EXPECT_NO_THROW(io::parse_npy(npy_file("{'descr': '<u2', 'fortran_order': False, 'shape': (2, 3), }", 12), "x.bf16.npy"));
  EXPECT_TRUE(npy_rejects(npy_file("{'descr': '<f4', 'shape': (2, 3), }", 24), "must define"));
  EXPECT_TRUE(npy_rejects(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", 24), "unexpected key"));
  EXPECT_TRUE(npy_rejects(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }", 24), "non-negative"));
  EXPECT_TRUE(npy_rejects(npy_file("{'descr': '<f4', 'fortran_order': Fals", 24), "malformed .npy header"));
  EXPECT_TRUE(npy_rejects(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24, 7), "version"));
  EXPECT_THROW(io::write_npy(tmp_path("x.npy"), io::StoredTensor{io::DType::bf16, Tensor<double>({2})}), io::format_error);
}

// Token ids as integers: i32 and i64 in both formats round-trip exactly (negative values and the
// largest exact i64 included); an i64 beyond 2^53 is rejected (no exact double); a non-integer or
// out-of-range value is not written as an integer.
TEST(VerifyIo, IntegerIdsRoundTripExactlyAndRejectInexactValues) {
  const double big = io::kMaxExactInteger;
  for (io::DType d : {io::DType::i32, io::DType::i64}) {
    Tensor<double> v({2, 3});
    const double top = d == io::DType::i32 ? 2147483647.0 : big;
    const double vals[] = {0, 1, 31999, -7, top, d == io::DType::i32 ? -2147483648.0 : -big};
    for (index_t i = 0; i < 6; ++i) v[i] = vals[i];
    const io::StoredTensor t{d, v};
    const std::string np = tmp_path(std::string("ids_") + std::string(io::to_string(d)) + ".npy");
    io::write_npy(np, t);
    const io::StoredTensor r = io::read_npy(np);
    EXPECT_EQ(r.dtype, d);
    EXPECT_EQ(r.values.shape(), v.shape());
    for (index_t i = 0; i < 6; ++i) EXPECT_EQ(r.values[i], v[i]) << io::to_string(d) << " npy entry " << i;
    const io::TensorMap m = io::parse_safetensors(io::serialize_safetensors({{"ids", t}}), "ids.safetensors");
    EXPECT_EQ(m.at("ids").dtype, d);
    for (index_t i = 0; i < 6; ++i) EXPECT_EQ(m.at("ids").values[i], v[i]) << io::to_string(d) << " safetensors entry " << i;
    // not an integer, or out of the dtype's exact range: refused by both writers, naming the entry
    for (double bad : {0.5, d == io::DType::i32 ? 2147483648.0 : 2.0 * big, std::nan("")}) {
      v[2] = bad;
      EXPECT_THROW(io::serialize_npy(io::StoredTensor{d, v}, "x.npy"), io::format_error) << bad;
      EXPECT_THROW(io::serialize_safetensors({{"ids", io::StoredTensor{d, v}}}), oasis::invalid_argument) << bad;
    }
  }
  // 2^53 + 1 as raw i64 bytes: rejected by both readers, naming the entry
  std::string raw(8, '\0');
  const std::uint64_t u = (std::uint64_t(1) << 53) + 1;
  for (int i = 0; i < 8; ++i) raw[static_cast<std::size_t>(i)] = static_cast<char>((u >> (8 * i)) & 0xFF);
  std::string npy = npy_file("{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }", 0) + raw;
  EXPECT_TRUE(npy_rejects(npy, "beyond 2^53"));
  EXPECT_TRUE(st_rejects(st_file(R"({"ids":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", 0) + raw, "beyond 2^53", "ids"));
  EXPECT_EQ(io::parse_dtype("int64"), io::DType::i64);
  EXPECT_TRUE(io::is_integer(io::DType::i32));
  EXPECT_FALSE(io::is_integer(io::DType::bf16));
}

// The readers decode a tensor's bytes in one pass per dtype (load_le_array): element for element
// the bits of load_le, over random bit patterns (NaN payloads, infinities and subnormals included)
// of every dtype; an i64 entry beyond 2^53 is named by its index before anything is written.
TEST(VerifyIo, BulkDecodeIsTheElementDecode) {
  std::mt19937_64 rng(oasis::test::base_seed());
  for (io::DType d : {io::DType::f16, io::DType::bf16, io::DType::f32, io::DType::f64, io::DType::i32, io::DType::i64}) {
    const std::size_t isz = io::dtype_size(d), n = 4099;
    std::vector<unsigned char> bytes(n * isz);
    for (auto& b : bytes) b = static_cast<unsigned char>(rng());
    if (d == io::DType::i64)  // integers within 2^53: clear the top 11 bits of each entry
      for (std::size_t i = 0; i < n; ++i) bytes[i * 8 + 7] = 0, bytes[i * 8 + 6] &= 0x1F;
    std::vector<double> got(n, -1.0);
    ASSERT_EQ(io::detail::load_le_array(bytes.data(), n, d, got.data()), n) << io::to_string(d);
    for (std::size_t i = 0; i < n; ++i) {
      const double want = io::detail::load_le(bytes.data() + i * isz, d);
      std::uint64_t a, b;
      std::memcpy(&a, &got[i], 8);
      std::memcpy(&b, &want, 8);
      ASSERT_EQ(a, b) << io::to_string(d) << " entry " << i;
    }
    if (d == io::DType::i64) {
      std::fill(bytes.begin() + 777 * 8, bytes.begin() + 778 * 8, 0);
      bytes[777 * 8 + 6] = 0x20;  // 2^53: exact
      ASSERT_EQ(io::detail::load_le_array(bytes.data(), n, d, got.data()), n);
      bytes[777 * 8] |= 1;  // 2^53 + 1: the first entry beyond
      std::fill(got.begin(), got.end(), -1.0);
      EXPECT_EQ(io::detail::load_le_array(bytes.data(), n, d, got.data()), 777u);
      EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](double x) { return x == -1.0; }));
      const std::uint64_t below = ~(std::uint64_t(1) << 53);  // -(2^53) - 1, two's complement
      for (int b = 0; b < 8; ++b) bytes[777 * 8 + static_cast<std::size_t>(b)] = static_cast<unsigned char>(below >> (8 * b));
      EXPECT_EQ(io::detail::load_le_array(bytes.data(), n, d, got.data()), 777u);
    }
  }
}

// Storage asked for huge pages (oasis/core/huge_pages.hpp) is resize's: the kept prefix, the fill,
// the size, below and above the threshold, growing and shrinking; a Tensor of 64 MiB holds its fill.
TEST(VerifyIo, AdvisedStorageIsPlainStorage) {
  const std::size_t big = oasis::kHugePagesFrom / sizeof(double) + 1000;
  for (std::size_t start : {std::size_t(0), std::size_t(10), big / 2}) {
    for (std::size_t n : {std::size_t(5), std::size_t(100), big, 2 * big}) {
      std::vector<double> v(start), w(start);
      for (std::size_t i = 0; i < start; ++i) v[i] = w[i] = static_cast<double>(i) + 0.5;
      oasis::resize_advised(v, n, -2.0);
      w.resize(n, -2.0);
      ASSERT_EQ(v, w) << "from " << start << " to " << n;
    }
  }
  const Tensor<double> t({8, 1024, 1024}, 0.25);
  EXPECT_EQ(t.size(), 8 * 1024 * 1024);
  EXPECT_TRUE(std::all_of(t.data(), t.data() + t.size(), [](double x) { return x == 0.25; }));
  oasis::advise_huge_pages(nullptr, std::size_t(1) << 30);  // a hint: nothing to advise, no effect
}
