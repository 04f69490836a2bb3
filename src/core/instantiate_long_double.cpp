// Explicit instantiation of the core for long double (see include/oasis/instances.hpp).
#define OASIS_INSTANTIATING
#include "oasis/instances.hpp"

OASIS_CORE_INSTANCES(, long double)
