// Explicit instantiation of the core for long double (see include/oasis/core/instances.hpp).
#define OASIS_INSTANTIATING
#include "oasis/core/instances.hpp"

OASIS_CORE_INSTANCES(, long double)
