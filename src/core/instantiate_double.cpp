// Explicit instantiation of the core for double (see include/oasis/core/instances.hpp).
#define OASIS_INSTANTIATING
#include "oasis/core/instances.hpp"

OASIS_CORE_INSTANCES(, double)
