// src/verify/model_checker_double.cpp — the model level's producers evaluated in double (model_checker_impl.hpp).
#include "model_checker_impl.hpp"

namespace oasis::verify::detail {

template class ModelCheckerOf<double>;

}  // namespace oasis::verify::detail
