// Explicit instantiation of the model backward for float, double and long double
// (see include/oasis/grad/model_backward.hpp); oasis::mp50 is in model_grad_mp50.cpp.
#define OASIS_MODEL_GRAD_INSTANTIATING
#include "oasis/grad/model_backward.hpp"

OASIS_MODEL_GRAD_INSTANCES(, float)
OASIS_MODEL_GRAD_INSTANCES(, double)
OASIS_MODEL_GRAD_INSTANCES(, long double)
