// oasis/verify/policy.hpp — the compare engine's tolerance policy applied to one tensor (the policy
// and its reasons: oasis/verify/compare.hpp, docs/verify.md). The engine's ops and the parity rows
// of `oasis-verify selfcheck` both call it.
#pragma once

#include <string>

#include "oasis/io/dtype.hpp"
#include "oasis/multiprecision.hpp"
#include "oasis/tensor.hpp"
#include "oasis/verify/report.hpp"

namespace oasis::verify {

/// `got` (stored in dtype D = got.dtype) against the mp50 oracle `ref`, per element
/// |x - ref| <= 0.5 ulp_D(ref) + 2 plain, with plain = B_i(D) of ref's shape (ignored when the
/// shapes differ, which fails the tensor); lists the first `show` mismatches.
TensorReport compare_tensor(const std::string& name, const io::StoredTensor& got, const Tensor<mp50>& ref,
                            const Tensor<double>& plain, int show);

}  // namespace oasis::verify
