// src/core/backend_registry.hpp — the library's backend tables (oasis/backends/registry.hpp), one
// per backend folder, listed in src/core/backend.cpp in the order of enum class Backend. Private to
// the library: the backends' CMake targets include it as "core/backend_registry.hpp".
#pragma once

#include "oasis/backends/registry.hpp"

namespace oasis::detail {

const BackendOps& reference_backend();  // src/core/backend_reference.cpp
const BackendOps& cpu_fast_backend();   // src/cpu_fast/register.cpp
/// src/cuda/register.cpp, or src/core/backend_cuda_absent.cpp in a build without the CUDA
/// toolkit (a table whose available() says why).
const BackendOps& cuda_backend();

}  // namespace oasis::detail
