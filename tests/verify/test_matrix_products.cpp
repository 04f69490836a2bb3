// tests/verify/test_matrix_products.cpp — oasis::verify::matrix_products (C = op(A) op(B), float
// and double) and the float kernel of every instruction-set variant this CPU runs: each element
// within the order-independent bound |C - AB| <= gamma_K sum_k |a_ik| |b_kj|, gamma_K = K u / (1 - K u)
// (u = 2^-24 in float, 2^-53 in double; Higham, Lemma 3.1 and eq. 3.5, every order, FMA or not),
// against the triple loop in long double; repeated calls and other thread counts bitwise equal.
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "matrix_products.hpp"
#include "oasis_random.hpp"
#include "oracle_kernels.hpp"

namespace {

using oasis::index_t;
namespace k = oasis::verify::kernels;

struct Size {
  index_t M, N, K;
};

/// The logical operands op(A) [M, K], op(B) [K, N], row-major, and the exact product with its
/// magnitude sum_k |a_ik| |b_kj|.
template <class T>
struct Case {
  index_t M, N, K;
  std::vector<T> a, b;
  std::vector<long double> exact, mag;

  Case(Size s, std::uint64_t salt) : M(s.M), N(s.N), K(s.K), a(M * K), b(K * N), exact(M * N), mag(M * N) {
    auto rng = oasis::test::make_rng(salt);
    std::normal_distribution<double> nd;
    for (T& x : a) x = static_cast<T>(nd(rng));
    for (T& x : b) x = static_cast<T>(nd(rng));
    for (index_t i = 0; i < M; ++i)
      for (index_t kk = 0; kk < K; ++kk) {
        const long double x = a[i * K + kk];
        for (index_t j = 0; j < N; ++j) {
          exact[i * N + j] += x * b[kk * N + j];
          mag[i * N + j] += std::fabs(x * b[kk * N + j]);
        }
      }
  }

  /// gamma_K in the precision of T.
  long double gamma() const {
    const long double u = std::ldexp(1.0L, -(std::numeric_limits<T>::digits));
    return K * u / (1 - K * u);
  }

  /// Every element of C [M, N] within the bound; the number of violations.
  int violations(const T* C, const char* what) const {
    int bad = 0;
    const long double g = gamma();
    for (index_t x = 0; x < M * N; ++x)
      if (!(std::fabs(C[x] - exact[x]) <= g * mag[x]) && ++bad <= 5)
        ADD_FAILURE() << what << " M " << M << " N " << N << " K " << K << " [" << x / N << ", " << x % N << "] "
                      << static_cast<double>(C[x]) << " vs " << static_cast<double>(exact[x]) << " bound "
                      << static_cast<double>(g * mag[x]);
    return bad;
  }
};

/// X [rows, cols] -> [cols, rows].
template <class T>
std::vector<T> transpose(const std::vector<T>& X, index_t rows, index_t cols) {
  std::vector<T> Y(X.size());
  for (index_t r = 0; r < rows; ++r)
    for (index_t c = 0; c < cols; ++c) Y[c * rows + r] = X[r * cols + c];
  return Y;
}

/// matrix_products() in all four (ta, tb) forms; C starts as garbage (the product overwrites it).
template <class T>
void check_products(Size s, std::uint64_t salt) {
  const Case<T> c(s, salt);
  const std::vector<T> at = transpose(c.a, c.M, c.K), bt = transpose(c.b, c.K, c.N);
  const auto& mp = oasis::verify::matrix_products();
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      std::vector<T> C(c.M * c.N, T(12345));
      if constexpr (std::is_same_v<T, float>)
        mp.f32(ta, tb, c.M, c.N, c.K, (ta ? at : c.a).data(), (tb ? bt : c.b).data(), C.data());
      else
        mp.f64(ta, tb, c.M, c.N, c.K, (ta ? at : c.a).data(), (tb ? bt : c.b).data(), C.data());
      const std::string what = std::string(std::is_same_v<T, float> ? "f32" : "f64") + " ta " + std::to_string(ta) +
                               " tb " + std::to_string(tb);
      EXPECT_EQ(c.violations(C.data(), what.c_str()), 0);
    }
}

const std::vector<Size> kSizes = {{0, 5, 3},      {5, 0, 3},       {4, 6, 0},      {1, 1, 1},
                                  {3, 67, 5},     {65, 33, 129},   {130, 100, 300}, {257, 64, 768},
                                  {70, 4133, 40}};  // the last: several column blocks, a tail, threads

TEST(MatrixProducts, FloatWithinTheBoundInEveryForm) {
  for (std::size_t x = 0; x < kSizes.size(); ++x) check_products<float>(kSizes[x], 100 + x);
}

