# Precompiled third-party headers: oasis_precompile(TARGET LIBRARY|TEST).
#
# Boost.Multiprecision (the mp50 and mpfr50 scalars, oasis/core/multiprecision.hpp), Eigen and
# GoogleTest are read by 157 of the 271 files a full build compiles, and parsing them takes 2 to 3 s
# of each (29 files drawn at random, compiled both ways on one core each: 177 s instead of 197 s
# in all; op_attention_merge.cpp 8.3 s instead of 11.7 s). With OASIS_PCH (the default) they
# are parsed once per kind of file instead.
#
# A precompiled header serves only translation units compiled with the flags it was built with:
# GCC checks position-independent code and every macro the headers read (-fopenmp's _REENTRANT,
# GoogleTest's GTEST_HAS_PTHREAD), and where they differ it warns (-Winvalid-pch, which CMake adds)
# and reads the headers' text instead. So there are two, each built once and reused:
#   LIBRARY  the position-independent library objects (oasis_core, which builds it; oasis_cpu_fast,
#            oasis_verify);
#   TEST     the GoogleTest programs of oasis_add_gtest (oasis_pch_tests builds it; GoogleTest too).
# The other targets compile without one: the CUDA backend and its emulator, the Python module (its
# Python.h must come first), the programs, and oasis_proofs, whose -O1 would not reach the
# precompiled template code (compiled at -O3, it was slower to build: 15 s instead of 11 s a file). A file that selects an instruction set
# (#pragma GCC target) does so after its includes, so the headers read first change nothing.
# Only third-party headers are precompiled: a project header is still read from the includes of
# each file. scripts/sanitize.sh builds with OASIS_PCH=OFF, so that the files it compiles are also
# checked to include what they use.
option(OASIS_PCH "Precompile the third-party headers (Boost.Multiprecision, Eigen, GoogleTest)" ON)

set(OASIS_PCH_HEADERS <boost/multiprecision/cpp_bin_float.hpp> <Eigen/Dense>)
if(OASIS_HAVE_MPFR)
  list(APPEND OASIS_PCH_HEADERS <boost/multiprecision/mpfr.hpp>)
endif()

if(OASIS_PCH AND OASIS_BUILD_TESTS)
  # the test programs' owner: an empty file compiled with a test program's flags and macros
  file(CONFIGURE OUTPUT ${PROJECT_BINARY_DIR}/pch/oasis_pch_tests.cpp
       CONTENT "// The test programs' precompiled header (cmake/OasisPch.cmake).\n")
  add_library(oasis_pch_tests OBJECT ${PROJECT_BINARY_DIR}/pch/oasis_pch_tests.cpp)
  target_link_libraries(oasis_pch_tests PRIVATE oasis::oasis oasis_test_support GTest::gtest)
  target_precompile_headers(oasis_pch_tests PRIVATE ${OASIS_PCH_HEADERS} <gtest/gtest.h>)
endif()

function(oasis_precompile target kind)
  if(NOT OASIS_PCH)
    return()
  endif()
  if(kind STREQUAL "LIBRARY")
    if(target STREQUAL "oasis_core")
      target_precompile_headers(oasis_core PRIVATE ${OASIS_PCH_HEADERS})
    else()
      target_precompile_headers(${target} REUSE_FROM oasis_core)
    endif()
  elseif(kind STREQUAL "TEST")
    target_precompile_headers(${target} REUSE_FROM oasis_pch_tests)
  else()
    message(FATAL_ERROR "oasis_precompile: kind must be LIBRARY or TEST, not '${kind}'")
  endif()
endfunction()
