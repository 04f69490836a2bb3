// Explicit instantiation of the backward oracle for float (see include/oasis/grad/instances.hpp).
#define OASIS_INSTANTIATING
#include "oasis/grad/instances.hpp"

OASIS_GRAD_INSTANCES(, float)
