// src/cuda/emu/cublas.cpp — the cuBLAS subset of the CUDA emulator (cublas_v2.h): handles, the
// math mode, and SGEMM with cuBLAS's column-major semantics and argument checks. The product
// accumulates in float with one fused multiply-add per term, in k order; C is not read when
// beta = 0. An operand outside one device allocation is a device fault (cudaErrorIllegalAddress).
#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>

#include "cublas_v2.h"
#include "emulator.hpp"

struct cublasContext {
  cublasMath_t mode = CUBLAS_DEFAULT_MATH;
};

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                           int k, const float* alpha, const float* A, int lda, const float* B, int ldb,
                           const float* beta, float* C, int ldc) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  auto valid_op = [](cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; };
  if (!valid_op(transa) || !valid_op(transb)) return CUBLAS_STATUS_INVALID_VALUE;
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;  // real data: C is T
  // cuBLAS's argument rules: sizes >= 0; leading dimensions cover the stored rows.
  if (m < 0 || n < 0 || k < 0 || !alpha || !beta) return CUBLAS_STATUS_INVALID_VALUE;
  if (lda < std::max(1, ta ? k : m) || ldb < std::max(1, tb ? n : k) || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
  // Stored extents (column-major): A is (ta ? k : m) x (ta ? m : k) with leading dimension lda.
  auto extent = [](long long rows, long long cols, long long ld) { return (cols - 1) * ld + rows; };
  {
    std::lock_guard<std::mutex> lock(oasis_emu::memory_mutex());
    const bool ok_a = k == 0 || oasis_emu::in_device_memory(A, sizeof(float) * extent(ta ? k : m, ta ? m : k, lda));
    const bool ok_b = k == 0 || oasis_emu::in_device_memory(B, sizeof(float) * extent(tb ? n : k, tb ? k : n, ldb));
    const bool ok_c = oasis_emu::in_device_memory(C, sizeof(float) * extent(m, n, ldc));
    if (!ok_a || !ok_b || !ok_c) {
      oasis_emu::record_fault(cudaErrorIllegalAddress,
                              std::string("cublasSgemm: operand ") + (!ok_a ? "A" : !ok_b ? "B" : "C") +
                                  " does not lie inside one device allocation (m = " + std::to_string(m) +
                                  ", n = " + std::to_string(n) + ", k = " + std::to_string(k) + ")");
      return CUBLAS_STATUS_EXECUTION_FAILED;
    }
  }
  const float a = *alpha, b = *beta;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      float acc = 0.0f;
      for (int l = 0; l < k; ++l) {
        const float x = ta ? A[l + static_cast<long long>(i) * lda] : A[i + static_cast<long long>(l) * lda];
        const float y = tb ? B[j + static_cast<long long>(l) * ldb] : B[l + static_cast<long long>(j) * ldb];
        acc = std::fma(x, y, acc);
      }
      float& c = C[i + static_cast<long long>(j) * ldc];
      c = b == 0.0f ? a * acc : a * acc + b * c;  // beta = 0: C is not read (it may hold NaN)
    }
  return CUBLAS_STATUS_SUCCESS;
}
