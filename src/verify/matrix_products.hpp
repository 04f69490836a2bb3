// src/verify/matrix_products.hpp — fast row-major matrix products in float and double,
// C [M, N] = op(A) op(B) (the contract of oasis::model::MatrixProducts, include/oasis/model/matrix_products.hpp).
//
// The verifier's plain replays and its double oracle of model gradients spend their time in
// matrix products whose error bounds (gamma_K sum_k |a_ik| |b_kj|) hold for every summation order,
// so the products may be blocked, vectorised per instruction set (oracle_kernels.hpp, the widest
// the CPU runs) and threaded (OpenMP over blocks of C). Each element's value depends only on the
// operands, the shapes and the caller's rounding mode (every thread takes it), never on the number
// of threads.
#pragma once

#include "oasis/model/layers.hpp"

namespace oasis::verify {

/// The products, for ErrorModel::products and the like (a static object).
const oasis::model::MatrixProducts& matrix_products();

}  // namespace oasis::verify
