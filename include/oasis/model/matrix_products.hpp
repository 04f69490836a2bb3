// oasis/model/matrix_products.hpp — matrix products supplied by compiled code to the model's linear
// layers (ForwardOptions::products, docs/model.md).
#pragma once

#include <type_traits>

#include "oasis/core/tensor.hpp"

namespace oasis::model {

/// Row-major matrix products, C [M, N] = op(A) op(B) (overwritten),
/// op(A) [M, K] is A stored [M, K], or A^T with A stored [K, M] when ta; likewise op(B) [K, N] and
/// tb. Any summation order, fused multiply-add or not. The verifier's plain replays and its double
/// oracle of model gradients run their matrix products through one (oasis::verify::matrix_products,
/// blocked, per instruction set, threaded); without one (null, the default) linear() and
/// linear_backward() keep their sequential sums, so that incremental decoding equals the full
/// forward bit for bit.
struct MatrixProducts {
  void (*f32)(bool ta, bool tb, index_t M, index_t N, index_t K, const float* A, const float* B, float* C) = nullptr;
  void (*f64)(bool ta, bool tb, index_t M, index_t N, index_t K, const double* A, const double* B, double* C) = nullptr;
};

/// C = op(A) op(B) through `p` (T float or double).
template <class T>
void matrix_product(const MatrixProducts& p, bool ta, bool tb, index_t M, index_t N, index_t K, const T* A, const T* B,
                    T* C) {
  if constexpr (std::is_same_v<T, float>) p.f32(ta, tb, M, N, K, A, B, C);
  else p.f64(ta, tb, M, N, K, A, B, C);
}

}  // namespace oasis::model
