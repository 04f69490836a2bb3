// Explicit instantiation of the core for float (see include/oasis/core/instances.hpp).
#define OASIS_INSTANTIATING
#include "oasis/core/instances.hpp"

OASIS_CORE_INSTANCES(, float)
