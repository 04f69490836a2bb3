// src/verify/matrix_products.cpp — C = op(A) op(B) (matrix_products.hpp) through the oracle's
// kernel, in blocks of C spread over the OpenMP threads: a transposed A is copied to [M, K], a
// transposed B one column block at a time, by the thread that uses it (a whole copy of a
// vocabulary-sized B^T, 98 MB for GPT-2's head in float, would cost its page faults and a pass
// through memory); the columns [0, N - N % 32) go through the kernel, the last N % 32 through plain loops.
#include "matrix_products.hpp"

#include <algorithm>
#include <cfenv>
#include <memory>

#include "oracle_kernels.hpp"

namespace oasis::verify {
namespace {

using kernels::idx;
using kernels::kColumnQuantum;

/// Blocks of C, one OpenMP task each: 128 rows share each packed strip of B (so B is read M / 128
/// times), 2048 columns keep the tasks many enough for the threads when M is small.
constexpr idx kRowBlock = 128, kColBlock = 2048;
/// Below this many multiply-adds a product runs on the calling thread.
constexpr double kParallelWork = 1 << 18;

template <class T>
using Kernel = void (*)(const T*, idx, const T*, idx, T*, idx, idx, idx, idx, bool);

template <class T>
Kernel<T> kernel() {
  if constexpr (sizeof(T) == sizeof(float))
    return kernels::oracle_gemm().gemm_f32;
  else
    return kernels::oracle_gemm().gemm;
}

/// X [rows, cols] -> [cols, rows], in 64 x 64 tiles.
template <class T>
std::unique_ptr<T[]> transposed(const T* X, idx rows, idx cols) {
  constexpr idx kTile = 64;
  std::unique_ptr<T[]> Y(new T[static_cast<std::size_t>(rows * cols)]);
  T* y = Y.get();
  const idx col_tiles = (cols + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) if (static_cast<double>(rows) * cols >= kParallelWork)
  for (idx ct = 0; ct < col_tiles; ++ct) {
    const idx c0 = ct * kTile, c1 = std::min(cols, c0 + kTile);
    for (idx r0 = 0; r0 < rows; r0 += kTile) {
      const idx r1 = std::min(rows, r0 + kTile);
      for (idx c = c0; c < c1; ++c)
        for (idx r = r0; r < r1; ++r) y[c * rows + r] = X[r * cols + c];
    }
  }
  return Y;
}

/// Rows [i0, i1) of C's columns [j0, j1): C = A B by plain loops (A [M, K], B [K, ldb] from column j0).
template <class T>
void plain_columns(const T* A, const T* B, idx ldb, T* C, idx ldc, idx i0, idx i1, idx j0, idx j1, idx K) {
  for (idx i = i0; i < i1; ++i) {
    T* c = C + i * ldc;
    for (idx j = j0; j < j1; ++j) c[j] = T(0);
    for (idx k = 0; k < K; ++k) {
      const T a = A[i * K + k];
      const T* b = B + k * ldb;
      for (idx j = j0; j < j1; ++j) c[j] += a * b[j - j0];
    }
  }
}

/// Rows [j0, j1) of Bt [N, K] transposed into b [K, ldb].
template <class T>
void transpose_rows(const T* Bt, idx K, idx j0, idx j1, T* b, idx ldb) {
  constexpr idx kTile = 64;
  for (idx k0 = 0; k0 < K; k0 += kTile)
    for (idx j = j0; j < j1; ++j)
      for (idx k = k0; k < std::min(K, k0 + kTile); ++k) b[k * ldb + (j - j0)] = Bt[j * K + k];
}

template <class T>
void product(bool ta, bool tb, idx M, idx N, idx K, const T* A, const T* B, T* C) {
  if (M <= 0 || N <= 0) return;
  std::unique_ptr<T[]> at;
  if (ta) A = (at = transposed(A, K, M)).get();
  const Kernel<T> gemm = kernel<T>();
  // Column blocks of width kColBlock, the last one also holding the N % 32 columns of the tail.
  const idx Nq = N - N % kColumnQuantum;
  const idx row_blocks = (M + kRowBlock - 1) / kRowBlock, col_blocks = std::max<idx>(1, (Nq + kColBlock - 1) / kColBlock);
  const idx tasks = row_blocks * col_blocks;
  // The plain replays run under directed rounding (fesetround is per thread, and OpenMP's pool
  // threads keep theirs): every thread rounds as the caller does while it computes.
  const int rounding = std::fegetround();
#pragma omp parallel if (tasks > 1 && static_cast<double>(M) * N * K >= kParallelWork)
  {
    const int own_rounding = std::fegetround();
    std::fesetround(rounding);
    // With tb, each thread transposes the column block of B it works on, once for all its row
    // blocks (the tasks of one thread are consecutive, column block by column block).
    // Its rows are kPad longer than the block: 2048 floats apart, the 64 rows that a tile of the
    // transposition writes would share one set of the L1 cache.
    constexpr idx kPad = 16;
    std::unique_ptr<T[]> packed(tb ? new T[static_cast<std::size_t>(K * (std::min(N, kColBlock + kColumnQuantum) + kPad))] : nullptr);
    idx packed_cb = -1;
#pragma omp for schedule(static)
    for (idx t = 0; t < tasks; ++t) {
      const idx cb = t / row_blocks, i0 = t % row_blocks * kRowBlock, i1 = std::min(M, i0 + kRowBlock);
      const idx j0 = cb * kColBlock, jq = std::min(Nq, j0 + kColBlock), j1 = cb == col_blocks - 1 ? N : jq;
      const T* b = B + j0;
      idx ldb = N;
      if (tb) {
        b = packed.get();
        ldb = j1 - j0 + kPad;
        if (packed_cb != cb) transpose_rows(B, K, j0, j1, packed.get(), ldb);
        packed_cb = cb;
      }
      if (jq > j0) gemm(A + i0 * K, K, b, ldb, C + i0 * N + j0, N, i1 - i0, jq - j0, K, false);
      if (j1 > jq) plain_columns(A, b + (jq - j0), ldb, C, N, i0, i1, jq, j1, K);
    }
    std::fesetround(own_rounding);
  }
}

void product_f32(bool ta, bool tb, index_t M, index_t N, index_t K, const float* A, const float* B, float* C) {
  product<float>(ta, tb, M, N, K, A, B, C);
}
void product_f64(bool ta, bool tb, index_t M, index_t N, index_t K, const double* A, const double* B, double* C) {
  product<double>(ta, tb, M, N, K, A, B, C);
}

}  // namespace

const oasis::model::MatrixProducts& matrix_products() {
  static const oasis::model::MatrixProducts products{&product_f32, &product_f64};
  return products;
}

}  // namespace oasis::verify
