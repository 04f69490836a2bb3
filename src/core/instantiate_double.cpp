// Explicit instantiation of the core for double (see include/oasis/instances.hpp).
#define OASIS_INSTANTIATING
#include "oasis/instances.hpp"

OASIS_CORE_INSTANCES(, double)
