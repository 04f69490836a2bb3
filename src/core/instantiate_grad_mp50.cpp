// Explicit instantiation of the backward oracle for ::oasis::mp50 (see include/oasis/grad/instances.hpp).
#define OASIS_INSTANTIATING
#include "oasis/grad/instances.hpp"

OASIS_GRAD_INSTANCES(, ::oasis::mp50)
