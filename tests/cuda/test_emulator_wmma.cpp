// The CUDA emulator's warp matrix functions (src/cuda/emu/mma.h, nvcuda::wmma): mma_sync is the
// exact float accumulation of the 16-bit products in the stated order, the fragment layout is
// opaque (scrambled, and different per use) while the documented semantics hold, and misuse —
// misaligned pointers, a bad leading dimension, lanes that disagree or have exited — is a
// device fault.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include "emu_test_support.hpp"
#include "kernel_launch.hpp"
#include "oasis/io/dtype.hpp"

namespace {

using namespace nvcuda;

using emu_test::DeviceArray;
using emu_test::launch_failed_with;

// --- kernels -----------------------------------------------------------------------------------------

/// d = a b + c for one 16x16x16 tile; a row-major (lda 16), b row- or column-major (ldb 16),
/// c and d row-major float (ld 16).
template <class T, class LB>
__global__ void mma_kernel(const T* a, const T* b, const float* c, float* d) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::load_matrix_sync(acc, c, 16, wmma::mem_row_major);
  wmma::mma_sync(acc, fa, fb, acc);
  wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}

/// Each lane's fragment elements, unchanged: what the lanes hold of one accumulator tile.
__global__ void accumulator_slots_kernel(const float* m, float* slots) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, m, 16, wmma::mem_row_major);
  for (int i = 0; i < acc.num_elements; ++i) slots[threadIdx.x * acc.num_elements + i] = acc.x[i];
}

/// The row-index technique of attention_tc.cu: an accumulator loaded from the table
/// rowid[r][c] = r names the row of each element of any accumulator (here an mma result), so
/// each row can be scaled by its own factor without knowing the layout; stored column-major.
template <class T>
__global__ void scale_rows_kernel(const T* a, const T* b, const float* factor, float* d) {
  __shared__ __align__(32) float rowid[16][16];
  for (int e = threadIdx.x; e < 256; e += 32) rowid[e / 16][e % 16] = static_cast<float>(e / 16);
  __syncwarp();
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> rows, acc;
  wmma::load_matrix_sync(rows, &rowid[0][0], 16, wmma::mem_row_major);
  wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::fill_fragment(acc, 0.0f);
  wmma::mma_sync(acc, fa, fb, acc);
  for (int i = 0; i < acc.num_elements; ++i) acc.x[i] *= factor[static_cast<int>(rows.x[i])];
  wmma::store_matrix_sync(d, acc, 16, wmma::mem_col_major);
}

/// A kernel that assumes a fragment layout: lane l holds row l / 2 (a guess that the scrambled
/// layout refutes, as the device's own layout would refute another guess).
__global__ void assumed_layout_kernel(const float* m, float* rows_seen) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, m, 16, wmma::mem_row_major);
  rows_seen[threadIdx.x] = acc.x[0];  // m[r][c] = r: the row of slot 0, expected threadIdx.x / 2
}

__global__ void load_misaligned_kernel(const float* m) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, m + 4, 16, wmma::mem_row_major);  // 16 bytes past a 32-byte boundary
}

__global__ void load_bad_ldm_kernel(const __half* m) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
  wmma::load_matrix_sync(fa, m, 20);  // 40 bytes: not a multiple of 16
}

__global__ void lanes_disagree_kernel(const float* m) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, m + (threadIdx.x == 3 ? 256 : 0), 16, wmma::mem_row_major);
}

__global__ void per_lane_fill_kernel(float* out) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, static_cast<float>(threadIdx.x));
  wmma::store_matrix_sync(out, acc, 16, wmma::mem_row_major);
}

__global__ void exited_lane_kernel(float* out) {
  if (threadIdx.x == 31) return;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 1.0f);
  wmma::store_matrix_sync(out, acc, 16, wmma::mem_row_major);
}

__global__ void shuffle_against_wmma_kernel(float* out) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  if (threadIdx.x == 0) out[0] = __shfl_sync(0xffffffffu, 1.0f, 0);
  wmma::fill_fragment(acc, 1.0f);
}

// --- helpers -----------------------------------------------------------------------------------------

template <class T>
T to_16(float x);
template <>
__half to_16<__half>(float x) { return __float2half_rn(x); }
template <>
__nv_bfloat16 to_16<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <class T>
float from_16(T x) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(x);
  else return __bfloat162float(x);
}

/// Random 16x16 tiles in T (values spread over several binades, so that the order of the float
/// accumulation matters).
template <class T>
std::vector<T> random_tile(std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-6, 6);
  std::vector<T> t(256);
  for (T& x : t) x = to_16<T>(std::ldexp(nd(rng), ex(rng)));
  return t;
}

