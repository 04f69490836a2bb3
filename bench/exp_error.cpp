// bench/exp_error.cpp — oasis_exp_error: the exhaustive error measurement of the fast kernels'
// exp (cpu_fast::vector_exp) quoted in docs/benchmarks.md, "Vectorised exp: error". For every
// float x whose e^x is a normal float (x in [-87.3365, 88.7228], about 2.2 x 10^9 inputs) and for
// each ISA variant this CPU runs (or those named as arguments), against std::exp in double: the
// largest relative error, and the largest error in ulps of the exact value (ulp = 2^(e - 23) for
// an exact value in [2^e, 2^(e+1))), and a digest of every result's bits (equal digests: the
// variants agree bitwise on the whole range). About a minute per variant with one thread
// (OpenMP: in parallel over blocks of inputs). Exit 2 for an unknown variant.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "oasis/backends/cpu_fast.hpp"
#include "oasis/core/error.hpp"

namespace {

struct Worst {
  double rel = 0, ulps = 0;
  float rel_at = 0, ulps_at = 0;
  long count = 0;
  std::uint64_t digest = 0;  // sum over blocks of (2 blk + 1) FNV-1a(block's result bits): order-free
  void merge(const Worst& o) {
    digest += o.digest;
    if (o.rel > rel) rel = o.rel, rel_at = o.rel_at;
    if (o.ulps > ulps) ulps = o.ulps, ulps_at = o.ulps_at;
    count += o.count;
  }
};

float from_bits(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// The bit patterns [b0, b1) (sign bit included), in blocks of 2^16.
Worst sweep(std::uint64_t b0, std::uint64_t b1) {
  constexpr std::uint64_t kBlock = 1 << 16;
  const std::uint64_t nblocks = (b1 - b0 + kBlock - 1) / kBlock;
  Worst all;
#pragma omp parallel
  {
    Worst mine;
    std::vector<float> x(kBlock), y(kBlock);
#pragma omp for schedule(dynamic, 16)
    for (std::int64_t blk = 0; blk < static_cast<std::int64_t>(nblocks); ++blk) {
      const std::uint64_t lo = b0 + static_cast<std::uint64_t>(blk) * kBlock;
      const std::uint64_t n = std::min(kBlock, b1 - lo);
      for (std::uint64_t i = 0; i < n; ++i) x[i] = from_bits(static_cast<std::uint32_t>(lo + i));
      oasis::cpu_fast::vector_exp(x.data(), y.data(), static_cast<oasis::index_t>(n));
      std::uint64_t h = 14695981039346656037ull;
      for (std::uint64_t i = 0; i < n; ++i) {
        std::uint32_t bits;
        std::memcpy(&bits, &y[i], sizeof bits);
        h = (h ^ bits) * 1099511628211ull;
      }
      mine.digest += h * (2 * (lo >> 16) + 1);
      for (std::uint64_t i = 0; i < n; ++i) {
        const double e = std::exp(static_cast<double>(x[i]));
        if (e < std::numeric_limits<float>::min() || e > std::numeric_limits<float>::max()) continue;
        const double err = std::abs(static_cast<double>(y[i]) - e);
        const double rel = err / e, ulps = err / std::ldexp(1.0, std::ilogb(e) - 23);
        ++mine.count;
        if (rel > mine.rel) mine.rel = rel, mine.rel_at = x[i];
        if (ulps > mine.ulps) mine.ulps = ulps, mine.ulps_at = x[i];
      }
    }
#pragma omp critical
    all.merge(mine);
  }
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> isas;
  for (int i = 1; i < argc; ++i) isas.emplace_back(argv[i]);
  if (isas.empty()) isas = oasis::cpu_fast::available_isas();
  std::uint32_t hi, lo;  // the largest positive and negative x with a normal e^x
  const float xhi = 88.72283f, xlo = -87.33654f;
  std::memcpy(&hi, &xhi, sizeof hi);
  std::memcpy(&lo, &xlo, sizeof lo);
  for (const std::string& isa : isas) {
    try {
      oasis::cpu_fast::set_isa(isa);
    } catch (const oasis::invalid_argument& e) {
      std::fprintf(stderr, "oasis_exp_error: %s\n", e.what());
      return 2;
    }
    Worst w = sweep(0, std::uint64_t{hi} + 1);         // +0 .. 88.72283
    w.merge(sweep(0x80000000u, std::uint64_t{lo} + 1));  // -0 .. -87.33654
    std::printf("%-8s %ld inputs: max relative error %.4g at x = %.9g; max %.4f ulp at x = %.9g; digest %016llx\n",
                isa.c_str(), w.count, w.rel, static_cast<double>(w.rel_at), w.ulps, static_cast<double>(w.ulps_at),
                static_cast<unsigned long long>(w.digest));
  }
  return 0;
}
