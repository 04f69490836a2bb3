// Explicit instantiation of the core for ::oasis::mpfr50 (see include/oasis/core/instances.hpp).
#define OASIS_INSTANTIATING
#include "oasis/core/instances.hpp"

#if defined(OASIS_HAVE_MPFR)
OASIS_CORE_INSTANCES(, ::oasis::mpfr50)
#endif
