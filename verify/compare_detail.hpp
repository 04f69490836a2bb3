// verify/compare_detail.hpp — pieces of `compare` shared between its translation units
// (compare.cpp: op level; compare_model.cpp: model level, kept apart because Model<mp50> is a
// slow instantiation).
#pragma once

#include <string>

#include "compare.hpp"
#include "oasis/io/dtype.hpp"
#include "oasis/io/json.hpp"
#include "oasis/multiprecision.hpp"

namespace oasis::verify::detail {

/// One tensor under the policy |x - ref| <= 0.5 ulp_D(ref) + 2 plain (plain: B_i(D), same shape
/// as ref; ignored when the shapes differ, which fails the tensor).
TensorReport compare_tensor(const std::string& name, const io::StoredTensor& got, const Tensor<mp50>& ref,
                            const Tensor<double>& plain, int show);

/// op "model": `model` is the configuration's "model" value (weights file path).
CompareReport op_model(const io::json::Value& model, const std::string& base_dir, const io::TensorMap& inputs,
                       const io::TensorMap& outputs, const CompareOptions& opt);

}  // namespace oasis::verify::detail