TEST(MatrixProducts, DoubleWithinTheBoundInEveryForm) {
  for (std::size_t x = 0; x < kSizes.size(); ++x) check_products<double>(kSizes[x], 200 + x);
}

TEST(MatrixProducts, EveryVariantsFloatKernelIsAMatrixProduct) {
  const std::vector<const k::Gemm*> variants = k::runnable_variants();
  // row counts of every residue modulo the variants' tile heights (AVX2 3, generic 4, AVX-512 6)
  for (const Size s : {Size{1, 32, 1}, Size{13, 3 * k::kColumnQuantum, 300}, Size{14, k::kColumnQuantum, 77},
                       Size{70, k::kColumnQuantum, 513}}) {
    const Case<float> c(s, 300 + s.M);
    std::vector<float> fused;  // the FMA variants sum in the same order: equal bit for bit
    for (const k::Gemm* g : variants) {
      std::vector<float> C(c.M * c.N, 12345.f);
      g->gemm_f32(c.a.data(), c.K, c.b.data(), c.N, C.data(), c.N, c.M, c.N, c.K, false);
      EXPECT_EQ(c.violations(C.data(), g->isa), 0);
      if (std::strcmp(g->isa, "generic") == 0) continue;
      if (fused.empty())
        fused = C;
      else
        EXPECT_EQ(std::memcmp(fused.data(), C.data(), C.size() * sizeof(float)), 0) << g->isa;
    }
  }
}

TEST(MatrixProducts, RepeatedCallsAndThreadCountsAgreeBitwise) {
  const index_t M = 300, N = 2100 + 7, K = 96;
  auto rng = oasis::test::make_rng(400);
  const auto A = oasis::test::randn<float>({K, M}, rng), B = oasis::test::randn<float>({N, K}, rng);
  const auto Ad = oasis::test::randn<double>({K, M}, rng), Bd = oasis::test::randn<double>({N, K}, rng);
  const auto& mp = oasis::verify::matrix_products();
  std::vector<float> first(M * N), again(M * N);
  std::vector<double> first_d(M * N), again_d(M * N);
  mp.f32(true, true, M, N, K, A.data(), B.data(), first.data());
  mp.f64(true, true, M, N, K, Ad.data(), Bd.data(), first_d.data());
#ifdef _OPENMP
  const int threads = omp_get_max_threads();
#endif
  for (int run = 0; run < 3; ++run) {
#ifdef _OPENMP
    omp_set_num_threads(run == 1 ? 1 : run == 2 ? 3 : threads);
#endif
    mp.f32(true, true, M, N, K, A.data(), B.data(), again.data());
    mp.f64(true, true, M, N, K, Ad.data(), Bd.data(), again_d.data());
    EXPECT_EQ(std::memcmp(first.data(), again.data(), again.size() * sizeof(float)), 0) << "run " << run;
    EXPECT_EQ(std::memcmp(first_d.data(), again_d.data(), again_d.size() * sizeof(double)), 0) << "run " << run;
  }
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
}

}  // namespace

// The plain replays call the products under directed rounding: every thread of the product must
// round as the caller, so that a directed product equals its one-thread evaluation bit for bit and
// rounds upward above the downward one in every element.
TEST(MatrixProducts, EveryThreadRoundsAsTheCaller) {
  const index_t M = 300, N = 2100 + 7, K = 96;
  auto rng = oasis::test::make_rng(401);
  const auto A = oasis::test::randn<float>({M, K}, rng), B = oasis::test::randn<float>({K, N}, rng);
  const auto& mp = oasis::verify::matrix_products();
  auto run = [&](int mode, int threads) {
    std::vector<float> c(M * N);
#ifdef _OPENMP
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
#endif
    const int old = std::fegetround();
    std::fesetround(mode);
    mp.f32(false, false, M, N, K, A.data(), B.data(), c.data());
    std::fesetround(old);
#ifdef _OPENMP
    omp_set_num_threads(before);
#endif
    return c;
  };
  (void)run(FE_TONEAREST, 2);  // the pool's threads exist, in the default rounding
  const std::vector<float> up2 = run(FE_UPWARD, 2), up1 = run(FE_UPWARD, 1), down2 = run(FE_DOWNWARD, 2);
  EXPECT_EQ(std::memcmp(up2.data(), up1.data(), up1.size() * sizeof(float)), 0);
  index_t above = 0;
  for (std::size_t i = 0; i < up2.size(); ++i) {
    ASSERT_GE(up2[i], down2[i]) << "element " << i;
    above += up2[i] > down2[i];
  }
  EXPECT_GT(above, static_cast<index_t>(up2.size() / 2));
  EXPECT_EQ(std::fegetround(), FE_TONEAREST);
}
