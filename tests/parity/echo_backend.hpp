// tests/parity/echo_backend.hpp — the recipe's test backend "echo" (echo_backend.cpp), registered in
// the parity program: every op is the float reference's.
#pragma once

#include "oasis/backends/registry.hpp"

namespace oasis::test {

const BackendOps& echo_backend();

}  // namespace oasis::test
