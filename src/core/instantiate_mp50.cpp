// Explicit instantiation of the core for ::oasis::mp50 (see include/oasis/instances.hpp).
#define OASIS_INSTANTIATING
#include "oasis/instances.hpp"

OASIS_CORE_INSTANCES(, ::oasis::mp50)