/// The stated arithmetic: D[r][n] = C[r][n], then D = fma(A[r][k], B[k][n], D) for k = 0..15.
template <class T>
std::vector<float> reference_mma(const std::vector<T>& a, const std::vector<T>& b, bool b_col_major,
                                 const std::vector<float>& c) {
  std::vector<float> d(256);
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      float acc = c[static_cast<std::size_t>(r * 16 + n)];
      for (int k = 0; k < 16; ++k) {
        const T bk = b[static_cast<std::size_t>(b_col_major ? n * 16 + k : k * 16 + n)];
        acc = std::fma(from_16(a[static_cast<std::size_t>(r * 16 + k)]), from_16(bk), acc);
      }
      d[static_cast<std::size_t>(r * 16 + n)] = acc;
    }
  return d;
}

template <class T, class LB>
void expect_mma_matches_definition(unsigned seed) {
  std::mt19937 rng(seed);
  const std::vector<T> a = random_tile<T>(rng), b = random_tile<T>(rng);
  std::vector<float> c(256);
  std::normal_distribution<float> nd(0.0f, 4.0f);
  for (float& x : c) x = nd(rng);
  DeviceArray<T> da(256), db(256);
  DeviceArray<float> dc(256), dd(256);
  da.put(a);
  db.put(b);
  dc.put(c);
  OASIS_LAUNCH(1, 32, nullptr, mma_kernel<T, LB>)(da.p, db.p, dc.p, dd.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> got = dd.get();
  const std::vector<float> want = reference_mma(a, b, std::is_same_v<LB, wmma::col_major>, c);
  int mismatches = 0;
  for (int e = 0; e < 256; ++e)
    if (std::memcmp(&got[static_cast<std::size_t>(e)], &want[static_cast<std::size_t>(e)], sizeof(float)) != 0 &&
        ++mismatches <= 5)
      ADD_FAILURE() << "seed " << seed << ": D[" << e / 16 << "][" << e % 16 << "] = " << got[static_cast<std::size_t>(e)]
                    << ", the stated accumulation gives " << want[static_cast<std::size_t>(e)];
  // The order matters on these inputs (the check is not vacuous): summing in reverse differs.
  if (seed == 1) {
    int differs = 0;
    for (int r = 0; r < 16; ++r)
      for (int n = 0; n < 16; ++n) {
        float rev = c[static_cast<std::size_t>(r * 16 + n)];
        for (int k = 15; k >= 0; --k) {
          const T bk = b[static_cast<std::size_t>(std::is_same_v<LB, wmma::col_major> ? n * 16 + k : k * 16 + n)];
          rev = std::fma(from_16(a[static_cast<std::size_t>(r * 16 + k)]), from_16(bk), rev);
        }
        differs += rev != want[static_cast<std::size_t>(r * 16 + n)];
      }
    EXPECT_GT(differs, 0) << "the inputs do not distinguish accumulation orders";
  }
}

// --- tests -------------------------------------------------------------------------------------------

TEST(CudaEmulatorWmma, MmaIsTheStatedFloatAccumulationOfExactProducts) {
  for (unsigned seed = 1; seed <= 3; ++seed) {
    expect_mma_matches_definition<__half, wmma::row_major>(seed);
    expect_mma_matches_definition<__half, wmma::col_major>(seed);
    expect_mma_matches_definition<__nv_bfloat16, wmma::row_major>(seed);
    expect_mma_matches_definition<__nv_bfloat16, wmma::col_major>(seed);
  }
}

TEST(CudaEmulatorWmma, FragmentLayoutIsScrambledButLoadAndStoreAreInverse) {
  std::vector<float> m(256);
  for (int e = 0; e < 256; ++e) m[static_cast<std::size_t>(e)] = static_cast<float>(e);
  DeviceArray<float> dm(256), slots(256), rows(32);
  dm.put(m);
  OASIS_LAUNCH(1, 32, nullptr, accumulator_slots_kernel)(dm.p, slots.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> s = slots.get();
  std::vector<int> seen(256, 0);
  int in_order = 0;
  for (int i = 0; i < 256; ++i) {
    ++seen[static_cast<std::size_t>(s[static_cast<std::size_t>(i)])];
    in_order += s[static_cast<std::size_t>(i)] == static_cast<float>(i);
  }
  for (int e = 0; e < 256; ++e) EXPECT_EQ(seen[static_cast<std::size_t>(e)], 1) << "element " << e;
  EXPECT_LT(in_order, 8) << "the accumulator layout is (nearly) the identity, which a kernel could come to rely on";
  // A kernel that guesses a layout reads the wrong rows.
  std::vector<float> rowtab(256);
  for (int e = 0; e < 256; ++e) rowtab[static_cast<std::size_t>(e)] = static_cast<float>(e / 16);
  dm.put(rowtab);
  OASIS_LAUNCH(1, 32, nullptr, assumed_layout_kernel)(dm.p, rows.p);
  const std::vector<float> r = rows.get();
  int right = 0;
  for (int l = 0; l < 32; ++l) right += r[static_cast<std::size_t>(l)] == static_cast<float>(l / 2);
  EXPECT_LT(right, 32) << "a guessed layout happened to be the emulator's";
}

TEST(CudaEmulatorWmma, RowIndexFragmentNamesTheRowsOfAnMmaResult) {
  std::mt19937 rng(7);
  const std::vector<__nv_bfloat16> a = random_tile<__nv_bfloat16>(rng), b = random_tile<__nv_bfloat16>(rng);
  std::vector<float> factor(16);
  for (int r = 0; r < 16; ++r) factor[static_cast<std::size_t>(r)] = static_cast<float>(r + 1) * 0.5f;
  DeviceArray<__nv_bfloat16> da(256), db(256);
  DeviceArray<float> df(16), dd(256);
  da.put(a);
  db.put(b);
  df.put(factor);
  OASIS_LAUNCH(1, 32, nullptr, scale_rows_kernel<__nv_bfloat16>)(da.p, db.p, df.p, dd.p);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> got = dd.get();  // column-major
  const std::vector<float> prod = reference_mma(a, b, true, std::vector<float>(256, 0.0f));
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n)
      EXPECT_EQ(got[static_cast<std::size_t>(n * 16 + r)],
                prod[static_cast<std::size_t>(r * 16 + n)] * factor[static_cast<std::size_t>(r)])
          << "row " << r << ", column " << n;
}

TEST(CudaEmulatorWmma, MisalignedPointerIsReported) {
  DeviceArray<float> m(512);
  m.put(std::vector<float>(512, 1.0f));
  const long long before = oasis_emu::fault_count();
  OASIS_LAUNCH(1, 32, nullptr, load_misaligned_kernel)(m.p);
  EXPECT_TRUE(launch_failed_with("32-byte", before));
}

TEST(CudaEmulatorWmma, LeadingDimensionNotAMultipleOf16BytesIsReported) {
  DeviceArray<__half> m(512);
  m.put(std::vector<__half>(512, __float2half_rn(1.0f)));
  const long long before = oasis_emu::fault_count();
  OASIS_LAUNCH(1, 32, nullptr, load_bad_ldm_kernel)(m.p);
  EXPECT_TRUE(launch_failed_with("ldm = 20", before));
}

TEST(CudaEmulatorWmma, LanesThatDisagreeOrHaveExitedAreReported) {
  DeviceArray<float> m(512);
  m.put(std::vector<float>(512, 1.0f));
  long long before = oasis_emu::fault_count();
  OASIS_LAUNCH(1, 32, nullptr, lanes_disagree_kernel)(m.p);
  EXPECT_TRUE(launch_failed_with("differ from those of the other lanes", before));
  before = oasis_emu::fault_count();
  OASIS_LAUNCH(1, 32, nullptr, per_lane_fill_kernel)(m.p);
  EXPECT_TRUE(launch_failed_with("wmma::fill_fragment", before));
  before = oasis_emu::fault_count();
  OASIS_LAUNCH(1, 32, nullptr, exited_lane_kernel)(m.p);  // reported at the exit or at the call
  EXPECT_TRUE(launch_failed_with("wmma::fill_fragment", before));
  before = oasis_emu::fault_count();
  OASIS_LAUNCH(1, 32, nullptr, shuffle_against_wmma_kernel)(m.p);
  EXPECT_TRUE(launch_failed_with("while other lanes of its warp wait in", before));
}

TEST(CudaEmulatorWmma, RoundingToSixteenBitsIsToNearestEven) {
  // 1 + 2^-11 is the midpoint between 1 and the next binary16; ties go to the even 1.
  EXPECT_EQ(__half2float(__float2half_rn(1.0f + std::ldexp(1.0f, -11))), 1.0f);
  EXPECT_EQ(__half2float(__float2half_rn(1.0f + 3 * std::ldexp(1.0f, -11))), 1.0f + std::ldexp(1.0f, -9));
  EXPECT_EQ(__bfloat162float(__float2bfloat16_rn(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(__bfloat162float(__float2bfloat16_rn(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(__half2float(__float2half_rn(1e6f)), INFINITY);  // beyond the binary16 range
}

}  // namespace
