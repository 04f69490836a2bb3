# Precompiled third-party headers: oasis_precompile(TARGET LIBRARY|TEST), oasis_pch_owner(...).
#
# Boost.Multiprecision (the mp50 and mpfr50 scalars, oasis/core/multiprecision.hpp), Eigen and
# GoogleTest are read by most files of the libraries and the tests, and parsing them is a large part
# of each such file's compile time. A precompiled header holds them parsed; CMake's own switch turns
# them off (-DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON, as the sanitizer lane does).
#
# GCC uses a precompiled header only in files compiled as it was: it checks position-independent
# code and the macros the headers read (-fopenmp's _OPENMP, GoogleTest's GTEST_HAS_PTHREAD), and
# where they differ it warns (-Winvalid-pch, which CMake adds) and reads the headers' text. It does
# not check optimisation options: a file that uses the header is compiled with the header's (Eigen
# marks functions with optimize attributes). So only targets compiled with exactly the owner's
# options use one (ctest's package.pch_options checks it in the Ninja build file), and there are
# two owners, each built once:
#   oasis_pch_library  position-independent, for oasis_core, oasis_cpu_fast and oasis_verify;
#   oasis_pch_tests    GoogleTest's header too, for the test programs on oasis::oasis
#                      (cmake/OasisTesting.cmake).
# Everything else compiles without: oasis_proofs (-O1), the CUDA emulator and the test programs
# on it (-ffp-contract=off), the CUDA backend (no OpenMP), the Python module (its Python.h must
# come first), the benchmarks and the programs; so do the files of the fast kernels and of the
# oracle's matrix products (SKIP_PRECOMPILE_HEADERS), which read none of these headers.
set(OASIS_PCH_HEADERS <boost/multiprecision/cpp_bin_float.hpp> <Eigen/Core>)
if(OASIS_HAVE_MPFR)
  list(APPEND OASIS_PCH_HEADERS <boost/multiprecision/mpfr.hpp>)
endif()

# oasis_pch_owner(NAME [PIC] [HEADERS extra...] LIBS libs...): an empty file compiled with the
# flags and macros that LIBS give, which builds the precompiled header.
function(oasis_pch_owner name)
  cmake_parse_arguments(A "PIC" "" "HEADERS;LIBS" ${ARGN})
  file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/pch/${name}.cpp
       CONTENT "// The owner of a precompiled header (cmake/OasisPch.cmake).\n")
  add_library(${name} OBJECT ${PROJECT_BINARY_DIR}/pch/${name}.cpp)
  target_link_libraries(${name} PRIVATE ${A_LIBS})
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ${A_PIC})
  target_precompile_headers(${name} PRIVATE ${OASIS_PCH_HEADERS} ${A_HEADERS})
endfunction()

oasis_pch_owner(oasis_pch_library PIC LIBS oasis_headers OpenMP::OpenMP_CXX)

function(oasis_precompile target kind)
  if(kind STREQUAL "LIBRARY")
    target_precompile_headers(${target} REUSE_FROM oasis_pch_library)
  elseif(kind STREQUAL "TEST")
    target_precompile_headers(${target} REUSE_FROM oasis_pch_tests)
  else()
    message(FATAL_ERROR "oasis_precompile: kind must be LIBRARY or TEST, not '${kind}'")
  endif()
endfunction()
