# oasis_add_gtest(NAME name SOURCES a.cpp ... [LABELS l1 l2] [LIBS extra...] [TIMEOUT s]
#                 [BASE library] [PREFIX p])
# One GoogleTest executable (with rapidcheck's GoogleTest integration), discovered by ctest.
# BASE replaces oasis::oasis (the CUDA emulator's tests link oasis_emu); PREFIX is prepended to
# the ctest names (the same test source built twice gets distinct names). A program on oasis::oasis
# uses the tests' precompiled header, so options added to it later make ctest's package.pch_options
# fail (cmake/OasisPch.cmake says why): give such a program a BASE or drop the header for it.
include(GoogleTest)
find_package(GTest REQUIRED)
find_package(rapidcheck REQUIRED)
oasis_pch_owner(oasis_pch_tests HEADERS <gtest/gtest.h> LIBS oasis::oasis oasis_test_support GTest::gtest)

function(oasis_add_gtest)
  cmake_parse_arguments(A "" "NAME;TIMEOUT;BASE;PREFIX" "SOURCES;LABELS;LIBS" ${ARGN})
  if(NOT A_BASE)
    set(A_BASE oasis::oasis)
  endif()
  add_executable(${A_NAME} ${A_SOURCES})
  target_link_libraries(${A_NAME} PRIVATE ${A_BASE} oasis_test_support GTest::gtest GTest::gtest_main
                        rapidcheck rapidcheck_gtest ${A_LIBS})
  if(A_BASE STREQUAL "oasis::oasis")  # not on the emulator (-ffp-contract=off): cmake/OasisPch.cmake
    oasis_precompile(${A_NAME} TEST)
  endif()
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 600)
  endif()
  gtest_discover_tests(${A_NAME}
    DISCOVERY_TIMEOUT 120
    TEST_LIST ${A_NAME}_TESTS
    TEST_PREFIX "${A_PREFIX}"
    PROPERTIES TIMEOUT ${A_TIMEOUT})
  # Labels and environment are set after discovery: a list passed through PROPERTIES is split into separate
  # arguments by GoogleTest.cmake (only the first label would survive). The discovery script
  # defines ${A_NAME}_TESTS; this include file runs after it and labels every discovered test.
  # Environment: a fixed rapidcheck seed (reproducible properties) and passive OpenMP waiting
  # (ctest -j runs several OpenMP programs on few cores; spinning workers would starve them).
  set(_script ${CMAKE_CURRENT_BINARY_DIR}/${A_NAME}_labels.cmake)
  file(WRITE ${_script}
       "if(DEFINED ${A_NAME}_TESTS)\n  set_tests_properties(\${${A_NAME}_TESTS} PROPERTIES LABELS \"${A_LABELS}\"\n    ENVIRONMENT \"RC_PARAMS=seed=20261129 max_success=100;OMP_WAIT_POLICY=passive\")\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${_script})
endfunction()
