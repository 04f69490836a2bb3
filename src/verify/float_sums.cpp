// src/verify/float_sums.cpp — the scaled float weights of float_sums.hpp.
#include "float_sums.hpp"

#include "row_clones.hpp"

namespace oasis::verify::detail::fsum {

OASIS_ROW_CLONES bool scale_to_float(const double* w, index_t n, float* out, int& e) {
  // one pass at e = 0, which serves every row whose largest weight lies in [2^-60, 2^30) (the sums
  // then stay below 2^30 2^80 kMaxTerms < 2^125); a second, scaled, for the others
  double mx = 0, nonfinite = 0;  // 0 unless some weight is NaN or infinite (0 inf is NaN)
#pragma omp simd reduction(max : mx) reduction(+ : nonfinite)
  for (index_t j = 0; j < n; ++j) {
    out[j] = static_cast<float>(w[j]);
    mx = w[j] > mx ? w[j] : mx;
    nonfinite += 0.0 * w[j];
  }
  e = 0;
  if (nonfinite != 0.0 || !(mx <= std::numeric_limits<double>::max())) return false;
  if (mx == 0.0 || (mx >= 0x1p-60 && mx < 0x1p30)) return true;
  if (mx < 0x1p-1000) return false;
  e = -std::ilogb(mx) - 1;
  const double s = std::ldexp(1.0, e);  // exact: |e| <= 1024
#pragma omp simd
  for (index_t j = 0; j < n; ++j) out[j] = static_cast<float>(w[j] * s);
  return true;
}

bool subnormals_kept() {
  // volatile: computed here, in this thread's modes. Each subnormal result is scaled into the normal
  // range before it is compared: under denormals-are-zero a comparison reads a subnormal as 0 too.
  volatile float tiny = 0x1p-140f, smallest_normal = 0x1p-126f, half = 0.5f;
  const float daz = tiny * 2.0f, ftz = smallest_normal * half;
  return daz * 0x1p100f == 0x1p-39f && ftz * 0x1p100f == 0x1p-27f;
}

}  // namespace oasis::verify::detail::fsum
