// Explicit instantiation of the core for ::oasis::mp50 (see include/oasis/core/instances.hpp).
#define OASIS_INSTANTIATING
#include "oasis/core/instances.hpp"

OASIS_CORE_INSTANCES(, ::oasis::mp50)
