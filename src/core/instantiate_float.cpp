// Explicit instantiation of the core for float (see include/oasis/instances.hpp).
#define OASIS_INSTANTIATING
#include "oasis/instances.hpp"

OASIS_CORE_INSTANCES(, float)
