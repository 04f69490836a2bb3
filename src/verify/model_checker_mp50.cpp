// src/verify/model_checker_mp50.cpp — the model level's producers evaluated in mp50 (model_checker_impl.hpp).
#include "model_checker_impl.hpp"

namespace oasis::verify::detail {

template class ModelCheckerOf<mp50>;

}  // namespace oasis::verify::detail
