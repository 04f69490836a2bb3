// Explicit instantiation of the model backward for ::oasis::mp50 (see include/oasis/grad/model_backward.hpp).
#define OASIS_MODEL_GRAD_INSTANTIATING
#include "oasis/grad/model_backward.hpp"
#include "oasis/core/multiprecision.hpp"

OASIS_MODEL_GRAD_INSTANCES(, ::oasis::mp50)
