// Explicit instantiation of the backward oracle for ::oasis::mpfr50 (see include/oasis/grad/instances.hpp).
#define OASIS_INSTANTIATING
#include "oasis/grad/instances.hpp"

#if defined(OASIS_HAVE_MPFR)
OASIS_GRAD_INSTANCES(, ::oasis::mpfr50)
#endif
